"""SPDnet layers: BiMap (Stiefel weights), ReEig, LogEig, their fused form, and vech, with
exact backward paths at repeated eigenvalues.
"""

import torch
from torch import nn

from .functional import (log_clamp, logeig, reeig, reeig_logeig, reeig_logeig_vech, spectral_vech_backward,
                         spectral_vech_forward, vech)
from .stiefel import polar, polar_newton_schulz, random_stiefel, tangent_project

__all__ = ["BiMap", "ReEig", "LogEig", "ReEigLogEig", "Vech"]


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
    """``Y = Wᵀ X W`` for one ``W`` and a batch ``X``, exact gradients without broadcast copies
    (with ``V``: the centred form, weight gradient ``P_W(∇W)`` to ``V``).
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
    """``Y = Wᵀ X W`` for symmetric ``X``: weight gradient ``Σ_b Z_b (G_b + G_bᵀ)``, ``Z = X W``,
    without a second pass over ``X`` (exact for symmetric ``X``).
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
    """``vech(f(Wᵀ X W))`` for symmetric ``X`` at the chart centre, in one autograd node."""

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
    """``Wᵀ X W`` (batched over ``X``); ``symmetric=True`` promises ``Xᵀ = X`` (a cheaper
    weight gradient).
    """
    if not _fast_path(W, X):
        return W.transpose(-1, -2) @ X @ W
    return (_SymCongruence if symmetric else _Congruence).apply(W, X)


class _ChartCentre(torch.autograd.Function):
    """``W(V) = uf(W_ref + P_{W_ref}(V))`` at ``V = 0``: value ``W_ref``, adjoint ``P_{W_ref}``."""

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


def tensor_version(t):
    """``t._version``, or ``None`` for inference tensors (no version counter)."""
    return None if t.is_inference() else t._version


class BiMap(nn.Module):
    """Bilinear map ``Σ ↦ WᵀΣW`` with ``W ∈ St(in_dim, out_dim)``.

    ``W = uf(W_ref + P_{W_ref}(V))`` (tangent-space local trivialization, Ablin et al.,
    2024): any torch optimizer updates the free parameter ``V`` while ``W`` stays orthonormal;
    :meth:`recenter_` moves the chart (``W_ref ← W``, ``V ← 0``). ``symmetric=True`` declares
    symmetric inputs (a cheaper weight gradient). Details: ``docs/guide/model.md``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.layers import BiMap
    >>> from skfedspd.stiefel import orthonormality_error
    >>> X = torch.as_tensor(make_spd_classification(n_matrices=8, n_channels=4, seed=0)[0])
    >>> bimap = BiMap(4, 2, seed=0, symmetric=True)
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
        """Whether ``W_ref`` is orthonormal to rounding; cached until its version changes."""
        W = self.W_ref
        mark = self._stiefel_mark
        if mark is not None and mark[0] is W and mark[1] == tensor_version(W):
            return True
        if not _on_stiefel(W):
            return False
        self._mark_stiefel()
        return True

    def _mark_stiefel(self):
        version = tensor_version(self.W_ref)
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

    def spectral_vech(self, X, eps):
        """``vech(log(max(Wᵀ X W, eps)))``: at the chart centre in one autograd node."""
        if self.symmetric and self._centred_node_applies(X):
            return _CentredBiMapSpectralVech.apply(self.W_ref, X, self.V, *log_clamp(eps))
        return reeig_logeig_vech(self(X), eps)

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


class ReEig(nn.Module):
    """Eigenvalue rectification ``U max(eps, Λ) Uᵀ``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.layers import ReEig
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
    >>> from skfedspd.layers import LogEig
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
    >>> from skfedspd.layers import ReEigLogEig
    >>> ReEigLogEig(eps=0.5)(torch.eye(2, dtype=torch.float64)).diagonal()
    tensor([0., 0.], dtype=torch.float64)
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
    >>> from skfedspd.layers import Vech
    >>> Vech()(torch.tensor([[[1.0, 2.0], [2.0, 3.0]]], dtype=torch.float64)).shape
    torch.Size([1, 3])
    """

    def forward(self, X):
        return vech(X)
