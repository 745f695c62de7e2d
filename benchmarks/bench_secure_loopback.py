"""Secure aggregation on the loopback deployment: plain vs ``secure_aggregation=True``.

A SuperLink and 3 SuperNodes on 127.0.0.1 (:class:`skfedspd.flower.loopback.LoopbackDeployment`),
the tests' synthetic SPD problem (90 matrices 6x6, 3 classes, one site per third), SPDnet
BiMap 3, 2 rounds x 1 local epoch; the run by ``fit_federated`` plain, then with
``secure_aggregation=True`` on the same deployment. Prints each run's per-round wall times
(``history_[*]["wall_time"]``), the whole fit, and the largest difference from the local
backend's global model.

Usage::

    cd benchmarks && PYTHONPATH=.. python bench_secure_loopback.py /tmp/secure-loopback [--record NAME]

Writes the record ``speed-secure-loopback`` (``--record NAME``; ``none``: no record): each run's
round wall times (units: rounds), the largest difference from the local backend as facts.
"""
import os, sys, time
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"; os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from pathlib import Path
import numpy as np
from conftest import make_spd_dataset
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the benchmarks package
from benchmarks.records.speed import write_speed_record
started = time.perf_counter()
record = sys.argv[sys.argv.index("--record") + 1] if "--record" in sys.argv else "speed-secure-loopback"
from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.clients import ClientPartition
from skfedspd.flower import fit_federated
from skfedspd.flower.loopback import LoopbackDeployment
tmp = Path(sys.argv[1]); tmp.mkdir(parents=True, exist_ok=True)
X, y = make_spd_dataset(n_matrices=90, n_channels=6, n_classes=3, seed=0)
groups = np.arange(90) % 3
paths = []
for g in range(3):
    p = tmp / f"site{g}.npz"; np.savez(p, X=X[groups == g], y=y[groups == g]); paths.append(p)
def fed():
    return FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=(3,), batch_size=8, lr=0.05), n_rounds=2,
                                     local_epochs=1, clients=ClientPartition(n_clients=3), random_state=0)
local = fed().fit(X, y, groups=groups)
with LoopbackDeployment(paths, root=tmp / "flower") as dep:
    out = {}
    for secure in (False, True):
        t = time.perf_counter()
        try:
            m = fit_federated(fed(), dep.address, 3, tmp / f"model{secure}.skfedspd", insecure=True, round_timeout=300,
                              connect_timeout=120, timeout=900, quiet=True, log_path=tmp / f"run{secure}.log",
                              secure_aggregation=secure, overwrite=True)
        except Exception:
            for name in dep.processes:
                print(f"---- {name}\n{dep.log(name)[-3000:]}")
            raise
        out[secure] = (m, time.perf_counter() - t)
facts = {}
for secure, (m, total) in out.items():
    diff = max(np.abs(m.engine_.global_params[n] - local.engine_.global_params[n]).max() for n in m.engine_.global_params)
    print(f"secure={secure}: per round {[round(r['wall_time'], 2) for r in m.history_]} s, fit {total:.1f} s, "
          f"max |Δ| vs local {diff:.1e}")
    facts[f"max_difference_from_local_{'secure' if secure else 'plain'}"] = f"{diff:.1e}"
write_speed_record(record, title="Secure aggregation on a loopback deployment, 3 sites",
                   times={("secure" if s else "plain"): [r["wall_time"] for r in m.history_] for s, (m, _) in out.items()},
                   reference="plain", started=started, metric="s", description="seconds per round", facts=facts)
