"""Tests for ``skfedspd.nn``: the ``SPDNet`` module (training on the Stiefel manifold with
any torch optimizer, the fused last block, structure, re-centring, parameter export/import,
the eigenvalue clamp diagnostic, batch norms inside the network).

Data comes from the ``spd_dataset`` / ``spd_batch`` fixtures of ``conftest.py``. All sizes
are tiny (at most 8 channels) so the file runs in a few seconds.
"""

import copy
import pickle

import numpy as np
import pytest
import torch
from conftest import gauss_np, perturb_V
from torch.func import functional_call

from skfedspd.functional import reeig
from skfedspd.batchnorm import DomainSPDBatchNorm, SPDBatchNorm
from skfedspd.nn import SPDNet
from skfedspd.stiefel import orthonormality_error
from skfedspd.training import train_epochs

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _torch_data(spd_dataset, n_matrices=30, n_channels=6, n_classes=3, seed=0):
    X, y = spd_dataset(n_matrices=n_matrices, n_channels=n_channels, n_classes=n_classes, seed=seed)
    return torch.as_tensor(X), torch.as_tensor(y)


def _make_net(*args, torch_seed=0, **kwargs):
    """SPDNet with the linear head's (torch-global) initialisation seeded too."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch_seed)
        return SPDNet(*args, **kwargs)


def _full_batch_training(net, optimizer, X, y, n_steps):
    losses = []
    for _ in range(n_steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(X), y)
        loss.backward()
        optimizer.step()
        net.after_step_()
        losses.append(float(loss.detach()))
    return np.array(losses)



# ---------------------------------------------------------------------------------------------
# SPDNet: orthonormality under long training with any torch optimizer
# ---------------------------------------------------------------------------------------------

OPTIMIZERS = {
    "adam": (lambda p: torch.optim.Adam(p, lr=1e-2), 1000),
    "sgd_momentum_wd": (lambda p: torch.optim.SGD(p, lr=5e-2, momentum=0.9, weight_decay=1e-3, nesterov=True), 300),
    "adamw": (lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=1e-2), 300),
    "rmsprop": (lambda p: torch.optim.RMSprop(p, lr=1e-3), 300),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("recenter_every", [1, 7])
def test_spdnet_training_stays_on_stiefel_and_learns(spd_dataset, name, recenter_every):
    make_optimizer, n_steps = OPTIMIZERS[name]
    X, y = _torch_data(spd_dataset, n_channels=6)
    net = _make_net(6, (4,), 3, eps=1e-4, recenter_every=recenter_every, seed=0)
    losses = _full_batch_training(net, make_optimizer(net.parameters()), X, y, n_steps)
    assert np.isfinite(losses).all()
    for bimap in net.bimaps:
        assert orthonormality_error(bimap.weight.detach()) <= 1e-10
        assert orthonormality_error(bimap.W_ref) <= 1e-10
    assert losses[-50:].mean() < losses[:50].mean()


def test_spdnet_multiblock_training_stays_on_stiefel(spd_dataset):
    X, y = _torch_data(spd_dataset, n_channels=8)
    net = _make_net(8, (6, 4), 3, eps=1e-4, seed=0)
    losses = _full_batch_training(net, torch.optim.Adam(net.parameters(), lr=1e-2), X, y, 300)
    assert max(orthonormality_error(b.weight.detach()) for b in net.bimaps) <= 1e-10
    assert losses[-50:].mean() < losses[:50].mean()


# ---------------------------------------------------------------------------------------------
# SPDNet: the fused last block (centred BiMap + ReEig/LogEig + vech in one node)
# ---------------------------------------------------------------------------------------------


def _features_and_grads(net, X, C):
    """Features, and the gradients of a non-linear loss wrt every V, the head and X."""
    X = X.clone().requires_grad_(True)
    net.zero_grad(set_to_none=True)
    F = net.features(X)
    loss = (F * C).sum() + 0.1 * (F**2).sum()
    loss.backward()
    return [F.detach()] + [b.V.grad.clone() for b in net.bimaps] + [X.grad.clone()]


@pytest.mark.parametrize("hidden_dims", [(4,), (6, 4), (5, 3, 2)])
@pytest.mark.parametrize("v_scale", [0.0, 0.05])
def test_spdnet_fused_last_block_equals_unfused(spd_batch, hidden_dims, v_scale):
    net = _make_net(8, hidden_dims, 3, eps=1e-2, seed=0)
    for i, bimap in enumerate(net.bimaps):
        perturb_V(bimap, v_scale, seed=30 + i)
    X = spd_batch(5, 8, seed=31)
    d = hidden_dims[-1]
    C = torch.as_tensor(gauss_np((5, d * (d + 1) // 2), 32))
    fused = _features_and_grads(net, X, C)
    reference = copy.deepcopy(net)
    for bimap in reference.bimaps:
        bimap.symmetric = False  # general congruence, separate spectral node
    unfused = _features_and_grads(reference, X, C)
    for a, b in zip(fused, unfused):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_spdnet_features_use_one_node_at_chart_centre(spd_batch):
    net = _make_net(8, (6, 4), 3, seed=0)
    F = net.features(spd_batch(2, 8))
    assert type(F.grad_fn).__name__ == "_CentredBiMapSpectralVechBackward"


@pytest.mark.parametrize("hidden_dims", [(4,), (6, 3)])
@pytest.mark.parametrize("v_scale", [0.0, 0.1])
def test_spdnet_features_gradcheck_last_v_and_input(spd_batch, hidden_dims, v_scale):
    """Finite differences through the fused node (at V = 0) and the polar path (V ≠ 0); the
    input is symmetrised inside so that gradcheck may perturb entries independently."""
    net = _make_net(8, hidden_dims, 3, eps=1e-2, seed=0)
    X0 = spd_batch(3, 8, seed=33).requires_grad_(True)
    name = f"bimaps.{len(hidden_dims) - 1}.V"
    in_dim = hidden_dims[-2] if len(hidden_dims) > 1 else 8
    V0 = torch.tensor(v_scale * gauss_np((in_dim, hidden_dims[-1]), 34), requires_grad=True)

    def f(V, X):
        return functional_call(net, {name: V}, (0.5 * (X + X.mT),), strict=False)

    assert torch.autograd.gradcheck(f, (V0, X0), eps=1e-6, atol=1e-7, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# SPDNet: structure
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_channels, hidden_dims", [(8, (4,)), (8, (6, 4)), (8, (8,)), (6, (5, 3, 2))])
@pytest.mark.parametrize("n_classes", [2, 4])
@pytest.mark.parametrize("batch", [1, 5])
def test_spdnet_output_shape(spd_batch, n_channels, hidden_dims, n_classes, batch):
    net = _make_net(n_channels, hidden_dims, n_classes, seed=0)
    X = spd_batch(batch, n_channels)
    d = hidden_dims[-1]
    assert len(net.bimaps) == len(hidden_dims)
    assert net.features(X).shape == (batch, d * (d + 1) // 2)
    out = net(X)
    assert out.shape == (batch, n_classes)
    assert out.dtype == torch.float64
    assert torch.isfinite(out).all()


def test_spdnet_float32(spd_batch):
    net = _make_net(8, (6, 4), 3, seed=0, dtype=torch.float32)
    out = net(spd_batch(5, 8, dtype=torch.float32))
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_spdnet_bimaps_chain_dimensions():
    net = _make_net(8, (6, 4), 3, seed=0)
    assert [tuple(b.weight.shape) for b in net.bimaps] == [(8, 6), (6, 4)]
    assert tuple(net.head.weight.shape) == (3, 10)


def test_spdnet_seed_reproducible_and_head_uses_caller_rng():
    a, b = _make_net(8, (6, 4), 3, seed=1, torch_seed=0), _make_net(8, (6, 4), 3, seed=1, torch_seed=0)
    for name, value in a.get_parameters().items():
        np.testing.assert_array_equal(value, b.get_parameters()[name])
    c = _make_net(8, (6, 4), 3, seed=2, torch_seed=0)
    assert not np.allclose(a.get_parameters()["bimaps.0.weight"], c.get_parameters()["bimaps.0.weight"])
    np.testing.assert_array_equal(a.get_parameters()["head.weight"], c.get_parameters()["head.weight"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(recenter_every=0), "recenter_every"),
    (dict(hidden_dims=()), "hidden_dims"),
    (dict(hidden_dims=(4, 6)), "out_dim=6 > in_dim=4"),
    (dict(hidden_dims=(10,)), "out_dim=10 > in_dim=8"),
    (dict(batchnorm="riemann"), "batchnorm must be None, 'spd' or 'domain'"),
    (dict(batchnorm="spd", bn_momentum=0.0), "momentum"),
    (dict(batchnorm="domain", karcher_steps=-1), "karcher_steps"),
])
def test_spdnet_rejects_bad_arguments(kwargs, match):
    args = dict(n_channels=8, hidden_dims=(4,), n_classes=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        SPDNet(**args)


# ---------------------------------------------------------------------------------------------
# SPDNet: re-centring schedule
# ---------------------------------------------------------------------------------------------


def _count_recenterings(net, monkeypatch):
    calls = []
    original = net.recenter_

    def counting():
        calls.append(net._steps_since_recenter)
        original()

    monkeypatch.setattr(net, "recenter_", counting)
    return calls


@pytest.mark.parametrize("recenter_every", [1, 2, 3, 5, 12, 20])
def test_spdnet_recenter_every_is_respected(spd_dataset, monkeypatch, recenter_every):
    X, y = _torch_data(spd_dataset, n_channels=6)
    net = _make_net(6, (4, 3), 3, recenter_every=recenter_every, seed=0)
    calls = _count_recenterings(net, monkeypatch)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    n_steps = 12
    for step in range(1, n_steps + 1):
        _full_batch_training(net, optimizer, X, y, 1)
        assert len(calls) == step // recenter_every
        at_centre = step % recenter_every == 0
        for bimap in net.bimaps:
            assert (torch.count_nonzero(bimap.V) == 0) == at_centre
    assert all(c == recenter_every for c in calls)  # each after exactly recenter_every steps


@pytest.mark.parametrize("recenter_every", [1, 2, 4])
@pytest.mark.parametrize("batch_size", [7, 10, 30])
def test_train_epochs_recenters_per_optimizer_step(spd_dataset, monkeypatch, recenter_every, batch_size):
    X, y = _torch_data(spd_dataset, n_channels=6)
    net = _make_net(6, (4,), 3, recenter_every=recenter_every, seed=0)
    calls = _count_recenterings(net, monkeypatch)
    n_epochs = 2
    loss, skipped = train_epochs(net, torch.optim.Adam(net.parameters(), lr=1e-2), X, y,
                                 n_epochs=n_epochs, batch_size=batch_size,
                                 generator=torch.Generator().manual_seed(0))
    n_steps = n_epochs * -(-len(y) // batch_size)
    assert skipped == 0 and np.isfinite(loss)
    assert len(calls) == n_steps // recenter_every
    assert net._steps_since_recenter == n_steps % recenter_every


# ---------------------------------------------------------------------------------------------
# SPDNet: parameter export / import
# ---------------------------------------------------------------------------------------------

HIDDEN = [(4,), (6, 4), (7, 5, 2)]


def _kinds_expected(n_blocks):
    return [(f"bimaps.{i}.weight", "stiefel") for i in range(n_blocks)] + [
        ("head.weight", "euclidean"), ("head.bias", "euclidean")]


@pytest.mark.parametrize("hidden_dims", HIDDEN)
def test_spdnet_parameter_kinds(hidden_dims):
    net = _make_net(8, hidden_dims, 3, seed=0)
    kinds = net.parameter_kinds()
    assert list(kinds.items()) == _kinds_expected(len(hidden_dims))
    params = net.get_parameters()
    assert list(params) == list(kinds)
    dims = (8,) + hidden_dims
    for i in range(len(hidden_dims)):
        assert params[f"bimaps.{i}.weight"].shape == (dims[i], dims[i + 1])
    d = hidden_dims[-1]
    assert params["head.weight"].shape == (3, d * (d + 1) // 2)
    assert params["head.bias"].shape == (3,)
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float64 for v in params.values())


@pytest.mark.parametrize("hidden_dims", HIDDEN)
@pytest.mark.parametrize("recenter_every", [1, 3])
def test_spdnet_get_set_parameters_round_trip(spd_dataset, hidden_dims, recenter_every):
    X, y = _torch_data(spd_dataset, n_channels=8)
    source = _make_net(8, hidden_dims, 3, recenter_every=recenter_every, seed=0, torch_seed=0)
    # Two steps: with recenter_every=3 the charts are off-centre (V ≠ 0), so the export must
    # be the actual weight uf(W_ref + P(V)), not the buffer W_ref.
    _full_batch_training(source, torch.optim.Adam(source.parameters(), lr=5e-2), X, y, 2)
    target = _make_net(8, hidden_dims, 3, seed=1, torch_seed=1)
    with torch.no_grad():
        assert not torch.allclose(source(X), target(X))
    exported = source.get_parameters()
    target.set_parameters(exported)
    with torch.no_grad():
        np.testing.assert_allclose(target(X).numpy(), source(X).numpy(), rtol=1e-12, atol=1e-12)
    for name, value in target.get_parameters().items():
        np.testing.assert_allclose(value, exported[name], atol=1e-14)
    for bimap in target.bimaps:
        assert torch.count_nonzero(bimap.V) == 0


# ---------------------------------------------------------------------------------------------
# SPDNet: eigenvalue clamp diagnostic
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level, expected", [(1.0, 0.0), (1e-3, 0.0), (1e-6, 1.0), (1e-10, 1.0)])
def test_eigenvalue_clamp_fraction_scaled_identity(level, expected):
    net = _make_net(8, (4,), 3, eps=1e-4, seed=0)
    X = level * torch.eye(8, dtype=torch.float64).expand(5, 8, 8)
    assert net.eigenvalue_clamp_fraction(X) == [expected]


@pytest.mark.parametrize("n_small", [0, 2, 4, 8])
def test_eigenvalue_clamp_fraction_counts_small_eigenvalues(n_small):
    # Square BiMap: WᵀXW has exactly X's eigenvalues.
    net = _make_net(8, (8,), 3, eps=1e-4, seed=0)
    lam = np.r_[np.full(n_small, 1e-8), np.ones(8 - n_small)]
    X = torch.as_tensor(np.diag(lam)).expand(3, 8, 8)
    assert net.eigenvalue_clamp_fraction(X) == pytest.approx([n_small / 8])


@pytest.mark.parametrize("hidden_dims", HIDDEN)
def test_eigenvalue_clamp_fraction_one_per_block(spd_batch, hidden_dims):
    net = _make_net(8, hidden_dims, 3, eps=1e-4, seed=0)
    X = spd_batch(6, 8).requires_grad_(True)
    fractions = net.eigenvalue_clamp_fraction(X)
    assert len(fractions) == len(hidden_dims)
    assert all(f == 0.0 for f in fractions)  # well-conditioned input: nothing clamped
    assert all(torch.count_nonzero(b.V) == 0 for b in net.bimaps)  # no side effect


BN_KINDS = ["spd", "domain"]


def _bn_net(batchnorm, hidden_dims=(6, 4), **kwargs):
    return _make_net(8, hidden_dims, 3, eps=1e-2, seed=0, batchnorm=batchnorm, **kwargs)


def test_spdnet_without_batchnorm_is_unchanged(spd_batch):
    """batchnorm=None: same module (no extra state, same kinds) and the fused fast path."""
    X = spd_batch(4, 8)
    plain, explicit = _make_net(8, (6, 4), 3, seed=0), _bn_net(None)
    assert list(plain.state_dict()) == list(explicit.state_dict())
    assert list(plain.parameter_kinds()) == ["bimaps.0.weight", "bimaps.1.weight", "head.weight", "head.bias"]
    torch.testing.assert_close(plain(X), explicit(X), rtol=0, atol=0)
    assert type(explicit.features(X).grad_fn).__name__ == "_CentredBiMapSpectralVechBackward"
    with pytest.raises(ValueError, match="batchnorm='domain' only"):
        explicit(X, domains=np.zeros(4))


@pytest.mark.parametrize("batchnorm", BN_KINDS)
def test_spdnet_batchnorm_parameter_kinds(batchnorm):
    net = _bn_net(batchnorm)
    kinds = net.parameter_kinds()
    expected = {"bimaps.0.weight": "stiefel", "bimaps.1.weight": "stiefel", "head.weight": "euclidean",
                "head.bias": "euclidean", "batchnorms.0.log_bias": "euclidean", "batchnorms.1.log_bias": "euclidean"}
    if batchnorm == "spd":
        expected.update({"batchnorms.0.running_mean": "local", "batchnorms.1.running_mean": "local"})
    assert dict(kinds) == expected
    params = net.get_parameters()
    assert list(params) == list(kinds)
    assert params["batchnorms.0.log_bias"].shape == (6, 6)
    # every trainable tensor and every buffer except the BiMap charts is exported
    exported = {n for n in kinds if not n.startswith("bimaps.")}
    state = {n for n in net.state_dict() if not n.startswith("bimaps.")}
    assert exported == state


@pytest.mark.parametrize("batchnorm", BN_KINDS)
def test_spdnet_batchnorm_get_set_parameters_round_trip(spd_dataset, batchnorm):
    X, y = _torch_data(spd_dataset, n_channels=8)
    net = _bn_net(batchnorm)
    kwargs = {"domains": np.arange(len(y)) % 3} if batchnorm == "domain" else {}
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(X, **kwargs), y).backward()
        opt.step()
        net.after_step_()
    params = net.get_parameters()
    assert np.abs(params["batchnorms.0.log_bias"]).max() > 0
    if batchnorm == "spd":
        assert not np.allclose(params["batchnorms.0.running_mean"], np.eye(6))
    other = _bn_net(batchnorm)
    other.set_parameters(params)
    net.eval(), other.eval()
    torch.testing.assert_close(other(X, **kwargs), net(X, **kwargs), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("batchnorm", BN_KINDS)
@pytest.mark.parametrize("hidden_dims", [(4,), (6, 3)])
def test_spdnet_batchnorm_gradcheck(spd_batch, batchnorm, hidden_dims):
    """Finite differences through BiMap → BN → ReEig → ... → LogEig → head: wrt the last
    BiMap's V, the first BN bias and the input (two domains for batchnorm='domain')."""
    net = _bn_net(batchnorm, hidden_dims=hidden_dims)
    X0 = spd_batch(4, 8, seed=61).requires_grad_(True)
    V0 = torch.zeros_like(net.bimaps[-1].V, requires_grad=True)
    L0 = torch.tensor(0.2 * gauss_np((hidden_dims[0],) * 2, 62), requires_grad=True)
    names = (f"bimaps.{len(hidden_dims) - 1}.V", "batchnorms.0.log_bias")
    domains = np.array([0, 1, 0, 1]) if batchnorm == "domain" else None

    def f(V, L, X):
        return functional_call(net, dict(zip(names, (V, L))), (0.5 * (X + X.mT), domains), strict=False)

    assert torch.autograd.gradcheck(f, (V0, L0, X0), eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("batchnorm", BN_KINDS)
def test_spdnet_batchnorm_trains(spd_dataset, batchnorm):
    X, y = _torch_data(spd_dataset, n_channels=8)
    net = _bn_net(batchnorm)
    losses = _full_batch_training(net, torch.optim.Adam(net.parameters(), lr=1e-2), X, y, 60)
    assert np.isfinite(losses).all()
    assert losses[-10:].mean() < 0.8 * losses[:10].mean()
    assert max(orthonormality_error(b.weight.detach()) for b in net.bimaps) <= 1e-10


def test_spdnet_batchnorm_float32_and_pickle(spd_batch):
    net = _bn_net("spd", dtype=torch.float32)
    X = spd_batch(6, 8, dtype=torch.float32)
    net(X)
    net.eval()
    out = net(X)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    restored = pickle.loads(pickle.dumps(net))
    torch.testing.assert_close(restored(X), out, rtol=0, atol=0)


@pytest.mark.parametrize("batchnorm", BN_KINDS)
def test_eigenvalue_clamp_fraction_with_batchnorm_has_no_side_effect(spd_batch, batchnorm):
    net = _bn_net(batchnorm)
    before = copy.deepcopy(net.state_dict())
    fractions = net.eigenvalue_clamp_fraction(spd_batch(6, 8))
    assert len(fractions) == 2 and all(0 <= f <= 1 for f in fractions)
    for name, value in net.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)


@pytest.mark.parametrize("layer", [SPDBatchNorm, DomainSPDBatchNorm])
def test_whiten_follows_the_bias_without_autograd(spd_batch, layer):
    """Without autograd B^{1/2} is computed once per value of log_bias: an in-place change
    (an optimizer step, a federated broadcast through set_parameters) is seen at once, and
    the value matches the differentiable path."""
    X = spd_batch(5, 4)
    bn = layer(4)
    M_inv_half = torch.linalg.inv(torch.linalg.cholesky(X.mean(0)))  # any whitening matrix
    with torch.no_grad():
        before = bn.whiten(X, M_inv_half)
        bn.log_bias.add_(0.3 * torch.eye(4, dtype=X.dtype))
        after = bn.whiten(X, M_inv_half)
    torch.testing.assert_close(after, bn.whiten(X, M_inv_half).detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(after, torch.exp(torch.tensor(0.3, dtype=X.dtype)) * before, rtol=1e-12, atol=1e-12)


def test_batchnorm_inputs_are_the_bimap_outputs_of_each_layer(spd_batch):
    X = spd_batch(6, 5)
    net = SPDNet(5, (4, 3), 2, seed=0, batchnorm="domain")
    first, second = net.batchnorm_inputs(X)
    W0, W1 = (b.weight.detach() for b in net.bimaps)
    with torch.no_grad():
        torch.testing.assert_close(first, W0.T @ X @ W0)
        Y = reeig(net.batchnorms[0].normalize_batch(first), net.eps)
        torch.testing.assert_close(second, W1.T @ Y @ W1)
