"""``Recenter``: unsupervised re-centring of SPD matrices to the identity (Zanini et al., 2018)."""

import warnings

import numpy as np
import torch
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import check_is_fitted

from .base import resolve_groups
from .classifier import check_spd_batch
from .functional import karcher_mean, sqrtm_invsqrtm

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
    groups = np.asarray(groups)
    if groups.ndim != 1 or len(groups) != n_samples:
        raise ValueError(
            f"groups must be a 1-D array with one entry per matrix ({n_samples}), got shape {groups.shape}"
        )
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


class Recenter(TransformerMixin, BaseEstimator):
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

    The transformer is *unsupervised and transductive*: nothing learned in ``fit`` is used to
    transform other data. Every call re-centres the data it is given with that data's own
    means:

    - ``fit_transform(X, groups=g)`` (what a :class:`~sklearn.pipeline.Pipeline` calls on the
      training data) re-centres each training group by its own mean;
    - ``transform(X, groups=g)`` re-centres each group of ``X`` by its own mean;
      ``transform(X)`` without groups treats all of ``X`` as **one** domain.

    In a Pipeline, ``predict(X_test)`` therefore re-centres the test data by the test data's
    own mean (unlabeled test-time adaptation). This is the intended use when the test set
    is one new domain, e.g. MOABB's ``CrossSubjectEvaluation`` (each test fold is one unseen
    subject: route ``groups``/``subjects`` into fit so the training subjects are re-centred
    one by one). Under MOABB's ``WithinSessionEvaluation`` (and CrossSession) the pipeline
    is fitted on one session's training folds and scored on the held-out fold of the same
    session: the training part (no groups: one domain) and the test fold are each
    re-centred by their own mean, which is the identity map up to a common congruence when
    both folds share the session's mean, and noisy when the test fold is small (a handful of
    trials estimate an ``n×n`` mean). A test set mixing several domains without ``groups``
    is re-centred as one domain; pass ``groups`` to ``predict`` (metadata routing) to
    re-centre them one by one. A test set of a single matrix is mapped to the identity.

    ``groups`` is requested from metadata routing for ``fit`` and ``transform`` by default,
    so under ``sklearn.set_config(enable_metadata_routing=True)`` ``Pipeline``,
    ``GridSearchCV`` and ``cross_validate(..., params={"groups": g})`` route it here
    (also to a ``GroupKFold`` splitter). Without routing pass it directly
    (``fit_transform(X, groups=g)``, ``pipeline.fit(X, y, recenter__groups=g)``). MOABB's
    CrossSubject routes the training subjects as ``subjects``, an alias of ``groups`` that
    ``fit`` also requests by default: each training subject is re-centred by its own mean.

    Attributes
    ----------
    n_features_in_ : int
        Size of the matrices seen in ``fit``.

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
    >>> clf.predict(X[~train]).shape  # subject 4 re-centred by its own mean
    (20,)
    >>> Recenter().fit_transform(X, groups=subjects).shape
    (80, 4, 4)
    """

    __metadata_request__fit = {"groups": True, "subjects": True}
    __metadata_request__transform = {"groups": True}

    def fit(self, X, y=None, groups=None, subjects=None):
        """Check ``X`` (and ``groups``); store the matrix size.

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
        X = check_spd_batch(X)
        _group_labels(resolve_groups(groups, subjects), len(X))
        self.n_features_in_ = X.shape[1]
        return self

    def transform(self, X, groups=None):
        """Re-centre each group of ``X`` by its own Riemannian mean.

        Parameters
        ----------
        X : array-like of shape (n_matrices, n, n)
            SPD matrices of the size seen in ``fit``.
        groups : array-like of shape (n_matrices,), default=None
            Domain of each matrix; None: ``X`` is one domain.

        Returns
        -------
        ndarray of shape (n_matrices, n, n)
            Re-centred matrices (each group's Riemannian mean is the identity).
        """
        check_is_fitted(self)
        return recenter_groups(check_spd_batch(X, self.n_features_in_), groups)

    def fit_transform(self, X, y=None, groups=None, subjects=None):
        """``fit(X, y, groups).transform(X, groups)`` with one validation pass (``subjects``:
        alias of ``groups``, as in :meth:`fit`)."""
        X = check_spd_batch(X)
        self.n_features_in_ = X.shape[1]
        return recenter_groups(X, resolve_groups(groups, subjects))

    def __sklearn_is_fitted__(self):
        return hasattr(self, "n_features_in_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        tags.requires_fit = True
        return tags
