"""MOABB's cross-subject transfer protocols (``cs_mode``) on the offline PhysioNet left/right subjects.

``CrossSubjectEvaluation(cs_mode=m)`` (MOABB >= 1.6) for every preset ``m`` of
``moabb.evaluations.CrossSubjectMode`` (``--modes``): each held-out subject is a new subject;
``TRAIN`` scores its whole block, ``TRAIN_TRIALWISE`` one trial at a time, the
``TRAIN_AND_TARGET_UNLABELED_20P/50P/FULL`` presets route the first 20 % / 50 % / all of its
trials unlabeled (``X_target_unlabeled``) to ``fit`` and score the rest (FULL: all of them,
transductive), the ``TRAIN_AND_TARGET_LABELED_20P/50P`` presets route them labeled
(``X_target_labeled``, ``y_target_labeled``). Leave one subject out by default: MOABB routes
no subject labels with the slice, so a test fold of several subjects (``--cross-folds K``)
would mix them into one calibration domain.

Pipelines (the same for every preset; :func:`transfer_pipelines`):

* TS+LR: OAS covariances, tangent space, logistic regression (uses no slice);
* Recenter+TS+LR: ``skfedspd.Recenter`` between the covariances and the tangent space; the
  training subjects each re-centred by their own mean, the new subject by the routed slice
  (and, block-wise, by its test block: ``transform`` adds the block to a temporary copy of
  the slice's statistics);
* EA+TS+LR: MOABB's ``EuclideanAlignment`` before TS+LR. In MOABB 1.7.2 it requests neither
  the training subjects nor the slice: one whitening fitted on the pooled training trials;
* SPDnet: SCM covariances (as the paper) and ``SPDnetClassifier(random_state=0)`` (its
  ``"auto"`` batch norm is domain batch norm with the routed subjects), the slice as the new
  subject's domain statistics. Every preset of a fold trains on the same subjects: the
  network trained for one preset is reused by the others (:class:`ReusedTraining`), which
  then only add their slice;
* opt-in (:data:`NO_SLICE`): "Recenter+TS+LR, no slice" and "SPDnet, no slice", the same
  pipelines with the slice left unrequested (the network is the same training): paired with
  their own row on the same test trials, what the slice buys.

The package's pipelines are built with ``Pipeline(transform_input=skfedspd.transfer.
TARGET_INPUTS)``, which passes the raw slice through the covariance step before the step that
uses it. A labeled slice is used as unlabeled calibration (its labels are not requested).

Scores: balanced accuracy (the headline) with ROC-AUC beside it, per subject; under
``TRAIN_TRIALWISE`` ROC-AUC only (MOABB 1.7.2 scores one trial at a time in accuracy or ROC-AUC
only). The calibration presets score fewer test trials than ``TRAIN`` (the slice is not
scored): compare pipelines within a preset, and presets with that in mind.

Records (``--record`` prefix, default ``moabb-transfer``): one per preset,
``PREFIX-<preset>-loso<N>`` (``-groupkfold<K>-<N>`` with ``--cross-folds``), every pipeline
paired with TS+LR subject by subject; ``--no-record`` writes none (a smoke run).

    nice python -m benchmarks.experiments moabb-transfer                 # 40 subjects, every preset
    nice python -m benchmarks.experiments moabb-transfer --subjects 1 2 3 \\
        --modes train train_and_target_unlabeled_20p --no-record         # a smoke run
"""

import copy
import hashlib
import time
from pathlib import Path

import numpy as np
import torch

from skfedspd import SPDnetClassifier
from skfedspd.transfer import adapt_target, target_trials
from skfedspd.validation import resolve_groups

from . import report as records_report
from .data import offline_root, physionet_moabb
from .moabb_evaluation import quiet_libraries, subject_frame

PIPELINES = ["TS+LR", "Recenter+TS+LR", "EA+TS+LR", "SPDnet"]
#: The re-centring pipelines with the slice left unrequested: paired with their own row on the
#: same test trials, they show what the slice buys (under the calibration presets).
NO_SLICE = ["Recenter+TS+LR, no slice", "SPDnet, no slice"]
METRICS = {"balanced_accuracy": "balanced accuracy (%)", "roc_auc": "ROC-AUC (%)"}
REFERENCE = "TS+LR"


def modes():
    """The names of MOABB's ``CrossSubjectMode`` presets (all of them, in MOABB's order)."""
    from moabb.evaluations import CrossSubjectMode

    return [m.value for m in CrossSubjectMode]


class ReusedTraining(SPDnetClassifier):
    """``SPDnetClassifier`` whose training is done once per training set and reused: every
    cs_mode preset of a fold trains on the same subjects with the same seed, and ``fit(X, y,
    subjects, X_target_unlabeled=C)`` equals ``fit(X, y, subjects)`` then ``adapt(C,
    "target")`` (``tests/test_moabb_transfer.py``). The trained state is kept in this process
    (:attr:`trained`), keyed by the training data and the parameters.

    Examples
    --------
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=40, n_channels=4, seed=0)
    >>> ReusedTraining.trained.clear()
    >>> a = ReusedTraining(max_epochs=2, random_state=0).fit(X, y, subjects=[1, 2] * 20)
    >>> b = ReusedTraining(max_epochs=2, random_state=0).fit(X, y, subjects=[1, 2] * 20, X_target_unlabeled=X[:5])
    >>> len(ReusedTraining.trained), b.domains_, bool((a.predict_proba(X) == b.predict_proba(X, domain=0)).all())
    (1, {'target': 5}, True)
    """

    trained = {}

    def training_key(self, X, y, groups):
        digest = hashlib.sha1()
        for part in (X, y, groups):
            digest.update(np.ascontiguousarray(np.asarray(part)).tobytes())
        return digest.hexdigest(), repr(sorted(self.get_params().items()))

    def fit(self, X, y, groups=None, sample_weight=None, subjects=None, X_target_unlabeled=None,
            X_target_labeled=None):
        groups = resolve_groups(groups, subjects)
        key = self.training_key(X, y, groups) + (repr(sample_weight),)
        if key not in self.trained:
            super().fit(X, y, groups=groups, sample_weight=sample_weight)
            self.trained[key] = copy.deepcopy(self.__dict__)
        self.__dict__.update(copy.deepcopy(self.trained[key]))
        calibration = target_trials(X_target_unlabeled, X_target_labeled, n_channels=self.n_features_in_)
        if calibration is not None:
            adapt_target(self, calibration)
        return self


def transfer_pipelines(names=PIPELINES, seed=0):
    """The pipelines of ``names`` (:data:`PIPELINES`), the package's ones with
    ``transform_input`` so that the routed raw slice reaches them as covariances."""
    import sklearn
    from moabb.datasets.preprocessing import EuclideanAlignment
    from pyriemann.estimation import Covariances
    from pyriemann.tangentspace import TangentSpace
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    from skfedspd import Recenter
    from skfedspd.transfer import TARGET_INPUTS

    def ts_lr():
        return [TangentSpace(metric="riemann"), LogisticRegression(max_iter=1000)]

    def without_slice(step):
        with sklearn.config_context(enable_metadata_routing=True):
            return step.set_fit_request(**dict.fromkeys(TARGET_INPUTS, False))

    build = {
        "TS+LR": lambda: make_pipeline(Covariances("oas"), *ts_lr()),
        "Recenter+TS+LR, no slice": lambda: make_pipeline(Covariances("oas"), without_slice(Recenter()), *ts_lr()),
        "SPDnet, no slice": lambda: make_pipeline(Covariances("scm"),
                                                  without_slice(ReusedTraining(random_state=seed))),
        "Recenter+TS+LR": lambda: make_pipeline(Covariances("oas"), Recenter(), *ts_lr(),
                                                transform_input=TARGET_INPUTS),
        "EA+TS+LR": lambda: make_pipeline(EuclideanAlignment(), Covariances("oas"), *ts_lr()),
        "SPDnet": lambda: make_pipeline(Covariances("scm"), ReusedTraining(random_state=seed),
                                        transform_input=TARGET_INPUTS),
    }
    return {name: build[name]() for name in names}


def networks(names):
    """The row keys of the pipelines among ``names`` that train a network: one per fold, from
    one seed, so their readings over subjects say so."""
    return [records_report.row_key(name) for name in names if name.startswith("SPDnet")]


def metrics_of(mode):
    """The metrics MOABB scores under ``mode``: ROC-AUC only one trial at a time."""
    from moabb.evaluations import CrossSubjectMode

    return {"roc_auc": METRICS["roc_auc"]} if CrossSubjectMode(mode).trialwise else dict(METRICS)


def evaluate_mode(mode, subjects, pipelines, cross_folds, out):
    """MOABB's scores of ``pipelines`` under ``mode``: one row per (pipeline, subject), the
    metrics of :func:`metrics_of` in %."""
    from moabb.evaluations import CrossSubjectEvaluation

    metrics = list(metrics_of(mode))
    dataset, paradigm = physionet_moabb(subjects, 2, scorer=metrics if len(metrics) > 1 else metrics[0])
    # GroupKFold is deterministic: MOABB would hand it the random_state, which sklearn refuses
    evaluation = CrossSubjectEvaluation(paradigm=paradigm, datasets=[dataset], cs_mode=mode, overwrite=True,
                                        n_splits=cross_folds, random_state=42 if cross_folds is None else None,
                                        hdf5_path=str(out / "hdf5" / mode), error_score="raise")
    scores = evaluation.process(pipelines)
    if len(metrics) == 1:  # one scorer: MOABB's "score" column only
        scores[f"score_{metrics[0]}"] = scores["score"]
    scores["evaluation"] = mode
    return scores, subject_frame(scores, None, metrics)


def mode_lines(mode, frame, seconds):
    """Markdown: the mean ± sd over subjects of each pipeline, then each pipeline paired with
    TS+LR (:func:`~.report.format_paired`)."""
    metrics = metrics_of(mode)
    lines = [f"## {mode} ({seconds / 60:.1f} min)", "",
             "| pipeline | " + " | ".join(metrics.values()) + " | subjects |",
             "| --- |" + " --- |" * (len(metrics) + 1)]
    for name, part in frame.groupby("pipeline", sort=False):
        cells = [f"{part[m].mean():.1f} ± {part[m].std(ddof=1):.1f}" for m in metrics]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {len(part)} |")
    wide = {m: frame.pivot(index="subject", columns="pipeline", values=m) for m in metrics}
    lines.append("")
    for name in wide[next(iter(metrics))]:
        if name != REFERENCE:
            lines.append(f"- {name} − {REFERENCE}: " + "; ".join(
                f"{label.removesuffix(' (%)')} {records_report.format_paired(wide[m][name], wide[m][REFERENCE])}"
                for m, label in metrics.items()))
    return lines


def add_arguments(parser):
    from skfedspd.datasets import PHYSIONET_LEFT_RIGHT_SUBJECTS

    parser.add_argument("--subjects", type=int, nargs="+", default=list(PHYSIONET_LEFT_RIGHT_SUBJECTS),
                        help="left/right subjects (default: the 40 offline ones)")
    parser.add_argument("--modes", nargs="+", default=None, metavar="MODE",
                        help="CrossSubjectMode presets by value, e.g. train train_trialwise "
                             "train_and_target_unlabeled_20p (default: every preset)")
    parser.add_argument("--pipelines", nargs="+", choices=PIPELINES + NO_SLICE, default=PIPELINES,
                        help="the rows; the re-centring ones without the slice (NO_SLICE) are opt-in")
    parser.add_argument("--cross-folds", type=int, default=None, metavar="K",
                        help="GroupKFold(K) over the subjects instead of leave one subject out (the slice of a "
                             "fold of several subjects is then one mixed calibration domain)")
    parser.add_argument("--out", type=Path, default=Path("results/moabb-transfer"))
    parser.add_argument("--record", default="moabb-transfer", metavar="PREFIX")
    parser.add_argument("--no-record", action="store_true", help="write no record (a smoke run)")


def run(args):
    """``python -m benchmarks.experiments moabb-transfer``."""
    if offline_root(say=print) is None:  # MOABB reads the offline copy and never downloads
        return 1
    chosen = args.modes or modes()
    unknown = sorted(set(chosen) - set(modes()))
    if unknown:
        raise SystemExit(f"unknown cs_mode presets {unknown}; MOABB's: {modes()}")
    if REFERENCE not in args.pipelines:
        raise SystemExit(f"--pipelines must include {REFERENCE}, the row every other is paired with")
    args.out.mkdir(parents=True, exist_ok=True)
    quiet_libraries(args.out / "moabb.log")
    torch.set_num_threads(1)
    start = time.perf_counter()
    split = "loso" if args.cross_folds is None else f"groupkfold{args.cross_folds}-"
    lines = ["# MOABB cross-subject transfer protocols", ""] + records_report.header() + [
        f"subjects: {args.subjects}; split: {split.rstrip('-')}", ""]
    for mode in chosen:
        t0 = time.perf_counter()
        print(f"{mode} ...", flush=True)
        scores, frame = evaluate_mode(mode, args.subjects, transfer_pipelines(args.pipelines), args.cross_folds,
                                      args.out)
        seconds = time.perf_counter() - t0
        scores.drop(columns=["dataset"], errors="ignore").to_csv(args.out / f"scores-{mode}.csv", index=False)
        lines += mode_lines(mode, frame, seconds) + [""]
        print("\n".join(mode_lines(mode, frame, seconds)), flush=True)
        if not args.no_record:
            path = records_report.write_subject_record(
                f"{args.record}-{mode}-{split}{len(args.subjects)}",
                f"MOABB CrossSubject cs_mode={mode}, PhysionetMI left/right, {len(args.subjects)} subjects",
                frame, REFERENCE, seconds, {"cs_mode": mode, "split": split.rstrip("-"),
                                            "subjects": sorted(args.subjects),
                                            "fit_seconds_per_pipeline": scores.groupby("pipeline")["time"]
                                            .mean().round(1).to_dict(),
                                            "one_training_seed": networks(args.pipelines)},
                metrics=metrics_of(mode))
            print(f"record: {path}", flush=True)
    elapsed = time.perf_counter() - start
    lines.append(f"Total: {elapsed / 60:.1f} min wall.")
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    print(f"total: {elapsed / 60:.1f} min wall; report: {args.out / 'report.md'}")
    return 0
