"""Tests for ``skfedspd.dp_sgd``: the Riemannian DP-SGD mechanism and the released domain means.

Oracles: single-sample losses
differentiated one by one through plain autograd (``Wᵀ X W`` on a leaf ``W``, no BiMap
chart node), orthonormality, and a plain full-batch gradient step.
"""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import skfedspd.dp_sgd as dp_sgd
from skfedspd.eegnet import EEGNet
from skfedspd.functional import reeig, reeig_logeig_vech
from skfedspd.batchnorm import DomainBatch
from skfedspd.nn import SPDNet
from skfedspd.dp_sgd import (
    add_gaussian_noise,
    clip_and_sum,
    dp_train_epochs,
    per_sample_gradients,
    stiefel_charts,
    steps_per_epoch,
)
from skfedspd.privacy import calibrate_noise, epsilon_spent
from skfedspd.stiefel import orthonormality_error, tangent_project
from skfedspd.training import evaluate, train_epochs

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _spd_data(spd_dataset, n=40, n_channels=6, seed=0):
    X, y = spd_dataset(n_matrices=n, n_channels=n_channels, n_classes=2, seed=seed)
    return torch.as_tensor(X), torch.as_tensor(y)


def _spdnet(n_channels=6, hidden=(4,), seed=0, dtype=torch.float64):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return SPDNet(n_channels, hidden, 2, eps=1e-2, seed=seed, dtype=dtype)


def _eegnet(dropout=0.0, seed=0, norm="batch"):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return EEGNet(4, 64, 2, fs=64.0, F1=2, D=2, F2=4, p1=2, p2=4, dropout=dropout, norm=norm).double()


def _eeg_data(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return torch.as_tensor(rng.standard_normal((n, 4, 64))), torch.as_tensor(np.arange(n) % 2)


def _joint_norm(tensors):
    return float(torch.sqrt(sum((t**2).sum() for t in tensors.values())))


# ---------------------------------------------------------------------------------------------
# (e) per-sample gradients against single-sample losses, one by one
# ---------------------------------------------------------------------------------------------


def _oracle_spdnet_grads(module, x, t):
    """Gradients of one sample's loss through plain autograd on leaf Stiefel weights ``W``;
    Riemannian gradient ``P_W(∇_W ℓ)``, Euclidean for the head."""
    Ws = [b.W_ref.detach().clone().requires_grad_() for b in module.bimaps]
    head = {k: v.detach().clone().requires_grad_() for k, v in module.head.named_parameters()}
    for W in Ws[:-1]:
        x = reeig(W.T @ x @ W, module.eps)
    feats = reeig_logeig_vech(Ws[-1].T @ x @ Ws[-1], module.eps)
    loss = F.cross_entropy(F.linear(feats, head["weight"], head["bias"]), t)
    gW = torch.autograd.grad(loss, Ws + [head["weight"], head["bias"]])
    out = {f"bimaps.{i}.V": tangent_project(W.detach(), g) for i, (W, g) in enumerate(zip(Ws, gW))}
    out["head.weight"], out["head.bias"] = gW[-2], gW[-1]
    return out


@pytest.mark.parametrize("method", ["auto", "batched", "loop"])
@pytest.mark.parametrize("hidden", [(4,), (5, 3)])
def test_per_sample_gradients_spdnet_match_single_sample_oracle(spd_dataset, hidden, method):
    X, y = _spd_data(spd_dataset, n=11)  # more than one chunk of the batched backward
    module = _spdnet(hidden=hidden)
    grads, losses = per_sample_gradients(module, X, y, method=method)
    assert set(grads) == {name for name, _ in module.named_parameters()}
    for i in range(len(y)):
        oracle = _oracle_spdnet_grads(module, X[i : i + 1], y[i : i + 1])
        for name, g in oracle.items():
            torch.testing.assert_close(grads[name][i], g, rtol=0, atol=1e-10)
        with torch.no_grad():
            single = float(F.cross_entropy(module(X[i : i + 1]), y[i : i + 1]))
        assert float(losses[i]) == pytest.approx(single, abs=1e-12)
    for name, W in stiefel_charts(module).items():  # tangent: Wᵀg skew-symmetric
        WtG = W.T @ grads[name]
        assert float((WtG + WtG.transpose(-1, -2)).abs().max()) < 1e-12


@pytest.mark.parametrize("norm", ["batch", "group"])
@pytest.mark.parametrize("method", ["auto", "vmap", "batched", "loop"])
def test_per_sample_gradients_eegnet_match_single_sample_backward(method, norm):
    X, y = _eeg_data()
    module = _eegnet(norm=norm)
    if norm == "batch":
        module.eval()  # BatchNorm with running statistics (as dp_train_epochs freezes it)
    # GroupNorm normalises each sample by its own statistics: it stays in training mode
    grads, _ = per_sample_gradients(module, X, y, method=method)
    for i in range(len(y)):
        module.zero_grad()
        F.cross_entropy(module(X[i : i + 1]), y[i : i + 1]).backward()
        for name, p in module.named_parameters():
            torch.testing.assert_close(grads[name][i], p.grad, rtol=0, atol=1e-10)


def test_per_sample_gradients_errors(spd_dataset):
    X, y = _spd_data(spd_dataset, n=4)
    module = _spdnet()
    with pytest.raises(ValueError, match="method='vmap' cannot"):
        per_sample_gradients(module, X, y, method="vmap")
    with pytest.raises(ValueError, match="method must be"):
        per_sample_gradients(module, X, y, method="jac")
    with pytest.raises(ValueError, match="4 samples but y has 3"):
        per_sample_gradients(module, X, y[:3])
    with torch.no_grad():
        module.bimaps[0].V.fill_(1e-3)
    with pytest.raises(ValueError, match="not centred"):
        per_sample_gradients(module, X, y)


def test_per_sample_gradients_refuse_batchnorm_in_training_mode():
    X, y = _eeg_data(n=4)
    with pytest.raises(ValueError, match="mix the samples"):
        per_sample_gradients(_eegnet(), X, y)  # a fresh module is in training mode


def test_frozen_bimap_is_neither_privatized_nor_moved(spd_dataset):
    """Parameters without gradient (SPDnetClassifier(trainable="head")) are left out of the
    per-sample gradients, hence of the clip norm and the noise; DP-SGD keeps them exactly."""
    X, y = _spd_data(spd_dataset)
    module = _spdnet()
    module.bimaps[0].V.requires_grad_(False)
    grads, _ = per_sample_gradients(module, X, y)
    assert sorted(grads) == ["head.bias", "head.weight"]
    W = module.bimaps[0].weight.detach().clone()
    dp_train_epochs(module, X, y, n_epochs=1, sample_rate=0.25, clip_norm=1.0, noise_multiplier=1.0, lr=0.05,
                    generator=torch.Generator().manual_seed(0))
    assert torch.equal(module.bimaps[0].weight.detach(), W)


def test_per_sample_gradients_empty_batch(spd_dataset):
    X, y = _spd_data(spd_dataset, n=4)
    grads, losses = per_sample_gradients(_spdnet(), X[:0], y[:0])
    assert losses.shape == (0,) and grads["head.weight"].shape == (0, 2, 10)


# ---------------------------------------------------------------------------------------------
# (c) clipping bounds each sample's contribution
# ---------------------------------------------------------------------------------------------


def _summed_update(module, X, y, clip_norm):
    grads, _ = per_sample_gradients(module, X, y)
    summed, norms = clip_and_sum(grads, clip_norm)
    noisy = add_gaussian_noise(summed, std=0.0, charts=stiefel_charts(module), generator=torch.Generator())
    return noisy, norms


@pytest.mark.parametrize("clip_norm", [0.05, 1.0])
def test_poisoned_sample_moves_update_by_at_most_clip(spd_dataset, clip_norm):
    X, y = _spd_data(spd_dataset, n=10)
    module = _spdnet()
    poisoned_x, poisoned_y = 1e6 * X[:1], 1 - y[:1]
    base, _ = _summed_update(module, X, y, clip_norm)
    added, norms = _summed_update(module, torch.cat([X, poisoned_x]), torch.cat([y, poisoned_y]), clip_norm)
    replaced, _ = _summed_update(module, torch.cat([poisoned_x, X[1:]]), torch.cat([poisoned_y, y[1:]]), clip_norm)
    assert float(norms[-1]) > 10 * clip_norm  # the poisoned gradient is large: clipping acts
    bound = clip_norm * (1 + 1e-12)
    # add/remove adjacency (the accountant's): the sum moves by at most C
    assert _joint_norm({k: added[k] - base[k] for k in base}) <= bound
    # replace-one: remove (≤ C) then add (≤ C)
    assert _joint_norm({k: replaced[k] - base[k] for k in base}) <= 2 * bound
    # without clipping the poisoned sample would have moved it by its full gradient norm
    unclipped, _ = clip_and_sum(per_sample_gradients(module, poisoned_x, poisoned_y)[0], 1e30)
    assert _joint_norm(unclipped) > 10 * clip_norm


def test_clip_and_sum_exact_and_non_finite_samples():
    g = {"a": torch.tensor([[3.0, 0.0], [0.3, 0.0], [math.nan, 1.0], [0.0, 0.0]], dtype=torch.float64),
         "b": torch.tensor([[4.0], [0.4], [0.0], [0.0]], dtype=torch.float64)}
    summed, norms = clip_and_sum(g, 1.0)
    torch.testing.assert_close(norms[[0, 1, 3]], torch.tensor([5.0, 0.5, 0.0], dtype=torch.float64))
    assert math.isnan(float(norms[2]))
    # sample 0 scaled to norm 1, sample 1 untouched, sample 2 (NaN) dropped, sample 3 zero
    torch.testing.assert_close(summed["a"], torch.tensor([0.6 + 0.3, 0.0], dtype=torch.float64))
    torch.testing.assert_close(summed["b"], torch.tensor([0.8 + 0.4], dtype=torch.float64))
    with pytest.raises(ValueError, match="clip_norm"):
        clip_and_sum(g, 0.0)


def test_noise_is_projected_on_the_tangent_space_and_has_the_right_scale():
    module = _spdnet(n_channels=30, hidden=(20,))
    charts = stiefel_charts(module)
    zeros = {name: torch.zeros_like(p) for name, p in module.named_parameters()}
    noisy = add_gaussian_noise(zeros, std=2.0, charts=charts, generator=torch.Generator().manual_seed(0))
    W, xi = charts["bimaps.0.V"], noisy["bimaps.0.V"]
    torch.testing.assert_close(tangent_project(W, xi), xi, rtol=0, atol=1e-13)
    # tangent space of St(30, 20): 30·20 − 20·21/2 = 390 dimensions, each with variance 4
    assert float((xi**2).sum()) / 390 == pytest.approx(4.0, rel=0.15)
    assert float(noisy["head.weight"].std()) == pytest.approx(2.0, rel=0.3)


# ---------------------------------------------------------------------------------------------
# dp_train_epochs: the wiring, the manifold, determinism, BatchNorm
# ---------------------------------------------------------------------------------------------


def test_full_batch_without_noise_is_a_plain_riemannian_sgd_step(spd_dataset):
    """q = 1, σ = 0, C huge: one step equals SGD on the mean loss + retraction."""
    X, y = _spd_data(spd_dataset, n=12)
    dp_module, plain = _spdnet(), _spdnet()
    dp_train_epochs(dp_module, X, y, n_epochs=1, sample_rate=1.0, clip_norm=1e30, noise_multiplier=0.0,
                    lr=0.3, generator=torch.Generator().manual_seed(0))
    train_epochs(plain, torch.optim.SGD(plain.parameters(), lr=0.3), X, y, n_epochs=1, batch_size=len(y),
                 generator=torch.Generator().manual_seed(0))
    for name, value in plain.get_parameters().items():
        np.testing.assert_allclose(dp_module.get_parameters()[name], value, rtol=0, atol=1e-12)


def test_update_divides_by_the_expected_batch_size(spd_dataset, monkeypatch):
    """Poisson batches: the noisy sum is divided by q·n (data-independent), not by the drawn size."""
    X, y = _spd_data(spd_dataset, n=21)  # q·n = 10.5: never a drawn batch size
    sums = []
    real = dp_sgd.per_sample_gradients

    def recording(module, Xb, yb, **kwargs):
        grads, losses = real(module, Xb, yb, **kwargs)
        sums.append(grads["head.bias"].sum(0))
        return grads, losses

    monkeypatch.setattr(dp_sgd, "per_sample_gradients", recording)
    module = _spdnet()
    bias0 = module.head.bias.detach().clone()
    dp_train_epochs(module, X, y, n_epochs=1, sample_rate=0.5, clip_norm=1e30, noise_multiplier=0.0, lr=0.3,
                    generator=torch.Generator().manual_seed(0))
    assert len(sums) == 2
    torch.testing.assert_close(module.head.bias.detach(), bias0 - 0.3 * (sums[0] + sums[1]) / 10.5,
                               rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-13), (torch.float32, 1e-5)])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_weights_stay_on_stiefel(spd_dataset, dtype, tol, optimizer):
    X, y = _spd_data(spd_dataset, n=20)
    module = _spdnet(hidden=(5, 3), dtype=dtype)
    before = module.get_parameters()
    dp_train_epochs(module, X.to(dtype), y, n_epochs=2, sample_rate=0.25, clip_norm=1.0, noise_multiplier=3.0,
                    lr=0.5, generator=torch.Generator().manual_seed(0), optimizer=optimizer)
    after = module.get_parameters()
    for bimap in module.bimaps:
        assert orthonormality_error(bimap.W_ref) < tol
        assert not bool(bimap.V.any())  # charts centred after every step
    assert all(np.abs(after[k] - before[k]).max() > 1e-3 for k in before)  # it did move


def test_poisson_sampling_rate(spd_dataset, monkeypatch):
    X, y = _spd_data(spd_dataset, n=200)
    sizes = []
    real = dp_sgd.per_sample_gradients

    def recording(module, Xb, yb, **kwargs):
        sizes.append(len(yb))
        return real(module, Xb[:0], yb[:0], **kwargs)  # skip the work, keep the shapes

    monkeypatch.setattr(dp_sgd, "per_sample_gradients", recording)
    dp_train_epochs(_spdnet(), X, y, n_epochs=20, sample_rate=0.1, clip_norm=1.0, noise_multiplier=1.0,
                    lr=0.1, generator=torch.Generator().manual_seed(0))
    assert len(sizes) == 20 * steps_per_epoch(0.1) == 200
    # Binomial(200, 0.1): mean 20, variance 18
    assert np.mean(sizes) == pytest.approx(20, abs=1.5)
    assert 10 < np.var(sizes) < 30


def test_determinism_under_seeded_generator(spd_dataset):
    X, y = _spd_data(spd_dataset, n=20)
    kwargs = dict(n_epochs=1, sample_rate=0.3, clip_norm=1.0, noise_multiplier=1.0, lr=0.2)
    runs = []
    global_state = torch.random.get_rng_state()
    for seed in (0, 0, 1):
        module = _spdnet()
        loss, _ = dp_train_epochs(module, X, y, generator=torch.Generator().manual_seed(seed), **kwargs)
        runs.append((loss, module.get_parameters()))
    assert torch.equal(torch.random.get_rng_state(), global_state)  # the global RNG untouched
    assert runs[0][0] == runs[1][0]
    for name in runs[0][1]:
        np.testing.assert_array_equal(runs[0][1][name], runs[1][1][name])
    assert any(not np.array_equal(runs[0][1][k], runs[2][1][k]) for k in runs[0][1])


def test_eegnet_dropout_determinism_and_frozen_batchnorm():
    X, y = _eeg_data(n=16)
    runs = []
    for _ in range(2):
        module = _eegnet(dropout=0.5)
        buffers = copy.deepcopy(dict(module.named_buffers()))
        dp_train_epochs(module, X, y, n_epochs=2, sample_rate=0.5, clip_norm=1.0, noise_multiplier=0.5,
                        lr=0.05, generator=torch.Generator().manual_seed(3), optimizer="adam")
        for name, value in module.named_buffers():  # BatchNorm statistics never updated
            assert torch.equal(value, buffers[name]), name
        assert module.training and all(sub.training for sub in module.modules())  # modes restored
        runs.append(module.get_parameters())
    for name in runs[0]:
        np.testing.assert_array_equal(runs[0][name], runs[1][name])


@pytest.mark.parametrize("make", ["spdnet", "eegnet"])
def test_dp_train_epochs_ignores_global_grad_mode(spd_dataset, make):
    X, y = _spd_data(spd_dataset, n=8) if make == "spdnet" else _eeg_data(n=8)
    module = _spdnet() if make == "spdnet" else _eegnet()
    before = module.get_parameters()
    with torch.no_grad():
        dp_train_epochs(module, X, y, n_epochs=1, sample_rate=0.5, clip_norm=1.0, noise_multiplier=0.0,
                        lr=0.1, generator=torch.Generator().manual_seed(0))
    after = module.get_parameters()
    assert any(np.abs(after[k] - before[k]).max() > 0 for k in before if "running" not in k)


def test_batchnorm_without_running_statistics_is_refused():
    module = _eegnet()
    module.bn2 = torch.nn.BatchNorm2d(4, track_running_stats=False).double()
    X, y = _eeg_data(n=4)
    with pytest.raises(ValueError, match="batch statistics"):
        dp_train_epochs(module, X, y, n_epochs=1, sample_rate=0.5, clip_norm=1.0, noise_multiplier=1.0,
                        lr=0.1, generator=torch.Generator())


@pytest.mark.parametrize("kwargs, match", [
    (dict(sample_rate=0.0), "sample_rate"), (dict(sample_rate=1.5), "sample_rate"),
    (dict(clip_norm=-1.0), "clip_norm"), (dict(noise_multiplier=-0.1), "noise_multiplier"),
    (dict(lr=0.0), "lr"), (dict(optimizer="rmsprop"), "optimizer"), (dict(n_epochs=-1), "n_epochs"),
])
def test_dp_train_epochs_bad_arguments(spd_dataset, kwargs, match):
    X, y = _spd_data(spd_dataset, n=4)
    args = {**dict(n_epochs=1, sample_rate=0.5, clip_norm=1.0, noise_multiplier=1.0, lr=0.1,
                   generator=torch.Generator()), **kwargs}
    with pytest.raises(ValueError, match=match):
        dp_train_epochs(_spdnet(), X, y, **args)


def test_dp_train_epochs_needs_a_torch_generator(spd_dataset):
    X, y = _spd_data(spd_dataset, n=4)
    with pytest.raises(TypeError, match="torch.Generator"):
        dp_train_epochs(_spdnet(), X, y, n_epochs=1, sample_rate=0.5, clip_norm=1.0, noise_multiplier=1.0,
                        lr=0.1, generator=0)


# ---------------------------------------------------------------------------------------------
# (d) the noise is real
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("accounting")
def test_tiny_epsilon_destroys_accuracy_while_clipping_alone_learns(spd_dataset):
    X, y = _spd_data(spd_dataset, n=120, seed=0)
    (X_train, X_test), (y_train, y_test) = (X[:60], X[60:]), (y[:60], y[60:])
    q, n_epochs, delta = 0.25, 8, 1e-3
    steps = n_epochs * steps_per_epoch(q)
    scores = {}
    for epsilon in (math.inf, 0.05):
        sigma = calibrate_noise(epsilon, delta, sample_rate=q, steps=steps)
        module = _spdnet()
        dp_train_epochs(module, X_train, y_train, n_epochs=n_epochs, sample_rate=q, clip_norm=1.0,
                        noise_multiplier=sigma, lr=0.5, generator=torch.Generator().manual_seed(0))
        scores[epsilon] = evaluate(module, X_test, y_test)[1]
        if epsilon < math.inf:
            assert sigma > 10 and epsilon_spent(sigma, delta, q, steps) <= epsilon
    assert scores[math.inf] >= 0.9
    assert scores[0.05] <= 0.7


# ---------------------------------------------------------------------------------------------
# Re-centring under DP: the released domain means
# ---------------------------------------------------------------------------------------------


def _domain_net(n_channels=6, hidden=(4, 3), seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return SPDNet(n_channels, hidden, 2, eps=1e-2, seed=seed, batchnorm="domain")


def _domain_batch(spd_dataset, n=40, n_domains=2, scales=(1.0, 30.0)):
    X, y = _spd_data(spd_dataset, n=n)
    codes = np.arange(n) % n_domains
    X = X * torch.as_tensor(np.asarray(scales)[codes])[:, None, None]
    return DomainBatch(X, codes), y


def _symmetric(rng, d, scale):
    A = rng.standard_normal((d, d)) * scale
    return torch.as_tensor((A + A.T) / 2)


@pytest.mark.parametrize("clip", [0.5, 2.0, 10.0])
@pytest.mark.parametrize("scale", [0.01, 1.0, 100.0])
def test_one_trial_moves_its_domains_vector_by_at_most_the_sensitivity(clip, scale):
    """Adding or removing one trial (any deviation, clipped or not) moves (S, c·n) of its own
    domain by at most Δ = √(R² + c²) and leaves the other domains' vectors unchanged."""
    rng = np.random.default_rng(0)
    D = torch.stack([_symmetric(rng, 4, scale) for _ in range(9)])
    codes = torch.as_tensor(np.arange(9) % 3)
    c = dp_sgd.DOMAIN_COUNT_WEIGHT * clip
    full = dp_sgd.clipped_domain_sums(D, codes, 3, clip)
    for removed in range(9):
        keep = torch.as_tensor([i for i in range(9) if i != removed])
        part = dp_sgd.clipped_domain_sums(D[keep], codes[keep], 3, clip)
        moved = torch.sqrt(torch.linalg.matrix_norm(full[0] - part[0]) ** 2 + (c * (full[1] - part[1])) ** 2)
        own = int(codes[removed])
        assert float(moved[own]) <= dp_sgd.domain_mean_sensitivity(clip) * (1 + 1e-12)
        assert float(moved.sum() - moved[own]) == 0.0


def test_domain_mean_sensitivity_is_the_norm_of_one_clipped_trial_and_its_count():
    assert dp_sgd.domain_mean_sensitivity(2.0) == pytest.approx(math.hypot(2.0, 1.0))
    with pytest.raises(ValueError, match="clip must be a finite positive number"):
        dp_sgd.domain_mean_sensitivity(0.0)


def test_released_noise_has_the_stated_standard_deviation_in_an_orthonormal_basis():
    """Each coordinate of the symmetric noise in an orthonormal basis (diagonal, √2 × the
    upper triangle) has the standard deviation σΔ: the Gaussian mechanism of the analysis."""
    std = 1.7
    Z = dp_sgd._symmetric_gaussian(4000, 5, std, torch.Generator().manual_seed(0), torch.float64)
    iu = torch.triu_indices(5, 5, offset=1)
    coords = torch.cat([Z.diagonal(dim1=-2, dim2=-1), math.sqrt(2) * Z[:, iu[0], iu[1]]], dim=1)
    assert torch.allclose(Z, Z.transpose(-1, -2))
    assert coords.std(0).numpy() == pytest.approx(np.full(15, std), rel=0.05)
    assert abs(float(coords.mean())) < 0.02 * std


def _release(net, batch, sigma, seed=0, clip=2.0):
    return dp_sgd.release_domain_means(net, batch, references=[torch.zeros(4, 4), torch.zeros(3, 3)], clip=clip,
                                        noise_multiplier=sigma, generator=torch.Generator().manual_seed(seed))


def test_without_noise_and_clipping_the_release_is_each_domains_log_euclidean_mean(spd_dataset):
    """Oracle: pyRiemann's log-Euclidean mean of each domain's first-layer inputs WᵀXW."""
    from pyriemann.utils.mean import mean_logeuclid

    net, (batch, _) = _domain_net(), _domain_batch(spd_dataset)
    released = _release(net, batch, sigma=0.0, clip=1e6)
    W = net.bimaps[0].weight.detach().numpy()
    for k in range(2):
        Z = W.T @ batch.X[batch.domains == k].numpy() @ W
        M = torch.linalg.inv(released[0][k] @ released[0][k]).numpy()
        assert M == pytest.approx(mean_logeuclid(Z), rel=1e-8)


def test_the_noise_is_present_and_seeded(spd_dataset):
    net, (batch, _) = _domain_net(), _domain_batch(spd_dataset)
    exact, noisy, again, other = (_release(net, batch, s, seed) for s, seed in ((0.0, 0), (1.0, 0), (1.0, 0), (1.0, 1)))
    for layer in range(2):
        assert not torch.allclose(exact[layer], noisy[layer])
        assert torch.equal(noisy[layer], again[layer])
        assert not torch.allclose(noisy[layer], other[layer])


def test_released_means_make_per_sample_gradients_independent(spd_dataset):
    """Whitened by fixed means, the samples of a batch do not interact: each per-sample
    gradient equals the gradient of that sample alone (loop oracle), and the batched method
    agrees."""
    net, (batch, y) = _domain_net(), _domain_batch(spd_dataset, n=12)
    batch.statistics = _release(net, batch, sigma=1.0)
    batched, _ = per_sample_gradients(net, batch, y, method="batched")
    loop, _ = per_sample_gradients(net, batch, y, method="loop")
    for name in batched:
        assert torch.allclose(batched[name], loop[name], atol=1e-10)
    alone = per_sample_gradients(net, batch[torch.tensor([3])], y[3:4], method="loop")[0]
    for name in alone:
        assert torch.allclose(alone[name][0], loop[name][3], atol=1e-12)


def test_domain_batch_norm_without_released_means_is_refused_in_dp_sgd(spd_dataset):
    net, (batch, y) = _domain_net(), _domain_batch(spd_dataset, n=12)
    with pytest.raises(ValueError, match="DomainSPDBatchNorm.*mix the samples"):
        per_sample_gradients(net, batch, y)
    with pytest.raises(ValueError, match="DomainSPDBatchNorm"):
        dp_train_epochs(net, batch, y, n_epochs=1, sample_rate=0.5, clip_norm=1.0, noise_multiplier=1.0, lr=0.01,
                        generator=torch.Generator().manual_seed(0))


def test_dp_sgd_trains_on_released_means(spd_dataset):
    net, (batch, y) = _domain_net(), _domain_batch(spd_dataset)
    batch.statistics = _release(net, batch, sigma=1.0)
    before = copy.deepcopy(net.state_dict())
    loss, dropped = dp_train_epochs(net, batch, y, n_epochs=1, sample_rate=0.25, clip_norm=1.0, noise_multiplier=1.0,
                                    lr=0.01, generator=torch.Generator().manual_seed(0))
    assert dropped == 0 and math.isfinite(loss)
    assert any(not torch.equal(before[k], v) for k, v in net.state_dict().items())


@pytest.mark.parametrize("bad, match", [
    (dict(references=[torch.zeros(4, 4)]), "one reference per batch-norm layer"),
    (dict(references=[torch.zeros(3, 3), torch.zeros(3, 3)]), r"reference 0 has shape \(3, 3\)"),
    (dict(clip=0.0), "clip must be"),
    (dict(noise_multiplier=-1.0), "noise_multiplier must be"),
])
def test_release_errors_are_named(spd_dataset, bad, match):
    net, (batch, _) = _domain_net(), _domain_batch(spd_dataset, n=8)
    good = dict(references=[torch.zeros(4, 4), torch.zeros(3, 3)], clip=1.0, noise_multiplier=1.0,
                generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=match):
        dp_sgd.release_domain_means(net, batch, **{**good, **bad})
    with pytest.raises(TypeError, match="DomainBatch"):
        dp_sgd.release_domain_means(net, batch.X, **good)


