"""Tests for ``skfedspd.stiefel``: tangent projection, polar factor, retraction, lifting, and
the Riemannian exponential / logarithm under the canonical metric."""

import numpy as np
import pytest
import scipy.linalg
import torch

from skfedspd.stiefel import (
    lift,
    orthonormality_error,
    polar,
    polar_newton_schulz,
    random_stiefel,
    retract,
    stiefel_exp,
    stiefel_log,
    sym,
    tangent_project,
)

SHAPES = [(3, 1), (4, 2), (6, 3), (5, 5), (8, 4)]
BACKENDS = ["numpy", "torch"]


def _as(backend, A):
    return torch.as_tensor(A, dtype=torch.float64) if backend == "torch" else np.asarray(A)


def _np(A):
    return A.detach().numpy() if isinstance(A, torch.Tensor) else np.asarray(A)


def _t(A):
    return np.swapaxes(A, -1, -2)


def _gauss(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def _stiefel_batch(p, k, batch, seed):
    rng = np.random.default_rng(seed)
    return np.stack([random_stiefel(p, k, rng) for _ in range(batch)])


def _spd(k, seed, lo=0.5, hi=3.0):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((k, k)))
    return (Q * rng.uniform(lo, hi, k)) @ Q.T


def _orthogonal(n, seed):
    Q, R = np.linalg.qr(_gauss((n, n), seed))
    return Q * np.sign(np.diag(R))


def _plain_polar(A):
    """Polar factor with autograd through ``torch.linalg.svd``."""
    U, _, Vh = torch.linalg.svd(A, full_matrices=False)
    return U @ Vh


# ---------------------------------------------------------------------------------------------
# sym / tangent_project
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_sym(backend):
    A = _as(backend, _gauss((2, 4, 4), 0))
    S = sym(A)
    np.testing.assert_allclose(_np(S), _t(_np(S)), rtol=0, atol=0)
    np.testing.assert_allclose(_np(sym(S)), _np(S), rtol=0, atol=0)
    np.testing.assert_allclose(_np(S), 0.5 * (_np(A) + _t(_np(A))), rtol=0, atol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_tangent_project_is_tangent(p, k, backend):
    W = random_stiefel(p, k, 0)
    X = _gauss((p, k), 1)
    xi = _np(tangent_project(_as(backend, W), _as(backend, X)))
    np.testing.assert_allclose(W.T @ xi + xi.T @ W, 0, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_tangent_project_idempotent(p, k, backend):
    W = _as(backend, random_stiefel(p, k, 2))
    X = _as(backend, _gauss((p, k), 3))
    P1 = tangent_project(W, X)
    P2 = tangent_project(W, P1)
    np.testing.assert_allclose(_np(P2), _np(P1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("p, k", SHAPES)
def test_tangent_project_numpy_torch_same_numbers(p, k):
    W = random_stiefel(p, k, 4)
    X = _gauss((p, k), 5)
    out_np = tangent_project(W, X)
    out_t = tangent_project(torch.as_tensor(W), torch.as_tensor(X))
    assert isinstance(out_np, np.ndarray) and isinstance(out_t, torch.Tensor)
    assert out_t.dtype == torch.float64
    np.testing.assert_allclose(out_t.numpy(), out_np, rtol=0, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tangent_project_batch(backend):
    W = _stiefel_batch(5, 2, 4, seed=6)
    X = _gauss((4, 5, 2), 7)
    out = _np(tangent_project(_as(backend, W), _as(backend, X)))
    assert out.shape == (4, 5, 2)
    for i in range(4):
        np.testing.assert_allclose(out[i], tangent_project(W[i], X[i]), rtol=0, atol=1e-14)
    np.testing.assert_allclose(_t(W) @ out + _t(out) @ W, 0, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_tangent_project_fixes_tangent_and_kills_normal(p, k, backend):
    """``W Ω + W⊥ K`` (Ω skew) is tangent: fixed. ``W S`` (S symmetric) is normal: zeroed."""
    W = random_stiefel(p, k, 8)
    A = _gauss((k, k), 9)
    skew, S = A - A.T, A + A.T
    W_perp = scipy.linalg.null_space(W.T)
    tangent = W @ skew + W_perp @ _gauss((p - k, k), 10)
    Wb = _as(backend, W)
    np.testing.assert_allclose(
        _np(tangent_project(Wb, _as(backend, tangent))), tangent, rtol=0, atol=1e-12
    )
    np.testing.assert_allclose(_np(tangent_project(Wb, _as(backend, W @ S))), 0, atol=1e-12)


@pytest.mark.parametrize("p, k", SHAPES)
def test_tangent_project_is_orthogonal_projection(p, k):
    """Self-adjoint for the Frobenius inner product: ⟨P X, Y⟩ = ⟨X, P Y⟩."""
    W = random_stiefel(p, k, 11)
    X, Y = _gauss((p, k), 12), _gauss((p, k), 13)
    lhs = np.sum(tangent_project(W, X) * Y)
    rhs = np.sum(X * tangent_project(W, Y))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# polar
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_polar_orthonormal(p, k, backend):
    Q = polar(_as(backend, _gauss((p, k), 20)))
    assert type(Q) is type(_as(backend, np.zeros(1)))
    assert orthonormality_error(Q) <= 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_polar_matches_scipy(p, k, backend):
    A = _gauss((p, k), 21)
    u, _ = scipy.linalg.polar(A)
    np.testing.assert_allclose(_np(polar(_as(backend, A))), u, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_polar_matches_closed_form(backend):
    """``uf(A) = A (AᵀA)^{-1/2}``."""
    A = _gauss((6, 3), 22)
    w, V = np.linalg.eigh(A.T @ A)
    expected = A @ (V * w**-0.5) @ V.T
    np.testing.assert_allclose(_np(polar(_as(backend, A))), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_polar_batch(backend):
    A = _gauss((2, 3, 5, 2), 23)
    Q = _np(polar(_as(backend, A)))
    assert Q.shape == A.shape
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(
                Q[i, j], scipy.linalg.polar(A[i, j])[0], rtol=0, atol=1e-12
            )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_polar_orthogonal_equivariance(p, k, backend):
    """``uf(Q A R) = Q uf(A) R`` for orthogonal ``Q`` (p×p) and ``R`` (k×k)."""
    A = _gauss((p, k), 24)
    Q, R = _orthogonal(p, 25), _orthogonal(k, 26)
    lhs = _np(polar(_as(backend, Q @ A @ R)))
    rhs = Q @ _np(polar(_as(backend, A))) @ R
    np.testing.assert_allclose(lhs, rhs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_polar_of_stiefel_times_spd_is_the_stiefel_factor(p, k, backend):
    """``W P`` with ``W`` on the Stiefel manifold and ``P`` SPD is a polar decomposition."""
    W = random_stiefel(p, k, 27)
    P = _spd(k, 28)
    np.testing.assert_allclose(_np(polar(_as(backend, W @ P))), W, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("c", [1e-3, 0.5, 10.0])
def test_polar_positive_scale_invariant(c, backend):
    A = _gauss((5, 3), 29)
    np.testing.assert_allclose(
        _np(polar(_as(backend, c * A))), _np(polar(_as(backend, A))), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_polar_fixes_stiefel_points(p, k, backend):
    W = random_stiefel(p, k, 30)
    np.testing.assert_allclose(_np(polar(_as(backend, W))), W, rtol=0, atol=1e-12)


@pytest.mark.parametrize("p, k", SHAPES)
def test_polar_is_closest_stiefel_point(p, k):
    A = _gauss((p, k), 31)
    Q = polar(A)
    d = np.linalg.norm(A - Q)
    rng = np.random.default_rng(32)
    for _ in range(20):
        assert d <= np.linalg.norm(A - random_stiefel(p, k, rng)) + 1e-12
        assert d <= np.linalg.norm(A - polar(Q + 0.05 * rng.standard_normal((p, k)))) + 1e-12


def _polar_points(p, k, where):
    if where == "generic":
        return _gauss((p, k), 40)
    if where == "trivialization":  # A = W, all singular values exactly 1
        return random_stiefel(p, k, 41)
    if where == "stiefel_times_spd":
        return random_stiefel(p, k, 42) @ _spd(k, 43)
    raise ValueError(where)


@pytest.mark.parametrize("where", ["generic", "trivialization", "stiefel_times_spd"])
@pytest.mark.parametrize("p, k", SHAPES)
def test_polar_gradcheck(p, k, where):
    A = torch.as_tensor(_polar_points(p, k, where)).requires_grad_(True)
    assert torch.autograd.gradcheck(polar, (A,))


@pytest.mark.parametrize("where", ["generic", "trivialization"])
def test_polar_gradcheck_batch(where):
    A = np.stack([_polar_points(5, 3, where), _polar_points(5, 3, "stiefel_times_spd")])
    A = torch.as_tensor(A).requires_grad_(True)
    assert torch.autograd.gradcheck(polar, (A,))


@pytest.mark.parametrize("p, k", SHAPES)
def test_polar_gradient_finite_at_trivialization_point(p, k):
    W = torch.as_tensor(random_stiefel(p, k, 44)).requires_grad_(True)
    G = torch.as_tensor(_gauss((p, k), 45))
    (polar(W) * G).sum().backward()
    assert torch.isfinite(W.grad).all()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("p, k", [s for s in SHAPES if s[1] > 1])
def test_plain_svd_autograd_is_nan_or_wrong_at_trivialization_point(p, k, seed):
    """At ``A = W`` autograd through ``torch.linalg.svd`` divides by ``s_i² − s_j² ≈ 0``.

    Checked beforehand: square shapes give NaN/Inf; tall shapes give NaN/Inf for some seeds
    and a finite but wrong gradient (off by > 1e-2) for the others. The custom backward is
    checked against central finite differences at the same point.
    """
    W = torch.as_tensor(random_stiefel(p, k, 50 + seed))
    G = torch.as_tensor(_gauss((p, k), 60 + seed))

    def grad(f):
        A = W.clone().requires_grad_(True)
        (f(A) * G).sum().backward()
        return A.grad

    g_plain, g_custom = grad(_plain_polar), grad(polar)
    torch.testing.assert_close(_plain_polar(W), polar(W), rtol=0, atol=1e-12)  # same forward

    E = torch.as_tensor(_gauss((p, k), 70 + seed))
    h = 1e-6
    with torch.no_grad():
        fd = ((polar(W + h * E) - polar(W - h * E)) * G).sum() / (2 * h)
    torch.testing.assert_close((g_custom * E).sum(), fd, rtol=1e-6, atol=1e-8)

    plain_broken = (not torch.isfinite(g_plain).all()) or (
        (g_plain - g_custom).abs().max() > 1e-2
    )
    assert plain_broken


def test_plain_svd_autograd_nan_for_square_trivialization_point():
    W = torch.as_tensor(random_stiefel(4, 4, 0)).requires_grad_(True)
    (_plain_polar(W) * torch.as_tensor(_gauss((4, 4), 1))).sum().backward()
    assert not torch.isfinite(W.grad).all()


@pytest.mark.parametrize("p, k", SHAPES)
def test_polar_custom_grad_equals_svd_autograd_at_generic_point(p, k):
    A = torch.as_tensor(_gauss((p, k), 80))
    G = torch.as_tensor(_gauss((p, k), 81))
    grads = []
    for f in (polar, _plain_polar):
        X = A.clone().requires_grad_(True)
        (f(X) * G).sum().backward()
        grads.append(X.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-9, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# polar_newton_schulz
# ---------------------------------------------------------------------------------------------


def _near_stiefel(p, k, scale, seed, batch=()):
    """``W + P_W(V)`` with ``V`` Gaussian of the given scale (a re-centring's argument)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(batch)) if batch else 1
    W = np.stack([random_stiefel(p, k, rng) for _ in range(n)])
    A = W + tangent_project(W, scale * rng.standard_normal(W.shape))
    return A.reshape(batch + (p, k))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [0.0, 1e-6, 1e-3, 1e-2])
@pytest.mark.parametrize("p, k", SHAPES + [(64, 18)])
def test_polar_newton_schulz_matches_polar_near_stiefel(p, k, scale, backend):
    A = _as(backend, _near_stiefel(p, k, scale, seed=90))
    Q = polar_newton_schulz(A)
    assert type(Q) is type(A)
    np.testing.assert_allclose(_np(Q), _np(polar(A)), rtol=0, atol=2e-15)
    assert orthonormality_error(Q) < 4e-15


@pytest.mark.parametrize("backend", BACKENDS)
def test_polar_newton_schulz_batch(backend):
    A = _as(backend, _near_stiefel(6, 3, 1e-2, seed=91, batch=(2, 3)))
    Q = _np(polar_newton_schulz(A))
    assert Q.shape == (2, 3, 6, 3)
    np.testing.assert_allclose(Q, _np(polar(A)), rtol=0, atol=2e-15)


@pytest.mark.parametrize("p, k", [(6, 3), (64, 18)])
def test_polar_newton_schulz_needs_no_svd_near_stiefel(p, k, monkeypatch):
    A = torch.as_tensor(_near_stiefel(p, k, 1e-3, seed=92))

    def no_svd(*args, **kwargs):
        raise AssertionError("SVD called")

    monkeypatch.setattr(torch.linalg, "svd", no_svd)
    assert orthonormality_error(polar_newton_schulz(A)) < 4e-15


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["generic", "stiefel_times_spd", "far_batch_member"])
def test_polar_newton_schulz_falls_back_to_polar_far_from_stiefel(where, backend):
    if where == "far_batch_member":  # one far matrix sends the whole batch to the SVD
        A = np.stack([_near_stiefel(5, 3, 1e-3, seed=93), _gauss((5, 3), 94)])
    else:
        A = _polar_points(5, 3, where)
    A = _as(backend, A)
    np.testing.assert_array_equal(_np(polar_newton_schulz(A)), _np(polar(A)))


def test_polar_newton_schulz_float32():
    A = torch.as_tensor(_near_stiefel(64, 18, 1e-3, seed=95), dtype=torch.float32)
    Q = polar_newton_schulz(A)
    assert Q.dtype == torch.float32
    torch.testing.assert_close(Q, polar(A), rtol=0, atol=2e-6)
    assert orthonormality_error(Q) < 2e-6


def test_polar_newton_schulz_under_autograd_is_polar():
    A = torch.as_tensor(_near_stiefel(6, 3, 1e-2, seed=96)).requires_grad_(True)
    assert torch.autograd.gradcheck(polar_newton_schulz, (A,))
    G = torch.as_tensor(_gauss((6, 3), 97))
    (g_ns,) = torch.autograd.grad((polar_newton_schulz(A) * G).sum(), A)
    (g_polar,) = torch.autograd.grad((polar(A) * G).sum(), A)
    torch.testing.assert_close(g_ns, g_polar, rtol=0, atol=0)


@pytest.mark.parametrize("max_dev", [0.0, 1.0, -0.5, 2.0])
def test_polar_newton_schulz_rejects_bad_max_dev(max_dev):
    with pytest.raises(ValueError, match="max_dev"):
        polar_newton_schulz(random_stiefel(4, 2, 0), max_dev=max_dev)


# ---------------------------------------------------------------------------------------------
# retract / lift
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_retract_at_zero_is_identity(p, k, backend):
    W = random_stiefel(p, k, 90)
    out = retract(_as(backend, W), _as(backend, np.zeros((p, k))))
    np.testing.assert_allclose(_np(out), W, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_lift_of_self_is_zero(p, k, backend):
    W = _as(backend, random_stiefel(p, k, 91))
    np.testing.assert_array_equal(_np(lift(W, W)), 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_retract_on_manifold_and_lift_tangent(p, k, backend):
    W = random_stiefel(p, k, 92)
    W_bar = random_stiefel(p, k, 93)
    xi = _np(lift(_as(backend, W), _as(backend, W_bar)))
    np.testing.assert_allclose(W.T @ xi + xi.T @ W, 0, atol=1e-12)
    assert orthonormality_error(retract(_as(backend, W), _as(backend, 3.0 * xi))) <= 1e-12


@pytest.mark.parametrize("p, k", SHAPES)
def test_retract_closed_form_for_tangent_vectors(p, k):
    """For tangent ``ξ``: ``(W+ξ)ᵀ(W+ξ) = I + ξᵀξ``, so ``R_W(ξ) = (W+ξ)(I+ξᵀξ)^{-1/2}``."""
    W = random_stiefel(p, k, 94)
    xi = tangent_project(W, _gauss((p, k), 95))
    w, V = np.linalg.eigh(np.eye(k) + xi.T @ xi)
    expected = (W + xi) @ (V * w**-0.5) @ V.T
    np.testing.assert_allclose(retract(W, xi), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_retract_first_order(p, k, backend):
    """``R_W(tξ) = W + tξ + O(t²)``."""
    W = random_stiefel(p, k, 96)
    xi = tangent_project(W, _gauss((p, k), 97))
    errs = []
    for t in (1e-2, 5e-3, 2.5e-3):
        R = _np(retract(_as(backend, W), _as(backend, t * xi)))
        errs.append(np.linalg.norm(R - W - t * xi) / t)
    assert errs[1] < 0.6 * errs[0] and errs[2] < 0.6 * errs[1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("p, k", SHAPES)
def test_retract_lift_first_order_consistency(p, k, seed, backend):
    """``‖R_W(L_W(W̄)) − W̄‖ = O(‖W̄ − W‖²)``: the ratio to the distance shrinks with it."""
    rng = np.random.default_rng(100 + seed)
    W = random_stiefel(p, k, rng)
    Z = rng.standard_normal((p, k))
    Wb = _as(backend, W)
    dists, errs = [], []
    for t in (0.1, 0.05, 0.025, 0.0125):
        W_bar = polar(_as(backend, W + t * Z))
        err = _np(retract(Wb, lift(Wb, W_bar)) - W_bar)
        dists.append(np.linalg.norm(_np(W_bar) - W))
        errs.append(np.linalg.norm(err))
    ratios = np.array(errs) / np.array(dists)
    # Halving the distance at least halves (roughly) the ratio error / distance.
    assert np.all(ratios[1:] < 0.6 * ratios[:-1])
    # And the error stays below C · distance².
    assert np.all(np.array(errs) <= np.array(dists) ** 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_retract_lift_batch(backend):
    W = _stiefel_batch(5, 2, 3, seed=110)
    W_bar = _stiefel_batch(5, 2, 3, seed=111)
    Wb, Wbb = _as(backend, W), _as(backend, W_bar)
    xi = lift(Wb, Wbb)
    R = retract(Wb, xi)
    assert _np(R).shape == (3, 5, 2)
    for i in range(3):
        np.testing.assert_allclose(_np(xi)[i], lift(W[i], W_bar[i]), rtol=0, atol=1e-14)
        expected = retract(W[i], lift(W[i], W_bar[i]))
        np.testing.assert_allclose(_np(R)[i], expected, rtol=0, atol=1e-12)
    assert orthonormality_error(R) <= 1e-12


# ---------------------------------------------------------------------------------------------
# random_stiefel
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p, k", SHAPES + [(1, 1), (10, 1), (20, 7)])
def test_random_stiefel_orthonormal(p, k):
    W = random_stiefel(p, k, 0)
    assert isinstance(W, np.ndarray) and W.shape == (p, k) and W.dtype == np.float64
    np.testing.assert_allclose(W.T @ W, np.eye(k), rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_random_stiefel_seeded_reproducible(seed):
    np.testing.assert_array_equal(random_stiefel(6, 3, seed), random_stiefel(6, 3, seed))
    np.testing.assert_array_equal(
        random_stiefel(6, 3, np.random.default_rng(seed)),
        random_stiefel(6, 3, np.random.default_rng(seed)),
    )
    np.testing.assert_array_equal(
        random_stiefel(6, 3, seed), random_stiefel(6, 3, np.random.default_rng(seed))
    )
    assert not np.allclose(random_stiefel(6, 3, seed), random_stiefel(6, 3, seed + 1))


def test_random_stiefel_generator_advances():
    rng = np.random.default_rng(0)
    assert not np.allclose(random_stiefel(5, 2, rng), random_stiefel(5, 2, rng))


def test_random_stiefel_none_seed():
    W = random_stiefel(4, 2)
    assert orthonormality_error(W) <= 1e-12


@pytest.mark.parametrize("p, k", [(2, 3), (1, 2), (4, 5), (3, 10)])
def test_random_stiefel_raises_when_k_greater_than_p(p, k):
    with pytest.raises(ValueError, match="k <= p"):
        random_stiefel(p, k, 0)


def test_random_stiefel_mean_is_zero():
    """Haar measure is invariant under W -> -W: the sample mean shrinks to 0."""
    rng = np.random.default_rng(7)
    mean = np.mean([random_stiefel(4, 2, rng) for _ in range(2000)], axis=0)
    assert np.abs(mean).max() < 0.05


# ---------------------------------------------------------------------------------------------
# orthonormality_error
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_orthonormality_error_zero_on_stiefel(p, k, backend):
    err = orthonormality_error(_as(backend, random_stiefel(p, k, 120)))
    assert isinstance(err, float) and 0.0 <= err <= 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p, k", SHAPES)
def test_orthonormality_error_known_value(p, k, backend):
    """``(2W)ᵀ(2W) − I = 3 I``, so the error is ``3 √k``."""
    W = random_stiefel(p, k, 121)
    err = orthonormality_error(_as(backend, 2.0 * W))
    np.testing.assert_allclose(err, 3 * np.sqrt(k), rtol=1e-12)


@pytest.mark.parametrize("p, k", SHAPES)
def test_orthonormality_error_numpy_torch_agree(p, k):
    A = _gauss((p, k), 122)
    np.testing.assert_allclose(
        orthonormality_error(A), orthonormality_error(torch.as_tensor(A)), rtol=1e-12
    )
    expected = np.linalg.norm(A.T @ A - np.eye(k))
    np.testing.assert_allclose(orthonormality_error(A), expected, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_orthonormality_error_batch_is_max(backend):
    W = _stiefel_batch(5, 3, 3, seed=123)
    W[1] *= 2.0  # error 3√3
    W[2] *= 1.5  # error 1.25√3
    err = orthonormality_error(_as(backend, W))
    np.testing.assert_allclose(err, 3 * np.sqrt(3), rtol=1e-12)


def test_orthonormality_error_float32_torch():
    W = torch.as_tensor(random_stiefel(6, 3, 124), dtype=torch.float32)
    err = orthonormality_error(W)
    assert isinstance(err, float) and err < 1e-5


# ---------------------------------------------------------------------------------------------
# Exponential and logarithm (canonical metric)
# ---------------------------------------------------------------------------------------------

EXPLOG_SHAPES = SHAPES + [(5, 3), (7, 5), (64, 18)]  # (5, 3), (7, 5): p < 2k


def _tangent(W, norm, seed):
    """A tangent vector at ``W`` of Frobenius norm ``norm`` with both a skew (``WΩ``) and a
    normal part."""
    D = tangent_project(W, _gauss(W.shape, seed))
    return D * (norm / np.linalg.norm(D))


def _is_tangent_error(W, D):
    return np.linalg.norm(W.T @ D + D.T @ W)


@pytest.mark.parametrize("p, k", EXPLOG_SHAPES)
@pytest.mark.parametrize("norm", [0.0, 1e-8, 0.3, 1.0, 3.0, 10.0])
def test_stiefel_exp_on_manifold(p, k, norm):
    W = random_stiefel(p, k, p * k)
    X = stiefel_exp(W, _tangent(W, norm, 1))
    assert X.shape == (p, k) and X.dtype == np.float64
    assert orthonormality_error(X) <= 1e-13


@pytest.mark.parametrize("p, k", EXPLOG_SHAPES)
def test_stiefel_exp_zero_is_identity(p, k):
    W = random_stiefel(p, k, 0)
    np.testing.assert_allclose(stiefel_exp(W, np.zeros((p, k))), W, rtol=0, atol=1e-15)


@pytest.mark.parametrize("p", [3, 5, 10])
def test_stiefel_exp_sphere_is_great_circle(p):
    """``k = 1``: the geodesics are great circles, ``cos‖D‖ W + sin‖D‖ D/‖D‖``."""
    W = random_stiefel(p, 1, p)
    for norm in [0.1, 1.0, 2.5]:
        D = _tangent(W, norm, 2)
        expected = np.cos(norm) * W + np.sin(norm) * D / norm
        np.testing.assert_allclose(stiefel_exp(W, D), expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("p, k", EXPLOG_SHAPES)
def test_stiefel_exp_vertical_direction(p, k):
    """``D = WΩ`` (Ω skew): ``Exp_W(D) = W expm(Ω)`` (rotation within the span of ``W``)."""
    W = random_stiefel(p, k, 3)
    G = _gauss((k, k), 4)
    Omega = 0.7 * (G - G.T)
    np.testing.assert_allclose(stiefel_exp(W, W @ Omega), W @ scipy.linalg.expm(Omega), rtol=0, atol=1e-13)


@pytest.mark.parametrize("p", [3, 5])
def test_stiefel_exp_orthogonal_group(p):
    """``k = p``: every tangent vector is ``WΩ``, so ``Exp_W(D) = W expm(WᵀD)``."""
    W = random_stiefel(p, p, 5)
    D = _tangent(W, 2.0, 6)
    np.testing.assert_allclose(stiefel_exp(W, D), W @ scipy.linalg.expm(W.T @ D), rtol=0, atol=1e-13)


@pytest.mark.parametrize("p, k", EXPLOG_SHAPES)
@pytest.mark.parametrize("norm", [1e-6, 0.1, 0.5, 1.0])
def test_stiefel_log_inverts_exp(p, k, norm):
    """``Log_W(Exp_W(D)) = D`` for tangent ``D`` of moderate norm; the result is tangent."""
    W = random_stiefel(p, k, 10 * p + k)
    D = _tangent(W, norm, 7)
    L = stiefel_log(W, stiefel_exp(W, D))
    assert L.shape == (p, k) and L.dtype == np.float64
    np.testing.assert_allclose(L, D, rtol=0, atol=1e-12)
    assert _is_tangent_error(W, L) <= 1e-13


@pytest.mark.parametrize("p, k", EXPLOG_SHAPES)
@pytest.mark.parametrize("spread", [0.05, 0.5, 1.5])
def test_stiefel_exp_inverts_log(p, k, spread):
    """``Exp_W(Log_W(W1)) = W1`` for ``W1`` near ``W`` (a polar retraction away), and
    ``Log_W(W1)`` is tangent at ``W``."""
    W = random_stiefel(p, k, p + k)
    W1 = retract(W, _tangent(W, spread, 8))
    L = stiefel_log(W, W1)
    assert _is_tangent_error(W, L) <= 1e-13
    np.testing.assert_allclose(stiefel_exp(W, L), W1, rtol=0, atol=1e-12)


@pytest.mark.parametrize("p, k", EXPLOG_SHAPES)
def test_stiefel_log_at_base_point_is_zero(p, k):
    W = random_stiefel(p, k, 11)
    np.testing.assert_allclose(stiefel_log(W, W), 0.0, rtol=0, atol=1e-14)


@pytest.mark.parametrize("p, k", EXPLOG_SHAPES)
def test_stiefel_log_along_a_geodesic(p, k):
    """Points of one geodesic: ``Log_W(Exp_W(tD)) = tD`` for several ``t``."""
    W = random_stiefel(p, k, 12)
    D = _tangent(W, 1.0, 13)
    for t in [0.1, 0.4, 0.8]:
        np.testing.assert_allclose(stiefel_log(W, stiefel_exp(W, t * D)), t * D, rtol=0, atol=1e-12)


@pytest.mark.parametrize("p, k", EXPLOG_SHAPES)
def test_stiefel_exp_log_equivariance(p, k):
    """The canonical metric is invariant under ``W ↦ QWR`` (``Q ∈ O(p)``, ``R ∈ O(k)``):
    ``Exp_{QWR}(QDR) = Q Exp_W(D) R`` and ``Log_{QWR}(QW1R) = Q Log_W(W1) R``."""
    rng = np.random.default_rng(14)
    Q = random_stiefel(p, p, rng)
    R = random_stiefel(k, k, rng)
    Q[:, 0] *= -1  # an improper one too
    W = random_stiefel(p, k, rng)
    D = _tangent(W, 0.8, 15)
    W1 = stiefel_exp(W, D)
    np.testing.assert_allclose(stiefel_exp(Q @ W @ R, Q @ D @ R), Q @ W1 @ R, rtol=0, atol=1e-12)
    np.testing.assert_allclose(stiefel_log(Q @ W @ R, Q @ W1 @ R), Q @ stiefel_log(W, W1) @ R, rtol=0, atol=1e-12)


@pytest.mark.parametrize("p, k", [(4, 2), (6, 3), (8, 4), (64, 18)])
def test_stiefel_log_far_point_raises(p, k):
    """``−W`` is a rotation by π away: no principal logarithm."""
    W = random_stiefel(p, k, 16)
    with pytest.raises(RuntimeError, match="too far"):
        stiefel_log(W, -W)


def test_stiefel_log_not_converging_raises():
    W = random_stiefel(8, 4, 17)
    W1 = stiefel_exp(W, _tangent(W, 1.0, 18))
    with pytest.raises(RuntimeError, match="did not converge in 1 iterations"):
        stiefel_log(W, W1, tol=0.0, max_iter=1)
