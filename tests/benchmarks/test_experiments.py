"""Tests of the accuracy-experiment harness (``benchmarks.experiments``): its paired
reporting, its shared pipelines and the experiments folded into it (no EEG)."""

import numpy as np
import pandas as pd
import pytest
from sklearn import config_context
from sklearn.utils.metadata_routing import get_routing_for_object

from benchmarks.experiments import (client_optimizer_state, defaults, online, pipelines, report, table_one_ablation,
                                   unseen_subjects)
from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.datasets import SENSORIMOTOR_CHANNELS


def test_paired_differences():
    mean, se, wins, n = report.paired([80.0, 70.0, 90.0], [70.0, 70.0, 80.0])
    assert (wins, n) == (2, 3) and mean == pytest.approx(20 / 3)
    assert se == pytest.approx(np.std([10, 0, 10], ddof=1) / np.sqrt(3))
    assert (report.format_paired([80.0, 70.0, 90.0], [70.0, 70.0, 80.0])
            == "+6.7 ± 3.3 (higher on 2 of 3, Wilcoxon p = 0.500, level)")
    assert np.isnan(report.paired([1.0], [0.0])[1])  # no standard error from one pair


def test_subject_scores_are_per_pipeline_and_subject():
    predictions = pd.DataFrame({
        "pipeline": ["A"] * 8 + ["B"] * 4,
        "subject": [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1],
        "y": [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1],
        "pred": [0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1],
        "score": [0.1, 0.6, 0.7, 0.9, 0.2, 0.3, 0.8, 0.9, 0.9, 0.8, 0.2, 0.1],
    })
    scores = report.subject_scores(predictions)
    assert scores[["pipeline", "subject"]].values.tolist() == [["A", 1], ["A", 2], ["B", 1]]
    # balanced accuracy: (1/2 + 2/2) / 2 on A/1, perfect on A/2, chance on B/1 (one class predicted)
    assert scores["balanced_accuracy"].tolist() == pytest.approx([75.0, 100.0, 50.0])
    assert scores["roc_auc"].tolist() == pytest.approx([100.0, 100.0, 0.0])


def test_paired_lines_pair_the_subjects_both_pipelines_have():
    scores = pd.DataFrame([{"pipeline": p, "subject": s, "balanced_accuracy": v, "roc_auc": v}
                           for p, values in {"A": {1: 80, 2: 70, 3: 90}, "B": {1: 70, 2: 70}}.items()
                           for s, v in values.items()])
    (line,) = report.paired_lines(scores, [("A", "B"), ("A", "missing")])
    assert line == ("- A − B: balanced accuracy +5.0 ± 5.0 (higher on 1 of 2, Wilcoxon p = 1.000, level); "
                    "ROC-AUC +5.0 ± 5.0 (higher on 1 of 2, Wilcoxon p = 1.000, level)")


def test_the_subject_domains_ablation_differs_from_the_default_in_domains_only(spd_domains):
    """The ablation keeps the default federation's clients of two subjects, each subject a domain."""
    X, y, subjects = spd_domains(n_groups=4, n_per_group=15)
    model = pipelines.ABLATIONS["FedSPDnet+dBN, subject domains"](0).set_params(n_rounds=1, local_epochs=1)
    default = pipelines.PIPELINES["FedSPDnet+dBN"](0)
    assert model.domains == "group" and default.domains == "client"
    def settings(fed):
        return {k: v for k, v in fed.get_params(deep=False).items()
                if k not in ("domains", "n_rounds", "local_epochs", "estimator")}, fed.estimator.get_params()

    assert settings(model) == settings(default)
    pipelines.fit(model, X, y, subjects + 5)
    assert model.n_clients_ == 2


def test_pipelines_that_adapt_or_federate_get_the_groups():
    """``fit`` routes groups only where the routing asks for them, as MOABB does."""
    with config_context(enable_metadata_routing=True):
        consumes = {name: bool(get_routing_for_object(factory(0)).consumes("fit", {"groups"}))
                    for name, factory in pipelines.PIPELINES.items()}
    assert consumes == {name: name != "TS+LR" for name in pipelines.PIPELINES}


@pytest.mark.parametrize("name, setting, momentum", [
    ("kept client Adam", "full", 0.0), ("server momentum, kept client Adam", "half+sm", 0.9),
    ("protocol + server momentum", "full+sm", 0.9),
])
def test_table_one_ablation_client_state_variants(name, setting, momentum):
    """The client-state variants change the clients' optimizer state only: server momentum as
    in the protocol's "+sm" cells, the paper's fresh client Adam unless the variant keeps it."""
    from benchmarks.experiments.table_one_protocols import PROFILES, PROTOCOLS
    from benchmarks.experiments.table_one_runner import build

    cells, params = table_one_ablation.VARIANTS[name]
    (cell,) = [c for c in cells if c.setting == setting]
    clf = build(PROTOCOLS["PhysionetMI"], cell, 0, PROFILES["full"], params)
    assert clf.client_optimizer_state == ("keep" if "kept" in name else "reset")
    assert (0.0 if clf.server_optimizer is None else clf.server_optimizer.momentum) == momentum
    assert clf.local_epochs == 2


@pytest.mark.parametrize("argv, message", [
    (["table-one-ablation", "--variants", "E=16 local epochs"], "invalid choice: 'E=16 local epochs'"),
    (["client-optimizer-state", "--protocol", "both", "--subjects", "1"], "invalid choice: 'both'"),
    (["no-such-experiment"], "invalid choice: 'no-such-experiment'"),
])
def test_the_command_line_refuses_unknown_names(argv, message, capsys):
    from benchmarks.experiments.__main__ import main

    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", ["table-one", "flower-table-one", "moabb", "moabb-transfer", "online", "table-one-ablation",
                                  "learner-ablation", "learner-leads"])
def test_every_experiment_has_its_help(name, capsys):
    from benchmarks.experiments.__main__ import EXPERIMENTS, main

    with pytest.raises(SystemExit) as stop:
        main([name, "--help"])
    help_text = capsys.readouterr().out
    assert stop.value.code == 0 and f"python -m benchmarks.experiments {name}" in help_text
    assert EXPERIMENTS[name].__doc__.split("\n")[0] in help_text


@pytest.mark.parametrize("key, clients_per_round, aggregation", [
    ("full/spdnet-projavg", None, "projavg"), ("half/spdnet-rlavg", 0.5, "rlavg")])
def test_flower_table_one_builds_the_cell_of_its_key(key, clients_per_round, aggregation):
    from benchmarks.experiments.flower_table_one import build
    from benchmarks.experiments.table_one_protocols import PROTOCOLS, federated_schedule

    fed = build(PROTOCOLS["PhysionetMI"], key, 3, 7)
    assert (fed.clients_per_round, fed.aggregation, fed.n_rounds, fed.random_state) == (
        clients_per_round, aggregation, 7, 3)
    assert fed.schedule == federated_schedule(clients_per_round or 1.0)["schedule"]


def test_domain_bn_rows_need_the_cross_protocol():
    from benchmarks.experiments.__main__ import main

    with pytest.raises(SystemExit, match="use --protocol cross"):
        main(["client-optimizer-state", "--protocol", "within", "--models", "domain-bn", "--subjects", "1"])


@pytest.mark.parametrize("row, state, partition", [
    ("FedSPDnet, fresh client Adam (reset)", "reset", "stratified"),
    ("FedSPDnet, kept client Adam (keep)", "keep", "stratified"),
])
def test_client_optimizer_state_rows_differ_in_the_client_state_only(row, state, partition):
    model = client_optimizer_state.MODELS["plain"][row](1)
    assert isinstance(model, FederatedSPDnetClassifier) and model.estimator is None
    assert (model.client_optimizer_state, model.clients.partition, model.clients.groups_per_client) == (state, partition, 1)
    assert model.get_params()["random_state"] == 0


@pytest.mark.parametrize("k, batch", [(3, 21), (12, 5)])
def test_domain_bn_rows_share_the_pooled_batch(k, batch):
    """The local batch of the ablation row is the pooled batch's share of one of K subjects."""
    models = client_optimizer_state.MODELS["domain-bn"]
    local = models["FedSPDnet + domain BN, keep, local batch 64 / K"](k).estimator
    assert (local.batchnorm, local.batch_size) == ("domain", batch)
    assert models["FedSPDnet + domain BN, reset"](k).client_optimizer_state == "reset"
    assert models["SPDnet + domain BN, whole-subject statistics"](k).batch_size >= 10**6


@pytest.mark.parametrize("n, n_channels", [(36, 64), (144, 64), (720, 64), (36, 3), (500, 16)])
def test_the_recommended_rule_is_the_package_defaults(n, n_channels):
    """The ablation's recommended set, resolved at a training size, is what ``SPDnetClassifier()``
    does there: ``hidden_dims="auto"`` and a validation part only when it is large enough."""
    from skfedspd.validation import uses_validation
    from skfedspd.classifier import auto_hidden_dim

    rule = defaults.RECOMMENDED(n, n_channels, 2)
    package = SPDnetClassifier()
    assert rule["hidden_dims"] == (auto_hidden_dim(n_channels),)
    assert (rule["validation_fraction"] > 0) == uses_validation(n, 2, package.validation_fraction)
    assert (rule["lr"], rule["max_epochs"], package.validation_metric) == (package.lr, package.max_epochs, "loss")


def test_defaults_fold_applies_a_rule_on_the_starting_defaults(spd_domains):
    X, y, _ = spd_domains(n_groups=1, n_per_group=40)
    folds = defaults.stratified_folds(y)
    assert len(folds) == 5 and all(len(np.intersect1d(tr, te)) == 0 for tr, te in folds)
    tr, te = folds[0]
    record = defaults.fit_fold(X, y, tr, te, lambda n, c, k: {"max_epochs": 3, "hidden_dims": (4,)}, "loss", 1)
    assert record["params"] == {"max_epochs": 3, "hidden_dims": (4,)} and record["epochs"] == 3
    assert 0.0 <= record["auc"] <= 1.0 and 0.0 <= record["acc"] <= 1.0
    reference = defaults.fit_fold(X, y, tr, te, "ts-lr", None, 1)
    assert np.isnan(reference["epochs"]) and reference["params"] == {}


@pytest.mark.parametrize("params", [{}, {"memory": 3.0}, {"prior_weight": 4.0}, {"include_self": True}])
def test_online_conditions_score_every_trial_after_the_warmup_and_restore_the_model(spd_domains, params):
    """Every condition predicts the same trials; "none" stays at the prior whatever the
    ablation's parameters, and "0" (no trial seen) is "none" unless a trial's own matrix
    counts; the ablation's parameters come back after the block."""
    X, y, groups = spd_domains(n_groups=3, n_per_group=30)
    model = pipelines.fit(pipelines.PIPELINES["Recenter+TS+LR"](0), X[groups < 2], y[groups < 2], groups[groups < 2])
    with online.domain_params(model, **params) if params else online.nullcontext():
        proba, seconds = online.conditions("Recenter+TS+LR", model, X[groups == 2], warmup=20)
    after = {f"{kind} after {k}": 30 - k for k in online.ONLINE_AFTER for kind in ("online", "all")}
    assert set(proba) == {"none", "all", "online", *map(str, online.SEEN), *(f"{k} recent" for k in online.RECENT),
                          *after}
    assert all(p.shape == (after.get(c, 10),) for c, p in proba.items()) and seconds > 0
    np.testing.assert_array_equal(proba["online after 10"][10:], proba["online"])
    np.testing.assert_array_equal(proba["all after 10"][10:], proba["all"])
    assert model[0].domain_adaptation is None  # the ablation's settings are gone
    assert np.allclose(proba["0"], proba["none"], atol=1e-9) != params.get("include_self", False)
    lam, U = np.linalg.eigh(model[0].domain_prior_)
    inv_half = (U / np.sqrt(lam)) @ U.T  # re-centring by the prior alone
    prior_only = model[1:].predict_proba(inv_half @ X[groups == 2][20:] @ inv_half)[:, 1]
    np.testing.assert_allclose(proba["none"], prior_only, atol=1e-6)


@pytest.mark.parametrize("pipeline, kept", [
    ("SPDnet+dBN | 20 recent", True), ("Recenter+TS+LR | online after 5", True), ("TS+LR | none", True),
    ("SPDnet+dBN (memory 10) | online", True), ("FedSPDnet+dBN (itself included) | 1", True),
    ("SPDnet+dBN (prior weight 4) | 1 recent", True), ("SPDnet+dBN (memory 10) | 20", False),
    ("Recenter+TS+LR (itself included) | online after 10", False), ("SPDnet+dBN | online, seed ensemble", True),
    ("FedSPDnet+dBN | all after 10, seed ensemble", True), ("SPDnet+dBN | 5 recent, seed ensemble", False),
    ("SPDnet+dBN (memory 10) | online, seed ensemble", False)])
def test_the_online_record_keeps_every_condition_of_a_model_and_the_ablations_compared(pipeline, kept):
    assert online.recorded(pipeline) is kept


def test_drift_means_are_the_exact_means_of_the_chosen_trials(spd_domains):
    """The trial sets of the drift experiment: "10 before" ends at the warm-up, the
    scored-run trials come after it."""
    from pyriemann.geometry.mean import mean_riemann

    from benchmarks.experiments import drift

    X, _, _ = spd_domains(n_groups=1, n_per_group=30)
    got = drift.means(X, warmup=20, rng=np.random.default_rng(0))
    assert list(got) == drift.SETS
    for name, trials in [("first 10", X[:10]), ("10 before", X[10:20]), ("whole subject", X),
                         ("10 scored-run", X[20:])]:  # exactly 10 trials after the warm-up here
        np.testing.assert_allclose(got[name], mean_riemann(trials))


@pytest.mark.parametrize("spread, expected", [(0.1, 4.0), (1.0, 0.04)])
def test_empirical_bayes_weight_is_within_over_between_dispersion(spread, expected):
    """Diagonal matrices whose log-eigenvalues are a subject offset (variance spread² per
    coordinate) plus trial noise (variance 0.2² per coordinate): the weight is 0.04 / spread²."""
    from benchmarks.experiments import drift

    rng = np.random.default_rng(0)
    n_subjects, n_trials, n = 200, 40, 3
    offsets = rng.normal(0, spread, (n_subjects, 1, n))
    logs = offsets + rng.normal(0, 0.2, (n_subjects, n_trials, n))
    log_matrices = logs.reshape(-1, n)[:, :, None] * np.eye(n)  # log X of diagonal X
    groups = np.repeat(np.arange(n_subjects), n_trials)
    assert drift.empirical_bayes_weight(log_matrices, groups) == pytest.approx(expected, rel=0.2)


def test_unseen_subjects_reuses_a_saved_model_and_refits_the_others(spd_domains, tmp_path):
    """``--models``: a pipeline with a saved model predicts with it (and reports that run's
    fit time); one without is fitted."""
    from types import SimpleNamespace

    from benchmarks.experiments import unseen_subjects
    from skfedspd import save_estimator

    X, y, groups = spd_domains(n_groups=3, n_per_group=20)
    saved = pipelines.fit(pipelines.PIPELINES["SPDnet+dBN"](0).set_params(max_epochs=2), X, y, groups)
    (tmp_path / "models").mkdir()
    (tmp_path / "predictions").mkdir()
    save_estimator(saved, tmp_path / "models" / "SPDnet+dBN-fold0.skfedspd")
    pd.DataFrame({"fit_seconds": [12.5, 12.5]}).to_csv(tmp_path / "predictions" / "SPDnet+dBN-fold0.csv")
    args = SimpleNamespace(models=tmp_path)
    model, seconds = unseen_subjects.trained(args, "SPDnet+dBN", "SPDnet+dBN-fold0", 0, X, y, groups)
    assert seconds == 12.5 and model.get_params()["max_epochs"] == 2
    np.testing.assert_array_equal(model.predict_proba(X), saved.predict_proba(X))
    refitted, seconds = unseen_subjects.trained(args, "TS+LR", "TS+LR-fold0", 0, X, y, groups)
    assert seconds > 0 and hasattr(refitted, "classes_")


def test_unseen_subjects_trains_a_network_per_seed_and_a_classical_pipeline_once():
    from benchmarks.experiments import unseen_subjects

    assert unseen_subjects.runs("SPDnet+dBN", [0, 1, 2]) == [
        (0, "SPDnet+dBN-fold{k}"), (1, "SPDnet+dBN-fold{k}-seed1"), (2, "SPDnet+dBN-fold{k}-seed2")]
    assert unseen_subjects.runs("Recenter+TS+LR", [0, 1, 2]) == [(0, "Recenter+TS+LR-fold{k}")]


def test_unseen_subjects_averages_each_subjects_scores_over_the_training_seeds():
    from benchmarks.experiments import unseen_subjects

    y = [0, 0, 1, 1]
    rows = [("net", 0, [0, 0, 1, 1]), ("net", 1, [0, 1, 1, 1]), ("TS+LR", 0, [1, 1, 1, 1])]
    predictions = pd.concat([pd.DataFrame({"pipeline": name, "subject": 7, "seed": seed, "y": y, "pred": pred,
                                           "score": np.array(pred, dtype=float) + [0.1, 0.2, 0.3, 0.4]})
                             for name, seed, pred in rows], ignore_index=True)
    scores = unseen_subjects.seed_averaged_scores(predictions).set_index("pipeline")
    assert scores.loc["net", "balanced_accuracy"] == pytest.approx((100 + 75) / 2)
    assert scores.loc["TS+LR", "balanced_accuracy"] == pytest.approx(50)
    assert list(scores.index) == ["net", "TS+LR"] and (scores["subject"] == 7).all()


def test_a_seed_ensemble_averages_each_trials_probability_over_the_seeds():
    from benchmarks.experiments import unseen_subjects

    y = [0, 0, 1, 1]
    rows = [("net", 0, [0.2, 0.6, 0.7, 0.4]), ("net", 1, [0.4, 0.6, 0.5, 0.8]), ("TS+LR", 0, [0.1, 0.2, 0.9, 0.8])]
    predictions = pd.concat([pd.DataFrame({"pipeline": name, "subject": 7, "trial": range(4), "seed": seed, "y": y,
                                           "score": score, "pred": (np.array(score) > 0.5).astype(int)})
                             for name, seed, score in rows], ignore_index=True)
    ensemble = unseen_subjects.seed_ensembles(predictions)
    assert list(ensemble["pipeline"].unique()) == ["net, seed ensemble"]  # one seed: no ensemble
    assert np.allclose(ensemble["score"], [0.3, 0.6, 0.6, 0.6]) and list(ensemble["pred"]) == [0, 1, 1, 1]
    assert list(ensemble["y"]) == y
    assert unseen_subjects.one_training(["net", "TS+LR", "net, seed ensemble"], {"net": [0, 1]}) == [
        "net-seed-ensemble"]


def test_the_unseen_subjects_record_names_its_networks_as_one_training_seed_each():
    names = ["TS+LR", "Recenter+TS+LR", "FedRecenter+TS+LR", "SPDnet+dBN", "FedSPDnet+dBN"]
    seeds_of = {"SPDnet+dBN": [0], "FedSPDnet+dBN": [0]}
    assert unseen_subjects.one_training(names, seeds_of) == ["fedspdnet-dbn", "spdnet-dbn"]


def test_training_subjects_fit_the_same_drawn_subjects_for_every_pipeline(spd_domains):
    X, y, groups = spd_domains(n_groups=4, n_per_group=10)
    tsr = pipelines.ABLATIONS["Recenter+TS+LR, 8 training subjects"](0).set_params(n_subjects=2).fit(X, y, groups)
    net = pipelines.ABLATIONS["SPDnet+dBN, 8 training subjects"](3).set_params(n_subjects=2)
    net.set_params(estimator__max_epochs=2).fit(X, y, groups)
    assert len(tsr.subjects_) == 2 and set(tsr.subjects_) == set(net.subjects_) <= set(groups)
    assert net.predict_proba(X).shape == (40, 2) and set(tsr.predict(X)) <= set(y)
    assert unseen_subjects.is_network(net) and not unseen_subjects.is_network(tsr)
    with pytest.raises(ValueError, match="n_subjects=8"):
        pipelines.ABLATIONS["Recenter+TS+LR, 8 training subjects"](0).fit(X, y, groups)


def test_the_study_rows_are_networks_named_one_training_seed_when_trained_once():
    assert all(unseen_subjects.is_network(factory(0)) for factory in pipelines.STUDIES.values())
    seeds_of = {"study model": [0], "SPDnet+dBN": [0, 1]}
    names = ["TS+LR", "study model", "SPDnet+dBN", "SPDnet+dBN, seed ensemble"]
    assert unseen_subjects.one_training(names, seeds_of) == ["spdnet-dbn-seed-ensemble", "study-model"]


def test_online_scores_average_a_networks_seeds_and_add_their_ensemble():
    y = [0, 0, 1, 1]
    rows = [("SPDnet+dBN | online", 0, [0.2, 0.6, 0.7, 0.4]), ("SPDnet+dBN | online", 1, [0.4, 0.2, 0.5, 0.8]),
            ("Recenter+TS+LR | online", 0, [0.1, 0.2, 0.9, 0.8])]
    predictions = pd.concat([pd.DataFrame({"pipeline": name, "subject": 3, "seed": seed, "trial": range(4), "y": y,
                                           "score": score, "pred": (np.array(score) > 0.5).astype(int)})
                             for name, seed, score in rows], ignore_index=True)
    scores = online.seed_scores(predictions).set_index("pipeline")["balanced_accuracy"]
    assert scores["SPDnet+dBN | online"] == pytest.approx((50 + 75) / 2)  # the mean of the two seeds
    assert scores["SPDnet+dBN | online, seed ensemble"] == pytest.approx(100)  # mean probabilities 0.3 0.4 0.6 0.6
    assert scores["Recenter+TS+LR | online"] == pytest.approx(100) and len(scores) == 3
    # a report of predictions saved before seeds were recorded: one seed, no ensemble
    assert len(online.seed_scores(predictions[predictions["seed"] == 0].drop(columns="seed"))) == 2


def test_the_filter_bank_recentres_each_band_by_the_routed_subjects(spd_domains):
    from pyriemann.tangentspace import TangentSpace

    from skfedspd import Recenter

    X, y, groups = spd_domains(n_groups=3, n_per_group=20, n_channels=4)
    bands = np.stack([X, X + 0.5 * np.eye(4), 2 * X, X @ X], 1)
    bank = pipelines.fit(pipelines.BANDED["Recenter+TS+LR, 4 sub-bands (OAS)"](0), bands, y, groups)
    features = bank[0].transform(bands[groups == 1])
    n = 4 * 5 // 2
    assert features.shape == (20, 4 * n)
    alone = pipelines.fit(pipelines.make_pipeline(Recenter(), TangentSpace()), bands[:, 2], y, groups)
    np.testing.assert_allclose(features[:, 2 * n:3 * n], alone.transform(bands[groups == 1, 2]), atol=1e-8)
    assert bank.predict(bands[:5]).shape == (5,)


def test_band_covariances_from_another_band_set_are_refused(tmp_path):
    from benchmarks.experiments.data import load_left_right_bands

    np.savez(tmp_path / "physionet-lr-bands-oas-8-12-1.npz", X=np.zeros((2, 1, 3, 3)), y=np.zeros(2),
             bands=np.array([[8, 30]]))
    with pytest.raises(ValueError, match="cached bands of subject 1 .* remove .*physionet-lr-bands-oas-8-12-1.npz"):
        load_left_right_bands([1], bands=[(8, 12)], cache=tmp_path)


def test_each_band_set_has_its_own_cache_files(tmp_path):
    from benchmarks.experiments.data import BROAD, SUB_BANDS, load_left_right_bands

    for bands, stem in ((SUB_BANDS, "physionet-lr-bands-oas"), (BROAD, "physionet-lr-bands-oas-8-32")):
        n = len(bands)
        np.savez(tmp_path / f"{stem}-1.npz", X=np.full((2, n, 3, 3), n), y=np.zeros(2), bands=np.array(bands))
        X, _, groups = load_left_right_bands([1], bands=bands, cache=tmp_path)
        assert X.shape == (2, n, 3, 3) and (X == n).all() and (groups == 1).all()


def test_the_shrunk_baseline_takes_the_broad_band_oas_covariances():
    from benchmarks.experiments.pipelines import BANDED, SHRUNK
    from benchmarks.experiments.unseen_subjects import input_kind

    assert [input_kind(name) for name in SHRUNK] == ["oas"]
    assert {input_kind(name) for name in BANDED} == {"sub-bands"} and input_kind("Recenter+TS+LR") == "sample"


def test_the_sensorimotor_pipelines_take_the_16_channel_covariances():
    from benchmarks.experiments.pipelines import SENSORIMOTOR, SENSORIMOTOR_SHRUNK
    from benchmarks.experiments.unseen_subjects import OTHER_INPUTS, input_kind

    assert {input_kind(name) for name in SENSORIMOTOR} == {"sensorimotor"}
    assert [input_kind(name) for name in SENSORIMOTOR_SHRUNK] == ["sensorimotor-oas"]
    assert [OTHER_INPUTS[kind][2:] for kind in ("sensorimotor", "sensorimotor-oas")] == [
        ("scm", SENSORIMOTOR_CHANNELS), ("oas", SENSORIMOTOR_CHANNELS)]


def test_a_channel_set_has_its_own_cache_files(tmp_path, monkeypatch):
    from benchmarks.experiments import data

    asked = []

    def trials(subjects, n_classes, n_times, channels=None):
        asked.append(channels)
        return np.random.default_rng(0).standard_normal((4, len(channels), 480)), np.array([0, 1, 0, 1]), None

    monkeypatch.setattr(data, "physionet_trials", trials)
    X, _, _ = data.load_left_right_bands([1], bands=data.BROAD, estimator="scm", cache=tmp_path,
                                         channels=SENSORIMOTOR_CHANNELS)
    assert X.shape == (4, 1, 16, 16) and asked == [SENSORIMOTOR_CHANNELS]
    assert [f.name for f in tmp_path.iterdir()] == ["physionet-lr-bands-scm-8-32-16ch-1.npz"]
