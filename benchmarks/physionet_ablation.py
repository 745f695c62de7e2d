"""What moves the PhysionetMI figures of Table I: local budget and EEGNet input scaling.

Each variant changes one thing of the paper's protocol (``physionet_experiment.py``) and
re-runs the cells it affects on the same client splits and seeds:

* FedSPDnet Full (ProjAvg) with more local computation per round: E = 8 local epochs
  instead of 2, or a local Adam learning rate of 4e-3 instead of 1e-3 (what closes the
  gap to centralized SPDnet, beyond the paper's budget); FedSPDnet Half with the
  learning-rate patience counted in plain rounds (20) instead of rounds of full
  participation (40 at M = N/2);
* EEGNet, centralized and FedAvg Full, with each channel z-scored on its own
  (``standardize="channel"``) instead of the whole trial (the default, ``"trial"``).

The protocol's own cells are read from the main experiment's cache (``--main-out``) and
fitted there when missing, so the two scripts share their records.

    python benchmarks/physionet_ablation.py --seeds 3 --jobs 2
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import physionet_experiment as experiment
from skfedspd.datasets import configure_offline, find_physionet_root, sample_covariance

# name -> (keys, estimator parameter overrides; None: the protocol itself)
VARIANTS = {
    "protocol": (["centralized/spdnet", "full/spdnet-projavg", "half/spdnet-projavg"], None),
    "E=8 local epochs": (["full/spdnet-projavg"], {"federated": {"local_epochs": 8}}),
    "local lr 4e-3": (["full/spdnet-projavg"], {"local": {"lr": 4e-3}}),
    "Half, LR patience 20 rounds": (["half/spdnet-projavg"], {"federated": {"lr_patience": 20}}),
    "protocol (EEGNet)": (["centralized/eegnet", "full/eegnet"], None),
    "EEGNet standardize='channel'": (["centralized/eegnet", "full/eegnet"], {"local": {"standardize": "channel"}}),
}


def folder(name):
    return name.replace(" ", "_").replace("=", "").replace("'", "").replace("(", "").replace(")", "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="SPDnet seeds (default 3)")
    parser.add_argument("--eegnet-seeds", type=int, default=2, help="EEGNet seeds (default 2)")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/ablation"))
    parser.add_argument("--main-out", type=Path, default=Path("results/experiment-full/PhysionetMI"),
                        help="cache of the main experiment's protocol cells (shared)")
    args = parser.parse_args(argv)
    command = "python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:]))
    print(f"command: {command}\nmachine: {experiment.machine()}", flush=True)
    root = find_physionet_root()
    if root is None:
        print("PhysioNet EEG files not found (../shared/data or $SKFEDSPD_DATA): nothing to run.")
        return 1
    configure_offline(root)

    protocol = experiment.PROTOCOLS["PhysionetMI"]
    X_raw, y, subjects = protocol.load()
    data = (sample_covariance(X_raw), X_raw, y, subjects)
    budget = dict(experiment.PROFILES["full"], rounds=args.rounds, eegnet_rounds=args.rounds,
                  seeds=args.seeds, eegnet_seeds=args.eegnet_seeds)
    start = time.perf_counter()
    rows = []
    for name, (keys, params) in VARIANTS.items():
        out = args.main_out if params is None else args.out / folder(name)
        results = experiment.run_table(protocol, data, budget, out, only=keys, jobs=args.jobs, params=params)
        rows += [(name, key, results[key]) for key in keys]

    # Each model's protocol centralized score, the reference of the ratios.
    centralized = {key.split("/")[1]: np.mean([r["f1"] for r in records]) for name, key, records in rows
                   if name.startswith("protocol") and key.startswith("centralized")}
    lines = ["| variant | cell | test macro-F1 (%) | seeds | / protocol centralized | LR halvings per seed |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, key, records in rows:
        reference = centralized.get(key.split("/")[1].split("-")[0])
        ratio = f"{np.mean([r['f1'] for r in records]) / reference:.1%}" if reference else "–"
        halvings = ", ".join(str(int(np.sum(np.diff(r["lr"]) < 0))) if r.get("lr") else "–" for r in records)
        lines.append(f"| {name} | {key} | {experiment.fmt(records)} | {len(records)} | {ratio} | {halvings} |")
    lines += ["", f"Command: `{command}` — {(time.perf_counter() - start) / 60:.1f} min; {experiment.machine()}; "
                  f"{args.rounds} rounds."]
    text = "\n".join(lines)
    print("\n" + text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
