"""The federated classical baseline: re-centred tangent space + logistic regression across
sites, by L-BFGS on the sum of the sites' objectives (each evaluation one round), which is
exactly the pooled objective.
"""

from numbers import Integral, Real

import numpy as np
from scipy.optimize import minimize
from scipy.special import logsumexp
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

from .functional import logeig
from .recenter import recenter_groups
from .validation import check_groups, check_spd_batch, resolve_groups

__all__ = ["FederatedTangentSpaceLR", "site_objective", "tangent_features"]


def tangent_features(X, groups=None):
    """Tangent vectors at the identity of ``X`` re-centred per group (pyRiemann's ``upper``).

    Examples
    --------
    >>> from skfedspd.classical import tangent_features
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, _ = make_spd_classification(n_matrices=10, n_channels=4, seed=0)
    >>> tangent_features(X, groups=[0] * 5 + [1] * 5).shape
    (10, 10)
    """
    import torch

    try:  # imported here: pyRiemann's import sets matplotlib up
        from pyriemann.geometry.tangentspace import upper
    except ImportError:  # pyRiemann < 0.12
        from pyriemann.utils.tangentspace import upper

    Y = recenter_groups(np.asarray(X, dtype=np.float64), groups)
    with torch.no_grad():
        return upper(logeig(torch.as_tensor(Y)).numpy())


def site_objective(W, features, codes, n_classes, sample_weight=None):
    """One site's reply: the multinomial log-loss summed over its trials and its gradient
    (``W`` of shape ``(n_features + 1, n_classes)``, the intercept last).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.classical import site_objective
    >>> loss, grad = site_objective(np.zeros((3, 2)), np.ones((4, 2)), np.array([0, 1, 1, 0]), 2)
    >>> round(loss, 4), grad.shape
    (2.7726, (3, 2))
    """
    logits = features @ W[:-1] + W[-1]
    log_p = logits - logsumexp(logits, axis=1, keepdims=True)
    w = np.ones(len(codes)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    loss = -float(np.sum(w * log_p[np.arange(len(codes)), codes]))
    residual = np.exp(log_p)
    residual[np.arange(len(codes)), codes] -= 1.0
    residual *= w[:, None]
    grad = np.vstack([features.T @ residual, residual.sum(0)])
    return loss, grad


class FederatedTangentSpaceLR(ClassifierMixin, BaseEstimator):
    """Re-centred tangent space + L2 logistic regression, trained across sites.

    Parameters
    ----------
    C : float, default=1.0
        Inverse regularization strength.
    max_rounds : int, default=1000
        The most rounds (objective evaluations).
    tol : float, default=1e-6
        L-BFGS's tolerance on the projected gradient.
    groups_per_client : int, default=2
        Consecutive subjects (sorted) per site.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (n_classes, n_features)
    intercept_ : ndarray of shape (n_classes,)
    n_features_in_ : int
    n_clients_ : int
    n_rounds_ : int
    converged_ : bool

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.classical import FederatedTangentSpaceLR
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=40, n_channels=4, seed=0)
    >>> clf = FederatedTangentSpaceLR().fit(X, y, groups=np.repeat([1, 2, 3, 4], 10))
    >>> clf.n_clients_, clf.predict(X[:10]).shape
    (2, (10,))
    """

    _parameter_constraints: dict = {
        "C": [Interval(Real, 0, None, closed="neither")],
        "max_rounds": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="neither")],
        "groups_per_client": [Interval(Integral, 1, None, closed="left")],
    }

    __metadata_request__fit = {"groups": True, "subjects": True}

    def __init__(self, C=1.0, max_rounds=1000, tol=1e-6, groups_per_client=2):
        self.C = C
        self.max_rounds = max_rounds
        self.tol = tol
        self.groups_per_client = groups_per_client

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, groups=None, subjects=None):
        """Fit across the sites of ``groups`` (each subject re-centred by its own mean).

        Parameters
        ----------
        X : array-like of shape (n_matrices, n_channels, n_channels)
        y : array-like of shape (n_matrices,)
        groups, subjects : array-like of shape (n_matrices,)
            The subject of each matrix; required.

        Returns
        -------
        self
        """
        from .clients import make_clients

        X = check_spd_batch(X)
        groups = resolve_groups(groups, subjects)
        if groups is None:
            raise ValueError("FederatedTangentSpaceLR needs the subject of each trial (groups=...): sites are "
                             "made of subjects, and each subject is re-centred by its own mean")
        groups = check_groups(groups, len(X))
        y = np.asarray(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"y needs at least two classes, got {self.classes_.tolist()}")
        client_idx, _ = make_clients(groups, self.groups_per_client)
        # What each site computes once, on its own trials.
        sites = [(tangent_features(X[idx], groups[idx]), codes[idx]) for idx in client_idx]
        n_features, n_classes = sites[0][0].shape[1], len(self.classes_)
        penalty = np.ones((n_features + 1, n_classes))
        penalty[-1] = 0.0  # the intercept is not penalized
        rounds = 0

        def objective(flat):
            nonlocal rounds
            rounds += 1
            W = flat.reshape(n_features + 1, n_classes)
            loss, grad = 0.0, np.zeros_like(W)
            for features, site_codes in sites:  # one round: every site's reply, summed
                site_loss, site_grad = site_objective(W, features, site_codes, n_classes)
                loss, grad = loss + site_loss, grad + site_grad
            # scikit-learn's scaling: C · Σ loss + ||w||² / 2
            return self.C * loss + 0.5 * float(np.sum(penalty * W * W)), (self.C * grad + penalty * W).ravel()

        result = minimize(objective, np.zeros((n_features + 1) * n_classes), jac=True, method="L-BFGS-B",
                          options={"maxfun": self.max_rounds, "maxiter": self.max_rounds, "gtol": self.tol})
        W = result.x.reshape(n_features + 1, n_classes)
        self.coef_, self.intercept_ = W[:-1].T.copy(), W[-1].copy()
        self.n_features_in_ = X.shape[1]
        self.n_clients_ = len(client_idx)
        self.n_rounds_ = rounds
        self.converged_ = bool(result.success)
        return self

    def decision_function(self, X):
        """Logits of ``X``, re-centred by its own mean (one call: one subject)."""
        check_is_fitted(self)
        X = check_spd_batch(X, self.n_features_in_)
        return tangent_features(X) @ self.coef_.T + self.intercept_

    def predict_proba(self, X):
        """Class probabilities of ``X`` (one call: one subject, re-centred by its own mean)."""
        logits = self.decision_function(X)
        return np.exp(logits - logsumexp(logits, axis=1, keepdims=True))

    def predict(self, X):
        """Labels of ``X`` (one call: one subject, re-centred by its own mean)."""
        return self.classes_[np.argmax(self.decision_function(X), axis=1)]

    def __sklearn_is_fitted__(self):
        return hasattr(self, "coef_")
