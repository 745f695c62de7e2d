"""The federated classical baseline: re-centred tangent space + logistic regression across sites.

Each site re-centres each of its subjects by that subject's own Riemannian mean (Zanini et
al., 2018), so every site's tangent space is the one at the identity and no reference point
is shared. The logistic regression is then fitted by L-BFGS on the **sum of the sites'
objectives**: every evaluation is one round in which the server broadcasts the weights and
each site replies with its loss and gradient on its own trials (the trials, their features
and their labels never leave it). The summed objective is exactly the pooled one, so the
federated model is the centralized re-centred TS+LR to the optimizer's tolerance: the honest
peer of FedSPDnet, a federated pipeline as good as pooling allows.
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
    """Tangent vectors at the identity of ``X`` re-centred per group: ``upper(log(M^{-1/2} X M^{-1/2}))``
    (pyRiemann's ``upper``: off-diagonal entries times sqrt 2, so Euclidean norms are Riemannian ones).

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
    """One site's reply: the multinomial log-loss summed over its trials and its gradient.

    ``W`` has shape ``(n_features + 1, n_classes)`` (the last row is the intercept); the
    sites' replies add up to the pooled objective.

    Returns
    -------
    loss : float
    grad : ndarray of the shape of ``W``

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.classical import site_objective
    >>> loss, grad = site_objective(np.zeros((3, 2)), np.ones((4, 2)), np.array([0, 1, 1, 0]), 2)
    >>> round(loss, 4), grad.shape  # 4 trials at probability 1/2
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

    The objective is scikit-learn's ``LogisticRegression(C=C)`` (multinomial, intercept not
    penalized) on the tangent vectors at the identity of each subject's re-centred matrices
    (:func:`tangent_features`); it is minimized by L-BFGS whose every evaluation is one
    federated round (each site: :func:`site_objective` on its own trials). ``n_rounds_``
    counts them.

    Parameters
    ----------
    C : float, default=1.0
        Inverse regularization strength, as in :class:`sklearn.linear_model.LogisticRegression`.
    max_rounds : int, default=1000
        The most rounds (objective evaluations) L-BFGS may use.
    tol : float, default=1e-6
        L-BFGS's tolerance on the projected gradient.
    groups_per_client : int, default=2
        Consecutive subjects (sorted) per site, as :class:`~skfedspd.FederatedSPDnetClassifier`.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (n_classes, n_features)
    intercept_ : ndarray of shape (n_classes,)
    n_features_in_ : int
        Number of channels.
    n_clients_ : int
    n_rounds_ : int
        Rounds run (objective evaluations).
    converged_ : bool

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.classical import FederatedTangentSpaceLR
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=40, n_channels=4, seed=0)
    >>> subjects = np.repeat([1, 2, 3, 4], 10)
    >>> clf = FederatedTangentSpaceLR().fit(X, y, groups=subjects)
    >>> clf.n_clients_, clf.predict(X[:10]).shape  # the 10 trials of one subject, re-centred together
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
            The subject of each matrix (``subjects``: MOABB's key); required.

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
