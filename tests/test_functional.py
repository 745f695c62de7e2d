"""Tests for ``skfedspd.functional``: spectral functions with Daleckii–Krein gradients, vech.

The gradient tests cover the three regimes that matter for SPDnet:

* distinct eigenvalues (where plain ``torch.linalg.eigh`` autograd is also fine),
* exactly repeated eigenvalues (``c·I``, exact diagonal ties, and ``U diag(...) Uᵀ`` with a
  repeated entry), where ``eigh`` autograd divides by zero,
* eigenvalues clamped by ReEig (several strictly below ``eps``, none exactly at ``eps``).
"""

import numpy as np
import pytest
import scipy.linalg
import torch
from pyriemann.datasets import make_matrices
from pyriemann.geometry.geodesic import geodesic_riemann
from pyriemann.geometry.mean import mean_logeuclid, mean_riemann
from pyriemann.utils.base import logm as pyr_logm

from skfedspd.functional import (
    _loewner,
    expm_sym,
    karcher_mean,
    logeig,
    reeig,
    reeig_logeig,
    spd_geodesic,
    spectral_function,
    sqrtm_invsqrtm,
    unvech,
    vech,
)

EPS = 1e-2  # ReEig threshold used throughout; clamped eigenvalues stay >= 1e-3 away from it.
DTYPE = torch.float64


# ---------------------------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------------------------


def _orth(n, seed):
    Q, R = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))
    return Q * np.sign(np.diag(R))


def _rotated(eigvals, seed=0):
    """``Q diag(eigvals) Qᵀ`` for a random orthogonal ``Q``, symmetrised exactly."""
    eigvals = np.asarray(eigvals, dtype=float)
    Q = _orth(len(eigvals), seed)
    X = (Q * eigvals) @ Q.T
    return 0.5 * (X + X.T)


# name -> numpy matrix. All SPD with eigenvalues >= 0.5 (safe for logeig and for gradcheck).
SPD_CASES = {
    "distinct": _rotated([0.5, 1.3, 2.0, 3.7], seed=1),
    "scaled_identity": 2.5 * np.eye(4),
    "identity": np.eye(3),
    "diag_repeated": np.diag([1.0, 1.0, 2.0, 3.0]),
    "two_equal_rotated": _rotated([1.0, 1.0, 2.0, 3.0], seed=2),
    "three_equal_rotated": _rotated([0.7, 0.7, 0.7, 4.0], seed=3),
    "two_pairs_rotated": _rotated([0.8, 0.8, 1.9, 1.9, 3.0], seed=4),
}

# Symmetric matrices with several eigenvalues strictly below EPS (none at EPS). Some are not
# SPD: ReEig and ReEig∘LogEig accept any symmetric input.
CLAMP_CASES = {
    "clamped_small": _rotated([1e-4, 3e-4, 2e-3, 1.5, 2.0], seed=5),
    "clamped_negative": _rotated([-1.0, -0.5, 3e-3, 0.3, 2.0], seed=6),
    "clamped_tied_zero": np.diag([0.0, 0.0, 1.0, 2.0]),
    "clamped_tied_rotated": _rotated([1e-3, 1e-3, 1e-3, 0.4, 0.9], seed=7),
    "clamped_all_scaled_identity": 1e-3 * np.eye(4),
    "clamped_rank_deficient": (lambda B: B @ B.T)(
        np.random.default_rng(8).standard_normal((5, 2))
    ),
}

ALL_CASES = {**SPD_CASES, **CLAMP_CASES}


def _t(X, dtype=DTYPE):
    return torch.as_tensor(X, dtype=dtype)


def _sym_wrap(f):
    """Input-symmetrising wrapper so gradcheck may perturb entries independently."""
    return lambda A: f(0.5 * (A + A.mT))


def _rand_sym(n, seed, batch=()):
    A = np.random.default_rng(seed).standard_normal(batch + (n, n))
    return 0.5 * (A + np.swapaxes(A, -1, -2))


def _batch(names):
    """Stack same-size cases into one ``(B, n, n)`` tensor."""
    return _t(np.stack([ALL_CASES[name] for name in names]))


FUNCTIONS = {
    "reeig": lambda X: reeig(X, EPS),
    "logeig": logeig,
    "reeig_logeig": lambda X: reeig_logeig(X, EPS),
    "spectral_exp": lambda X: spectral_function(X, torch.exp, torch.exp),
    "spectral_sqrt": lambda X: spectral_function(
        X, torch.sqrt, lambda lam: 0.5 / torch.sqrt(lam)
    ),
    "spectral_cube": lambda X: spectral_function(X, lambda lam: lam**3, lambda lam: 3 * lam**2),
}
SPD_ONLY = {"logeig", "spectral_sqrt"}


def _function_case_pairs():
    pairs = []
    for fname in FUNCTIONS:
        cases = SPD_CASES if fname in SPD_ONLY else ALL_CASES
        pairs += [(fname, cname) for cname in cases]
    return pairs


FUNCTION_CASE_PAIRS = _function_case_pairs()


# Plain eigh-based implementations (autograd through torch.linalg.eigh).
def _plain_spectral(X, f):
    lam, U = torch.linalg.eigh(X)
    return (U * f(lam).unsqueeze(-2)) @ U.mT


def _plain_logeig(X):
    return _plain_spectral(X, torch.log)


def _plain_reeig(X, eps):
    return _plain_spectral(X, lambda lam: lam.clamp_min(eps))


def _grad(f, X, G):
    X = X.detach().clone().requires_grad_(True)
    (f(X) * G).sum().backward()
    return X.grad


def _fd_directional(loss, X, E, h=1e-6):
    """Central finite difference of ``loss`` at ``X`` along ``E``."""
    with torch.no_grad():
        return (loss(X + h * E) - loss(X - h * E)) / (2 * h)


# ---------------------------------------------------------------------------------------------
# Sanity of the test cases themselves
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CLAMP_CASES)
def test_clamp_cases_have_several_eigenvalues_strictly_below_eps(name):
    lam = np.linalg.eigvalsh(CLAMP_CASES[name])
    assert np.sum(lam < EPS) >= 2
    assert np.min(np.abs(lam - EPS)) > 1e-3  # no eigenvalue at (or near) the kink


@pytest.mark.parametrize("name", ["scaled_identity", "identity", "diag_repeated"])
def test_exact_cases_have_exactly_repeated_eigenvalues(name):
    lam = torch.linalg.eigvalsh(_t(SPD_CASES[name]))
    assert torch.any(lam[1:] == lam[:-1])


# ---------------------------------------------------------------------------------------------
# gradcheck (float64)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fname, cname", FUNCTION_CASE_PAIRS)
def test_gradcheck(fname, cname):
    X = _t(ALL_CASES[cname]).requires_grad_(True)
    assert torch.autograd.gradcheck(_sym_wrap(FUNCTIONS[fname]), (X,))


@pytest.mark.parametrize(
    "fname, names",
    [
        ("logeig", ["distinct", "scaled_identity", "diag_repeated", "two_equal_rotated"]),
        ("spectral_exp", ["distinct", "scaled_identity", "diag_repeated", "two_equal_rotated"]),
        (
            "reeig",
            ["distinct", "diag_repeated", "clamped_tied_zero", "clamped_all_scaled_identity"],
        ),
        (
            "reeig_logeig",
            ["distinct", "diag_repeated", "clamped_tied_zero", "clamped_all_scaled_identity"],
        ),
        ("reeig", ["clamped_small", "clamped_negative", "clamped_tied_rotated"]),
        ("reeig_logeig", ["clamped_small", "clamped_negative", "clamped_tied_rotated"]),
    ],
)
def test_gradcheck_batch(fname, names):
    X = _batch(names).requires_grad_(True)
    assert X.ndim == 3 and X.shape[0] == len(names)
    assert torch.autograd.gradcheck(_sym_wrap(FUNCTIONS[fname]), (X,))


@pytest.mark.parametrize("fname", ["reeig", "reeig_logeig", "logeig", "spectral_exp"])
def test_gradcheck_nested_batch_of_random_spd(fname):
    """Random well-conditioned SPD batch, extra leading batch dimension ``(2, 3, n, n)``."""
    A = np.random.default_rng(11).standard_normal((2, 3, 4, 4))
    X = _t(A @ np.swapaxes(A, -1, -2) + 0.5 * np.eye(4)).requires_grad_(True)
    assert torch.autograd.gradcheck(_sym_wrap(FUNCTIONS[fname]), (X,))


# ---------------------------------------------------------------------------------------------
# No NaN / Inf
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("fname, cname", FUNCTION_CASE_PAIRS)
def test_forward_backward_finite(fname, cname, dtype):
    X = _t(ALL_CASES[cname], dtype=dtype).requires_grad_(True)
    Y = FUNCTIONS[fname](X)
    assert torch.isfinite(Y).all()
    G = _t(_rand_sym(X.shape[-1], seed=0), dtype=dtype)
    (Y * G).sum().backward()
    assert torch.isfinite(X.grad).all()


@pytest.mark.parametrize("fname", ["reeig", "logeig", "reeig_logeig"])
def test_backward_finite_batch_with_mixed_cases(fname):
    names = ["scaled_identity", "diag_repeated", "two_equal_rotated", "distinct"]
    if fname != "logeig":
        names += ["clamped_tied_zero", "clamped_all_scaled_identity"]
    X = _batch(names).requires_grad_(True)
    Y = FUNCTIONS[fname](X)
    Y.square().sum().backward()
    assert torch.isfinite(Y).all() and torch.isfinite(X.grad).all()


# ---------------------------------------------------------------------------------------------
# Why the custom backward is needed: plain eigh autograd breaks on repeated eigenvalues.
# (Only cases checked to fail deterministically: exact ties returned by eigh. For rotated
# ties, eigh returns eigenvalues ~1e-16 apart and plain autograd is NaN for some seeds only.)
# ---------------------------------------------------------------------------------------------


PLAIN_FAILURES = [
    ("logeig", "scaled_identity"),
    ("logeig", "identity"),
    ("logeig", "diag_repeated"),
    ("reeig", "scaled_identity"),
    ("reeig", "diag_repeated"),
    ("reeig", "clamped_tied_zero"),  # ReEig clamps two exactly-zero eigenvalues
    ("reeig", "clamped_all_scaled_identity"),
]


@pytest.mark.parametrize("fname, cname", PLAIN_FAILURES)
def test_plain_eigh_autograd_fails_on_repeated_eigenvalues(fname, cname):
    plain = {"logeig": _plain_logeig, "reeig": lambda X: _plain_reeig(X, EPS)}[fname]
    X = _t(ALL_CASES[cname])
    G = _t(_rand_sym(X.shape[-1], seed=3))
    g_plain = _grad(plain, X, G)
    g_custom = _grad(FUNCTIONS[fname], X, G)
    # The forward passes agree: only the backward differs.
    torch.testing.assert_close(plain(X), FUNCTIONS[fname](X), rtol=0, atol=1e-12)
    assert not torch.isfinite(g_plain).all()
    assert torch.isfinite(g_custom).all()
    # ... and the custom gradient is the right one (central finite differences).
    E = _t(_rand_sym(X.shape[-1], seed=4))
    fd = _fd_directional(lambda Z: (FUNCTIONS[fname](Z) * G).sum(), X, E)
    torch.testing.assert_close((g_custom * E).sum(), fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    "fname, cname",
    [
        ("logeig", "distinct"),
        ("reeig", "distinct"),
        ("reeig", "clamped_small"),
        ("reeig", "clamped_negative"),
    ],
)
def test_custom_backward_equals_plain_eigh_for_distinct_eigenvalues(fname, cname):
    plain = {"logeig": _plain_logeig, "reeig": lambda X: _plain_reeig(X, EPS)}[fname]
    X = _t(ALL_CASES[cname])
    G = _t(np.random.default_rng(5).standard_normal(X.shape))
    torch.testing.assert_close(
        _grad(FUNCTIONS[fname], X, G), _grad(plain, X, G), rtol=1e-10, atol=1e-12
    )


# ---------------------------------------------------------------------------------------------
# Forward values against independent oracles
# ---------------------------------------------------------------------------------------------


def _np_spectral(X, f):
    w, V = np.linalg.eigh(X)
    return (V * f(w)[..., None, :]) @ np.swapaxes(V, -1, -2)


@pytest.mark.parametrize("cname", SPD_CASES)
def test_logeig_matches_scipy_logm(cname):
    X = SPD_CASES[cname]
    expected = np.real(scipy.linalg.logm(X))
    np.testing.assert_allclose(logeig(_t(X)).numpy(), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("cname", SPD_CASES)
def test_logeig_matches_pyriemann_logm(cname):
    X = SPD_CASES[cname]
    np.testing.assert_allclose(logeig(_t(X)).numpy(), pyr_logm(X), rtol=0, atol=1e-10)


def test_logeig_batch_matches_pyriemann_logm():
    A = np.random.default_rng(12).standard_normal((2, 3, 5, 5))
    X = A @ np.swapaxes(A, -1, -2) + 0.1 * np.eye(5)
    Y = logeig(_t(X)).numpy()
    assert Y.shape == X.shape
    np.testing.assert_allclose(Y, pyr_logm(X), rtol=0, atol=1e-10)
    np.testing.assert_allclose(Y[1, 2], np.real(scipy.linalg.logm(X[1, 2])), rtol=0, atol=1e-10)


@pytest.mark.parametrize("c", [1e-3, 0.5, 1.0, 7.0])
def test_logeig_scaled_identity_exact(c):
    Y = logeig(_t(c * np.eye(4)))
    np.testing.assert_allclose(Y.numpy(), np.log(c) * np.eye(4), rtol=0, atol=1e-14)


@pytest.mark.parametrize("eps", [1e-4, EPS, 0.5])
@pytest.mark.parametrize("cname", ALL_CASES)
def test_reeig_matches_numpy_reference(cname, eps):
    X = ALL_CASES[cname]
    expected = _np_spectral(X, lambda w: np.maximum(w, eps))
    np.testing.assert_allclose(reeig(_t(X), eps).numpy(), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("cname", ALL_CASES)
def test_reeig_eigenvalues_are_clamped(cname):
    X = ALL_CASES[cname]
    lam = np.linalg.eigvalsh(reeig(_t(X), EPS).numpy())
    np.testing.assert_allclose(
        lam, np.maximum(np.linalg.eigvalsh(X), EPS), rtol=0, atol=1e-10
    )
    assert lam.min() >= EPS - 1e-12


@pytest.mark.parametrize("cname", SPD_CASES)
def test_reeig_is_identity_above_eps(cname):
    X = _t(SPD_CASES[cname])  # all eigenvalues >= 0.5 > EPS
    torch.testing.assert_close(reeig(X, EPS), X, rtol=0, atol=1e-12)


def test_reeig_batch_matches_numpy_reference():
    X = np.stack([CLAMP_CASES["clamped_small"], CLAMP_CASES["clamped_negative"]])
    expected = _np_spectral(X, lambda w: np.maximum(w, EPS))
    np.testing.assert_allclose(reeig(_t(X), EPS).numpy(), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("cname", ALL_CASES)
def test_reeig_logeig_forward_equals_composition(cname):
    X = _t(ALL_CASES[cname])
    torch.testing.assert_close(reeig_logeig(X, EPS), logeig(reeig(X, EPS)), rtol=0, atol=1e-10)
    expected = _np_spectral(ALL_CASES[cname], lambda w: np.log(np.maximum(w, EPS)))
    np.testing.assert_allclose(reeig_logeig(X, EPS).numpy(), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("cname", SPD_CASES)
def test_spectral_function_identity_and_exp(cname):
    X = SPD_CASES[cname]
    Y = spectral_function(_t(X), lambda lam: lam, torch.ones_like)
    np.testing.assert_allclose(Y.numpy(), X, rtol=0, atol=1e-12)
    E = spectral_function(_t(X), torch.exp, torch.exp)
    np.testing.assert_allclose(E.numpy(), scipy.linalg.expm(X), rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("fname", ["reeig", "logeig", "reeig_logeig"])
def test_output_symmetric_and_dtype_preserved(fname):
    for dtype in (torch.float32, torch.float64):
        X = _t(SPD_CASES["distinct"], dtype=dtype)
        Y = FUNCTIONS[fname](X)
        assert Y.dtype == dtype and Y.shape == X.shape
        torch.testing.assert_close(Y, Y.mT)


# ---------------------------------------------------------------------------------------------
# reeig_logeig gradients: composition and finite differences
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cname", ALL_CASES)
def test_reeig_logeig_grad_equals_composition_grad(cname):
    X = _t(ALL_CASES[cname])
    G = _t(np.random.default_rng(21).standard_normal(X.shape))
    g_fused = _grad(lambda Z: reeig_logeig(Z, EPS), X, G)
    g_comp = _grad(lambda Z: logeig(reeig(Z, EPS)), X, G)
    assert torch.isfinite(g_fused).all()
    torch.testing.assert_close(g_fused, g_comp, rtol=1e-9, atol=1e-9)


def test_reeig_logeig_grad_equals_composition_grad_batch():
    names = ["distinct", "diag_repeated", "clamped_tied_zero", "clamped_all_scaled_identity"]
    X = _batch(names)
    G = _t(np.random.default_rng(22).standard_normal(X.shape))
    g_fused = _grad(lambda Z: reeig_logeig(Z, EPS), X, G)
    g_comp = _grad(lambda Z: logeig(reeig(Z, EPS)), X, G)
    torch.testing.assert_close(g_fused, g_comp, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cname", ALL_CASES)
def test_reeig_logeig_grad_matches_finite_differences(cname, seed):
    X = _t(ALL_CASES[cname])
    n = X.shape[-1]
    G = _t(_rand_sym(n, seed=100 + seed))

    def loss(Z):  # nonlinear scalar loss of the output
        Y = reeig_logeig(Z, EPS)
        return (G * Y).sum() + 0.25 * (Y**2).sum()

    Xg = X.clone().requires_grad_(True)
    loss(Xg).backward()
    E = _t(_rand_sym(n, seed=200 + seed))
    fd = _fd_directional(loss, X, E)
    torch.testing.assert_close((Xg.grad * E).sum(), fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("cname", CLAMP_CASES)
def test_reeig_grad_vanishes_on_clamped_block(cname):
    """In the eigenbasis, the gradient block between two clamped eigenvalues is zero."""
    X = _t(CLAMP_CASES[cname])
    lam, U = torch.linalg.eigh(X)
    G = _t(_rand_sym(X.shape[-1], seed=31))
    for f in (lambda Z: reeig(Z, EPS), lambda Z: reeig_logeig(Z, EPS)):
        g = U.mT @ _grad(f, X, G) @ U
        clamped = lam < EPS
        block = g[clamped][:, clamped]
        assert block.abs().max() < 1e-12


@pytest.mark.parametrize("gap", [1e-6, 1e-9, 1e-12, 1e-15])
def test_logeig_grad_accurate_for_nearly_repeated_eigenvalues(gap):
    """Near-ties: the Loewner matrix stays accurate across the tie threshold."""
    X = _t(_rotated([2.0, 2.0 + gap, 3.0, 5.0], seed=9))
    G = _t(_rand_sym(4, seed=10))
    g = _grad(logeig, X, G)
    lam, U = torch.linalg.eigh(X)
    d = lam[None, :] - lam[:, None]
    safe = torch.where(d == 0, torch.ones_like(d), d)
    # Stable divided difference of log: log1p(d / λ_i) / d.
    L = torch.where(d == 0, 1.0 / lam[:, None], torch.log1p(d / lam[:, None]) / safe)
    ref = U @ (L * (U.mT @ G @ U)) @ U.mT
    torch.testing.assert_close(g, ref, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("f, df", [(torch.log, torch.reciprocal), (torch.exp, torch.exp)])
def test_loewner_fast_path_equals_tie_path(f, df):
    """Without ties the diagonal is set directly; with a tie anywhere in the batch every
    matrix goes through the pairwise mask: the tie-free matrices must not notice."""
    distinct = torch.linalg.eigvalsh(_t(ALL_CASES["distinct"]))
    tied = torch.linalg.eigvalsh(_t(SPD_CASES["diag_repeated"]))
    alone = _loewner(distinct, f(distinct), df)
    batch = torch.stack([distinct, tied])
    together = _loewner(batch, f(batch), df)
    torch.testing.assert_close(together[0], alone, rtol=0, atol=0)
    li, lj = distinct[:, None], distinct[None, :]
    off = ~torch.eye(len(distinct), dtype=torch.bool)
    torch.testing.assert_close(alone[off], ((f(li) - f(lj)) / (li - lj))[off], rtol=1e-14, atol=0)
    torch.testing.assert_close(alone.diagonal(), df(distinct), rtol=0, atol=0)
    # the tied pair (λ = 1, 1) takes the derivative, finite
    assert together[1, 0, 1] == df(tied[0]) and torch.isfinite(together).all()


@pytest.mark.parametrize("fname", ["reeig", "logeig", "reeig_logeig"])
def test_one_by_one_matrices(fname):
    f = {
        "reeig": lambda Z: reeig(Z, EPS),
        "logeig": logeig,
        "reeig_logeig": lambda Z: reeig_logeig(Z, EPS),
    }[fname]
    X = _t([[[2.0]], [[0.5]]]).requires_grad_(True)
    assert torch.autograd.gradcheck(f, (X,))


# ---------------------------------------------------------------------------------------------
# vech / unvech
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [(), (3,), (2, 4)])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_vech_length(n, batch):
    v = vech(_t(_rand_sym(n, seed=0, batch=batch)))
    assert v.shape == batch + (n * (n + 1) // 2,)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_vech_isometry(n, dtype, tol):
    X = _t(_rand_sym(n, seed=n, batch=(3,)), dtype=dtype)
    torch.testing.assert_close(
        torch.linalg.vector_norm(vech(X), dim=-1),
        torch.linalg.matrix_norm(X),
        rtol=tol,
        atol=0,
    )


@pytest.mark.parametrize("n", [2, 3, 6])
def test_vech_preserves_inner_products(n):
    X = _t(_rand_sym(n, seed=1, batch=(4,)))
    Y = _t(_rand_sym(n, seed=2, batch=(4,)))
    torch.testing.assert_close(
        (vech(X) * vech(Y)).sum(-1), (X * Y).sum((-1, -2)), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_unvech_inverts_vech(n, batch, dtype, tol):
    X = _t(_rand_sym(n, seed=3, batch=batch), dtype=dtype)
    Y = unvech(vech(X))
    assert Y.shape == X.shape and Y.dtype == dtype
    torch.testing.assert_close(Y, X, rtol=tol, atol=tol)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_vech_inverts_unvech(n):
    v = _t(np.random.default_rng(4).standard_normal((3, n * (n + 1) // 2)))
    Y = unvech(v)
    torch.testing.assert_close(Y, Y.mT, rtol=0, atol=0)
    torch.testing.assert_close(vech(Y), v, rtol=1e-12, atol=1e-12)


def test_vech_layout_upper_triangle_row_major_with_sqrt2():
    X = _t([[1.0, 2.0, 3.0], [2.0, 4.0, 5.0], [3.0, 5.0, 6.0]])
    r = np.sqrt(2.0)
    expected = _t([1.0, 2.0 * r, 3.0 * r, 4.0, 5.0 * r, 6.0])
    torch.testing.assert_close(vech(X), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("m", [2, 4, 5, 7, 8, 9, 11, 14, 16, 20])
def test_unvech_raises_on_bad_length(m):
    with pytest.raises(ValueError, match="n\\(n\\+1\\)/2"):
        unvech(torch.zeros(m, dtype=DTYPE))


def test_vech_is_differentiable():
    X = _t(_rand_sym(4, seed=5)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda A: vech(0.5 * (A + A.mT)), (X,))
    v = _t(np.random.default_rng(6).standard_normal(10)).requires_grad_(True)
    assert torch.autograd.gradcheck(unvech, (v,))


# ---------------------------------------------------------------------------------------------
# Square roots, geodesic and the affine-invariant (Karcher) mean used by SPD batch norm
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cname", SPD_CASES)
def test_sqrtm_invsqrtm_values(cname):
    X = _t(SPD_CASES[cname])
    root, inv_root = sqrtm_invsqrtm(X)
    np.testing.assert_allclose(root.numpy(), scipy.linalg.sqrtm(SPD_CASES[cname]).real, atol=1e-12)
    np.testing.assert_allclose((inv_root @ X @ inv_root).numpy(), np.eye(len(X)), atol=1e-12)


@pytest.mark.parametrize("cname", SPD_CASES)
@pytest.mark.parametrize("output", ["sqrt", "invsqrt", "both"])
def test_sqrtm_invsqrtm_gradcheck(cname, output):
    """One eigh, two outputs: the joint backward, at distinct and repeated eigenvalues."""
    X = _t(SPD_CASES[cname]).requires_grad_(True)
    pick = {"sqrt": lambda r, i: r, "invsqrt": lambda r, i: i, "both": lambda r, i: r @ i.T + 0.3 * i}[output]
    assert torch.autograd.gradcheck(_sym_wrap(lambda A: pick(*sqrtm_invsqrtm(A))), (X,))


@pytest.mark.parametrize("cname", SPD_CASES)
def test_expm_sym_gradcheck_and_value(cname):
    S = _t(pyr_logm(SPD_CASES[cname]))
    np.testing.assert_allclose(expm_sym(S).numpy(), SPD_CASES[cname], atol=1e-12)
    assert torch.autograd.gradcheck(_sym_wrap(expm_sym), (S.clone().requires_grad_(True),))


@pytest.mark.parametrize("t", [0.0, 0.1, 0.5, 1.0])
def test_spd_geodesic_matches_pyriemann(t):
    A, B = make_matrices(2, 4, "spd", 0)
    np.testing.assert_allclose(spd_geodesic(_t(A), _t(B), t).numpy(), geodesic_riemann(A, B, t), atol=1e-12)


def _spd_set(m, n, seed):
    return make_matrices(m, n, "spd", seed)


@pytest.mark.parametrize("m, n, seed", [(2, 3, 0), (10, 4, 1), (40, 8, 2), (7, 1, 3)])
def test_karcher_mean_matches_pyriemann(m, n, seed):
    X = _spd_set(m, n, seed)
    expected = mean_riemann(X, tol=1e-14, maxiter=500)
    M = karcher_mean(_t(X), 100, tol=1e-13).numpy()
    np.testing.assert_allclose(M, expected, rtol=1e-11, atol=1e-12 * np.abs(expected).max())
    np.testing.assert_allclose(karcher_mean(_t(X), 0).numpy(), mean_logeuclid(X), atol=1e-12 * np.abs(expected).max())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_karcher_steps_converge_fast_from_the_log_euclidean_mean(seed):
    """The figures quoted by SPDBatchNorm: each fixed-point step divides the error by >= 20."""
    X = _spd_set(30, 6, seed)
    expected = mean_riemann(X, tol=1e-14, maxiter=500)
    errors = [np.abs(karcher_mean(_t(X), k).numpy() - expected).max() / np.abs(expected).max() for k in range(4)]
    assert errors[0] < 5e-3
    for before, after in zip(errors, errors[1:]):
        assert after < before / 20


def test_karcher_mean_congruence_equivariant():
    X = _spd_set(12, 5, 4)
    A = np.random.default_rng(5).standard_normal((5, 5))
    M = karcher_mean(_t(X), 100, tol=1e-13).numpy()
    moved = karcher_mean(_t(A @ X @ A.T), 100, tol=1e-13).numpy()
    np.testing.assert_allclose(moved, A @ M @ A.T, rtol=1e-10, atol=1e-11 * np.abs(moved).max())


def _inverse_pair(seed):
    """``{A, A⁻¹}``: its Karcher and log-Euclidean means are exactly ``I`` (all eigenvalues tied)."""
    A = _rotated([0.5, 1.3, 2.0, 3.7], seed=seed)
    return np.stack([A, np.linalg.inv(A)])


REPEATED_MEAN_BATCHES = {
    "inverse_pair": _inverse_pair(1),
    "identities": np.stack([np.eye(4)] * 3),
    "scaled_identity_and_rotated": np.stack([2.5 * np.eye(4), SPD_CASES["two_equal_rotated"]]),
    "random": _spd_set(5, 4, 6),
}


@pytest.mark.parametrize("n_iter", [0, 1, 3])
@pytest.mark.parametrize("bname", REPEATED_MEAN_BATCHES)
def test_karcher_mean_gradcheck(bname, n_iter):
    """float64 gradcheck of the computed mean (log-Euclidean start + fixed steps), including
    batches whose mean or whose matrices have repeated eigenvalues."""
    X = _t(REPEATED_MEAN_BATCHES[bname]).requires_grad_(True)
    M = karcher_mean(X.detach(), n_iter)
    assert torch.isfinite(M).all()
    if bname == "inverse_pair":
        np.testing.assert_allclose(M.numpy(), np.eye(4), atol=1e-12)
    assert torch.autograd.gradcheck(_sym_wrap(lambda A: karcher_mean(A, n_iter)), (X,))


@pytest.mark.parametrize("bname", ["inverse_pair", "random", "scaled_identity_and_rotated"])
def test_karcher_mean_gradient_matches_pyriemann_finite_differences(bname):
    """Independent oracle: central differences of pyRiemann's mean_riemann along a random
    symmetric direction vs our backward through converged fixed-point steps."""
    X = REPEATED_MEAN_BATCHES[bname]
    E = _rand_sym(X.shape[-1], 8, batch=(len(X),))
    C = _rand_sym(X.shape[-1], 9)
    Xt = _t(X).requires_grad_(True)
    (karcher_mean(Xt, 40) * _t(C)).sum().backward()
    h = 1e-5

    def oracle(A):
        return float((mean_riemann(A, tol=1e-15, maxiter=1000) * C).sum())

    fd = (oracle(X + h * E) - oracle(X - h * E)) / (2 * h)
    assert float((Xt.grad * _t(E)).sum()) == pytest.approx(fd, rel=1e-6, abs=1e-8)
