"""
A Flower deployment on one machine: SuperLink, SuperNodes and ``fit_federated``
===============================================================================

On a real deployment each site runs a Flower **SuperNode** next to its data, the server runs
a **SuperLink**, and the researcher submits the run with
:func:`skfedspd.flower.fit_federated`; the fitted model comes back as a
:class:`~skfedspd.FederatedSPDnetClassifier` (:doc:`/guide/deployment` has the multi-machine set-up,
TLS included). :class:`~skfedspd.flower.loopback.LoopbackDeployment` starts the same processes
on 127.0.0.1, one per site and one for the SuperLink, each with its own Flower home, and stops
them (by PID) when the ``with`` block ends: the way to try a deployment before going
multi-machine.

Here two sites hold one subject each. Starting the processes takes a while (each imports
torch and skfedspd), so the run is kept to two rounds.
Needs the ``flower`` extra: ``pip install "skfedspd[flower]"``.
"""

# %%
# One data file per site
# ----------------------
# A site's SuperNode is started with the path of its own ``.npz`` file (arrays ``X`` and
# ``y``) in its node configuration; the path never leaves the site.
import importlib.util
import tempfile
import time
from pathlib import Path

import numpy as np
from sklearn.base import clone

if importlib.util.find_spec("flwr") is None:
    raise SystemExit("This example needs Flower: pip install 'skfedspd[flower]'")

from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.datasets import make_spd_classification
from skfedspd.flower import fit_federated
from skfedspd.flower.loopback import LoopbackDeployment

X, y = make_spd_classification(n_matrices=80, n_channels=6, n_classes=2, separation=2.0, seed=0)
subjects = np.repeat([0, 1], 40)
workdir = Path(tempfile.mkdtemp(prefix="skfedspd-loopback-example-"))
site_paths = []
for site in (0, 1):
    path = workdir / f"site{site}.npz"
    np.savez(path, X=X[subjects == site], y=y[subjects == site])
    site_paths.append(path)

# %%
# Train on the deployment
# -----------------------
# The estimator is the run's configuration; ``fit_federated`` writes the Flower App, submits
# it to the SuperLink with ``flwr run``, waits for the ServerApp to write the fitted model and
# loads it. The server's log goes to a file (``quiet=True``).
fed = FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=(4,), lr=1e-2), aggregation="rlavg",
                                n_rounds=2, local_epochs=2, random_state=0)
start = time.perf_counter()
with LoopbackDeployment(site_paths, root=workdir / "flower") as deployment:
    print(f"SuperLink at {deployment.address}, {len(site_paths)} SuperNodes "
          f"(PIDs {sorted(p.pid for p in deployment.processes.values())})")
    remote = fit_federated(fed, deployment.address, n_sites=len(site_paths), output=workdir / "model.skfedspd",
                           insecure=True, quiet=True, log_path=workdir / "server.log",
                           round_timeout=300, connect_timeout=300, timeout=900)
print(f"deployment run: {time.perf_counter() - start:.0f} s (process start-up included)")
print("clients:", remote.client_source_, [r["clients"] for r in remote.history_])

# %%
# The same model as the local backend
# -----------------------------------
# Client ``i`` is the SuperNode started with ``client-id=i``; with the same configuration the
# local backend, given the subjects as groups, computes the same rounds.
local = clone(fed).fit(X, y, groups=subjects)
print("identical predictions:", np.array_equal(local.predict_proba(X), remote.predict_proba(X)))

# %%
# What the server saw: its log names the strategy and the rounds, never a site's file.
server_log = (workdir / "server.log").read_text()
print("data paths in the server log:", any(str(p) in server_log for p in site_paths))
