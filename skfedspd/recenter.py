"""``Recenter``: unsupervised re-centring of SPD matrices to the identity (Zanini et al., 2018)."""

import warnings

import numpy as np
import torch
from sklearn.base import BaseEstimator, TransformerMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import check_is_fitted

from .functional import karcher_mean, sqrtm_invsqrtm
from .online import (NO_PRIOR_WARNING, THIS_CALL, DomainAdaptation, DomainStatistics, DomainStatisticsMixin, adaptation_of,
                     domain_labels,
                     log_euclidean_sum)
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

    ``X_i ↦ M_g^{-1/2} X_i M_g^{-1/2}`` for the matrices ``X_i`` of group ``g``, ``M_g`` their
    Riemannian (Karcher) mean, so that each group's mean becomes the identity.

    Parameters
    ----------
    X : ndarray of shape (n_matrices, n, n)
        SPD matrices (validated float64 array).
    groups : array-like of shape (n_matrices,) or None
        Group (domain) label of each matrix; None: all matrices form one group.

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

    Each group (subject, session: a *domain*) is congruence-whitened by its own
    affine-invariant Riemannian mean ``M``: ``X_i ↦ M^{-1/2} X_i M^{-1/2}``, after which the
    group's Riemannian mean is the identity. This removes the domain's average spatial
    covariance (electrode placement, head shape, impedances) and keeps what varies within it.
    The affine-invariant mean is congruence-equivariant (``A X_i Aᵀ`` has mean ``A M Aᵀ``),
    so a congruence of a whole group (``X_i ↦ A X_i Aᵀ``, any invertible ``A``) changes its
    output only by one rotation common to the group, ``Y_i ↦ R Y_i Rᵀ`` with
    ``R = (A M Aᵀ)^{-1/2} A M^{1/2}`` orthogonal: eigenvalues, Riemannian distances and every
    rotation-invariant feature are unchanged (removing ``R`` too needs a supervised rotation,
    as in Riemannian Procrustes analysis).

    Training: ``fit_transform(X, groups=g)`` (what a :class:`~sklearn.pipeline.Pipeline`
    calls on the training data) re-centres each training group by its own mean, and
    ``fit`` stores the **prior**, the log-Euclidean mean of the training matrices.

    Transforming new data: each domain keeps **persistent statistics** that adapt from its
    unlabeled trials (:mod:`skfedspd.online`). ``transform(X, domain="s17")`` first adds the
    trials of ``X``, in order, to the running Riemannian mean of domain ``"s17"`` (a new
    domain starts from the prior, weighing ``domain_adaptation.prior_weight`` trials), then
    re-centres every trial of ``X`` by the updated mean without the trial itself
    (``domain_adaptation.include_self``). A whole subject in one call is whole-subject adaptation
    (each trial re-centred by the mean of the others, the prior weighing one trial); one
    trial per call is online adaptation, as in a BCI (each trial re-centred by the trials
    before it, a new domain's first by the prior). :meth:`adapt` updates a domain without transforming,
    :meth:`reset_domain` forgets one; ``domain`` may give one label per row.
    ``transform(X)`` without ``domain`` treats ``X`` as one temporary domain started from
    the prior and not kept (``groups``: each group a temporary domain): ``X`` re-centred by
    nearly its own mean, and a single matrix by the prior.

    In a Pipeline, ``predict(X_test)`` therefore re-centres the test data by (nearly) the
    test data's own mean, and ``predict(x, domain="s17")`` one trial with subject s17's
    statistics so far. Under MOABB's ``CrossSubjectEvaluation`` each test fold is one unseen
    subject (route ``groups``/``subjects`` into fit so the training subjects are re-centred
    one by one). Under ``WithinSessionEvaluation`` the training part (no groups: one
    domain) and the test fold are each re-centred by their own mean, noisy when the test
    fold is small (a handful of trials estimate an ``n×n`` mean).

    ``groups`` is requested from metadata routing for ``fit`` and ``transform`` by default,
    and ``domain`` for ``transform``, so under ``sklearn.set_config(
    enable_metadata_routing=True)`` ``Pipeline``, ``GridSearchCV`` and
    ``cross_validate(..., params={"groups": g})`` route them here (``groups`` also to a
    ``GroupKFold`` splitter), and ``pipeline.predict(x, domain="s17")`` runs online.
    Without routing pass them directly (``fit_transform(X, groups=g)``,
    ``pipeline.fit(X, y, recenter__groups=g)``). MOABB's CrossSubject routes the training
    subjects as ``subjects``, an alias of ``groups`` that ``fit`` also requests by default.

    Parameters
    ----------
    domain_adaptation : DomainAdaptation or None, default=None
        How each domain's statistics adapt from its matrices
        (:class:`~skfedspd.online.DomainAdaptation`: ``prior_weight``, the prior's weight in
        trials; ``memory``, how many recent trials the statistics remember;
        ``include_self``, whether a matrix is re-centred by statistics that include it;
        ``max_domains``, the most domains stored, about 100 KB each at 64 channels); None:
        its defaults. Reachable as ``domain_adaptation__memory`` once set.

    The parameters are validated at ``fit`` and again, by the same constraints, at every
    ``transform`` and :meth:`adapt` (a ``set_params`` after ``fit`` gets the same error).
    ``transform`` and :meth:`adapt` refuse matrices that are not positive definite at
    float64 precision, or whose scale or condition number lies far outside the training
    matrices' (``input_range_``, :func:`skfedspd.validation.check_input_range`), before any
    domain's statistics change.

    Attributes
    ----------
    n_features_in_ : int
        Size of the matrices seen in ``fit``.
    input_range_ : dict
        The training matrices' range of :func:`skfedspd.validation.spectral_summary`
        statistics (``{"log_scale": [low, high], "log_condition": [low, high]}``, decades).
    domain_statistics_ : skfedspd.online.DomainStatistics
        The prior and the stored domains' running means; read them through ``domains_``
        (label → trials seen) and ``domain_prior_`` (the prior, or None).

    Examples
    --------
    Three training subjects whose recordings differ by a congruence (the same classes seen
    through different "head shapes"), and a new subject:

    >>> import numpy as np
    >>> from pyriemann.tangentspace import TangentSpace
    >>> from sklearn.linear_model import LogisticRegression
    >>> from sklearn.pipeline import make_pipeline
    >>> from skfedspd import Recenter
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=80, n_channels=4, n_classes=2, seed=0)
    >>> rng = np.random.default_rng(0)
    >>> subjects = np.repeat([1, 2, 3, 4], 20)
    >>> for s in (1, 2, 3, 4):
    ...     A = np.eye(4) + 0.5 * rng.standard_normal((4, 4))
    ...     X[subjects == s] = A @ X[subjects == s] @ A.T
    >>> train = subjects < 4
    >>> clf = make_pipeline(Recenter(), TangentSpace(), LogisticRegression())
    >>> clf = clf.fit(X[train], y[train], recenter__groups=subjects[train])
    >>> clf.predict(X[~train]).shape  # subject 4 re-centred by (nearly) its own mean
    (20,)

    Online, one matrix per call, subject 4's statistics kept and updated as they arrive
    (in a Pipeline under metadata routing: ``clf.predict(x, domain=4)``):

    >>> rc = Recenter().fit(X[train], groups=subjects[train])
    >>> Y = [rc.transform(X[i : i + 1], domain=4) for i in (60, 61)]
    >>> rc.domains_
    {4: 2}
    >>> Recenter().fit_transform(X, groups=subjects).shape
    (80, 4, 4)
    """

    __metadata_request__fit = {"groups": True, "subjects": True}
    __metadata_request__transform = {"groups": True, "domain": True}

    _parameter_constraints: dict = {"domain_adaptation": [None, DomainAdaptation]}

    @accepts_renamed(DOMAIN_RENAMED, DOMAIN_MERGES)  # the flat names of before
    def __init__(self, domain_adaptation=None):
        self.domain_adaptation = domain_adaptation

    def set_params(self, **params):
        """Set the parameters (scikit-learn's), the flat names of before
        (:data:`~skfedspd.renamed.DOMAIN_RENAMED`) included, with a ``FutureWarning``."""
        return super().set_params(**check_nested_params(self, fold_renamed(self, params, DOMAIN_RENAMED, DOMAIN_MERGES)))

    def _validate_params(self):
        super()._validate_params()
        adaptation_of(self).check_params()  # the settings object checks its own parameters

    def _fit(self, X, groups, *, transforming=False):
        """Validated ``X``; sets ``n_features_in_``, ``input_range_`` and the prior,
        forgets stored domains. ``transforming`` (``fit_transform``): the groups are
        re-centred, :func:`~skfedspd.validation.check_domain_sizes` first."""
        X, summary = check_spd_batch(X, return_summary=True)
        _group_labels(groups, len(X))
        if transforming and groups is not None:
            check_domain_sizes(np.asarray(groups), "Recenter")
        with torch.no_grad():
            log_sum = log_euclidean_sum(torch.as_tensor(X))
        stats = DomainStatistics([X.shape[1]], torch.float64)
        stats.set_prior([log_sum], len(X))
        self.n_features_in_ = X.shape[1]
        self.input_range_ = input_range(summary)
        self.domain_statistics_ = stats
        return X

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, groups=None, subjects=None):
        """Check ``X`` (and ``groups``); store the matrix size and the prior.

        The prior, which a new domain's statistics start from, is the log-Euclidean mean of
        ``X`` (additive over sites; see :mod:`skfedspd.online`). Stored domains are
        forgotten.

        Parameters
        ----------
        X : array-like of shape (n_matrices, n, n)
            SPD matrices.
        y : ignored
        groups : array-like of shape (n_matrices,), default=None
            Domain of each matrix (checked here; used by ``fit_transform``).
        subjects : array-like of shape (n_matrices,), default=None
            Alias of ``groups`` (MOABB's ``CrossSubjectEvaluation`` routes the training
            subjects under this key). Requested by default.

        Returns
        -------
        self
        """
        self._fit(X, resolve_groups(groups, subjects))
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def fit_transform(self, X, y=None, groups=None, subjects=None):
        """``fit(X, y, groups)``, then each training group re-centred by its own Riemannian
        mean (``subjects``: alias of ``groups``, as in :meth:`fit`). A group of one trial
        would be the identity: refused when every group is one trial, warned about when
        some are (:func:`~skfedspd.validation.check_domain_sizes`)."""
        groups = resolve_groups(groups, subjects)
        return recenter_groups(self._fit(X, groups, transforming=True), groups)

    def _update(self, X, domain, groups, *, keep):
        """Validate, add the trials of ``X`` to their domains in order; return ``(X, update)``
        (a :class:`~skfedspd.online.DomainUpdate`, stored only with ``keep``, after
        everything succeeded)."""
        check_is_fitted(self)
        self._validate_params()  # set_params since fit: the same constraints, naming the parameter
        X, summary = check_spd_batch(X, self.n_features_in_, return_summary=True)
        check_input_range(summary, getattr(self, "input_range_", None))
        if domain is not None and groups is not None:
            raise ValueError("pass either domain (persistent statistics) or groups (one temporary domain per group), "
                             "not both")
        if domain is not None:
            labels = domain_labels(domain, len(X))
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
        """The stored statistics; for a Recenter pickled before they existed, an empty
        store without a prior (stored only by a call that updates it)."""
        stats = getattr(self, "domain_statistics_", None)
        return DomainStatistics([self.n_features_in_], torch.float64) if stats is None else stats

    def transform(self, X, groups=None, domain=None):
        """Update the domains of ``X``'s matrices, then re-centre each by its domain's mean
        (without the matrix itself unless ``domain_adaptation.include_self``).

        Parameters
        ----------
        X : array-like of shape (n_matrices, n, n)
            SPD matrices of the size seen in ``fit``.
        groups : array-like of shape (n_matrices,), default=None
            Each group a temporary domain (started from the prior, not kept).
        domain : str, int or array-like of shape (n_matrices,), default=None
            The domain of the matrices (one label, or one per row): its statistics are
            updated with ``X`` in order, kept, and used for every matrix. Neither: ``X`` is
            one temporary domain.

        Returns
        -------
        ndarray of shape (n_matrices, n, n)
            Re-centred matrices.
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
        """Unlabeled calibration: add the matrices of ``X``, in order, to ``domain``'s
        statistics (a new domain starts from the prior).

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
