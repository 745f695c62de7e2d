"""Unseen subjects: each test subject predicted in one call, trained on the other subjects.

Left/right imagery of the 40 offline PhysioNet subjects (``--subjects``), ``GroupKFold(5)``
over subjects (``--cv loso``: leave one subject out). Every pipeline sees the same folds; a
model is trained on the training subjects (each a domain, routed as ``groups``) and predicts
each test subject in one call, so domain batch norm and ``Recenter`` re-centre the unseen
subject with all of its unlabeled trials (whole-subject adaptation). Reported per subject in
balanced accuracy, ROC-AUC beside it, with paired differences ± standard error.

The fitted SPDnet-family models are saved under ``OUT/models`` (``skfedspd.save_estimator``)
for the ``online`` experiment. Each (pipeline, fold) is one file of predictions: a run can be
split over processes with ``--folds`` and resumed; the report covers what is there.
"""

import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold, LeaveOneGroupOut

from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier, load_estimator, save_estimator

from . import report
from .data import LEFT_RIGHT_SUBJECTS, load_left_right
from .pipelines import ABLATIONS, PIPELINES, fit

DEFAULT_PIPELINES = ["TS+LR", "Recenter+TS+LR", "SPDnet+dBN", "FedSPDnet+dBN", "FedSPDnet+dBN, subject domains"]
PAIRS = [("SPDnet+dBN", "Recenter+TS+LR"), ("FedSPDnet+dBN", "Recenter+TS+LR"), ("FedSPDnet+dBN", "SPDnet+dBN"),
         ("Recenter+TS+LR", "TS+LR"), ("SPDnet+dBN", "TS+LR"),
         ("FedSPDnet+dBN", "FedSPDnet+dBN, subject domains"), ("SPDnet+dBN", "SPDnet+dBN, best epoch")]


def add_arguments(parser):
    parser.add_argument("--subjects", type=int, nargs="+", default=list(LEFT_RIGHT_SUBJECTS))
    parser.add_argument("--cv", choices=["groupkfold5", "loso"], default="groupkfold5")
    parser.add_argument("--folds", type=int, nargs="+", default=None, help="run only these fold indices")
    parser.add_argument("--pipelines", nargs="+", default=DEFAULT_PIPELINES,
                        choices=list(PIPELINES) + list(ABLATIONS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/unseen-subjects"))
    parser.add_argument("--models", type=Path, default=None,
                        help="an earlier run's folder: its saved models predict again instead of being refitted "
                             "(the others are refitted), e.g. after a change to the prediction rule")
    parser.add_argument("--report-only", action="store_true", help="report the predictions already in --out")


def folds(groups, cv):
    """The (train, test) index pairs of ``cv`` over ``groups``."""
    splitter = LeaveOneGroupOut() if cv == "loso" else GroupKFold(5)
    return list(splitter.split(np.zeros(len(groups)), groups=groups))


def build(name, seed):
    """The model of a pipeline name."""
    return {**PIPELINES, **ABLATIONS}[name](seed)


def networks(names, seed):
    """The row keys of the pipelines among ``names`` that train a network from ``seed``: each is
    one training seed, whatever the number of subjects its scores are paired over."""
    return sorted(report.row_key(name) for name in names
                  if isinstance(build(name, seed), (SPDnetClassifier, FederatedSPDnetClassifier)))


def predict_subjects(model, X, y, groups, classes):
    """One call per subject; a DataFrame of its trials' labels, decisions and scores."""
    rows = []
    for subject in pd.unique(groups):
        mine = groups == subject
        proba = model.predict_proba(X[mine])
        rows.append(pd.DataFrame({"subject": subject, "trial": np.arange(mine.sum()),
                                  "y": (y[mine] == classes[1]).astype(int),
                                  "pred": proba.argmax(axis=1), "score": proba[:, 1]}))
    return pd.concat(rows, ignore_index=True)


def run(args):
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    cached_at_start = len(list((args.out / "predictions").glob("*.csv")))
    if not args.report_only:
        X, y, groups = load_left_right(args.subjects)
        splits = folds(groups, args.cv)
        np.save(args.out / "groups.npy", groups)
        for k, (train, test) in enumerate(splits):
            if args.folds is not None and k not in args.folds:
                continue
            for name in args.pipelines:
                path = args.out / "predictions" / f"{name}-fold{k}.csv"
                if path.exists():
                    continue
                model, seconds = trained(args, name, k, X[train], y[train], groups[train])
                frame = predict_subjects(model, X[test], y[test], groups[test], model.classes_)
                frame.insert(0, "pipeline", name)
                frame["fold"] = k
                frame["fit_seconds"] = seconds
                path.parent.mkdir(exist_ok=True)
                if isinstance(model, (SPDnetClassifier, FederatedSPDnetClassifier)):
                    (args.out / "models").mkdir(exist_ok=True)
                    save_estimator(model, args.out / "models" / f"{name}-fold{k}.skfedspd")
                frame.to_csv(path, index=False)
                print(f"fold {k} {name}: balanced accuracy "
                      f"{report.subject_scores(frame)['balanced_accuracy'].mean():.1f} ({seconds:.0f} s)",
                      flush=True)
    scores = write_report(args)
    if scores is not None and args.folds is None and args.models is None and not args.report_only:
        path = report.write_subject_record(
            f"unseen-subjects-{args.cv}", f"Unseen subjects, whole-subject adaptation, {args.cv}", scores,
            "Recenter+TS+LR" if "Recenter+TS+LR" in set(scores["pipeline"]) else scores["pipeline"].iloc[0],
            time.perf_counter() - start, {"subjects": scores["subject"].nunique(), "cv": args.cv,
                                          "predictions_cached_at_start": cached_at_start,
                                          "one_training_seed": networks(scores["pipeline"].unique(), args.seed)})
        print(f"record: {path} ({(time.perf_counter() - start) / 60:.1f} min wall, {cached_at_start} "
              f"(pipeline, fold) predictions cached at the start)")


def trained(args, name, k, X, y, groups):
    """``(model, fit seconds)``: the model of ``--models`` (with that run's fit time) when
    it saved one for this pipeline and fold, else a new one fitted here."""
    saved = None if args.models is None else args.models / "models" / f"{name}-fold{k}.skfedspd"
    if saved is not None and saved.exists():
        earlier = pd.read_csv(args.models / "predictions" / f"{name}-fold{k}.csv")
        return load_estimator(saved), float(earlier["fit_seconds"].iloc[0])
    model = build(name, args.seed)
    start = time.perf_counter()
    fit(model, X, y, groups)
    return model, time.perf_counter() - start


def write_report(args):
    """Print and write the report of the predictions in ``args.out``; their per-subject
    scores (None when there are none)."""
    files = sorted((args.out / "predictions").glob("*.csv"))
    if not files:
        print("no predictions yet")
        return None
    predictions = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    scores = report.subject_scores(predictions)
    present = list(dict.fromkeys(scores["pipeline"]))
    known = list(PIPELINES) + list(ABLATIONS)
    order = [n for n in known if n in present] + sorted(n for n in present if n not in known)
    lines = ["# Unseen subjects: whole-subject adaptation", ""] + report.header() + [
        f"protocol: left/right imagery, {scores['subject'].nunique()} subjects, {args.cv}, "
        "each test subject predicted in one call", ""]
    lines += report.score_table(scores, order) + [""] + report.paired_lines(scores, PAIRS)
    fit_time = predictions.groupby(["pipeline", "fold"])["fit_seconds"].first().groupby("pipeline").mean()
    lines += ["", "mean fit time per fold (s): " + ", ".join(f"{n} {fit_time[n]:.0f}" for n in order)]
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    scores.to_csv(args.out / "subject_scores.csv", index=False)
    print("\n".join(lines))
    return scores
