"""Tools on the Stiefel manifold ``St(p, k) = {W ∈ R^{p×k} : WᵀW = I_k}``.

Every function accepts numpy arrays or torch tensors (batched over leading axes) and
returns the same kind. Notation of the FedSPDnet paper: ``P_W`` tangent projection, ``uf``
polar factor, ``R_W`` polar retraction, ``L_W`` lifting. :func:`stiefel_exp` /
:func:`stiefel_log` (canonical metric, numpy) serve :func:`skfedspd.aggregation.karcher`.
"""

import numpy as np
import scipy.linalg
import torch

__all__ = [
    "sym",
    "tangent_project",
    "polar",
    "polar_newton_schulz",
    "retract",
    "lift",
    "random_stiefel",
    "orthonormality_error",
    "orthonormality_problem",
    "stiefel_tolerance",
    "stiefel_exp",
    "stiefel_log",
]


def _t(A):
    return A.swapaxes(-1, -2)


def sym(A):
    """Symmetric part ``(A + Aᵀ) / 2``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.stiefel import sym
    >>> sym(np.array([[1.0, 2.0], [0.0, 3.0]]))
    array([[1., 1.],
           [1., 3.]])
    """
    return 0.5 * (A + _t(A))


def tangent_project(W, X):
    """Orthogonal projection of ``X`` onto the tangent space at ``W``: ``X − W sym(WᵀX)``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.stiefel import random_stiefel, tangent_project
    >>> W = random_stiefel(5, 2, rng=0)
    >>> xi = tangent_project(W, np.random.default_rng(1).standard_normal((5, 2)))
    >>> bool(np.allclose(W.T @ xi, -(W.T @ xi).T))
    True
    """
    return X - W @ sym(_t(W) @ X)


class _Polar(torch.autograd.Function):
    """Polar factor ``U Vᵀ`` with the SVD-free backward
    ``∇A = U [(M − Mᵀ) ⊘ (s_i + s_j)] Vᵀ + (G − U UᵀG) V S⁻¹ Vᵀ``, ``M = UᵀGV``: finite
    where singular values coincide (at ``A = W``), unlike autograd through the SVD.
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
    """Orthogonal polar factor ``uf(A) = A (AᵀA)^{-1/2}``: the closest Stiefel point to ``A``,
    with an exact finite gradient for torch tensors.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.stiefel import orthonormality_error, polar, random_stiefel
    >>> W = torch.tensor(random_stiefel(5, 2, rng=0), requires_grad=True)
    >>> polar(W).sum().backward()
    >>> orthonormality_error(polar(W).detach()) < 1e-14, bool(torch.isfinite(W.grad).all())
    (True, True)
    """
    if isinstance(A, torch.Tensor):
        if torch.is_grad_enabled() and A.requires_grad:
            return _Polar.apply(A)
        U, _, Vh = torch.linalg.svd(A, full_matrices=False)
        return U @ Vh
    U, _, Vh = np.linalg.svd(A, full_matrices=False)
    return U @ Vh


def polar_newton_schulz(A, max_dev=0.5):
    """Polar factor ``uf(A)`` of a near-orthonormal ``A`` by Newton–Schulz steps
    ``X ← 1.5 X − 0.5 X XᵀX``, a number fixed from ``‖AᵀA − I‖_F ≤ max_dev``; otherwise,
    or under autograd, :func:`polar`.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.stiefel import polar, polar_newton_schulz, random_stiefel, tangent_project
    >>> W = random_stiefel(6, 3, rng=0)
    >>> A = W + 1e-2 * tangent_project(W, np.random.default_rng(1).standard_normal((6, 3)))
    >>> bool(np.allclose(polar_newton_schulz(A), polar(A), atol=1e-13))
    True
    """
    if not 0 < max_dev < 1:
        raise ValueError(f"max_dev must be in (0, 1), got {max_dev}")
    is_torch = isinstance(A, torch.Tensor)
    if is_torch and torch.is_grad_enabled() and A.requires_grad:
        return polar(A)
    k = A.shape[-1]
    C = _t(A) @ A
    if is_torch:
        C.diagonal(dim1=-2, dim2=-1).sub_(1.0)
        dev = float(torch.linalg.matrix_norm(C).max()) if C.numel() else 0.0
        eps = torch.finfo(A.dtype).eps
    else:
        C = C - np.eye(k)
        dev = float(np.max(np.linalg.norm(C, axis=(-2, -1)), initial=0.0))
        eps = np.finfo(np.result_type(A, np.float32)).eps
    if not dev <= max_dev:
        return polar(A)

    # X ← beta·X − 0.5·X G: the first step takes G = AᵀA − I (beta = 1), the next ones
    # G = XᵀX (beta = 1.5); both are X (1.5 I − 0.5 XᵀX).
    X = _newton_schulz_step(A, C, 1.0)
    dev *= dev
    while dev > eps:
        X = _newton_schulz_step(X, _t(X) @ X, 1.5)
        dev *= dev
    return X


def _newton_schulz_step(X, G, beta):
    """``beta·X − 0.5·X G`` (batched), fused into one BLAS call for torch tensors."""
    if not isinstance(X, torch.Tensor):
        return beta * X - 0.5 * (X @ G)
    if X.dim() == 2:
        return torch.addmm(X, X, G, beta=beta, alpha=-0.5)
    X3 = X.reshape(-1, *X.shape[-2:])
    return torch.baddbmm(X3, X3, G.reshape(-1, *G.shape[-2:]), beta=beta, alpha=-0.5).view(X.shape)


def retract(W, X):
    """Polar retraction ``R_W(X) = uf(W + X)``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.stiefel import orthonormality_error, random_stiefel, retract, tangent_project
    >>> W = random_stiefel(5, 2, rng=0)
    >>> xi = tangent_project(W, np.random.default_rng(1).standard_normal((5, 2)))
    >>> orthonormality_error(retract(W, 0.1 * xi)) < 1e-14
    True
    """
    return polar(W + X)


def lift(W, W_bar):
    """Lifting ``L_W(W̄) = P_W(W̄ − W)``, the tangent vector at ``W`` pointing to ``W̄``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.stiefel import lift, random_stiefel, retract, tangent_project
    >>> W = random_stiefel(5, 2, rng=0)
    >>> xi = 1e-4 * tangent_project(W, np.random.default_rng(1).standard_normal((5, 2)))
    >>> bool(np.allclose(lift(W, retract(W, xi)), xi, rtol=0, atol=1e-7))
    True
    """
    return tangent_project(W, W_bar - W)


def random_stiefel(p, k, rng=None):
    """Haar-distributed point of ``St(p, k)``; ``rng`` as ``numpy.random.default_rng`` takes.

    Examples
    --------
    >>> from skfedspd.stiefel import random_stiefel
    >>> random_stiefel(4, 2, rng=0).shape
    (4, 2)
    """
    if k > p:
        raise ValueError(f"Stiefel St(p={p}, k={k}) needs k <= p")
    rng = np.random.default_rng(rng)
    Q, R = np.linalg.qr(rng.standard_normal((p, k)))
    return Q * np.sign(np.diag(R))


def orthonormality_error(W):
    """``‖WᵀW − I‖_F`` (maximum over a batch).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.stiefel import orthonormality_error
    >>> round(orthonormality_error(2 * np.eye(3)[:, :2]), 4)
    4.2426
    """
    k = W.shape[-1]
    if isinstance(W, torch.Tensor):
        eye = torch.eye(k, dtype=W.dtype, device=W.device)
        return float(torch.linalg.matrix_norm(_t(W) @ W - eye).max())
    return float(np.max(np.linalg.norm(_t(W) @ W - np.eye(k), axis=(-2, -1))))


_STIEFEL_TOL = {np.dtype(np.float64): 1e-6, np.dtype(np.float32): 1e-3}


def stiefel_tolerance(dtype, n_columns):
    """Largest accepted ``‖WᵀW − I‖_F`` for a Stiefel array of this dtype and width
    (``1e-6·√k`` in float64, ``1e-3·√k`` in float32).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.stiefel import stiefel_tolerance
    >>> float(stiefel_tolerance(np.float64, 4)), float(stiefel_tolerance(np.float32, 4))
    (2e-06, 0.002)
    """
    return _STIEFEL_TOL.get(np.dtype(dtype), 1e-3) * np.sqrt(n_columns)


def orthonormality_problem(W, dtype=None):
    """Why ``W`` is not orthonormal within :func:`stiefel_tolerance`, or None.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.stiefel import orthonormality_problem
    >>> orthonormality_problem(np.ones((3, 2)))
    'is not orthonormal: ‖WᵀW − I‖ = 5.1 > 1.41e-06'
    """
    error = orthonormality_error(W)
    tol = stiefel_tolerance(W.dtype if dtype is None else dtype, W.shape[-1])
    if not error <= tol:
        return f"is not orthonormal: ‖WᵀW − I‖ = {error:.3g} > {tol:.3g}"
    return None


# ---------------------------------------------------------------------------------------------
# Riemannian exponential and logarithm under the canonical metric (numpy, one matrix)
# ---------------------------------------------------------------------------------------------


def _expm_skew(S):
    """``expm(S)`` of a real skew-symmetric matrix, from the eigendecomposition of ``iS``."""
    w, Z = np.linalg.eigh(1j * S)
    return np.real((Z * np.exp(-1j * w)) @ Z.conj().T)


def _log_orthogonal(V):
    """Principal real (skew-symmetric) logarithm of a special orthogonal matrix, from its real
    Schur form; ValueError on a rotation by π.
    """
    T, Z = scipy.linalg.schur(V, output="real")
    n, L, i = len(T), np.zeros_like(T), 0
    while i < n:
        if i + 1 < n and T[i + 1, i] != 0.0:
            theta = np.arctan2(0.5 * (T[i + 1, i] - T[i, i + 1]), 0.5 * (T[i, i] + T[i + 1, i + 1]))
            L[i, i + 1], L[i + 1, i] = -theta, theta
            i += 2
        else:
            if T[i, i] < 0:
                raise ValueError("orthogonal matrix with eigenvalue -1: no principal real logarithm")
            i += 1
    return Z @ L @ Z.T


def stiefel_exp(W, D):
    """Riemannian exponential of ``St(p, k)`` under the canonical metric (Edelman et al., 1998):
    ``Exp_W(D) = [W Q] expm([[A, −Rᵀ], [R, 0]]) [I_k; 0]``, ``A = WᵀD``, ``QR = (I − WWᵀ)D``.

    Parameters
    ----------
    W : ndarray of shape (p, k)
        Base point.
    D : ndarray of shape (p, k)
        Tangent vector at ``W``.

    Returns
    -------
    ndarray of shape (p, k)

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.stiefel import orthonormality_error, random_stiefel, stiefel_exp, tangent_project
    >>> W = random_stiefel(5, 2, rng=0)
    >>> D = tangent_project(W, np.random.default_rng(1).standard_normal((5, 2)))
    >>> orthonormality_error(stiefel_exp(W, D)) < 1e-13
    True
    """
    W = np.asarray(W, dtype=np.float64)
    D = np.asarray(D, dtype=np.float64)
    k = W.shape[1]
    A = W.T @ D
    Q, R = np.linalg.qr(D - W @ A)
    MN = _expm_skew(np.block([[A, -R.T], [R, np.zeros((k, k))]]))[:, :k]
    return W @ MN[:k] + Q @ MN[k:]


def stiefel_log(W0, W1, tol=1e-13, max_iter=100):
    """Riemannian logarithm of ``St(p, k)`` under the canonical metric (Zimmermann, SIAM J.
    Matrix Anal. Appl. 38(2), 2017): ``D`` at ``W0`` with ``Exp_{W0}(D) = W1``, iterated until
    ``tol`` (at most ``max_iter``); RuntimeError when ``W1`` is too far from ``W0``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.stiefel import random_stiefel, stiefel_exp, stiefel_log, tangent_project
    >>> W = random_stiefel(5, 2, rng=0)
    >>> D = 0.3 * tangent_project(W, np.random.default_rng(1).standard_normal((5, 2)))
    >>> bool(np.allclose(stiefel_log(W, stiefel_exp(W, D)), D, atol=1e-10))
    True
    """
    W0 = np.asarray(W0, dtype=np.float64)
    W1 = np.asarray(W1, dtype=np.float64)
    k = W0.shape[1]
    M = W0.T @ W1
    Q, N = np.linalg.qr(W1 - W0 @ M)
    MN = np.vstack([M, N])
    V = np.hstack([MN, np.linalg.qr(MN, mode="complete")[0][:, k:]])
    if np.linalg.det(V) < 0:
        V[:, -1] *= -1
    # start from the completion closest to the solution's lower-right block (symmetric, as
    # close to I as det V = +1 allows): fewer iterations, fewer spurious rotations by π
    U, _, Vh = np.linalg.svd(V[k:, k:])
    if np.linalg.det(U) * np.linalg.det(Vh) < 0:
        U[:, -1] *= -1
    V[:, k:] = V[:, k:] @ (Vh.T @ U.T)
    try:
        for _ in range(max_iter):
            L = _log_orthogonal(V)
            C = L[k:, k:]
            if np.linalg.norm(C) <= tol:
                break
            V[:, k:] = V[:, k:] @ _expm_skew(-C)
        else:
            raise RuntimeError(f"Stiefel logarithm did not converge in {max_iter} iterations "
                               f"(‖C‖_F = {np.linalg.norm(C):.2e} > tol = {tol:g}): W1 is too far from W0")
    except ValueError as err:
        raise RuntimeError(f"Stiefel logarithm failed: {err}; W1 is too far from W0") from err
    return W0 @ L[:k, :k] + Q @ L[k:, :k]
