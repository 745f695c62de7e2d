"""The learner-leads experiment: its rows, subsamples, windows and ensembles."""

import numpy as np

from benchmarks.experiments.learner_leads import ROWS, subsample, window_covariances, windowed_proba


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
                                                      "fed-ts-lr", "recenter-ts-lr"}
    assert ROWS["TS+LR"] == ("ts-lr", {})


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
    assert spdnet(3, hidden_dims=32).hidden_dims == 32
    assert [clf.hidden_dims for _, clf in spdnet(2, 5, hidden_dims=12).estimators] == [12] * 5


def test_the_filter_bank_ts_lr_concatenates_one_tangent_space_per_band(spd_domains):
    from pyriemann.tangentspace import TangentSpace

    from benchmarks.experiments.learner_leads import ts_lr

    X, y, _ = spd_domains(n_groups=2, n_per_group=20, n_channels=4)
    bands = np.stack([X, X + 0.5 * np.eye(4)], 1)
    bank = ts_lr(n_bands=2).fit(bands, y)
    features = bank[0].transform(bands)
    assert features.shape == (40, 2 * 10)
    np.testing.assert_allclose(features[:, 10:], TangentSpace(metric="riemann").fit_transform(bands[:, 1]))
    assert bank.predict_proba(bands).shape == (40, 2)


def test_a_replication_run_names_its_new_splits():
    from benchmarks.experiments.learner_leads import splits_title

    assert splits_title(range(8)) == "the main job's splits"
    assert splits_title(range(8, 16)) == "new splits (seeds 8-15)"
    assert splits_title(range(16)) == "the main job's splits and 8 new ones (seeds 0-15)"


def test_the_client_lr_row_sets_the_sites_adam_only():
    from benchmarks.experiments.learner_leads import federations

    lowered = federations(ROWS["FedSPDnet + domain BN + server momentum, client lr 1e-3"][1], seed=2)
    shipped = federations(ROWS["FedSPDnet + domain BN + server momentum"][1], seed=2)
    assert [fed.estimator.lr for fed in lowered + shipped] == [1e-3, 1e-2]
    def others(fed):  # every setting but the local estimator's learning rate
        return {key: repr(value) for key, value in fed.get_params().items() if key not in ("estimator", "estimator__lr")}

    assert others(lowered[0]) == others(shipped[0])
    ensemble = federations(ROWS["FedSPDnet + domain BN + server momentum, 5 training seeds, probabilities averaged"][1], 2)
    assert [fed.random_state for fed in ensemble] == [10, 11, 12, 13, 14]


def smallest_eigenvalue_fitted(monkeypatch):
    """The TS+LR and the networks of ``learner_leads`` replaced by models that record the
    smallest eigenvalue of the matrices each is fitted on (in the list returned)."""
    from benchmarks.experiments import learner_leads

    seen = []

    class Recorder:
        def fit(self, X, y, groups=None):
            seen.append(np.linalg.eigvalsh(X).min())
            return self

        def predict_proba(self, X):
            return np.full((len(X), 2), 0.5)

    monkeypatch.setattr(learner_leads, "ts_lr", lambda n_bands=None: Recorder())
    monkeypatch.setattr(learner_leads, "spdnet", lambda seed, n_seeds=1, **params: Recorder())
    return seen


def test_recentred_ts_lr_and_the_ensemble_with_ts_lr_on_oas(spd_domains, monkeypatch):
    from benchmarks.experiments import learner_leads

    X, y, subjects = spd_domains(n_groups=4, n_per_group=40, n_channels=4, seed=0)
    shrunk = X + np.eye(4)  # stands for the OAS covariances: told apart by their smallest eigenvalue
    data = (X, shrunk[:, None], None, None, None, y, subjects)
    row = learner_leads.fit_row("Recenter+TS+LR", data, seed=0)
    assert row["f1"] > 0.6 and row["n_train"] == 136  # 85 % of each client's 80 trials

    seen = smallest_eigenvalue_fitted(monkeypatch)
    learner_leads.fit_row("SPDnetClassifier() over 5 training seeds and TS+LR on OAS covariances, probabilities "
                          "averaged", data, seed=0)
    assert seen[0] >= 1 > seen[1]  # TS+LR on the shrunk matrices, the networks on the sample covariances


def test_the_sensorimotor_rows_take_the_16_channel_matrices(spd_domains, monkeypatch):
    from benchmarks.experiments import learner_leads

    X, y, subjects = spd_domains(n_groups=4, n_per_group=40, n_channels=4, seed=0)
    # all 64 channels (+5 I) and their OAS (+9 I) told apart from the sensorimotor sample (X) and OAS (+2 I)
    sensorimotor = np.stack([X, X + 2 * np.eye(4)], 1)
    data = (X + 5 * np.eye(4), (X + 9 * np.eye(4))[:, None], None, None, sensorimotor, y, subjects)
    seen = smallest_eigenvalue_fitted(monkeypatch)
    learner_leads.fit_row("SPDnetClassifier() over 5 training seeds and TS+LR on OAS covariances, probabilities "
                          "averaged, 16 sensorimotor channels", data, seed=0)
    learner_leads.fit_row("TS+LR, 16 sensorimotor channels", data, seed=0)
    assert 2 <= seen[0] < 5 and seen[1] < 2 and seen[2] < 2  # OAS for TS+LR, sample covariances otherwise
    row = learner_leads.fit_row("Recenter+TS+LR on OAS covariances, 16 sensorimotor channels", data, seed=0)
    assert row["config"]["channels"] == "sensorimotor" and row["n_train"] == 136


def test_sensorimotor_covariances_pick_the_channels_by_name(monkeypatch):
    from benchmarks.experiments import learner_leads
    from skfedspd.datasets import SENSORIMOTOR_CHANNELS, sample_covariance

    names = [f"X{k}" for k in range(48)] + list(SENSORIMOTOR_CHANNELS)[::-1]  # the 16 last, reversed
    monkeypatch.setattr(learner_leads, "channel_names", lambda subject: names)
    X_raw = np.random.default_rng(0).standard_normal((3, 64, 200))
    C = learner_leads.sensorimotor_covariances(X_raw)
    np.testing.assert_allclose(C[:, 0], sample_covariance(X_raw[:, 63:47:-1]))
    assert C.shape == (3, 2, 16, 16) and (np.linalg.eigvalsh(C[:, 1]) > 0).all()
