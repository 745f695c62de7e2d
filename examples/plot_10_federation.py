"""
A federation of sites on unseen subjects: FedSPDnet with domain batch norm against Recenter + TS+LR
===================================================================================================

Three sites (hospitals, labs) each hold the recordings of two subjects and never send them
anywhere: :class:`~skfedspd.FederatedSPDnetClassifier` trains one SPDnet across the sites
by federated rounds, each site a client, in the recommended configuration
(:doc:`/which-configuration`): domain batch normalization
(``SPDnetClassifier(batchnorm="domain")``: each site's data are re-centred by their own
mean, ``domains="client"``), server momentum (``ServerMomentum(lr=1.0, momentum=0.9)``) and
a fresh client Adam every round (``client_optimizer_state="reset"``). The shared model then decodes subjects that no site holds,
each subject's unlabeled trials re-centred by their own mean in one call. The reference is
re-centred tangent space + logistic regression (``Recenter`` + TS+LR), trained on the same
subjects pooled in one place, which a federation does not need.

The comparison is paired: both decoders score the same held-out subjects, and the difference
is taken subject by subject, with its standard error.

This is a **demonstration size** (six training subjects, four held-out subjects, 21
channels, 50 rounds where the benchmark runs 150), small enough for a documentation build on
two cores: whatever the reading printed below, four subjects are a demonstration, not a
measurement (their standard error has three degrees of freedom, and four subjects say little
about the next ones). The measured figures (40 subjects, ``GroupKFold(5)``, paired by
subject, with their command) are on :doc:`/benchmarks/unseen-subjects`.

The data are left/right hand imagery of the offline PhysioNet EEG where they are present
(``SKFEDSPD_DATA``, see :doc:`/install`); elsewhere a small synthetic set with a shift per
subject stands in for them, and the example says so.
"""

# %%
# Data: six subjects in three sites, four subjects held out
# ---------------------------------------------------------
import matplotlib.pyplot as plt
import numpy as np
import sklearn
from pyriemann.tangentspace import TangentSpace
from scipy.linalg import expm
from scipy.stats import t as student_t
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score
from sklearn.pipeline import make_pipeline

from skfedspd import FederatedSPDnetClassifier, Recenter, SPDnetClassifier
from skfedspd.clients import ClientPartition
from skfedspd.datasets import find_physionet_root, load_physionet_mi, make_spd_classification
from skfedspd.server_optimizer import ServerMomentum

TRAIN_SUBJECTS = [1, 2, 3, 4, 5, 6]  # sites of two subjects: (1, 2), (3, 4), (5, 6)
HELD_OUT = [7, 8, 9, 10]


def synthetic_subjects(subject_ids, n_trials=45, n_channels=8):
    """Two-class SPD matrices with one class structure for all subjects, each subject's
    moved by its own congruence ``A X Aᵀ`` (the shift re-centring removes)."""
    rng = np.random.default_rng(0)
    X, y = make_spd_classification(n_matrices=n_trials * len(subject_ids), n_channels=n_channels,
                                   n_classes=2, seed=0, separation=1.3)
    parts = []
    for i, s in enumerate(subject_ids):
        S = rng.standard_normal((n_channels, n_channels))
        A = expm(0.3 * (S + S.T))
        trials = slice(i * n_trials, (i + 1) * n_trials)
        parts.append((A @ X[trials] @ A.T, y[trials], np.full(n_trials, s)))
    return tuple(np.concatenate(a) for a in zip(*parts))


if find_physionet_root() is not None:
    X, y, subjects, meta = load_physionet_mi(subjects=TRAIN_SUBJECTS + HELD_OUT, n_classes=2)
    # The 21 channels over the sensorimotor cortex, out of 64.
    motor = [f"{row}{col}" for row in ("FC", "C", "CP") for col in ("5", "3", "1", "z", "2", "4", "6")]
    picks = [meta.attrs["ch_names"].index(name) for name in motor]
    X = X[:, picks][:, :, picks]
    print(f"PhysioNet EEG: {len(X)} trials of {len(np.unique(subjects))} subjects, covariances {X.shape[1:]}")
else:
    X, y, subjects = synthetic_subjects(TRAIN_SUBJECTS + HELD_OUT)
    print("PhysioNet EEG data not found: a synthetic set of 10 shifted subjects stands in for them.")

train = np.isin(subjects, TRAIN_SUBJECTS)

# %%
# The federation and the pooled reference
# ---------------------------------------
# ``clients=ClientPartition(groups_per_client=2)`` makes each pair of training subjects one
# site (client). Each round, every site trains the current model for two local epochs on its
# own trials with a fresh Adam, the server averages the sites' networks on the Stiefel manifold
# (ProjAvg) and steps along that averaged update with momentum (FedAvgM on the manifold); no
# trial leaves its site.
# At the end, the model's prior for a new domain is computed from the training data.
fed = FederatedSPDnetClassifier(
    SPDnetClassifier(batchnorm="domain"), clients=ClientPartition(groups_per_client=2),
    server_optimizer=ServerMomentum(lr=1.0, momentum=0.9), client_optimizer_state="reset", n_rounds=50,
    random_state=0,
)
fed.fit(X[train], y[train], groups=subjects[train])
print(f"{fed.n_clients_} sites, {len(fed.history_)} rounds, model of round {fed.best_round_} kept")

# Metadata routing sends ``groups`` to ``Recenter`` at fit: each training subject is
# re-centred by its own mean.
recentered = make_pipeline(Recenter(), TangentSpace(), LogisticRegression(max_iter=1000))
with sklearn.config_context(enable_metadata_routing=True):
    recentered.fit(X[train], y[train], groups=subjects[train])

# %%
# Each held-out subject in its own call
# -------------------------------------
# Without a ``domain``, one call is one temporary domain: the subject's trials are re-centred
# by their own mean (each trial by the others'), by both decoders.
scores = {"FedSPDnet + domain BN": [], "Recenter + TS+LR": []}
for s in HELD_OUT:
    subject = subjects == s
    scores["FedSPDnet + domain BN"].append(balanced_accuracy_score(y[subject], fed.predict(X[subject])))
    scores["Recenter + TS+LR"].append(balanced_accuracy_score(y[subject], recentered.predict(X[subject])))
scores = {name: 100 * np.array(values) for name, values in scores.items()}
for i, s in enumerate(HELD_OUT):
    print(f"subject {s:2d}: " + ", ".join(f"{name} {values[i]:.1f}" for name, values in scores.items()))

# %%
# The paired difference
# ---------------------
# Subject by subject, the federation minus the reference; its mean ± standard error. A
# difference within the two-sided 95 % t critical value (3.18 with four subjects) times its
# standard error of zero is read as level, not as a win.
difference = scores["FedSPDnet + domain BN"] - scores["Recenter + TS+LR"]
se = difference.std(ddof=1) / np.sqrt(len(difference))
critical = student_t.ppf(0.975, len(difference) - 1)
reading = "level" if abs(difference.mean()) <= critical * se else ("higher" if difference.mean() > 0 else "lower")
print(f"FedSPDnet + domain BN − Recenter + TS+LR: {difference.mean():+.1f} ± {se:.1f} balanced-accuracy points "
      f"(higher on {np.sum(difference > 0)} of {len(difference)} subjects): {reading}, "
      f"on {len(difference)} subjects only")

fig, ax = plt.subplots(figsize=(5.6, 3.8))
names = list(scores)
for i in range(len(HELD_OUT)):
    ax.plot([0, 1], [scores[names[0]][i], scores[names[1]][i]], color="0.6", marker="o")
ax.plot([0, 1], [scores[names[0]].mean(), scores[names[1]].mean()], color="C0", marker="s", lw=2.5, label="mean")
ax.axhline(50, color="k", ls=":", lw=1)
ax.set_xticks([0, 1], names)
ax.set_xlim(-0.4, 1.4)
ax.set_ylabel("balanced accuracy of a held-out subject (%)")
ax.set_title(f"{len(HELD_OUT)} held-out subjects, paired: {difference.mean():+.1f} ± {se:.1f} ({reading})", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
