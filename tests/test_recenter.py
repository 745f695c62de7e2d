"""Tests for ``skfedspd.Recenter``: each group's Riemannian mean becomes the identity
(checked with pyRiemann's ``mean_riemann``), congruence equivariance, Pipelines with
pyRiemann's TangentSpace and with SPDnetClassifier, metadata routing of ``groups`` through
Pipeline / GridSearchCV / cross_validate with GroupKFold, bad inputs, clone and pickle."""

import pickle
import warnings

import numpy as np
import pytest
import sklearn
from pyriemann.geometry.mean import mean_riemann
from pyriemann.tangentspace import TangentSpace
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, GroupKFold, cross_validate
from sklearn.pipeline import make_pipeline

from skfedspd import Recenter, SPDnetClassifier
from skfedspd.recenter import recenter_groups

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _random_congruence(n, rng):
    """A well-conditioned random invertible matrix (a domain's 'mixing')."""
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (Q * rng.uniform(0.3, 3.0, n)) @ np.linalg.qr(rng.standard_normal((n, n)))[0]


def _sqrtm(M, p):
    lam, U = np.linalg.eigh(M)
    return (U * lam**p) @ U.T


def _identity_error(X):
    return np.abs(mean_riemann(X, tol=1e-12, maxiter=200) - np.eye(X.shape[-1])).max()


@pytest.mark.parametrize("n_groups", [1, 2, 4])
@pytest.mark.parametrize("n_channels", [2, 5, 8])
def test_each_group_mean_is_identity(spd_domains, n_groups, n_channels):
    X, _, groups = spd_domains(n_groups=n_groups, n_channels=n_channels)
    Y = Recenter().fit_transform(X, groups=groups)
    assert Y.shape == X.shape
    np.testing.assert_array_equal(Y, Y.transpose(0, 2, 1))
    for g in np.unique(groups):
        assert _identity_error(Y[groups == g]) < 1e-8
    if n_groups > 1:  # the groups had different means before
        assert _identity_error(X[groups == 0]) > 1e-2


def test_whitening_uses_the_riemannian_mean(spd_dataset):
    """Output = M^{-1/2} X M^{-1/2} with M from pyRiemann's mean_riemann (an independent oracle)."""
    X, _ = spd_dataset(n_matrices=20, n_channels=5, seed=3)
    M = mean_riemann(X, tol=1e-12, maxiter=200)
    lam, U = np.linalg.eigh(M)
    W = (U / np.sqrt(lam)) @ U.T
    np.testing.assert_allclose(Recenter().fit_transform(X), W @ X @ W, rtol=1e-9, atol=1e-10)


def test_no_groups_is_one_group(spd_domains):
    """transform(X): X one temporary domain, re-centred by the running mean of the prior
    (weighing 1 of 31 matrices) and X, near X's own mean (the geodesic running mean is
    within a few percent of the dispersion of the Karcher mean: tests/test_online.py)."""
    X, _, groups = spd_domains(n_groups=3)
    rc = Recenter().fit(X)
    np.testing.assert_array_equal(rc.transform(X), rc.transform(X, groups=np.zeros(len(X))))
    assert _identity_error(rc.transform(X[groups == 0])) < 0.05  # measured 0.028
    assert not np.allclose(rc.transform(X), rc.transform(X, groups=groups))
    assert rc.domains_ == {}


def test_group_labels_of_any_type_and_order(spd_domains):
    X, _, groups = spd_domains(n_groups=3, labels=["s3", "s1", "s2"])
    perm = np.random.default_rng(0).permutation(len(X))
    Y = Recenter().fit_transform(X, groups=groups)
    np.testing.assert_allclose(Recenter().fit_transform(X[perm], groups=groups[perm]), Y[perm], atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_congruence_of_a_group_changes_output_by_one_rotation(spd_domains, seed):
    """X_g -> A X_g Aᵀ: outputs R Y_i Rᵀ with R = (A M Aᵀ)^{-1/2} A M^{1/2} orthogonal,
    so eigenvalues and all pairwise Riemannian distances are unchanged."""
    X, _, groups = spd_domains(n_groups=2, n_channels=5, seed=seed)
    rng = np.random.default_rng(100 + seed)
    A = _random_congruence(5, rng)
    moved = X.copy()
    moved[groups == 1] = A @ X[groups == 1] @ A.T
    Y = Recenter().fit_transform(X, groups=groups)
    Y_moved = Recenter().fit_transform(moved, groups=groups)
    np.testing.assert_allclose(Y_moved[groups == 0], Y[groups == 0], atol=1e-12)
    M = mean_riemann(X[groups == 1], tol=1e-12, maxiter=200)
    R = _sqrtm(A @ M @ A.T, -0.5) @ A @ _sqrtm(M, 0.5)
    np.testing.assert_allclose(R @ R.T, np.eye(5), atol=1e-8)
    np.testing.assert_allclose(Y_moved[groups == 1], R @ Y[groups == 1] @ R.T, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(np.linalg.eigvalsh(Y_moved), np.linalg.eigvalsh(Y), rtol=1e-8)


def test_scaling_a_group_changes_nothing(spd_domains):
    X, _, groups = spd_domains(n_groups=2)
    scaled = X * np.where(groups == 1, 1e-10, 1.0)[:, None, None]  # volts² vs µV²
    np.testing.assert_allclose(Recenter().fit_transform(scaled, groups=groups),
                               Recenter().fit_transform(X, groups=groups), rtol=1e-8, atol=1e-10)


def test_single_matrix_is_not_mapped_to_identity(spd_dataset):
    """One matrix is re-centred by the mean of the prior and itself, never by itself alone
    (which maps every matrix to the identity; tests/test_online.py checks the value)."""
    X, _ = spd_dataset(n_matrices=3, n_channels=4)
    rc = Recenter().fit(X)
    assert np.abs(rc.transform(X[:1])[0] - np.eye(4)).max() > 1e-2


def test_warns_when_the_mean_does_not_converge():
    """Extremely dispersed matrices (log-eigenvalues of s.d. 6): a ConvergenceWarning naming
    the group, not a silently imprecise re-centring."""
    rng = np.random.default_rng(0)
    Q = np.linalg.qr(rng.standard_normal((20, 6, 6)))[0]
    X = (Q * np.exp(6 * rng.standard_normal((20, 1, 6)))) @ Q.transpose(0, 2, 1)
    X = 0.5 * (X + X.transpose(0, 2, 1))
    with pytest.warns(ConvergenceWarning, match="group subject-7 "):
        Recenter().fit_transform(X, groups=["subject-7"] * 20)


@pytest.mark.slow
def test_converges_without_warning_at_64_channels(spd_dataset):
    """The stopping tolerance sits above the rounding floor of a 64-channel mean."""
    X, _ = spd_dataset(n_matrices=40, n_channels=64, seed=9, scale=1e-10)  # volts²
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        Y = Recenter().fit_transform(X)
    # I is the Karcher mean iff mean_i log(Y_i) = 0 (the cost's Riemannian gradient at I)
    lam, U = np.linalg.eigh(Y)
    assert np.abs(((U * np.log(lam)[:, None, :]) @ U.transpose(0, 2, 1)).mean(0)).max() < 1e-9


def test_recenter_groups_function_matches_estimator(spd_domains):
    X, _, groups = spd_domains(n_groups=2)
    np.testing.assert_array_equal(recenter_groups(X, groups), Recenter().fit_transform(X, groups=groups))


# ---------------------------------------------------------------------------------------------
# Pipelines
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_pipeline_with_tangent_space_and_lr(spd_domains, seed):
    """Unseen domain: with Recenter the classes of a new congruence-shifted group are
    recognised; without it the domain shift costs the classifier."""
    X, y, groups = spd_domains(n_groups=5, n_per_group=40, n_channels=6, seed=seed)
    train, test = groups < 4, groups == 4
    pipe = make_pipeline(Recenter(), TangentSpace(metric="riemann"), LogisticRegression())
    pipe.fit(X[train], y[train], recenter__groups=groups[train])
    recentred = pipe.score(X[test], y[test])
    plain = make_pipeline(TangentSpace(metric="riemann"), LogisticRegression()).fit(X[train], y[train])
    assert recentred >= 0.9
    assert recentred > plain.score(X[test], y[test]) + 0.1


def test_pipeline_with_spdnet(spd_domains):
    X, y, groups = spd_domains(n_groups=3, n_per_group=30, n_channels=6, seed=5)
    pipe = make_pipeline(
        Recenter(), SPDnetClassifier(hidden_dims=(4,), max_epochs=20, lr=2e-2, validation_fraction=0, random_state=0)
    )
    pipe.fit(X[groups < 2], y[groups < 2], recenter__groups=groups[groups < 2])
    assert pipe.score(X[groups == 2], y[groups == 2]) >= 0.8
    assert pipe[-1].n_features_in_ == 6


@pytest.fixture
def routing():
    with sklearn.config_context(enable_metadata_routing=True):
        yield


def test_requests_groups_and_domain_by_default():
    routing = Recenter().get_metadata_routing()
    assert routing.fit.requests == {"groups": True, "subjects": True, "X_target_unlabeled": True,
                                    "X_target_labeled": True}
    assert routing.transform.requests == {"groups": True, "domain": True}


@pytest.mark.usefixtures("routing")
def test_subjects_as_moabb_routes_them_are_the_groups(spd_domains):
    """MOABB's CrossSubject fits ``pipeline.fit(X, y, subjects=...)`` under routing: each
    training subject is re-centred by its own mean, as with ``groups``."""
    X, y, groups = spd_domains(n_groups=3, n_per_group=20, seed=9)
    pipe = make_pipeline(Recenter(), TangentSpace(), LogisticRegression())
    by_subjects = clone(pipe).fit(X, y, subjects=groups)
    by_groups = clone(pipe).fit(X, y, groups=groups)
    np.testing.assert_array_equal(_lr_coef(by_subjects), _lr_coef(by_groups))
    np.testing.assert_array_equal(Recenter().fit(X, subjects=groups).transform(X), Recenter().fit(X).transform(X))
    np.testing.assert_array_equal(Recenter().fit_transform(X, subjects=groups), recenter_groups(X, groups))
    with pytest.raises(ValueError, match="groups and subjects"):
        Recenter().fit_transform(X, groups=groups, subjects=groups[::-1])


def _lr_coef(pipe):
    return pipe[-1].coef_


@pytest.mark.usefixtures("routing")
def test_routing_through_pipeline_and_gridsearch(spd_domains):
    X, y, groups = spd_domains(n_groups=4, n_per_group=20, seed=6)
    pipe = make_pipeline(Recenter(), TangentSpace(), LogisticRegression())
    routed = clone(pipe).fit(X, y, groups=groups)
    with sklearn.config_context(enable_metadata_routing=False):
        direct = clone(pipe).fit(X, y, recenter__groups=groups)
        ungrouped = clone(pipe).fit(X, y)
    np.testing.assert_allclose(_lr_coef(routed), _lr_coef(direct), rtol=1e-10)
    assert not np.allclose(_lr_coef(routed), _lr_coef(ungrouped))

    search = GridSearchCV(pipe, {"logisticregression__C": [0.1, 1.0]}, cv=GroupKFold(n_splits=2))
    search.fit(X, y, groups=groups)
    best = clone(pipe).set_params(**search.best_params_).fit(X, y, groups=groups)
    np.testing.assert_allclose(_lr_coef(search.best_estimator_), _lr_coef(best), rtol=1e-10)
    # transform routing: predicting with groups re-centres each group as a temporary domain.
    recentred = np.empty_like(X)
    for g in np.unique(groups):
        recentred[groups == g] = routed[0].transform(X[groups == g])
    manual = routed[-1].decision_function(routed[1].transform(recentred))
    np.testing.assert_allclose(routed.decision_function(X, groups=groups), manual, rtol=1e-12, atol=1e-12)
    assert not np.allclose(routed.decision_function(X), manual)


@pytest.mark.usefixtures("routing")
def test_routing_through_cross_validate_with_group_kfold(spd_domains):
    X, y, groups = spd_domains(n_groups=4, n_per_group=20, seed=7)
    pipe = make_pipeline(Recenter(), TangentSpace(), LogisticRegression())
    cv = GroupKFold(n_splits=4)
    result = cross_validate(pipe, X, y, cv=cv, params={"groups": groups}, return_estimator=True)
    for est, (train, test) in zip(result["estimator"], cv.split(X, y, groups)):
        assert len(np.unique(groups[test])) == 1  # each test fold: one unseen domain
        with sklearn.config_context(enable_metadata_routing=False):
            manual = clone(pipe).fit(X[train], y[train], recenter__groups=groups[train])
        np.testing.assert_allclose(_lr_coef(est), _lr_coef(manual), rtol=1e-10)
    assert result["test_score"].mean() >= 0.85


def test_without_routing_groups_go_only_to_the_splitter(spd_domains):
    """Routing disabled: sklearn passes ``groups`` to the splitter only (Recenter sees none)."""
    X, y, groups = spd_domains(n_groups=3, n_per_group=20, seed=8)
    pipe = make_pipeline(Recenter(), TangentSpace(), LogisticRegression())
    scores = cross_validate(pipe, X, y, cv=GroupKFold(n_splits=3), groups=groups)["test_score"]
    assert np.isfinite(scores).all()


# ---------------------------------------------------------------------------------------------
# Bad inputs, clone, pickle
# ---------------------------------------------------------------------------------------------


def test_bad_inputs(spd_dataset):
    X, _ = spd_dataset(n_matrices=10, n_channels=4)
    with pytest.raises(ValueError, match="3-D array"):
        Recenter().fit(X[0])
    with pytest.raises(ValueError, match="not positive definite"):
        Recenter().fit_transform(np.concatenate([X, -X[:1]]))
    with pytest.raises(ValueError, match="not symmetric"):
        bad = X.copy()
        bad[2, 0, 1] += 1.0
        Recenter().fit(bad)
    with pytest.raises(ValueError, match="NaN or infinity"):
        bad = X.copy()
        bad[1, 0, 0] = np.nan
        Recenter().fit_transform(bad)
    with pytest.raises(ValueError, match="groups has 9 entries but X has 10 samples"):
        Recenter().fit_transform(X, groups=np.zeros(9))
    with pytest.raises(ValueError, match="groups must be a 1-D array"):
        Recenter().fit(X, groups=np.zeros((10, 1)))
    rc = Recenter().fit(X)
    with pytest.raises(ValueError, match="fitted on 4x4"):
        rc.transform(spd_dataset(n_matrices=5, n_channels=3)[0])
    with pytest.raises(ValueError, match="groups has 3 entries but X has 10 samples"):
        rc.transform(X, groups=np.zeros(3))
    with pytest.raises(NotFittedError):
        Recenter().transform(X)


def test_clone_and_pickle(spd_domains):
    X, _, groups = spd_domains(n_groups=2)
    rc = Recenter().fit(X, groups=groups)
    assert clone(rc).get_params() == {"domain_adaptation": None}
    assert not hasattr(clone(rc), "n_features_in_")
    restored = pickle.loads(pickle.dumps(rc))
    np.testing.assert_array_equal(restored.transform(X, groups=groups), rc.transform(X, groups=groups))
    assert restored.get_metadata_routing().fit.requests == {"groups": True, "subjects": True,
                                                            "X_target_unlabeled": True, "X_target_labeled": True}
