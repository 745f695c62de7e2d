"""
Quick start: the recommended configuration on EEG
=================================================

EEG trials go through pyRiemann's :class:`~pyriemann.estimation.Covariances` (one spatial
covariance matrix per trial) into :class:`~skfedspd.SPDnetClassifier`, with its defaults and
each trial's subject: given the subjects (``groups``), its default ``batchnorm="auto"``
builds domain batch norm, each subject normalized by its own statistics. The score is
subject-aware: :class:`~sklearn.model_selection.GroupKFold` keeps each subject in one fold,
so each test fold is a subject the model never saw, re-centred by its own trials in one call.
The code is the README's quick start, unchanged.

The data are left/right hand imagery of three subjects of the offline PhysioNet EEG, on 16
sensorimotor channels: small sizes, for speed. Below 500 training trials no validation part
is held out (:func:`~skfedspd.validation.uses_validation`), so each fold trains the full
budget of 300 epochs: a few minutes on two CPU cores. Needs the offline data
(``SKFEDSPD_DATA`` or ``<ancestor>/shared/data``, see :doc:`/install`); elsewhere the example
says so and stops. How this model compares with tangent space + logistic regression on more
subjects, with the records: :doc:`/which-configuration`.
"""

# %%
# The offline data
# ----------------
import sys

from skfedspd.datasets import find_physionet_root

if find_physionet_root() is None:
    print("PhysioNet EEG data not found (set SKFEDSPD_DATA to the folder holding "
          "MNE-eegbci-data): this example needs them and stops here.")
    sys.exit(0)

# %%
# The quick start
# ---------------
import sklearn
from pyriemann.estimation import Covariances
from sklearn.model_selection import GroupKFold, cross_val_score
from sklearn.pipeline import make_pipeline

from skfedspd import SPDnetClassifier
from skfedspd.datasets import SENSORIMOTOR_CHANNELS, load_physionet_mi

sklearn.set_config(enable_metadata_routing=True)  # `groups` reaches the splitter and SPDnet's fit

# X: EEG trials (n_trials, n_channels, n_times) in volts, y: labels, subjects: each trial's subject;
# here left/right hand imagery of PhysioNet subjects 1-3, 16 sensorimotor channels
X, y, subjects = load_physionet_mi([1, 2, 3], n_classes=2, channels=SENSORIMOTOR_CHANNELS, return_raw=True)[:3]
clf = make_pipeline(Covariances("scm"), SPDnetClassifier(random_state=0))
scores = cross_val_score(clf, X, y, cv=GroupKFold(3), params={"groups": subjects})
print(scores.mean())  # each test fold is one unseen subject, re-centred by its own trials

# %%
# Against re-centred tangent space + logistic regression
# ------------------------------------------------------
# The same folds for :class:`~skfedspd.Recenter` + TS+LR (pyRiemann), the reference for unseen
# subjects: ``Recenter`` re-centres each training subject by its own mean, and a test subject by
# its own trials. Paired by subject; three subjects are a demonstration, not a measurement.
import numpy as np
from pyriemann.tangentspace import TangentSpace
from sklearn.linear_model import LogisticRegression

from skfedspd import Recenter

reference = make_pipeline(Covariances("scm"), Recenter(), TangentSpace(), LogisticRegression(max_iter=1000))
reference_scores = cross_val_score(reference, X, y, cv=GroupKFold(3), params={"groups": subjects})
test_subjects = [np.unique(subjects[test])[0] for _, test in GroupKFold(3).split(X, y, subjects)]
for s, a, b in zip(test_subjects, scores, reference_scores):
    print(f"unseen subject {s}: SPDnet {a:.2f}, Recenter + TS+LR {b:.2f}")

# %%
# The training curve
# ------------------
# The model of the first fold, refitted to show its history. With 90 training trials nothing
# is held out for validation, so the history's validation scores are NaN: the curve is the
# training loss, over the full budget of epochs.
import matplotlib.pyplot as plt

train, test = next(GroupKFold(3).split(X, y, subjects))
model = clf.fit(X[train], y[train], groups=subjects[train])
network = model[-1]
print(f"batch norm: {network.batchnorm_}; validation part held out: {network.validation_used_}; "
      f"unseen subject {np.unique(subjects[test])[0]}: accuracy {model.score(X[test], y[test]):.2f}")
fig, ax = plt.subplots(figsize=(5.6, 3.4))
ax.plot([h["train_loss"] for h in network.history_])
ax.set(xlabel="epoch", ylabel="training loss", title="SPDnet, domain batch norm, two training subjects")
fig.tight_layout()
plt.show()
