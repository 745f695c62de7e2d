"""A Table I cell through a Flower deployment on this machine, against the local backend.

The PhysionetMI Table I protocol, twice: same clients, same ``random_state``, the same model
bit for bit?

One cell of Table I (default: FedSPDnet ProjAvg, full participation, seed 0, 150 rounds of
2 local epochs, 8 clients of 2 subjects, ``table-one``'s protocol on the offline PhysionetMI
subset, read through :mod:`.data`) is fitted twice:

* ``local``: ``FederatedSPDnetClassifier(backend="local").fit(X, y, groups=subjects)``;
* ``loopback``: one ``.npz`` per client (the local backend's clients, in its order), a
  :class:`~skfedspd.flower.loopback.LoopbackDeployment` (SuperLink + 8 SuperNodes, each with
  its long-lived ClientApp process, on 127.0.0.1), :func:`~skfedspd.flower.fit_federated`.

It prints both wall times (the deployment's with and without starting its processes), the
per-round times, the largest absolute difference of the global parameters, whether the
histories (validation macro-F1 per round, ...) are identical, and both test macro-F1.

    FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 python -m benchmarks.experiments flower-table-one
    python -m benchmarks.experiments flower-table-one --key half/spdnet-rlavg --seed 1 --rounds 30

The exit status is 0 when both models are the same bit for bit, 1 otherwise.
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from sklearn.base import clone
from sklearn.metrics import f1_score

from skfedspd.datasets import sample_covariance
from skfedspd.clients import make_clients
from skfedspd.training import torch_threads

from .._machine import machine_line
from .data import offline_root
from .table_one_cells import PARTICIPATION
from .table_one_protocols import federated, physionet_protocol, spdnet
from .table_one_runner import client_split, load_or_skip

PROG = "python -m benchmarks.experiments flower-table-one"

KEYS = ("full/spdnet-projavg", "full/spdnet-rlavg", "half/spdnet-projavg", "half/spdnet-rlavg")


def _history(fed):
    return repr([{k: v for k, v in record.items() if k != "wall_time"} for record in fed.history_])


def build(protocol, key, seed, rounds):
    """The federated estimator of the Table I cell ``key`` (one of :data:`KEYS`), unfitted."""
    setting, model = key.split("/")
    return federated(spdnet(protocol, seed, 1), model.split("-")[1], PARTICIPATION[setting], rounds, seed)


def add_arguments(parser):
    parser.add_argument("--key", choices=KEYS, default=KEYS[0], help=f"Table I cell (setting/model; default {KEYS[0]})")
    parser.add_argument("--seed", type=int, default=0, help="default 0")
    parser.add_argument("--rounds", type=int, default=150, help="default 150")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch threads of the local fit and of each deployment process (default 1)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the sites' files, logs and the model "
                                                               "(default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures there")


def run(args):
    """``python -m benchmarks.experiments flower-table-one``: exits 0 when both models are the same."""
    sys.exit(compare(args, " ".join([PROG, *sys.argv[2:]])))


def compare(args, command):
    """Fit the cell of ``args`` on both backends and report; 0 when the models are the same."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # before Flower is imported
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    print(f"command: {command}\nmachine: {machine_line()}, load average {os.getloadavg()[0]:.1f} at start",
          flush=True)

    from skfedspd.flower import fit_federated
    from skfedspd.flower.loopback import LoopbackDeployment

    if offline_root(say=print) is None:
        return 1
    protocol = physionet_protocol()
    X_raw, y, subjects = load_or_skip(protocol)
    X = sample_covariance(X_raw)
    train, test = client_split(y, subjects, args.seed)
    fed = build(protocol, args.key, args.seed, args.rounds)
    clients, client_groups = make_clients(subjects[train], fed.clients.groups_per_client)
    print(f"{protocol.name}: {len(train)} training trials, {len(clients)} clients {client_groups}; "
          f"{args.key}, seed {args.seed}, {args.rounds} rounds", flush=True)

    start = time.perf_counter()
    with torch_threads(args.torch_threads):
        local = clone(fed).fit(X[train], y[train], groups=subjects[train])
    local_s = time.perf_counter() - start
    print(f"local: {local_s:.1f} s", flush=True)

    out = Path(args.out or tempfile.mkdtemp(prefix="flower-tableone-"))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for cid, idx in enumerate(clients):  # client i of the local backend = site i
        path = out / f"site{cid}.npz"
        np.savez(path, X=X[train][idx], y=y[train][idx])
        paths.append(path)
    start = time.perf_counter()
    with LoopbackDeployment(paths, root=out / "flower", torch_threads=args.torch_threads) as deployment:
        up_s = time.perf_counter() - start
        remote = fit_federated(clone(fed), deployment.address, len(paths), out / "model.skfedspd", insecure=True,
                               overwrite=True, round_timeout=600, connect_timeout=300)
        fit_s = time.perf_counter() - start - up_s
    total_s = time.perf_counter() - start

    local_params, remote_params = local.engine_.global_params, remote.engine_.global_params
    diff = max(float(np.max(np.abs(local_params[k] - remote_params[k]))) for k in local_params)
    same_history = _history(local) == _history(remote)
    f1 = {name: float(f1_score(y[test], est.predict(X[test]), average="macro")) for name, est in
          (("local", local), ("loopback", remote))}
    rounds = len(remote.history_)
    walls = {name: [r["wall_time"] for r in est.history_] for name, est in (("local", local), ("loopback", remote))}
    print(f"\n| {args.key}, seed {args.seed}, {rounds} rounds, 8 sites | local backend | loopback deployment |")
    print("| --- | --- | --- |")
    print(f"| fit | {local_s:.1f} s | {fit_s:.1f} s (+ {up_s:.1f} s starting the processes; {total_s:.1f} s "
          "in all, stopping included) |")
    print(f"| per round, median (min-max) | {np.median(walls['local']):.3f} s | {np.median(walls['loopback']):.3f} s "
          f"({min(walls['loopback']):.3f}-{max(walls['loopback']):.3f}) |")
    print(f"| test macro-F1 | {f1['local']:.4f} | {f1['loopback']:.4f} |")
    print(f"\nmax |local - loopback| over the global parameters: {diff:.3g}; identical histories "
          f"(val_f1 ... per round): {same_history}; best round {local.best_round_} / {remote.best_round_}; "
          f"ratio loopback / local fit: {fit_s / local_s:.2f}; load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dict(command=command, key=args.key, seed=args.seed, rounds=rounds,
                                             local_s=local_s, loopback_fit_s=fit_s, loopback_up_s=up_s,
                                             loopback_total_s=total_s, max_abs_diff=diff, same_history=same_history,
                                             f1=f1, walls=walls), indent=1))
    return 0 if diff == 0 and same_history else 1
