"""What every experiment's report shares: the command, the machine, the budget of a profile,
the report file, and the per-subject scores and paired comparisons.

Decisions are what a calibration-free user gets, so the headline metric of an unseen-subject
figure is the balanced accuracy of each unseen subject; ROC-AUC stands beside it (it ranks
one subject's trials against each other and cannot see a shift of that subject's whole score
distribution). The machine is described by :mod:`benchmarks._machine`, the one helper of the
speed scripts, the experiments and the records.
"""

import platform
import re
import shlex
import sys

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import balanced_accuracy_score, roc_auc_score

import skfedspd

from .._machine import cpu_name
from ..records.paired import paired_difference
from ..records.render import wilcoxon_text
from ..records.store import write_record


METRICS = {"balanced_accuracy": "balanced accuracy (%)", "roc_auc": "ROC-AUC (%)"}


def command_line():
    """How this process was started, as a user types it."""
    return " ".join(shlex.quote(a) for a in ["python", "-m", "benchmarks.experiments"] + sys.argv[1:])


def row_key(pipeline):
    """``"FedSPDnet+dBN, subject domains"`` -> ``"fedspdnet-dbn-subject-domains"``: a record's row key."""
    return re.sub(r"[^a-z0-9]+", "-", pipeline.lower()).strip("-")


def write_subject_record(name, title, scores, reference, wall_seconds, facts, *, metrics=None, command=None,
                         paired_by="subject", measured_on=None):
    """Write the record ``name`` of per-subject ``scores`` (:func:`subject_scores`), every
    pipeline compared with ``reference`` subject by subject; returns its path.

    ``metrics``: ``{column of scores: description}`` (default :data:`METRICS`); ``command``:
    the command that computed the scores (default: this process's); ``paired_by``: what a
    unit (the ``subject`` column) is; ``measured_on``: the machine (default: this one).
    """
    metrics = METRICS if metrics is None else metrics
    rows = {row_key(pipeline): {"label": pipeline,
                                "scores": {m: dict(zip(part["subject"], part[m])) for m in metrics}}
            for pipeline, part in scores.groupby("pipeline", sort=False)}
    return write_record(name, title=title, command=command or command_line(), rows=rows, metrics=metrics,
                        reference=row_key(reference), paired_by=paired_by, wall_seconds=wall_seconds, facts=facts,
                        measured_on=measured_on)


def resolve_profile(args, profiles):
    """``(profile name, budget, number of seeds)`` from ``--profile``/``--quick``, ``--rounds``
    and ``--seeds`` (each overriding the profile's)."""
    profile = args.profile or ("quick" if args.quick else "full")
    budget = dict(profiles[profile])
    if args.rounds is not None:
        budget["rounds"] = args.rounds
    return profile, budget, budget["seeds"] if args.seeds is None else args.seeds


def write_report(lines, out, figure=None, docs=None):
    """Print the report, write it to ``out/report.md`` and copy ``figure`` to ``docs`` (if given)."""
    text = "\n".join(lines)
    print("\n" + text)
    (out / "report.md").write_text(text + "\n")
    if docs and figure is not None:
        docs.mkdir(parents=True, exist_ok=True)
        (docs / figure.name).write_bytes(figure.read_bytes())


def header():
    """The lines every report opens with: command, package version, machine."""
    return [f"command : `{command_line()}`",
            f"package : skfedspd {skfedspd.__version__}, torch {torch.__version__}, "
            f"python {platform.python_version()}",
            f"machine : {cpu_name()}, 1 thread per process"]


def subject_scores(predictions):
    """One row per (pipeline, subject): balanced accuracy and ROC-AUC (in %).

    ``predictions``: DataFrame with columns ``pipeline``, ``subject``, ``y`` (0/1),
    ``pred`` (0/1) and ``score`` (decision value or probability of class 1).
    """
    rows = []
    for (name, subject), part in predictions.groupby(["pipeline", "subject"], sort=False):
        rows.append({"pipeline": name, "subject": subject,
                     "balanced_accuracy": 100 * balanced_accuracy_score(part["y"], part["pred"]),
                     "roc_auc": 100 * roc_auc_score(part["y"], part["score"])})
    return pd.DataFrame(rows)


def paired(a, b):
    """``(mean, standard error, wins, n)`` of the paired differences ``a − b`` (pairs in order)."""
    d = paired_difference(dict(enumerate(np.asarray(a, dtype=float))), dict(enumerate(np.asarray(b, dtype=float))))
    return d.mean, d.se, d.higher, d.n


def format_paired(a, b):
    """``"+1.2 ± 0.4 (higher on 25 of 40, Wilcoxon p = 0.012)"``, ``", level"`` added within two
    standard errors."""
    d = paired_difference(dict(enumerate(np.asarray(a, dtype=float))), dict(enumerate(np.asarray(b, dtype=float))))
    level = ", level" if d.reading == "level" else ""
    return f"{d.mean:+.1f} ± {d.se:.1f} (higher on {d.higher} of {d.n}, {wilcoxon_text(d.p)}{level})"


def score_table(scores, order):
    """Markdown table: mean ± sd over subjects of each metric, per pipeline in ``order``."""
    lines = ["| pipeline | balanced accuracy % | ROC-AUC % | subjects |", "| --- | --- | --- | --- |"]
    for name in order:
        part = scores[scores["pipeline"] == name]
        if len(part):
            ba, auc = part["balanced_accuracy"], part["roc_auc"]
            lines.append(f"| {name} | {ba.mean():.1f} ± {ba.std(ddof=1):.1f} | "
                         f"{auc.mean():.1f} ± {auc.std(ddof=1):.1f} | {len(part)} |")
    return lines


def paired_lines(scores, pairs):
    """Markdown bullet per ``(a, b)`` of ``pairs``: paired differences in both metrics."""
    wide = {m: scores.pivot(index="subject", columns="pipeline", values=m)
            for m in ("balanced_accuracy", "roc_auc")}
    lines = []
    for a, b in pairs:
        if a in wide["balanced_accuracy"] and b in wide["balanced_accuracy"]:
            both = wide["balanced_accuracy"][[a, b]].dropna().index
            ba = format_paired(wide["balanced_accuracy"].loc[both, a], wide["balanced_accuracy"].loc[both, b])
            auc = format_paired(wide["roc_auc"].loc[both, a], wide["roc_auc"].loc[both, b])
            lines.append(f"- {a} − {b}: balanced accuracy {ba}; ROC-AUC {auc}")
    return lines
