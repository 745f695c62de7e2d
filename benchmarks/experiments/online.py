"""Online adaptation to unseen subjects: balanced accuracy against the unlabeled trials seen.

The models of the ``unseen-subjects`` experiment (same folds, read from ``--models``) predict
each test subject as an online BCI does, trial by trial. The subject is a named domain whose
statistics start from the training prior and follow the subject's unlabeled trials
(``adapt`` / ``predict(..., domain=...)``). Every condition is scored on the same trials of
each subject, those after its first ``--warmup`` (20) trials in recording order:

* ``none``: no adaptation (the domain statistics stay at the prior);
* ``k`` = 0, 1, 5, 10, 20: each trial predicted with the statistics of the subject's first
  ``k`` trials (a predict call with ``domain=`` adds the trial to them but scores it without
  itself, so ``0`` is ``none``; the ``(itself included)`` rows, ``--include-self``, score it
  with itself);
* ``k recent`` = 1, 5, 10, 20: the same with the ``k`` trials just before the predicted one.
  Its difference to ``k`` is the subject's drift between runs (the first trials are minutes
  older than the scored ones), which no amount of statistics from the first trials removes;
* ``all``: the whole subject in one call (whole-subject adaptation);
* ``online``: trial by trial in recording order, one predict call per trial, the domain
  updated by every trial before it (the online BCI).

The online BCI is also scored from an earlier trial on: ``online after k`` (``k`` = 0, 1, 5,
10) scores the same trial-by-trial predictions on every trial after the subject's first
``k``, beside ``all after k``, the whole-subject call scored on those trials: the decoder
once it has seen ``k`` unlabeled trials, adapting on.

Rows: SPDnet + domain BN and FedSPDnet + domain BN (the saved models), Recenter+TS+LR
(refitted per fold: ``Recenter`` adapts online the same way) and TS+LR (no adaptation at
all, for reference). With several ``--seeds``, each network's saved model of every seed
predicts; a subject's score is the mean over the seeds, and each condition has a seed-ensemble
row (``NAME | condition, seed ensemble``: every trial's probability averaged over the seeds'
networks, each adapting its own statistics to the same trials), as the ``unseen-subjects``
experiment does for whole subjects.
"""

import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import pandas as pd
import sklearn
from sklearn.base import clone
from sklearn.pipeline import Pipeline

from skfedspd import load_estimator
from skfedspd.online import adaptation_of

from . import report
from .data import LEFT_RIGHT_SUBJECTS, load_left_right
from .pipelines import PIPELINES, fit
from .unseen_subjects import ENSEMBLE, folds, one_training, runs, seed_averaged_scores, seed_ensembles

MODELS = ["SPDnet+dBN", "FedSPDnet+dBN"]
REFITTED = ["Recenter+TS+LR", "TS+LR"]
SEEN = [0, 1, 5, 10, 20]
RECENT = [1, 5, 10, 20]
ONLINE_AFTER = [0, 1, 5, 10]
#: A prior weight no run of trials moves: the statistics stay at the prior.
FROZEN = 1e12


def add_arguments(parser):
    parser.add_argument("--subjects", type=int, nargs="+", default=list(LEFT_RIGHT_SUBJECTS))
    parser.add_argument("--cv", choices=["groupkfold5", "loso"], default="groupkfold5")
    parser.add_argument("--models", type=Path, default=Path("results/unseen-subjects/models"),
                        help="the unseen-subjects experiment's saved models")
    parser.add_argument("--warmup", type=int, default=max(RECENT),
                        help="trials of each subject left out of every score (at least the largest k recent)")
    parser.add_argument("--prior-weights", type=float, nargs="+", default=None,
                        help="also score these prior weights (the ablation of DomainAdaptation's prior_weight); each adds rows")
    parser.add_argument("--memories", type=float, nargs="+", default=None,
                        help="also score these domain memories (the ablation of DomainAdaptation's memory); each adds rows")
    parser.add_argument("--include-self", action="store_true",
                        help="also score each trial with statistics that include it (the ablation of "
                             "DomainAdaptation(include_self=True)); adds rows")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the refitted pipelines")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="the networks' training seeds whose saved models predict (the unseen-subjects run's)")
    parser.add_argument("--out", type=Path, default=Path("results/online"))
    parser.add_argument("--report-only", action="store_true", help="report the predictions already in --out")


def adaptive_step(model):
    """The estimator of ``model`` that holds the domain statistics: a Pipeline's Recenter,
    a federated model's global model, or the model itself."""
    if isinstance(model, Pipeline):
        return model[0]
    return getattr(model, "global_estimator_", model)


@contextmanager
def domain_params(model, **params):
    """Set the fields ``params`` (``prior_weight``, ``memory``, ``include_self``) of the
    domain adaptation of the fitted model's adaptive step for the block; the former settings
    come back after it."""
    step = adaptive_step(model)
    former = step.domain_adaptation
    step.set_params(domain_adaptation=clone(adaptation_of(step)).set_params(**params))
    try:
        yield model
    finally:
        step.set_params(domain_adaptation=former)


def conditions(name, model, X, warmup):
    """``{condition: class-1 probabilities of the subject's last trials}`` (trials warmup..,
    or k.. for ``online after k`` and ``all after k``), plus the median seconds of one
    online predict call."""
    n, rest = len(X), np.arange(warmup, len(X))
    proba = {}
    if name == "TS+LR":
        return {"none": model.predict_proba(X[rest])[:, 1]}, None
    step = adaptive_step(model)
    with sklearn.config_context(enable_metadata_routing=True):
        step.reset_domain()
        with domain_params(model, prior_weight=FROZEN, memory=None):
            proba["none"] = model.predict_proba(X[rest], domain=[f"none-{j}" for j in rest])[:, 1]
        for k in SEEN:
            labels = [f"{k}-{j}" for j in rest]
            for label in labels:
                if k:
                    step.adapt(X[:k], domain=label)
            proba[str(k)] = model.predict_proba(X[rest], domain=labels)[:, 1]
        for k in RECENT:
            labels = [f"{k} recent-{j}" for j in rest]
            for j, label in zip(rest, labels):
                step.adapt(X[j - k : j], domain=label)
            proba[f"{k} recent"] = model.predict_proba(X[rest], domain=labels)[:, 1]
        whole = model.predict_proba(X, domain="all")[:, 1]
        proba["all"] = whole[rest]
        online, seconds = np.empty(n), np.empty(n)
        for i in range(n):
            start = time.perf_counter()
            online[i] = model.predict_proba(X[i : i + 1], domain="online")[0, 1]
            seconds[i] = time.perf_counter() - start
        proba["online"] = online[rest]
        for k in ONLINE_AFTER:
            proba[f"online after {k}"], proba[f"all after {k}"] = online[k:], whole[k:]
        step.reset_domain()
    return proba, float(np.median(seconds))


#: The conditions an ablation's rows keep in the record (the models' own rows keep every one).
ABLATION_RECORDED = ("none", "0", "1", "1 recent", "all", "online")
#: The conditions a seed ensemble's rows keep in the record.
ENSEMBLE_RECORDED = ("none", "10", "all", "online", "online after 10", "all after 10")


def recorded(pipeline):
    """Whether the record keeps the scores of ``pipeline`` (``"model (ablation) | condition"``,
    a seed ensemble's ending in ``", seed ensemble"``)."""
    variant, condition = pipeline.split(" | ")
    if condition.endswith(ENSEMBLE.format("")):
        return "(" not in variant and condition[:-len(ENSEMBLE.format(""))] in ENSEMBLE_RECORDED
    return "(" not in variant or condition in ABLATION_RECORDED


def run(args):
    start = time.perf_counter()
    if args.warmup < max(RECENT):
        raise ValueError(f"--warmup must be at least {max(RECENT)} (the largest k recent), got {args.warmup}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        write_report(args, pd.read_csv(args.out / "predictions.csv"), pd.read_csv(args.out / "latency.csv"))
        return
    X, y, groups = load_left_right(args.subjects)
    rows, latency = [], []
    for k, (train, test) in enumerate(folds(groups, args.cv)):
        models = {(name, seed): load_estimator(args.models / f"{stem.format(k=k)}.skfedspd")
                  for name in MODELS for seed, stem in runs(name, args.seeds)}
        for model in models.values():
            if model.domain_prior_ is None:  # saved by a version without domain statistics
                model.fit_domain_prior(X[train], groups[train])
        for name in REFITTED:
            models[name, args.seed] = fit(PIPELINES[name](args.seed), X[train], y[train], groups[train])
        variants = {(name, seed): (model, {}) for (name, seed), model in models.items()}
        ablations = [(f"prior weight {v:g}", {"prior_weight": v}) for v in args.prior_weights or []]
        ablations += [(f"memory {v:g}", {"memory": v}) for v in args.memories or []]
        ablations += [("itself included", {"include_self": True})] if args.include_self else []
        for label, params in ablations:
            variants.update({(f"{name} ({label})", seed): (model, params) for (name, seed), model in models.items()
                             if name in MODELS + ["Recenter+TS+LR"]})
        for subject in pd.unique(groups[test]):
            mine = groups == subject
            for (name, seed), (model, params) in variants.items():
                with domain_params(model, **params) if params else nullcontext():
                    proba, seconds = conditions(name.split(" (")[0], model, X[mine], args.warmup)
                truth = (y[mine] == model.classes_[1]).astype(int)
                for condition, p in proba.items():
                    rows.append(pd.DataFrame({"pipeline": f"{name} | {condition}", "subject": subject,
                                              "seed": seed, "trial": np.arange(len(p)),
                                              "y": truth[len(truth) - len(p):],
                                              "pred": (p > 0.5).astype(int), "score": p}))
                if seconds is not None:
                    latency.append({"pipeline": name, "subject": subject, "seed": seed, "seconds": seconds})
        print(f"fold {k} done", flush=True)
    predictions = pd.concat(rows, ignore_index=True)
    predictions.to_csv(args.out / "predictions.csv", index=False)
    pd.DataFrame(latency).to_csv(args.out / "latency.csv", index=False)
    scores = write_report(args, predictions, pd.DataFrame(latency))
    path = report.write_subject_record(
        f"online-{args.cv}", f"Unseen subjects online, trial by trial, {args.cv}",
        scores[scores["pipeline"].map(recorded)],
        "Recenter+TS+LR | online", time.perf_counter() - start,
        {"subjects": scores["subject"].nunique(), "cv": args.cv, "warmup": args.warmup,
         "training_seeds": args.seeds,
         # the networks are the unseen-subjects run's: one training per seed, one ensemble of them
         "one_training_seed": one_training([p for p in scores["pipeline"].unique() if recorded(p)],
                                           {p: args.seeds for p in scores["pipeline"].unique()
                                            if p.split(" | ")[0].split(" (")[0] in MODELS})})
    print(f"record: {path} ({(time.perf_counter() - start) / 60:.1f} min wall)")


def curve(scores):
    """``{model: {condition: mean balanced accuracy}}`` from the subject scores."""
    split = scores["pipeline"].str.split(" | ", regex=False, expand=True)
    frame = scores.assign(model=split[0], condition=split[1])
    return frame.groupby(["model", "condition"])["balanced_accuracy"].mean().unstack()


def seed_scores(predictions):
    """Per (pipeline, subject) scores: each network's averaged over its training seeds, and the
    seed-ensemble rows of those trained from several."""
    if "seed" not in predictions:  # predictions of a run before seeds were recorded: seed 0
        predictions = predictions.assign(seed=0)
    ensembles = seed_ensembles(predictions)
    return pd.concat([seed_averaged_scores(predictions)] + ([report.subject_scores(ensembles)] if len(ensembles)
                                                             else []), ignore_index=True)


def write_report(args, predictions, latency):
    scores = seed_scores(predictions)
    table = curve(scores)
    columns = ["none"] + [str(k) for k in SEEN] + [f"{k} recent" for k in RECENT] + ["all", "online"]
    lines = ["# Online adaptation to unseen subjects", ""] + report.header() + [
        f"protocol: left/right imagery, {scores['subject'].nunique()} subjects, {args.cv} (the unseen-subjects "
        f"folds), scored on each subject's trials after its first {args.warmup}; balanced accuracy %, mean over "
        f"subjects; networks from training seeds {sorted(predictions.get('seed', pd.Series([0])).unique().tolist())}, "
        "a subject's score the mean over them", "", "| model | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    for model in sorted(table.index, key=lambda m: (MODELS + REFITTED).index(m.split(" (")[0])):
        lines.append(f"| {model} | " + " | ".join(
                "-" if pd.isna(table.loc[model].get(c)) else f"{table.loc[model][c]:.1f}" for c in columns) + " |")
    after = [f"{kind} after {k}" for k in ONLINE_AFTER for kind in ("online", "all")]
    lines += ["", "The online BCI scored from trial k on, beside the whole-subject call on the same trials:", "",
              "| model | " + " | ".join(after) + " |", "| --- |" + " --- |" * len(after)]
    for model in sorted(table.index, key=lambda m: (MODELS + REFITTED).index(m.split(" (")[0])):
        if all(c in table.columns and not pd.isna(table.loc[model][c]) for c in after):
            lines.append(f"| {model} | " + " | ".join(f"{table.loc[model][c]:.1f}" for c in after) + " |")
    pairs = [(f"{m} | {a}", f"{m} | {b}") for m in MODELS + ["Recenter+TS+LR"]
             for a, b in (("10", "all"), ("10 recent", "all"), ("20 recent", "all"), ("0", "none"), ("1", "none"),
                          ("online", "all"), ("online", "none"), ("online after 10", "all after 10"),
                          ("online after 0", "all after 0"))]
    pairs += [(f"{m} | {c}, seed ensemble", other) for m in MODELS for c in ("online", "all")
              for other in (f"Recenter+TS+LR | {c}", f"{m} | {c}")]
    lines += ["", "Paired over subjects:"] + report.paired_lines(scores, pairs)
    if len(latency):
        lines += ["", "median seconds of one online predict call (one trial, domain updated), per model: " + ", ".join(
            f"{m} {1e3 * s:.2f} ms" for m, s in latency.groupby("pipeline")["seconds"].median().items())]
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    scores.to_csv(args.out / "subject_scores.csv", index=False)
    plot(table, args.out / "online_curve.png", args.warmup)
    print("\n".join(lines))
    return scores


def plot(table, path, warmup):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    x = SEEN + [45]
    for i, model in enumerate(m for m in MODELS + ["Recenter+TS+LR"] if m in table.index):
        color = f"C{i}"
        ax.plot(x, [table.loc[model][str(k)] for k in SEEN] + [table.loc[model]["all"]], "o-", color=color,
                label=model)
        if all(f"{k} recent" in table.columns for k in RECENT):
            ax.plot(RECENT, [table.loc[model][f"{k} recent"] for k in RECENT], "s--", color=color, ms=4,
                    label=f"{model}, the k trials just before")
        ax.axhline(table.loc[model]["none"], color=color, ls=":", lw=1)
    if "TS+LR" in table.index:
        ax.axhline(table.loc["TS+LR"]["none"], color="grey", ls="--", lw=1, label="TS+LR (no adaptation)")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(-0.3, 60)
    ax.set_xticks(x, [str(k) for k in SEEN] + ["all"])
    ax.set_xlabel("unlabeled trials of the subject seen before the prediction (solid: its first k; dashed: "
                  "the k just before)", fontsize=8)
    ax.set_ylabel("balanced accuracy (%)")
    ax.set_title(f"Unseen subjects, online (dotted: no adaptation; trials after the first {warmup})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
