"""Per-round overhead of secure aggregation (Flower SecAgg+) in the in-process simulation.

For each number of sites, two fits of the same configuration and ``random_state`` by
``FederatedSPDnetClassifier(backend=FlowerBackend())``: plain, and
``backend=FlowerBackend(secure_aggregation=True)``
(two SecAgg+ runs per round: the weighted train sums, then the validation totals; four
message stages each). Printed side by side: the per-round wall time (median over rounds
of ``history_[*]["wall_time"]``: selection → training → aggregation → validation), the
overhead (secure − plain) and the ratio, and the largest entry-wise difference between the
two final global models. The PhysionetMI model sizes by default (64 channels, BiMap to 18,
4 classes). ``torch.set_num_threads(1)``; the first fit of a process (imports, warm-up)
is not measured.

Usage::

    FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 .venv/bin/python benchmarks/bench_secure_aggregation.py
    ... --sites 3,5,10 --rounds 5

Writes the record ``speed-secure-aggregation`` (``--record``): each fit's round wall times
(units: rounds), plain and secure, for every number of sites.
"""

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from _machine import cpu_name  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package, for its records
from benchmarks.records.speed import add_record_option, write_speed_record  # noqa: E402
from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier  # noqa: E402
from skfedspd.backends import FlowerBackend  # noqa: E402
from skfedspd.datasets import make_spd_classification  # noqa: E402


def fit(args, n_sites, secure, X, y):
    fed = FederatedSPDnetClassifier(
        SPDnetClassifier(hidden_dims=(args.hidden,), batch_size=16, lr=0.02), n_rounds=args.rounds,
        local_epochs=args.local_epochs, aggregation=args.aggregation, random_state=0,
        backend=FlowerBackend(secure_aggregation=secure))
    groups = np.arange(len(y)) % n_sites  # every site holds every class
    start = time.perf_counter()
    fed.fit(X, y, groups=groups)
    return fed, time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sites", default="3,5,10", help="comma-separated numbers of sites")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--samples-per-site", type=int, default=45)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--hidden", type=int, default=18)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--aggregation", default="projavg", choices=["projavg", "rlavg"])
    add_record_option(p, "speed-secure-aggregation")
    args = p.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(1)
    sites = [int(s) for s in args.sites.split(",")]
    print(f"command: {shlex.join([os.path.basename(sys.executable)] + sys.argv)}")
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"torch {torch.__version__}")
    print(f"model: SPDnet {args.channels}x{args.channels} -> BiMap {args.hidden} -> head {args.classes} classes; "
          f"{args.rounds} rounds x {args.local_epochs} local epoch(s), {args.samples_per_site} samples per site, "
          f"{args.aggregation}\n")
    X0, y0 = make_spd_classification(3 * 6, args.channels, args.classes, seed=1)
    fit(args, 3, False, X0, y0)  # warm-up (imports, first simulation), not measured
    rows, times, labels, facts = [], {}, {}, {}
    for n_sites in sites:
        X, y = make_spd_classification(n_sites * args.samples_per_site, args.channels, args.classes, seed=0)
        plain, plain_fit = fit(args, n_sites, False, X, y)
        secure, secure_fit = fit(args, n_sites, True, X, y)
        plain_round = float(np.median([r["wall_time"] for r in plain.history_]))
        secure_round = float(np.median([r["wall_time"] for r in secure.history_]))
        diff = max(float(np.abs(plain.engine_.global_params[n] - secure.engine_.global_params[n]).max())
                   for n in plain.engine_.global_params)
        rows.append((n_sites, plain_round, secure_round, plain_fit, secure_fit, diff))
        for kind, fed in (("plain", plain), ("secure", secure)):
            times[f"{kind}/{n_sites}"] = [r["wall_time"] for r in fed.history_]
            labels[f"{kind}/{n_sites}"] = f"{kind}, {n_sites} sites"
        facts[f"max_difference_{n_sites}"] = f"{diff:.1e}"
    print("| sites | plain per round | secure per round | overhead per round | ratio | fit plain / secure "
          "| max abs Δ global model |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n_sites, plain_round, secure_round, plain_fit, secure_fit, diff in rows:
        print(f"| {n_sites} | {plain_round:.3f} s | {secure_round:.3f} s | {secure_round - plain_round:+.3f} s "
              f"| {secure_round / plain_round:.2f}x | {plain_fit:.1f} s / {secure_fit:.1f} s | {diff:.1e} |")
    write_speed_record(args.record, title="Secure aggregation (SecAgg+) against plain rounds, in-process simulation",
                       times=times, labels=labels, reference=f"plain/{sites[0]}", started=started, metric="s",
                       description="seconds per round", facts=facts)


if __name__ == "__main__":
    main()
