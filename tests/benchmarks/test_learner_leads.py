"""The learner-leads study: its band model, its dispersion normalization, its mixed-domain
minibatches with running domain means, and its subsamples."""

import numpy as np
import pytest
import torch

from benchmarks.experiments.learner_leads import (ROWS, BandSPDNet, DispersionBatchNorm, RunningDomainBatchNorm, fit_study,
                                                  mixed_minibatches, momentum_schedule, subsample, window_covariances,
                                                  windowed_proba)
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


def test_subsample_keeps_a_stratified_share_of_every_subject():
    y = np.tile([0, 1, 2, 3], 20)
    subjects = np.repeat([1, 2], 40)
    train = np.arange(80)
    kept = subsample(train, y, subjects, 0.25, seed=0)
    for s in (1, 2):
        counts = np.bincount(y[kept][subjects[kept] == s], minlength=4)
        assert counts.sum() == 10 and counts.min() >= 2 and counts.max() <= 3  # 10 trials a class, a quarter
    assert subsample(train, y, subjects, 1.0, seed=0) is train


def test_every_row_names_a_model_the_study_fits():
    assert {model for model, _ in ROWS.values()} == {"ts-lr", "spdnet", "ensemble", "study", "federated", "windows",
                                                      "fed-ts-lr"}
    assert ROWS["TS+LR"] == ("ts-lr", {})


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


def test_window_covariances_are_those_of_each_window():
    X = np.random.default_rng(0).standard_normal((3, 4, 480))
    W = window_covariances(X)
    assert W.shape == (3, 5, 4, 4)  # windows of 320 samples at 0, 40, ..., 160
    assert np.allclose(W[1, 2], np.cov(X[1, :, 80:400]))


def test_windowed_prediction_averages_the_windows_of_each_test_trial(monkeypatch):
    from benchmarks.experiments import learner_leads

    class Proba:  # the probability of class 1 is a window's first entry
        def fit(self, X, y):
            assert len(X) == len(y) == 2 * 3  # every window of the training trials
            return self

        def predict_proba(self, X):
            return np.stack([1 - X[:, 0, 0], X[:, 0, 0]], 1)

    monkeypatch.setattr(learner_leads, "ts_lr", Proba)
    windows = np.zeros((4, 3, 2, 2))
    windows[..., 0, 0] = [[0.1, 0.2, 0.3], [0, 0, 0], [0.9, 0.6, 0.3], [1, 1, 1]]
    proba = windowed_proba({"learner": "ts-lr"}, windows, np.array([0, 1, 0, 1]), np.zeros(4), np.array([1, 3]),
                           np.array([0, 2]), seed=0)
    assert np.allclose(proba[:, 1], [0.2, 0.6])


def test_an_ensemble_row_trains_a_new_set_of_seeds_for_each_split():
    from sklearn.ensemble import VotingClassifier

    from benchmarks.experiments.learner_leads import ensemble_seeds, spdnet

    assert ensemble_seeds(3, 1) == [3] and ensemble_seeds(2, 5) == [10, 11, 12, 13, 14]
    ensemble = spdnet(2, 5)
    assert isinstance(ensemble, VotingClassifier) and ensemble.voting == "soft"
    assert [clf.random_state for _, clf in ensemble.estimators] == [10, 11, 12, 13, 14]
    assert spdnet(3).random_state == 3
