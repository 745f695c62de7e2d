"""Spectral functions of symmetric matrices with exact (Daleckii–Krein) gradients.

For ``X = U diag(λ) Uᵀ``, ``F(X) = U diag(f(λ)) Uᵀ`` has the adjoint
``U (L ∘ (Uᵀ sym(G) U)) Uᵀ``, ``L`` the Loewner matrix of divided differences of ``f``
(``f'(λ_i)`` on ties): finite where eigenvalues coincide (as after ReEig), unlike the
autograd of ``torch.linalg.eigh``.
"""

import functools
import math

import torch

__all__ = [
    "reeig",
    "logeig",
    "expm_sym",
    "sqrtm_invsqrtm",
    "karcher_mean",
    "spd_geodesic",
    "reeig_logeig",
    "reeig_logeig_vech",
    "spectral_function",
    "vech",
    "unvech",
    "log_clamp",
    "spectral_vech_forward",
    "spectral_vech_backward",
]

# Eigenvalue gaps below this fraction of the spectral scale count as ties.
_TIE_RTOL = 1e3


def _sym(A):
    return 0.5 * (A + A.transpose(-1, -2))


def _loewner(lam, f_lam, df):
    """Loewner matrix of divided differences of ``f`` at the ascending ``lam`` (near-ties: the
    mean derivative).
    """
    divided_differences = getattr(df, "divided_differences", None)
    if divided_differences is not None:  # a derivative that knows a stable closed form
        return divided_differences(lam, f_lam)
    finfo = torch.finfo(lam.dtype)
    tol = lam.abs().amax(-1, keepdim=True).mul_(_TIE_RTOL * finfo.eps)
    # Tied entries divide by a (near-)zero gap below; they are overwritten.
    gap = lam.unsqueeze(-1) - lam.unsqueeze(-2)
    divided = (f_lam.unsqueeze(-1) - f_lam.unsqueeze(-2)).div_(gap)
    d = df(lam)
    if not bool((torch.diff(lam, dim=-1) <= tol).any()):
        divided.diagonal(dim1=-2, dim2=-1).copy_(d)
        return divided
    half_df = 0.5 * d
    tie = gap.abs_() <= tol.unsqueeze(-1)
    return torch.where(tie, half_df.unsqueeze(-1) + half_df.unsqueeze(-2), divided)


def _mm(A, B):
    """``A @ B``; straight to ``bmm`` for 3-D operands (skips ``matmul``'s shape handling)."""
    if A.dim() == 3 and B.dim() == 3:
        return torch.bmm(A, B)
    return A @ B


def _reconstruct(U, values):
    return _mm(U * values.unsqueeze(-2), U.transpose(-1, -2))


def _daleckii_krein(lam, U, f_lam, df, S):
    """``U (L ∘ (Uᵀ S U)) Uᵀ`` for a symmetric ``S``: the adjoint of ``dF`` at ``X = U Λ Uᵀ``."""
    Ut = U.transpose(-1, -2)
    K = _mm(_mm(Ut, S), U).mul_(_loewner(lam, f_lam, df))
    return _mm(_mm(U, K), Ut)


class _SpectralPair(torch.autograd.Function):
    """``(U f(Λ) Uᵀ, U g(Λ) Uᵀ)`` from one ``eigh``, with the summed Daleckii–Krein backward."""

    @staticmethod
    def forward(ctx, X, f, df, g, dg):
        lam, U = torch.linalg.eigh(X)
        f_lam, g_lam = f(lam), g(lam)
        ctx.save_for_backward(lam, U, f_lam, g_lam)
        ctx.derivatives = (df, dg)
        return _reconstruct(U, f_lam), _reconstruct(U, g_lam)

    @staticmethod
    def backward(ctx, grad_f, grad_g):
        lam, U, f_lam, g_lam = ctx.saved_tensors
        df, dg = ctx.derivatives
        Ut = U.transpose(-1, -2)
        K = _mm(_mm(Ut, _sym(grad_f)), U).mul_(_loewner(lam, f_lam, df))
        K += _mm(_mm(Ut, _sym(grad_g)), U).mul_(_loewner(lam, g_lam, dg))
        return _mm(_mm(U, K), Ut), None, None, None, None


class _SpectralFunction(torch.autograd.Function):
    """``U f(Λ) Uᵀ`` from one ``eigh``, with the Daleckii–Krein backward."""

    @staticmethod
    def forward(ctx, X, f, df):
        lam, U = torch.linalg.eigh(X)
        f_lam = f(lam)
        ctx.save_for_backward(lam, U, f_lam)
        ctx.df = df
        return _reconstruct(U, f_lam)

    @staticmethod
    def backward(ctx, grad):
        lam, U, f_lam = ctx.saved_tensors
        return _daleckii_krein(lam, U, f_lam, ctx.df, _sym(grad)), None, None


def spectral_vech_forward(X, f):
    """``(vech(U f(Λ) Uᵀ), λ, U, f(λ))`` for the symmetric batch ``X``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import log_clamp, reeig_logeig, spectral_vech_forward, vech
    >>> X = torch.diag(torch.tensor([0.5, 2.0], dtype=torch.float64))
    >>> out, lam, U, f_lam = spectral_vech_forward(X, log_clamp(1e-2)[0])
    >>> torch.allclose(out, vech(reeig_logeig(X, 1e-2)))
    True
    """
    lam, U = torch.linalg.eigh(X)
    f_lam = f(lam)
    return vech(_reconstruct(U, f_lam)), lam, U, f_lam


def spectral_vech_backward(grad, lam, U, f_lam, df):
    """Adjoint of ``X ↦ vech(f(X))`` at ``X = U Λ Uᵀ``: a symmetric matrix (batch).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import log_clamp, reeig_logeig_vech, spectral_vech_backward, spectral_vech_forward
    >>> X = torch.diag(torch.tensor([0.5, 2.0], dtype=torch.float64))
    >>> f, df = log_clamp(1e-2)
    >>> out, lam, U, f_lam = spectral_vech_forward(X, f)
    >>> X_leaf = X.clone().requires_grad_(True)
    >>> reeig_logeig_vech(X_leaf, 1e-2).backward(torch.ones_like(out))
    >>> torch.allclose(spectral_vech_backward(torch.ones_like(out), lam, U, f_lam, df), X_leaf.grad)
    True
    """
    n = U.shape[-1]
    # Adjoint of F ↦ vech(F) on symmetric F: S_ii = g_ii, S_ij = S_ji = g_ij / √2.
    half = _vech_weights(n, grad.dtype, grad.device, True)
    # reshape, not unflatten: unflatten has no vmap batching rule (per-sample gradients by a
    # batched backward, skfedspd.privacy)
    S = (grad * half).index_select(-1, _vech_gather(n, grad.device)).reshape(grad.shape[:-1] + (n, n))
    return _daleckii_krein(lam, U, f_lam, df, S)


class _SpectralVech(torch.autograd.Function):
    """``vech(U f(Λ) Uᵀ)`` in one node: the vech adjoint is folded into the symmetric ``S``."""

    @staticmethod
    def forward(ctx, X, f, df):
        out, lam, U, f_lam = spectral_vech_forward(X, f)
        ctx.save_for_backward(lam, U, f_lam)
        ctx.df = df
        return out

    @staticmethod
    def backward(ctx, grad):
        lam, U, f_lam = ctx.saved_tensors
        return spectral_vech_backward(grad, lam, U, f_lam, ctx.df), None, None


def spectral_function(X, f, df):
    """Apply ``f`` (derivative ``df``) to the eigenvalues of the symmetric batch ``X``, with the
    exact Daleckii–Krein gradient.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import spectral_function
    >>> X = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    >>> R = spectral_function(X, torch.sqrt, lambda lam: 0.5 / torch.sqrt(lam))
    >>> torch.allclose(R @ R, X)
    True
    """
    return _SpectralFunction.apply(X, f, df)


def _clamp(eps):
    return lambda lam: lam.clamp_min(eps)


def _clamp_derivative(eps):
    # Subgradient 1 above the threshold, 0 below; ties exactly at eps take 1 (identity side).
    return lambda lam: (lam >= eps).to(lam.dtype)


def _log(lam):
    return torch.log(lam)


def _log_derivative(lam):
    return 1.0 / lam


def reeig(X, eps):
    """ReEig layer: ``U max(eps, Λ) Uᵀ`` (finite gradient where eigenvalues are clamped together).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import reeig
    >>> X = torch.diag(torch.tensor([1e-3, 0.5, 2.0], dtype=torch.float64))
    >>> reeig(X, 1e-2).diagonal()
    tensor([0.0100, 0.5000, 2.0000], dtype=torch.float64)
    """
    return spectral_function(X, _clamp(eps), _clamp_derivative(eps))


def logeig(X):
    """LogEig layer: ``U log(Λ) Uᵀ`` (exact gradient at repeated eigenvalues, e.g. ``X = I``).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import logeig
    >>> X = torch.eye(3, dtype=torch.float64, requires_grad=True)
    >>> logeig(X).trace().backward()
    >>> torch.allclose(X.grad, torch.eye(3, dtype=torch.float64))
    True
    """
    return spectral_function(X, _log, _log_derivative)


class _ExpDerivative:
    """``exp' = exp``, with divided differences ``e^{λ_j} expm1(δ) / δ`` exact at any gap."""

    def __call__(self, lam):
        return torch.exp(lam)

    @staticmethod
    def divided_differences(lam, f_lam):
        gap = lam.unsqueeze(-1) - lam.unsqueeze(-2)
        ratio = torch.where(gap == 0, torch.ones_like(gap), torch.expm1(gap) / gap)
        return ratio.mul_(f_lam.unsqueeze(-2))


def expm_sym(X):
    """Matrix exponential ``U exp(Λ) Uᵀ`` of a symmetric batch.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import expm_sym, logeig
    >>> X = torch.diag(torch.tensor([0.5, 2.0], dtype=torch.float64))
    >>> torch.allclose(expm_sym(logeig(X)), X)
    True
    """
    return spectral_function(X, torch.exp, _ExpDerivative())


def sqrtm_invsqrtm(X):
    """``(X^{1/2}, X^{-1/2})`` of an SPD batch from one ``eigh`` (exact joint backward).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import sqrtm_invsqrtm
    >>> half, inv_half = sqrtm_invsqrtm(torch.diag(torch.tensor([4.0, 9.0], dtype=torch.float64)))
    >>> half.diagonal(), inv_half.diagonal()
    (tensor([2., 3.], dtype=torch.float64), tensor([0.5000, 0.3333], dtype=torch.float64))
    """
    return _SpectralPair.apply(
        X,
        torch.sqrt,
        lambda lam: 0.5 * torch.rsqrt(lam),
        torch.rsqrt,
        lambda lam: -0.5 * torch.rsqrt(lam) / lam,
    )


def _power(t):
    return lambda lam: lam**t, lambda lam: t * lam ** (t - 1)


def spd_geodesic(A, B, t):
    """Point at ``t`` on the affine-invariant geodesic from ``A`` (t=0) to ``B`` (t=1).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import spd_geodesic
    >>> A, B = torch.eye(2, dtype=torch.float64), 4 * torch.eye(2, dtype=torch.float64)
    >>> spd_geodesic(A, B, 0.5).diagonal()
    tensor([2., 2.], dtype=torch.float64)
    """
    A_half, A_inv_half = sqrtm_invsqrtm(A)
    return _sym(A_half @ spectral_function(_sym(A_inv_half @ B @ A_inv_half), *_power(t)) @ A_half)


def _log_euclidean_mean(X):
    return expm_sym(logeig(X).mean(-3))


# Karcher steps: halve the step only when the gradient norm grows above this (see karcher_mean).
_DIVERGENCE_FLOOR = 1e-4


def karcher_mean(X, n_iter, tol=None, return_converged=False):
    """Affine-invariant (Karcher) mean of the SPD matrices ``X`` (shape ``(m, n, n)``).

    From the log-Euclidean mean, ``n_iter`` fixed-point steps
    ``M ← M^{1/2} exp(T) M^{1/2}``, ``T = mean_i log(M^{-1/2} X_i M^{-1/2})`` (halved when
    ``‖T‖_F`` grows), stopping once ``‖T‖_F <= tol``; differentiable with exact gradients.

    Returns
    -------
    M : torch.Tensor of shape (n, n)
    converged : bool
        With ``return_converged=True``.

    Examples
    --------
    >>> import torch
    >>> A = torch.randn(3, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> X = A @ A.transpose(-1, -2) + 4 * torch.eye(4, dtype=torch.float64)
    >>> from pyriemann.utils.mean import mean_riemann
    >>> from skfedspd.functional import karcher_mean
    >>> M, converged = karcher_mean(X, n_iter=50, tol=1e-10, return_converged=True)
    >>> converged, bool(torch.allclose(M, torch.as_tensor(mean_riemann(X.numpy(), tol=1e-12))))
    (True, True)
    """
    M = _log_euclidean_mean(X)
    step, previous, converged = 1.0, math.inf, False
    for _ in range(n_iter):
        M_half, M_inv_half = sqrtm_invsqrtm(M)
        T = logeig(_sym(M_inv_half @ X @ M_inv_half)).mean(-3)
        crit = float(torch.linalg.matrix_norm(T.detach()))
        if tol is not None and crit <= tol:
            converged = True
            break
        if crit > previous and crit > _DIVERGENCE_FLOOR:
            step *= 0.5
        previous = crit
        M = _sym(M_half @ expm_sym(step * T) @ M_half)
    return (M, converged) if return_converged else M


def reeig_logeig(X, eps):
    """ReEig followed by LogEig, ``U log(max(eps, Λ)) Uᵀ``, from a single ``eigh``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import logeig, reeig, reeig_logeig
    >>> X = torch.diag(torch.tensor([1e-3, 2.0], dtype=torch.float64))
    >>> torch.allclose(reeig_logeig(X, 1e-2), logeig(reeig(X, 1e-2)))
    True
    """
    return spectral_function(X, *log_clamp(eps))


def log_clamp(eps):
    """``λ ↦ log(max(eps, λ))`` and its (sub)derivative ``1/λ`` above ``eps``, 0 below.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import log_clamp
    >>> f, df = log_clamp(0.5)
    >>> f(torch.tensor([0.1, 2.0])), df(torch.tensor([0.1, 2.0]))
    (tensor([-0.6931,  0.6931]), tensor([0.0000, 0.5000]))
    """
    return (
        lambda lam: torch.log(lam.clamp_min(eps)),
        lambda lam: torch.where(lam >= eps, lam.reciprocal(), 0.0),
    )


def reeig_logeig_vech(X, eps):
    """``vech(reeig_logeig(X, eps))`` as a single autograd node.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import reeig_logeig_vech
    >>> reeig_logeig_vech(torch.eye(4, dtype=torch.float64).expand(2, 4, 4), 1e-2).shape
    torch.Size([2, 10])
    """
    return _SpectralVech.apply(X, *log_clamp(eps))


@functools.lru_cache(maxsize=None)
def _vech_index(n, device):
    """Flat positions of the upper triangle of an ``n×n`` matrix, row by row (cached)."""
    with torch.inference_mode(False):
        rows, cols = torch.triu_indices(n, n, device=device)
        return rows, cols, rows * n + cols


@functools.lru_cache(maxsize=None)
def _vech_gather(n, device):
    """For every flat position ``(i, j)`` of an ``n×n`` matrix, the vech index of ``(min, max)``."""
    with torch.inference_mode(False):
        rows, cols, flat = _vech_index(n, device)
        pos = torch.empty(n * n, dtype=torch.long, device=device)
        ids = torch.arange(len(flat), device=device)
        pos[flat] = ids
        pos[cols * n + rows] = ids
        return pos


@functools.lru_cache(maxsize=None)
def _vech_weights(n, dtype, device, inverse):
    rows, cols, _ = _vech_index(n, device)
    # Built in the target dtype: a float32 √2 would cost float64 inputs 1e-8 of accuracy.
    with torch.inference_mode(False):
        one = torch.ones(rows.shape, dtype=dtype, device=device)
        return torch.where(rows == cols, one, one * (math.sqrt(0.5) if inverse else math.sqrt(2.0)))


def vech(X):
    """Half-vectorisation, off-diagonal entries scaled by √2 (``‖vech(X)‖₂ = ‖X‖_F``): shape
    ``(..., n(n+1)/2)``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import vech
    >>> vech(torch.tensor([[1.0, 2.0], [2.0, 3.0]], dtype=torch.float64))
    tensor([1.0000, 2.8284, 3.0000], dtype=torch.float64)
    """
    n = X.shape[-1]
    _, _, flat = _vech_index(n, X.device)
    # index_select on the flattened matrix: its backward is a cheap index_add, unlike the
    # accumulating index_put of advanced indexing X[..., rows, cols].
    return X.flatten(-2).index_select(-1, flat) * _vech_weights(n, X.dtype, X.device, False)


def unvech(v):
    """Inverse of :func:`vech`: symmetric matrices from their scaled half-vectorisation.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import unvech, vech
    >>> X = torch.tensor([[1.0, 2.0], [2.0, 3.0]], dtype=torch.float64)
    >>> torch.allclose(unvech(vech(X)), X)
    True
    """
    m = v.shape[-1]
    n = int(round((math.sqrt(8 * m + 1) - 1) / 2))
    if n * (n + 1) // 2 != m:
        raise ValueError(f"vector length {m} is not n(n+1)/2 for any integer n")
    rows, cols, _ = _vech_index(n, v.device)
    values = v * _vech_weights(n, v.dtype, v.device, True)
    X = v.new_zeros(v.shape[:-1] + (n, n))
    X[..., rows, cols] = values
    X[..., cols, rows] = values
    return X
