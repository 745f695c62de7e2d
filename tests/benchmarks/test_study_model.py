"""The study model: its band model, its dispersion normalization, its mixed-domain minibatches
with running domain means, and the classifier around them."""

import numpy as np
import pytest
import torch

from benchmarks.experiments.study_model import (BandSPDNet, CompleteDomainBatchNorm, DispersionBatchNorm,
                                                RunningDomainBatchNorm, StudySPDnetClassifier, fit_study,
                                                mixed_minibatches, momentum_schedule)
from skfedspd.aggregation import projavg
from skfedspd.batchnorm import DomainBatch
from skfedspd.functional import karcher_mean, logeig, spd_geodesic


def test_dispersion_normalization_sets_each_domain_to_its_target_dispersion(spd_domains):
    X, _, groups = spd_domains(n_groups=2, n_per_group=20, n_channels=4)
    bn = DispersionBatchNorm(4)
    with torch.no_grad():
        bn.log_std.fill_(np.log(0.7))
        Y = bn(torch.as_tensor(X), groups)
    for g in np.unique(groups):
        L = logeig(Y[torch.as_tensor(groups == g)])
        # re-centred at the identity (the bias), mean squared distance the target's square
        assert torch.allclose(L.mean(0), torch.zeros(4, 4, dtype=L.dtype), atol=0.05)
        assert (L**2).sum((-1, -2)).mean().item() == pytest.approx(0.49, rel=1e-6)


@pytest.mark.parametrize("dispersion", [False, True])
def test_band_model_exports_every_band_and_averages_on_the_stiefel_manifold(spd_domains, dispersion):
    X, y, groups = spd_domains(n_groups=2, n_per_group=20, n_channels=6)
    bands = np.stack([X, X + 0.1 * np.eye(6)], 1)
    model = BandSPDNet(2, 6, 3, 2, seed=0, dispersion=dispersion)
    kinds = model.parameter_kinds()
    assert [name for name, kind in kinds.items() if kind == "stiefel"] == ["nets.0.bimaps.0.weight",
                                                                           "nets.1.bimaps.0.weight"]
    assert any(name.endswith("log_std") for name in kinds) == dispersion
    logits = model(DomainBatch(torch.as_tensor(bands), groups))
    assert logits.shape == (40, 2)
    first = model.get_parameters()
    other = BandSPDNet(2, 6, 3, 2, seed=1, dispersion=dispersion).get_parameters()
    model.set_parameters(projavg([first, other], [0.5, 0.5], None, kinds))
    W = model.get_parameters()["nets.1.bimaps.0.weight"]
    assert np.allclose(W.T @ W, np.eye(3), atol=1e-10)


def test_study_fit_keeps_an_average_of_its_validated_epochs(spd_domains):
    X, y, groups = spd_domains(n_groups=2, n_per_group=40, n_channels=4)
    X = X[:, None]
    model = fit_study(X, y, groups, seed=0, dispersion=False, hidden_dim=3, max_epochs=6, patience=2)
    with torch.no_grad():
        pred = model(DomainBatch(torch.as_tensor(X), groups)).argmax(1).numpy()
    assert not model.training and (pred == y).mean() > 0.6


def test_momentum_decays_from_one_to_the_domain_share_of_a_minibatch():
    etas = [momentum_schedule(epoch) for epoch in range(60)]
    assert etas[0] == pytest.approx(1.0) and etas[49] == pytest.approx(16 / 64) and etas[59] == etas[49]
    assert all(a > b for a, b in zip(etas[:49], etas[1:50]))


def test_mixed_minibatches_hold_chunks_of_several_domains_covering_every_trial_once():
    domains = torch.as_tensor(np.repeat([0, 1, 2, 3, 4], [30, 33, 16, 40, 17]))
    batches = mixed_minibatches(domains, 16, 4, torch.Generator().manual_seed(0))
    assert sorted(torch.cat(batches).tolist()) == list(range(len(domains)))
    # 4 chunks a batch (two chunks of one domain may meet): several domains in a batch
    assert all(2 <= len(torch.unique(domains[b])) <= 4 for b in batches[:-1])
    for b in batches:  # every domain's chunk in a batch has at least half of 16 trials
        assert min(torch.bincount(domains[b])[torch.unique(domains[b])].tolist()) >= 8


def test_running_domain_means_move_by_the_momentum_and_pass_the_gradient(spd_domains):
    X, _, groups = spd_domains(n_groups=2, n_per_group=20, n_channels=4)
    X, codes = torch.as_tensor(X), torch.as_tensor(groups)
    bn = RunningDomainBatchNorm(4).train()
    first, second = slice(0, 10), slice(10, 20)  # domain 0's trials, in two minibatches
    bn(X[first], codes[first])
    held = bn.running[0]
    assert torch.allclose(held, karcher_mean(X[first], 1))  # momentum 1: the minibatch's mean
    bn.eta = 0.25
    Z = X[second].clone().requires_grad_(True)
    Y = bn(Z, codes[second])
    expected = spd_geodesic(held, karcher_mean(X[second], 1), 0.25)
    assert torch.allclose(bn.running[0], expected)
    assert torch.allclose(Y, bn.normalize(X[second], expected))
    Y.sum().backward()
    assert torch.isfinite(Z.grad).all() and Z.grad.abs().sum() > 0
    with torch.no_grad():  # evaluation: each domain by its own trials, as the package does
        assert torch.allclose(bn.eval()(X[second], codes[second]), bn.normalize_batch(X[second]))


def test_complete_batch_norm_rescales_the_dispersion_around_the_running_mean(spd_domains):
    X, _, groups = spd_domains(n_groups=2, n_per_group=20, n_channels=4)
    X, codes = torch.as_tensor(X), torch.as_tensor(groups)
    bn = CompleteDomainBatchNorm(4).train()
    with torch.no_grad():
        bn.log_std.fill_(np.log(0.5))
    bn(X[:10], codes[:10])
    bn.eta = 0.25
    Y = bn(X[10:20], codes[10:20]).detach()
    mean = spd_geodesic(karcher_mean(X[:10], 1), karcher_mean(X[10:20], 1), 0.25)
    assert torch.allclose(bn.running[0], mean)
    L = logeig(Y)  # the bias is the identity: the target dispersion around the running mean
    assert (L**2).sum((-1, -2)).mean().item() == pytest.approx(0.25, rel=1e-6)


@pytest.mark.parametrize("settings", [{}, {"dispersion": True}, {"mixed": True, "running": True, "dispersion": True}])
def test_classifier_fits_the_study_model_on_scaled_bands_and_predicts_labels(spd_domains, settings):
    X, y, groups = spd_domains(n_groups=4, n_per_group=20, n_channels=4)
    labels = np.array(["left", "right"])[y]
    clf = StudySPDnetClassifier(hidden_dim=3, max_epochs=4, **settings).fit(7.0 * X, labels, groups=groups)
    assert clf.trace_.shape == (1,) and clf.trace_[0] == pytest.approx(7.0 * np.trace(X, axis1=1, axis2=2).mean())
    proba = clf.predict_proba(7.0 * X[:20])
    assert proba.shape == (20, 2) and np.allclose(proba.sum(1), 1.0)
    assert set(clf.predict(7.0 * X[:20])) <= {"left", "right"}
    # the same model on 4-D input (one band), scale-free
    again = StudySPDnetClassifier(hidden_dim=3, max_epochs=4, **settings).fit(X[:, None], labels, groups=groups)
    assert np.allclose(again.predict_proba(X[:20, None]), proba)


def test_classifier_needs_the_subjects():
    X = np.tile(np.eye(3), (6, 1, 1))
    with pytest.raises(ValueError, match="groups"):
        StudySPDnetClassifier().fit(X, np.array([0, 1] * 3))


def test_running_means_without_mixed_minibatches_are_refused():
    X = np.tile(np.eye(3), (6, 1, 1))
    with pytest.raises(ValueError, match="running=True needs mixed=True"):
        StudySPDnetClassifier(running=True).fit(X, np.array([0, 1] * 3), groups=np.repeat([1, 2], 3))
