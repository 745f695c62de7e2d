"""Tests of DP mode of ``FederatedSPDnetClassifier`` (``privacy=DPSGD(...)``): the budget, the wiring
into both backends, the noise, the parameter rules. The building blocks (DP-SGD, the
accountant wrappers) are tested in ``test_privacy.py``."""

import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("dp_accounting")

from conftest import make_eeg_timeseries, make_spd_dataset  # noqa: E402
from skfedspd import EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier  # noqa: E402
from skfedspd.messages import TrainReply  # noqa: E402
from skfedspd.online import DomainAdaptation  # noqa: E402
from skfedspd.persistence import load_estimator, save_estimator  # noqa: E402
from skfedspd.privacy import DPSGD  # noqa: E402
from skfedspd.stiefel import orthonormality_error  # noqa: E402

N_CHANNELS = 6


def _fed(estimator=None, **kwargs):
    params = dict(n_rounds=3, local_epochs=1, n_clients=4, partition="stratified", validation_fraction=0.0,
                  privacy=DPSGD(epsilon=2.0, delta=1e-3), random_state=0)
    params.update(kwargs)
    est = estimator if estimator is not None else SPDnetClassifier(hidden_dims=(3,), scaling="trace", batch_size=8,
                                                                    lr=0.05)
    return FederatedSPDnetClassifier(est, **params)


def _accountant_epsilon(sigma, q, steps, delta):
    """ε straight from dp_accounting (not through skfedspd.privacy)."""
    import dp_accounting

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(delta)


@pytest.fixture(scope="module")
def spd():
    return make_spd_dataset(80, N_CHANNELS, 2, seed=0)


@pytest.fixture(scope="module")
def partial_fit(spd):
    """A DP fit with partial participation (2 of 4 clients per round)."""
    return _fed(n_rounds=4, clients_per_round=2).fit(*spd)


def test_budget_holds_for_every_site_by_the_accountant(partial_fit):
    fed = partial_fit
    report = fed.privacy_
    assert report["target_epsilon"] == 2.0 and report["delta"] == 1e-3 and report["clip_norm"] == 1.0
    assert report["accountant"]["name"] == "rdp" and report["accountant"]["version"]
    assert report["rounds_bound"].startswith("exact")
    # the exact counts of the seeded schedule, and those are the rounds that ran
    selected = np.zeros(4, dtype=int)
    for t in range(4):
        selected[fed.engine_.select(t)[0]] += 1
    assert [s["rounds"] for s in report["sites"]] == selected.tolist() == [s["rounds_run"] for s in report["sites"]]
    assert sum(selected) == 8
    for site in report["sites"]:
        if site["rounds_run"] == 0:  # never drawn: nothing released, no noise planned
            assert site["epsilon"] == 0.0
            continue
        assert site["noise_multiplier"] > 0
        assert site["steps_run"] == site["rounds_run"] * site["steps_per_epoch"]
        spent = _accountant_epsilon(site["noise_multiplier"], site["sample_rate"], site["steps_run"], 1e-3)
        assert spent <= 2.0 + 1e-9
        assert site["epsilon"] == pytest.approx(spent, rel=1e-9)
        if site["rounds_run"] == max(selected):  # the calibration is tight for a site drawn the most
            assert spent > 1.9


def test_weights_stay_orthonormal_and_nothing_else_is_released(partial_fit):
    fed = partial_fit
    kinds = fed.global_estimator_.parameter_kinds()
    params = fed.global_estimator_.get_parameters()
    stiefel = [n for n, k in kinds.items() if k == "stiefel"]
    assert stiefel
    for name in stiefel:
        assert orthonormality_error(params[name]) < 1e-12
    for record in fed.history_:
        assert all(err < 1e-12 for err in record["orthonormality"].values())
        assert np.isnan(record["train_loss"]) and record["skipped_batches"] == 0
        assert np.isnan(record["val_f1"])  # no validation in DP mode
    assert fed.global_estimator_.scale_ == 1.0  # scaling="trace": no pooled statistic
    assert fed.engine_.input_statistic is None


def test_a_reply_that_releases_its_loss_is_rejected(partial_fit):
    engine = partial_fit.engine_
    params = {n: v.copy() for n, v in engine.global_params.items()}
    assert "released in DP mode" in engine.check_train_reply(0, TrainReply(params, 0.5, 0, 1))
    assert engine.check_train_reply(0, TrainReply(params, float("nan"), 0, 1)) is None


def test_privacy_report_survives_save_and_load(partial_fit, tmp_path):
    save_estimator(partial_fit, tmp_path / "fed.skfedspd")
    loaded = load_estimator(tmp_path / "fed.skfedspd")
    assert loaded.privacy_ == partial_fit.privacy_


def test_without_dp_there_is_no_report(spd):
    fed = _fed(n_rounds=1, privacy=None).fit(*spd)
    assert fed.privacy_ is None
    assert np.isfinite(fed.history_[0]["train_loss"])


def test_local_and_flower_backends_give_the_same_dp_model(spd):
    pytest.importorskip("flwr")
    local = _fed(clients_per_round=3).fit(*spd)
    flower = _fed(clients_per_round=3, backend="flower").fit(*spd)
    for name, value in local.engine_.global_params.items():
        np.testing.assert_array_equal(value, flower.engine_.global_params[name], err_msg=name, strict=True)
    assert local.privacy_ == flower.privacy_
    assert flower.engine_.input_statistic is None


def test_dp_eegnet_frozen_batchnorm():
    """DP-FedEEGNet: the baseline runs DP-SGD with its BatchNorm layers frozen (running
    statistics stay at their initial values: they carry no data)."""
    X, y = make_eeg_timeseries(n_trials=48, n_channels=4, n_times=64, n_classes=2, seed=0)
    est = EEGNetClassifier(batch_size=8, lr=1e-2, dtype="float32")
    fed = _fed(est, n_rounds=2, n_clients=3).fit(X, y)
    kinds = fed.global_estimator_.parameter_kinds()
    params = fed.global_estimator_.get_parameters()
    local = [n for n, k in kinds.items() if k == "local" and "running" in n]
    assert local
    for name in local:
        expected = 0.0 if "mean" in name else 1.0
        np.testing.assert_array_equal(params[name], np.full_like(params[name], expected))
    assert all(np.isfinite(v).all() for v in params.values())
    assert all(site["epsilon"] <= 2.0 for site in fed.privacy_["sites"])


def test_dp_eegnet_group_norm_trains_its_normalisation():
    """DP-FedEEGNet with ``norm="group"``: each trial normalised by itself, so nothing is
    frozen and nothing is client-local; the GroupNorm weights train under DP-SGD."""
    X, y = make_eeg_timeseries(n_trials=48, n_channels=4, n_times=64, n_classes=2, seed=0)
    fed = _fed(EEGNetClassifier(batch_size=8, lr=1e-2, norm="group"), n_rounds=2, n_clients=3).fit(X, y)
    assert set(fed.global_estimator_.parameter_kinds().values()) == {"euclidean"}
    assert fed.engine_.local_states == {}
    params = fed.global_estimator_.get_parameters()
    for name in ("bn1", "bn2", "bn3"):
        assert not np.allclose(params[f"{name}.weight"], 1.0) and not np.allclose(params[f"{name}.bias"], 0.0)
    assert all(np.isfinite(v).all() for v in params.values())
    assert all(0 < site["epsilon"] <= 2.0 for site in fed.privacy_["sites"])
    assert fed.predict_proba(X).shape == (48, 2)


@pytest.mark.slow
def test_tiny_epsilon_destroys_accuracy_that_no_dp_learns():
    X, y = make_spd_dataset(300, N_CHANNELS, 3, seed=1)
    (X_train, y_train), (X_test, y_test) = (X[:200], y[:200]), (X[200:], y[200:])
    scores = {}
    for epsilon in (None, 0.01):
        fed = _fed(n_rounds=10, local_epochs=2, privacy=DPSGD(epsilon=epsilon, delta=1e-3) if epsilon else None,
                   estimator=SPDnetClassifier(hidden_dims=(4,), scaling="trace", batch_size=16, lr=0.05))
        scores[epsilon] = fed.fit(X_train, y_train).score(X_test, y_test)
    assert scores[None] >= 0.9
    assert scores[0.01] <= 0.6


@pytest.mark.parametrize("params, match", [
    (dict(validation_fraction=0.1, estimator=SPDnetClassifier(scaling="trace", early_stopping=True)),
     "explicit validation split"),
    (dict(estimator=SPDnetClassifier(batchnorm="spd")), "batchnorm='spd'"),
    (dict(warm_start=True), "warm_start"),
    (dict(privacy=DPSGD(epsilon=2.0, delta=0.05)), r"delta=0\.05 must be below 1 / \(smallest site's training size 20\)"),
    (dict(privacy=DPSGD(epsilon=0.0)), "'epsilon' parameter of DPSGD"),
    (dict(privacy=DPSGD(epsilon="8")), "'epsilon' parameter of DPSGD"),
    (dict(privacy=DPSGD(epsilon=2.0, delta=1.0)), "'delta' parameter of DPSGD"),
    (dict(privacy=DPSGD(epsilon=2.0, clip_norm=0.0)), "'clip_norm' parameter of DPSGD"),
    (dict(privacy=8.0), "'privacy' parameter of FederatedSPDnetClassifier"),
])
def test_parameter_errors_are_named(spd, params, match):
    fed = _fed(**params)
    with pytest.raises(ValueError, match=match):
        fed.fit(*spd)
    assert not hasattr(fed, "privacy_")


def test_check_params_applies_the_dp_rules():
    with pytest.raises(ValueError, match="explicit validation split"):
        _fed(SPDnetClassifier(early_stopping=True), validation_fraction=0.2).check_params()
    _fed().check_params()
    _fed(SPDnetClassifier(), validation_fraction=0.2).check_params()  # resolved to no split


@pytest.mark.parametrize("scaling, resolved", [("auto", "trace"), ("trace", "trace"), (2.0, 2.0), (None, None)])
@pytest.mark.parametrize("early_stopping", ["auto", False])
def test_dp_defaults_resolve_to_private_choices(spd, scaling, resolved, early_stopping):
    """The package defaults (validation_fraction=0.1, scaling="auto") fit in DP mode: no
    site holds out validation data, and "auto" scaling becomes per-matrix "trace"."""
    est = SPDnetClassifier(hidden_dims=(3,), batch_size=8, scaling=scaling, early_stopping=early_stopping)
    fed = FederatedSPDnetClassifier(est, n_rounds=1, local_epochs=1, n_clients=4, partition="stratified",
                                    privacy=DPSGD(epsilon=2.0, delta=1e-3), random_state=0).fit(*spd)
    assert fed.validation_fraction == 0.1 and fed.estimator.scaling == scaling  # the parameters are untouched
    assert fed.privacy_["resolved"] == {"validation_fraction": 0.0, "scaling": resolved}
    assert fed.global_estimator_.scaling == resolved
    assert fed.engine_.n_val == [0, 0, 0, 0] and fed.engine_.input_statistic is None


@pytest.fixture(scope="module")
def public_model(spd):
    """A model fitted on other ("public") data of the same task, scaling fitted by "auto"."""
    X, y = make_spd_dataset(80, N_CHANNELS, 2, seed=5)
    return SPDnetClassifier(hidden_dims=(3,), max_epochs=3, batch_size=16, random_state=0).fit(X, y)


@pytest.mark.parametrize("trainable", ["all", "head"])
def test_dp_fine_tuning_from_a_public_model(spd, public_model, trainable, tmp_path):
    """init= is allowed in DP mode: the public weights and scaling cost nothing; with
    trainable="head" the BiMap stays the public one and only the head is privatized."""
    before = public_model.get_parameters()
    fed = _fed(SPDnetClassifier(hidden_dims=(3,), batch_size=8, lr=0.05, trainable=trainable),
               init=public_model).fit(*spd)
    after = fed.global_estimator_.get_parameters()
    assert fed.privacy_["resolved"]["scaling"] == public_model.scale_ == fed.global_estimator_.scale_
    # frozen: only the rounding of the aggregation (the mean of equal arrays, its polar factor)
    frozen = np.allclose(after["bimaps.0.weight"], before["bimaps.0.weight"], rtol=0, atol=1e-12)
    assert frozen == (trainable == "head")
    assert not np.array_equal(after["head.weight"], before["head.weight"])
    head = before["head.weight"].size + before["head.bias"].size
    bimap = before["bimaps.0.weight"].size
    assert fed.privacy_["privatized_parameters"] == head + (bimap if trainable == "all" else 0)
    for name, value in public_model.get_parameters().items():  # the public model is only read
        np.testing.assert_array_equal(value, before[name])
    assert max(s["epsilon"] for s in fed.privacy_["sites"]) <= 2.0
    save_estimator(fed, tmp_path / "fed.skfedspd")
    loaded = load_estimator(tmp_path / "fed.skfedspd")
    assert loaded.init is None and loaded.privacy_ == fed.privacy_  # init's scaling recorded, not recomputed


def test_flower_backend_fine_tunes_from_init_as_the_local_one(spd, public_model):
    """The Flower server starts from init too (its weights and scaling), with the DP
    defaults resolved as on the local backend: the same model bit for bit."""
    pytest.importorskip("flwr")
    est = SPDnetClassifier(hidden_dims=(3,), batch_size=8, lr=0.05, trainable="head")
    local = _fed(est, n_rounds=2, init=public_model, validation_fraction=0.1).fit(*spd)
    flower = _fed(est, n_rounds=2, init=public_model, validation_fraction=0.1, backend="flower").fit(*spd)
    for name, value in local.engine_.global_params.items():
        np.testing.assert_array_equal(value, flower.engine_.global_params[name], err_msg=name, strict=True)
    assert local.privacy_ == flower.privacy_ and flower.engine_.n_val == [0, 0, 0, 0]


# ------------------------------------------------------------------ re-centring under DP


@pytest.fixture(scope="module")
def subjects_data():
    """Eight subjects of 20 trials, each with its own scale (what re-centring removes)."""
    X, y = make_spd_dataset(160, N_CHANNELS, 2, seed=3)
    groups = np.repeat(np.arange(8), 20)
    return X * np.repeat(np.geomspace(0.2, 20.0, 8), 20)[:, None, None], y, groups


@pytest.fixture(scope="module")
def public_domain_model():
    X, y = make_spd_dataset(60, N_CHANNELS, 2, seed=4)
    return SPDnetClassifier(hidden_dims=(3,), batchnorm="domain", max_epochs=3, random_state=0).fit(
        X, y, groups=np.repeat(np.arange(3), 20))


def _domain_fed(public, **kwargs):
    est = SPDnetClassifier(hidden_dims=(3,), batchnorm="domain", batch_size=8, lr=0.01)
    params = dict(init=public, n_clients=5, partition=None, groups_per_client=2, domains="group", n_rounds=3,
                  privacy=DPSGD(epsilon=4.0, delta=1e-3))
    return _fed(est, **{**params, **kwargs})


def test_domain_batch_norm_releases_each_sites_means_once_within_the_budget(subjects_data, public_domain_model,
                                                                             monkeypatch):
    import skfedspd.dp_sgd as dp_sgd

    calls = []
    release = dp_sgd.release_domain_means
    monkeypatch.setattr(dp_sgd, "release_domain_means", lambda *a, **k: calls.append(k) or release(*a, **k))
    X, y, groups = subjects_data
    fed = _domain_fed(public_domain_model).fit(X, y, groups=groups)
    report = fed.privacy_
    assert len(calls) == 4 and len(fed.history_) == 3  # four sites, three rounds: one release per site
    released = report["domain_release"]
    assert released["layers"] == 1 and released["share"] == 0.25 and released["clip"] == 2.0
    assert released["epsilon"] == pytest.approx(1.0, rel=0.02) and released["epsilon"] <= 1.0
    assert calls[0]["noise_multiplier"] == released["noise_multiplier"] > 0
    for site in report["sites"]:
        assert released["epsilon"] < site["epsilon"] <= 4.0
        assert site["training_epsilon"] < site["epsilon"]
    # the clip reference is the public model's prior, and the released model starts new domains from it
    reference = np.asarray(calls[0]["references"][0])
    from pyriemann.utils.base import logm

    np.testing.assert_allclose(reference, logm(public_domain_model.domain_prior_[0]), atol=1e-12)
    np.testing.assert_allclose(fed.global_estimator_.domain_prior_[0], public_domain_model.domain_prior_[0],
                               rtol=1e-10)


def test_a_dp_domain_model_re_centres_a_new_subject_by_its_own_trials(subjects_data, public_domain_model):
    X, y, groups = subjects_data
    fed = _domain_fed(public_domain_model).fit(X[groups < 6], y[groups < 6], groups=groups[groups < 6])
    new = groups == 7
    fed.global_estimator_.set_params(domain_adaptation=DomainAdaptation(prior_weight=1e-12))  # the subject's own trials alone
    whole = fed.predict_proba(X[new])  # the whole recording: one domain, its own means
    shifted = fed.predict_proba(1e3 * X[new])  # a whole-subject scale: re-centring removes it
    np.testing.assert_allclose(whole, shifted, atol=1e-6)
    fed.adapt(X[new][:10], domain="s7")  # online: the domain's running means
    assert fed.predict(X[new][10:], domain="s7").shape == (10,)


def test_local_and_flower_backends_give_the_same_dp_domain_model(subjects_data, public_domain_model):
    pytest.importorskip("flwr")
    X, y, groups = subjects_data
    local = _domain_fed(public_domain_model, n_rounds=2).fit(X, y, groups=groups)
    flower = _domain_fed(public_domain_model, n_rounds=2, backend="flower").fit(X, y, groups=groups)
    for name, value in local.engine_.global_params.items():
        np.testing.assert_array_equal(value, flower.engine_.global_params[name], err_msg=name, strict=True)
    assert local.privacy_ == flower.privacy_


def test_spd_batch_norm_stays_refused_in_dp_mode(subjects_data):
    X, y, groups = subjects_data
    with pytest.raises(ValueError, match="batchnorm='spd'.*mixes the samples"):
        _fed(SPDnetClassifier(batchnorm="spd")).fit(X, y)
