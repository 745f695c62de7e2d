"""MOABB evaluations of skfedspd against pyRiemann pipelines on the offline PhysionetMI subjects.

MOABB's ``WithinSessionEvaluation`` (5-fold per subject and session) and
``CrossSubjectEvaluation`` (unseen subjects: leave-one-subject-out in ``--quick``,
``GroupKFold(--cross-folds)`` otherwise, 5 by default) on ``PhysionetMI(imagined=True)`` read
from the offline copy (``../shared/data`` or ``$SKFEDSPD_DATA``; never downloads).

Scores: balanced accuracy per subject (the decision a user gets: the headline metric for
unseen subjects, where a shift of a subject's whole score distribution costs decisions but
not ranks) with ROC-AUC beside it for two classes (MOABB's convention) and accuracy for four.
Paired differences ± standard error over subjects, with the number of subjects won.

* left/right hand (``LeftRightImagery``), the 40 offline subjects (``--quick``: subjects 1-4);
* 4 classes (``MotorImagery``, accuracy) on subjects 1, 4, 15 and 42, the only ones whose six
  imagery runs are all present (full run only).

``--channels sensorimotor`` keeps the 16 sensorimotor channels
(:data:`skfedspd.datasets.SENSORIMOTOR_CHANNELS`) in every paradigm instead of the 64; the
records say so in their title and facts (name them with ``--record``).

Pipelines (MOABB's own definitions where it has one: OAS covariances for the tangent-space
and MDM pipelines; SCM covariances for SPDnet, as in the paper):

* TS+LR, TS+SVM, MDM, FgMDM (pyRiemann; FgMDM is MOABB's best PhysionetMI left/right
  pipeline within session);
* Recenter+TS+LR: ``skfedspd.Recenter`` (each subject re-centred to the identity) before the
  tangent space. In CrossSubject, MOABB passes the training subjects (``fit(subjects=...)``)
  to the pipelines whose routing asks for them: ``Recenter``, ``SPDnetClassifier`` and the
  federated estimator do by default;
* SPDnet, FedSPDnet: ``SPDnetClassifier()`` and ``FederatedSPDnetClassifier()`` with their
  default constructors (``random_state=0``); "SPDnet, 5 seeds": five ``SPDnetClassifier()``
  (seeds 0-4) in scikit-learn's soft ``VotingClassifier``. In CrossSubject, MOABB routes the
  training subjects to ``fit`` (metadata routing, key ``subjects``): clients of
  ``--groups-per-client`` subjects (2 by default), each subject a domain. In WithinSession no
  subjects reach ``fit``: the federated estimator falls back to its
  ``n_clients`` partition;
* SPDnet + domain BN, FedSPDnet + domain BN: ``batchnorm="domain"``;
* EEGNet: ``EEGNetClassifier(fs=160)`` on the band-passed epochs (full run only).

The pipelines are those of :mod:`.pipelines` (``moabb_pipelines``), the data MOABB's
PhysionetMI through :mod:`.data` (``physionet_moabb``).

Output under ``--out`` (default ``results/moabb-evaluation``, ``results/moabb-evaluation-quick``
with ``--quick``): MOABB's scores (``scores.csv``, one column per metric), ``report.md`` (the mean
scores over subjects per pipeline and evaluation, the paired target lines, the command, the
machine and the time), MOABB's
score plots (``moabb.analysis.plotting.score_plot``) as PNG, MOABB's results store
(``hdf5_path``), the MNE/MOABB log (``moabb.log``; library noise stays out of the console) and
``run.json`` (command, wall and CPU time, split, machine).

Records (``benchmarks/records/data``, :func:`write_records`): one per task and evaluation, every
pipeline's per-subject balanced accuracy and ROC-AUC paired with TS+LR's, named by the split
(``moabb-withinsession-16``, ``moabb-crosssubject-loso16``, ``moabb-crosssubject-groupkfold4-16``;
``--record`` sets the prefix). A run writes its own; ``--combine`` of runs on disjoint subject
sets writes the combined one (``moabb-crosssubject-loso4x4``: leave one out within each of four
runs of four subjects), and of one folder re-writes that run's record from its folder. Runs
meant only as parts of a ``--combine`` take ``--no-record``.

    nice python -m benchmarks.experiments moabb --quick    # subjects 1-4, left/right, 8 pipelines
    nice python -m benchmarks.experiments moabb            # 40 subjects, + 4 classes, all pipelines
    # unseen subjects only, 40 subjects in GroupKFold(5) (the quick pipelines):
    nice python -m benchmarks.experiments moabb --quick --subjects 1 2 ... 39 42 \
        --evaluations CrossSubject --cross-folds 5
    # within session, the 40 subjects, the defaults against FgMDM and TS+LR:
    nice python -m benchmarks.experiments moabb --quick --subjects 1 2 ... 39 42 \
        --evaluations WithinSession --pipelines TS+LR FgMDM SPDnet
"""

import argparse
import json
import logging
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from skfedspd.datasets import SENSORIMOTOR_CHANNELS

from .._machine import cpu_name, machine_facts
from ..records.store import read_record
from . import report as records_report
from .data import offline_root, physionet_moabb

FOUR_CLASS_SUBJECTS = [1, 4, 15, 42]  # all six imagery runs present offline
EVALUATIONS = ("WithinSession", "CrossSubject")
QUICK_SUBJECTS = [1, 2, 3, 4]


#: ``--channels``: the EEG channels the paradigms keep (None: all 64).
CHANNEL_SETS = {"all": None, "sensorimotor": SENSORIMOTOR_CHANNELS}


def datasets(quick, subjects=None, channels=None):
    """(label, dataset, paradigm) triples; ``subjects`` overrides the left/right subjects,
    ``channels`` (names) restricts every paradigm to them."""
    from skfedspd.datasets import PHYSIONET_LEFT_RIGHT_SUBJECTS

    subjects = list(subjects or (QUICK_SUBJECTS if quick else PHYSIONET_LEFT_RIGHT_SUBJECTS))
    missing = sorted(set(subjects) - set(PHYSIONET_LEFT_RIGHT_SUBJECTS))
    if missing:
        raise SystemExit(f"subjects {missing} are not in the offline copy ({list(PHYSIONET_LEFT_RIGHT_SUBJECTS)})")
    picked = {} if channels is None else {"channels": list(channels)}
    out = [("left/right", *physionet_moabb(subjects, 2, scorer=list(METRICS["left/right"]), **picked))]
    if not quick:
        out.append(("4 classes", *physionet_moabb(FOUR_CLASS_SUBJECTS, 4, scorer=list(METRICS["4 classes"]),
                                                  **picked)))
    return out


#: MOABB scorers per task (the first is MOABB's ``score`` column), with their labels.
METRICS = {"left/right": {"balanced_accuracy": "balanced accuracy", "roc_auc": "ROC-AUC"},
           "4 classes": {"balanced_accuracy": "balanced accuracy", "accuracy": "accuracy"}}


def per_subject(scores, scorer):
    """Mean of one scorer's column per (evaluation, pipeline, subject), in %."""
    return 100 * scores.groupby(["evaluation", "pipeline", "subject"])[f"score_{scorer}"].mean()


def table(scores, task):
    """Markdown: mean ± sd over subjects of every metric, per evaluation and pipeline."""
    evaluations = list(dict.fromkeys(scores["evaluation"]))
    means = {scorer: per_subject(scores, scorer) for scorer in METRICS[task]}
    names = list(dict.fromkeys(scores["pipeline"]))
    heads = [f"{e} {label} (%)" for e in evaluations for label in METRICS[task].values()]
    lines = ["| pipeline | " + " | ".join(heads) + " | fit time per fold (s) |", "| --- |" + " --- |" * (len(heads) + 1)]
    for name in names:
        cells = []
        for e in evaluations:
            for scorer in METRICS[task]:
                s = means[scorer].get((e, name))
                cells.append("-" if s is None else f"{s.mean():.1f} ± {s.std(ddof=1):.1f}")
        fit_time = scores.loc[scores["pipeline"] == name, "time"].mean()
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {fit_time:.1f} |")
    return "\n".join(lines)


#: Targets, in balanced accuracy per subject: (evaluation, pipeline, reference, margin in
#: points), the pipeline ≥ reference + margin.
TARGETS = [
    ("WithinSession", "SPDnet", "TS+LR", 0.0),
    ("WithinSession", "FedSPDnet", "SPDnet", -3.0),
    ("CrossSubject", "SPDnet + domain BN", "Recenter+TS+LR", 2.0),
    ("CrossSubject", "FedSPDnet + domain BN", "Recenter+TS+LR", 2.0),
    ("CrossSubject", "FedSPDnet + domain BN", "SPDnet + domain BN", -1.0),
]


def target_verdict(mean, se, margin):
    """Whether a paired difference ``mean`` ± ``se`` reaches ``margin``: only beyond two
    standard errors is it reached (or not); within them it is not resolved."""
    if not se == se:  # one subject: no standard error
        return "not resolved (one subject)"
    if mean - 2 * se >= margin:
        return "reached beyond two standard errors"
    if mean + 2 * se < margin:
        return "NOT reached, beyond two standard errors"
    return "not resolved (within two standard errors)"


def target_lines(scores, scorer="balanced_accuracy"):
    """One line per target of :data:`TARGETS` on the subjects both pipelines have, in
    ``scorer``: the two means, their paired difference ± its standard error over subjects,
    how many subjects the pipeline wins, and :func:`target_verdict`."""
    means = per_subject(scores, scorer)
    lines = []
    for evaluation, name, reference, margin in TARGETS:
        try:
            a, b = means.loc[evaluation, name], means.loc[evaluation, reference]
        except KeyError:
            continue
        diff = (a - b).dropna()
        se = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else float("nan")
        verdict = target_verdict(diff.mean(), se, margin)
        goal = f"≥ {reference}" + (f" {margin:+g}" if margin else "")
        lines.append(f"- {evaluation}, {name} {goal}: {a[diff.index].mean():.1f} vs {b[diff.index].mean():.1f}, "
                     f"difference **{diff.mean():+.1f}** ± {se:.1f} (SE over {len(diff)} subjects; higher on "
                     f"{int((diff > 0).sum())}): {verdict}")
    return lines


def combine(folders):
    """The scores of earlier runs on disjoint subject sets, as one table (column ``run``: the
    index of the run's folder in ``folders``)."""
    import pandas as pd

    scores = pd.concat([pd.read_csv(Path(f) / "scores.csv").assign(run=k) for k, f in enumerate(folders)],
                       ignore_index=True)
    keys = ["task", "evaluation", "pipeline", "subject", "session"]
    repeated = scores.groupby(keys).size().pipe(lambda n: n[n > 1])  # MOABB stores one row per session
    if len(repeated):
        raise SystemExit(f"--combine needs disjoint subject sets; repeated: {list(repeated.index[:3])}")
    return scores


#: What a run leaves beside its ``scores.csv`` for the records: its command, wall and CPU
#: time, split and machine (:func:`write_run`).
RUN_FILE = "run.json"
#: The pipeline every other row of a record is compared with, subject by subject.
RECORD_REFERENCE = "TS+LR"


def write_run(out, command, wall_seconds, cpu_seconds, cross_folds, subjects, measured_on=None, channels="all"):
    """``out/run.json``: how the scores of ``out`` were computed (``cross_folds``: K of
    CrossSubject's GroupKFold, None for leave-one-subject-out; ``subjects``: ``{task: the
    subjects evaluated}``, more than the scores name when a test fold of several subjects is
    scored as one; ``channels``: a key of :data:`CHANNEL_SETS`)."""
    run = {"command": command, "wall_seconds": round(float(wall_seconds), 1),
           "cpu_seconds": round(float(cpu_seconds), 1), "cross_folds": cross_folds,
           "subjects": {task: [int(s) for s in subject_list] for task, subject_list in subjects.items()},
           "channels": channels, "machine": measured_on or machine_facts()}
    (Path(out) / RUN_FILE).write_text(json.dumps(run, indent=1) + "\n")
    return run


def read_run(folder):
    path = Path(folder) / RUN_FILE
    if not path.exists():
        raise SystemExit(f"{path} is missing: the run of {folder} wrote no {RUN_FILE}, run it again")
    return json.loads(path.read_text())


def record_name(prefix, task, evaluation, cross_folds, group_sizes):
    """``moabb-withinsession-16``, ``moabb-crosssubject-loso16``,
    ``moabb-crosssubject-groupkfold4-16``; runs combined on groups of subjects evaluate
    CrossSubject within each group: ``moabb-crosssubject-loso4x4`` (4 groups of 4);
    ``-4class`` for the 4-class task."""
    n = sum(group_sizes)
    if evaluation == "WithinSession":
        tag = f"withinsession-{n}"
    else:
        split = "loso" if cross_folds is None else f"groupkfold{cross_folds}-"
        if len(group_sizes) == 1:
            tag = f"crosssubject-{split}{n}"
        elif len(set(group_sizes)) == 1:
            tag = f"crosssubject-{split}{group_sizes[0]}x{len(group_sizes)}"
        else:
            tag = f"crosssubject-{split}" + "-".join(map(str, group_sizes))
    return f"{prefix}-{tag}" + ("" if task == "left/right" else "-4class")


def split_words(evaluation, cross_folds, group_sizes):
    """The split of a record, in words."""
    if evaluation == "WithinSession":
        return "5-fold cross-validation per subject and session"
    within = "" if len(group_sizes) == 1 else f" within each of {len(group_sizes)} runs' subjects"
    if cross_folds is None:
        return "leave one subject out" + within
    return f"GroupKFold({cross_folds}) over subjects{within}, each test fold scored as one"


#: The rows of a record in the order of :func:`~.pipelines.moabb_pipelines` (MOABB's
#: results come in the order its parallel tasks end).
PIPELINE_ORDER = ["TS+LR", "TS+SVM", "MDM", "FgMDM", "Recenter+TS+LR", "SPDnet", "SPDnet, 5 seeds", "FedSPDnet",
                  "SPDnet + domain BN", "FedSPDnet + domain BN", "EEGNet"]
#: The rows that train a network, from one seed (``random_state=0``): their readings over
#: subjects say so (the records' fact ``one_training_seed``).
NETWORKS = PIPELINE_ORDER[PIPELINE_ORDER.index("SPDnet"):]


def subject_frame(scores, task, metrics=None):
    """One row per (pipeline, subject) of one evaluation: every metric of ``task`` (or of
    ``metrics``) in % (MOABB's sessions averaged)."""
    import pandas as pd

    columns = {m: per_subject(scores, m).droplevel("evaluation") for m in (metrics or METRICS[task])}
    frame = pd.DataFrame(columns).reset_index()
    names = [n for n in PIPELINE_ORDER if n in set(scores["pipeline"])]
    order = {name: k for k, name in enumerate(names + sorted(set(scores["pipeline"]) - set(names)))}
    return frame.sort_values("pipeline", key=lambda names: names.map(order), kind="stable", ignore_index=True)


def score_figure(record, path, metric="balanced_accuracy"):
    """A record's scores in ``metric``, one point per unit (subject or test fold) and row, the
    mean as a bar, chance at 50; saved as ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(record["rows"].values())
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    jitter = np.random.default_rng(0)
    for k, row in enumerate(rows):
        values = np.array(list(row["scores"][metric].values()))
        ax.scatter(values, k + jitter.uniform(-0.15, 0.15, len(values)), s=14, alpha=0.7, color=f"C{k % 10}")
        ax.plot([values.mean()] * 2, [k - 0.3, k + 0.3], color="black", linewidth=2)
    ax.axvline(50, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(rows)), [row["label"] for row in rows])
    ax.invert_yaxis()
    ax.set_xlabel(f"{record['metrics'][metric]}, one point per {record['paired_by']}; bar: mean")
    ax.set_title(record["title"], fontsize=9)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def write_records(folders, prefix="moabb", command=None, figures=None):
    """The records of the runs in ``folders`` (one per task and evaluation; runs on disjoint
    subject sets combined): every pipeline's per-subject scores, paired with TS+LR's. The
    command of one run is the record's; several runs are combined by ``command`` (default:
    this process's), their commands kept as the fact ``run_commands``. ``figures``: a folder
    for each record's score plot, ``NAME.png``, drawn from the record (:func:`score_figure`).
    Returns the
    paths (under :data:`~benchmarks.records.store.RECORDS`)."""
    folders = [Path(f) for f in folders]
    runs = [read_run(f) for f in folders]
    scores = combine(folders)
    paths = []
    for (task, evaluation), part in scores.groupby(["task", "evaluation"], sort=False):
        used = [runs[k] for k in sorted(part["run"].unique())]
        subjects = [r["subjects"][task] for r in used]
        group_sizes = [len(s) for s in subjects]
        folds = {r["cross_folds"] for r in used}
        if evaluation == "CrossSubject" and len(folds) > 1:
            raise SystemExit(f"the runs split CrossSubject differently ({sorted(folds, key=str)}): not one record")
        cross_folds = folds.pop() if evaluation == "CrossSubject" else None
        channels = {r.get("channels", "all") for r in used}  # runs before the option: all 64
        if len(channels) > 1:
            raise SystemExit(f"the runs keep different channels ({sorted(channels)}): not one record")
        channels = channels.pop()
        name = record_name(prefix, task, evaluation, cross_folds, group_sizes)
        frame = subject_frame(part, task)
        facts = {"task": task, "evaluation": evaluation, "split": split_words(evaluation, cross_folds, group_sizes),
                 "subjects": sorted(s for group in subjects for s in group), "runs": len(used),
                 "cpu_minutes": round(sum(r["cpu_seconds"] for r in used) / 60, 1),
                 "one_training_seed": [records_report.row_key(name) for name in NETWORKS
                                       if name in set(frame["pipeline"])]}
        paired_by = "subject"
        if evaluation == "CrossSubject" and cross_folds is not None:
            paired_by = "fold"
            facts["unit"] = "a test fold of subjects scored as one, named by its first subject"
        if len(used) > 1:  # separate runs: their wall times, no wall time of one run
            facts["run_commands"] = [r["command"] for r in used]
            facts["run_wall_seconds"] = [r["wall_seconds"] for r in used]
        title = f"MOABB {evaluation}, PhysionetMI {task}, {len(facts['subjects'])} subjects, {facts['split']}"
        if channels != "all":
            picked = CHANNEL_SETS[channels]
            facts["channels"] = list(picked)
            title += f", {len(picked)} {channels} channels"
        reference = RECORD_REFERENCE if RECORD_REFERENCE in set(frame["pipeline"]) else frame["pipeline"].iloc[0]
        metrics = {m: f"{label} (%)" for m, label in METRICS[task].items()}
        paths.append(records_report.write_subject_record(
            name, title, frame, reference, used[0]["wall_seconds"] if len(used) == 1 else None, facts, metrics=metrics,
            command=used[0]["command"] if len(used) == 1 else command, paired_by=paired_by,
            measured_on=used[-1].get("machine")))
        if figures is not None:
            score_figure(read_record(name, paths[-1].parent), Path(figures) / f"{name}.png")
    return paths


def report_combined(folders, out, command):
    """``--combine``: one table and the target lines over the subjects of every folder."""
    scores = combine(folders)
    lines = [f"# MOABB evaluation, {len(folders)} runs combined\n", f"command: `{command}`  ",
             f"runs: {', '.join(f'`{f}`' for f in folders)}"]
    for label, task in scores.groupby("task", sort=False):
        subjects = sorted(int(s) for s in task["subject"].unique())
        lines += ["", f"## PhysionetMI {label}, subjects {subjects}: mean over subjects (± sd over subjects)", "",
                  table(task, label), "", "Targets (balanced accuracy, paired over subjects):", *target_lines(task)]
    text = "\n".join(lines)
    print(text)
    (out / "report.md").write_text(text + "\n")
    scores.to_csv(out / "scores.csv", index=False)
    return 0


def quiet_libraries(log_path):
    """MNE / MOABB messages and warnings go to ``log_path``, not to the console."""
    import mne

    handler = logging.FileHandler(log_path, mode="w")
    for name in ("mne", "moabb"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
    mne.set_log_file(str(log_path), overwrite=False)
    mne.set_log_level("WARNING")
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").handlers = [handler]
    logging.getLogger("py.warnings").propagate = False
    warnings.simplefilter("default")


def at_least_two(text):
    k = int(text)
    if k < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2, got {k}")
    return k


def add_arguments(parser):
    parser.add_argument("--quick", action="store_true", help="subjects 1-4, left/right, fewer pipelines")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse MOABB's stored results of unchanged pipelines (MOABB keys them on get_params, "
                             "not on the code: only when the package has not changed since)")
    parser.add_argument("--subjects", type=int, nargs="+", default=None,
                        help="left/right subjects (default: 1-4 with --quick, else the 40 offline ones)")
    parser.add_argument("--groups-per-client", type=int, default=2,
                        help="subjects per client of the federated rows in CrossSubject (default: 2)")
    parser.add_argument("--combine", type=Path, nargs="+", default=None, metavar="DIR",
                        help="fit nothing: report the scores.csv of earlier runs on disjoint subject sets as one table")
    parser.add_argument("--evaluations", nargs="+", choices=EVALUATIONS, default=list(EVALUATIONS),
                        help="which MOABB evaluations to run (default: both)")
    parser.add_argument("--cross-folds", type=at_least_two, default=None, metavar="K",
                        help="CrossSubject by GroupKFold(K) over the subjects (default: leave-one-subject-out with "
                             "--quick, K = 5 otherwise)")
    parser.add_argument("--pipelines", nargs="+", choices=PIPELINE_ORDER, default=None, metavar="NAME",
                        help="only these pipelines: " + ", ".join(PIPELINE_ORDER))
    parser.add_argument("--channels", choices=list(CHANNEL_SETS), default="all",
                        help="the EEG channels kept: all 64, or the 16 sensorimotor ones "
                             "(skfedspd.datasets.SENSORIMOTOR_CHANNELS)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--record", default="moabb", metavar="PREFIX",
                        help="records PREFIX-withinsession-N, PREFIX-crosssubject-losoN, "
                             "PREFIX-crosssubject-groupkfoldK-N (default prefix: moabb); --combine writes the "
                             "combined ones")
    parser.add_argument("--figures", type=Path, default=None, metavar="DIR",
                        help="save each record's score plot (drawn from the record) as DIR/NAME.png, "
                             "e.g. docs/benchmarks/figures")
    parser.add_argument("--no-record", action="store_true",
                        help="write no record (a run that is one part of a --combine)")


def run(args):
    """``python -m benchmarks.experiments moabb``: exits with the evaluation's status."""
    sys.exit(evaluate(args, " ".join(["nice python -m benchmarks.experiments moabb", *sys.argv[2:]])))


def evaluate(args, command):
    """The MOABB evaluations of ``args`` (``command``: how they were asked for); 0 when done."""
    out = args.out or Path("results/moabb-evaluation" + ("-quick" if args.quick else ""))
    out.mkdir(parents=True, exist_ok=True)
    if args.combine:
        status = report_combined(args.combine, out, command)
        if not args.no_record:
            for path in write_records(args.combine, args.record, records_report.command_line(), args.figures):
                print(f"record: {path}")
        return status

    if offline_root(say=print) is None:  # MOABB reads the offline copy and never downloads
        return 1
    quiet_libraries(out / "moabb.log")
    torch.set_num_threads(1)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    from moabb.analysis.plotting import score_plot
    from moabb.evaluations import CrossSubjectEvaluation, WithinSessionEvaluation

    from .pipelines import moabb_pipelines  # pyRiemann's import writes matplotlib's folders

    print(f"command: {command}\nmachine: {cpu_name()}, torch {torch.__version__}\noutput: {out}", flush=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    pipes = moabb_pipelines(args.quick, args.groups_per_client)
    if args.pipelines:
        missing = [name for name in args.pipelines if name not in pipes]
        if missing:
            print(f"--pipelines: {missing} not in the {'quick' if args.quick else 'full'} run's {list(pipes)}",
                  file=sys.stderr)
            return 2
        pipes = {name: pipes[name] for name in args.pipelines}
    report = [f"# MOABB evaluation{' (quick)' if args.quick else ''}\n", f"command: `{command}`  ",
              f"machine: {cpu_name()}, 1 process, torch {torch.__version__}  "]
    all_scores, subjects = [], {}
    for label, dataset, paradigm in datasets(args.quick, args.subjects, CHANNEL_SETS[args.channels]):
        subjects[label] = list(dataset.subject_list)
        runs = []
        cross_folds = args.cross_folds or (None if args.quick else 5)
        evaluations = {
            "WithinSession": lambda: WithinSessionEvaluation(paradigm=paradigm, datasets=[dataset],
                                                             overwrite=not args.reuse, random_state=42,
                                                             hdf5_path=str(out / "hdf5")),
            # GroupKFold (K folds) is deterministic: MOABB would hand it the random_state, which
            # sklearn refuses without shuffling.
            "CrossSubject": lambda: CrossSubjectEvaluation(paradigm=paradigm, datasets=[dataset],
                                                           overwrite=not args.reuse,
                                                           random_state=42 if cross_folds is None else None,
                                                           n_splits=cross_folds, hdf5_path=str(out / "hdf5")),
        }
        for kind, evaluation in ((k, evaluations[k]()) for k in EVALUATIONS if k in args.evaluations):
            t0 = time.perf_counter()
            print(f"{label}: {kind} on subjects {dataset.subject_list} ...", flush=True)
            scores = evaluation.process(pipes)
            scores["evaluation"] = kind
            print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
            runs.append(scores)
            fig, _ = score_plot(scores)
            fig.suptitle(f"PhysionetMI {label}, MOABB {kind}")
            name = f"score_{kind}_{'lr' if label == 'left/right' else '4class'}.png"
            fig.savefig(out / name, dpi=100, bbox_inches="tight")
            plt.close(fig)
        scores = pd.concat(runs, ignore_index=True)
        scores["task"] = label
        all_scores.append(scores)
        report += ["", f"## PhysionetMI {label}, subjects {dataset.subject_list}: mean over subjects "
                   "(± sd over subjects)", "", table(scores, label), "",
                   "Targets (balanced accuracy, paired over subjects):", *target_lines(scores)]
        print(report[-1], flush=True)

    pd.concat(all_scores, ignore_index=True).to_csv(out / "scores.csv", index=False)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    report += ["", f"Total time: {elapsed / 60:.1f} min wall, {cpu / 60:.1f} min CPU of this process (on a busy "
               "machine the wall time grows, the CPU time does not). MOABB scores: `scores.csv`; plots: `score_*.png`."]
    (out / "report.md").write_text("\n".join(report) + "\n")
    print(f"total time: {elapsed / 60:.1f} min wall, {cpu / 60:.1f} min CPU; report: {out / 'report.md'}")
    write_run(out, records_report.command_line(), elapsed, cpu,
              args.cross_folds or (None if args.quick else 5), subjects, channels=args.channels)
    if not args.no_record:
        for path in write_records([out], args.record, figures=args.figures):
            print(f"record: {path}")
    return 0
