"""Public pre-training, then DP fine-tuning at the sites (``python -m benchmarks.experiments privacy-pretrain``).

At the FedSPDnet paper's site sizes DP-FedSPDnet trained from scratch is at chance
(the ``privacy`` experiment). The standard remedy (Tramèr & Boneh 2021; De et al.
2022): pre-train on public data, outside the privacy budget, then fine-tune privately.

Protocol (left vs right hand imagery, ``load_physionet_mi(n_classes=2)``: MOABB's
``LeftRightImagery`` with ``feet_runs = []`` on the 40 offline subjects):

* public corpus, pooled, outside the budget: subjects 1-15 and 42; one centralized
  ``SPDnetClassifier`` (its validation rule: 10 % held out, early stopping) per seed;
* sites: subjects 16-39 in sorted order, ``--site-size`` subjects per site (4: 6 sites;
  8: 3 sites; 12: 2 sites); each subject's trials split 80/20 stratified per seed (20 %: test);
* every federated row: ``n_rounds`` rounds (the profile's), one local epoch, Adam, batch
  32, all sites every round, no validation split (the last global model is kept, as in DP
  mode), per-matrix ``scaling="trace"``; DP rows: sample-level (ε, δ = 1e-5)-DP per site,
  clip norm 1 (``FederatedSPDnetClassifier(privacy=DPSGD(...))``); fine-tuned rows start from
  the seed's public model (``init=``), whole network or head alone
  (``SPDnetClassifier(trainable="head")``), at a learning rate of 1e-3 (from scratch:
  1e-2), fixed before any run;
* rows: public model only; non-private FedSPDnet from scratch and fine-tuned; DP-FedSPDnet
  from scratch, fine-tuned (whole network) and fine-tuned (head) at each ε; TS+LR and
  Recenter+TS+LR (each training subject re-centred by its own mean, the test subject by
  its own) on the sites' training trials pooled (non-private references);
* score: balanced accuracy of each test subject (one ``predict`` call per subject: the
  whole subject at once, what unlabeled adaptation such as ``Recenter`` needs), mean over
  the 24 test subjects; ROC-AUC likewise. Paired over seeds (same splits, same public
  model): mean ± standard error of the difference and wins.

The rounds are checked, not tuned: each non-private federated record stores its training
loss per round, and the report prints the change of its mean over the last 10 rounds
(a fit still learning shows a clear fall).

    python -m benchmarks.experiments privacy-pretrain --quick --seeds 10                  # sites of 4
    python -m benchmarks.experiments privacy-pretrain --quick --seeds 10 --site-size 8
    python -m benchmarks.experiments privacy-pretrain --quick --seeds 12 --unseen --epsilons 1 8
    python -m benchmarks.experiments privacy-pretrain                                    # full: 60 rounds

Covariances are cached under ``results/`` (one load of the 40 subjects); every (row, ε,
seed) result is a JSON file under ``--out`` with its setup, so a re-run skips what is done.
"""

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import sklearn
from joblib import Parallel, delayed
from pyriemann.tangentspace import TangentSpace
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score, roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline

from .._machine import load_average
from .._machine import machine_line as machine
from ..records import store
from .data import load_left_right_channels
from .online import adaptive_step
from .report import resolve_profile, write_report
from skfedspd import FederatedSPDnetClassifier, Recenter, SPDnetClassifier, __version__, load_estimator, save_estimator
from skfedspd.clients import ClientPartition
from skfedspd.dp_sgd import steps_per_epoch
from skfedspd.privacy import DPSGD, group_epsilon
from skfedspd.training import torch_threads

PUBLIC_SUBJECTS = (*range(1, 16), 42)
SITE_SUBJECTS = tuple(range(16, 40))
PROFILES = {
    "quick": dict(seeds=3, rounds=30, public_epochs=100),
    "full": dict(seeds=10, rounds=60, public_epochs=300),
    "smoke": dict(seeds=1, rounds=1, public_epochs=2),  # the plumbing, not the science
}
EPSILONS = (1.0, 3.0, 8.0)
DELTA = 1e-5
CLIP_NORM = 1.0
BATCH_SIZE = 32
SCRATCH_LR, FINETUNE_LR = 1e-2, 1e-3
TEST_FRACTION = 0.2
#: Rows: key → (label, private, start). ``start``: "scratch", "public" (whole network) or "head".
ROWS = {
    "public": ("public model only", False, None),
    "fed-scratch": ("FedSPDnet from scratch", False, "scratch"),
    "fed-finetune": ("FedSPDnet fine-tuned", False, "public"),
    "dp-scratch": ("DP-FedSPDnet from scratch", True, "scratch"),
    "dp-finetune": ("DP-FedSPDnet fine-tuned (whole network)", True, "public"),
    "dp-finetune-head": ("DP-FedSPDnet fine-tuned (head)", True, "head"),
    "public-dbn": ("public model only, domain batch norm", False, None),
    "fed-dbn": ("FedSPDnet fine-tuned, domain batch norm", False, "public-dbn"),
    "dp-dbn": ("DP-FedSPDnet fine-tuned, domain batch norm (released means)", True, "public-dbn"),
    "tslr": ("TS+LR, sites pooled", False, None),
    "recenter-tslr": ("Recenter+TS+LR, sites pooled", False, None),
}


def load_covariances(cache, channels):
    """Covariances, labels and subjects of the 40 offline subjects (left/right imagery),
    loaded once and cached in ``cache`` (an ``.npz``)."""
    return load_left_right_channels([*PUBLIC_SUBJECTS, *SITE_SUBJECTS], cache, channels)


#: ``--unseen``: seed ``s`` keeps the ``s``-th block of this many site subjects (cyclically)
#: out of every site; they are the test subjects, all their trials, in recording order.
UNSEEN_BLOCK = 4
#: ``--unseen``: online predictions are scored from this trial of each subject on (0-based).
ONLINE_FROM = 10


def held_out_subjects(seed):
    """The site subjects in no site for ``seed`` (``--unseen``)."""
    start = (seed % (len(SITE_SUBJECTS) // UNSEEN_BLOCK)) * UNSEEN_BLOCK
    return SITE_SUBJECTS[start:start + UNSEEN_BLOCK]


def site_split(y, subjects, seed, unseen=False):
    """Site subjects' trials: each subject's stratified 80/20 split of ``seed``. Index arrays.
    ``unseen``: the held-out subjects' trials are the whole test set (the other subjects keep
    the same training part)."""
    held = held_out_subjects(seed) if unseen else ()
    train, test = [], []
    for s in SITE_SUBJECTS:
        idx = np.flatnonzero(subjects == s)
        tr, te = train_test_split(idx, test_size=TEST_FRACTION, stratify=y[idx], random_state=seed * 1000 + s)
        if s in held:
            test.append(idx)
            continue
        train.append(tr)
        if not unseen:
            test.append(te)
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def setup(profile_budget, site_size, channels, unseen=False):
    """What a cached record was fitted with: another setup is refitted, never reused."""
    settings = dict(rounds=profile_budget["rounds"], public_epochs=profile_budget["public_epochs"], site_size=site_size,
                    channels=channels, batch_size=BATCH_SIZE, scratch_lr=SCRATCH_LR, finetune_lr=FINETUNE_LR,
                    delta=DELTA, clip_norm=CLIP_NORM, test_fraction=TEST_FRACTION)
    if unseen:  # only then: the records of the site-subject protocol keep their setup
        settings.update(unseen=True, unseen_block=UNSEEN_BLOCK, online_from=ONLINE_FROM)
    return settings


def public_model(X, y, seed, epochs, subjects=None):
    """The seed's model pre-trained on the pooled public subjects; with their ``subjects``,
    with domain batch norm (each public subject re-centred by its own means)."""
    if subjects is None:
        return SPDnetClassifier(scaling="trace", batch_size=BATCH_SIZE, max_epochs=epochs, random_state=seed).fit(X, y)
    return SPDnetClassifier(scaling="trace", batch_size=BATCH_SIZE, max_epochs=epochs, batchnorm="domain",
                            random_state=seed).fit(X, y, groups=subjects)


def federated(row, epsilon, public, rounds, site_size, seed):
    """The federated estimator of a row (module docstring), unfitted."""
    _, private, start = ROWS[row]
    domain = start == "public-dbn"  # each subject a domain, re-centred by its released means
    local = SPDnetClassifier(scaling="trace", batch_size=BATCH_SIZE, lr=SCRATCH_LR if start == "scratch" else FINETUNE_LR,
                             trainable="head" if start == "head" else "all", batchnorm="domain" if domain else None)
    return FederatedSPDnetClassifier(
        local, n_rounds=rounds, local_epochs=1, clients=ClientPartition(groups_per_client=site_size),
        validation_fraction=0.0, domains="group" if domain else "client", random_state=seed,
        init=None if start == "scratch" else public,
        privacy=DPSGD(epsilon=epsilon, delta=DELTA, clip_norm=CLIP_NORM) if private else None)


def reference(row):
    """TS+LR or Recenter+TS+LR, unfitted (fitted with the training subjects as groups)."""
    steps = [TangentSpace(), LogisticRegression(max_iter=1000)]
    return make_pipeline(*([Recenter()] if row == "recenter-tslr" else []), *steps)


def per_subject_scores(model, X, y, subjects):
    """Balanced accuracy and ROC-AUC of each test subject, predicted one subject per call."""
    balanced, auc = {}, {}
    for s in np.unique(subjects):
        rows = subjects == s
        proba = model.predict_proba(X[rows])[:, 1]
        pred = model.classes_[(proba > 0.5).astype(int)]
        balanced[int(s)] = float(balanced_accuracy_score(y[rows], pred))
        auc[int(s)] = float(roc_auc_score(y[rows] == model.classes_[1], proba))
    return balanced, auc


def online_scores(model, X, y, subjects):
    """Balanced accuracy of each test subject predicted as an online BCI: one trial per call
    in recording order, the subject a domain that every trial before updates (unlabeled),
    scored from trial ``ONLINE_FROM`` on. A model without domain statistics (TS+LR) does not
    adapt: its predictions of the same trials."""
    step = adaptive_step(model)
    adaptive = hasattr(step, "reset_domain") and getattr(step, "batchnorm", "domain") == "domain"
    balanced = {}
    with sklearn.config_context(enable_metadata_routing=True):
        for s in np.unique(subjects):
            rows = np.flatnonzero(subjects == s)
            if adaptive:
                proba = np.array([model.predict_proba(X[i:i + 1], domain=f"online-{s}")[0, 1] for i in rows])
                step.reset_domain(f"online-{s}")
            else:
                proba = model.predict_proba(X[rows])[:, 1]
            pred = model.classes_[(proba[ONLINE_FROM:] > 0.5).astype(int)]
            balanced[int(s)] = float(balanced_accuracy_score(y[rows][ONLINE_FROM:], pred))
    return balanced


def record_of(row, epsilon, seed, model, data, split, settings, fit_seconds):
    X, y, subjects = data
    _, test = split
    balanced, auc = per_subject_scores(model, X[test], y[test], subjects[test])
    online = online_scores(model, X[test], y[test], subjects[test]) if settings.get("unseen") else None
    privacy = getattr(model, "privacy_", None)
    # non-private federated fits: their training loss per round (the convergence check)
    curve = isinstance(model, FederatedSPDnetClassifier) and privacy is None
    return {"row": row, "epsilon": eps_key(epsilon), "seed": seed, "setup": settings,
            "balanced_accuracy": balanced, "auc": auc, "online_balanced_accuracy": online, "fit_seconds": fit_seconds,
            "train_loss": [h["train_loss"] for h in model.history_] if curve else None,
            "target_epsilon": None if privacy is None else privacy["target_epsilon"],
            "epsilon_spent": None if privacy is None else [s["epsilon"] for s in privacy["sites"]],
            "noise_multipliers": None if privacy is None else [s["noise_multiplier"] for s in privacy["sites"]],
            "training_epsilon": None if privacy is None else [s["training_epsilon"] for s in privacy["sites"]],
            "domain_release": None if privacy is None else privacy.get("domain_release"),
            "privatized_parameters": None if privacy is None else privacy["privatized_parameters"],
            "resolved": None if privacy is None else privacy["resolved"]}


def cached_public_model(kind, X, y, subjects, seed, epochs, out):
    """The seed's public model of ``kind`` (``"public"`` or ``"public-dbn"``) and its fit
    seconds, saved beside ``out`` and reused: every site size and the unseen protocol
    fine-tune the same public model of a seed."""
    folder = out.parent / "privacy-pretrain-public-models"
    path = folder / f"{kind}-seed{seed}-epochs{epochs}.skfedspd"
    seconds = path.with_suffix(".seconds")
    if path.exists() and seconds.exists():
        return load_estimator(path), float(seconds.read_text())
    start = time.perf_counter()
    model = public_model(X, y, seed, epochs, subjects if kind == "public-dbn" else None)
    elapsed = time.perf_counter() - start
    folder.mkdir(parents=True, exist_ok=True)
    save_estimator(model, path)
    seconds.write_text(f"{elapsed}")
    return model, elapsed


def run_seed(data, seed, todo, budget, site_size, settings, out, n_threads=1):
    """Fit the ``todo`` (row, ε) pairs of one seed, writing each record as it is done."""
    X, y, subjects = data
    split = site_split(y, subjects, seed, unseen=settings.get("unseen", False))
    train, _ = split
    public_rows = np.isin(subjects, PUBLIC_SUBJECTS)
    written = []
    with torch_threads(n_threads):
        publics, public_seconds = {}, {}
        for kind in ("public", "public-dbn"):
            if any(row == kind or ROWS[row][2] in {"public": ("public", "head"), "public-dbn": ("public-dbn",)}[kind]
                   for row, _ in todo):
                publics[kind], public_seconds[kind] = cached_public_model(
                    kind, X[public_rows], y[public_rows], subjects[public_rows], seed, budget["public_epochs"], out)
        for row, epsilon in todo:
            start = time.perf_counter()
            if row in publics:
                model, seconds = publics[row], public_seconds[row]
            else:
                if row in ("tslr", "recenter-tslr"):
                    model = reference(row).fit(X[train], y[train], **({"recenter__groups": subjects[train]}
                                                                       if row == "recenter-tslr" else {}))
                else:
                    public = publics.get("public-dbn" if ROWS[row][2] == "public-dbn" else "public")
                    model = federated(row, epsilon, public, budget["rounds"], site_size, seed).fit(
                        X[train], y[train], groups=subjects[train])
                seconds = time.perf_counter() - start
            record = record_of(row, epsilon, seed, model, data, split, settings, seconds)
            record_path(out, row, epsilon, seed).write_text(json.dumps(record))
            written.append(record)
    return written


def eps_key(epsilon):
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def record_path(out, row, epsilon, seed):
    return out / f"{row}__eps{eps_key(epsilon)}__seed{seed}.json"


def runs_of(epsilons, seeds):
    """Every (row, ε, seed) of the protocol: ε = ∞ for the non-private rows."""
    cells = [(row, e) for row, (_, private, _) in ROWS.items() for e in (epsilons if private else [math.inf])]
    return [(row, e, s) for s in range(seeds) for row, e in cells]


def mean_score(record, key="balanced_accuracy"):
    """The record's score: the mean over its test subjects, in %."""
    return 100 * float(np.mean(list(record[key].values())))


def scores(results, row, epsilon, key="balanced_accuracy"):
    """``{seed: score}`` of a cell."""
    return {r["seed"]: mean_score(r, key) for r in results.get((row, eps_key(epsilon)), []) if r.get(key)}


def paired(results, a, b):
    """``(mean, standard error, wins, n)`` of ``score(a) − score(b)`` over the seeds both
    cells hold; ``a`` and ``b`` are ``(row, ε)``. None when no seed is shared."""
    sa, sb = scores(results, *a), scores(results, *b)
    seeds = sorted(set(sa) & set(sb))
    if not seeds:
        return None
    diff = np.array([sa[s] - sb[s] for s in seeds])
    se = diff.std(ddof=1) / math.sqrt(len(diff)) if len(diff) > 1 else float("nan")
    return float(diff.mean()), float(se), int((diff > 0).sum()), len(diff)


def describe(value):
    """``mean ± SE`` of a list of per-seed scores (the SE of the mean over seeds)."""
    v = np.array(value)
    if not len(v):
        return "–"
    se = v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else float("nan")
    return f"{v.mean():.1f} ± {se:.1f}"


def table(results, epsilons):
    columns = [math.inf, *epsilons]
    lines = ["| row | " + " | ".join("no DP" if math.isinf(e) else f"ε = {e:g}" for e in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for row, (label, private, _) in ROWS.items():
        cells = []
        for e in columns:
            if private == math.isinf(e):
                cells.append("")
                continue
            ba, auc = scores(results, row, e), scores(results, row, e, "auc")
            cells.append(f"{describe(list(ba.values()))} (AUC {describe(list(auc.values()))}, n={len(ba)})"
                         if ba else "–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def difference_line(results, a, b, label):
    p = paired(results, a, b)
    if p is None:
        return None
    mean, se, wins, n = p
    return f"- {label}: **{mean:+.1f} ± {se:.1f}** points (paired over {n} seeds, {wins}/{n} wins)"


def targets(results):
    """The target lines, paired over seeds (module docstring)."""
    public, plain = ("public", math.inf), ("fed-finetune", math.inf)
    lines = []
    for row in ("dp-finetune", "dp-finetune-head"):
        label = ROWS[row][0]
        eight, one = (row, 8.0), (row, 1.0)
        line = difference_line(results, eight, public, f"{label} at ε = 8 − public only (target ≥ +3)")
        if line:
            mean = paired(results, eight, public)[0]
            lines.append(line + f": {'met' if mean >= 3 else 'MISSED'}")
        sa, sb = scores(results, *eight), scores(results, *plain)
        seeds = sorted(set(sa) & set(sb))
        if seeds:
            ratio = np.mean([sa[s] for s in seeds]) / np.mean([sb[s] for s in seeds])
            lines.append(f"- {label} at ε = 8 / non-private fine-tuned: **{100 * ratio:.0f} %** over {len(seeds)} "
                         f"seeds (target ≥ 90 %: {'met' if ratio >= 0.9 else 'MISSED'})")
        line = difference_line(results, one, public, f"{label} at ε = 1 − public only (target ≥ −1)")
        if line:
            mean = paired(results, one, public)[0]
            lines.append(line + f": {'met' if mean >= -1 else 'MISSED'}")
    dbn = ("public-dbn", math.inf)
    # (a, b, label, floor, level): the target is a - b >= floor beyond two standard errors,
    # or, with level, a - b not below floor beyond them (level or higher)
    for a, b, label, floor, level in (
            (("dp-dbn", 8.0), ("recenter-tslr", math.inf),
             "DP domain-BN at ε = 8 − Recenter+TS+LR (target: at least level)", 0.0, True),
            (("dp-dbn", 8.0), dbn, "DP domain-BN at ε = 8 − public domain-BN (target ≥ +1)", 1.0, False),
            (("dp-dbn", 1.0), dbn, "DP domain-BN at ε = 1 − public domain-BN (target ≥ −1)", -1.0, False)):
        p = paired(results, a, b)
        if p is not None:
            mean, se = p[0], p[1]
            if level:
                verdict = "reached" if mean + 2 * se >= floor else "NOT REACHED"
            else:
                verdict = ("reached" if mean - 2 * se >= floor else "within two standard errors of the line"
                           if mean + 2 * se >= floor else "NOT REACHED")
            lines.append(difference_line(results, a, b, label) + f": {verdict}")
    for a, b, label in ((("fed-dbn", math.inf), dbn, "non-private domain-BN fine-tuned − public domain-BN"),
                        (dbn, public, "public domain-BN − public only"),
                        (("fed-finetune", math.inf), public, "non-private fine-tuned − public only"),
                        (("fed-finetune", math.inf), ("fed-scratch", math.inf),
                         "non-private fine-tuned − non-private from scratch"),
                        (("dp-finetune", 8.0), ("dp-scratch", 8.0), "DP fine-tuned − DP from scratch at ε = 8"),
                        (("dp-finetune-head", 8.0), ("dp-finetune", 8.0), "DP head − DP whole network at ε = 8"),
                        (public, ("recenter-tslr", math.inf), "public only − Recenter+TS+LR")):
        line = difference_line(results, a, b, label)
        if line:
            lines.append(line)
    return lines


def budget_check(results):
    """Every site's ε spent ≤ the requested ε (the accountant's own numbers in ``privacy_``)."""
    private = [r for rs in results.values() for r in rs if r["target_epsilon"] is not None]
    if not private:
        return "no DP run yet"
    ok = all(max(r["epsilon_spent"]) <= r["target_epsilon"] for r in private)
    worst = max(max(r["epsilon_spent"]) / r["target_epsilon"] for r in private)
    verdict = "every site's ε spent ≤ the requested ε" if ok else "A SITE SPENT MORE THAN THE REQUESTED ε"
    return (f"Budget: {verdict} ({sum(len(r['epsilon_spent']) for r in private)} (site, run) pairs, largest "
            f"spent / requested = {worst:.4f}, δ = {DELTA:g}).")


def convergence(results):
    """The non-private federated fits' mean training loss over rounds: first 10, the 10
    before the last 10, the last 10 (a fit still learning shows a clear fall at the end)."""
    lines = []
    for row in ("fed-scratch", "fed-finetune", "fed-dbn"):
        curves = [r["train_loss"] for r in results.get((row, "inf"), []) if r["train_loss"]]
        if curves and len(curves[0]) >= 20:
            c = np.mean(curves, axis=0)
            lines.append(f"- {ROWS[row][0]}: training loss {c[:10].mean():.3f} (rounds 1-10), "
                         f"{c[-20:-10].mean():.3f} (the 10 before the last), {c[-10:].mean():.3f} (last 10)")
    return lines


def plot(results, epsilons, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for index, (row, (label, private, _)) in enumerate(ROWS.items()):
        color = f"C{index}"  # one colour per row, lines and levels alike
        if private:
            values = [list(scores(results, row, e).values()) for e in epsilons]
            mean = [np.mean(v) if v else np.nan for v in values]
            se = [np.std(v, ddof=1) / math.sqrt(len(v)) if len(v) > 1 else 0.0 for v in values]
            ax.errorbar(epsilons, mean, yerr=se, marker="o", capsize=3, label=label, color=color)
        else:
            values = list(scores(results, row, math.inf).values())
            if values:
                ax.axhline(np.mean(values), ls="--", lw=1, label=f"{label} (no DP)", color=color)
    ax.axhline(50, color="grey", lw=0.8, ls=":", label="chance")
    ax.set_xscale("log")
    ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
    ax.set_xticks([], minor=True)
    ax.set_xlabel(f"ε per site (δ = {DELTA:g})")
    ax.set_ylabel("balanced accuracy per test subject (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def record_name(profile, site_size, unseen):
    return f"privacy-pretrain-{profile}-" + ("unseen" if unseen else f"sites-of-{site_size}")


def subject_epsilons(records, site_trials, subject_trials):
    """The group-privacy bound (:func:`skfedspd.privacy.group_epsilon`) for one subject's
    training trials, at each site of each DP record with released means: the largest."""
    bounds = []
    for r in records:
        release = r["domain_release"]
        for sigma, n in zip(r["noise_multipliers"], site_trials):
            steps = r["setup"]["rounds"] * steps_per_epoch(min(1.0, BATCH_SIZE / n))
            bounds.append(group_epsilon(sigma, DELTA, steps, subject_trials, domain=release))
    return max(bounds)


def write_record(results, rows, epsilons, seeds, settings, command, unseen, site_trials, subject_trials,
                 wall_seconds, folder=store.RECORDS):
    """The tracked record of a complete run (every cell of ``rows`` at every seed; None
    otherwise): per-seed scores (mean over the test subjects, %), the ε split of the DP
    rows with released means, the budget check, and the group-privacy bound of one
    subject's ``subject_trials`` training trials (sites of ``site_trials`` trials); ``wall_seconds``:
    the run's wall time (the fact ``fit_minutes`` sums the runs' fit times)."""
    cells = [(row, math.inf) for row in rows if not ROWS[row][1]] + [(row, e) for row in rows if ROWS[row][1]
                                                                       for e in epsilons]
    if any(len(scores(results, row, e)) < seeds for row, e in cells):
        return None
    metrics = {"balanced_accuracy": "balanced accuracy (%)", "auc": "ROC-AUC (%)"}
    if unseen:
        metrics["online_balanced_accuracy"] = f"balanced accuracy online, from trial {ONLINE_FROM + 1} (%)"
    table = {}
    for row, e in cells:
        label = ROWS[row][0] + ("" if math.isinf(e) else f", ε = {e:g}")
        table[f"{row}/{eps_key(e)}"] = {"label": label, "scores": {m: scores(results, row, e, m) for m in metrics}}
    private = [r for rs in results.values() for r in rs if r["target_epsilon"] is not None]
    facts = dict(settings, seeds=seeds, sites=len(SITE_SUBJECTS) // settings["site_size"] - (1 if unseen else 0),
                 test_subjects=UNSEEN_BLOCK if unseen else len(SITE_SUBJECTS),
                 fit_minutes=round(sum(r["fit_seconds"] for rs in results.values() for r in rs) / 60, 1),
                 site_runs=sum(len(r["epsilon_spent"]) for r in private),
                 largest_spent_ratio=f"{max(max(r['epsilon_spent']) / r['target_epsilon'] for r in private):.4f}"
                 if private else "–")
    for e in epsilons:
        released = [r for r in results.get(("dp-dbn", eps_key(e)), []) if r.get("domain_release")]
        if released:
            facts[f"release_epsilon_{eps_key(e)}"] = f"{max(r['domain_release']['epsilon'] for r in released):.2f}"
            facts[f"training_epsilon_{eps_key(e)}"] = f"{max(max(r['training_epsilon']) for r in released):.2f}"
            facts[f"total_epsilon_{eps_key(e)}"] = f"{max(max(r['epsilon_spent']) for r in released):.2f}"
            facts[f"subject_epsilon_{eps_key(e)}"] = f"{subject_epsilons(released, site_trials, subject_trials):.0f}"
    facts.update(site_trials=site_trials, subject_trials=subject_trials)
    reference = "recenter-tslr/inf" if "recenter-tslr/inf" in table else next(iter(table))
    title = ("Public pre-training, then DP fine-tuning: " + ("subjects in no site" if unseen else
             f"sites of {settings['site_size']}"))
    return store.write_record(record_name(settings.get("profile", "quick"), settings["site_size"], unseen),
                              title=title, command=command, rows=table, metrics=metrics, reference=reference,
                              paired_by="seed", wall_seconds=wall_seconds, facts=facts, folder=folder)


PROG = "python -m benchmarks.experiments privacy-pretrain"


def add_arguments(parser):
    parser.add_argument("--quick", action="store_true", help="the quick profile (3 seeds)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None, help="a profile by name")
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default: the profile's)")
    parser.add_argument("--site-size", type=int, choices=(4, 8, 12), default=4,
                        help="subjects per site (6, 3 or 2 sites)")
    parser.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS), help="budgets of the DP rows")
    parser.add_argument("--rows", nargs="+", choices=sorted(ROWS), default=list(ROWS), help="the rows to fit and report")
    parser.add_argument("--unseen", action="store_true",
                        help=f"test on site subjects in no site (seed s holds out its block of {UNSEEN_BLOCK}), whole "
                             f"recording and online from trial {ONLINE_FROM}")
    parser.add_argument("--channels", choices=("sensorimotor", "all"), default="sensorimotor",
                        help="the 16 sensorimotor channels (default) or all 64")
    parser.add_argument("--rounds", type=int, default=None, help="federated rounds (default: the profile's)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds fitted in parallel processes")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    parser.add_argument("--report-only", action="store_true", help="fit nothing: report the records in --out")
    parser.add_argument("--docs", type=Path, default=None, help="also copy the figure to <DOCS>/")


def run(args, argv=None):
    """The experiment of ``args`` (``argv``: its options as given, for the command line)."""
    profile, budget, seeds = resolve_profile(args, PROFILES)
    settings = setup(budget, args.site_size, args.channels, args.unseen)
    out = args.out or Path("results") / (f"privacy-pretrain-{profile}-sites-of-{args.site_size}"
                                         + ("-unseen" if args.unseen else ""))
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join([PROG, *(argv if argv is not None else sys.argv[2:])])
    print(f"command: {command}\nskfedspd {__version__}; machine: {machine()}\nsetup: {settings}, {seeds} seeds",
          flush=True)
    start = time.perf_counter()
    data = load_covariances(Path("results") / f"physionet-leftright-{args.channels}.npz", args.channels)
    print(f"{len(data[1])} trials, {len(np.unique(data[2]))} subjects loaded in "
          f"{time.perf_counter() - start:.0f} s", flush=True)

    def cached(row, epsilon, seed):
        file = record_path(out, row, epsilon, seed)
        record = json.loads(file.read_text()) if file.exists() else None
        return record if record is not None and record.get("setup") == settings else None

    runs = [run for run in runs_of(args.epsilons, seeds) if run[0] in args.rows]
    todo = {}
    for row, e, s in runs:
        if not args.report_only and cached(row, e, s) is None:
            todo.setdefault(s, []).append((row, e))
    print(f"{len(runs) - sum(map(len, todo.values()))} of {len(runs)} runs cached", flush=True)
    fit_start = time.perf_counter()
    for batch in Parallel(n_jobs=args.jobs, return_as="generator_unordered")(
            delayed(run_seed)(data, s, cells, budget, args.site_size, settings, out) for s, cells in todo.items()):
        for r in batch:
            spent = "" if r["epsilon_spent"] is None else f", ε spent ≤ {max(r['epsilon_spent']):.3f}"
            print(f"  seed {r['seed']} {r['row']:17s} ε={r['epsilon']:4s}: balanced accuracy {mean_score(r):5.1f}, "
                  f"AUC {mean_score(r, 'auc'):5.1f} ({r['fit_seconds']:.0f} s{spent})", flush=True)
    fit_minutes = (time.perf_counter() - fit_start) / 60
    results = {}
    for row, e, s in runs:
        record = cached(row, e, s)
        if record is not None:
            results.setdefault((row, eps_key(e)), []).append(record)
    n_sites = len(SITE_SUBJECTS) // args.site_size
    title = (f"PhysionetMI left/right, {data[0].shape[1]} channels; public: 16 subjects; "
             f"{n_sites} sites of {args.site_size} subjects; {budget['rounds']} rounds")
    figure = out / f"privacy_pretraining_{profile}_sites_of_{args.site_size}.png"
    plot(results, args.epsilons, figure, title)
    report = [f"### Public pre-training, then DP fine-tuning: {profile} profile, sites of {args.site_size}", "",
              table(results, args.epsilons), "",
              f"Balanced accuracy (%) per test subject, mean over the {len(SITE_SUBJECTS)} site subjects, then mean ± "
              f"standard error over seeds (ROC-AUC beside it); {title}; setup {settings}.", "",
              "Targets and paired differences:", *targets(results), "", budget_check(results), "",
              "Convergence (non-private federated rows, mean over seeds):", *convergence(results), "",
              f"Figure: `{figure}`" + (f" (copied to `{args.docs / figure.name}`)" if args.docs else ""), "",
              f"Command: `{command}` (skfedspd {__version__}); {fit_minutes:.1f} min fitting, {args.jobs} process(es) "
              f"of 1 torch thread; {machine()}; {load_average()} at the end."]
    train, _ = site_split(data[1], data[2], 0, unseen=args.unseen)
    per_subject = {s: int(np.sum(data[2][train] == s)) for s in np.unique(data[2][train])}
    ordered = [per_subject[s] for s in sorted(per_subject)]
    site_trials = [sum(ordered[i:i + args.site_size]) for i in range(0, len(ordered), args.site_size)]
    path = None if profile == "smoke" else write_record(  # the smoke profile tests the plumbing, not the science
        results, args.rows, args.epsilons, seeds, dict(settings, profile=profile), command, args.unseen,
        site_trials, int(np.median(ordered)), time.perf_counter() - start)
    report.append(f"Record: `{path}`" if path else "No record written: " + (
        "the smoke profile." if profile == "smoke" else "the run is incomplete."))
    write_report(report, out, figure, args.docs)
