"""pyRiemann 0.12's classifier battery, ported for our classifiers.

Source: pyRiemann v0.12 (commit 8a3395b7, "prepare release 0.12"),
``tests/test_classification.py::test_classifier`` and the ``clf_*`` checks it calls, with the
fixtures of ``tests/conftest.py`` it uses (``rndstate``, ``get_mats``, ``get_labels``,
``get_weights``; numpy backend, since the module is marked ``numpy_only`` there). Kind "spd"
only: our classifiers take real SPD matrices, not HPD ones.

pyRiemann's conftest calls ``torch.set_grad_enabled(False)`` at import, for the whole session:
the ``grad_off`` fixture below reproduces that for every test of this module (and restores the
caller's mode afterwards so that it does not leak into other test modules). Training must not
depend on torch's global grad mode.

The classifiers are built with their DEFAULT constructors, as pyRiemann builds its own.
"""

import numpy as np
import pytest
import torch
from numpy.testing import assert_array_equal
from pyriemann.datasets import make_matrices
from pyriemann.estimation import Covariances
from pytest import approx
from sklearn.model_selection import KFold, cross_val_score
from sklearn.pipeline import make_pipeline

from skfedspd import SPDnetClassifier
from skfedspd.federated import FederatedSPDnetClassifier

classifs = [SPDnetClassifier, FederatedSPDnetClassifier]


# ------------------------------------------------------------------ pyRiemann's conftest (numpy backend)
@pytest.fixture(autouse=True)
def grad_off():
    previous = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    yield
    torch.set_grad_enabled(previous)


@pytest.fixture
def rndstate():
    return np.random.RandomState(1234)


@pytest.fixture
def get_mats(rndstate):
    def _gen_mat(n_matrices, n_dim, kind):
        return make_matrices(n_matrices, n_dim, kind, rndstate, return_params=False)

    return _gen_mat


@pytest.fixture
def get_weights(rndstate):
    def _gen_weight(n_matrices):
        return 1 + rndstate.rand(n_matrices)

    return _gen_weight


@pytest.fixture
def get_labels():
    def _get_labels(n_matrices, n_classes):
        if n_matrices % n_classes != 0:
            raise ValueError("Number of matrices must be divisible by number of classes.")
        return np.arange(n_classes).repeat(n_matrices // n_classes)

    return _get_labels


# ------------------------------------------------------------------ test_classifier, as in pyRiemann 0.12
@pytest.mark.parametrize("kind", ["spd"])
@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("classif", classifs)
def test_classifier(kind, n_classes, classif, get_mats, get_labels, get_weights):
    if n_classes == 2:
        n_matrices, n_channels = 6, 3
    else:
        assert n_classes == 3
        n_matrices, n_channels = 9, 3
    X = get_mats(n_matrices, n_channels, kind)
    y = get_labels(n_matrices, n_classes)
    weights = get_weights(n_matrices)

    clf_fit(classif, X, y, weights)
    clf_predict(classif, X, y)
    clf_fit_independence(classif, X, y)
    clf_predict_proba(classif, X, y)
    clf_score(classif, X, y)
    clf_populate_classes(classif, X, y)
    if hasattr(classif(), "n_jobs"):
        clf_jobs(classif, X, y)
    if hasattr(classif(), "tsupdate"):
        clf_tsupdate(classif, X, y)
    clf_pipeline(classif, y, get_mats)


def clf_fit(classif, X, y, weights):
    n_classes = len(np.unique(y))
    clf = classif().fit(X, y)
    assert clf.classes_.shape == (n_classes,)
    assert_array_equal(clf.classes_, np.unique(y))

    clf.fit(X, y, sample_weight=weights)


def clf_predict(classif, X, y):
    n_matrices = len(y)
    clf = classif()
    pred = clf.fit(X, y).predict(X)
    assert pred.shape == (n_matrices,)


def clf_predict_proba(classif, X, y):
    n_matrices, n_classes = len(y), len(np.unique(y))
    clf = classif()
    if hasattr(clf, "probability"):
        clf.set_params(**{"probability": True})
    prob = clf.fit(X, y).predict_proba(X)
    assert prob.shape == (n_matrices, n_classes)
    assert prob.sum(axis=1) == approx(np.ones(n_matrices))


def clf_score(classif, X, y):
    clf = classif()
    score = clf.fit(X, y).score(X, y)
    assert isinstance(score, float)


def clf_fit_independence(classif, X, y):
    clf = classif()
    clf.fit(X, y).predict(X)
    # retraining with different size should erase previous fit
    Xnew = X[:, :-1, :-1]
    clf.fit(Xnew, y).predict(Xnew)


def clf_jobs(classif, X, y):
    clf = classif(n_jobs=2)
    clf.fit(X, y).predict(X)


def clf_populate_classes(classif, X, y):
    clf = classif()
    clf.fit(X, y)
    assert_array_equal(clf.classes_, np.unique(y))


def clf_tsupdate(classif, X, y):
    clf = classif(tsupdate=True)
    clf.fit(X, y).predict(X)


def clf_pipeline(classif, labels, get_mats):
    n_matrices, n_channels, n_times = len(labels), 3, 100
    X = get_mats(n_matrices, [n_channels, n_times], "real")

    clf = classif()
    if hasattr(clf, "probability"):
        clf.set_params(**{"probability": True})

    pip = make_pipeline(Covariances(estimator="scm"), clf)
    pip.fit(X, labels)
    pip.predict(X)
    pip.predict_proba(X)
    cross_val_score(pip, X, labels, cv=KFold(n_splits=3), scoring="accuracy", n_jobs=1)
