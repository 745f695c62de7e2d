"""Benchmark of the Flower backend: per-round wall time and peak memory of

* ``local``       — ``FederatedSPDnetClassifier(backend="local")`` (clients in-process);
* ``simulation``  — ``backend="flower"``: the in-process Flower simulation
  (``skfedspd.flower.simulation``: Flower's Simulation Runtime with a thread backend);
* ``deployment``  — a SuperLink and one SuperNode per site as separate processes on
  127.0.0.1 (``skfedspd.flower.loopback``), the run launched by ``fit_federated``.

Same small problem for all three (synthetic SPD matrices, one client per group), same
``random_state``: the three models are checked bit-identical. Each mode runs in a fresh
child interpreter, so its peak RSS (``VmHWM``) is its own; the deployment's memory is the
sum of the resident sets of all its processes (SuperLink, SuperNodes, their SuperExecs,
the ServerApp and the per-message ClientApp processes), sampled every 0.1 s with psutil,
plus the researcher's process. "per round" is the median of ``history_[*]["wall_time"]``
(selection → training → aggregation → validation of the global model); "fit" is the whole
call, set-up and start-up included (for the deployment: from launching the processes).

Usage::

    FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 .venv/bin/python benchmarks/bench_flower.py
    ... --modes local,simulation --rounds 5 --sites 4
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

ROOT = Path(__file__).resolve().parents[1]
MODES = ("local", "simulation", "deployment")


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
    from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier

    return FederatedSPDnetClassifier(
        SPDnetClassifier(hidden_dims=(args.hidden,), batch_size=16, lr=0.02),
        n_rounds=args.rounds, local_epochs=args.local_epochs, clients_per_round=args.clients_per_round,
        random_state=0)


def child(args):
    """One mode in this fresh interpreter; prints one JSON line."""
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
                        if os.getpgid(proc.pid) in pgids or proc.pid in {c.pid for c in me.children()}:
                            rss.append(proc.memory_info().rss / 2**20)
                    except (psutil.Error, ProcessLookupError, OSError):
                        pass
                if rss:
                    peak["total"] = max(peak["total"], sum(rss) + me.memory_info().rss / 2**20)
                    peak["largest"] = max(peak["largest"], max(rss))
                stop.wait(0.1)

        with LoopbackDeployment(paths, root=tmp / "flower") as deployment:
            out["startup_s"] = time.perf_counter() - start
            sampler = threading.Thread(target=sample, args=({p.pid for p in deployment.processes.values()},),
                                       daemon=True)
            sampler.start()
            fed = fit_federated(fed, deployment.address, args.sites, tmp / "model.skfedspd", insecure=True,
                                quiet=True, round_timeout=600, connect_timeout=300)
            stop.set()
            sampler.join()
        out["deployment_total_peak_mib"] = peak["total"]
        out["deployment_largest_process_peak_mib"] = peak["largest"]
    out["fit_s"] = time.perf_counter() - start
    walls = [r["wall_time"] for r in fed.history_]
    out.update(rounds=len(walls), round_median_s=float(np.median(walls)), round_min_s=float(np.min(walls)),
               round_max_s=float(np.max(walls)), peak_hwm_mib=vm_hwm_mib(), total_s=time.perf_counter() - t0,
               params={k: np.asarray(v).tolist() for k, v in fed.engine_.global_params.items()},
               history=repr([{k: v for k, v in r.items() if k != "wall_time"} for r in fed.history_]))
    print("RESULT " + json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--sites", type=int, default=3, help="clients = sites = SuperNodes")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--local-epochs", type=int, default=2)
    p.add_argument("--clients-per-round", type=int, default=None)
    p.add_argument("--n-matrices", type=int, default=180)
    p.add_argument("--channels", type=int, default=8)
    p.add_argument("--hidden", type=int, default=4)
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads of the local / simulation process (as bench_federated.py)")
    p.add_argument("--json", default=None, help="also write the figures there")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    results = {}
    for mode in args.modes.split(","):
        cmd = [sys.executable, __file__, "--child", mode, "--sites", str(args.sites), "--rounds", str(args.rounds),
               "--local-epochs", str(args.local_epochs), "--n-matrices", str(args.n_matrices),
               "--channels", str(args.channels), "--hidden", str(args.hidden),
               "--torch-threads", str(args.torch_threads)]
        if args.clients_per_round is not None:
            cmd += ["--clients-per-round", str(args.clients_per_round)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(f"{mode}: failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
            continue
        results[mode] = json.loads(lines[-1][len("RESULT "):])

    print(f"\n{args.sites} sites, {args.rounds} rounds x {args.local_epochs} local epochs, "
          f"{args.n_matrices} SPD matrices {args.channels}x{args.channels}, hidden {args.hidden}, "
          f"clients per round {args.clients_per_round or 'all'}\n")
    print("| mode | per round (median, min-max) | fit (incl. set-up) | peak RSS |")
    print("| --- | --- | --- | --- |")
    for mode, r in results.items():
        if mode == "deployment":
            memory = (f"{r['deployment_total_peak_mib']:.0f} MiB all processes "
                      f"(largest {r['deployment_largest_process_peak_mib']:.0f} MiB)")
            fit = f"{r['fit_s']:.1f} s (processes up in {r['startup_s']:.1f} s)"
        else:
            memory = f"{r['peak_hwm_mib']:.0f} MiB (imports alone {r['imports_hwm_mib']:.0f} MiB)"
            fit = f"{r['fit_s']:.2f} s"
        print(f"| {mode} | {r['round_median_s']:.3f} s ({r['round_min_s']:.3f}-{r['round_max_s']:.3f}) | {fit} "
              f"| {memory} |")
    if len(results) > 1:
        first = next(iter(results.values()))
        same = all(r["params"] == first["params"] and r["history"] == first["history"] for r in results.values())
        print(f"\nbit-identical global models and histories across {', '.join(results)}: {same}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({m: {k: v for k, v in r.items() if k not in ("params", "history")}
                                               for m, r in results.items()}, indent=1))


if __name__ == "__main__":
    main()
