"""
Quick start: a scikit-learn Pipeline from EEG trials to SPDnet
==============================================================

EEG trials go through pyRiemann's :class:`~pyriemann.estimation.Covariances` (one spatial
covariance matrix per trial) into :class:`~skfedspd.SPDnetClassifier`, the SPDnet classifier,
like any scikit-learn estimator: ``fit``, ``predict``, ``score``, cross-validation.

The trials here are simulated (8 channels, 3 classes, each class raising the power of its
own group of sources), so the example runs anywhere in seconds. With real EEG, replace
``X, y`` by your epochs, e.g. from :func:`skfedspd.datasets.load_physionet_mi` with
``return_raw=True``.
"""

# %%
# Simulated EEG trials
# --------------------
# ``n_sources`` independent sources are mixed into ``n_channels`` channels by a fixed random
# matrix; class ``k`` multiplies the variance of its group of sources by 1.5. The information is
# in the spatial covariance of the channels, which is what SPDnet learns from.
import matplotlib.pyplot as plt
import numpy as np
from pyriemann.estimation import Covariances
from pyriemann.tangentspace import TangentSpace
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import ConfusionMatrixDisplay
from sklearn.model_selection import cross_val_score, train_test_split
from sklearn.pipeline import make_pipeline

from skfedspd import SPDnetClassifier

rng = np.random.default_rng(0)
n_trials, n_channels, n_times, n_classes = 300, 8, 64, 3
mixing = rng.standard_normal((n_channels, n_channels))
y = np.arange(n_trials) % n_classes
gain = np.ones((n_trials, n_channels))
for k, group in enumerate(np.array_split(np.arange(n_channels), n_classes)):
    gain[np.ix_(y == k, group)] = np.sqrt(1.5)
sources = gain[:, :, None] * rng.standard_normal((n_trials, n_channels, n_times))
X = 1e-5 * (mixing @ sources)  # volts, as MOABB returns EEG
print(X.shape, np.bincount(y))

# %%
# Fit and score a pipeline
# ------------------------
# ``scaling="auto"`` (the default) rescales the covariances (volts²) by one scalar fitted on
# the training data, so ReEig's threshold ``eps`` acts on eigenvalues of order 1.
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, stratify=y, random_state=0)
spdnet = make_pipeline(
    Covariances("oas"),
    SPDnetClassifier(hidden_dims=(6,), lr=1e-2, max_epochs=40, random_state=0),
)
spdnet.fit(X_train, y_train)
print(f"SPDnet test accuracy: {spdnet.score(X_test, y_test):.3f}")

# %%
# The fitted classifier keeps its training history: one record per epoch with the training
# loss and the macro-F1 on its internal validation split (``validation_fraction``), which
# drives early stopping and the learning-rate schedule.
clf = spdnet[-1]
history = clf.history_
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
ax1.plot([h["train_loss"] for h in history])
ax1.set(xlabel="epoch", ylabel="training loss")
ax2.plot([h["val_f1"] for h in history])
ax2.axvline(clf.best_epoch_, color="k", ls=":", label="best epoch")
ax2.set(xlabel="epoch", ylabel="validation macro-F1")
ax2.legend()
fig.tight_layout()

# %%
# Predictions on the test trials.
display = ConfusionMatrixDisplay.from_estimator(spdnet, X_test, y_test, colorbar=False)
display.ax_.set_title("SPDnet on held-out trials")
plt.tight_layout()

# %%
# Cross-validation and a Riemannian baseline
# ------------------------------------------
# The pipeline is a regular scikit-learn estimator: :func:`~sklearn.model_selection.cross_val_score`
# clones and refits it on each fold. Tangent space + logistic regression (pyRiemann) is the
# usual baseline on covariance matrices.
baseline = make_pipeline(Covariances("oas"), TangentSpace(), LogisticRegression(max_iter=1000))
for name, pipeline in [("SPDnet", spdnet), ("TS + LR", baseline)]:
    scores = cross_val_score(pipeline, X, y, cv=3)
    print(f"{name:8s} 3-fold accuracy: {scores.mean():.3f} ± {scores.std():.3f}")
