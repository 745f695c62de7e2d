"""Privacy-utility trade-off: DP-FedSPDnet (ProjAvg, RLAvg) vs DP-FedEEGNet on PhysionetMI.

Protocol: Table I of the ``table-one`` experiment (4 classes, clients of 2 subjects, each
client's stratified 85/15 train/test split per seed, E = 2 local epochs, Adam 1e-3, batch
64, full participation) with the package's recommended server optimizer (FedAvgM on the
Stiefel manifold, ``ServerMomentum(lr=1.0, momentum=0.9)``: ``docs/design-decisions.md``), in DP mode
(``docs/guide/privacy.md``): sample-level (ε, δ)-DP per site, δ = 1e-5, clip norm 1, no
validation split (DP mode keeps the last global model after a fixed number of rounds, so
the 10 % validation part of Table I joins the training part), SPDnet with per-matrix
``scaling="trace"`` (nothing pooled). ε = ∞ is the same protocol without clipping or noise
(EEGNet with its BatchNorm trained as usual), so the columns differ only by the privacy
budget. DP-FedEEGNet runs with its BatchNorm frozen (affine weights trained privately:
``skfedspd.privacy``), the same rounds, its own learning rate (1e-3: ``EEGNetClassifier``'s
default and Table I's) and the same server momentum (FedAvgM on its Euclidean weights).

Why this setup (fixed before any DP run, never tuned on a DP result). Under a fixed ε the
noise of each DP-SGD step grows with the number of steps (Abadi et al. 2016; De et al.
2022; Ponomareva et al. 2023), so the budget goes to as few rounds as the *non-private*
model needs, each made as effective as possible. Server momentum is post-processing of
the released aggregates: free under DP, and it averages the per-round noise while it
multiplies the steps along persistent directions by up to 1/(1 − β) = 10. The local
learning rate stays Table I's Adam 1e-3, the one server momentum was validated with: with
``SPDnetClassifier``'s centralized default lr = 1e-2 on top of β = 0.9 (an effective step
of 0.1) the ε = ∞ training loss of the sizing run stalls near 0.8 and oscillates instead of
decreasing (``--quick --curve 80 --curve-lr 0.01``; docs/design-decisions.md).

Rounds (one rule, per profile): ``--curve`` fits the ε = ∞ ProjAvg model of seed 0 one round
at a time and prints its training loss and test macro-F1; ``R`` is the first multiple of 10
whose last 10 rounds' mean test macro-F1 is within 1 point of the best 10-round mean over
80 rounds (the non-private model has stopped improving; DP runs then spend their budget on
no more rounds than that). The test curve of one seed of the ε = ∞ run is the only thing
looked at; the DP columns never feed back into the setup.

    python -m benchmarks.experiments privacy --quick                  # 4 subjects (2 clients), 1 seed, ~5 min on 2 cores
    python -m benchmarks.experiments privacy --seeds 3 --models spdnet-projavg eegnet  # full, seeds 0-2
    python -m benchmarks.experiments privacy                          # full: 16 offline subjects, 10 seeds
    python -m benchmarks.experiments privacy --quick --curve 80       # the round-sizing run

Public pre-training, then DP fine-tuning at the sites: the ``privacy-pretrain`` experiment.

Every (ε, model, seed) result is stored as JSON under ``--out`` with its setup; a re-run
skips what is done with the same setup and refits the rest, so the full profile can be
extended seed by seed.

Record (``benchmarks/records``): every run but the smoke profile's, ``--report-only``
included, writes ``privacy-<profile>`` (another site size, montage or round count in the
name: :func:`record_name`) from the results in ``--out``, replacing the last one. Rows: test
macro-F1 (%) per seed of every fitted (model, ε) cell, uniform guessing on the same test sets,
and the non-private centralized TS+LR on the same trials, the reference: the one row every
seed and every model shares, the non-private ceiling of Table I (a model's own ε = ∞ row is
compared with its DP rows pair by pair). Facts: the setup, the budget check, the seed-0 plan
(sample rate, σ per site) and one DP step's signal against its noise.
"""

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from joblib import Parallel, delayed
from sklearn.metrics import f1_score

from .._machine import load_average
from .._machine import machine_line as machine
from ..records import store
from .data import offline_root
from .report import resolve_profile, write_report
from .table_one_cells import SERVER_MOMENTUM, Cell
from .table_one_protocols import LOCAL_EPOCHS, TRAINING, physionet_protocol
from .table_one_protocols import PROFILES as TABLE_ONE_PROFILES
from .table_one_runner import client_split, fit_cell, load_or_skip
from skfedspd import EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.datasets import SENSORIMOTOR_CHANNELS, sample_covariance
from skfedspd.clients import ClientPartition, make_clients
from skfedspd.dp_sgd import clip_and_sum, per_sample_gradients
from skfedspd.privacy import DPSGD
from skfedspd.server_optimizer import ServerMomentum
from skfedspd.training import torch_threads

#: Rounds sized by ``--curve 80`` (module docstring): quick 50 (2 clients), full 70 (8 clients).
PROFILES = {
    "quick": dict(subjects=[1, 2, 3, 4], seeds=1, rounds=50),
    "full": dict(subjects=None, seeds=10, rounds=70),
    "smoke": dict(subjects=[1, 2, 3, 4], seeds=1, rounds=1),  # the plumbing, not the science
}
EPSILONS = (1.0, 3.0, 8.0, math.inf)
DELTA = 1e-5
CLIP_NORM = 1.0
LOCAL_LR = TRAINING["lr"]
BATCH_SIZE = TRAINING["batch_size"]
MODELS = ("spdnet-projavg", "spdnet-rlavg", "eegnet")
LABELS = {"spdnet-projavg": "DP-FedSPDnet (ProjAvg)", "spdnet-rlavg": "DP-FedSPDnet (RLAvg)",
          "eegnet": "DP-FedEEGNet (FedAvg)"}


def estimator(protocol, model, epsilon, rounds, seed, warm_start=False, lr=LOCAL_LR, subjects_per_site=2):
    """The federated estimator of one (model, ε, seed) run: the setup of the module docstring
    (sites of ``subjects_per_site`` subjects; Table I: 2)."""
    if model == "eegnet":
        local = EEGNetClassifier(fs=protocol.fs, lr=lr, batch_size=BATCH_SIZE)
    else:
        local = SPDnetClassifier(hidden_dims=(protocol.hidden_dim,), eps=protocol.eps, scaling="trace", lr=lr,
                                 batch_size=BATCH_SIZE)
    private = not math.isinf(epsilon)
    return FederatedSPDnetClassifier(
        local, aggregation="projavg" if model == "eegnet" else model.split("-")[1], n_rounds=rounds,
        local_epochs=LOCAL_EPOCHS, clients=ClientPartition(groups_per_client=subjects_per_site),
        validation_fraction=0.0, random_state=seed,
        warm_start=warm_start, client_optimizer_state="reset", server_optimizer=ServerMomentum(**SERVER_MOMENTUM),
        privacy=DPSGD(epsilon=epsilon, delta=DELTA, clip_norm=CLIP_NORM) if private else None)


def setup(rounds, subjects_per_site=2, channels="all"):
    """What a cached run was fitted with: a run of another setup is refitted, never reused.
    Table I's sites of 2 subjects and all channels leave their keys out, as the runs cached
    before those keys existed."""
    sites = {} if subjects_per_site == 2 else {"subjects_per_site": subjects_per_site}
    montage = {} if channels == "all" else {"channels": channels}
    return dict(rounds=rounds, **sites, **montage, lr=LOCAL_LR, batch_size=BATCH_SIZE, local_epochs=LOCAL_EPOCHS, delta=DELTA,
                clip_norm=CLIP_NORM, server_momentum=SERVER_MOMENTUM["momentum"], server_lr=SERVER_MOMENTUM["lr"])


def run_one(protocol, data, model, epsilon, seed, rounds, n_threads, subjects_per_site=2, channels="all"):
    X_cov, X_raw, y, subjects = data
    train, test = client_split(y, subjects, seed)
    X = X_raw if model == "eegnet" else X_cov
    start = time.perf_counter()
    with torch_threads(n_threads):
        clf = estimator(protocol, model, epsilon, rounds, seed, subjects_per_site=subjects_per_site).fit(
            X[train], y[train], groups=subjects[train])
        pred = clf.predict(X[test])
    privacy = clf.privacy_
    return {"model": model, "epsilon": eps_key(epsilon), "seed": seed,
            "setup": setup(rounds, subjects_per_site, channels),
            "f1": float(f1_score(y[test], pred, average="macro")), "rounds": rounds,
            "classes_predicted": int(len(np.unique(pred))),
            "chance_f1": chance_f1(y[test], seed),
            "fit_seconds": time.perf_counter() - start,
            "target_epsilon": None if privacy is None else privacy["target_epsilon"],
            "epsilon_spent": None if privacy is None else [s["epsilon"] for s in privacy["sites"]],
            "noise_multipliers": None if privacy is None else [s["noise_multiplier"] for s in privacy["sites"]],
            "sample_rates": None if privacy is None else [s["sample_rate"] for s in privacy["sites"]],
            "accountant": None if privacy is None else privacy["accountant"]}


def tslr_reference(protocol, data, seeds):
    """Table I's non-private centralized TS+LR cell on the same training and test trials:
    test macro-F1 per seed."""
    cell, budget = Cell("centralized", "ts-lr"), TABLE_ONE_PROFILES["full"]  # the budget sizes networks only
    return np.array([fit_cell(protocol, cell, data, seed, budget)["f1"] for seed in seeds])


def chance_f1(y_test, seed, n_draws=1000):
    """Macro-F1 of uniform random guessing on this test set: ``(mean, 95th percentile)`` over draws."""
    classes = np.unique(y_test)
    rng = np.random.default_rng(seed)
    draws = [f1_score(y_test, rng.choice(classes, len(y_test)), average="macro") for _ in range(n_draws)]
    return [float(np.mean(draws)), float(np.percentile(draws, 95))]


def gradient_signal_to_noise(protocol, data, model, noise_multiplier, sample_rate, subjects_per_site=2):
    """Why DP-SGD learns or not here: one DP step's signal against its noise, on site 0.

    At the global model after one ε = ∞ round (seed 0), the per-sample gradients of an
    expected batch of site 0 (Riemannian for the Stiefel weight) are clipped to ``C`` and
    averaged: the norm of that mean is the step's signal (at most ``C``). The noise of the
    same step has norm ``σ C √d / (q n)`` (``d`` trainable coordinates). Returns a dict.
    """
    X_cov, X_raw, y, subjects = data
    X = X_raw if model == "eegnet" else X_cov
    train, _ = client_split(y, subjects, 0)
    with torch_threads(1):
        est = estimator(protocol, model, math.inf, 1, 0, subjects_per_site=subjects_per_site).fit(
            X[train], y[train], groups=subjects[train]).global_estimator_
        site = train[np.isin(subjects[train], np.unique(subjects)[:subjects_per_site])]
        batch = site[np.random.default_rng(0).permutation(len(site))[:round(sample_rate * len(site))]]
        module = est.module_.eval()  # BatchNorm on running statistics, as DP-SGD runs it; no dropout
        if hasattr(module, "recenter_"):
            module.recenter_()  # the gradient of V at V = 0 is the Riemannian gradient
        grads, _ = per_sample_gradients(module, est.to_tensor(X[batch]),
                                        torch.as_tensor(est.encode_labels(y[batch], len(batch))))
    summed, norms = clip_and_sum(grads, CLIP_NORM)
    d = sum(g[0].numel() for g in grads.values())
    signal = float(torch.sqrt(sum((v / len(batch)).pow(2).sum() for v in summed.values())))
    noise = noise_multiplier * CLIP_NORM * math.sqrt(d) / len(batch)
    return dict(d=d, median_norm=float(norms.median()), clipped=float((norms > CLIP_NORM).float().mean()),
                signal=signal, noise=noise)


def convergence_curve(protocol, data, n_rounds, block=10, lr=LOCAL_LR):
    """The round-sizing run: ε = ∞, ProjAvg, seed 0, one round at a time (warm start).

    Returns one ``(round, training loss, test macro-F1)`` per round and the rule's ``R``:
    the first multiple of ``block`` whose last ``block`` rounds' mean test macro-F1 is
    within 1 point of the best ``block``-round mean of the curve.
    """
    X_cov, _, y, subjects = data
    train, test = client_split(y, subjects, 0)
    clf = estimator(protocol, "spdnet-projavg", math.inf, 1, 0, warm_start=True, lr=lr)
    curve = []
    for r in range(1, n_rounds + 1):
        clf.fit(X_cov[train], y[train], groups=subjects[train])
        curve.append((r, clf.history_[-1]["train_loss"], f1_score(y[test], clf.predict(X_cov[test]), average="macro")))
    means = [np.mean([f1 for _, _, f1 in curve[i - block:i]]) for i in range(block, n_rounds + 1, block)]
    sized = block * (1 + next(i for i, m in enumerate(means) if m >= max(means) - 0.01))
    return curve, sized


def eps_key(epsilon):
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def eps_label(epsilon):
    return "∞" if math.isinf(epsilon) else f"{epsilon:g}"


def f1_values(results, model, epsilon):
    return 100 * np.array([r["f1"] for r in results.get((model, eps_key(epsilon)), [])])


def epsilons_present(results):
    """The budgets of the table and figure: the default ones and any other fitted."""
    fitted = {math.inf if k == "inf" else float(k) for _, k in results}
    return sorted(set(EPSILONS) | fitted)


def table(results):
    epsilons = epsilons_present(results)
    lines = ["| model | " + " | ".join(f"ε = {eps_label(e)}" for e in epsilons) + " |",
             "| --- |" + " --- |" * len(epsilons)]
    for model in MODELS:
        cells = []
        for e in epsilons:
            f1 = f1_values(results, model, e)
            cells.append(f"{f1.mean():.1f} ± {f1.std():.1f} (n={len(f1)})" if len(f1) else "–")
        lines.append(f"| {LABELS[model]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(results):
    """The target lines, on the seeds present in every cell they compare."""
    lines = []
    for model in ("spdnet-projavg", "spdnet-rlavg"):
        private, plain = f1_values(results, model, 8.0), f1_values(results, model, math.inf)
        eeg = f1_values(results, "eegnet", 8.0)
        if len(private) and len(plain):
            ratio = private.mean() / plain.mean()
            lines.append(f"- {LABELS[model]}, ε = 8 vs ε = ∞: {private.mean():.1f} / {plain.mean():.1f} = "
                         f"**{100 * ratio:.0f} %** (target ≥ 80 %: {'reached' if ratio >= 0.8 else 'NOT REACHED'})")
        if len(private) and len(eeg):
            margin = private.mean() - eeg.mean()
            high = 100 * np.mean([r["chance_f1"][1] for r in results[(model, "8")]])
            caveat = "" if private.mean() > high else (
                f"; but {LABELS[model]} is not above chance at ε = 8 (95th percentile of uniform guessing "
                f"{high:.1f}): a margin between two models at chance level, not a utility result")
            lines.append(f"- {LABELS[model]} − DP-FedEEGNet at ε = 8: {private.mean():.1f} − {eeg.mean():.1f} = "
                         f"**{margin:+.1f} points** (target ≥ +5: {'reached' if margin >= 5 else 'NOT REACHED'}{caveat})")
        low = results.get((model, "1"), [])
        if low:
            f1 = 100 * np.mean([r["f1"] for r in low])
            chance = 100 * np.mean([r["chance_f1"][0] for r in low])
            high = 100 * np.mean([r["chance_f1"][1] for r in low])
            lines.append(f"- {LABELS[model]} at ε = 1: {f1:.1f}, chance (uniform guessing on the same test sets) "
                         f"{chance:.1f}, its 95th percentile {high:.1f}: margin **{f1 - chance:+.1f} points** "
                         f"({f1 - high:+.1f} over the 95th percentile)")
    return lines


def signal_to_noise(protocol, data, results, subjects_per_site=2):
    """``{model: gradient_signal_to_noise(...)}`` at ε = 8 (seed 0's noise multiplier and
    sample rate of site 0), for the models with an ε = 8 run."""
    diagnoses = {}
    for model in ("spdnet-projavg", "eegnet"):
        runs = results.get((model, "8"))
        if runs:
            seed0 = min(runs, key=lambda r: r["seed"])
            diagnoses[model] = gradient_signal_to_noise(protocol, data, model, seed0["noise_multipliers"][0],
                                                        seed0["sample_rates"][0], subjects_per_site)
    return diagnoses


def diagnosis(diagnoses):
    """One line per model of :func:`signal_to_noise`: a DP step's signal and noise at ε = 8."""
    lines = [f"- {LABELS[model]}, one DP step at ε = 8 (site 0, after 1 round): d = {g['d']} coordinates, "
             f"median per-sample gradient norm {g['median_norm']:.2f} ({100 * g['clipped']:.0f} % clipped "
             f"at C = {CLIP_NORM:g}); mean clipped gradient {g['signal']:.3f} vs noise "
             f"σC√d/(qn) = {g['noise']:.2f}: signal / noise = **{g['signal'] / g['noise']:.3f}** per step"
             for model, g in diagnoses.items()]
    return ["Signal against noise:", *lines] if lines else []


def gaussian_dp_mu(epsilon, delta=DELTA):
    """The μ of μ-Gaussian DP whose (ε, δ) curve passes through (``epsilon``, ``delta``)
    (Dong, Roth & Su 2022, Corollary 2.13): the signal-to-noise a μ-GDP mechanism allows."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def delta_of(mu):
        return norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)

    return brentq(lambda mu: delta_of(mu) - delta, 1e-3, 100.0)


def budget_facts(results):
    """``(ok, DP runs, (site, run) pairs, largest spent / requested, accountant)`` over the DP
    runs, by the accountant's own computation; None without a DP run."""
    private = [r for rs in results.values() for r in rs if r["target_epsilon"] is not None]
    if not private:
        return None
    worst = max(max(r["epsilon_spent"]) / r["target_epsilon"] for r in private)
    ok = all(max(r["epsilon_spent"]) <= r["target_epsilon"] for r in private)
    return ok, len(private), sum(len(r["epsilon_spent"]) for r in private), worst, private[0]["accountant"]


def budget_check(results):
    """Every site's ε spent ≤ the requested ε, by the accountant's own computation."""
    facts = budget_facts(results)
    if facts is None:
        return "no DP run yet"
    ok, runs, sites, worst, accountant = facts
    verdict = "every site's ε spent ≤ the requested ε" if ok else "A SITE SPENT MORE THAN THE REQUESTED ε"
    return (f"Budget: {verdict}: {sites} (site, run) pairs over "
            f"{runs} DP runs, largest spent / requested = {worst:.4f} ({accountant['cls']} "
            f"{accountant['version']}, δ = {DELTA:g})")


def record_name(profile, subjects_per_site=2, channels="all", rounds=None):
    """``privacy-full``; another site size, montage or round count than the profile's is in the name."""
    return (f"privacy-{profile}" + (f"-sites-of-{subjects_per_site}" if subjects_per_site != 2 else "")
            + (f"-{channels}" if channels != "all" else "") + (f"-rounds-{rounds}" if rounds is not None else ""))


def row_label(model, epsilon):
    if math.isinf(epsilon):
        return LABELS[model].replace("DP-", "") + ", no DP (ε = ∞)"
    return f"{LABELS[model]}, ε = {eps_label(epsilon)}"


def span(values, digits):
    """``"0.55"`` or ``"0.55–0.71"``: the range of ``values``."""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}–{high}"


def write_record(name, results, reference, diagnoses, command, facts, site_trials, wall_seconds, folder=None):
    """The tracked record of a run: test macro-F1 (%) per seed of every fitted (model, ε)
    cell, of uniform guessing on the same test sets, and of the non-private centralized
    TS+LR (``reference``: its macro-F1 per seed, the record's reference row); the budget
    check, the seed-0 plan of the DP runs (sample rate, σ per site) and the signal-to-noise
    of one DP step (``diagnoses``: :func:`signal_to_noise`) as facts; ``site_trials``: the
    sites' training trials at seed 0, in the order of ``privacy_["sites"]``; ``wall_seconds``: the
    run's wall time (the fact ``fit_minutes`` sums the runs' fit times); the rows whose model
    predicted one class for every test trial of every seed as the fact ``predicts_one_class``
    (:mod:`benchmarks.records.render` reads them as chance, not as a score). Returns its path."""
    rows = {"tslr": {"label": "TS+LR, centralized, no DP", "scores": {"macro_f1": {
        s: 100 * f for s, f in enumerate(reference)}}}}
    chance, high = {}, []
    for model in MODELS:
        for epsilon in epsilons_present(results):
            runs = results.get((model, eps_key(epsilon)), [])
            if runs:
                rows[f"{model}/{eps_key(epsilon)}"] = {"label": row_label(model, epsilon), "scores": {
                    "macro_f1": {r["seed"]: 100 * r["f1"] for r in runs}}}
            for r in runs:
                chance[r["seed"]] = 100 * r["chance_f1"][0]
                high.append((r["seed"], 100 * r["chance_f1"][1]))
    rows["chance"] = {"label": "uniform guessing (mean over draws)", "scores": {"macro_f1": dict(sorted(chance.items()))}}
    runs = [r for rs in results.values() for r in rs]
    # A model that predicts one class on every seed has a chance score, not a utility (runs
    # cached before the count was kept say nothing).
    one_class = sorted(f"{model}/{key}" for (model, key), rs in results.items()
                       if rs and all(r.get("classes_predicted") == 1 for r in rs))
    facts = dict(facts, predicts_one_class=one_class, seeds=max(len(rs) for rs in results.values()), dp_runs=0,
                 site_train_trials=span(site_trials, 0),
                 fit_minutes=round(sum(r["fit_seconds"] for r in runs) / 60, 1),
                 chance_p95=f"{np.mean(list(dict(high).values())):.1f}")
    budget = budget_facts(results)
    if budget is not None:
        ok, facts["dp_runs"], facts["site_runs"], worst, accountant = budget
        facts.update(budget_within_target=ok, largest_spent_ratio=f"{worst:.4f}",
                     accountant=f"{accountant['cls']} {accountant['version']}")
    for (model, key), rs in results.items():
        seed0 = min(rs, key=lambda r: r["seed"])
        if model == "spdnet-projavg" and seed0["noise_multipliers"]:
            rates = seed0["sample_rates"]
            facts["sample_rate"] = span(rates, 3)
            facts["steps_per_round"] = span([LOCAL_EPOCHS * math.ceil(1 / q) for q in rates], 0)
            facts[f"sigma_{key}"] = span(seed0["noise_multipliers"], 1)
            # the noise's standard deviation per coordinate of a step's mean gradient, relative to C
            facts[f"noise_per_coordinate_{key}"] = span([s / (q * n) for s, q, n in
                                                         zip(seed0["noise_multipliers"], rates, site_trials)], 2)
            facts[f"gdp_mu_{key}"] = f"{gaussian_dp_mu(float(key)):.2f}"
    for model, g in diagnoses.items():
        prefix = "spdnet" if model.startswith("spdnet") else model
        facts.update({f"{prefix}_private_coordinates": g["d"], f"{prefix}_gradient_norm": f"{g['median_norm']:.1f}",
                      f"{prefix}_clipped_percent": f"{100 * g['clipped']:.0f}",
                      f"{prefix}_clipped_mean_norm": f"{g['signal']:.2f}", f"{prefix}_step_noise": f"{g['noise']:.1f}",
                      f"{prefix}_signal_to_noise": f"{g['signal'] / g['noise']:.3f}"})
    title = f"Privacy-utility trade-off: DP-FedSPDnet and DP-FedEEGNet, {facts.get('sites')} sites"
    return store.write_record(name, title=title, command=command, rows=rows, metrics={"macro_f1": "test macro-F1 (%)"},
                              reference="tslr", paired_by="seed", wall_seconds=wall_seconds,
                              facts=facts, folder=store.RECORDS if folder is None else folder)


def plot(results, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epsilons = epsilons_present(results)
    positions = np.arange(len(epsilons))
    fig, ax = plt.subplots(figsize=(6, 4))
    for model in MODELS:
        f1 = [f1_values(results, model, e) for e in epsilons]
        if not any(len(v) for v in f1):
            continue  # a model not fitted has no line (nor legend entry)
        mean = [v.mean() if len(v) else np.nan for v in f1]
        std = [v.std() if len(v) else np.nan for v in f1]
        ax.errorbar(positions, mean, yerr=std, marker="o", capsize=3, label=LABELS[model])
    chance = [r["chance_f1"][0] for rs in results.values() for r in rs]
    if chance:
        ax.axhline(100 * np.mean(chance), color="grey", ls="--", lw=1, label="chance (uniform guessing)")
    ax.set_xticks(positions, [eps_label(e).replace("∞", "∞ (no DP)") for e in epsilons])
    ax.set_xlabel(f"ε (δ = {DELTA:g})")
    ax.set_ylabel("test macro-F1 (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PROG = "python -m benchmarks.experiments privacy"


def add_arguments(parser):
    parser.add_argument("--quick", action="store_true", help="the quick profile: 4 subjects (2 clients), 1 seed")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None, help="a profile by name (--quick: quick)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default: the profile's)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="models to fit")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default results/privacy-<profile>)")
    parser.add_argument("--jobs", type=int, default=1, help="runs fitted in parallel processes")
    parser.add_argument("--report-only", action="store_true", help="train nothing: report the runs in --out")
    parser.add_argument("--curve", type=int, default=None, metavar="ROUNDS",
                        help="run the round-sizing curve (ε = ∞, ProjAvg, seed 0) for ROUNDS rounds and stop")
    parser.add_argument("--curve-lr", type=float, default=LOCAL_LR,
                        help="local learning rate of the --curve run only (the check behind the setup's lr)")
    parser.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS),
                        help="privacy budgets to fit (inf: no DP; default: 1 3 8 inf)")
    parser.add_argument("--subjects-per-site", type=int, default=2,
                        help="federate sites of this many subjects (Table I: 2); the test sets stay those of "
                             "Table I's clients of 2, so site sizes compare on the same trials")
    parser.add_argument("--channels", choices=("all", "sensorimotor"), default="all",
                        help="EEG channels: all 64 (Table I) or the 16 sensorimotor ones "
                             "(skfedspd.datasets.SENSORIMOTOR_CHANNELS; SPDnet's hidden size by its 'auto' rule)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="federated rounds (default: the profile's, sized by --curve for all channels)")
    parser.add_argument("--docs", type=Path, default=None, help="also copy the figure to <DOCS>/")


def run(args, argv=None):
    """The experiment of ``args`` (``argv``: its options as given, for the command line)."""
    profile, budget, seeds = resolve_profile(args, PROFILES)
    k, channels = args.subjects_per_site, args.channels
    if args.curve and (k != 2 or args.epsilons != list(EPSILONS) or args.models != list(MODELS)
                       or args.rounds is not None):
        print(f"{PROG}: error: --curve sizes the rounds of Table I's protocol (ε = ∞, ProjAvg, sites of 2): "
              "no --subjects-per-site, --epsilons, --models or --rounds with it", file=sys.stderr)
        raise SystemExit(2)
    out = args.out or Path("results") / (f"privacy-{profile}" + (f"-sites-of-{k}" if k != 2 else "")
                                         + (f"-{channels}" if channels != "all" else ""))
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join([PROG, *(argv if argv is not None else sys.argv[2:])])
    print(f"command: {command}\nmachine: {machine()}; {load_average()} at start\nprofile: {profile} {budget}; "
          f"setup {setup(budget['rounds'], k, channels)}", flush=True)
    offline_root()
    protocol = physionet_protocol(4, budget["subjects"], None if channels == "all" else SENSORIMOTOR_CHANNELS)
    loaded = load_or_skip(protocol)
    if loaded is None:
        return 1
    X_raw, y, subjects = loaded
    data = (sample_covariance(X_raw), X_raw, y, subjects)
    n_clients = len(np.unique(subjects)) // k
    print(f"{protocol.name}: {len(y)} trials, {len(np.unique(subjects))} subjects, {n_clients} clients", flush=True)
    start = time.perf_counter()

    if args.curve:
        curve, sized = convergence_curve(protocol, data, args.curve, lr=args.curve_lr)
        for r, loss, f1 in curve:
            print(f"  round {r:3d}: training loss {loss:.3f}, test macro-F1 {100 * f1:5.1f}")
        print(f"R = {sized} (rule of the module docstring); {(time.perf_counter() - start) / 60:.1f} min, "
              f"{load_average()}")
        return 0

    runs = [(m, e, s) for s in range(seeds) for e in args.epsilons for m in args.models]

    def path(model, epsilon, seed):
        return out / f"{model}__eps{eps_key(epsilon)}__seed{seed}.json"

    def cached(model, epsilon, seed):
        file = path(model, epsilon, seed)
        record = json.loads(file.read_text()) if file.exists() else None
        return record if record is not None and record.get("setup") == setup(budget["rounds"], k, channels) else None

    todo = [] if args.report_only else [r for r in runs if cached(*r) is None]
    print(f"{len(runs) - len(todo)} of {len(runs)} runs cached, {len(todo)} to fit", flush=True)
    replies = Parallel(n_jobs=args.jobs, return_as="generator_unordered")(
        delayed(run_one)(protocol, data, m, e, s, budget["rounds"], n_threads=1, subjects_per_site=k, channels=channels)
        for m, e, s in todo)
    for record in replies:
        epsilon = math.inf if record["epsilon"] == "inf" else float(record["epsilon"])
        path(record["model"], epsilon, record["seed"]).write_text(json.dumps(record))
        spent = "" if record["epsilon_spent"] is None else f", ε spent ≤ {max(record['epsilon_spent']):.3f}"
        print(f"  {record['model']:15s} ε={record['epsilon']:4s} seed {record['seed']}: macro-F1 "
              f"{100 * record['f1']:5.1f} ({record['fit_seconds']:.0f} s{spent})", flush=True)
    results = {}
    for m, e, s in runs:
        record = cached(m, e, s)
        if record is not None:
            results.setdefault((m, eps_key(e)), []).append(record)
    n_train = len(client_split(y, subjects, 0)[0])
    n_seeds = max((len(rs) for rs in results.values()), default=0)
    title = (f"PhysionetMI, {X_raw.shape[1]} channels, {n_clients} clients of {k} subjects, {budget['rounds']} rounds, "
             f"{n_seeds} seed(s)")
    figure = out / f"privacy_utility_{profile}.png"
    reference = tslr_reference(protocol, data, range(max(n_seeds, 1)))
    plot(results, figure, title)
    sigmas = {f"ε={k}": [round(v, 2) for v in rs[0]["noise_multipliers"]] for (m, k), rs in results.items()
              if rs[0]["noise_multipliers"] and m == "spdnet-projavg"}
    diagnoses = signal_to_noise(protocol, data, results, k)
    report = [f"### Privacy-utility, {profile} profile", "", table(results), "",
              f"Test macro-F1 (%), mean ± std over n seeds; {title}; {n_train} training trials in all (seed 0); "
              f"setup {setup(budget['rounds'], k, channels)}. Noise multipliers per site (ProjAvg, seed 0): {sigmas}.", "",
              f"Non-private centralized TS+LR on the same trials (seeds 0–{n_seeds - 1}): "
              f"{100 * reference.mean():.1f} ± {100 * reference.std():.1f}.", "",
              "Targets:", *targets(results), "", budget_check(results), "", *diagnosis(diagnoses), "",
              f"Figure: `{figure}`" + (f" (copied to `{args.docs / figure.name}`)" if args.docs else ""), "",
              f"Command: `{command}` — {(time.perf_counter() - start) / 60:.1f} min fitting {len(todo)} runs, 1 process, "
              f"1 torch thread each; {machine()}; {load_average()} at the end."]
    if profile != "smoke" and results:  # the smoke profile tests the plumbing, not the science
        train = client_split(y, subjects, 0)[0]
        site_trials = [len(idx) for idx in make_clients(subjects[train], k)[0]]
        facts = dict(setup(budget["rounds"], k, channels), profile=profile, subjects=len(np.unique(subjects)),
                     sites=n_clients, subjects_per_site=k, channels=X_raw.shape[1], trials=len(y), train_trials=n_train)
        path = write_record(record_name(profile, k, channels, args.rounds), results, reference, diagnoses, command,
                            facts, site_trials, time.perf_counter() - start)
        report.append(f"Record: `{path}`")
    write_report(report, out, figure, args.docs)
