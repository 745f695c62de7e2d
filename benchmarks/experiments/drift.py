"""Why the first trials adapt worse than recent ones: re-centring by exact means of chosen trials.

Recenter+TS+LR on the folds of the ``unseen-subjects`` experiment, each training subject
re-centred by its own Riemannian mean. Each test subject's trials after its first
``--warmup`` (20) are re-centred by the exact Karcher mean (pyRiemann's ``mean_riemann``, not
the package's running mean) of a chosen set of that subject's trials, then classified:

* ``first 10``: its first 10 trials (the first run);
* ``10 before``: trials 10-19, just before the scored ones;
* ``10 scored-run``: 10 trials drawn at random from the scored trials (the runs scored);
* ``whole subject``: all its trials.

If the first 10 lose against the whole subject while 10 trials from the scored runs do not,
the loss is the recording's drift, not the number of trials. The report gives the class
counts of the first 10 trials, which rule out their balance as the cause, and each fold's
empirical-Bayes prior weight (:func:`empirical_bayes_weight`), the ``DomainAdaptation.prior_weight``
that the dispersion of the training subjects argues for.
"""

import time
from pathlib import Path

import numpy as np
import pandas as pd
from pyriemann.geometry.base import invsqrtm, logm
from pyriemann.geometry.mean import mean_riemann

from . import report
from .data import LEFT_RIGHT_SUBJECTS, load_left_right
from .pipelines import ts_lr
from .unseen_subjects import folds

SETS = ["first 10", "10 before", "10 scored-run", "whole subject"]


def add_arguments(parser):
    parser.add_argument("--subjects", type=int, nargs="+", default=list(LEFT_RIGHT_SUBJECTS))
    parser.add_argument("--cv", choices=["groupkfold5", "loso"], default="groupkfold5")
    parser.add_argument("--warmup", type=int, default=20, help="trials of each subject left out of every score")
    parser.add_argument("--seed", type=int, default=0, help="draws the scored-run trials")
    parser.add_argument("--out", type=Path, default=Path("results/drift"))


def recentred(X, mean):
    """``X`` re-centred by ``mean``: ``M^{-1/2} X M^{-1/2}``."""
    inv_half = invsqrtm(mean)
    return inv_half @ X @ inv_half


def empirical_bayes_weight(logs, groups):
    """``σ² / τ²`` of the matrix logarithms ``logs`` (``log X``): the within-subject dispersion
    (log-Euclidean, squared Frobenius distance of ``log X`` to its subject's mean, per trial)
    over the between-subject dispersion of the subjects' means (their variance less the part
    the within-subject noise explains). A subject's mean estimated from ``k`` trials shrunk towards the prior with this
    weight, in trials, has the least squared error (James–Stein)."""
    subject_means, within, dof = [], 0.0, 0
    for subject in pd.unique(groups):
        part = logs[groups == subject]
        subject_means.append(part.mean(0))
        within += ((part - subject_means[-1]) ** 2).sum()
        dof += len(part) - 1
    sigma2 = within / dof
    subject_means = np.array(subject_means)
    spread = ((subject_means - subject_means.mean(0)) ** 2).sum() / (len(subject_means) - 1)
    return sigma2 / (spread - sigma2 * len(subject_means) / len(logs))


def means(X, warmup, rng):
    """``{set name: Karcher mean}`` of one subject's trial sets (module docstring)."""
    return {
        "first 10": mean_riemann(X[:10]),
        "10 before": mean_riemann(X[warmup - 10 : warmup]),
        "10 scored-run": mean_riemann(X[rng.choice(np.arange(warmup, len(X)), 10, replace=False)]),
        "whole subject": mean_riemann(X),
    }


def run(args):
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    X, labels, groups = load_left_right(args.subjects)
    classes = np.unique(labels)
    y = np.searchsorted(classes, labels)
    rng = np.random.default_rng(args.seed)
    logs = logm(X)  # once: the folds share their training subjects
    rows, first_counts, weights = [], [], []
    for train, test in folds(groups, args.cv):
        weights.append(empirical_bayes_weight(logs[train], groups[train]))
        Xt = np.concatenate([recentred(X[train][groups[train] == s], mean_riemann(X[train][groups[train] == s]))
                             for s in pd.unique(groups[train])])
        yt = np.concatenate([y[train][groups[train] == s] for s in pd.unique(groups[train])])
        model = ts_lr(args.seed).fit(Xt, yt)
        for subject in pd.unique(groups[test]):
            mine = groups == subject
            Xs, ys = X[mine], y[mine]
            first_counts.append(int((ys[:10] == 0).sum()))
            for name, mean in means(Xs, args.warmup, rng).items():
                scored = recentred(Xs[args.warmup:], mean)
                rows.append(pd.DataFrame({"pipeline": name, "subject": subject, "y": ys[args.warmup:],
                                          "pred": model.predict(scored), "score": model.predict_proba(scored)[:, 1]}))
    scores = report.subject_scores(pd.concat(rows, ignore_index=True))
    lines = ["# Re-centring by exact means of chosen trials (Recenter+TS+LR)", ""] + report.header() + [
        f"protocol: left/right imagery, {scores['subject'].nunique()} subjects, {args.cv}; scored on each subject's "
        f"trials after its first {args.warmup}; the first 10 trials of a subject hold {min(first_counts)} to "
        f"{max(first_counts)} trials of class {classes[0]}", ""] + report.score_table(scores, SETS) + [
        "", "Paired over subjects:"] + report.paired_lines(scores, [(name, "whole subject") for name in SETS[:-1]]) + [
        "", "Empirical-Bayes prior weight at the input (trials), per fold: " + ", ".join(f"{w:.2f}" for w in weights)]
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    scores.to_csv(args.out / "subject_scores.csv", index=False)
    print("\n".join(lines))
    path = report.write_subject_record(
        f"drift-{args.cv}", f"Re-centring by exact means of chosen trials (Recenter+TS+LR), {args.cv}", scores,
        "whole subject", time.perf_counter() - start,
        {"subjects": scores["subject"].nunique(), "cv": args.cv, "warmup": args.warmup,
         "first_10_class_counts": sorted(set(first_counts)),
         "empirical_bayes_weight_max": round(float(max(weights)), 2)})
    print(f"record: {path} ({(time.perf_counter() - start) / 60:.1f} min wall)")
