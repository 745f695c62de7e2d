"""Unseen subjects: each test subject predicted in one call, trained on the other subjects.

Left/right imagery of the 40 offline PhysioNet subjects (``--subjects``), ``GroupKFold(5)``
over subjects (``--cv loso``: leave one subject out). Every pipeline sees the same folds; a
model is trained on the training subjects (each a domain, routed as ``groups``) and predicts
each test subject in one call, so domain batch norm and ``Recenter`` re-centre the unseen
subject with all of its unlabeled trials (whole-subject adaptation). Reported per subject in
balanced accuracy, ROC-AUC beside it, with paired differences ± standard error.

A network is trained once per seed of ``--seeds``; its score on a subject is the mean over
those trainings, so with several seeds the standard error over subjects includes the spread of
training. With several seeds, each network also has an ensemble row (``NAME, seed ensemble``):
every trial's probability averaged over the seeds' networks, as scikit-learn's
``VotingClassifier(voting="soft")`` of those networks predicts; one ensemble, so its readings
say "one training seed". The classical pipelines have no seed and are fitted once.

Besides the named pipelines and their ablations (among them the networks and Recenter+TS+LR
trained on 8 or 16 of the training subjects), ``--pipelines`` takes the study model's rows
(:data:`.pipelines.STUDIES`: SPDDSMBN's parts one at a time) and the filter banks on four
sub-bands (:data:`.pipelines.BANDED`, fitted on the sub-bands' OAS covariances of the same
trials) and re-centred TS+LR on the OAS covariances of the 8-32 Hz trials
(:data:`.pipelines.SHRUNK`), and re-centred TS+LR (sample or OAS covariances) and SPDnet+dBN on
the trials' 16 sensorimotor channels (:data:`.pipelines.SENSORIMOTOR`,
:data:`.pipelines.SENSORIMOTOR_SHRUNK`); ``--record`` names the record.

The fitted SPDnet-family models are saved under ``OUT/models`` (``skfedspd.save_estimator``)
for the ``online`` experiment. Each (pipeline, fold, seed) is one file of predictions: a run
can be split over processes with ``--folds`` and resumed; the report covers what is there.
"""

import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from joblib import Parallel, delayed
from sklearn.model_selection import GroupKFold, LeaveOneGroupOut

from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier, load_estimator, save_estimator
from skfedspd.datasets import SENSORIMOTOR_CHANNELS

from . import report
from .data import BROAD, LEFT_RIGHT_SUBJECTS, SUB_BANDS, load_left_right, load_left_right_bands
from .pipelines import (ABLATIONS, BANDED, PIPELINES, SENSORIMOTOR, SENSORIMOTOR_SHRUNK, SHRUNK, STUDIES,
                        TrainingSubjects, fit)
from .study_model import StudySPDnetClassifier

DEFAULT_PIPELINES = ["TS+LR", "Recenter+TS+LR", "SPDnet+dBN", "FedSPDnet+dBN", "FedSPDnet+dBN, subject domains"]
#: The ensemble row of a network trained from several seeds.
ENSEMBLE = "{}, seed ensemble"
#: Every pipeline ``--pipelines`` takes, by name.
ALL_PIPELINES = {**PIPELINES, **ABLATIONS, **STUDIES, **BANDED, **SHRUNK, **SENSORIMOTOR, **SENSORIMOTOR_SHRUNK}
#: The inputs other than the 64-channel sample covariances: kind -> (its pipelines, bands,
#: covariance estimator, channels), loaded by :func:`.data.load_left_right_bands`.
OTHER_INPUTS = {"sub-bands": (BANDED, SUB_BANDS, "oas", None), "oas": (SHRUNK, BROAD, "oas", None),
                "sensorimotor": (SENSORIMOTOR, BROAD, "scm", SENSORIMOTOR_CHANNELS),
                "sensorimotor-oas": (SENSORIMOTOR_SHRUNK, BROAD, "oas", SENSORIMOTOR_CHANNELS)}
PAIRS = [("SPDnet+dBN", "Recenter+TS+LR"), ("Recenter+TS+LR on OAS covariances", "Recenter+TS+LR"),
         ("SPDnet+dBN", "Recenter+TS+LR on OAS covariances"),
         (ENSEMBLE.format("SPDnet+dBN"), "Recenter+TS+LR on OAS covariances"),
         ("FedSPDnet+dBN", "Recenter+TS+LR"), ("FedSPDnet+dBN", "SPDnet+dBN"),
         ("Recenter+TS+LR", "TS+LR"), ("SPDnet+dBN", "TS+LR"),
         ("FedSPDnet+dBN", "FedSPDnet+dBN, subject domains"), ("SPDnet+dBN", "SPDnet+dBN, best epoch"),
         (ENSEMBLE.format("SPDnet+dBN"), "Recenter+TS+LR"), (ENSEMBLE.format("FedSPDnet+dBN"), "FedRecenter+TS+LR"),
         (ENSEMBLE.format("FedSPDnet+dBN"), ENSEMBLE.format("SPDnet+dBN")),
         ("SPDnet+dBN, 8 training subjects", "Recenter+TS+LR, 8 training subjects"),
         ("SPDnet+dBN, 16 training subjects", "Recenter+TS+LR, 16 training subjects"),
         ("study model", "SPDnet+dBN"), ("study model, dispersion normalized", "study model"),
         ("study model, minibatches of 4 subjects x 16 trials", "study model"),
         ("study model, minibatches of 4 subjects x 16 trials, running domain means",
          "study model, minibatches of 4 subjects x 16 trials"),
         ("study model, complete SPDDSMBN", "study model, minibatches of 4 subjects x 16 trials, running domain means"),
         ("study model, minibatches of 4 subjects x 16 trials, dispersion normalized",
          "study model, minibatches of 4 subjects x 16 trials"),
         ("study model, minibatches of 4 subjects x 16 trials, dispersion normalized", "Recenter+TS+LR"),
         ("study model, complete SPDDSMBN", "Recenter+TS+LR"),
         ("Recenter+TS+LR, 4 sub-bands (OAS)", "Recenter+TS+LR"),
         ("study model, 4 sub-bands (OAS), one BiMap each", "study model"),
         ("study model, 4 sub-bands (OAS), one BiMap each", "Recenter+TS+LR, 4 sub-bands (OAS)"),
         ("SPDnet+dBN, 16 sensorimotor channels", "Recenter+TS+LR, 16 sensorimotor channels"),
         ("SPDnet+dBN, 16 sensorimotor channels", "Recenter+TS+LR on OAS covariances, 16 sensorimotor channels"),
         (ENSEMBLE.format("SPDnet+dBN, 16 sensorimotor channels"),
          "Recenter+TS+LR on OAS covariances, 16 sensorimotor channels"),
         ("SPDnet+dBN", "SPDnet+dBN, 16 sensorimotor channels"),
         ("Recenter+TS+LR on OAS covariances", "Recenter+TS+LR on OAS covariances, 16 sensorimotor channels")]


def add_arguments(parser):
    parser.add_argument("--subjects", type=int, nargs="+", default=list(LEFT_RIGHT_SUBJECTS))
    parser.add_argument("--cv", choices=["groupkfold5", "loso"], default="groupkfold5")
    parser.add_argument("--folds", type=int, nargs="+", default=None, help="run only these fold indices")
    parser.add_argument("--pipelines", nargs="+", default=DEFAULT_PIPELINES,
                        choices=list(ALL_PIPELINES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="training seeds of the networks (their scores are averaged per subject)")
    parser.add_argument("--jobs", type=int, default=1, help="trainings run in parallel, one process each")
    parser.add_argument("--out", type=Path, default=Path("results/unseen-subjects"))
    parser.add_argument("--models", type=Path, default=None,
                        help="an earlier run's folder: its saved models predict again instead of being refitted "
                             "(the others are refitted), e.g. after a change to the prediction rule")
    parser.add_argument("--report-only", action="store_true", help="report the predictions already in --out")
    parser.add_argument("--record", default=None, help="the record written (default: unseen-subjects-CV)")


def folds(groups, cv):
    """The (train, test) index pairs of ``cv`` over ``groups``."""
    splitter = LeaveOneGroupOut() if cv == "loso" else GroupKFold(5)
    return list(splitter.split(np.zeros(len(groups)), groups=groups))


def input_kind(name):
    """Which covariances a pipeline takes: a kind of :data:`OTHER_INPUTS`, or ``"sample"``."""
    return next((kind for kind, (rows, *_) in OTHER_INPUTS.items() if name in rows), "sample")


def build(name, seed):
    """The model of a pipeline name."""
    return ALL_PIPELINES[name](seed)


def one_training(names, seeds_of):
    """The row keys among ``names`` whose scores come from one training: a network trained
    from one seed (``seeds_of``: network name -> its training seeds), whatever the number of
    subjects its scores are paired over, and a seed ensemble (one ensemble of the seeds'
    networks)."""
    return sorted(report.row_key(name) for name in names
                  if name.endswith(ENSEMBLE.format("")) or len(seeds_of.get(name, ())) == 1)


def is_network(model):
    """Whether ``model`` trains from a seed: a network, or training subjects of one."""
    if isinstance(model, TrainingSubjects):
        return is_network(model.estimator)
    return isinstance(model, (SPDnetClassifier, FederatedSPDnetClassifier, StudySPDnetClassifier))


def runs(name, seeds):
    """``(seed, file stem)`` of each training of pipeline ``name``: one per seed for a network,
    one for a classical pipeline (no seed); the first seed's stem carries no seed, as the
    ``online`` experiment reads it."""
    stem = name + "-fold{k}"
    if not is_network(build(name, seeds[0])):
        return [(seeds[0], stem)]
    return [(seed, stem if i == 0 else f"{stem}-seed{seed}") for i, seed in enumerate(seeds)]


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
        inputs = {"sample": X}
        for kind, (rows, bands, estimator, channels) in OTHER_INPUTS.items():
            if any(name in rows for name in args.pipelines):  # other covariances of the same trials
                other, y_other, groups_other = load_left_right_bands(args.subjects, bands=bands, estimator=estimator,
                                                                     channels=channels)
                if not (np.array_equal(y_other, y) and np.array_equal(groups_other, groups)):
                    raise RuntimeError(f"the {kind} trials are not those of the 8-32 Hz covariances")
                inputs[kind] = other[:, 0] if bands == BROAD else other  # one band: (n, C, C)
        splits = folds(groups, args.cv)
        np.save(args.out / "groups.npy", groups)
        todo = [(k, name, seed, stem.format(k=k)) for k in range(len(splits))
                if args.folds is None or k in args.folds
                for name in args.pipelines for seed, stem in runs(name, args.seeds)]
        todo = [task for task in todo if not (args.out / "predictions" / f"{task[3]}.csv").exists()]
        # each training in its own process (one thread each): the fits are independent
        for line in Parallel(n_jobs=args.jobs, return_as="generator_unordered")(
                delayed(fit_and_predict)(args, name, stem, seed, k, inputs[input_kind(name)], y, groups, splits[k])
                for k, name, seed, stem in todo):
            print(line, flush=True)
    scores, seeds_of = write_report(args)
    if scores is not None and args.folds is None and args.models is None and not args.report_only:
        path = report.write_subject_record(
            args.record or f"unseen-subjects-{args.cv}", f"Unseen subjects, whole-subject adaptation, {args.cv}", scores,
            "Recenter+TS+LR" if "Recenter+TS+LR" in set(scores["pipeline"]) else scores["pipeline"].iloc[0],
            time.perf_counter() - start, {"subjects": scores["subject"].nunique(), "cv": args.cv,
                                          "predictions_cached_at_start": cached_at_start,
                                          "training_seeds": sorted({s for of in seeds_of.values() for s in of}),
                                          "one_training_seed": one_training(scores["pipeline"].unique(), seeds_of)})
        print(f"record: {path} ({(time.perf_counter() - start) / 60:.1f} min wall, {cached_at_start} "
              f"(pipeline, fold) predictions cached at the start)")


def fit_and_predict(args, name, stem, seed, k, X, y, groups, split):
    """Train pipeline ``name`` from ``seed`` on fold ``k``'s training subjects, predict each of
    its test subjects in one call, write the predictions (and a network's model) under
    ``args.out`` as ``stem``; a line for the console."""
    torch.set_num_threads(1)
    train, test = split
    model, seconds = trained(args, name, stem, seed, X[train], y[train], groups[train])
    frame = predict_subjects(model, X[test], y[test], groups[test], model.classes_)
    frame.insert(0, "pipeline", name)
    frame["fold"], frame["seed"], frame["fit_seconds"] = k, seed, seconds
    (args.out / "predictions").mkdir(exist_ok=True)
    if isinstance(model, (SPDnetClassifier, FederatedSPDnetClassifier)):  # the package's: for ``online``
        (args.out / "models").mkdir(exist_ok=True)
        save_estimator(model, args.out / "models" / f"{stem}.skfedspd")
    frame.to_csv(args.out / "predictions" / f"{stem}.csv", index=False)
    return (f"fold {k} {name} seed {seed}: balanced accuracy "
            f"{report.subject_scores(frame)['balanced_accuracy'].mean():.1f} ({seconds:.0f} s)")


def trained(args, name, stem, seed, X, y, groups):
    """``(model, fit seconds)``: the model of ``--models`` (with that run's fit time) when
    it saved one for this training (file ``stem``), else a new one fitted here from ``seed``."""
    saved = None if args.models is None else args.models / "models" / f"{stem}.skfedspd"
    if saved is not None and saved.exists():
        earlier = pd.read_csv(args.models / "predictions" / f"{stem}.csv")
        return load_estimator(saved), float(earlier["fit_seconds"].iloc[0])
    model = build(name, seed)
    start = time.perf_counter()
    fit(model, X, y, groups)
    return model, time.perf_counter() - start


def write_report(args):
    """Print and write the report of the predictions in ``args.out``; ``(per-subject scores,
    {network: its training seeds})``, ``(None, {})`` when there are none."""
    files = sorted((args.out / "predictions").glob("*.csv"))
    if not files:
        print("no predictions yet")
        return None, {}
    predictions = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    if "seed" not in predictions:  # predictions of a run before seeds were recorded: seed 0
        predictions["seed"] = 0
    predictions["seed"] = predictions["seed"].fillna(0).astype(int)
    ensembles = seed_ensembles(predictions)
    parts = [seed_averaged_scores(predictions)] + ([report.subject_scores(ensembles)] if len(ensembles) else [])
    scores = pd.concat(parts, ignore_index=True)
    trained_nets = [name for name in predictions["pipeline"].unique() if is_network(build(name, 0))]
    seeds_of = {name: sorted(int(s) for s in predictions.loc[predictions["pipeline"] == name, "seed"].unique())
                for name in trained_nets}
    seeds = sorted({s for of in seeds_of.values() for s in of})
    present = list(dict.fromkeys(scores["pipeline"]))
    order = [row for n in ALL_PIPELINES for row in (n, ENSEMBLE.format(n)) if row in present]
    order += sorted(n for n in present if n not in order)
    lines = ["# Unseen subjects: whole-subject adaptation", ""] + report.header() + [
        f"protocol: left/right imagery, {scores['subject'].nunique()} subjects, {args.cv}, "
        f"each test subject predicted in one call; networks trained from seeds {[int(s) for s in seeds]}, "
        "their scores averaged per subject", ""]
    lines += report.score_table(scores, order) + [""] + report.paired_lines(scores, PAIRS)
    fit_time = predictions.groupby(["pipeline", "fold", "seed"])["fit_seconds"].first().groupby("pipeline").mean()
    lines += ["", "mean fit time per fold (s): " + ", ".join(f"{n} {fit_time[n]:.0f}" for n in order if n in fit_time)]
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    scores.to_csv(args.out / "subject_scores.csv", index=False)
    print("\n".join(lines))
    return scores, seeds_of


def seed_averaged_scores(predictions):
    """One row per (pipeline, subject): :func:`~.report.subject_scores` of each training seed,
    averaged over the seeds."""
    per_seed = pd.concat([report.subject_scores(part) for _, part in predictions.groupby("seed")],
                         ignore_index=True)
    return per_seed.groupby(["pipeline", "subject"], sort=False, as_index=False).mean()


def seed_ensembles(predictions):
    """The predictions of each network trained from several seeds, as one ensemble of those
    networks (pipeline ``NAME, seed ensemble``): a trial's score is the mean over the seeds of
    its probability of class 1, its decision whether that mean exceeds one half (the argmax
    of the averaged probabilities, as ``VotingClassifier(voting="soft")``)."""
    seeded = predictions.groupby("pipeline")["seed"].transform("nunique") > 1
    keys = ["pipeline", "subject", "trial"]
    mean = predictions[seeded].groupby(keys, sort=False).agg(y=("y", "first"), score=("score", "mean")).reset_index()
    mean["pred"] = (mean["score"] > 0.5).astype(int)
    mean["pipeline"] = mean["pipeline"].map(ENSEMBLE.format)
    return mean
