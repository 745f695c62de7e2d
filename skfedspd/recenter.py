"""``Recenter``: unsupervised re-centring of SPD matrices to the identity (Zanini et al., 2018)."""

import warnings

import numpy as np
import torch
from sklearn.base import BaseEstimator, TransformerMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import check_is_fitted

from .functional import karcher_mean, sqrtm_invsqrtm
from .online import (NO_PRIOR_WARNING, THIS_CALL, DomainAdaptation, DomainStatistics, DomainStatisticsMixin, adaptation_of,
                     log_euclidean_sum)
from .transfer import adapt_target, call_labels, target_trials
from .renamed import DOMAIN_MERGES, DOMAIN_RENAMED, accepts_renamed, fold_renamed
from .validation import (check_domain_sizes, check_groups, check_input_range, check_nested_params, check_spd_batch, input_range,
                         resolve_groups)

__all__ = ["Recenter", "recenter_groups"]

# Karcher iteration: stop when the Riemannian gradient norm of the mean's cost is this small
# (the whitened mean is then the identity to about this distance). Its rounding floor grows
# with the size: about 2e-12 for 64 channels in float64.
_TOL = 1e-10
_MAX_ITER = 200


def _group_labels(groups, n_samples):
    """``(labels, codes)``: the distinct group labels and each matrix's index into them."""
    if groups is None:
        return np.array([None]), np.zeros(n_samples, dtype=np.intp)
    groups = check_groups(groups, n_samples)
    labels, codes = np.unique(groups, return_inverse=True)
    return labels, codes.reshape(-1)


def recenter_groups(X, groups=None):
    """Congruence-whiten each group of ``X`` by its own affine-invariant mean.

    ``X_i ↦ M_g^{-1/2} X_i M_g^{-1/2}``, ``M_g`` the Riemannian mean of group ``g``.

    Parameters
    ----------
    X : ndarray of shape (n_matrices, n, n)
        SPD matrices (validated float64 array).
    groups : array-like of shape (n_matrices,) or None
        Group (domain) label of each matrix; None: one group.

    Returns
    -------
    ndarray of shape (n_matrices, n, n)

    Examples
    --------
    >>> import numpy as np
    >>> from pyriemann.utils.mean import mean_riemann
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.recenter import recenter_groups
    >>> X, _ = make_spd_classification(n_matrices=20, n_channels=3, seed=0)
    >>> groups = np.repeat(["s1", "s2"], 10)
    >>> Y = recenter_groups(X, groups)
    >>> [np.allclose(mean_riemann(Y[groups == g]), np.eye(3)) for g in ("s1", "s2")]
    [True, True]
    """
    labels, codes = _group_labels(groups, len(X))
    out = np.empty_like(X)
    with torch.no_grad():
        Xt = torch.as_tensor(X)
        for g, label in enumerate(labels):
            members = np.flatnonzero(codes == g)
            part = Xt[members]
            M, converged = karcher_mean(part, _MAX_ITER, tol=_TOL, return_converged=True)
            if not converged:
                warnings.warn(
                    f"the Riemannian mean of {'the data' if label is None else f'group {label}'} "
                    f"({len(members)} matrices) did not converge "
                    f"to {_TOL:g} in {_MAX_ITER} Karcher steps: very dispersed matrices; the "
                    "re-centred group's mean is not exactly the identity",
                    ConvergenceWarning,
                    stacklevel=3,
                )
            _, M_inv_half = sqrtm_invsqrtm(M)
            Y = M_inv_half @ part @ M_inv_half
            out[members] = (0.5 * (Y + Y.transpose(-1, -2))).numpy()
    return out


class Recenter(DomainStatisticsMixin, TransformerMixin, BaseEstimator):
    """Re-centre SPD matrices to the identity, group by group (Zanini et al., 2018).

    Each group (a *domain*: subject, session) is congruence-whitened by its own
    affine-invariant mean ``M``: ``X_i ↦ M^{-1/2} X_i M^{-1/2}``. ``fit_transform(X, groups=g)``
    re-centres each training group by its own mean; ``fit`` stores the prior (the
    log-Euclidean mean of the training matrices). ``transform(X, domain="s17")`` adds the
    trials of ``X`` to the domain's running mean first, then re-centres each trial without
    itself; without ``domain``, ``X`` is one temporary domain started from the prior
    (``docs/guide/online-adaptation.md``). ``groups``, ``subjects`` and ``domain`` are
    requested from metadata routing by default.

    ``fit`` also requests a new subject's calibration trials (``X_target_unlabeled``,
    ``X_target_labeled``: MOABB's ``cs_mode``), stored as the domain ``"target"`` that
    ``transform`` without ``domain`` starts from (:mod:`skfedspd.transfer`).

    Parameters
    ----------
    domain_adaptation : DomainAdaptation or None, default=None
        How each domain's statistics adapt (:class:`~skfedspd.online.DomainAdaptation`);
        None: its defaults.

    Attributes
    ----------
    n_features_in_ : int
        Size of the matrices seen in ``fit``.
    input_range_ : dict
        The training matrices' range of :func:`skfedspd.validation.spectral_summary` statistics.
    domain_statistics_ : skfedspd.online.DomainStatistics
        The prior and the stored domains' running means (``domains_``, ``domain_prior_``).

    Examples
    --------
    >>> import numpy as np
    >>> from pyriemann.tangentspace import TangentSpace
    >>> from sklearn.linear_model import LogisticRegression
    >>> from sklearn.pipeline import make_pipeline
    >>> from skfedspd import Recenter
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=80, n_channels=4, n_classes=2, seed=0)
    >>> subjects = np.repeat([1, 2, 3, 4], 20)
    >>> train = subjects < 4
    >>> clf = make_pipeline(Recenter(), TangentSpace(), LogisticRegression())
    >>> clf.fit(X[train], y[train], recenter__groups=subjects[train]).predict(X[~train]).shape
    (20,)
    >>> rc = Recenter().fit(X[train], groups=subjects[train])
    >>> Y = [rc.transform(X[i : i + 1], domain=4) for i in (60, 61)]
    >>> rc.domains_
    {4: 2}
    """

    __metadata_request__fit = {"groups": True, "subjects": True, "X_target_unlabeled": True,
                               "X_target_labeled": True}
    __metadata_request__transform = {"groups": True, "domain": True}

    _parameter_constraints: dict = {"domain_adaptation": [None, DomainAdaptation]}

    @accepts_renamed(DOMAIN_RENAMED, DOMAIN_MERGES)  # the flat names of before
    def __init__(self, domain_adaptation=None):
        self.domain_adaptation = domain_adaptation

    def set_params(self, **params):
        """Set the parameters, the old flat names (:data:`~skfedspd.renamed.DOMAIN_RENAMED`) included."""
        return super().set_params(**check_nested_params(self, fold_renamed(self, params, DOMAIN_RENAMED, DOMAIN_MERGES)))

    def _validate_params(self):
        super()._validate_params()
        adaptation_of(self).check_params()  # the settings object checks its own parameters

    def _fit(self, X, groups, *, transforming=False, target=(None, None)):
        """Validated ``X``; sets ``n_features_in_``, ``input_range_``, the prior and the domain
        ``"target"`` of ``target`` (``(X_target_unlabeled, X_target_labeled)``)."""
        X, summary = check_spd_batch(X, return_summary=True)
        calibration = target_trials(*target, n_channels=X.shape[1])
        _group_labels(groups, len(X))
        if transforming and groups is not None:
            check_domain_sizes(np.asarray(groups), "Recenter")
        with torch.no_grad():
            log_sum = log_euclidean_sum(torch.as_tensor(X))
        stats = DomainStatistics([X.shape[1]], torch.float64)
        stats.set_prior([log_sum], len(X))
        before = dict(self.__dict__)  # the attributes below replace, never mutate, the old ones
        self.n_features_in_ = X.shape[1]
        self.input_range_ = input_range(summary)
        self.domain_statistics_ = stats
        if calibration is not None:
            try:
                adapt_target(self, calibration)
            except ValueError:  # beyond the training range: refused, the estimator as it was
                self.__dict__.clear()
                self.__dict__.update(before)
                raise
        return X

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, groups=None, subjects=None, X_target_unlabeled=None, X_target_labeled=None):
        """Check ``X`` (and ``groups``); store the matrix size and the prior; forget stored domains.

        Parameters
        ----------
        X : array-like of shape (n_matrices, n, n)
            SPD matrices.
        y : ignored
        groups : array-like of shape (n_matrices,), default=None
            Domain of each matrix (used by ``fit_transform``).
        subjects : array-like of shape (n_matrices,), default=None
            Alias of ``groups``.
        X_target_unlabeled, X_target_labeled : array-like of shape (n_calibration, n, n), default=None
            A new subject's calibration matrices: the domain ``"target"``, which ``transform``
            without ``domain`` starts from (:mod:`skfedspd.transfer`).

        Returns
        -------
        self
        """
        self._fit(X, resolve_groups(groups, subjects), target=(X_target_unlabeled, X_target_labeled))
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def fit_transform(self, X, y=None, groups=None, subjects=None, X_target_unlabeled=None, X_target_labeled=None):
        """``fit(X, y, groups)``, then each training group re-centred by its own mean."""
        groups = resolve_groups(groups, subjects)
        X = self._fit(X, groups, transforming=True, target=(X_target_unlabeled, X_target_labeled))
        return recenter_groups(X, groups)

    def _update(self, X, domain, groups, *, keep):
        """Validate, add the trials of ``X`` to their domains; return ``(X, update)``."""
        check_is_fitted(self)
        self._validate_params()  # set_params since fit: the same constraints, naming the parameter
        X, summary = check_spd_batch(X, self.n_features_in_, return_summary=True)
        check_input_range(summary, getattr(self, "input_range_", None))
        if domain is not None and groups is not None:
            raise ValueError("pass either domain (persistent statistics) or groups (one temporary domain per group), "
                             "not both")
        if domain is not None or groups is None:
            labels = call_labels(self._domain_statistics(), domain, len(X))
        else:
            _, codes = _group_labels(groups, len(X))
            labels = [(THIS_CALL, int(c)) for c in codes]
        stats = self._domain_statistics()
        adaptation = adaptation_of(self)
        update = stats.update(labels, float(adaptation.prior_weight), adaptation.memory)
        with torch.no_grad():
            update.add_in_order(torch.as_tensor(X), 0)
        if keep:
            update.commit(adaptation.max_domains)
            self.domain_statistics_ = stats
        return X, update

    def _domain_statistics(self):
        """The stored statistics (an empty store for an older pickle)."""
        stats = getattr(self, "domain_statistics_", None)
        return DomainStatistics([self.n_features_in_], torch.float64) if stats is None else stats

    def transform(self, X, groups=None, domain=None):
        """Update the domains of ``X``'s matrices, then re-centre each by its domain's mean.

        Parameters
        ----------
        X : array-like of shape (n_matrices, n, n)
        groups : array-like of shape (n_matrices,), default=None
            Each group a temporary domain (not kept).
        domain : str, int or array-like of shape (n_matrices,), default=None
            The domain of the matrices (one label, or one per row), kept. Neither: a temporary
            domain started from ``"target"`` (``fit``'s calibration trials) or the prior.

        Returns
        -------
        ndarray of shape (n_matrices, n, n)
        """
        X, update = self._update(X, domain, groups, keep=domain is not None)
        if update.starts_without_prior:
            warnings.warn(NO_PRIOR_WARNING.replace("fit_domain_prior(X_train, groups)", "fit(X_train)"),
                          UserWarning, stacklevel=2)
        with torch.no_grad():
            X = torch.as_tensor(X)
            W = update.inv_halves(0, adaptation_of(self).include_self)
            Y = W @ X @ W
        return (0.5 * (Y + Y.transpose(-1, -2))).numpy()

    def adapt(self, X, domain):
        """Unlabeled calibration: add the matrices of ``X``, in order, to ``domain``'s statistics.

        Parameters
        ----------
        X : array-like of shape (n_matrices, n, n)
        domain : str, int or array-like of shape (n_matrices,)

        Returns
        -------
        self
        """
        if domain is None:
            raise ValueError("adapt needs the domain the matrices belong to (domain=...)")
        self._update(X, domain, None, keep=True)
        return self

    @property
    def domain_prior_(self):
        """The mean a new domain starts from (ndarray of shape (n, n)), or None."""
        check_is_fitted(self)
        prior = self._domain_statistics().prior
        return None if prior is None else prior[0].numpy()

    def __sklearn_is_fitted__(self):
        return hasattr(self, "n_features_in_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        tags.requires_fit = True
        return tags
