"""Tests for ``skfedspd.nn``: the BiMap layer (Stiefel weight by tangent-space local
trivialization) and the ``SPDNet`` module (training, re-centring, parameter export/import).

Data comes from the ``spd_dataset`` / ``spd_batch`` fixtures of ``conftest.py``. All sizes
are tiny (at most 8 channels) so the file runs in a few seconds.
"""

import copy
import pickle

import numpy as np
import pytest
import torch
from torch.func import functional_call

import skfedspd.layers as layers_module
from skfedspd.functional import reeig
from skfedspd.batchnorm import DomainSPDBatchNorm, SPDBatchNorm
from skfedspd.layers import BiMap, congruence
from skfedspd.nn import SPDNet
from skfedspd.stiefel import orthonormality_error, random_stiefel, tangent_project
from skfedspd.training import train_epochs

pytestmark = pytest.mark.usefixtures("torch_single_thread")

DIMS = [(6, 3), (5, 5), (8, 1), (4, 2), (8, 6)]


def _bimap_loss(Y, C):
    """A smooth non-linear scalar function of the BiMap output."""
    return (Y * C).sum() + 0.1 * (Y**2).sum()


def _sym_weights(k, seed):
    C = torch.as_tensor(np.random.default_rng(seed).standard_normal((k, k)), dtype=torch.float64)
    return C + C.T


def _perturb_V(bimap, scale, seed):
    with torch.no_grad():
        V = np.random.default_rng(seed).standard_normal(tuple(bimap.V.shape))
        bimap.V.copy_(torch.as_tensor(scale * V))


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
# BiMap
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("in_dim, out_dim", DIMS)
@pytest.mark.parametrize("seed", [0, 1])
def test_bimap_weight_is_orthonormal(in_dim, out_dim, seed):
    bimap = BiMap(in_dim, out_dim, seed=seed)
    W = bimap.weight.detach()
    assert W.shape == (in_dim, out_dim)
    assert W.dtype == torch.float64
    assert orthonormality_error(W) < 1e-13
    assert torch.count_nonzero(bimap.V) == 0


@pytest.mark.parametrize("in_dim, out_dim", DIMS)
def test_bimap_weight_orthonormal_away_from_chart_centre(in_dim, out_dim):
    bimap = BiMap(in_dim, out_dim, seed=0)
    _perturb_V(bimap, 0.5, seed=1)
    assert orthonormality_error(bimap.weight.detach()) < 1e-13


def test_bimap_float32():
    bimap = BiMap(6, 3, seed=0, dtype=torch.float32)
    assert bimap.weight.dtype == bimap.V.dtype == torch.float32
    assert orthonormality_error(bimap.weight.detach()) < 1e-5


def test_bimap_seed_reproducible():
    assert torch.equal(BiMap(6, 3, seed=4).weight, BiMap(6, 3, seed=4).weight)
    assert not torch.allclose(BiMap(6, 3, seed=4).weight, BiMap(6, 3, seed=5).weight)


def test_bimap_rejects_increasing_dimension():
    with pytest.raises(ValueError, match="out_dim=5 > in_dim=3"):
        BiMap(3, 5)


@pytest.mark.parametrize("in_dim, out_dim", DIMS)
@pytest.mark.parametrize("v_scale", [0.0, 0.3])
def test_bimap_forward_is_congruence(spd_batch, in_dim, out_dim, v_scale):
    bimap = BiMap(in_dim, out_dim, seed=2)
    _perturb_V(bimap, v_scale, seed=3)
    X = spd_batch(4, in_dim, seed=5)
    Y = bimap(X).detach()
    W = bimap.weight.detach().numpy()
    expected = np.einsum("ji,njk,kl->nil", W, X.numpy(), W)
    assert Y.shape == (4, out_dim, out_dim)
    np.testing.assert_allclose(Y.numpy(), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(Y.numpy(), Y.numpy().transpose(0, 2, 1), atol=1e-12)
    assert (torch.linalg.eigvalsh(Y) > 0).all()  # congruence by a full-rank W keeps SPD


@pytest.mark.parametrize("in_dim, out_dim", DIMS)
@pytest.mark.parametrize("seed", [0, 1])
def test_bimap_gradient_at_chart_centre_is_riemannian_gradient(spd_batch, in_dim, out_dim, seed):
    """At V = 0, ∇_V L = P_W(∇_W L): the polar retraction's differential at 0 is P_W."""
    bimap = BiMap(in_dim, out_dim, seed=seed)
    X = spd_batch(3, in_dim, seed=seed + 10)
    C = _sym_weights(out_dim, seed)

    _bimap_loss(bimap(X), C).backward()
    grad_V = bimap.V.grad
    assert torch.isfinite(grad_V).all()  # autograd through the SVD would be NaN here

    W = bimap.W_ref.clone().requires_grad_(True)
    (grad_W,) = torch.autograd.grad(_bimap_loss(W.T @ X @ W, C), W)
    riemannian = tangent_project(W.detach(), grad_W)
    np.testing.assert_allclose(grad_V.numpy(), riemannian.numpy(), rtol=1e-10, atol=1e-12)
    # ... which is a tangent vector at W.
    np.testing.assert_allclose(tangent_project(W.detach(), grad_V).numpy(), grad_V.numpy(), atol=1e-12)


@pytest.mark.parametrize("in_dim, out_dim", DIMS)
@pytest.mark.parametrize("v_scale", [0.0, 0.2])
def test_bimap_gradcheck(spd_batch, in_dim, out_dim, v_scale):
    """Finite differences (float64) agree with the custom polar backward, at V = 0 and away."""
    bimap = BiMap(in_dim, out_dim, seed=7)
    X = spd_batch(2, in_dim, seed=8)
    V0 = torch.as_tensor(v_scale * np.random.default_rng(9).standard_normal((in_dim, out_dim)))
    V0.requires_grad_(True)

    def f(V):
        return functional_call(bimap, {"V": V}, (X,))

    assert torch.autograd.gradcheck(f, (V0,), eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("in_dim, out_dim", [(6, 3), (5, 5), (4, 1)])
@pytest.mark.parametrize("batch_shape", [(), (1,), (3,), (2, 2)])
def test_bimap_gradcheck_input_and_weight(in_dim, out_dim, batch_shape):
    """Gradients wrt the input too (any, not necessarily symmetric X), for any batch shape."""
    bimap = BiMap(in_dim, out_dim, seed=7)
    rng = np.random.default_rng(10)
    X = torch.tensor(rng.standard_normal(batch_shape + (in_dim, in_dim)), requires_grad=True)
    V0 = torch.tensor(0.1 * rng.standard_normal((in_dim, out_dim)), requires_grad=True)

    def f(V, X):
        return functional_call(bimap, {"V": V}, (X,))

    assert torch.autograd.gradcheck(f, (V0, X), eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("batch_shape", [(), (1,), (4,), (2, 3)])
def test_bimap_forward_batch_shapes(spd_batch, batch_shape):
    bimap = BiMap(6, 4, seed=0)
    n = int(np.prod(batch_shape)) if batch_shape else 1
    X = spd_batch(n, 6).reshape(batch_shape + (6, 6))
    W = bimap.weight.detach()
    Y = bimap(X).detach()
    assert Y.shape == batch_shape + (4, 4)
    np.testing.assert_allclose(Y.numpy(), (W.T @ X @ W).numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("in_dim, out_dim", DIMS)
def test_bimap_gradient_matches_finite_differences_of_loss(spd_batch, in_dim, out_dim):
    """Directional derivative of the loss along a random V direction, at V = 0."""
    bimap = BiMap(in_dim, out_dim, seed=11)
    X = spd_batch(3, in_dim, seed=12)
    C = _sym_weights(out_dim, 13)
    _bimap_loss(bimap(X), C).backward()
    D = torch.as_tensor(np.random.default_rng(14).standard_normal((in_dim, out_dim)))
    h = 1e-6

    def loss_at(V):
        with torch.no_grad():
            return float(_bimap_loss(functional_call(bimap, {"V": V}, (X,)), C))

    fd = (loss_at(h * D) - loss_at(-h * D)) / (2 * h)
    assert fd == pytest.approx(float((bimap.V.grad * D).sum()), rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("in_dim, out_dim", DIMS)
@pytest.mark.parametrize("v_scale", [0.0, 0.05, 0.5])
def test_bimap_recenter_keeps_weight_and_resets_V(spd_batch, in_dim, out_dim, v_scale):
    bimap = BiMap(in_dim, out_dim, seed=3)
    _perturb_V(bimap, v_scale, seed=4)
    X = spd_batch(3, in_dim, seed=5)
    W_before, Y_before = bimap.weight.detach().clone(), bimap(X).detach()
    bimap.recenter_()
    assert torch.count_nonzero(bimap.V) == 0
    np.testing.assert_allclose(bimap.W_ref.numpy(), W_before.numpy(), atol=1e-14)
    np.testing.assert_allclose(bimap.weight.detach().numpy(), W_before.numpy(), atol=1e-14)
    np.testing.assert_allclose(bimap(X).detach().numpy(), Y_before.numpy(), atol=1e-12)
    assert orthonormality_error(bimap.W_ref) < 1e-13


@pytest.mark.parametrize("in_dim, out_dim", DIMS)
@pytest.mark.parametrize("as_tensor", [False, True])
def test_bimap_set_weight(in_dim, out_dim, as_tensor):
    bimap = BiMap(in_dim, out_dim, seed=0)
    _perturb_V(bimap, 0.3, seed=1)
    W = random_stiefel(in_dim, out_dim, 42)
    bimap.set_weight(torch.as_tensor(W) if as_tensor else W)
    assert torch.count_nonzero(bimap.V) == 0
    assert bimap.W_ref.dtype == torch.float64
    np.testing.assert_allclose(bimap.W_ref.numpy(), W, atol=0)
    np.testing.assert_allclose(bimap.weight.detach().numpy(), W, atol=1e-14)


def test_bimap_set_weight_casts_to_layer_dtype():
    bimap = BiMap(5, 2, seed=0, dtype=torch.float32)
    bimap.set_weight(random_stiefel(5, 2, 1))
    assert bimap.W_ref.dtype == torch.float32


# ---------------------------------------------------------------------------------------------
# congruence for symmetric inputs, chart-centre node, Stiefel mark
# ---------------------------------------------------------------------------------------------


def _gauss_np(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def _sym_batch(batch_shape, n, seed):
    A = np.random.default_rng(seed).standard_normal(batch_shape + (n, n))
    return torch.as_tensor(A + np.swapaxes(A, -1, -2))


@pytest.mark.parametrize("n, k", [(6, 3), (5, 5), (4, 1)])
@pytest.mark.parametrize("batch_shape", [(), (1,), (3,), (2, 2)])
def test_symmetric_congruence_gradcheck(n, k, batch_shape):
    """Weight and input gradients of the symmetric variant at a symmetric ``X``."""
    W = torch.as_tensor(_gauss_np((n, k), 20)).requires_grad_(True)
    X = _sym_batch(batch_shape, n, 21).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda W, X: congruence(W, X, symmetric=True), (W, X))


@pytest.mark.parametrize("batch_shape", [(), (4,), (2, 3)])
def test_symmetric_congruence_equals_general_on_symmetric_input(batch_shape):
    W = torch.as_tensor(_gauss_np((6, 4), 22))
    X = _sym_batch(batch_shape, 6, 23)
    G = torch.as_tensor(_gauss_np(batch_shape + (4, 4), 24))
    out = {}
    for symmetric in (False, True):
        Wg, Xg = W.clone().requires_grad_(True), X.clone().requires_grad_(True)
        Y = congruence(Wg, Xg, symmetric=symmetric)
        out[symmetric] = (Y,) + torch.autograd.grad((Y * G).sum(), (Wg, Xg))
    for a, b in zip(out[False], out[True]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out[True][0], W.T @ X @ W, rtol=1e-12, atol=1e-12)


def test_symmetric_congruence_weight_gradient_on_nonsymmetric_input():
    """Documented deviation for a non-symmetric ``X``: ``Σ_b (X_b − X_bᵀ) W G_b``."""
    W = torch.as_tensor(_gauss_np((5, 3), 25))
    X = torch.as_tensor(_gauss_np((4, 5, 5), 26))
    G = torch.as_tensor(_gauss_np((4, 3, 3), 27))
    grads = {}
    for symmetric in (False, True):
        Wg = W.clone().requires_grad_(True)
        Y = congruence(Wg, X, symmetric=symmetric)
        torch.testing.assert_close(Y, W.T @ X @ W, rtol=1e-12, atol=1e-12)  # value: any X
        (grads[symmetric],) = torch.autograd.grad((Y * G).sum(), Wg)
    expected = ((X - X.mT) @ W @ G).sum(0)
    torch.testing.assert_close(grads[True] - grads[False], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("in_dim, out_dim", [(6, 3), (5, 5), (4, 1)])
@pytest.mark.parametrize("v_scale", [0.0, 0.1])
def test_bimap_gradcheck_input_and_weight_both_variants(symmetric, in_dim, out_dim, v_scale):
    """At ``V = 0`` one centred node (value ``W_ref``, ``V``-gradient ``P_W(∇W)``), else the
    polar path: finite differences cross from one to the other."""
    bimap = BiMap(in_dim, out_dim, seed=7, symmetric=symmetric)
    X = _sym_batch((3,), in_dim, 28).requires_grad_(True)
    V0 = torch.tensor(v_scale * _gauss_np((in_dim, out_dim), 29), requires_grad=True)

    def f(V, X):
        return functional_call(bimap, {"V": V}, (X,))

    assert torch.autograd.gradcheck(f, (V0, X), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_bimap_forward_uses_one_node_at_chart_centre(spd_batch):
    bimap = BiMap(6, 3, seed=0, symmetric=True)
    Y = bimap(spd_batch(2, 6))
    assert type(Y.grad_fn).__name__ == "_SymCongruenceBackward"
    assert Y.grad_fn.next_functions[0][0] is None  # W_ref: no gradient
    _perturb_V(bimap, 0.1, seed=1)  # off-centre: the weight comes from the polar node
    assert type(bimap.weight.grad_fn).__name__ == "_PolarBackward"


def _count_stiefel_checks(monkeypatch):
    calls = []
    original = layers_module._on_stiefel

    def counting(W):
        calls.append(1)
        return original(W)

    monkeypatch.setattr(layers_module, "_on_stiefel", counting)
    return calls


def test_bimap_recenter_marks_w_ref_and_skips_the_check(spd_batch, monkeypatch):
    bimap = BiMap(6, 3, seed=0)
    X = spd_batch(2, 6)
    calls = _count_stiefel_checks(monkeypatch)
    bimap(X)
    bimap(X)
    assert len(calls) == 1  # checked once, then cached
    _perturb_V(bimap, 1e-3, seed=1)
    bimap.recenter_()
    bimap(X)
    assert len(calls) == 1  # recenter_ wrote a polar factor: no new check
    assert orthonormality_error(bimap.W_ref) < 1e-14


@pytest.mark.parametrize("how", ["copy_", "mul_", "load_state_dict", "set_weight", "assign"])
def test_bimap_stiefel_mark_invalidated_when_w_ref_changes(spd_batch, how):
    """A non-orthonormal ``W_ref`` written after the check must not be used as the weight."""
    bimap = BiMap(6, 3, seed=0)
    X = spd_batch(2, 6)
    bimap(X)  # marks W_ref
    W = bimap.W_ref.clone()
    with torch.no_grad():
        if how == "copy_":
            bimap.W_ref.copy_(2.0 * W)
        elif how == "mul_":
            bimap.W_ref.mul_(2.0)
        elif how == "load_state_dict":
            bimap.load_state_dict({"W_ref": 2.0 * W, "V": torch.zeros_like(W)})
        elif how == "set_weight":
            bimap.set_weight(2.0 * W)
        else:
            bimap.W_ref = 2.0 * W
    # uf(2W) = W: the weight stays W and the output WᵀXW (a stale mark would give 4·WᵀXW)
    torch.testing.assert_close(bimap.weight.detach(), W, rtol=0, atol=1e-14)
    torch.testing.assert_close(bimap(X).detach(), W.T @ X @ W, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "to_float32"])
def test_bimap_stiefel_mark_not_carried_over(spd_batch, how):
    bimap = BiMap(6, 3, seed=0)
    X = spd_batch(2, 6)
    bimap(X)
    assert bimap._stiefel_mark is not None
    if how == "deepcopy":
        other = copy.deepcopy(bimap)
    elif how == "pickle":
        other = pickle.loads(pickle.dumps(bimap))
    else:
        other, X = bimap.to(torch.float32), X.to(torch.float32)
    if how != "to_float32":
        assert other._stiefel_mark is None
    else:
        assert other._stiefel_mark[0] is not other.W_ref  # stale: a new buffer tensor
    W = other.W_ref
    torch.testing.assert_close(other(X).detach(), W.T @ X @ W)
    assert other._stiefel_mark[0] is other.W_ref


def test_bimap_state_from_before_symmetric_flag(spd_batch):
    """A pickled state without ``symmetric`` / the mark loads as the general variant."""
    bimap = BiMap(6, 3, seed=0, symmetric=True)
    state = bimap.__getstate__()
    del state["symmetric"], state["_stiefel_mark"]
    old = BiMap.__new__(BiMap)
    old.__setstate__(state)
    assert old.symmetric is False and old._stiefel_mark is None
    X = spd_batch(2, 6)
    torch.testing.assert_close(old(X), bimap(X))


def test_bimap_in_inference_mode(spd_batch):
    with torch.inference_mode():
        bimap = BiMap(6, 3, seed=0, symmetric=True)
        X = spd_batch(2, 6)
        Y = bimap(X)
        W = bimap.W_ref
        torch.testing.assert_close(Y, W.T @ X @ W)
        assert bimap._stiefel_mark is None  # inference tensors have no version counter


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
        _perturb_V(bimap, v_scale, seed=30 + i)
    X = spd_batch(5, 8, seed=31)
    d = hidden_dims[-1]
    C = torch.as_tensor(_gauss_np((5, d * (d + 1) // 2), 32))
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
    V0 = torch.tensor(v_scale * _gauss_np((in_dim, hidden_dims[-1]), 34), requires_grad=True)

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


def test_spdnet_get_parameters_returns_copies():
    net = _make_net(8, (4,), 3, seed=0)
    params = net.get_parameters()
    before = {k: v.copy() for k, v in params.items()}
    for value in params.values():
        value += 1.0
    for name, value in net.get_parameters().items():
        np.testing.assert_array_equal(value, before[name])


def test_spdnet_set_parameters_subset():
    net = _make_net(8, (6, 4), 3, seed=0)
    before = net.get_parameters()
    net.set_parameters({"head.bias": np.array([1.0, 2.0, 3.0])})
    after = net.get_parameters()
    np.testing.assert_array_equal(after["head.bias"], [1.0, 2.0, 3.0])
    for name in ("bimaps.0.weight", "bimaps.1.weight", "head.weight"):
        np.testing.assert_array_equal(after[name], before[name])


@pytest.mark.parametrize("bad_name", ["bimaps.2.weight", "head.weigth", "bimaps.0.W_ref", "bimaps.0.V"])
def test_spdnet_set_parameters_rejects_unknown_names(bad_name):
    net = _make_net(8, (6, 4), 3, seed=0)
    before = net.get_parameters()
    arrays = {"head.bias": np.zeros(3), bad_name: np.zeros((8, 6))}
    with pytest.raises(KeyError, match="unknown parameter names"):
        net.set_parameters(arrays)
    for name, value in net.get_parameters().items():  # nothing was loaded
        np.testing.assert_array_equal(value, before[name])


@pytest.mark.parametrize("name, shape", [
    ("bimaps.0.weight", (6, 8)),
    ("bimaps.1.weight", (6, 3)),
    ("head.weight", (3, 9)),
    ("head.bias", (4,)),
    ("head.bias", ()),
])
def test_spdnet_set_parameters_rejects_wrong_shapes(name, shape):
    net = _make_net(8, (6, 4), 3, seed=0)
    with pytest.raises(ValueError, match=rf"parameter '{name}' has shape .*expected"):
        net.set_parameters({name: np.zeros(shape)})


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


# ---------------------------------------------------------------------------------------------
# SPD batch normalization (Brooks et al. 2019; domain-specific: Kobler et al. 2022)
# ---------------------------------------------------------------------------------------------

from pyriemann.geometry.geodesic import geodesic_riemann  # noqa: E402
from pyriemann.geometry.mean import mean_riemann  # noqa: E402


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
        bn.log_bias.copy_(torch.as_tensor(scale * _gauss_np(tuple(bn.log_bias.shape), seed)))


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
    L0 = torch.tensor(0.2 * _gauss_np((4, 4), 49), requires_grad=True)

    def f(L, X):
        return functional_call(bn, {"log_bias": L}, (0.5 * (X + X.mT),))

    assert torch.autograd.gradcheck(f, (L0, X0), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_batchnorm_eval_gradcheck(spd_batch):
    bn = SPDBatchNorm(4)
    bn(spd_batch(6, 4, seed=50))
    bn.eval()
    X0 = spd_batch(3, 4, seed=51).requires_grad_(True)
    L0 = torch.tensor(0.2 * _gauss_np((4, 4), 52), requires_grad=True)

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
    C = _sym_weights(4, 55).numpy()
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
    A = torch.as_tensor(_gauss_np((4, 4), 60))
    moved = X.clone()
    moved[domains == 1] = A @ X[domains == 1] @ A.T
    Y, Y_moved = bn(X, domains).detach(), bn(moved, domains).detach()
    torch.testing.assert_close(Y_moved[domains == 0], Y[domains == 0])
    torch.testing.assert_close(torch.linalg.eigvalsh(Y_moved), torch.linalg.eigvalsh(Y), rtol=1e-8, atol=1e-10)


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
    L0 = torch.tensor(0.2 * _gauss_np((hidden_dims[0],) * 2, 62), requires_grad=True)
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
