"""Spectral functions of symmetric matrices with exact (Daleckii–Krein) gradients.

For a symmetric ``X = U diag(λ) Uᵀ`` and a scalar function ``f``, the matrix function
``F(X) = U diag(f(λ)) Uᵀ`` has the Fréchet derivative (Daleckii–Krein theorem)

    dF = U (L ∘ (Uᵀ dX U)) Uᵀ,   L_ij = (f(λ_i) − f(λ_j)) / (λ_i − λ_j)  if λ_i ≠ λ_j,
                                 L_ij = f'(λ_i)                          otherwise,

``L`` being the Loewner matrix of first divided differences. Its adjoint has the same form,
so the backward pass is ``U (L ∘ (Uᵀ sym(G) U)) Uᵀ``. Unlike the autograd of
``torch.linalg.eigh``, which divides by ``λ_i − λ_j`` and returns NaN (or silently wrong
values) when eigenvalues coincide, the divided difference stays bounded: for nearly equal
eigenvalues it is evaluated as the mean derivative ``(f'(λ_i) + f'(λ_j)) / 2`` (exact to
second order in the gap), which is precisely the case created by ReEig clamping several
eigenvalues to ``eps``.
"""

import functools
import math

import torch

__all__ = ["reeig", "logeig", "reeig_logeig", "reeig_logeig_vech", "spectral_function", "vech", "unvech"]

# Eigenvalue gaps below this fraction of the spectral scale count as ties.
_TIE_RTOL = 1e3


def _sym(A):
    return 0.5 * (A + A.transpose(-1, -2))


def _loewner(lam, f_lam, df):
    """Loewner matrix of first divided differences of ``f`` at eigenvalues ``lam``.

    ``lam`` is sorted ascending (as ``eigh`` returns it). Near-ties (gaps below
    ``_TIE_RTOL·eps·max|λ|``, the diagonal included) take the mean derivative
    ``(f'(λ_i) + f'(λ_j)) / 2``: exact on the diagonal and, like the midpoint derivative,
    exact to second order in the gap. ``df`` is evaluated on the eigenvalues only. Off the
    diagonal, a tie can only join consecutive eigenvalues, so one check on the ``n − 1``
    consecutive gaps decides whether the pairwise tie mask is needed at all (one host sync);
    without ties the diagonal is set directly.
    """
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


def _spectral_vech_forward(X, f):
    """``(vech(U f(Λ) Uᵀ), λ, U, f(λ))`` for the symmetric batch ``X``."""
    lam, U = torch.linalg.eigh(X)
    f_lam = f(lam)
    return vech(_reconstruct(U, f_lam)), lam, U, f_lam


def _spectral_vech_backward(grad, lam, U, f_lam, df):
    """Adjoint of ``X ↦ vech(f(X))`` at ``X = U Λ Uᵀ``: a symmetric matrix (batch)."""
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
        out, lam, U, f_lam = _spectral_vech_forward(X, f)
        ctx.save_for_backward(lam, U, f_lam)
        ctx.df = df
        return out

    @staticmethod
    def backward(ctx, grad):
        lam, U, f_lam = ctx.saved_tensors
        return _spectral_vech_backward(grad, lam, U, f_lam, ctx.df), None, None


def spectral_function(X, f, df):
    """Apply ``f`` to the eigenvalues of the symmetric batch ``X`` (shape ``(..., n, n)``).

    ``f`` and ``df`` (its derivative) act elementwise on eigenvalue tensors. The gradient
    is the exact Daleckii–Krein adjoint, finite for repeated eigenvalues.

    Examples
    --------
    The matrix square root:

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
    """ReEig layer: ``U max(eps, Λ) Uᵀ``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import reeig
    >>> X = torch.diag(torch.tensor([1e-3, 0.5, 2.0], dtype=torch.float64))
    >>> reeig(X, 1e-2).diagonal()
    tensor([0.0100, 0.5000, 2.0000], dtype=torch.float64)

    The gradient is finite where eigenvalues are clamped together (here two of them):

    >>> X = torch.diag(torch.tensor([1e-4, 1e-3, 2.0], dtype=torch.float64)).requires_grad_()
    >>> reeig(X, 1e-2).sum().backward()
    >>> X.grad.diagonal()
    tensor([0., 0., 1.], dtype=torch.float64)
    """
    return spectral_function(X, _clamp(eps), _clamp_derivative(eps))


def logeig(X):
    """LogEig layer: ``U log(Λ) Uᵀ`` (matrix logarithm of an SPD batch).

    Examples
    --------
    ``d tr(log X) = tr(X⁻¹ dX)``, exact at ``X = I`` where every eigenvalue is repeated
    (autograd through ``torch.linalg.eigh`` returns NaN there):

    >>> import torch
    >>> from skfedspd.functional import logeig
    >>> X = torch.eye(3, dtype=torch.float64, requires_grad=True)
    >>> logeig(X).trace().backward()
    >>> torch.allclose(X.grad, torch.eye(3, dtype=torch.float64))
    True
    """
    return spectral_function(X, _log, _log_derivative)


def reeig_logeig(X, eps):
    """ReEig followed by LogEig, ``U log(max(eps, Λ)) Uᵀ``, from a single ``eigh``.

    ReEig keeps the eigenvectors, so the composition is the spectral function
    ``λ ↦ log(max(eps, λ))`` whose derivative is ``1/λ`` above ``eps`` and 0 below.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import logeig, reeig, reeig_logeig
    >>> A = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> X = A @ A.T
    >>> torch.allclose(reeig_logeig(X, 1e-2), logeig(reeig(X, 1e-2)))
    True
    """
    return spectral_function(X, *_log_clamp(eps))


def _log_clamp(eps):
    """``λ ↦ log(max(eps, λ))`` and its (sub)derivative ``1/λ`` above ``eps``, 0 below."""
    return (
        lambda lam: torch.log(lam.clamp_min(eps)),
        lambda lam: torch.where(lam >= eps, lam.reciprocal(), 0.0),
    )


def reeig_logeig_vech(X, eps):
    """``vech(reeig_logeig(X, eps))`` as a single autograd node (same values and gradient).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import reeig_logeig, reeig_logeig_vech, vech
    >>> A = torch.randn(2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> X = A @ A.transpose(-1, -2)
    >>> reeig_logeig_vech(X, 1e-2).shape
    torch.Size([2, 10])
    >>> torch.allclose(reeig_logeig_vech(X, 1e-2), vech(reeig_logeig(X, 1e-2)))
    True
    """
    return _SpectralVech.apply(X, *_log_clamp(eps))


@functools.lru_cache(maxsize=None)
def _vech_index(n, device):
    """Flat (row-major) positions of the upper triangle of an ``n×n`` matrix, row by row.

    Cached; built outside inference mode so that autograd may save them whatever the mode
    of the first call.
    """
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
    """Half-vectorisation with off-diagonal entries scaled by √2.

    Returns the upper triangle (row by row, diagonal included) of each symmetric matrix,
    shape ``(..., n(n+1)/2)``. The √2 scaling makes the map an isometry from symmetric
    matrices with the Frobenius norm to Euclidean vectors: ``‖vech(X)‖₂ = ‖X‖_F``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import vech
    >>> X = torch.tensor([[1.0, 2.0], [2.0, 3.0]], dtype=torch.float64)
    >>> vech(X)
    tensor([1.0000, 2.8284, 3.0000], dtype=torch.float64)
    >>> torch.allclose(torch.linalg.vector_norm(vech(X)), torch.linalg.matrix_norm(X))
    True
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
