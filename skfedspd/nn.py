"""SPDnet layers (BiMap, ReEig, LogEig, vech) and the ``SPDNet`` module.

Parameters of every module here can be exported and imported as named numpy arrays together
with their *kind* — ``"stiefel"`` (aggregated on the Stiefel manifold), ``"euclidean"``
(aggregated by weighted mean) or ``"local"`` (never leaves a client) — which is what the
federated layer needs.
"""

from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from .functional import (
    expm_sym,
    karcher_mean,
    log_clamp,
    logeig,
    reeig,
    reeig_logeig,
    reeig_logeig_vech,
    spd_geodesic,
    spectral_vech_backward,
    spectral_vech_forward,
    sqrtm_invsqrtm,
    vech,
)
from .stiefel import orthonormality_problem, polar, polar_newton_schulz, random_stiefel, tangent_project

__all__ = [
    "BiMap",
    "ReEig",
    "LogEig",
    "ReEigLogEig",
    "Vech",
    "SPDBatchNorm",
    "DomainSPDBatchNorm",
    "DomainBatch",
    "SPDNet",
    "FederatedModule",
]


def _tangent_adjoint(W, G):
    """``P_W(G) = G − W sym(WᵀG)`` for ``W`` on the manifold (2-D)."""
    A = W.transpose(-1, -2) @ G
    return torch.addmm(G, W, A + A.transpose(-1, -2), alpha=-0.5)


def _centred_grads(ctx, grad_W, grad_X):
    """Gradients ``(W, X, V)`` of a congruence node, centred or not (see :meth:`BiMap.forward`)."""
    if ctx.centred:
        grad_V = None
        if ctx.needs_input_grad[2]:
            grad_V = _tangent_adjoint(ctx.saved_tensors[0], grad_W)
        return None, grad_X, grad_V
    return grad_W, grad_X, None


class _Congruence(torch.autograd.Function):
    """``Y = Wᵀ X W`` for one ``W`` (``n×k``) and a batch ``X`` (``..., n, n``).

    Same values and exact gradients as ``W.mT @ X @ W`` under autograd, without the
    layout copies that broadcasting a 2-D ``W`` against a batch costs (forward and backward):
    ``Z = X W`` is one ``(batch·n)×n`` by ``n×k`` product, and

        ∇W = Σ_b (X_bᵀ W G_b + X_b W G_bᵀ) = X_flatᵀ (W G)_flat + Σ_b Z_b G_bᵀ,
        ∇X_b = W G_b Wᵀ,

    valid for any (not necessarily symmetric) ``X`` and upstream gradient ``G``. With a third
    argument ``V`` (the chart-centre form used by :meth:`BiMap.forward`: ``W`` is ``W_ref``
    and ``V = 0``) the weight gradient goes to ``V`` as ``P_W(∇W)`` — the adjoint of the
    retraction's differential at 0, as in :class:`_ChartCentre` — and ``W`` gets none.
    """

    @staticmethod
    def forward(ctx, W, X, V=None):
        n, k = W.shape
        Z = (X.reshape(-1, n) @ W).view(X.shape[:-1] + (k,))  # X_b W
        ctx.save_for_backward(W, X, Z)
        ctx.centred = V is not None
        Zb = Z.reshape(-1, n, k)
        return torch.bmm(W.transpose(0, 1).expand(Zb.shape[0], k, n), Zb).view(X.shape[:-2] + (k, k))

    @staticmethod
    def backward(ctx, G):
        W, X, Z = ctx.saved_tensors
        n, k = W.shape
        Gb = G.reshape(-1, k, k)
        M = torch.bmm(W.expand(Gb.shape[0], n, k), Gb)  # W G_b
        grad_W = grad_X = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[2]:
            ZGt = torch.bmm(Z.reshape(-1, n, k), Gb.transpose(-1, -2)).sum(0)  # Σ_b X_b W G_bᵀ
            grad_W = torch.addmm(ZGt, X.reshape(-1, n).transpose(0, 1), M.view(-1, k))
        if ctx.needs_input_grad[1]:
            grad_X = (M @ W.transpose(-1, -2)).view(X.shape)
        return _centred_grads(ctx, grad_W, grad_X)


class _SymCongruence(torch.autograd.Function):
    """``Y = Wᵀ X W`` for a batch of *symmetric* ``X``: the same forward as
    :class:`_Congruence`, a cheaper backward.

    With ``Xᵀ = X`` the weight gradient collapses to

        ∇W = Σ_b (X_b W G_bᵀ + X_b W G_b) = Σ_b Z_b (G_b + G_bᵀ),   Z = X W,

    one batched ``(n×k)(k×k)`` product on the ``Z`` already computed by the forward pass:
    ``X`` is neither saved nor read again (the general form needs a second pass over ``X``).
    The input gradient ``∇X_b = W G_b Wᵀ`` holds for any ``G`` and is computed only when
    ``X`` requires it. The value is exact for any ``X``; the weight gradient is exact when
    ``X`` is symmetric (for an ``X`` that is not, it is off by ``Σ_b (X_b − X_bᵀ) W G_b``:
    rounding level for inputs symmetric to rounding).
    """

    @staticmethod
    def forward(ctx, W, X, V=None):
        n, k = W.shape
        Z = (X.reshape(-1, n) @ W).view(-1, n, k)  # X_b W
        ctx.save_for_backward(W, Z)
        ctx.x_shape = X.shape
        ctx.centred = V is not None
        Y = torch.bmm(W.transpose(0, 1).expand(Z.shape[0], k, n), Z)
        return Y.view(X.shape[:-2] + (k, k))

    @staticmethod
    def backward(ctx, G):
        W, Z = ctx.saved_tensors
        n, k = W.shape
        Gb = G.reshape(-1, k, k)
        grad_W = grad_X = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[2]:
            grad_W = torch.bmm(Z, Gb + Gb.transpose(-1, -2)).sum(0)
        if ctx.needs_input_grad[1]:
            M = torch.bmm(W.expand(Gb.shape[0], n, k), Gb)  # W G_b
            grad_X = (M @ W.transpose(-1, -2)).view(ctx.x_shape)
        return _centred_grads(ctx, grad_W, grad_X)


class _CentredBiMapSpectralVech(torch.autograd.Function):
    """``vech(f(Wᵀ X W))`` for symmetric ``X`` at the chart centre, in one autograd node.

    The composition of :class:`_SymCongruence` (centred form: ``W = W_ref``, weight gradient
    to ``V`` through ``P_W``) and the spectral ``vech`` node of :mod:`skfedspd.functional`,
    with the same value and the same exact gradients. One node instead of two, and the
    gradient ``G`` reaching the congruence is the spectral adjoint ``U K Uᵀ``, symmetric by
    construction, so ``∇W = Σ_b Z_b (G_b + G_bᵀ) = 2 Σ_b Z_b G_b``.
    """

    @staticmethod
    def forward(ctx, W, X, V, f, df):
        n, k = W.shape
        Z = (X.reshape(-1, n) @ W).view(-1, n, k)  # X_b W
        Y = torch.bmm(W.transpose(0, 1).expand(Z.shape[0], k, n), Z)
        out, lam, U, f_lam = spectral_vech_forward(Y, f)
        ctx.save_for_backward(W, Z, lam, U, f_lam)
        ctx.df = df
        ctx.x_shape = X.shape
        return out.view(X.shape[:-2] + out.shape[-1:])

    @staticmethod
    def backward(ctx, grad):
        W, Z, lam, U, f_lam = ctx.saved_tensors
        n, k = W.shape
        G = spectral_vech_backward(grad.reshape(-1, grad.shape[-1]), lam, U, f_lam, ctx.df)
        grad_X = grad_V = None
        if ctx.needs_input_grad[2]:
            grad_V = _tangent_adjoint(W, torch.bmm(Z, G).sum(0).mul_(2.0))
        if ctx.needs_input_grad[1]:
            M = torch.bmm(W.expand(G.shape[0], n, k), G)  # W G_b
            grad_X = (M @ W.transpose(-1, -2)).view(ctx.x_shape)
        return None, grad_X, grad_V, None, None


def _fast_path(W, X):
    return W.dim() == 2 and X.dim() >= 2 and X.dtype == W.dtype and X.device == W.device


def congruence(W, X, symmetric=False):
    """``Wᵀ X W`` (batched over ``X``), with a copy-free backward for a 2-D ``W``.

    ``symmetric=True`` promises ``Xᵀ = X`` (SPD inputs, ReEig outputs): same value, a
    cheaper weight gradient (see :class:`_SymCongruence`) that is exact under that promise.
    """
    if not _fast_path(W, X):
        return W.transpose(-1, -2) @ X @ W
    return (_SymCongruence if symmetric else _Congruence).apply(W, X)


class _ChartCentre(torch.autograd.Function):
    """``W(V) = uf(W_ref + P_{W_ref}(V))`` at ``V = 0``: value ``W_ref``, adjoint ``P_{W_ref}``.

    The polar retraction's differential at 0 is the identity on the tangent space, so the
    composite's differential is ``P_{W_ref}`` (self-adjoint). Valid for ``W_ref`` on the
    manifold only; :class:`BiMap` checks that before using it.
    """

    @staticmethod
    def forward(ctx, V, W_ref):
        ctx.save_for_backward(W_ref)
        return W_ref.clone()

    @staticmethod
    def backward(ctx, G):
        (W_ref,) = ctx.saved_tensors
        return _tangent_adjoint(W_ref, G), None  # P_{W_ref}(G)


def _on_stiefel(W):
    """``‖WᵀW − I‖_F`` at rounding level (``16·k·eps``), so ``uf(W) = W`` (one host sync)."""
    W = W.detach()
    gram = W.transpose(-1, -2) @ W
    gram.diagonal(dim1=-2, dim2=-1).sub_(1.0)
    return bool(torch.linalg.matrix_norm(gram) <= 16 * W.shape[-1] * torch.finfo(W.dtype).eps)


def _version(t):
    """``t._version``, or ``None`` for inference tensors (no version counter)."""
    return None if t.is_inference() else t._version


class BiMap(nn.Module):
    """Bilinear map ``Σ ↦ WᵀΣW`` with ``W ∈ St(in_dim, out_dim)``.

    ``W`` is trained by tangent-space local trivialization (Ablin et al., 2024):

        W = R_{W_ref}(P_{W_ref}(V)) = uf(W_ref + P_{W_ref}(V)),

    ``W_ref`` a buffer on the manifold and ``V`` a free Euclidean parameter starting at 0,
    so any torch optimizer (Adam, SGD, weight decay...) updates ``V`` while ``W`` stays
    exactly orthonormal. The polar factor has a custom SVD-free backward
    (:func:`skfedspd.stiefel.polar`), exact and finite at ``V = 0`` where autograd through
    the SVD is NaN. At the chart centre itself (``V = 0``, ``W_ref`` orthonormal to working
    precision — every forward pass when re-centring after each step) the SVD is skipped:
    ``uf(W_ref) = W_ref`` and the retraction's differential there is ``P_{W_ref}``, so the
    value and the gradient are the same; the forward pass is then a single autograd node
    (congruence by ``W_ref``, weight gradient mapped to ``V`` by ``P_{W_ref}``). Whether
    ``W_ref`` is orthonormal is checked once and remembered until the buffer changes (its
    version counter); ``V == 0`` is checked at every call.

    ``symmetric=True`` declares that the inputs are symmetric (SPD matrices, ReEig outputs),
    which :class:`SPDNet` does: the weight gradient then needs no second pass over the input
    (see :class:`_SymCongruence`). Leave it ``False`` for general square inputs.

    :meth:`recenter_` moves the chart: ``W_ref ← W``, ``V ← 0``, the polar factor from
    Newton–Schulz steps (:func:`skfedspd.stiefel.polar_newton_schulz`; an SVD when ``V`` is
    far from 0). The training loop calls it every ``recenter_every`` optimizer steps;
    :meth:`set_weight` (the federated broadcast) does it as well. Optimizer state attached to ``V`` (Adam moments) is kept across a
    re-centring: it is expressed in ambient coordinates, and the projection ``P_{W_ref}``
    in the forward pass maps it to the new tangent space, whose difference from the old one
    is of the order of one step. The same holds for a federated client that keeps its Adam state
    from one round to the next (the broadcast moves the chart by one round's aggregate step).

    Examples
    --------
    Any torch optimizer steps ``V``; after :meth:`recenter_` the weight is still orthonormal:

    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.nn import BiMap
    >>> from skfedspd.stiefel import orthonormality_error
    >>> X = torch.as_tensor(make_spd_classification(n_matrices=8, n_channels=4, seed=0)[0])
    >>> bimap = BiMap(4, 2, seed=0, symmetric=True)
    >>> bimap(X).shape
    torch.Size([8, 2, 2])
    >>> optimizer = torch.optim.Adam(bimap.parameters(), lr=0.1)
    >>> bimap(X).diagonal(dim1=-2, dim2=-1).sum().backward()
    >>> optimizer.step()
    >>> bimap.recenter_()
    >>> bool(orthonormality_error(bimap.weight.detach()) < 1e-12), bool(bimap.V.any())
    (True, False)
    """

    def __init__(self, in_dim, out_dim, seed=None, dtype=torch.float64, symmetric=False):
        super().__init__()
        if out_dim > in_dim:
            raise ValueError(f"BiMap reduces dimension: out_dim={out_dim} > in_dim={in_dim}")
        self.symmetric = bool(symmetric)
        W0 = torch.as_tensor(random_stiefel(in_dim, out_dim, seed), dtype=dtype)
        self.register_buffer("W_ref", W0)
        self.V = nn.Parameter(torch.zeros_like(W0))
        self._stiefel_mark = None

    def _ref_on_stiefel(self):
        """Whether ``W_ref`` is orthonormal to rounding; cached until ``W_ref`` changes.

        :meth:`recenter_` marks the polar factor it writes; any later in-place change of the
        buffer (``copy_``, ``load_state_dict``, :meth:`set_weight`) bumps its version counter
        and a replaced buffer (``.to()``) is another tensor, so either triggers a new check.
        (Writes through ``W_ref.data`` bypass the version counter: use :meth:`set_weight`.)
        """
        W = self.W_ref
        mark = self._stiefel_mark
        if mark is not None and mark[0] is W and mark[1] == _version(W):
            return True
        if not _on_stiefel(W):
            return False
        self._mark_stiefel()
        return True

    def _mark_stiefel(self):
        version = _version(self.W_ref)
        self._stiefel_mark = None if version is None else (self.W_ref, version)

    def _at_centre(self):
        """``V == 0`` and ``W_ref`` on the manifold: ``W = uf(W_ref) = W_ref`` (see class doc)."""
        return not bool(self.V.detach().any()) and self._ref_on_stiefel()

    @property
    def weight(self):
        W_ref, V = self.W_ref, self.V
        if self._at_centre():
            # Chart centre (every step when re-centring each step): uf(W_ref) = W_ref to
            # rounding and the differential is P_{W_ref}, so skip the SVD and its backward.
            return _ChartCentre.apply(V, W_ref)
        return polar(W_ref + tangent_project(W_ref, V))

    def _centred_node_applies(self, X):
        """At the chart centre, with the layouts of the fused autograd nodes."""
        return not self.W_ref.requires_grad and _fast_path(self.W_ref, X) and self._at_centre()

    def forward(self, X):
        if self._centred_node_applies(X):
            # Same value and gradient as congruence(self.weight, X), one autograd node.
            return (_SymCongruence if self.symmetric else _Congruence).apply(self.W_ref, X, self.V)
        return congruence(self.weight, X, symmetric=self.symmetric)

    @torch.no_grad()
    def recenter_(self):
        # Always the polar factor (no chart-centre shortcut): at V = 0 it re-orthonormalises;
        # except for a frozen BiMap (V without gradient: SPDnetClassifier(trainable="head")),
        # which keeps its weight exactly.
        W, V = self.W_ref, self.V
        if not V.requires_grad:
            return
        M = W.transpose(-1, -2) @ V
        A = torch.addmm(W + V, W, M + M.transpose(-1, -2), alpha=-0.5)  # W + P_W(V)
        # A = W + ξ with ξ tangent: AᵀA = I + ξᵀξ, close to I after one step or a few, so
        # Newton–Schulz steps reach the polar factor without an SVD (SVD fallback for a far V).
        W.copy_(polar_newton_schulz(A))
        V.zero_()
        self._mark_stiefel()

    @torch.no_grad()
    def set_weight(self, W):
        self.W_ref.copy_(torch.as_tensor(W, dtype=self.W_ref.dtype))
        self.V.zero_()

    def __getstate__(self):
        # The Stiefel mark holds a tensor and a version counter value: never carry it over.
        return {**self.__dict__, "_stiefel_mark": None}

    def __setstate__(self, state):
        # Modules pickled before these attributes existed: the general (always exact) path.
        state = {"symmetric": False, **state, "_stiefel_mark": None}
        super().__setstate__(state)


class _SPDNormalization(nn.Module):
    """Shared part of the SPD batch normalizations: batch mean, whitening, SPD bias.

    A batch ``X`` with (Fréchet) mean ``M`` becomes ``C X Cᵀ`` with ``C = B^{1/2} M^{-1/2}``:
    congruence to the identity (``M^{-1/2} X M^{-1/2}`` has mean ``I``), then to the bias
    ``B`` (the output's mean). ``B = exp(sym(log_bias))`` stays SPD whatever value the
    Euclidean parameter ``log_bias`` (zeros: ``B = I``) takes, so any optimizer trains it,
    and the federated weighted mean of ``log_bias`` is the log-Euclidean mean of the biases.

    Metric: see :class:`SPDBatchNorm`.
    """

    def __init__(self, n, karcher_steps=1, dtype=torch.float64):
        super().__init__()
        if karcher_steps < 0:
            raise ValueError(f"karcher_steps must be >= 0, got {karcher_steps}")
        self.karcher_steps = int(karcher_steps)
        self.log_bias = nn.Parameter(torch.zeros(n, n, dtype=dtype))
        self._bias_half_cache = None

    def bias(self):
        """The SPD bias ``B = exp(sym(log_bias))``."""
        L = self.log_bias
        return expm_sym(0.5 * (L + L.transpose(-1, -2)))

    def batch_mean(self, X):
        return karcher_mean(X, self.karcher_steps)

    def normalize(self, X, M):
        """``C X Cᵀ``, ``C = B^{1/2} M^{-1/2}``: mean ``M`` to the identity, then to ``B``."""
        return self.whiten(X, sqrtm_invsqrtm(M)[1])

    def whiten(self, X, M_inv_half):
        """``C X Cᵀ``, ``C = B^{1/2} M^{-1/2}``, from ``M^{-1/2}`` (one per matrix of ``X``, or
        one for all): the mean's inverse square root is what the running domain statistics
        of :mod:`skfedspd.online` keep, so re-centring by them needs no decomposition."""
        C = self._bias_half() @ M_inv_half
        return C @ X @ C.transpose(-1, -2)

    def _bias_half(self):
        """``B^{1/2}``; without autograd, computed once per value of ``log_bias`` (its
        version counter), so an online prediction does not decompose it at every call."""
        L = self.log_bias
        if torch.is_grad_enabled():
            return expm_sym(0.25 * (L + L.transpose(-1, -2)))
        key = (L.data_ptr(), _version(L))
        cached = getattr(self, "_bias_half_cache", None)  # modules pickled before the cache
        if cached is None or cached[0] != key:
            cached = self._bias_half_cache = (key, expm_sym(0.25 * (L + L.transpose(-1, -2))))
        return cached[1]

    def normalize_batch(self, X):
        """Normalize ``X`` by its own mean (no side effect)."""
        return self.normalize(X, self.batch_mean(X))


class SPDBatchNorm(_SPDNormalization):
    """Riemannian batch normalization of SPD matrices (Brooks et al., NeurIPS 2019).

    Training: each batch ``X`` (shape ``(m, n, n)``) is congruence-normalized by its own
    affine-invariant mean ``M`` to the learnable SPD bias ``B`` (metric: see Notes),
    and the running mean moves along the affine-invariant geodesic towards ``M``:
    ``G ← G #_momentum M = G^{1/2} (G^{-1/2} M G^{-1/2})^momentum G^{1/2}``. Evaluation: the
    running mean ``G`` is used. Batches of one matrix are mapped to ``B`` exactly.

    Parameters
    ----------
    n : int
        Matrix size.
    momentum : float in (0, 1], default=0.1
        Geodesic step of the running mean towards each batch mean.
    karcher_steps : int, default=1
        Karcher fixed-point steps after the log-Euclidean start (0: log-Euclidean mean).
    dtype : torch.dtype

    Attributes
    ----------
    running_mean : buffer of shape (n, n)
        Exported as a ``"local"`` parameter by :class:`SPDNet` (a client's statistic).
    log_bias : parameter of shape (n, n)
        ``B = exp(sym(log_bias))``; exported as ``"euclidean"``.

    Notes
    -----
    The mean is the affine-invariant (Karcher) mean, from the log-Euclidean mean followed
    by ``karcher_steps`` exact fixed-point steps (:func:`skfedspd.functional.karcher_mean`),
    back-propagated through with exact Daleckii–Krein gradients. Why that metric: only the
    affine-invariant mean is congruence-equivariant (``mean(A X Aᵀ) = A mean(X) Aᵀ``), so
    the whitened batch does not depend on the congruence that separates domains (up to one
    rotation) — the property re-centring relies on, which the log-Euclidean mean lacks
    (it is only orthogonally equivariant). The log-Euclidean start costs one ``eigh`` per
    matrix, is exact when the matrices commute and is within a few 1e-4 of the Karcher
    mean for EEG-like dispersions; each step divides that error by about 50 (measured in
    ``tests/test_nn.py``), so one step (Brooks et al. use one, from the arithmetic mean) is
    at 1e-5 and ``karcher_steps=0`` gives the cheaper log-Euclidean mean.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.functional import karcher_mean
    >>> from skfedspd.nn import SPDBatchNorm
    >>> X = torch.as_tensor(make_spd_classification(n_matrices=16, n_channels=3, seed=0)[0])
    >>> bn = SPDBatchNorm(3)
    >>> Y = bn(X)  # training mode: the batch mean goes to the bias B = I
    >>> # to ~1e-3 here: the batch mean is one Karcher step from the log-Euclidean mean
    >>> torch.allclose(karcher_mean(Y.detach(), 20), torch.eye(3, dtype=X.dtype), atol=1e-2)
    True
    >>> bool((bn.running_mean != torch.eye(3, dtype=X.dtype)).any())  # moved towards the batch mean
    True
    >>> bn.eval()(X[:2]).shape  # evaluation: normalized by the running mean
    torch.Size([2, 3, 3])
    """

    def __init__(self, n, momentum=0.1, karcher_steps=1, dtype=torch.float64):
        super().__init__(n, karcher_steps=karcher_steps, dtype=dtype)
        if not 0 < momentum <= 1:
            raise ValueError(f"momentum must be in (0, 1], got {momentum}")
        self.momentum = float(momentum)
        self.register_buffer("running_mean", torch.eye(n, dtype=dtype))

    def forward(self, X):
        if not self.training:
            return self.normalize(X, self.running_mean)
        M = self.batch_mean(X)
        with torch.no_grad():
            self.running_mean.copy_(spd_geodesic(self.running_mean, M.detach(), self.momentum))
        return self.normalize(X, M)


def domain_codes(domains, n_matrices):
    """Integer codes ``0..n_domains-1`` of per-matrix domain labels (any hashable type)."""
    if isinstance(domains, torch.Tensor):
        domains = domains.detach().cpu().numpy()
    domains = np.asarray(domains)
    if domains.ndim != 1 or len(domains) != n_matrices:
        raise ValueError(
            f"domains must be a 1-D array with one label per matrix ({n_matrices}), got shape {domains.shape}"
        )
    return np.unique(domains, return_inverse=True)[1].reshape(-1)


class DomainBatch:
    """A batch of matrices with one domain label per matrix, indexable like a tensor.

    ``batch[idx]`` (any tensor index: a permutation, a slice) keeps each matrix with its
    domain, and ``len(batch)`` is the number of matrices, so the loops that only index and
    measure their inputs (:func:`skfedspd.training.train_epochs`, ``predict_logits``) carry
    the domains of every minibatch to ``SPDNet(batchnorm="domain")`` unchanged.

    Parameters
    ----------
    X : torch.Tensor of shape (n_matrices, n, n)
    domains : array-like of shape (n_matrices,)
        Domain labels of any hashable type (stored as integer codes).

    statistics : list of torch.Tensor or None, default=None
        Fixed domain statistics: for each batch-norm layer, ``M^{-1/2}`` of every domain's
        mean (shape ``(n_domains, d, d)``, indexed by the codes). ``SPDNet`` then whitens
        each matrix by its domain's entry instead of the batch's own means, so the samples
        of a batch do not interact (DP-SGD, :func:`skfedspd.privacy.release_domain_means`).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.nn import DomainBatch
    >>> batch = DomainBatch(torch.eye(2).expand(3, 2, 2), ["s2", "s1", "s2"])
    >>> len(batch), batch.domains
    (3, tensor([1, 0, 1]))
    >>> batch[torch.tensor([2, 0])].domains  # a minibatch keeps each matrix's domain code
    tensor([1, 1])
    """

    def __init__(self, X, domains, statistics=None):
        self.X = X
        self.domains = torch.as_tensor(domain_codes(domains, len(X)))
        self.statistics = statistics

    def __len__(self):
        return len(self.X)

    def __getitem__(self, index):
        return self.with_inputs(self.X[index], self.domains[index])

    def with_inputs(self, X, domains=None):
        """A batch of ``X`` with this batch's codes (or ``domains``, codes of it) and statistics."""
        batch = DomainBatch.__new__(DomainBatch)
        batch.X, batch.domains, batch.statistics = X, self.domains if domains is None else domains, self.statistics
        return batch


class DomainSPDBatchNorm(_SPDNormalization):
    """SPD batch normalization with domain-specific statistics (SPDDSMBN, Kobler et al., 2022).

    Each domain (subject, session) present in a call is congruence-normalized by the
    affine-invariant mean of *its own* matrices in that call, to one shared learnable SPD
    bias ``B`` — in training (the domains of a minibatch) and in evaluation alike. Calling
    the layer on an unlabeled batch from a new domain therefore re-centres it by its own
    statistics (test-time adaptation, Kobler et al.'s source-free setting with the whole
    target set as one batch); ``domains=None`` makes the whole call one domain. Nothing
    domain-specific is stored: the only state is ``log_bias`` (shared, ``"euclidean"``),
    so no domain statistic can leave a federated client. A domain with a single matrix in
    a call is mapped to ``B`` exactly (its information is lost): keep domains in batches.

    Parameters
    ----------
    n : int
        Matrix size.
    karcher_steps : int, default=1
        Karcher fixed-point steps after the log-Euclidean start (0: log-Euclidean mean).
    dtype : torch.dtype

    Examples
    --------
    Two domains whose matrices differ by a scale: each is re-centred by its own mean.

    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.functional import karcher_mean
    >>> from skfedspd.nn import DomainSPDBatchNorm
    >>> X = torch.as_tensor(make_spd_classification(n_matrices=12, n_channels=3, seed=0)[0])
    >>> X = torch.cat([X[:6], 100 * X[6:]])
    >>> Y = DomainSPDBatchNorm(3)(X, domains=["a"] * 6 + ["b"] * 6).detach()
    >>> eye = torch.eye(3, dtype=X.dtype)
    >>> [torch.allclose(karcher_mean(part, 20), eye, atol=1e-2) for part in (Y[:6], Y[6:])]
    [True, True]
    """

    def forward(self, X, domains=None):
        if domains is None:
            return self.normalize_batch(X)
        codes = domain_codes(domains, X.shape[0])
        if codes.max() == 0:
            return self.normalize_batch(X)
        order = np.argsort(codes, kind="stable")
        bounds = np.flatnonzero(np.diff(codes[order])) + 1
        parts = [self.normalize_batch(X[torch.as_tensor(idx, device=X.device)])
                 for idx in np.split(order, bounds)]
        inverse = torch.as_tensor(np.argsort(order, kind="stable"), device=X.device)
        return torch.cat(parts)[inverse]

class ReEig(nn.Module):
    """Eigenvalue rectification ``U max(eps, Λ) Uᵀ``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.nn import ReEig
    >>> ReEig(eps=0.1)(torch.diag(torch.tensor([1e-3, 2.0], dtype=torch.float64)))
    tensor([[0.1000, 0.0000],
            [0.0000, 2.0000]], dtype=torch.float64)
    """

    def __init__(self, eps=1e-4):
        super().__init__()
        self.eps = eps

    def forward(self, X):
        return reeig(X, self.eps)


class LogEig(nn.Module):
    """Matrix logarithm ``U log(Λ) Uᵀ``.

    Examples
    --------
    >>> import math
    >>> import torch
    >>> from skfedspd.nn import LogEig
    >>> LogEig()(torch.diag(torch.tensor([1.0, math.e], dtype=torch.float64)))
    tensor([[0., 0.],
            [0., 1.]], dtype=torch.float64)
    """

    def forward(self, X):
        return logeig(X)


class ReEigLogEig(nn.Module):
    """ReEig followed by LogEig with one eigendecomposition.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.nn import LogEig, ReEig, ReEigLogEig
    >>> X = torch.as_tensor(make_spd_classification(n_matrices=4, n_channels=3, seed=0)[0])
    >>> torch.allclose(ReEigLogEig(eps=0.5)(X), LogEig()(ReEig(eps=0.5)(X)))
    True
    """

    def __init__(self, eps=1e-4):
        super().__init__()
        self.eps = eps

    def forward(self, X):
        return reeig_logeig(X, self.eps)


class Vech(nn.Module):
    """Half-vectorisation with √2-scaled off-diagonal entries (an isometry).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.nn import Vech
    >>> X = torch.tensor([[[1.0, 2.0], [2.0, 3.0]]], dtype=torch.float64)
    >>> v = Vech()(X)
    >>> v.shape, torch.allclose(v.norm(), X.norm())
    (torch.Size([1, 3]), True)
    """

    def forward(self, X):
        return vech(X)


class FederatedModule(nn.Module):
    """A module whose state can be exported/imported as named numpy arrays with kinds.

    Examples
    --------
    A subclass says how the server treats each array (:meth:`parameter_kinds`):

    >>> import numpy as np
    >>> import torch
    >>> from skfedspd.nn import FederatedModule
    >>> class Linear(FederatedModule):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = torch.nn.Linear(3, 2)
    ...     def parameter_kinds(self):
    ...         return {"fc.weight": "euclidean", "fc.bias": "euclidean"}
    ...     def forward(self, x):
    ...         return self.fc(x)
    >>> module = Linear()
    >>> module.set_parameters({"fc.bias": np.ones(2, dtype=np.float32)})
    >>> module.get_parameters()["fc.bias"]
    array([1., 1.], dtype=float32)
    >>> module.set_parameters({"fc.scale": np.ones(2)})
    Traceback (most recent call last):
    ...
    KeyError: "unknown parameter names: ['fc.scale']"
    """

    def parameter_kinds(self):
        """Ordered mapping ``name → "stiefel" | "euclidean" | "local"``."""
        raise NotImplementedError

    def after_step_(self):
        """Hook run by the training loop after every optimizer step (default: nothing)."""

    def get_parameters(self):
        """Named numpy copies of the exported state (the keys of :meth:`parameter_kinds`)."""
        state = self._exported_state()
        return OrderedDict(
            (name, state[name].detach().cpu().numpy().copy()) for name in self.parameter_kinds()
        )

    def set_parameters(self, arrays):
        """Load named arrays (a subset of :meth:`parameter_kinds` is allowed).

        Every array is checked before any is loaded, so a refused call changes nothing:
        a known name, the parameter's shape, real finite values, and for a ``"stiefel"``
        array orthonormal columns within :func:`~skfedspd.stiefel.stiefel_tolerance` of the
        module's dtype (a non-orthonormal array would otherwise be silently replaced by its
        polar factor). ``KeyError`` for an unknown name, ``ValueError`` naming the array
        otherwise.
        """
        kinds = self.parameter_kinds()
        unknown = set(arrays) - set(kinds)
        if unknown:
            raise KeyError(f"unknown parameter names: {sorted(unknown)}")
        state = self._loadable_state()
        checked = {}
        for name, value in arrays.items():
            value = np.asarray(value)
            if value.shape != tuple(state[name].shape):
                raise ValueError(f"parameter {name!r} has shape {value.shape}, expected {tuple(state[name].shape)}")
            if value.dtype.kind not in "fiu" or not np.isfinite(value).all():
                raise ValueError(f"parameter {name!r} must be a finite real array, got dtype {value.dtype}"
                                 + (f" with {int((~np.isfinite(value)).sum())} non-finite values"
                                    if value.dtype.kind == "f" else ""))
            if kinds[name] == "stiefel":
                dtype = np.float32 if state[name].dtype == torch.float32 else np.float64
                problem = orthonormality_problem(value.astype(np.float64, copy=False), dtype)
                if problem:
                    raise ValueError(f"parameter {name!r} {problem}")
            checked[name] = value
        with torch.no_grad():
            for name, value in checked.items():
                self._load_array(name, torch.as_tensor(value), state)

    def _exported_state(self):
        return self.state_dict(keep_vars=True)

    def _loadable_state(self):
        """Tensors of the exported names and shapes that :meth:`_load_array` writes to."""
        return self._exported_state()

    def _load_array(self, name, value, state):
        if not state[name].dtype.is_floating_point:
            value = value.round()  # a pooled count (a weighted mean, or a quantized secure sum)
        state[name].copy_(value)


class SPDNet(FederatedModule):
    """SPDnet (Huang & Van Gool, 2017): BiRe blocks → LogEig → vech → Linear.

    Inputs are batches of symmetric (SPD) matrices: the BiMaps are built with
    ``symmetric=True`` (exact weight gradients for symmetric inputs, see :class:`BiMap`), and
    at the chart centre the last BiMap, ReEig, LogEig and vech form one autograd node.

    Parameters
    ----------
    n_channels : int
        Input matrix size ``d_0``.
    hidden_dims : sequence of int
        Output size of each BiMap; one BiRe block (BiMap + ReEig) per entry. The last
        block's ReEig and the LogEig share one eigendecomposition.
    n_classes : int
        Number of outputs (logits).
    eps : float
        ReEig threshold.
    recenter_every : int
        Re-centre the BiMap charts every this many optimizer steps.
    seed : int or None
        Seed of the Stiefel initialisation (the linear head uses torch's default init,
        drawn from the caller's RNG state).
    dtype : torch.dtype
    batchnorm : {None, "spd", "domain"}, default=None
        SPD batch normalization after each BiMap (before its ReEig): ``"spd"``
        (:class:`SPDBatchNorm`, running mean at evaluation) or ``"domain"``
        (:class:`DomainSPDBatchNorm`, each domain of a call normalized by its own mean;
        ``forward(X, domains)``). None keeps the network (and its fused fast path) as is.
    bn_momentum : float, default=0.1
        Running-mean momentum of ``batchnorm="spd"``.
    karcher_steps : int, default=1
        Karcher steps of the batch means (0: log-Euclidean mean).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.nn import SPDNet
    >>> X = torch.as_tensor(make_spd_classification(n_matrices=5, n_channels=6, seed=0)[0])
    >>> net = SPDNet(n_channels=6, hidden_dims=(4, 3), n_classes=2, seed=0)
    >>> net(X).shape, net.features(X).shape  # logits; vech of a 3 x 3 logarithm
    (torch.Size([5, 2]), torch.Size([5, 6]))
    >>> dict(net.parameter_kinds())
    {'bimaps.0.weight': 'stiefel', 'bimaps.1.weight': 'stiefel', 'head.weight': 'euclidean', 'head.bias': 'euclidean'}
    >>> params = net.get_parameters()  # what a federated client sends
    >>> params["bimaps.0.weight"].shape
    (6, 4)
    >>> net.set_parameters(params)  # what it loads from the server's broadcast
    """

    def __init__(
        self, n_channels, hidden_dims, n_classes, eps=1e-4, recenter_every=1, seed=None, dtype=torch.float64,
        batchnorm=None, bn_momentum=0.1, karcher_steps=1,
    ):
        super().__init__()
        if batchnorm not in (None, "spd", "domain"):
            raise ValueError(f"batchnorm must be None, 'spd' or 'domain', got {batchnorm!r}")
        self.batchnorm = batchnorm
        if recenter_every < 1:
            raise ValueError(f"recenter_every must be >= 1, got {recenter_every}")
        self.recenter_every = int(recenter_every)
        self._steps_since_recenter = 0
        hidden_dims = tuple(int(d) for d in hidden_dims)
        if not hidden_dims:
            raise ValueError("hidden_dims needs at least one BiRe block")
        dims = (int(n_channels),) + hidden_dims
        seeds = np.random.SeedSequence(seed).spawn(len(hidden_dims))
        self.bimaps = nn.ModuleList(
            BiMap(
                dims[i], dims[i + 1], seed=np.random.default_rng(seeds[i]), dtype=dtype, symmetric=True
            )
            for i in range(len(hidden_dims))
        )
        self.eps = eps
        self.head = nn.Linear(hidden_dims[-1] * (hidden_dims[-1] + 1) // 2, n_classes, dtype=dtype)
        if batchnorm == "spd":
            self.batchnorms = nn.ModuleList(
                SPDBatchNorm(d, momentum=bn_momentum, karcher_steps=karcher_steps, dtype=dtype) for d in hidden_dims
            )
        elif batchnorm == "domain":
            self.batchnorms = nn.ModuleList(
                DomainSPDBatchNorm(d, karcher_steps=karcher_steps, dtype=dtype) for d in hidden_dims
            )

    @staticmethod
    def state_shapes(n_channels, hidden_dims, n_classes, batchnorm=None):
        """Name → shape of the ``state_dict`` of ``SPDNet(n_channels, hidden_dims,
        n_classes, batchnorm=batchnorm)``, computed without building it (a saved file is
        checked against it before its network is allocated).

        Examples
        --------
        >>> from skfedspd.nn import SPDNet
        >>> net = SPDNet(6, (4, 3), 2, batchnorm="spd")
        >>> SPDNet.state_shapes(6, (4, 3), 2, "spd") == {k: tuple(v.shape) for k, v in net.state_dict().items()}
        True
        """
        dims = (int(n_channels),) + tuple(int(d) for d in hidden_dims)
        shapes = {}
        for i in range(len(dims) - 1):
            shapes[f"bimaps.{i}.V"] = shapes[f"bimaps.{i}.W_ref"] = (dims[i], dims[i + 1])
        shapes["head.weight"] = (int(n_classes), dims[-1] * (dims[-1] + 1) // 2)
        shapes["head.bias"] = (int(n_classes),)
        if batchnorm is not None:
            for i, d in enumerate(dims[1:]):
                shapes[f"batchnorms.{i}.log_bias"] = (d, d)
                if batchnorm == "spd":
                    shapes[f"batchnorms.{i}.running_mean"] = (d, d)
        return shapes

    def _reeig_inputs(self, X, normalize=None):
        """The input of each ReEig: the BiMap output, then ``normalize(i, bn, ·)`` with batch norm."""
        for i, bimap in enumerate(self.bimaps):
            if i:
                X = reeig(X, self.eps)
            X = bimap(X)
            if normalize is not None:
                X = normalize(i, self.batchnorms[i], X)
            yield X

    def features(self, X, domains=None):
        """Tangent-space features ``vech(log(ReEig(...)))``, shape ``(batch, d_L(d_L+1)/2)``.

        ``domains`` (one label per matrix) is used by ``batchnorm="domain"`` only; ``X`` may
        also be a :class:`DomainBatch` carrying them.
        """
        statistics = None
        if isinstance(X, DomainBatch):
            if domains is not None:
                raise ValueError("domains given twice: in the DomainBatch and as an argument")
            X, domains, statistics = X.X, X.domains, X.statistics
        if domains is not None and self.batchnorm != "domain":
            raise ValueError(f"domains are used by batchnorm='domain' only (this network has batchnorm={self.batchnorm!r})")
        if statistics is not None:
            # fixed domain statistics: each matrix whitened by its own domain's entry
            *_, X = self._reeig_inputs(X, lambda i, bn, Y: bn.whiten(Y, statistics[i][domains]))
            return reeig_logeig_vech(X, self.eps)
        if self.batchnorm is not None:
            *_, X = self._reeig_inputs(X, lambda i, bn, Y: bn(Y) if domains is None else bn(Y, domains))
            return reeig_logeig_vech(X, self.eps)
        for bimap in self.bimaps[:-1]:
            X = reeig(bimap(X), self.eps)
        last = self.bimaps[-1]
        if last.symmetric and last._centred_node_applies(X):
            # Same value and gradients as the branch below, in one autograd node.
            return _CentredBiMapSpectralVech.apply(last.W_ref, X, last.V, *log_clamp(self.eps))
        return reeig_logeig_vech(last(X), self.eps)

    def forward(self, X, domains=None):
        return self.head(self.features(X, domains))

    def batchnorm_inputs(self, X):
        """The input of each batch-norm layer for the batch ``X``, each layer's output
        normalized by the batch's own mean as in training (``X`` is one domain)."""
        inputs = []

        def record(i, bn, Z):
            inputs.append(Z)
            return bn.normalize_batch(Z)

        for _ in self._reeig_inputs(X, record):
            pass
        return inputs

    def adapted_forward(self, X, update, predict=True, include_self=False):
        """Add the trials of ``X`` to their domains' running means, then their logits.

        ``batchnorm="domain"`` only. Layer by layer, each trial ``X[t]`` updates the running
        mean of its domain in ``update`` (a :class:`skfedspd.online.DomainUpdate`), in order,
        and reaches the next layer re-centred by the statistics just after its own update:
        the result after a trial depends only on the trials before it, so adapting in chunks
        equals adapting at once. Then every trial is predicted with the final statistics,
        without the trial itself (:meth:`~skfedspd.online.DomainUpdate.inv_halves`;
        ``include_self``: with it).

        Returns
        -------
        torch.Tensor of shape (len(X), n_classes) or None
            The logits (None when ``predict`` is False: only ``update`` is updated).
        """
        if self.batchnorm != "domain":
            raise ValueError(f"domain statistics need batchnorm='domain' (this network has batchnorm={self.batchnorm!r})")
        if self.training:
            self.eval()
        first, Y = None, X
        for i, (bimap, bn) in enumerate(zip(self.bimaps, self.batchnorms)):
            Z = bimap(reeig(Y, self.eps) if i else Y)
            first = Z if i == 0 else first
            at_update = update.add_in_order(Z, i)
            if i + 1 < len(self.bimaps):
                Y = bn.whiten(Z, at_update)
        if not predict:
            return None
        Y = X
        for i, (bimap, bn) in enumerate(zip(self.bimaps, self.batchnorms)):
            Z = first if i == 0 else bimap(reeig(Y, self.eps))
            Y = bn.whiten(Z, update.inv_halves(i, include_self))
        return self.head(reeig_logeig_vech(Y, self.eps))

    def recenter_(self):
        for bimap in self.bimaps:
            bimap.recenter_()
        self._steps_since_recenter = 0

    def after_step_(self):
        self._steps_since_recenter += 1
        if self._steps_since_recenter >= self.recenter_every:
            self.recenter_()

    def parameter_kinds(self):
        """BiMap weights ``"stiefel"``; head and batch-norm biases ``"euclidean"``; running
        means (``batchnorm="spd"``) ``"local"``: a client's statistics never leave it."""
        kinds = OrderedDict((f"bimaps.{i}.weight", "stiefel") for i in range(len(self.bimaps)))
        kinds["head.weight"] = "euclidean"
        kinds["head.bias"] = "euclidean"
        for name in self._batchnorm_state():
            kinds[name] = "local" if name.endswith("running_mean") else "euclidean"
        return kinds

    def _batchnorm_state(self):
        if self.batchnorm is None:
            return {}
        return {f"batchnorms.{name}": value for name, value in self.batchnorms.state_dict(keep_vars=True).items()}

    def _exported_state(self):
        return self._named_state(lambda bimap: bimap.weight)

    def _loadable_state(self):
        # The chart reference has W's shape; loading goes through set_weight, so computing
        # W itself (a polar factor) would be wasted.
        return self._named_state(lambda bimap: bimap.W_ref)

    def _named_state(self, stiefel):
        state = {f"bimaps.{i}.weight": stiefel(b) for i, b in enumerate(self.bimaps)}
        state["head.weight"] = self.head.weight
        state["head.bias"] = self.head.bias
        state.update(self._batchnorm_state())
        return state

    def _load_array(self, name, value, state):
        if name.startswith("bimaps."):
            self.bimaps[int(name.split(".")[1])].set_weight(value)
            # set_weight re-centres the chart: the step count towards the next re-centring
            # restarts, so a local update never depends on what the module trained before.
            self._steps_since_recenter = 0
        else:
            super()._load_array(name, value, state)

    def eigenvalue_clamp_fraction(self, X):
        """Fraction of eigenvalues clamped by each ReEig on input batch ``X`` (diagnostic)."""
        # With batch norm: each block normalized by its own batch mean (no running-mean update).
        normalize = None if self.batchnorm is None else (lambda i, bn, Y: bn.normalize_batch(Y))
        with torch.no_grad():
            return [
                float((torch.linalg.eigvalsh(Y) < self.eps).to(torch.float64).mean())
                for Y in self._reeig_inputs(X, normalize)
            ]
