"""Benchmark of the federated layer (``FederatedSPDnetClassifier`` and the aggregation rules).

Four figures, each printed with its ratio and its target side by side:

* **P2** federated overhead — one federated fit of ``T`` rounds × ``E`` local epochs (every
  client every round, per-round validation of the global model on every client's validation
  part) against one centralized ``SPDnetClassifier`` fit of ``T·E`` epochs (patience so large
  that it never stops early) on the same synthetic SPD data. Same work per epoch: every
  training matrix is seen once per (local) epoch in both, but each client's last minibatch is
  partial, so the federated fit takes more optimizer steps (printed). Also the server-side
  share of the fit (aggregation + global validation). Target: wall-time ratio
  federated / centralized ≤ 1.15 (the CPU-time ratio is printed too: it is what machine load
  disturbs least).
* **P3** client parallelism — the same federated fit with ``backend=LocalBackend(n_jobs=2)``
  (this process and one joblib worker, each training half of the clients) against
  ``LocalBackend(n_jobs=1)``, *after* a warm-up
  that starts the joblib (loky) workers and makes each import the package (they are reused by
  every later ``Parallel`` call with the same settings). Also checks that both give
  bit-identical models, splits the CPU time between the main process and the workers (psutil),
  and measures the machine's *ceiling* at that moment: the same number of equal pure-compute
  torch jobs, serially and on the same two workers (other processes on the cores lower it).
  Also the speed-up per round, set-up excluded: fits of ``T`` and ``T // 5`` rounds, per
  round = the difference over the rounds between them (the fit's serial set-up, input
  checks and client splits, cancels out). Target: speed-up ≥ 1.6× or ≥ 90 % of the ceiling.
* **P4** aggregation cost — one server aggregation of ``N`` clients' ``(64×18)`` Stiefel
  weights plus a small Euclidean head: ProjAvg and RLAvg (median of many repetitions, ms)
  against the iterative reference ``skfedspd.aggregation.karcher`` (the weighted Karcher
  mean under the canonical metric: Riemannian gradient descent from ProjAvg with Zimmermann's
  Stiefel logarithm, to a gradient norm ``≤ 1e-11``; its number of gradient steps is
  printed), for clients spread around one Stiefel point at a few spreads δ; also the
  Frobenius distance of ProjAvg / RLAvg to the reference. Target: ≤ 1 ms and ≥ 100× cheaper.
  (RLAvg iterated at its own output, the "R-barycenter", is no reference: its fixed point is
  ProjAvg — see the ``skfedspd.aggregation`` module docstring.)
* **P6** memory at scale — ``1000`` simulated clients × ``10`` rounds on small matrices, in a
  fresh child interpreter so the peak RSS (``VmHWM``; ``ru_maxrss`` would include this
  process's RSS at the fork) is that of the federated fit alone (plus the imports, reported
  separately). Target: peak RSS ≤ 2 GB.

Timing rules: ``torch.set_num_threads(--torch-threads)`` (default 1: the ``n_jobs=1`` path
leaves torch's thread count as it finds it while ``n_jobs>1`` pins each worker to one thread,
so one thread everywhere compares like with like; on a loaded 2-core machine two intra-op
threads can also be 10–50× slower than one because of spin-waiting), a warm-up call of every
timed function, then ``--reps`` repetitions whose order alternates, and the median.

Usage::

    .venv/bin/python benchmarks/bench_federated.py                 # all parts, < 5 min on 2 cores
    .venv/bin/python benchmarks/bench_federated.py --parts P2,P3 --reps 5
    .venv/bin/python benchmarks/bench_federated.py --parts P6 --p6-clients 2000

Each part writes its record (``--record PREFIX``, default ``speed-federated``):
``PREFIX-overhead`` (P2), ``PREFIX-parallel`` (P3), ``PREFIX-aggregation`` (P4),
``PREFIX-memory`` (P6).
"""

import argparse
import json
import os
import pickle
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
import warnings

import joblib
import numpy as np
import sklearn
import torch

import skfedspd.local as local_backend
from _machine import cpu_name

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the benchmarks package
from benchmarks.records.speed import add_record_option, write_speed_record  # noqa: E402
from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.backends import LocalBackend
from skfedspd.clients import ClientPartition
from skfedspd.engine import FederatedEngine
from skfedspd.datasets import make_spd_classification
from skfedspd.aggregation import client_weights, karcher, projavg, rlavg, weighted_sum
from skfedspd.stiefel import orthonormality_error, polar, random_stiefel, retract, stiefel_log, tangent_project
from skfedspd.training import EpochSchedule, RoundSchedule

PARTS = ("P2", "P3", "P4", "P6")
BIG = 10**9  # "never": patience / lr_patience that no benchmark reaches


# ---------------------------------------------------------------------------------------------
# Data and machine
# ---------------------------------------------------------------------------------------------




def machine_info():
    cpu = cpu_name()
    try:
        load = "  load average (1/5/15 min): " + " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        load = ""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = "n/a"
    return "\n".join([
        f"CPU          : {cpu}",
        f"cores        : {os.cpu_count()} logical (affinity: {affinity}){load}",
        f"python       : {platform.python_version()}  ({platform.platform()})",
        f"torch        : {torch.__version__}  (intra-op threads: {torch.get_num_threads()}, "
        f"inter-op threads: {torch.get_num_interop_threads()})",
        f"numpy        : {np.__version__}   scikit-learn: {sklearn.__version__}   joblib: {joblib.__version__}",
    ])


def median_ms(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times), times


def verdict(ok):
    return "REACHED" if ok else "NOT REACHED"


# ---------------------------------------------------------------------------------------------
# P2 / P3: federated fit timing
# ---------------------------------------------------------------------------------------------


class _TimedFederated(FederatedSPDnetClassifier):
    """The federated estimator, with the server-side time of its fits split out.

    ``server_time_`` covers the engine's round steps (reply checks, aggregation, schedule,
    records: ``FederatedEngine.aggregate`` and ``finish_round``) plus the evaluation of the
    new global model on every client's validation part; ``eval_time_`` is the evaluation
    alone (``skfedspd.local.evaluate``, called once per client per round).
    """

    def fit(self, X, y, **kwargs):
        times = {"server": 0.0, "eval": 0.0}

        def timed(function, *keys):
            def wrapper(*args, **kw):
                t0 = time.perf_counter()
                try:
                    return function(*args, **kw)
                finally:
                    for key in keys:
                        times[key] += time.perf_counter() - t0
            return wrapper

        patches = [(FederatedEngine, "aggregate", ("server",)), (FederatedEngine, "finish_round", ("server",)),
                   (local_backend, "evaluate", ("server", "eval"))]
        originals = [getattr(owner, name) for owner, name, _ in patches]
        try:
            for owner, name, keys in patches:
                setattr(owner, name, timed(getattr(owner, name), *keys))
            super().fit(X, y, **kwargs)
        finally:
            for (owner, name, _), original in zip(patches, originals):
                setattr(owner, name, original)
        self.server_time_, self.eval_time_ = times["server"], times["eval"]
        return self


def _local_estimator(args):
    return SPDnetClassifier(hidden_dims=(args.hidden,), batch_size=args.batch_size, lr=1e-3,
                            schedule=EpochSchedule(patience=BIG, lr_patience=BIG))


def _federated(args, n_jobs, n_rounds, n_clients, timed=True):
    cls = _TimedFederated if timed else FederatedSPDnetClassifier
    return cls(_local_estimator(args), aggregation=args.aggregation, n_rounds=n_rounds,
               local_epochs=args.epochs, clients=ClientPartition(n_clients=n_clients, partition="stratified"),
               schedule=RoundSchedule(lr_patience=BIG), validation_fraction=args.validation_fraction,
               backend=LocalBackend(n_jobs=n_jobs), random_state=0)


def _centralized(args, n_epochs):
    return _local_estimator(args).set_params(max_epochs=n_epochs, validation_fraction=args.validation_fraction,
                                             random_state=0)


def _timed_fit(make, X, y, cpu=None):
    """Wall time of ``make().fit(X, y)``; this process's CPU time is appended to ``cpu``."""
    est = make()
    c0, t0 = time.process_time(), time.perf_counter()
    est.fit(X, y)
    wall = time.perf_counter() - t0
    if cpu is not None:
        cpu.append(time.process_time() - c0)
    return wall, est


def _compare_models(a, b):
    """``(identical, description)`` of two federated fits: final global parameters and the
    per-round history (train/validation loss, validation F1)."""
    pa, pb = a.global_estimator_.module_.get_parameters(), b.global_estimator_.module_.get_parameters()
    max_diff = max(float(np.max(np.abs(pa[k] - pb[k]))) for k in pa)
    keys = ("train_loss", "val_loss", "val_f1")
    ha = [tuple(h[k] for k in keys) for h in a.history_]
    hb = [tuple(h[k] for k in keys) for h in b.history_]
    first = next((t for t, (u, v) in enumerate(zip(ha, hb)) if u != v), None)
    if len(ha) != len(hb) and first is None:
        first = min(len(ha), len(hb))
    identical = max_diff == 0.0 and first is None
    return identical, ("bit-identical" if identical else
                       f"DIFFERENT: max |param diff| {max_diff:.3e}, first differing round {first}")


def bench_p2(args, X, y, results):
    started = time.perf_counter()  # the wall time of this part's record
    T, E, K = args.rounds, args.epochs, args.clients
    print(f"\n== P2: federated ({K} clients, T={T} rounds x E={E} local epochs, all clients, "
          f"validation {args.validation_fraction:g} per client) vs centralized ({T * E} epochs) ==")
    make_fed = lambda: _federated(args, 1, T, K)  # noqa: E731
    make_cen = lambda: _centralized(args, T * E)  # noqa: E731
    # warm-up (first-call costs of torch / sklearn)
    _timed_fit(lambda: _federated(args, 1, 1, K), X, y)
    _timed_fit(lambda: _centralized(args, 1), X, y)
    fed_t, cen_t, server, evals, fed_cpu, cen_cpu = [], [], [], [], [], []
    load = os.getloadavg()[0]
    for r in range(args.reps):
        order = [("fed", make_fed), ("cen", make_cen)]
        if r % 2:
            order.reverse()
        for name, make in order:
            t, est = _timed_fit(make, X, y, fed_cpu if name == "fed" else cen_cpu)
            if name == "fed":
                fed_t.append(t)
                server.append(est.server_time_)
                evals.append(est.eval_time_)
                fed = est
            else:
                cen_t.append(t)
                cen = est
    f, c = statistics.median(fed_t), statistics.median(cen_t)
    fc, cc = statistics.median(fed_cpu), statistics.median(cen_cpu)
    n_train_fed = sum(fed.history_[-1]["n_samples"])
    n_train_cen = len(y) - round(args.validation_fraction * len(y))
    ratio = f / c
    print(f"  data             : {len(y)} SPD matrices {X.shape[1]}x{X.shape[2]} -> BiMap {args.hidden}, "
          f"4 classes, batch {args.batch_size}, aggregation {args.aggregation}")
    steps_fed = T * E * sum(-(-n // args.batch_size) for n in fed.history_[-1]["n_samples"])
    steps_cen = T * E * -(-n_train_cen // args.batch_size)
    print(f"  training samples : federated {n_train_fed} (over {K} clients), centralized {n_train_cen}")
    print(f"  optimizer steps  : federated {steps_fed}, centralized {steps_cen} (x{steps_fed / steps_cen:.3f}: "
          f"each client's last minibatch is partial)")
    print(f"  reps             : {args.reps} (order alternated), median; 1-min load average "
          f"{load:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"  {'':<26}{'wall s':>10}{'CPU s':>8}{'all runs, wall (s)':>40}")
    print(f"  {'federated fit':<26}{f:>10.3f}{fc:>8.3f}{'  ' + ' '.join(f'{v:.2f}' for v in fed_t):>40}")
    print(f"  {'  server side / round':<26}{statistics.median(server) / T:>10.4f}"
          f"   (aggregation + global evaluation + schedule: {100 * statistics.median(server) / f:.1f}% of fit)")
    print(f"  {'  global evaluation / rnd':<26}{statistics.median(evals) / T:>10.4f}"
          f"   ({100 * statistics.median(evals) / f:.1f}% of fit)")
    print(f"  {'centralized fit':<26}{c:>10.3f}{cc:>8.3f}{'  ' + ' '.join(f'{v:.2f}' for v in cen_t):>40}")
    print(f"  final val macro-F1: federated {fed.history_[-1]['val_f1']:.3f}, centralized "
          f"{cen.history_[-1]['val_f1']:.3f}")
    print(f"  ratio federated / centralized = {ratio:.3f} wall ({fc / cc:.3f} CPU)   target <= 1.15   "
          f"-> {verdict(ratio <= 1.15)}")
    results["P2"] = (f"fed/central wall time = {ratio:.3f} (CPU {fc / cc:.3f})", "<= 1.15", ratio <= 1.15)
    write_speed_record(f"{args.record}-overhead", title="Federated fit against the centralized fit of as many epochs",
                       times={"federated": fed_t, "centralized": cen_t}, reference="centralized",
                       labels={"federated": f"federated, {K} clients x {T} rounds x {E} epochs",
                               "centralized": f"centralized, {T * E} epochs"},
                       metric="s", description="seconds per fit", started=started,
                       facts={"target": "≤ 1.15", "cpu_ratio": f"{fc / cc:.3f}", "clients": K, "rounds": T,
                              "local_epochs": E, "steps_ratio": f"{steps_fed / steps_cen:.3f}",
                              "server_share_percent": f"{100 * statistics.median(server) / f:.1f}"})


def _cpu_seconds():
    """``(this process, {child pid: seconds})`` of user + system CPU time (children: psutil)."""
    try:
        import psutil
    except ImportError:
        return time.process_time(), None
    me = psutil.Process()
    kids = {}
    for child in me.children(recursive=True):
        try:
            t = child.cpu_times()
            kids[child.pid] = t.user + t.system
        except psutil.Error:
            pass
    t = me.cpu_times()
    return t.user + t.system, kids


def _burn(n_iter, size=64, k=18):
    """Pure torch compute (one thread), no data in or out: the machine's parallel ceiling."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    A = torch.randn(size, size, size, dtype=torch.float64, generator=g)
    W = torch.randn(size, k, dtype=torch.float64, generator=g)
    for _ in range(n_iter):
        torch.linalg.eigh(W.T @ A @ W)
    return None


def _warm_worker(X, y):
    """A short fit (imports and first-call costs of torch and the package), then hold the
    worker a moment so that every worker gets a call."""
    SPDnetClassifier(hidden_dims=(4,), max_epochs=1, validation_fraction=0).fit(X, y)
    time.sleep(0.5)


def _ceiling(n_jobs, n_tasks, n_iter):
    """Wall time of ``n_tasks`` equal ``_burn`` jobs, serially (n_jobs=1) or on the loky workers."""
    t0 = time.perf_counter()
    if n_jobs == 1:
        for _ in range(n_tasks):
            _burn(n_iter)
    else:
        joblib.Parallel(n_jobs=n_jobs)(joblib.delayed(_burn)(n_iter) for _ in range(n_tasks))
    return time.perf_counter() - t0


def bench_p3(args, X, y, results):
    started = time.perf_counter()  # the wall time of this part's record
    T, K = args.p3_rounds, args.p3_clients
    print(f"\n== P3: n_jobs=2 vs n_jobs=1 ({K} clients, T={T} rounds x E={args.epochs} local epochs) ==")
    t0 = time.perf_counter()
    _timed_fit(lambda: _federated(args, 2, 1, K), X, y)
    cold = time.perf_counter() - t0
    # a fit sends one job per round to whichever worker is free: every worker pays its
    # first-call costs now, not in the middle of a timed fit
    joblib.Parallel(n_jobs=2)(joblib.delayed(_warm_worker)(X[:40], y[:40]) for _ in range(4))
    print(f"  warm-up fit with n_jobs=2 (1 round, starts the loky workers): {cold:.2f} s; a short fit in "
          f"every worker: {time.perf_counter() - t0:.2f} s in all")
    _timed_fit(lambda: _federated(args, 1, 1, K), X, y)
    # what one client's job carries: the local estimator (its module) + broadcast (pickled per job) and its data
    probe = _federated(args, 1, 1, K, timed=False).fit(X, y)
    small = len(pickle.dumps((probe.global_estimator_, probe.global_estimator_.get_parameters())))
    data_mib = probe.global_estimator_.to_tensor(X[: len(y) // K]).numpy().nbytes / 2**20
    # the ceiling workload: jobs as long as one client's local update
    one = _federated(args, 1, 1, K, timed=False)
    one.fit(X, y)
    t_job = one.history_[0]["wall_time"] / K
    t0 = time.perf_counter()
    _burn(10)
    n_iter = max(1, int(10 * t_job / (time.perf_counter() - t0)))
    t1, t2, cpu1, models, c1, c2 = [], [], [], {}, [], []
    short = {1: [], 2: []}  # fits of T_short rounds: per round = (T(T) - T(T_short)) / (T - T_short)
    T_short = max(1, T // 5)
    cpu2 = []  # (main process CPU, busiest worker CPU, all workers CPU)
    load = os.getloadavg()[0]
    for r in range(args.reps):
        order = [1, 2] if r % 2 == 0 else [2, 1]
        for n_jobs in order:
            (c1 if n_jobs == 1 else c2).append(_ceiling(n_jobs, K * T, n_iter))
            short[n_jobs].append(_timed_fit(lambda: _federated(args, n_jobs, T_short, K), X, y)[0])
            main0, kids0 = _cpu_seconds()
            t, est = _timed_fit(lambda: _federated(args, n_jobs, T, K), X, y)
            main1, kids1 = _cpu_seconds()
            if n_jobs == 1:
                t1.append(t)
                cpu1.append(main1 - main0)
            else:
                t2.append(t)
                if kids1 is not None:
                    used = [kids1[pid] - kids0.get(pid, 0.0) for pid in kids1]
                    cpu2.append((main1 - main0, max(used, default=0.0), sum(used)))
            models[n_jobs] = est
    a, b = statistics.median(t1), statistics.median(t2)
    speedup = a / b
    per_round = {n: (statistics.median(t) - statistics.median(short[n])) / (T - T_short)
                 for n, t in ((1, t1), (2, t2))}
    round_speedup = per_round[1] / per_round[2]
    ceiling = statistics.median(c1) / statistics.median(c2)
    identical, how = _compare_models(models[1], models[2])
    print(f"  per job: estimator + broadcast {small / 1024:.0f} KiB pickled; client training data "
          f"{data_mib:.2f} MiB ({K} jobs per round)")
    print(f"  reps {args.reps} (order alternated), median; 1-min load average {load:.2f} -> "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"  {'':<16}{'wall s':>10}{'min s':>8}{'all runs, wall (s)':>36}")
    print(f"  {'n_jobs=1':<16}{a:>10.3f}{min(t1):>8.3f}{'  ' + ' '.join(f'{v:.2f}' for v in t1):>36}")
    print(f"  {'n_jobs=2':<16}{b:>10.3f}{min(t2):>8.3f}{'  ' + ' '.join(f'{v:.2f}' for v in t2):>36}")
    print(f"  machine ceiling now: {K * T} pure-compute jobs of ~{1e3 * t_job:.0f} ms (torch, no data moved) "
          f"on the same workers: {statistics.median(c1):.3f} s serial, {statistics.median(c2):.3f} s with "
          f"n_jobs=2 -> {ceiling:.2f}x")
    if cpu2:
        main_c, busiest, total = (statistics.median(v) for v in zip(*cpu2))
        serial_c = statistics.median(cpu1)
        print(f"  CPU s: n_jobs=1 {serial_c:.3f}; n_jobs=2 main process {main_c:.3f} (incl. joblib's "
              f"threads), workers {total:.3f} in all, busiest {busiest:.3f}")
        path = max(main_c, busiest)  # this process trains a share beside the workers
        print(f"  contention-free bound (n_jobs=1 CPU / max(main CPU, busiest worker CPU)): "
              f"{serial_c / path:.2f}x; wall n_jobs=2 / that critical path "
              f"{b / path:.2f} (> 1: waits, serial steps, other processes on the cores)")
    print(f"  n_jobs=1 vs n_jobs=2 (final parameters, per-round losses and F1): {how}")
    print(f"  per round (T({T}) - T({T_short})) / {T - T_short}, set-up excluded: n_jobs=1 {1e3 * per_round[1]:.1f} ms, "
          f"n_jobs=2 {1e3 * per_round[2]:.1f} ms -> {round_speedup:.2f}x ({100 * round_speedup / ceiling:.0f}% of "
          f"the ceiling)")
    met = speedup >= 1.6 or speedup >= 0.9 * ceiling
    print(f"  speed-up n_jobs=2 / n_jobs=1 = {speedup:.2f}x (min/min {min(t1) / min(t2):.2f}x; "
          f"{100 * speedup / ceiling:.0f}% of the {ceiling:.2f}x ceiling)   target >= 1.6x or >= 90% of the ceiling"
          f"   -> {verdict(met)}")
    results["P3"] = (f"speed-up n_jobs=2 = {speedup:.2f}x, per round {round_speedup:.2f}x (ceiling {ceiling:.2f}x; "
                     f"bit-identical: {identical})", ">= 1.6x or >= 90% of ceiling", met and identical)
    facts = {"target": "≥ 1.6×", "bit_identical": identical, "clients": K, "rounds": T, "short_rounds": T_short,
             "per_round_ms_1": f"{1e3 * per_round[1]:.1f}", "per_round_ms_2": f"{1e3 * per_round[2]:.1f}",
             "per_round_speedup": f"{round_speedup:.2f}×", "percent_of_ceiling": f"{100 * speedup / ceiling:.0f} %",
             "per_round_percent_of_ceiling": f"{100 * round_speedup / ceiling:.0f} %"}
    if cpu2:
        facts.update(main_cpu_s=f"{main_c:.2f}", serial_cpu_s=f"{serial_c:.2f}",
                     contention_free_bound=f"{serial_c / path:.2f}×")
    write_speed_record(f"{args.record}-parallel", title="Federated fit with n_jobs=2 against n_jobs=1",
                       times={"n_jobs=1": t1, "n_jobs=2": t2, "n_jobs=1/short": short[1], "n_jobs=2/short": short[2],
                              "ceiling/serial": c1, "ceiling/n_jobs=2": c2}, reference="n_jobs=1",
                       labels={"n_jobs=1": f"n_jobs=1, {T} rounds", "n_jobs=2": f"n_jobs=2, {T} rounds",
                               "n_jobs=1/short": f"n_jobs=1, {T_short} rounds",
                               "n_jobs=2/short": f"n_jobs=2, {T_short} rounds",
                               "ceiling/serial": "pure compute, serial", "ceiling/n_jobs=2": "pure compute, n_jobs=2"},
                       metric="s", description="seconds per fit", started=started, facts=facts)


# ---------------------------------------------------------------------------------------------
# P4: aggregation
# ---------------------------------------------------------------------------------------------


def bench_p4(args, results):
    started = time.perf_counter()  # the wall time of this part's record
    N, p, k, n_classes = args.p4_clients, args.channels, args.hidden, 4
    n_feat = k * (k + 1) // 2
    print(f"\n== P4: one aggregation of {N} clients x St({p},{k}) + head ({n_classes}x{n_feat} + {n_classes}) ==")
    rng = np.random.default_rng(0)
    W0 = random_stiefel(p, k, rng)
    H0, b0 = rng.standard_normal((n_classes, n_feat)), rng.standard_normal(n_classes)
    name = "bimaps.0.weight"
    kinds = {name: "stiefel", "head.weight": "euclidean", "head.bias": "euclidean"}
    weights = client_weights(rng.integers(20, 200, size=N))
    previous = {name: W0, "head.weight": H0, "head.bias": b0}
    print(f"  clients W_i = R_W0(delta * P_W0(G_i)), G_i Gaussian with ||G_i||_F = 1; weights ~ sample counts; "
          f"previous global = W0; median of {args.p4_reps} reps (reference: {args.p4_ref_reps})")
    print("  reference: skfedspd.aggregation.karcher, weighted Karcher mean under the canonical metric "
          "(Riemannian gradient descent from ProjAvg,\n  Zimmermann's Stiefel log, |grad|_F <= 1e-11); "
          "iters = gradient steps; |grad at Proj| = |sum w_i Log_Proj(W_i)|_F")
    header = (f"  {'delta':>6} {'ProjAvg ms':>11} {'RLAvg ms':>9} {'Karcher ms':>11} {'iters':>5} "
              f"{'K/Proj':>8} {'K/RL':>8} {'|Proj-K|F':>10} {'|RL-K|F':>10} {'|grad at Proj|':>14} "
              f"{'mean |W_i-K|F':>14} {'orth. err':>9}")
    print(header)
    worst_ms, worst_ratio = 0.0, np.inf
    recorded, labels, facts = {}, {}, {"clients": N}
    for delta in args.deltas:
        clients = []
        for _ in range(N):
            G = rng.standard_normal((p, k))
            D = tangent_project(W0, G)
            D /= np.linalg.norm(D)
            clients.append({name: retract(W0, delta * D),
                            "head.weight": H0 + delta * rng.standard_normal(H0.shape),
                            "head.bias": b0 + delta * rng.standard_normal(b0.shape)})
        t_proj, s_proj = median_ms(lambda: projavg(clients, weights, previous, kinds), args.p4_reps)
        t_rl, s_rl = median_ms(lambda: rlavg(clients, weights, previous, kinds), args.p4_reps)
        t_k, s_k = median_ms(lambda: karcher(clients, weights, previous, kinds), args.p4_ref_reps, warmup=1)
        for rule, label, seconds in (("projavg", "ProjAvg", s_proj), ("rlavg", "RLAvg", s_rl),
                                     ("karcher", "Karcher mean", s_k)):
            recorded[f"{rule}/{delta:g}"] = [1e3 * v for v in seconds]
            labels[f"{rule}/{delta:g}"] = f"{label}, spread δ = {delta:g}"
        out, iters = karcher(clients, weights, previous, kinds, return_iterations=True)
        K = out[name]
        pa = projavg(clients, weights, previous, kinds)[name]
        rl = rlavg(clients, weights, previous, kinds)[name]
        grad_pa = np.linalg.norm(sum(w * stiefel_log(pa, c[name]) for w, c in zip(weights, clients)))
        spread = np.mean([np.linalg.norm(c[name] - K) for c in clients])
        orth = max(orthonormality_error(pa), orthonormality_error(rl), orthonormality_error(K))
        print(f"  {delta:>6g} {t_proj:>11.4f} {t_rl:>9.4f} {t_k:>11.1f} {iters[name]:>5d} {t_k / t_proj:>8.0f} "
              f"{t_k / t_rl:>8.0f} {np.linalg.norm(pa - K):>10.2e} {np.linalg.norm(rl - K):>10.2e} "
              f"{grad_pa:>14.2e} {spread:>14.3e} {orth:>9.1e}")
        worst_ms = max(worst_ms, t_proj, t_rl)
        facts.update({f"karcher_iterations_{delta:g}": int(iters[name]),
                      f"projavg_to_karcher_{delta:g}": f"{np.linalg.norm(pa - K):.1e}",
                      f"rlavg_to_karcher_{delta:g}": f"{np.linalg.norm(rl - K):.1e}"})
        worst_ratio = min(worst_ratio, t_k / t_proj, t_k / t_rl)
    # where one ProjAvg goes: the weighted sum over clients vs the polar factor
    summed = weighted_sum(clients, weights, kinds)
    t_sum, _ = median_ms(lambda: weighted_sum(clients, weights, kinds), args.p4_reps)
    t_polar, _ = median_ms(lambda: polar(summed[name]), args.p4_reps)
    print(f"  breakdown (last delta): weighted_sum over {N} clients {t_sum:.4f} ms, "
          f"polar({p}x{k}) {t_polar:.4f} ms")
    ok_ms, ok_ratio = worst_ms <= 1.0, worst_ratio >= 100
    print(f"  slowest ProjAvg/RLAvg = {worst_ms:.4f} ms   target <= 1 ms   -> {verdict(ok_ms)}")
    print(f"  smallest Karcher / (ProjAvg|RLAvg) = {worst_ratio:.0f}x   target >= 100x   -> {verdict(ok_ratio)}")
    results["P4 time"] = (f"ProjAvg/RLAvg <= {worst_ms:.3f} ms", "<= 1 ms", ok_ms)
    results["P4 ratio"] = (f"Karcher / one-step >= {worst_ratio:.0f}x", ">= 100x", ok_ratio)
    write_speed_record(f"{args.record}-aggregation", title=f"One aggregation of {N} clients: ProjAvg, RLAvg, Karcher mean",
                       times=recorded, labels=labels, reference=f"projavg/{args.deltas[0]:g}", started=started,
                       description="milliseconds per aggregation", facts=facts)


# ---------------------------------------------------------------------------------------------
# P6: memory with many clients (child interpreter)
# ---------------------------------------------------------------------------------------------


def _rss_mib():
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:  # pragma: no cover - Linux fallback
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mib():
    """Peak RSS of this process: ``VmHWM`` of /proc/self/status (the high-water mark of this
    process image), else ``getrusage(RUSAGE_SELF).ru_maxrss``. On Linux ``ru_maxrss`` survives
    fork + exec, so in a child interpreter it starts at the parent's RSS at the fork."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def p6_child(args):
    """Runs in a fresh interpreter; prints one JSON line."""
    torch.set_num_threads(args.torch_threads)
    n_clients, per_client = args.p6_clients, args.p6_samples
    X, y = make_spd_classification(n_clients * per_client, args.p6_channels, n_classes=2, seed=1, separation=3.0)
    groups = np.repeat(np.arange(n_clients), per_client)
    # each client: interleaved labels -> both classes; (per_client - 1) training samples, 1 validation
    rss_before = _rss_mib()
    peak_before = _peak_rss_mib()
    fed = FederatedSPDnetClassifier(
        SPDnetClassifier(hidden_dims=(args.p6_hidden,), batch_size=32, lr=1e-2),
        n_rounds=args.p6_rounds, local_epochs=args.epochs, schedule=RoundSchedule(lr_patience=BIG),
        validation_fraction=1.0 / per_client,
        backend=LocalBackend(n_jobs=args.p6_jobs), random_state=0)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fed.fit(X, y, groups=groups)
    wall = time.perf_counter() - t0
    peak = _peak_rss_mib()
    print(json.dumps({
        "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "n_clients": fed.n_clients_, "rounds": len(fed.history_), "wall_s": wall,
        "rss_before_mib": rss_before, "peak_before_mib": peak_before, "rss_after_mib": _rss_mib(),
        "peak_mib": peak, "fitted_pickle_mib": len(pickle.dumps(fed)) / 2**20,
        "val_f1_first": fed.history_[0]["val_f1"], "val_f1_last": fed.history_[-1]["val_f1"],
        "best_round": fed.best_round_, "round_s": [h["wall_time"] for h in fed.history_],
    }))


def bench_p6(args, results):
    started = time.perf_counter()  # the wall time of this part's record
    print(f"\n== P6: {args.p6_clients} clients x {args.p6_rounds} rounds, {args.p6_samples} matrices "
          f"{args.p6_channels}x{args.p6_channels} per client ({args.p6_samples - 1} train + 1 validation), "
          f"BiMap {args.p6_hidden}, E={args.epochs}, n_jobs={args.p6_jobs} ==")
    cmd = [sys.executable, os.path.abspath(__file__), "--_p6-child", "--torch-threads", str(args.torch_threads),
           "--epochs", str(args.epochs)]
    for flag in ("p6_clients", "p6_rounds", "p6_samples", "p6_channels", "p6_hidden", "p6_jobs"):
        cmd += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr)
        results["P6"] = ("child failed", "<= 2 GB", False)
        return
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    rounds = np.asarray(r["round_s"])
    peak_gb = r["peak_mib"] / 1024
    print(f"  fit wall time           : {r['wall_s']:.1f} s ({rounds.mean():.2f} s per round, "
          f"{1e3 * rounds.mean() / r['n_clients']:.2f} ms per client-round)")
    print(f"  RSS after imports + data: {r['rss_before_mib']:.0f} MiB (peak so far {r['peak_before_mib']:.0f} MiB)")
    print(f"  RSS after fit           : {r['rss_after_mib']:.0f} MiB")
    print(f"  peak RSS (VmHWM)        : {r['peak_mib']:.0f} MiB = {peak_gb:.3f} GiB "
          f"(fit added {r['peak_mib'] - r['peak_before_mib']:.0f} MiB to the peak; ru_maxrss "
          f"{r['ru_maxrss_mib']:.0f} MiB includes the parent's RSS at the fork)")
    print(f"  pickled fitted estimator: {r['fitted_pickle_mib']:.2f} MiB")
    print(f"  val macro-F1 round 0 -> last: {r['val_f1_first']:.3f} -> {r['val_f1_last']:.3f} "
          f"(best round {r['best_round']})")
    if args.p6_jobs not in (None, 1):
        print("  note: loky workers' own memory is not included in this process's ru_maxrss")
    print(f"  peak RSS {peak_gb:.3f} GiB   target <= 2 GB   -> {verdict(peak_gb <= 2)}")
    results["P6"] = (f"peak RSS = {peak_gb:.3f} GiB", "<= 2 GB", peak_gb <= 2)
    write_speed_record(f"{args.record}-memory", title=f"Peak memory of a federated fit of {r['n_clients']} clients",
                       times={"fit": [r["peak_mib"]]}, reference="fit", labels={"fit": "peak RSS of the fit's process"},
                       metric="MiB", description="MiB", started=started,
                       facts={"target": "≤ 2 GiB", "peak_gib": f"{peak_gb:.3f}", "clients": r["n_clients"],
                              "rounds": r["rounds"], "fit_s": f"{r['wall_s']:.1f}",
                              "imports_and_data_mib": f"{r['rss_before_mib']:.0f}",
                              "round_s_first": f"{rounds[0]:.2f}", "round_s_last": f"{rounds[-1]:.2f}"})


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS))
    p.add_argument("--reps", type=int, default=3, help="repetitions of each timed fit (P2, P3)")
    p.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads of the main process")
    g = p.add_argument_group("data and model (P2, P3; P4 uses --channels/--hidden)")
    g.add_argument("--n-matrices", type=int, default=800)
    g.add_argument("--channels", type=int, default=64)
    g.add_argument("--hidden", type=int, default=18)
    g.add_argument("--batch-size", type=int, default=64)
    g.add_argument("--validation-fraction", type=float, default=0.1)
    g.add_argument("--aggregation", default="projavg")
    g.add_argument("--epochs", type=int, default=2, help="local epochs E per round (P2, P3, P6)")
    g = p.add_argument_group("P2")
    g.add_argument("--clients", type=int, default=8)
    g.add_argument("--rounds", type=int, default=10)
    g = p.add_argument_group("P3")
    g.add_argument("--p3-clients", type=int, default=8)
    g.add_argument("--p3-rounds", type=int, default=10)
    g = p.add_argument_group("P4")
    g.add_argument("--p4-clients", type=int, default=53)
    g.add_argument("--p4-reps", type=int, default=300)
    g.add_argument("--p4-ref-reps", type=int, default=3, help="repetitions of the Karcher-mean reference")
    g.add_argument("--deltas", type=float, nargs="+", default=[0.01, 0.1, 0.5])
    g = p.add_argument_group("P6")
    g.add_argument("--p6-clients", type=int, default=1000)
    g.add_argument("--p6-rounds", type=int, default=10)
    g.add_argument("--p6-samples", type=int, default=4, help="matrices per client (one is validation)")
    g.add_argument("--p6-channels", type=int, default=8)
    g.add_argument("--p6-hidden", type=int, default=4)
    g.add_argument("--p6-jobs", type=int, default=1)
    p.add_argument("--_p6-child", action="store_true", help=argparse.SUPPRESS)
    add_record_option(p, "speed-federated")
    args = p.parse_args(argv)
    if args._p6_child:
        return p6_child(args)

    parts = [s.strip().upper() for s in args.parts.split(",") if s.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    torch.set_num_threads(args.torch_threads)
    print("command      :", " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv))
    print(machine_info())
    start = time.perf_counter()
    results = {}
    if "P4" in parts:
        bench_p4(args, results)
    if "P2" in parts or "P3" in parts:
        X, y = make_spd_classification(args.n_matrices, args.channels, n_classes=4, seed=0, separation=1.5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            if "P2" in parts:
                bench_p2(args, X, y, results)
            if "P3" in parts:
                bench_p3(args, X, y, results)
    if "P6" in parts:
        bench_p6(args, results)

    print(f"\n== summary (total {time.perf_counter() - start:.0f} s) ==")
    for name, (value, target, ok) in results.items():
        print(f"  {name:<11} {value:<54} target {target:<9} {verdict(ok)}")


if __name__ == "__main__":
    main()
