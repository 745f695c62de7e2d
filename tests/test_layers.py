"""Tests for ``skfedspd.layers``: the BiMap layer (Stiefel weight by tangent-space local
trivialization, exact gradients at and away from the chart centre, its Stiefel mark) and the
symmetric congruence node, against finite differences and gradcheck in float64.

Data comes from the ``spd_batch`` fixture of ``conftest.py``; at most 8 channels.
"""

import copy
import pickle

import numpy as np
import pytest
import torch
from conftest import gauss_np, perturb_V, sym_weights
from torch.func import functional_call

import skfedspd.layers as layers_module
from skfedspd.layers import BiMap, congruence
from skfedspd.stiefel import orthonormality_error, random_stiefel, tangent_project

pytestmark = pytest.mark.usefixtures("torch_single_thread")

DIMS = [(6, 3), (5, 5), (8, 1), (4, 2), (8, 6)]


def _bimap_loss(Y, C):
    """A smooth non-linear scalar function of the BiMap output."""
    return (Y * C).sum() + 0.1 * (Y**2).sum()



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
    perturb_V(bimap, 0.5, seed=1)
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
    perturb_V(bimap, v_scale, seed=3)
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
    C = sym_weights(out_dim, seed)

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
    C = sym_weights(out_dim, 13)
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
    perturb_V(bimap, v_scale, seed=4)
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
    perturb_V(bimap, 0.3, seed=1)
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


def _sym_batch(batch_shape, n, seed):
    A = np.random.default_rng(seed).standard_normal(batch_shape + (n, n))
    return torch.as_tensor(A + np.swapaxes(A, -1, -2))


@pytest.mark.parametrize("n, k", [(6, 3), (5, 5), (4, 1)])
@pytest.mark.parametrize("batch_shape", [(), (1,), (3,), (2, 2)])
def test_symmetric_congruence_gradcheck(n, k, batch_shape):
    """Weight and input gradients of the symmetric variant at a symmetric ``X``."""
    W = torch.as_tensor(gauss_np((n, k), 20)).requires_grad_(True)
    X = _sym_batch(batch_shape, n, 21).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda W, X: congruence(W, X, symmetric=True), (W, X))


@pytest.mark.parametrize("batch_shape", [(), (4,), (2, 3)])
def test_symmetric_congruence_equals_general_on_symmetric_input(batch_shape):
    W = torch.as_tensor(gauss_np((6, 4), 22))
    X = _sym_batch(batch_shape, 6, 23)
    G = torch.as_tensor(gauss_np(batch_shape + (4, 4), 24))
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
    W = torch.as_tensor(gauss_np((5, 3), 25))
    X = torch.as_tensor(gauss_np((4, 5, 5), 26))
    G = torch.as_tensor(gauss_np((4, 3, 3), 27))
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
    V0 = torch.tensor(v_scale * gauss_np((in_dim, out_dim), 29), requires_grad=True)

    def f(V, X):
        return functional_call(bimap, {"V": V}, (X,))

    assert torch.autograd.gradcheck(f, (V0, X), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_bimap_forward_uses_one_node_at_chart_centre(spd_batch):
    bimap = BiMap(6, 3, seed=0, symmetric=True)
    Y = bimap(spd_batch(2, 6))
    assert type(Y.grad_fn).__name__ == "_SymCongruenceBackward"
    assert Y.grad_fn.next_functions[0][0] is None  # W_ref: no gradient
    perturb_V(bimap, 0.1, seed=1)  # off-centre: the weight comes from the polar node
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
    perturb_V(bimap, 1e-3, seed=1)
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
