"""What each part of the centralized learner buys on the paper's 4-class task, against TS+LR.

PhysionetMI, the 16 offline subjects, 4 classes, the main job's client splits (clients of 2
subjects, each client's own stratified 85/15 split; one split per seed). Every row is
``SPDnetClassifier`` as shipped (``batchnorm="auto"``: given the subjects as ``groups``,
per-subject domain batch norm; each test subject predicted in its own call) with one
parameter changed, and every row is paired seed by seed with pyRiemann's TS+LR on the same
split. The rows: the shipped learner, without batch norm, with one shared SPD batch norm,
a wider or a deeper BiMap, the learning rate a factor 3 either way, a smaller minibatch.

    python -m benchmarks.experiments learner-ablation --seeds 8 --jobs 2

Every (row, seed) fit is cached as JSON under ``--out`` (a re-run fits only what is missing
or was fitted with another configuration). The run writes the record ``--record`` (default
``learner-ablation``, in ``benchmarks/records/data``), paired by seed with TS+LR.
"""

import dataclasses
import logging
import time
from pathlib import Path

from .._machine import machine_line
from ..records.paired import paired_difference, t_critical
from ..records.store import write_record
from . import report
from .console import console_and_log
from .table_one_cells import Cell
from .table_one_protocols import PROFILES, logged_offline_study
from .table_one_report import SEED_METRICS, seed_scores
from .table_one_runner import record_path, run_table

log = logging.getLogger(__name__)

TS_LR, SPDNET = Cell("centralized", "ts-lr"), Cell("centralized", "spdnet-domain")
# label -> (cell, SPDnetClassifier parameters over the shipped ones; None: the cell as it is)
ROWS = {
    "TS+LR": (TS_LR, None),
    "SPDnetClassifier() as shipped": (SPDNET, {"batchnorm": "auto"}),
    "no batch norm": (SPDNET, {"batchnorm": None}),
    "one shared SPD batch norm": (SPDNET, {"batchnorm": "spd"}),
    "BiMap 64 to 32": (SPDNET, {"batchnorm": "auto", "hidden_dims": (32,)}),
    "BiMap 64 to 32 to 16": (SPDNET, {"batchnorm": "auto", "hidden_dims": (32, 16)}),
    "lr 3e-3": (SPDNET, {"batchnorm": "auto", "lr": 3e-3}),
    "lr 3e-2": (SPDNET, {"batchnorm": "auto", "lr": 3e-2}),
    "batch size 32": (SPDNET, {"batchnorm": "auto", "batch_size": 32}),
}


def add_row_arguments(parser, rows, name):
    """The arguments of an experiment of seeded ``rows`` paired with TS+LR: ``--seeds``,
    ``--jobs``, ``--rows``, ``--out`` (``results/NAME``) and ``--record`` (``NAME``)."""
    parser.add_argument("--seeds", type=int, default=8, help="splits (seeds) per row (default 8)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--rows", nargs="+", choices=list(rows), default=list(rows), metavar="NAME",
                        help="the rows to run (default: all; TS+LR is always run): " + "; ".join(rows).replace("%", "%%"))
    parser.add_argument("--out", type=Path, default=Path(f"results/{name}"))
    parser.add_argument("--record", default=name, help="the record written (benchmarks/records/data)")


def add_arguments(parser):
    add_row_arguments(parser, ROWS, "learner-ablation")


def run(args):
    log_file = args.out / "ablation.log"
    with console_and_log(log_file):
        command, loaded = logged_offline_study(log, log_file)
        if loaded is None:
            return 1
        protocol, X_raw, covariances, y, subjects = loaded
        data = (covariances, X_raw, y, subjects)
        budget = dataclasses.replace(PROFILES["full"], seeds=args.seeds)
        start = time.perf_counter()
        names = ["TS+LR"] + [name for name in args.rows if name != "TS+LR"]
        results, cached = {}, []
        for name in names:
            cell, params = ROWS[name]
            out = args.out / report.row_key(name)
            before = {p: p.stat().st_mtime_ns for p in out.glob("*.json")}
            runs = run_table(protocol, data, budget, out, (cell,), jobs=args.jobs,
                             params=None if params is None else {"local": params}, log_file=log_file)[cell]
            # A run read from the cache left its file untouched (a refitted one rewrote it).
            cached += [r for r in runs if before.get(path := record_path(out, cell, r["seed"])) == path.stat().st_mtime_ns]
            results[name] = runs
        elapsed = time.perf_counter() - start
        rows = {report.row_key(name): {"label": name, "scores": seed_scores(runs)} for name, runs in results.items()}
        path = write_record(
            args.record, title="What each part of SPDnetClassifier buys on PhysionetMI, 4 classes, against TS+LR",
            command=command, rows=rows, metrics=SEED_METRICS, reference=report.row_key("TS+LR"),
            paired_by="seed", wall_seconds=elapsed,
            facts={"seeds": args.seeds, "subjects": list(protocol.subjects), "dataset": protocol.name,
                   "runs_cached_at_start": len(cached),
                   "fit_minutes": round(sum(r["fit_seconds"] for rs in results.values() for r in rs) / 60, 1)})
        log.info("\n" + summary(results, command, elapsed) + f"\n\nRecord: {path}")
    return 0


def summary(results, command, elapsed):
    """The rows' macro-F1 and their paired difference to TS+LR, with the t critical value."""
    reference = {r["seed"]: 100 * r["f1"] for r in results["TS+LR"]}
    lines = ["| row | test macro-F1 (%) | − TS+LR, paired by seed | t × SE |", "| --- | --- | --- | --- |"]
    for name, runs in results.items():
        mine = {r["seed"]: 100 * r["f1"] for r in runs}
        mean = sum(mine.values()) / len(mine)
        if name == "TS+LR":
            lines.append(f"| {name} | {mean:.1f} | reference | |")
            continue
        d = paired_difference(mine, reference)
        lines.append(f"| {name} | {mean:.1f} | {d.mean:+.1f} ± {d.se:.1f} | {t_critical(d.n) * d.se:.1f} |")
    return "\n".join(lines + ["", f"Command: `{command}` — {elapsed / 60:.1f} min; {machine_line()}."])
