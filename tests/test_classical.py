"""The federated classical baseline equals the pooled re-centred TS+LR."""

import numpy as np
import pytest
from pyriemann.tangentspace import TangentSpace
from sklearn.linear_model import LogisticRegression

from skfedspd.classical import FederatedTangentSpaceLR, site_objective, tangent_features
from skfedspd.datasets import make_spd_classification
from skfedspd.recenter import recenter_groups


@pytest.fixture(scope="module")
def subjects_data():
    X, y = make_spd_classification(n_matrices=120, n_channels=5, n_classes=3, seed=0)
    return X, y, np.repeat(np.arange(6), 20)


def test_tangent_features_are_pyriemanns_tangent_space_at_the_identity(subjects_data):
    X, _, groups = subjects_data
    expected = TangentSpace(metric="riemann", tsupdate=False).fit(np.eye(5)[None].repeat(2, 0)).transform(
        recenter_groups(X, groups))
    np.testing.assert_allclose(tangent_features(X, groups), expected, atol=1e-10)


@pytest.mark.parametrize("groups_per_client", [1, 2, 6])
@pytest.mark.parametrize("C", [0.1, 1.0])
def test_the_federated_model_is_the_pooled_logistic_regression(subjects_data, groups_per_client, C):
    X, y, groups = subjects_data
    fed = FederatedTangentSpaceLR(C=C, tol=1e-10, groups_per_client=groups_per_client).fit(X, y, groups=groups)
    pooled = LogisticRegression(C=C, tol=1e-10, max_iter=10_000).fit(tangent_features(X, groups), y)
    assert fed.converged_ and fed.n_clients_ == -(-6 // groups_per_client)
    np.testing.assert_allclose(fed.coef_, pooled.coef_, atol=1e-4)
    np.testing.assert_allclose(fed.intercept_ - fed.intercept_.mean(), pooled.intercept_ - pooled.intercept_.mean(),
                               atol=1e-4)
    np.testing.assert_allclose(fed.predict_proba(X[:20]), pooled.predict_proba(tangent_features(X[:20])), atol=1e-4)


def test_the_sites_replies_add_up_to_the_pooled_gradient(subjects_data):
    X, y, groups = subjects_data
    codes = np.unique(y, return_inverse=True)[1]
    F = tangent_features(X, groups)
    W = np.random.default_rng(0).standard_normal((F.shape[1] + 1, 3))
    loss, grad = site_objective(W, F, codes, 3)
    parts = [site_objective(W, F[idx], codes[idx], 3) for idx in np.array_split(np.arange(len(codes)), 4)]
    assert np.isclose(loss, sum(p[0] for p in parts))
    np.testing.assert_allclose(grad, sum(p[1] for p in parts), atol=1e-10)
    # and the gradient is the loss's (central differences)
    step, i, k = 1e-6, 3, 1
    W_plus, W_minus = W.copy(), W.copy()
    W_plus[i, k] += step
    W_minus[i, k] -= step
    numeric = (site_objective(W_plus, F, codes, 3)[0] - site_objective(W_minus, F, codes, 3)[0]) / (2 * step)
    assert np.isclose(grad[i, k], numeric, rtol=1e-6)


def test_groups_are_required_and_named(subjects_data):
    X, y, _ = subjects_data
    with pytest.raises(ValueError, match="groups"):
        FederatedTangentSpaceLR().fit(X, y)


def test_one_call_is_one_subject_re_centred_by_its_own_mean(subjects_data):
    X, y, groups = subjects_data
    clf = FederatedTangentSpaceLR().fit(X[groups < 5], y[groups < 5], groups=groups[groups < 5])
    new = X[groups == 5]
    # a whole-subject power shift, which re-centring removes exactly
    np.testing.assert_allclose(clf.decision_function(7.0 * new), clf.decision_function(new), atol=1e-8)
    assert not np.allclose(clf.decision_function(new[:5]), clf.decision_function(new)[:5])
