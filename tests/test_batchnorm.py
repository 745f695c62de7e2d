"""Tests for ``skfedspd.batchnorm``: SPD batch normalization (Brooks et al. 2019) and its
domain-specific form (Kobler et al. 2022) against a numpy/pyRiemann oracle, with gradcheck
and finite differences.

Data comes from the ``spd_batch`` fixture of ``conftest.py``.
"""

import numpy as np
import pytest
import torch
from conftest import gauss_np, sym_weights
from pyriemann.geometry.geodesic import geodesic_riemann
from pyriemann.geometry.mean import mean_riemann
from torch.func import functional_call

from skfedspd.batchnorm import DomainSPDBatchNorm, SPDBatchNorm

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _np_power(M, p):
    lam, U = np.linalg.eigh(M)
    return (U * lam**p) @ U.T


def _np_expm_sym(S):
    lam, U = np.linalg.eigh(0.5 * (S + S.T))
    return (U * np.exp(lam)) @ U.T


def _oracle_normalize(X, log_bias, M=None):
    """Independent numpy/pyRiemann version of the layer: B^{1/2} M^{-1/2} X M^{-1/2} B^{1/2},
    M = pyRiemann's mean_riemann (converged) unless given."""
    M = mean_riemann(X, tol=1e-14, maxiter=1000) if M is None else M
    C = _np_expm_sym(0.5 * log_bias) @ _np_power(M, -0.5)
    return C @ X @ C.T


def _set_log_bias(bn, seed, scale=0.3):
    with torch.no_grad():
        bn.log_bias.copy_(torch.as_tensor(scale * gauss_np(tuple(bn.log_bias.shape), seed)))


def _repeated_batch(n):
    """Identity matrices and an inverse pair: batch mean exactly I (all eigenvalues tied)."""
    A = _np_power(np.cov(np.random.default_rng(40).standard_normal((n, 3 * n))), 1.0)
    return torch.as_tensor(np.stack([A, np.linalg.inv(A), np.eye(n), np.eye(n)]))


@pytest.mark.parametrize("layer", [SPDBatchNorm, DomainSPDBatchNorm])
@pytest.mark.parametrize("with_bias", [False, True])
def test_batchnorm_output_mean_is_the_bias(spd_batch, layer, with_bias):
    """Training mode: the batch is congruence-normalized to mean B (I before training)."""
    bn = layer(5, karcher_steps=30)
    if with_bias:
        _set_log_bias(bn, 41)
    X = spd_batch(12, 5, seed=42)
    Y = bn(X).detach().numpy()
    B = bn.bias().detach().numpy()
    np.testing.assert_allclose(mean_riemann(Y, tol=1e-14, maxiter=1000), B, atol=1e-10)
    np.testing.assert_allclose(Y, _oracle_normalize(X.numpy(), bn.log_bias.detach().numpy()), atol=1e-10)
    assert (np.linalg.eigvalsh(Y) > 0).all()


@pytest.mark.parametrize("momentum", [0.1, 0.5, 1.0])
def test_batchnorm_running_mean_moves_along_the_geodesic(spd_batch, momentum):
    bn = SPDBatchNorm(4, momentum=momentum, karcher_steps=30)
    X1, X2 = spd_batch(6, 4, seed=43), 3.0 * spd_batch(6, 4, seed=44)
    expected = np.eye(4)
    for X in (X1, X2):
        bn(X)
        expected = geodesic_riemann(expected, mean_riemann(X.numpy(), tol=1e-14, maxiter=1000), momentum)
        np.testing.assert_allclose(bn.running_mean.numpy(), expected, atol=1e-10)


def test_batchnorm_eval_uses_running_mean_and_has_no_side_effect(spd_batch):
    bn = SPDBatchNorm(4, momentum=0.3)
    _set_log_bias(bn, 45)
    bn(spd_batch(8, 4, seed=46))
    bn.eval()
    running = bn.running_mean.clone()
    X = spd_batch(5, 4, seed=47)
    Y = bn(X).detach().numpy()
    torch.testing.assert_close(bn.running_mean, running, rtol=0, atol=0)
    np.testing.assert_allclose(
        Y, _oracle_normalize(X.numpy(), bn.log_bias.detach().numpy(), running.numpy()), atol=1e-12
    )
    # one matrix at evaluation: normalized by the running mean, not mapped to B
    np.testing.assert_allclose(bn(X[:1]).detach().numpy(), Y[:1], atol=1e-12)


@pytest.mark.parametrize("layer", [SPDBatchNorm, DomainSPDBatchNorm])
@pytest.mark.parametrize("karcher_steps", [0, 1, 2])
@pytest.mark.parametrize("batch", ["random", "repeated"])
def test_batchnorm_gradcheck(spd_batch, layer, karcher_steps, batch):
    """float64 gradcheck wrt the input batch and the bias, training mode (batch statistics),
    including a batch whose mean has all eigenvalues tied (= I) and identity members."""
    bn = layer(4, karcher_steps=karcher_steps)
    X0 = (spd_batch(4, 4, seed=48) if batch == "random" else _repeated_batch(4)).requires_grad_(True)
    L0 = torch.tensor(0.2 * gauss_np((4, 4), 49), requires_grad=True)

    def f(L, X):
        return functional_call(bn, {"log_bias": L}, (0.5 * (X + X.mT),))

    assert torch.autograd.gradcheck(f, (L0, X0), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_batchnorm_eval_gradcheck(spd_batch):
    bn = SPDBatchNorm(4)
    bn(spd_batch(6, 4, seed=50))
    bn.eval()
    X0 = spd_batch(3, 4, seed=51).requires_grad_(True)
    L0 = torch.tensor(0.2 * gauss_np((4, 4), 52), requires_grad=True)

    def f(L, X):
        return functional_call(bn, {"log_bias": L}, (0.5 * (X + X.mT),))

    assert torch.autograd.gradcheck(f, (L0, X0), eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("batch", ["random", "repeated"])
def test_batchnorm_gradient_matches_pyriemann_oracle_finite_differences(spd_batch, batch):
    """Whole layer (converged Karcher steps) vs central differences of the numpy/pyRiemann
    oracle along random symmetric directions in the input and the bias."""
    bn = SPDBatchNorm(4, karcher_steps=40)
    _set_log_bias(bn, 53)
    X = spd_batch(5, 4, seed=54) if batch == "random" else _repeated_batch(4)
    X = X.clone().requires_grad_(True)
    C = sym_weights(4, 55).numpy()
    (bn(X) * torch.as_tensor(C)).sum().backward()
    rng = np.random.default_rng(56)
    E = rng.standard_normal(tuple(X.shape))
    E = 0.5 * (E + E.transpose(0, 2, 1))
    F = rng.standard_normal((4, 4))
    F = 0.5 * (F + F.T)
    L = bn.log_bias.detach().numpy()
    Xn = X.detach().numpy()
    h = 1e-5

    def oracle(t):
        return float((_oracle_normalize(Xn + t * E, L + t * F) * C).sum())

    fd = (oracle(h) - oracle(-h)) / (2 * h)
    analytic = float((X.grad.numpy() * E).sum() + (bn.log_bias.grad.numpy() * F).sum())
    assert analytic == pytest.approx(fd, rel=1e-6, abs=1e-8)


def test_domain_batchnorm_normalizes_each_domain_by_its_own_mean(spd_batch):
    bn = DomainSPDBatchNorm(4, karcher_steps=30)
    _set_log_bias(bn, 57)
    X = spd_batch(12, 4, seed=58)
    domains = np.array(["b", "a", "c"] * 4)
    Y = bn(X, domains).detach().numpy()
    L = bn.log_bias.detach().numpy()
    for d in np.unique(domains):
        np.testing.assert_allclose(Y[domains == d], _oracle_normalize(X.numpy()[domains == d], L), atol=1e-10)
    # one domain = no domains; evaluation = training (nothing stored); torch labels accepted
    torch.testing.assert_close(bn(X, np.zeros(12)), bn(X))
    bn.eval()
    codes = torch.as_tensor(np.unique(domains, return_inverse=True)[1])
    np.testing.assert_array_equal(bn(X, codes).detach().numpy(), Y)
    assert list(dict(bn.named_buffers())) == []


def test_domain_batchnorm_rejects_bad_domains(spd_batch):
    bn = DomainSPDBatchNorm(3)
    with pytest.raises(ValueError, match="one label per matrix"):
        bn(spd_batch(4, 3), np.zeros(3))
    with pytest.raises(ValueError, match="one label per matrix"):
        bn(spd_batch(4, 3), np.zeros((4, 1)))


def test_domain_batchnorm_removes_a_domain_congruence(spd_batch):
    """A congruence of one domain changes that domain's output by one rotation only."""
    bn = DomainSPDBatchNorm(4, karcher_steps=30)
    X = spd_batch(10, 4, seed=59)
    domains = np.arange(10) % 2
    A = torch.as_tensor(gauss_np((4, 4), 60))
    moved = X.clone()
    moved[domains == 1] = A @ X[domains == 1] @ A.T
    Y, Y_moved = bn(X, domains).detach(), bn(moved, domains).detach()
    torch.testing.assert_close(Y_moved[domains == 0], Y[domains == 0])
    torch.testing.assert_close(torch.linalg.eigvalsh(Y_moved), torch.linalg.eigvalsh(Y), rtol=1e-8, atol=1e-10)
