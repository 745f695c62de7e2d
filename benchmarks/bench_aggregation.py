"""Speed of one server aggregation per rule: the robust rules beside ProjAvg / RLAvg.

One aggregation of ``--clients`` (8) clients, each with a ``St(64, 18)`` Stiefel weight and
the SPDnet head (4 × 171 + 4), float64, on one core (BLAS limited to one thread): median
CPU time of ``--reps`` calls, and its ratio to ProjAvg. Clients as in a round: ``W_i = R_W(δ ξ_i)``
for unit tangent ``ξ_i`` at the broadcast ``W`` (δ = 0.05), head moved by δ; the
"2 outliers" rows replace two clients by Haar points with heads 100 away. FLTrust is timed
as the engine runs it in a round (the rule and the record's agreement), with the server's
reference update as one more client-like model; the reference step itself (the server's
local training on its root set: ``--root`` trials of 64 channels, ``--local-epochs`` epochs of
minibatches of 64, SPDnet 64 → 18 as in Table I, one torch thread) is timed apart, through a
fit's engine. Target: each robust rule <= 20 ms besides the reference step.

    nice python -m benchmarks.bench_aggregation [--root 64 256]

Writes the record ``speed-aggregation`` (``--record``): the CPU time of every call of every
rule (honest round and 2 outliers), and of every reference step.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_name  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package, for its records
from benchmarks.records.speed import add_record_option, write_speed_record  # noqa: E402

import torch  # noqa: E402

from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier, __version__  # noqa: E402
from skfedspd.aggregation import FLTrust, GeometricMedian, Krum, TrimmedMean, projavg, rlavg  # noqa: E402
from skfedspd.client import Site  # noqa: E402
from skfedspd.datasets import make_spd_classification  # noqa: E402
from skfedspd.run import FederatedRun  # noqa: E402
from skfedspd.stiefel import random_stiefel, retract, tangent_project  # noqa: E402

TARGET_MS = 20.0
NAME = "bimaps.0.weight"
KINDS = {NAME: "stiefel", "head.weight": "euclidean", "head.bias": "euclidean"}


def round_of_clients(n_clients, p, k, n_outliers, seed=0, delta=0.05):
    """``(previous, clients, weights)`` of one round (see the module docstring)."""
    rng = np.random.default_rng(seed)
    W = random_stiefel(p, k, rng)
    head = rng.standard_normal((4, k * (k + 1) // 2))
    previous = {NAME: W, "head.weight": head, "head.bias": np.zeros(4)}
    clients = []
    for i in range(n_clients):
        if i < n_outliers:
            clients.append({NAME: random_stiefel(p, k, rng), "head.weight": head + 100,
                            "head.bias": np.full(4, -100.0)})
            continue
        xi = tangent_project(W, rng.standard_normal((p, k)))
        clients.append({NAME: retract(W, delta * xi / np.linalg.norm(xi)),
                        "head.weight": head + delta * rng.standard_normal(head.shape),
                        "head.bias": delta * rng.standard_normal(4)})
    weights = rng.integers(50, 200, n_clients).astype(float)
    return previous, clients, weights / weights.sum()


def fltrust_round(rule, reference):
    """FLTrust as the engine runs it in a round: the rule, then each client's agreement."""
    def run(clients, weights, previous, kinds):
        out, _ = rule.aggregate(clients, weights, previous, kinds, reference=reference)
        rule.agreement(clients, reference, previous, kinds)
        return out
    return run


def reference_step_ms(n_root, local_epochs, reps, n_channels=64, hidden=18):
    """CPU times (ms) of the server's reference update (``engine.reference``) of a fit with
    FLTrust on a root set of ``n_root`` synthetic trials, with two synthetic sites."""
    X, y = make_spd_classification(n_matrices=n_root + 40, n_channels=n_channels, n_classes=4, seed=0)
    local = SPDnetClassifier(hidden_dims=(hidden,), batch_size=64, lr=1e-3)
    fed = FederatedSPDnetClassifier(local, aggregation=FLTrust(X[:n_root], y[:n_root]), local_epochs=local_epochs,
                                    random_state=0)
    run = FederatedRun(fed, validation_fraction=0.0)
    sites = [Site(i, X[n_root + i::2], y[n_root + i::2], None, None, run.site_setup(), local) for i in range(2)]
    engine = run.start([site.reply for site in sites])
    rounds = iter(range(reps + 1))
    return cpu_times_ms(lambda: engine.reference(next(rounds)), reps)


def cpu_times_ms(function, reps):
    """CPU times (ms) of the calling thread, one per call after a warm-up (on a shared machine
    wall times add the waits)."""
    function()  # warm-up
    times = []
    for _ in range(reps):
        start = time.thread_time()
        function()
        times.append(1e3 * (time.thread_time() - start))
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--root", type=int, nargs="+", default=[64], help="root-set trials of the reference step")
    parser.add_argument("--local-epochs", type=int, default=2, help="local epochs of the reference step")
    parser.add_argument("--reference-reps", type=int, default=5)
    add_record_option(parser, "speed-aggregation")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    reference = round_of_clients(args.clients + 1, 64, 18, 0, seed=1)[1][0]
    keys = {"ProjAvg": "projavg", "RLAvg": "rlavg", "geomedian": "geomedian", "trimmedmean": "trimmedmean",
            "krum (f=2)": "krum", "FLTrust": "fltrust", "FLTrust per layer, accept, bounded": "fltrust-layer"}
    rules = {"ProjAvg": projavg, "RLAvg": rlavg, "geomedian": GeometricMedian(), "trimmedmean": TrimmedMean(),
             "krum (f=2)": Krum(n_faulty=2),
             # the reference: one more client-like model (the root set plays no part in the rule)
             "FLTrust": fltrust_round(FLTrust(np.zeros((1, 64, 64)), [0]), reference),
             "FLTrust per layer, accept, bounded": fltrust_round(
                 FLTrust(np.zeros((1, 64, 64)), [0], agreement_scope="layer", trust="accept", magnitude="bounded"),
                 reference)}
    command = "python -m benchmarks.bench_aggregation " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"command: {command.strip()}\nmachine: {cpu_name()}, 1 thread, load average {os.getloadavg()[0]:.1f}; "
          f"skfedspd {__version__}, numpy {np.__version__}\n"
          f"{args.clients} clients x St(64, 18) + head, float64, median CPU time of {args.reps} calls\n")
    print("| clients | " + " | ".join(rules) + " |")
    print("| --- |" + " --- |" * len(rules))
    worst = 0.0
    recorded, labels = {}, {}
    with threadpool_limits(1):
        for n_outliers in (0, 2):
            previous, clients, weights = round_of_clients(args.clients, 64, 18, n_outliers)
            calls = {name: cpu_times_ms(lambda rule=rule: rule(clients, weights, previous, KINDS), args.reps)
                     for name, rule in rules.items()}
            times = {name: statistics.median(t) for name, t in calls.items()}
            worst = max([worst] + [t for name, t in times.items() if name not in ("ProjAvg", "RLAvg")])
            label = "honest" if n_outliers == 0 else f"{n_outliers} outliers"
            for name, t in calls.items():
                recorded[f"{keys[name]}/{label.replace(' ', '-')}"] = t
                labels[f"{keys[name]}/{label.replace(' ', '-')}"] = f"{name}, {label}"
            print(f"| {label} | " + " | ".join(f"{t:.2f} ms ({t / times['ProjAvg']:.0f}x)" for t in times.values())
                  + " |")
    verdict = "reached" if worst <= TARGET_MS else "not reached"
    print(f"\nslowest robust rule: {worst:.2f} ms (target <= {TARGET_MS:g} ms: {verdict})")
    torch.set_num_threads(1)
    for n_root in args.root:
        with threadpool_limits(1):
            steps = reference_step_ms(n_root, args.local_epochs, args.reference_reps)
        print(f"FLTrust's reference step (the server's training, besides the rule): {statistics.median(steps):.0f} ms "
              f"for {n_root} root trials x {args.local_epochs} local epochs, SPDnet 64 -> 18")
        recorded[f"reference-step/{n_root}"] = steps
        labels[f"reference-step/{n_root}"] = f"FLTrust's reference step, {n_root} root trials"
    write_speed_record(args.record, title="One server aggregation per rule, and FLTrust's reference step",
                       times=recorded, labels=labels, reference="projavg/honest", started=started,
                       description="CPU milliseconds per call",
                       facts={"target": f"≤ {TARGET_MS:g} ms", "clients": args.clients,
                              "local_epochs": args.local_epochs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
