"""Tools on the Stiefel manifold ``St(p, k) = {W ∈ R^{p×k} : WᵀW = I_k}``.

Every function accepts numpy arrays or torch tensors (batched over leading axes) and returns
the same kind, so the federated aggregation (numpy) and the BiMap layer (torch) share one
implementation. Notation follows the FedSPDnet paper: ``P_W`` tangent projection,
``uf`` orthogonal polar factor, ``R_W`` polar retraction, ``L_W`` lifting.
"""

import numpy as np
import torch

__all__ = [
    "sym",
    "tangent_project",
    "polar",
    "retract",
    "lift",
    "random_stiefel",
    "orthonormality_error",
]


def _t(A):
    return A.swapaxes(-1, -2)


def _linalg(A):
    return torch.linalg if isinstance(A, torch.Tensor) else np.linalg


def sym(A):
    """Symmetric part ``(A + Aᵀ) / 2``."""
    return 0.5 * (A + _t(A))


def tangent_project(W, X):
    """Orthogonal projection of ``X`` onto the tangent space at ``W``: ``X − W sym(WᵀX)``."""
    return X - W @ sym(_t(W) @ X)


class _Polar(torch.autograd.Function):
    """Orthogonal polar factor ``U Vᵀ`` of ``A = U S Vᵀ`` with an SVD-free backward.

    With ``M = UᵀGV``, the adjoint of the polar factor's differential is

        ∇A = U [(M − Mᵀ) ⊘ (s_i + s_j)] Vᵀ + (G − U UᵀG) V S⁻¹ Vᵀ,

    which only needs ``s_i + s_j > 0`` (``A`` of full column rank). Autograd through
    ``torch.linalg.svd`` divides by ``s_i² − s_j²`` instead and is NaN when singular values
    coincide, which is exactly the case at the trivialization point ``A = W`` (all ones).
    """

    @staticmethod
    def forward(ctx, A):
        U, s, Vh = torch.linalg.svd(A, full_matrices=False)
        ctx.save_for_backward(U, s, Vh)
        return U @ Vh

    @staticmethod
    def backward(ctx, G):
        U, s, Vh = ctx.saved_tensors
        V = _t(Vh)
        M = _t(U) @ G @ V
        skew = (M - _t(M)) / (s.unsqueeze(-1) + s.unsqueeze(-2))
        normal = (G - U @ (_t(U) @ G)) @ (V / s.unsqueeze(-2)) @ Vh
        return U @ skew @ Vh + normal


def polar(A):
    """Orthogonal polar factor ``uf(A) = A (AᵀA)^{-1/2}``: the closest Stiefel point to ``A``.

    Differentiable for torch tensors with an exact, finite gradient (see ``_Polar``).
    """
    if isinstance(A, torch.Tensor):
        if torch.is_grad_enabled() and A.requires_grad:
            return _Polar.apply(A)
        U, _, Vh = torch.linalg.svd(A, full_matrices=False)
        return U @ Vh
    U, _, Vh = np.linalg.svd(A, full_matrices=False)
    return U @ Vh


def retract(W, X):
    """Polar retraction ``R_W(X) = uf(W + X)``."""
    return polar(W + X)


def lift(W, W_bar):
    """Lifting ``L_W(W̄) = P_W(W̄ − W)``, the tangent vector at ``W`` pointing to ``W̄``."""
    return tangent_project(W, W_bar - W)


def random_stiefel(p, k, rng=None):
    """Haar-distributed point of ``St(p, k)`` (QR of a Gaussian matrix, signs fixed).

    ``rng`` is anything ``numpy.random.default_rng`` accepts (seed, Generator or None).
    """
    if k > p:
        raise ValueError(f"Stiefel St(p={p}, k={k}) needs k <= p")
    rng = np.random.default_rng(rng)
    Q, R = np.linalg.qr(rng.standard_normal((p, k)))
    return Q * np.sign(np.diag(R))


def orthonormality_error(W):
    """``‖WᵀW − I‖_F`` (maximum over a batch)."""
    k = W.shape[-1]
    if isinstance(W, torch.Tensor):
        eye = torch.eye(k, dtype=W.dtype, device=W.device)
        return float(torch.linalg.matrix_norm(_t(W) @ W - eye).max())
    return float(np.max(np.linalg.norm(_t(W) @ W - np.eye(k), axis=(-2, -1))))
