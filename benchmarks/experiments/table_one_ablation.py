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

``--variants`` runs some of them (default: all).

The protocol's own cells are read from the main experiment's cache (``--main-out``) and
fitted there when missing, so the two commands share their records.

    python -m benchmarks.experiments table-one-ablation --seeds 3 --jobs 2
    python -m benchmarks.experiments table-one-ablation --seeds 10 --jobs 2 --variants protocol \
        "protocol + server momentum" "kept client Adam" "server momentum, kept client Adam" \
        --main-out results/ablation-8/protocol --out results/ablation-8
"""

import dataclasses
import logging
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from .._machine import machine_line
from .console import console_and_log
from .table_one_cells import Cell
from .table_one_protocols import PROFILES, load_offline_physionet
from .table_one_report import fmt
from .table_one_runner import run_table

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
    parser.add_argument("--out", type=Path, default=Path("results/ablation"))
    parser.add_argument("--main-out", type=Path, default=Path("results/experiment-full/PhysionetMI"),
                        help="cache of the main experiment's protocol cells (shared)")


def run(args):
    log_file = args.out / "ablation.log"
    with console_and_log(log_file):
        command = "python -m benchmarks.experiments " + shlex.join(sys.argv[1:])
        log.info(f"command: {command.strip()}\nmachine: {machine_line()}\nlibrary output: {log_file}")
        loaded = load_offline_physionet(log.info)
        if loaded is None:
            return 1
        protocol, X_raw, covariances, y, subjects = loaded
        data = (covariances, X_raw, y, subjects)
        budget = dataclasses.replace(PROFILES["full"], rounds=args.rounds, eegnet_rounds=args.rounds,
                                     seeds=args.seeds, eegnet_seeds=args.eegnet_seeds)
        start = time.perf_counter()
        rows = []
        for name in args.variants:
            cells, params = VARIANTS[name]
            out = args.main_out if params is None else args.out / folder(name)
            results = run_table(protocol, data, budget, out, cells, jobs=args.jobs, params=params,
                                log_file=log_file)
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
        lines += ["", f"Command: `{command.strip()}` — {(time.perf_counter() - start) / 60:.1f} min; {machine_line()}; "
                      f"{args.rounds} rounds."]
        text = "\n".join(lines)
        log.info("\n" + text)
        (args.out / "report.md").write_text(text + "\n")
    return 0


def params_free(name):
    return VARIANTS[name][1] is None

