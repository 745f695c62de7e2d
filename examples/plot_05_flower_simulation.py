"""
The same federated run as a Flower simulation
=============================================

`Flower <https://flower.ai>`_ is the framework that runs FedSPDnet across real sites
(:doc:`/guide/deployment`). ``FederatedSPDnetClassifier(backend="flower")`` runs the rounds of
``fit`` as an in-process Flower simulation: a ServerApp with skfedspd's strategy
(:class:`~skfedspd.flower.SPDnetStrategy`) and one virtual SuperNode per client, each running
the same local-training routine as the local backend. Server logic, client selection,
aggregation and seeds are shared, so the two backends give **the same model to the last
bit**: the simulation is the check that the Flower path computes what the local backend
computes, before the sites are real.

Needs the ``flower`` extra: ``pip install "skfedspd[flower]"``.
"""

# %%
import importlib.util
import time

import numpy as np

if importlib.util.find_spec("flwr") is None:
    raise SystemExit("This example needs Flower: pip install 'skfedspd[flower]'")

from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.datasets import make_spd_classification

X, y = make_spd_classification(n_matrices=160, n_channels=8, n_classes=2, separation=2.0, seed=0)
subjects = np.repeat(np.arange(4), 40)

# %%
# One configuration, two backends
# -------------------------------
# Four clients (one per subject), half of them in each round, ProjAvg.
params = dict(estimator=SPDnetClassifier(hidden_dims=(4,), lr=1e-2), aggregation="projavg",
              n_rounds=5, local_epochs=2, clients_per_round=0.5, random_state=0)
fits = {}
for backend in ["local", "flower"]:
    start = time.perf_counter()
    fits[backend] = FederatedSPDnetClassifier(backend=backend, **params).fit(X, y, groups=subjects)
    print(f"{backend:6s} backend: {time.perf_counter() - start:5.1f} s, "
          f"training accuracy {fits[backend].score(X, y):.3f}")

# %%
# Bit-identical models
# --------------------
# The global parameters (BiMap Stiefel weights, the linear head) and the round history agree
# exactly: same clients drawn, same local minibatches, same aggregation. With 160 trials no
# validation part is held out (below 50 validation trials, see
# :func:`~skfedspd.validation.uses_validation`): the rounds' validation scores are NaN on both
# backends, so the history is compared on the clients drawn and the training losses.
local, flower = (fits[b].global_estimator_.module_.get_parameters() for b in ["local", "flower"])
print("parameters identical:", all(np.array_equal(local[name], flower[name]) for name in local))
print("clients per round:   ", [r["clients"] for r in fits["flower"].history_])
same_clients = [r["clients"] for r in fits["local"].history_] == [r["clients"] for r in fits["flower"].history_]
losses = {b: np.array([r["train_loss"] for r in fits[b].history_], dtype=float) for b in fits}
print("same history:        ", same_clients and np.array_equal(losses["local"], losses["flower"], equal_nan=True))

# %%
# What the Flower run adds is the message passing: the server only ever receives each
# client's parameters, its training loss and its validation scores, never a sample. On a
# deployment, each site's SuperNode reads its own data file; see the next example and
# :doc:`/guide/deployment`.
