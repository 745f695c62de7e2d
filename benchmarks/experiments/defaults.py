"""Defaults that learn on small data: which ``SPDnetClassifier`` rules the defaults rest on.

PhysionetMI left/right (offline subjects 1-4 only: the rules are chosen here and re-checked
on other subjects), the harness's sample covariances (:mod:`.data`), stratified 5-fold
cross-validation, ROC-AUC and accuracy, with TS+LR (:func:`.pipelines.ts_lr`: pyRiemann
``TangentSpace`` + ``LogisticRegression``) on the same folds and the same covariances, side
by side.

Every candidate is a *rule*: a function of what ``fit`` knows (training size ``n``,
``n_channels``, ``n_classes``) that returns constructor parameters of ``SPDnetClassifier``,
applied on top of the defaults the ablation started from (:data:`BEFORE`: the paper's
network, lr 1e-3, early stopping on a validation part whatever its size, restore-best on
the macro-F1). The rules change one thing at a time from those, then combine:

* (a) ``hidden_dims="auto"``: ``d = min(n_channels, max(8, round(0.28 n_channels)))``
  (18 at 64 channels, the paper's network; no reduction at 8 channels or fewer). At 64
  channels every variant gives 18, so (a) is compared on channel subsets (16 and 3
  sensorimotor channels) against the pure ratio and against no reduction;
* (b) a validation split only when it is large enough (``round(0.1 n) >= max(50, 2
  n_classes)``), otherwise a fixed epoch budget at a constant learning rate with the last
  weights; and, where a split is used, restore-best on the validation *loss* instead of
  the macro-F1 (``validation_metric="loss"``);
* (c) learning rate 1e-2 instead of 1e-3; the epoch budget (100 vs 300);
* (d) a batch size relative to ``n``: ``min(64, max(8, ceil(n / 4)))`` (4 steps per epoch
  on small data, 64 on large data).

The package's defaults are the recommended set (a + b + c): ``SPDnetClassifier()``.

Settings: "within" = each subject alone (36 training trials per fold: MOABB's
WithinSession on PhysionetMI), "pooled" = subjects 1-4 together (144 training trials,
the 10 % split holds 14 trials).

    nice python -m benchmarks.experiments defaults --jobs 2            # within-subject rows
    nice python -m benchmarks.experiments defaults --jobs 2 --extra    # + pooled, channel subsets, budgets
    nice python -m benchmarks.experiments defaults --quick             # 2 subjects, 3 rows (smoke run)

Fold results are cached in ``--cache`` (``results/``): a second run only fits what is missing.
A whole run (not ``--quick``) writes one record per setting (``benchmarks/records/data``):
``defaults-within`` (paired by subject: each subject's mean over its 5 folds, the same folds
for every rule) and, with ``--extra``, ``defaults-pooled`` (paired by fold: the 5 folds of
one pooled data set, which share training trials) and ``defaults-within-16-channels``,
``defaults-within-3-channels``; every rule is compared with TS+LR on the same units. The
report (tables with per-subject scores, epochs and fit times) goes to ``--out``.
"""

import json
import math
import os
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from joblib import Parallel, delayed
from sklearn.metrics import accuracy_score, roc_auc_score
from sklearn.model_selection import StratifiedKFold

from skfedspd import SPDnetClassifier
from skfedspd.datasets import SENSORIMOTOR_CHANNELS

from . import report
from ..records.store import write_record
from .data import channel_names, load_left_right, offline_root
from .pipelines import ts_lr

SENSORIMOTOR_3 = ["C3", "Cz", "C4"]
N_MIN_VALIDATION = 50  # smallest validation split worth selecting weights on (accuracy SE <= 0.07)


# ---------------------------------------------------------------------------- rules
def auto_hidden(n_channels, floor=8, ratio=0.28):
    """(a): 18 at 64 channels (the paper); never above n_channels; no reduction up to ``floor``."""
    return min(n_channels, max(floor, round(ratio * n_channels)))


def relative_batch(n):
    """(d): about 4 minibatches per epoch on small data, 64 on large data."""
    return min(64, max(8, math.ceil(n / 4)))


def validation_if_large(n, n_classes, fraction=0.1):
    """(b): the split's fraction, or 0 (fixed budget, last weights) when it would be tiny."""
    return fraction if round(fraction * n) >= max(N_MIN_VALIDATION, 2 * n_classes) else 0.0


#: The defaults the ablation started from, which every rule changes: the paper's network
#: (d = 18), lr 1e-3, early stopping whenever ``validation_fraction > 0``, and restore-best
#: on the validation macro-F1 (a rule's criterion "loss" switches it to the loss).
BEFORE = {"hidden_dims": (18,), "lr": 1e-3, "early_stopping": True, "validation_metric": "f1"}


def today(n, n_channels, n_classes):
    return {}


def rule_b_small_val(n, n_channels, n_classes):
    return {"validation_fraction": validation_if_large(n, n_classes)}


def rule_c_lr(n, n_channels, n_classes):
    return {"lr": 1e-2}


def rule_c_lr_budget(n, n_channels, n_classes):
    return {"lr": 1e-2, "max_epochs": 100}


def rule_d_batch(n, n_channels, n_classes):
    return {"batch_size": relative_batch(n)}


def combination(max_epochs=300, batch=True, lr=1e-2):
    def rule(n, n_channels, n_classes):
        params = {"hidden_dims": (auto_hidden(n_channels),), "lr": lr, "max_epochs": max_epochs,
                  "validation_fraction": validation_if_large(n, n_classes)}
        if batch:
            params["batch_size"] = relative_batch(n)
        return params

    return rule


def with_hidden(d, base):
    def rule(n, n_channels, n_classes):
        return {**base(n, n_channels, n_classes), "hidden_dims": (d,)}

    return rule


#: The rule set this ablation recommends: (a) + (b) + lr 1e-2, batch 64, 300 epochs.
RECOMMENDED = combination(300, batch=False)


# ---------------------------------------------------------------------------- evaluation
def stratified_folds(y, seed=42):
    """The within-subject folds: StratifiedKFold(5, shuffle=True, random_state=42)."""
    return list(StratifiedKFold(5, shuffle=True, random_state=seed).split(np.zeros(len(y)), y))


def score(y_true, scores, classes):
    pred = classes[(scores > 0).astype(int)]
    return roc_auc_score(y_true == classes[1], scores), accuracy_score(y_true, pred)


def fit_fold(X, y, tr, te, rule, criterion, k):
    """One fold: SPDnet under ``rule`` (``criterion``: restore-best on "f1" or "loss"), or
    TS+LR when ``rule == "ts-lr"``. Runs in a joblib worker (one torch thread)."""
    torch.set_num_threads(1)
    start, cpu = time.perf_counter(), time.process_time()
    if rule == "ts-lr":
        params, epochs, best = {}, np.nan, np.nan
        clf = ts_lr(k)
        clf.fit(X[tr], y[tr])
    else:
        params = rule(len(tr), X.shape[1], len(np.unique(y)))
        clf = SPDnetClassifier(random_state=k, **{**BEFORE, **params, "validation_metric": criterion})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            clf.fit(X[tr], y[tr])
        epochs, best = clf.n_iter_, clf.best_epoch_
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    auc, acc = score(y[te], clf.decision_function(X[te]), clf.classes_)
    return dict(auc=auc, acc=acc, epochs=epochs, best=best, time=elapsed, cpu=cpu, params=params)


def describe(params):
    if not params:
        return "the starting defaults"
    return ", ".join(f"{k}={v}" for k, v in params.items())


def summarize(name, per_unit):
    """per_unit: {subject or 'pooled': [fold records]} -> one table row."""
    aucs = [np.mean([r["auc"] for r in recs]) for recs in per_unit.values()]
    accs = [np.mean([r["acc"] for r in recs]) for recs in per_unit.values()]
    recs = [r for rs in per_unit.values() for r in rs]
    sd = f" ± {100 * np.std(aucs, ddof=1):.1f}" if len(aucs) > 1 else ""
    return {
        "name": name, "auc": np.mean(aucs), "acc": np.mean(accs),
        "text": (f"| {name} | {TS_LR if name == 'TS+LR' else describe(recs[0]['params'])} | {100 * np.mean(aucs):.1f}{sd} | "
                 f"{100 * np.mean(accs):.1f} | "
                 + " ".join(f"{100 * a:.0f}" for a in aucs)
                 + f" | {_epochs(recs)}"
                 f" | {np.mean([r['time'] for r in recs]):.1f} |"),
    }


def _epochs(recs):
    epochs = [r["epochs"] for r in recs if r["epochs"] == r["epochs"]]  # NaN (TS+LR) left out
    return f"{np.mean(epochs):.0f} / {np.mean([r['best'] for r in recs]):.0f}" if epochs else "-"


TS_LR = "TangentSpace(riemann) + LogisticRegression(C=1)"
HEADER = ("| rule | parameters at this n | ROC-AUC (%) mean ± sd over subjects | accuracy (%) | "
          "per-subject ROC-AUC | epochs run / restored | fit (s) |\n| --- | --- | --- | --- | --- | --- | --- |")


def evaluate_setting(title, units, rules, log, jobs, cache):
    """units: {label: (X, y)}; rules: [(key, name, rule or 'ts-lr', criterion)]. Every fold of
    every rule in one joblib pool; fold results are kept in ``cache`` (a folder, keyed by
    setting, rule and fold) so an interrupted run resumes where it stopped.

    Returns ``(rows, folds, elapsed, cached)``: the table rows, ``{rule key: {unit: [fold
    records]}}``, this call's wall time and the fold records read from the cache."""
    start = time.perf_counter()
    log(f"\n## {title}\n\n{HEADER}")
    tasks = [(r, label, k, tr, te) for r in range(len(rules)) for label, (X, y) in units.items()
             for k, (tr, te) in enumerate(stratified_folds(y))]
    paths = [cache / f"{_slug(title)}--{_slug(rules[r][0])}--{label}--{k}.json" for r, label, k, _, _ in tasks]
    todo = [i for i, path in enumerate(paths) if not path.exists()]
    COUNTS["fitted"] += len(todo)
    COUNTS["cached"] += len(paths) - len(todo)
    Parallel(n_jobs=jobs)(
        delayed(_cached_fold)(paths[i], *units[tasks[i][1]], tasks[i][3], tasks[i][4], rules[tasks[i][0]][2],
                              rules[tasks[i][0]][3], tasks[i][2]) for i in todo)
    records = [json.loads(path.read_text()) for path in paths]
    COUNTS["fit_seconds"] += sum(r["time"] for r in records)
    rows, folds = [], {}
    for r, (key, name, _, _) in enumerate(rules):
        folds[key] = {label: [rec for (i, lab, *_), rec in zip(tasks, records) if i == r and lab == label]
                      for label in units}
        row = summarize(name, folds[key])
        rows.append(row)
        log(row["text"])
    fitted = set(todo)
    cached = [record for i, record in enumerate(records) if i not in fitted]
    return rows, folds, time.perf_counter() - start, cached


#: The metrics of a record of this ablation (in %).
METRICS = {"roc_auc": "ROC-AUC (%)", "accuracy": "accuracy (%)"}


def unit_scores(per_unit, paired_by):
    """``{metric: {unit: score in %}}`` of one rule: per subject, the mean over its folds
    (``paired_by="subject"``), or per fold of the one unit (``"fold"``: the pooled data)."""
    field = {"roc_auc": "auc", "accuracy": "acc"}
    if paired_by == "subject":
        return {m: {label: 100 * np.mean([r[f] for r in recs]) for label, recs in per_unit.items()}
                for m, f in field.items()}
    (recs,) = per_unit.values()
    return {m: {k: 100 * r[f] for k, r in enumerate(recs)} for m, f in field.items()}


def rule_facts(key, recs):
    """A rule's facts: its parameters at the first fold's training size, the mean CPU time of
    a fold's fit (s), and for SPDnet the mean epochs run and the mean epoch kept."""
    facts = {f"fit_cpu_seconds/{key}": round(float(np.mean([r.get("cpu", r["time"]) for r in recs])), 1)}
    epochs = [r["epochs"] for r in recs if r["epochs"] == r["epochs"]]  # NaN (TS+LR) left out
    if epochs:
        facts[f"parameters/{key}"] = describe(recs[0]["params"])
        facts[f"epochs/{key}"] = int(round(np.mean(epochs)))
        facts[f"kept_epoch/{key}"] = int(round(np.mean([r["best"] for r in recs])))
    return facts


def write_setting_record(name, title, rules, folds, paired_by, elapsed, cached, facts):
    """Write the record ``name`` of one setting: every rule (``rules``: ``[(key, label, rule,
    criterion)]``, TS+LR first, the reference) per unit (:func:`unit_scores`), from ``folds``
    (``{rule key: {unit: [fold records]}}``, as :func:`evaluate_setting` returns them).

    Its time is the setting's wall time (``elapsed``); ``fit_cpu_minutes`` sums the CPU time of
    every fold, cached ones included."""
    rows = {key: {"label": label, "scores": unit_scores(folds[key], paired_by)} for key, label, _, _ in rules}
    recs = {key: [r for unit in folds[key].values() for r in unit] for key, _, _, _ in rules}
    every = [r for rs in recs.values() for r in rs]
    facts = {**facts, "folds": len(every), "folds_cached_at_start": len(cached),
             "fit_cpu_minutes": round(sum(r.get("cpu", r["time"]) for r in every) / 60, 1)}
    for key, rs in recs.items():
        facts.update(rule_facts(key, rs))
    return write_record(name, title=title, command=report.command_line(), rows=rows, metrics=METRICS,
                        reference=rules[0][0], paired_by=paired_by,
                        wall_seconds=elapsed, facts=facts)


COUNTS = {"fitted": 0, "cached": 0, "fit_seconds": 0.0}


def _cached_fold(path, *args):
    """:func:`fit_fold`, its record written to ``path`` as soon as it is done (in the worker)."""
    record = fit_fold(*args)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, default=_jsonable))
    tmp.replace(path)


def _slug(text):
    return "".join(c if c.isalnum() else "_" for c in text)[:80]


def _jsonable(value):
    return value.item() if isinstance(value, np.generic) else list(value) if isinstance(value, tuple) else str(value)


def add_arguments(parser):
    parser.add_argument("--quick", action="store_true", help="subjects 1-2, fewer rules (smoke run)")
    parser.add_argument("--jobs", type=int, default=1, help="joblib processes (folds in parallel)")
    parser.add_argument("--extra", action="store_true",
                        help="also the pooled setting, the channel subsets of (a) and two more budget rows")
    parser.add_argument("--cache", type=Path, default=Path("results/ablation-defaults-cache"))
    parser.add_argument("--out", type=Path, default=Path("results/ablation-defaults.md"),
                        help="the report (the records go to benchmarks/records/data)")


def run(args):
    lines = []

    def log(text):
        print(text, flush=True)
        lines.append(text)

    if offline_root(say=print) is None:
        return
    subjects = [1, 2] if args.quick else [1, 2, 3, 4]
    args.cache.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    X, y, subj = load_left_right(subjects)
    log("# Defaults that learn on small data: ablation\n")
    log("  \n".join(report.header()) + f"  \njoblib: {args.jobs} process(es) of 1 torch thread\n")
    log(f"PhysionetMI left/right, subjects {subjects} (offline copy), {X.shape[1]} channels, "
        f"covariances of `load_physionet_mi` (8-32 Hz, 0-3 s, sample covariance); StratifiedKFold(5, "
        "shuffle=True, random_state=42) per unit; SPDnet random_state = fold index. ROC-AUC from "
        "`decision_function`; mean over folds per subject, then over subjects. TS+LR = "
        "TangentSpace(riemann) + LogisticRegression(C=1) on the same covariances and folds.")

    def setting(record, title, units, rules, paired_by, **facts):
        """Evaluate one setting and, on a whole run, write its record."""
        rows, folds, elapsed, cached = evaluate_setting(title, units, rules, log, args.jobs, args.cache)
        if not args.quick:
            training = sorted({len(tr) for _, yu in units.values() for tr, _ in stratified_folds(yu)})
            path = write_setting_record(record, title, rules, folds, paired_by, elapsed, cached,
                                        {"subjects": subjects, "training_trials": training, **facts})
            log(f"\nRecord: {path}")
        return rows

    within = {s: (X[subj == s], y[subj == s]) for s in subjects}
    rules = [
        ("ts-lr", "TS+LR", "ts-lr", None),
        ("before", "starting defaults: d = 18, lr 1e-3, 10 % split, restore-best on F1", today, "f1"),
        ("recommended", "(a+b+c) recommended: batch 64, 300 epochs", RECOMMENDED, "loss"),
        ("b-small-split", "(b) validation only if >= 50 samples, else fixed budget", rule_b_small_val, "f1"),
        ("c-lr", "(c) lr 1e-2", rule_c_lr, "f1"),
        ("d-batch", "(d) batch ~ n/4", rule_d_batch, "f1"),
        ("b-loss", "(b) restore-best on validation loss", today, "loss"),
        ("abcd-300", "(a+b+c+d) combination, 300 epochs", combination(300), "loss"),
    ]
    if args.extra:
        rules += [("c-lr-100", "(c) lr 1e-2, 100 epochs", rule_c_lr_budget, "f1"),
                  ("abcd-100", "(a+b+c+d) combination, 100 epochs", combination(100), "loss"),
                  ("abd-lr-1e-3", "(a+b+d) combination, lr 1e-3, 300 epochs", combination(300, lr=1e-3), "loss")]
    if args.quick:
        rules = rules[:3]
    within_rows = setting("defaults-within", "Within-subject (36 training trials per fold, 64 channels)", within,
                          rules, "subject", channels=X.shape[1])

    if args.extra and not args.quick:
        pooled_rules = [
            ("ts-lr", "TS+LR", "ts-lr", None),
            ("before", "starting defaults (14-trial split, restore-best on F1)", today, "f1"),
            ("b-loss", "(b) restore-best on validation loss (14-trial split)", today, "loss"),
            ("b-no-split", "(b) no split: fixed 300-epoch budget, last weights",
             lambda n, c, k: {"validation_fraction": 0.0}, "f1"),
            ("recommended", "(a+b+c) recommended: batch 64, 300 epochs", RECOMMENDED, "loss"),
            ("abcd-300", "(a+b+c+d) combination, 300 epochs", combination(300), "loss"),
        ]
        setting("defaults-pooled", "Pooled subjects 1-4 (144 training trials per fold, 64 channels)",
                {"pooled": (X, y)}, pooled_rules, "fold", channels=X.shape[1])

        ch_names = channel_names(subjects[0])
        for names in (SENSORIMOTOR_CHANNELS, SENSORIMOTOR_3):
            idx = [ch_names.index(c) for c in names]
            sub = {s: (Xs[:, idx][:, :, idx], ys) for s, (Xs, ys) in within.items()}
            n = len(idx)
            variants = sorted({auto_hidden(n), max(1, round(0.28 * n)), n})
            hidden_rules = [("ts-lr", "TS+LR", "ts-lr", None)] + [
                (f"d-{d}", f"(a) d={d}" + (" = auto" if d == auto_hidden(n) else "")
                 + (" = round(0.28 n)" if d == max(1, round(0.28 * n)) else "") + (" = n" if d == n else ""),
                 with_hidden(d, RECOMMENDED), "loss")
                for d in variants
            ]
            setting(f"defaults-within-{n}-channels",
                    f"Within-subject, {n} sensorimotor channels ({', '.join(names)}); training rules of the "
                    "recommended set", sub, hidden_rules, "subject", channels=list(names))

    best = max(within_rows[1:], key=lambda r: r["auc"])
    log(f"\nBest within-subject rule: {best['name']} ({100 * best['auc']:.1f} ROC-AUC vs TS+LR "
        f"{100 * within_rows[0]['auc']:.1f}).")
    log(f"\nThis run: {time.perf_counter() - start:.0f} s wall, {COUNTS['fitted']} folds fitted, "
        f"{COUNTS['cached']} read from the cache ({args.cache}); all folds together took "
        f"{COUNTS['fit_seconds'] / 60:.0f} min of fit time (wall time per fold in its worker, on a machine "
        "shared with other jobs it grows with the load; load average now: "
        + ", ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs).")
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        print(f"written: {args.out}")
