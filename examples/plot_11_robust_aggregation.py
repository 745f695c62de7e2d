"""
A faulty site: the FLTrust gate against plain ProjAvg
=====================================================

One site of a federation trains on broken data (here its labels are swapped, as a site with
a mislabelled export would), and its updates pull the shared model away from what the other
sites learn. A robust aggregation rule limits what such a site can do. The rule the
robust-aggregation benchmark recommends is the *FLTrust gate* (:doc:`/guide/robust-aggregation`,
:doc:`/benchmarks/robust-aggregation`): the server holds a small clean *root set*, trains its own
reference update on it each round, gives no weight to a site whose update disagrees with it
(layer by layer, ``agreement_scope="layer"``, ``trust="accept"``) and cuts every update to
the reference's length (``magnitude="bounded"``).

Four sites of two subjects each (left/right hand imagery of the offline PhysioNet EEG, 16
sensorimotor channels), the first with its labels swapped; two other subjects are the
server's root set. Each rule is scored on the held-out trials of the three honest sites. The
sizes (eight subjects in four sites, 80 rounds as in the benchmark's left/right setting) are
small for speed: one seed, a demonstration, not a measurement; the measured figures, paired
over seeds, are on :doc:`/benchmarks/robust-aggregation`. Needs the offline data
(``SKFEDSPD_DATA``, see :doc:`/install`); elsewhere the example says so and stops.
"""

# %%
# Sites, a faulty one, and the server's root set
# ----------------------------------------------
import sys

import matplotlib.pyplot as plt
import numpy as np
from sklearn.metrics import balanced_accuracy_score
from sklearn.model_selection import train_test_split

from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.aggregation import FLTrust
from skfedspd.clients import ClientPartition
from skfedspd.datasets import SENSORIMOTOR_CHANNELS, find_physionet_root, load_physionet_mi

if find_physionet_root() is None:
    print("PhysioNet EEG data not found (set SKFEDSPD_DATA to the folder holding "
          "MNE-eegbci-data): this example needs them and stops here.")
    sys.exit(0)

SITES = [1, 2, 3, 4, 5, 6, 7, 8]  # sites of two subjects: (1, 2) faulty, (3, 4), (5, 6), (7, 8)
ROOT = [9, 10]  # the server's clean root set
X, y, subjects = load_physionet_mi(SITES + ROOT, n_classes=2, channels=SENSORIMOTOR_CHANNELS)[:3]
root = np.isin(subjects, ROOT)
X_root, y_root = X[root], y[root]

# Each site subject keeps 20 % of its trials for the test.
site_trials = np.flatnonzero(~root)
train_idx, test_idx = train_test_split(site_trials, test_size=0.2, random_state=0,
                                       stratify=[f"{s}-{c}" for s, c in zip(subjects[site_trials], y[site_trials])])
faulty = np.isin(subjects, [1, 2])
y_sites = y.copy()
classes = np.unique(y)
y_sites[faulty] = np.where(y[faulty] == classes[0], classes[1], classes[0])  # the faulty site's swapped labels
honest_test = test_idx[~faulty[test_idx]]
print(f"{len(train_idx)} training trials in 4 sites (the first faulty), root set of {len(y_root)} trials, "
      f"{len(honest_test)} test trials of the honest sites")

# %%
# Two federations, the same sites
# -------------------------------
# The package's default federation (local ``SPDnetClassifier()``, kept client Adam) with
# ProjAvg, the plain average, and with the FLTrust gate. On about fifty test trials and one
# seed, a few points between the two scores are noise: what a single run shows is the
# diagnosis below.
rules = {
    "ProjAvg": "projavg",
    "FLTrust gate": FLTrust(X_root, y_root, agreement_scope="layer", trust="accept", magnitude="bounded"),
}
fits = {}
for name, rule in rules.items():
    fits[name] = FederatedSPDnetClassifier(
        SPDnetClassifier(), aggregation=rule, clients=ClientPartition(groups_per_client=2), n_rounds=80,
        random_state=0,
    ).fit(X[train_idx], y_sites[train_idx], groups=subjects[train_idx])
    score = balanced_accuracy_score(y[honest_test], fits[name].predict(X[honest_test]))
    print(f"{name:12s}: balanced accuracy on the honest sites' test trials {score:.2f}")

# %%
# What the server saw
# -------------------
# Under the FLTrust gate, ``history_`` gives each round's sites whose share of the aggregate
# fell below half their weight (``downweighted_clients``), and each site's agreement with the
# reference update. ``client_trust_`` sums the fit up per site (1: as close to the consensus
# as the typical site); the lowest trust comes first in ``np.argsort``.
gate = fits["FLTrust gate"]
gated = [sorted(r["downweighted_clients"]) for r in gate.history_]
print("rounds where site 0 was set aside:", sum(0 in g for g in gated), "of", len(gated))
print("trust per site:", np.round(gate.client_trust_, 2), "suspects first:", np.argsort(gate.client_trust_))

fig, ax = plt.subplots(figsize=(6, 3.5))
agreement = np.array([r["client_agreement"] for r in gate.history_], dtype=float)
for site in range(agreement.shape[1]):
    ax.plot([r["round"] for r in gate.history_], agreement[:, site],
            label=f"site {site}" + (" (labels swapped)" if site == 0 else ""))
ax.axhline(0, color="k", ls=":", lw=1)
ax.set(xlabel="round", ylabel="agreement with the reference update",
       title="FLTrust gate: a site below 0 gets no weight")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
