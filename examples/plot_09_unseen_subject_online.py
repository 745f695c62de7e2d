"""
An unseen subject, whole recording and online: domain batch norm against Recenter + TS+LR
=========================================================================================

A decoder trained on some subjects meets a new one without labels. Its trials are shifted as
a whole (another head, another cap), which re-centring removes:
``SPDnetClassifier(batchnorm="domain")`` re-centres inside the network, each training subject
a domain; ``Recenter`` + tangent space + logistic regression (TS+LR) re-centres before a
linear model. Both are scored on the new subject's whole recording in one call, then as an
online BCI does: trial by trial, each prediction updating the subject's statistics, with the
learning curve plotted.

The data are left/right hand imagery of 14 subjects of the offline PhysioNet EEG (21
sensorimotor channels) where they are present (``SKFEDSPD_DATA``, see :doc:`/install`);
elsewhere a small synthetic set with a shift per subject, and the example says so. How the
two compare on 40 subjects, paired by subject: :doc:`/which-configuration`.
"""

# %%
# Data: trained on all subjects but the last, which is unseen
# -----------------------------------------------------------
import matplotlib.pyplot as plt
import numpy as np
import sklearn
from pyriemann.tangentspace import TangentSpace
from scipy.linalg import expm
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from skfedspd import Recenter, SPDnetClassifier
from skfedspd.datasets import find_physionet_root, load_physionet_mi, make_spd_classification


def synthetic_subjects(n_subjects=14, n_trials=45, n_channels=8):
    """Two-class SPD matrices, each subject's moved by its own congruence ``A X Aᵀ``."""
    rng = np.random.default_rng(0)
    parts = []
    for s in range(n_subjects):
        X, y = make_spd_classification(n_matrices=n_trials, n_channels=n_channels, n_classes=2, seed=s)
        S = rng.standard_normal((n_channels, n_channels))
        A = expm(0.3 * (S + S.T))
        parts.append((A @ X @ A.T, y, np.full(n_trials, s + 1)))
    return tuple(np.concatenate(a) for a in zip(*parts))


if find_physionet_root() is not None:
    X, y, subjects, meta = load_physionet_mi(subjects=range(1, 15), n_classes=2)
    motor = [f"{row}{col}" for row in ("FC", "C", "CP") for col in ("5", "3", "1", "z", "2", "4", "6")]
    picks = [meta.attrs["ch_names"].index(name) for name in motor]
    X = X[:, picks][:, :, picks]
    print(f"PhysioNet EEG: {len(X)} trials of 14 subjects, covariances {X.shape[1:]}")
else:
    X, y, subjects = synthetic_subjects()
    print("PhysioNet EEG data not found: a synthetic set of 14 shifted subjects stands in for them.")

# 13 training subjects give more than 500 training trials: enough for the network's default
# validation part and early stopping.
new = subjects == 14
train = ~new

# %%
# Two re-centring decoders, and TS+LR without re-centring
# -------------------------------------------------------
# Metadata routing sends ``groups`` to ``Recenter`` at fit and ``domain`` to it at predict.
spdnet = SPDnetClassifier(batchnorm="domain", random_state=0).fit(X[train], y[train], groups=subjects[train])
recentered = make_pipeline(Recenter(), TangentSpace(), LogisticRegression(max_iter=1000))
with sklearn.config_context(enable_metadata_routing=True):
    recentered.fit(X[train], y[train], groups=subjects[train])
plain = make_pipeline(TangentSpace(), LogisticRegression(max_iter=1000)).fit(X[train], y[train])

# %%
# The whole recording in one call
# -------------------------------
# Without a ``domain``, one call is one temporary domain: the new subject's trials are
# re-centred by their own mean (each trial by the others').
whole = {"SPDnet + domain BN": spdnet.score(X[new], y[new]),
         "Recenter + TS+LR": recentered.score(X[new], y[new]),
         "TS+LR": plain.score(X[new], y[new])}
for name, score in whole.items():
    print(f"whole recording, {name}: accuracy {score:.2f}")

# %%
# Online, trial by trial
# ----------------------
# Each call predicts one trial with the statistics of the trials before it (the first with
# the prior learned from the training subjects), then adds the trial to them.
with sklearn.config_context(enable_metadata_routing=True):
    online = {"SPDnet + domain BN": [spdnet.predict(x[None], domain="new subject")[0] for x in X[new]],
              "Recenter + TS+LR": [recentered.predict(x[None], domain="new subject")[0] for x in X[new]],
              "TS+LR": plain.predict(X[new])}
trials = np.arange(1, new.sum() + 1)
fig, ax = plt.subplots(figsize=(6.4, 4.0))
for i, (name, predicted) in enumerate(online.items()):
    running = np.cumsum(np.asarray(predicted) == y[new]) / trials
    ax.plot(trials, running, color=f"C{i}", label=f"{name}, online")
    ax.axhline(whole[name], color=f"C{i}", ls=":", lw=1)
ax.set_xlabel("trials of the new subject predicted")
ax.set_ylabel("accuracy so far")
ax.set_title("Unseen subject, online (dotted: the whole recording in one call)", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
