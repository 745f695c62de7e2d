"""What moves the PhysionetMI figures of Table I: local budget and EEGNet input scaling.

Each variant changes one thing of the paper's protocol (``table-one``) and
re-runs the cells it affects on the same client splits and seeds:

* FedSPDnet Full (ProjAvg) with more local computation per round: E = 8 local epochs
  instead of 2, or a local Adam learning rate of 4e-3 instead of 1e-3 (what closes the
  gap to centralized SPDnet, beyond the paper's budget); FedSPDnet Half with the
  learning-rate patience counted in plain rounds (20) instead of rounds of full
  participation (40 at M = N/2);
* EEGNet, centralized and FedAvg Full, with each channel z-scored on its own
  (``standardize="channel"``) instead of the whole trial (the default, ``"trial"``);
* FedSPDnet Full and Half, with and without server momentum, with clients that keep their
  Adam state between rounds (``client_optimizer_state="keep"``, the package's default)
  instead of the paper's fresh Adam every round (server momentum was recommended with the
  paper's clients before it was measured with kept client state).

``--variants`` runs some of them (default: all), ``--settings`` some of their cells (the
centralized, Full or Half ones). The run writes the record ``--record`` (default
``tableone-ablation``, in ``benchmarks/records/data``): every (variant, cell) row's test
scores per seed, compared with the protocol's centralized SPDnet seed by seed (the first row
when it is not among them), for the docs to compute their figures from.

The protocol's own cells are read from the main experiment's cache (``--main-out``) and
fitted there when missing, so the two commands share their records.

    python -m benchmarks.experiments table-one-ablation --seeds 3 --jobs 2
    python -m benchmarks.experiments table-one-ablation --seeds 10 --jobs 2 --variants protocol \
        "protocol + server momentum" "kept client Adam" "server momentum, kept client Adam" \
        --main-out results/ablation-8/protocol --out results/ablation-8 --record tableone-ablation-client-state
"""

import dataclasses
import logging
import time
from pathlib import Path

import numpy as np

from .._machine import machine_line
from .console import console_and_log
from .table_one_cells import Cell
from .table_one_protocols import PROFILES, logged_offline_study
from . import report
from ..records.store import write_record
from .table_one_report import SEED_METRICS, fmt, seed_scores
from .table_one_runner import record_path, run_table

log = logging.getLogger(__name__)

CENTRALIZED_SPDNET, CENTRALIZED_EEGNET = Cell("centralized", "spdnet"), Cell("centralized", "eegnet")
FULL, HALF = Cell("full", "spdnet", "projavg"), Cell("half", "spdnet", "projavg")
FULL_EEGNET = Cell("full", "eegnet", "projavg")
FULL_SM, HALF_SM = Cell("full+sm", "spdnet", "projavg"), Cell("half+sm", "spdnet", "projavg")
KEEP = {"federated": {"client_optimizer_state": "keep"}}
# name -> (cells, estimator parameter overrides; None: the protocol itself)
VARIANTS = {
    "protocol": ((CENTRALIZED_SPDNET, FULL, HALF), None),
    "E=8 local epochs": ((FULL,), {"federated": {"local_epochs": 8}}),
    "local lr 4e-3": ((FULL,), {"local": {"lr": 4e-3}}),
    "Half, LR patience 20 rounds": ((HALF,), {"federated": {"schedule__lr_patience": 20}}),
    "protocol (EEGNet)": ((CENTRALIZED_EEGNET, FULL_EEGNET), None),
    "EEGNet standardize='channel'": ((CENTRALIZED_EEGNET, FULL_EEGNET), {"local": {"standardize": "channel"}}),
    "protocol + server momentum": ((FULL_SM, HALF_SM), None),
    "kept client Adam": ((FULL, HALF), KEEP),
    "server momentum, kept client Adam": ((FULL_SM, HALF_SM), KEEP),
}


def folder(name):
    return name.replace(" ", "_").replace("=", "").replace("'", "").replace("(", "").replace(")", "")


def add_arguments(parser):
    parser.add_argument("--seeds", type=int, default=3, help="SPDnet seeds (default 3)")
    parser.add_argument("--eegnet-seeds", type=int, default=2, help="EEGNet seeds (default 2)")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS), metavar="NAME",
                        help="the variants to run (default: all): " + "; ".join(VARIANTS))
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS),
                        help="the cells to run of each variant, by setting (default: all)")
    parser.add_argument("--out", type=Path, default=Path("results/ablation"))
    parser.add_argument("--record", default="tableone-ablation", help="the record written (benchmarks/records/data)")
    parser.add_argument("--main-out", type=Path, default=Path("results/experiment-full/PhysionetMI"),
                        help="cache of the main experiment's protocol cells (shared)")


def run(args):
    log_file = args.out / "ablation.log"
    with console_and_log(log_file):
        command, loaded = logged_offline_study(log, log_file)
        if loaded is None:
            return 1
        protocol, X_raw, covariances, y, subjects = loaded
        data = (covariances, X_raw, y, subjects)
        budget = dataclasses.replace(PROFILES["full"], rounds=args.rounds, eegnet_rounds=args.rounds,
                                     seeds=args.seeds, eegnet_seeds=args.eegnet_seeds)
        start = time.perf_counter()
        rows, cached = [], []
        for name in args.variants:
            cells, params = variant_cells(name, args.settings)
            if not cells:
                continue
            out = args.main_out if params is None else args.out / folder(name)
            before = {p: p.stat().st_mtime_ns for p in out.glob("*.json")}
            results = run_table(protocol, data, budget, out, cells, jobs=args.jobs, params=params,
                                log_file=log_file)
            # A run read from the cache left its file untouched (a refitted one rewrote it).
            cached += [r for cell in cells for r in results.get(cell, ())
                       if before.get(path := record_path(out, cell, r["seed"])) == path.stat().st_mtime_ns]
            rows += [(name, cell, results[cell]) for cell in cells]

        # Each model's protocol centralized score, the reference of the ratios.
        centralized = {cell.model: np.mean([r["f1"] for r in records]) for name, cell, records in rows
                       if params_free(name) and not cell.federated}
        lines = ["| variant | cell | test macro-F1 (%) | seeds | / protocol centralized | LR halvings per seed |",
                 "| --- | --- | --- | --- | --- | --- |"]
        for name, cell, records in rows:
            reference = centralized.get(cell.model)
            ratio = f"{np.mean([r['f1'] for r in records]) / reference:.1%}" if reference else "–"
            halvings = ", ".join(str(int(np.sum(np.diff(r["lr"]) < 0))) if r.get("lr") else "–" for r in records)
            lines.append(f"| {name} | {cell.key} | {fmt(records)} | {len(records)} | {ratio} | {halvings} |")
        lines += ["", f"Command: `{command}` — {(time.perf_counter() - start) / 60:.1f} min; {machine_line()}; "
                      f"{args.rounds} rounds."]
        path = write_ablation_record(args.record, rows, command, time.perf_counter() - start, cached,
                                     facts={"seeds": args.seeds, "rounds": args.rounds,
                                            "subjects": list(protocol.subjects or ()),
                                            "clients": len(protocol.subjects or ()) // 2})
        lines += ["", f"Record: {path}"]
        text = "\n".join(lines)
        log.info("\n" + text)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(text + "\n")
    return 0


#: The settings a variant's cells are chosen by (``--settings``).
SETTINGS = ("centralized", "full", "half")


def variant_cells(name, settings=SETTINGS):
    """``(cells, parameters)`` of the variant ``name``, its cells limited to ``settings``
    (a server-momentum cell counts as its participation's setting)."""
    cells, params = VARIANTS[name]
    return tuple(c for c in cells if c.setting.split("+")[0] in settings), params


def row_key(name, cell):
    """``"kept-client-adam/full/spdnet-projavg"``: a record's row of ``cell`` in the variant ``name``."""
    return f"{report.row_key(name)}/{cell.key}"


def write_ablation_record(name, rows, command, elapsed, cached, facts):
    """Write the record ``name`` of the ablation's ``rows`` (``[(variant, cell, run records)]``),
    paired by seed with the protocol's centralized SPDnet (the first row when it did not run).

    ``cached``: the run records read from a cache. The record's time is the run's wall time
    (``elapsed``); ``fit_minutes`` sums the fit time of every run, cached ones included."""
    keys = {row_key(variant, cell): (variant, cell, runs) for variant, cell, runs in rows}
    reference = row_key("protocol", CENTRALIZED_SPDNET)
    runs = [r for _, _, rs in keys.values() for r in rs]
    return write_record(
        name, title="What moves Table I (PhysionetMI): ablation of the protocol, per seed", command=command,
        rows={key: {"label": f"{variant}: {cell.label}", "scores": seed_scores(rs)}
              for key, (variant, cell, rs) in keys.items()},
        metrics=SEED_METRICS, reference=reference if reference in keys else next(iter(keys)), paired_by="seed",
        wall_seconds=elapsed,
        facts={**facts, "runs": len(runs), "runs_cached_at_start": len(cached),
               "variants": list(dict.fromkeys(v for v, _, _ in rows)),
               "fit_minutes": round(sum(r["fit_seconds"] for r in runs) / 60, 1),
               "cpu_minutes": round(sum(r.get("cpu_seconds", 0.0) for r in runs) / 60, 1)})


def params_free(name):
    return VARIANTS[name][1] is None

