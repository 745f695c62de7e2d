"""Benchmark of the Flower backend: the cost of a round, start-up apart, and peak memory of

* ``local``       — ``FederatedSPDnetClassifier(backend="local")`` (clients in-process);
* ``simulation``  — ``backend="flower"``: the in-process Flower simulation
  (``skfedspd.flower.simulation``: Flower's Simulation Runtime with a thread backend);
* ``loopback``    — a SuperLink and one SuperNode per site as separate processes on
  127.0.0.1 (``skfedspd.flower.loopback.LoopbackDeployment``), Flower's process isolation
  mode with one long-lived app process per SuperNode and one for the SuperLink
  (``skfedspd.flower.runtime``), the run launched by ``fit_federated``;
* ``loopback-subprocess`` — the same with Flower's default ``--isolation subprocess`` (a new
  ``flwr-clientapp`` process per message, Flower's 3 s polls): the baseline (slow: about
  30-90 s per round here; not in the default modes).

Same small problem for all (synthetic SPD matrices, one client per group), same
``random_state``: the models are checked bit-identical. Each mode and round count runs in a
fresh child interpreter, so its peak RSS (``VmHWM``) is its own. **Per round** is
``(T(n2) - T(n1)) / (n2 - n1)`` with ``T`` the fit's wall time at ``n1`` and ``n2`` rounds
(``--rounds n1,n2``): start-up and set-up cancel out (for a deployment ``T`` is the
``fit_federated`` call, processes already up; their start-up is printed apart). The CPU
time of a deployment's processes (all of them, children included) per round is printed
too: machine load disturbs it least. Memory of a deployment: the sum of the resident sets
of all its processes, sampled every 0.1 s with psutil, plus the researcher's process.

Usage::

    FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 .venv/bin/python benchmarks/bench_flower.py
    ... --modes local,loopback,loopback-subprocess --rounds 1,3 --sites 2

Writes the record ``speed-flower`` (``--record``): each mode's round wall times (the fit of n2
rounds, units: rounds), its per-round cost, CPU and memory as facts.
"""

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_name  # noqa: E402

sys.path.insert(0, str(ROOT))  # the benchmarks package, for its records
from benchmarks.records.speed import add_record_option, write_speed_record  # noqa: E402
MODES = ("local", "simulation", "loopback", "loopback-subprocess")
DEFAULT_MODES = "local,simulation,loopback"


def vm_hwm_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def problem(args):
    import numpy as np

    from skfedspd.datasets import make_spd_classification

    X, y = make_spd_classification(args.n_matrices, args.channels, 3, seed=0)
    groups = np.arange(len(y)) % args.sites  # every group holds every class
    return X, y, groups


def estimator(args):
    """The federated estimator of every mode. No validation split: on this small problem the
    local backend holds out none (``skfedspd.run.held_out_fraction``), while a deployment's
    sites, which the server does not see, hold out ``validation_fraction`` as given; with 0
    both train on the same data and their models can be compared."""
    from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier

    return FederatedSPDnetClassifier(
        SPDnetClassifier(hidden_dims=(args.hidden,), batch_size=16, lr=0.02),
        n_rounds=args.rounds, local_epochs=args.local_epochs, clients_per_round=args.clients_per_round,
        validation_fraction=0.0, random_state=0)


def _group_cpu_seconds(pgids):
    """CPU seconds (user + system, reaped children included) of the processes in ``pgids``."""
    import psutil

    total = 0.0
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) in pgids:
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        except (psutil.Error, ProcessLookupError, OSError):
            pass
    return total


def child(args):
    """One mode and round count in this fresh interpreter; prints one JSON line."""
    import numpy as np

    import torch

    torch.set_num_threads(args.torch_threads)
    t0 = time.perf_counter()
    X, y, groups = problem(args)
    import skfedspd.flower  # noqa: F401 - imports counted in the baseline
    out = {"mode": args.child, "imports_hwm_mib": vm_hwm_mib()}
    fed = estimator(args)
    start = time.perf_counter()
    if args.child in ("local", "simulation"):
        fed.set_params(backend="local" if args.child == "local" else "flower").fit(X, y, groups=groups)
        out["fit_s"] = time.perf_counter() - start
    else:
        import psutil

        from skfedspd.flower import fit_federated
        from skfedspd.flower.loopback import LoopbackDeployment

        tmp = Path(tempfile.mkdtemp(prefix="bench-flower-"))
        paths = []
        for g in range(args.sites):
            path = tmp / f"site{g}.npz"
            np.savez(path, X=X[groups == g], y=y[groups == g])
            paths.append(path)
        peak = {"total": 0.0, "largest": 0.0}
        stop = threading.Event()
        me = psutil.Process()

        def sample(pgids):
            while not stop.is_set():
                rss = []
                for proc in psutil.process_iter(["pid"]):
                    try:
                        if os.getpgid(proc.pid) in pgids:
                            rss.append(proc.memory_info().rss / 2**20)
                    except (psutil.Error, ProcessLookupError, OSError):
                        pass
                if rss:
                    peak["total"] = max(peak["total"], sum(rss) + me.memory_info().rss / 2**20)
                    peak["largest"] = max(peak["largest"], max(rss))
                stop.wait(0.1)

        isolation = "subprocess" if args.child == "loopback-subprocess" else "process"
        with LoopbackDeployment(paths, root=tmp / "flower", isolation=isolation,
                                torch_threads=args.torch_threads) as deployment:
            out["startup_s"] = time.perf_counter() - start
            pgids = {p.pid for p in deployment.processes.values()}
            sampler = threading.Thread(target=sample, args=(pgids,), daemon=True)
            sampler.start()
            cpu_before = _group_cpu_seconds(pgids)
            fit_start = time.perf_counter()
            fed = fit_federated(fed, deployment.address, args.sites, tmp / "model.skfedspd", insecure=True,
                                quiet=True, round_timeout=600, connect_timeout=300)
            out["fit_s"] = time.perf_counter() - fit_start
            out["deployment_cpu_s"] = _group_cpu_seconds(pgids) - cpu_before
            stop.set()
            sampler.join()
        out["deployment_total_peak_mib"] = peak["total"]
        out["deployment_largest_process_peak_mib"] = peak["largest"]
    walls = [r["wall_time"] for r in fed.history_]
    out.update(rounds=len(walls), round_s=walls, round_median_s=float(np.median(walls)), round_min_s=float(np.min(walls)),
               round_max_s=float(np.max(walls)), peak_hwm_mib=vm_hwm_mib(), total_s=time.perf_counter() - t0,
               params={k: np.asarray(v).tolist() for k, v in fed.engine_.global_params.items()},
               history=repr([{k: r[k] for k in sorted(r) if k != "wall_time"} for r in fed.history_]))
    print("RESULT " + json.dumps(out))


def run_child(args, mode, rounds):
    cmd = [sys.executable, __file__, "--child", mode, "--sites", str(args.sites), "--rounds", str(rounds),
           "--local-epochs", str(args.local_epochs), "--n-matrices", str(args.n_matrices),
           "--channels", str(args.channels), "--hidden", str(args.hidden), "--torch-threads", str(args.torch_threads)]
    if args.clients_per_round is not None:
        cmd += ["--clients-per-round", str(args.clients_per_round)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=3600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(f"{mode}, {rounds} rounds: failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        return None
    return json.loads(lines[-1][len("RESULT "):])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--modes", default=DEFAULT_MODES, help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--sites", type=int, default=2, help="clients = sites = SuperNodes")
    p.add_argument("--rounds", default="2,6", help="n1,n2: per round = (T(n2) - T(n1)) / (n2 - n1)")
    p.add_argument("--local-epochs", type=int, default=2)
    p.add_argument("--clients-per-round", type=int, default=None)
    p.add_argument("--n-matrices", type=int, default=180)
    p.add_argument("--channels", type=int, default=8)
    p.add_argument("--hidden", type=int, default=4)
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads of every process (as bench_federated.py)")
    p.add_argument("--json", default=None, help="also write the figures there")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    add_record_option(p, "speed-flower")
    args = p.parse_args()
    started = time.perf_counter()
    if args.child:
        args.rounds = int(args.rounds)
        return child(args)
    n1, n2 = (int(r) for r in args.rounds.split(","))
    if not 0 < n1 < n2:
        p.error(f"--rounds needs 0 < n1 < n2, got {args.rounds}")
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        p.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")

    import torch

    print("command:", " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv))
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch "
          f"{torch.__version__}; load average {os.getloadavg()[0]:.1f} at start", flush=True)
    results = {}
    for mode in modes:
        runs = [run_child(args, mode, n) for n in (n1, n2)]
        if all(runs):
            results[mode] = runs
            print(f"  {mode}: T({n1}) = {runs[0]['fit_s']:.2f} s, T({n2}) = {runs[1]['fit_s']:.2f} s", flush=True)

    print(f"\n{args.sites} sites, rounds {n1} and {n2} x {args.local_epochs} local epochs, {args.n_matrices} SPD "
          f"matrices {args.channels}x{args.channels}, hidden {args.hidden}, clients per round "
          f"{args.clients_per_round or 'all'}; load average {os.getloadavg()[0]:.1f} at the end\n")
    local = results.get("local")
    local_round = (local[1]["fit_s"] - local[0]["fit_s"]) / (n2 - n1) if local else None
    print("| mode | per round | / local | median round (history) | fit at n2 rounds | CPU s per round, all "
          "processes | peak RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    figures, facts = {}, {"target": "≤ 3 s", "sites": args.sites, "rounds": f"{n1}, {n2}"}
    for mode, (a, b) in results.items():
        per_round = (b["fit_s"] - a["fit_s"]) / (n2 - n1)
        ratio = f"{per_round / local_round:.0f}x" if local_round and mode != "local" else "1"
        fit = f"{b['fit_s']:.2f} s"
        cpu = memory = "-"
        if "startup_s" in b:
            fit += f" (+ {b['startup_s']:.1f} s starting the processes)"
            cpu = f"{(b['deployment_cpu_s'] - a['deployment_cpu_s']) / (n2 - n1):.2f} s"
            memory = (f"{b['deployment_total_peak_mib']:.0f} MiB all processes "
                      f"(largest {b['deployment_largest_process_peak_mib']:.0f} MiB)")
        else:
            memory = f"{b['peak_hwm_mib']:.0f} MiB (imports alone {b['imports_hwm_mib']:.0f} MiB)"
        print(f"| {mode} | {per_round:.3f} s | {ratio} | {b['round_median_s']:.3f} s | {fit} | {cpu} | {memory} |")
        facts.update({f"per_round_s_{mode}": f"{per_round:.3f}", f"fit_s_{mode}": f"{b['fit_s']:.2f}"})
        if "startup_s" in b:
            facts.update({f"startup_s_{mode}": f"{b['startup_s']:.1f}", f"cpu_per_round_s_{mode}": cpu.split()[0],
                          f"peak_mib_{mode}": f"{b['deployment_total_peak_mib']:.0f}",
                          f"largest_process_peak_mib_{mode}": f"{b['deployment_largest_process_peak_mib']:.0f}"})
        else:
            facts[f"peak_mib_{mode}"] = f"{b['peak_hwm_mib']:.0f}"
        figures[mode] = dict(per_round_s=per_round, **{f"{k}_n{n}": r[k] for n, r in ((n1, a), (n2, b))
                                                         for k in r if k not in ("params", "history")})
    if len(results) > 1:
        same = all(runs[i]["params"] == next(iter(results.values()))[i]["params"]
                   and runs[i]["history"] == next(iter(results.values()))[i]["history"]
                   for runs in results.values() for i in (0, 1))
        print(f"\nbit-identical global models and histories across {', '.join(results)}: {same}")
        facts["bit_identical"] = same
    if results:
        write_speed_record(args.record, title="Flower backends: the cost of a round",
                           times={mode: b["round_s"] for mode, (a, b) in results.items()},
                           reference="local" if "local" in results else next(iter(results)), started=started,
                           metric="s", description=f"seconds per round (fit of {n2} rounds)", facts=facts)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
