"""The robust-aggregation experiment's pieces (``python -m benchmarks.experiments
robust-aggregation``): what each fault does to a site's data or update, on small synthetic
arrays (no EEG, no fitting); the scores (honest clients' subjects, faulty clients' subjects),
the diagnosis and the record on hand-made fits; the root set's draw."""

import argparse
import json

import numpy as np
import pytest

from benchmarks.experiments import robust_aggregation as experiment
from benchmarks.experiments.robust_aggregation import (
    MAX_UPDATE_NORM,
    ROOT_SIZE,
    client_split,
    corrupt_update,
    draw_root_set,
    flagged,
    hostile_clients,
    inject_data_fault,
    named,
    plan,
    score,
)
from benchmarks.records.store import read_record
from skfedspd.aggregation import FLTrust
from skfedspd.engine import FederatedEngine
from skfedspd.messages import TrainReply
from skfedspd.datasets import make_spd_classification
from skfedspd.stiefel import lift, random_stiefel

KINDS = {"W": "stiefel", "b": "euclidean", "m": "local"}


def _params(seed):
    return {"W": random_stiefel(6, 3, rng=seed), "b": np.full(3, float(seed)), "m": np.eye(2)}


def test_reversed_update_points_the_other_way():
    previous = _params(0)
    client = _params(1)
    out = corrupt_update(client, previous, KINDS, "reversed")
    np.testing.assert_allclose(out["b"] - previous["b"], -(client["b"] - previous["b"]))
    step, reversed_step = lift(previous["W"], client["W"]), lift(previous["W"], out["W"])
    assert float(np.sum(step * reversed_step)) < 0  # the tangent step turned around
    np.testing.assert_allclose(out["W"].T @ out["W"], np.eye(3), atol=1e-10)
    assert out["m"] is client["m"]  # local arrays never leave a client: untouched


def test_scaled_update_stays_inside_the_bound():
    previous, client = _params(0), _params(1)
    out = corrupt_update(client, previous, KINDS, "scaled")
    step = out["b"] - previous["b"]
    assert np.linalg.norm(step) == pytest.approx(0.99 * MAX_UPDATE_NORM * (1 + np.linalg.norm(previous["b"])))
    assert np.allclose(step / np.linalg.norm(step), (client["b"] - previous["b"]) / np.linalg.norm(client["b"]
                                                                                                  - previous["b"]))


@pytest.mark.parametrize("fault", ["reversed", "scaled"])
def test_hostile_clients_reach_the_engine_corrupted_and_only_within_the_block(fault):
    """The server checks, aggregates and measures the corrupted reply of the chosen client only."""
    kinds = {"W": "stiefel", "b": "euclidean"}
    initial = {"W": random_stiefel(6, 3, rng=0), "b": np.zeros(3)}

    def run(hostile):
        engine = FederatedEngine(initial, kinds, n_train=[10, 10, 10], n_val=[2, 2, 2], seed=0, lr=0.01)
        replies = [TrainReply({"W": random_stiefel(6, 3, rng=c + 1), "b": np.full(3, 0.1 * (c + 1))}, 0.5, 0, 10)
                   for c in range(3)]
        with hostile_clients(fault, hostile):
            return engine.aggregate(0, [0, 1, 2], replies)

    original = FederatedEngine.aggregate
    honest, attacked = run([]), run([2])
    assert attacked["client_distance"][2] > honest["client_distance"][2]
    assert FederatedEngine.aggregate is original  # restored after the block


@pytest.mark.parametrize("fault", ["labels", "channels", "noise"])
def test_data_faults_change_the_site_only(fault):
    X, y = make_spd_classification(n_matrices=20, n_channels=4, n_classes=2, seed=0)
    rows = np.arange(5)
    Xf, yf = inject_data_fault(fault, X, y, rows, np.random.default_rng(0))
    np.testing.assert_array_equal(Xf[5:], X[5:])
    np.testing.assert_array_equal(yf[5:], y[5:])
    if fault == "labels":
        assert np.all(yf[rows] != y[rows]) and np.array_equal(X, Xf)
    else:
        assert not np.allclose(Xf[rows], X[rows]) and np.array_equal(y, yf)
        assert np.all(np.linalg.eigvalsh(Xf[rows]) > 0)  # still SPD
    if fault == "channels":  # a permutation keeps each matrix's spectrum
        np.testing.assert_allclose(np.linalg.eigvalsh(Xf[rows]), np.linalg.eigvalsh(X[rows]))


def _fit(rule, fault, n_faulty, seed, correct, trust, n_clients=20):
    """A fit: two test trials (one per class) per client, the first ``correct[client]`` right."""
    client = np.repeat(np.arange(n_clients), 2)
    y_test = np.tile([0, 1], n_clients)
    pred = np.where(np.tile([0, 1], n_clients) < np.repeat(correct, 2), y_test, 1 - y_test)
    # three rounds in which each client lies 1 / trust times as far from the aggregate as a trust-1 client
    distance = None if trust is None else [[1 / t for t in trust]] * 3
    return {"setting": "left-right", "n_clients": n_clients, "rule": rule, "fault": fault, "n_faulty": n_faulty,
            "seed": seed, "client": client.tolist(), "y_test": y_test.tolist(), "pred": pred.tolist(),
            "client_distance": distance, "round_trust": None if trust is None or rule == "projavg" else [trust] * 3,
            "best_round": 2, "val_f1": [0.5, 0.6, 0.55], "cpu_seconds": 1.0}


def test_score_scores_the_chosen_clients_subjects_only():
    fit = _fit("projavg", "none", 0, 0, [2] * 4 + [0] * 16, [1.0] * 20)
    assert score(fit, range(4)) == 100.0 and score(fit, range(4, 20)) == 0.0  # balanced accuracy (%)
    assert score(fit, range(2, 6)) == pytest.approx(50.0)


def test_named_and_flagged_read_the_trust_over_the_fit():
    trust = [0.1, 0.3, 0.2, 0.6] + [0.7] + [1.0] * 15  # the median client's 1: flagged below 1 / 1.5
    fit = _fit("fltrust", "labels", 4, 0, [2] * 20, trust)
    assert named(fit, 4) and flagged(fit, range(4)) == 4 and flagged(fit, range(4, 20)) == 0
    tie = _fit("fltrust", "labels", 4, 0, [2] * 20, [0.4] * 4 + [0.4] + [1.0] * 15)
    assert not named(tie, 4)  # an honest client as little trusted as a faulty one: not named


def test_fit_trust_is_the_engines_over_the_rounds_the_fit_keeps():
    fit = _fit("fltrust-gate", "labels", 2, 0, [2] * 4, [0.5, 1.0, 1.0, 1.0], n_clients=4)
    np.testing.assert_allclose(experiment.fit_trust(fit), [0.5, 1.0, 1.0, 1.0])
    assert experiment.fit_trust(_fit("projavg", "dropped", 2, 0, [2] * 4, None, n_clients=4)) is None


def test_ts_lr_reference_is_scored_on_the_same_test_trials_as_the_federation():
    X, y = make_spd_classification(n_matrices=80, n_channels=4, n_classes=2, seed=0)
    data = (X, y, np.repeat(np.arange(4), 20))
    fit = experiment.fit_one(data, "ts-lr", "none", 0, 0, rounds=3)
    assert fit["n_clients"] == 2 and "client_distance" not in fit and "best_round" not in fit
    assert len(fit["pred"]) == len(fit["y_test"]) == len(fit["client"]) and set(fit["client"]) == {0, 1}
    assert 0 <= score(fit, range(2)) <= 100


def test_table_one_setting_scores_macro_f1_in_its_own_folder_and_record():
    fit = _fit("projavg", "none", 0, 0, [2, 1] * 4, [1.0] * 8, n_clients=8)
    fit["pred"] = [0] * 16  # one class predicted throughout: balanced accuracy 50 %, macro-F1 lower
    assert score(fit, range(8)) == pytest.approx(50.0)
    fit["setting"] = "table-one"
    assert score(fit, range(8)) == pytest.approx(100 * (2 / 3) / 2)  # F1 2/3 for class 0, 0 for class 1
    path = experiment.fit_path("out", "projavg", "none", 0, 0, 150, 128, "table-one")
    assert path.parent.name == "table-one" and experiment.fit_path("out", "projavg", "none", 0, 0, 80, 1).parent.name == "out"
    assert experiment.SETTINGS["table-one"].record_name(2) == "robust-aggregation-tableone-f2"
    assert experiment.SETTINGS["left-right"].record_name(4) == "robust-aggregation-f4"


def test_plan_fits_each_rule_without_fault_and_the_dropped_reference_with_projavg_only():
    runs = plan(["projavg", "fltrust"], ["labels", "dropped"], 4, [0, 1])
    assert ("projavg", "none", 0, 0) in runs and ("fltrust", "labels", 4, 1) in runs
    assert ("projavg", "dropped", 4, 0) in runs and ("fltrust", "dropped", 4, 0) not in runs
    assert len(runs) == 2 * (2 + 2 + 1)
    with_reference = plan(["projavg", "ts-lr"], ["labels", "dropped"], 4, [0])
    assert ("ts-lr", "none", 0, 0) in with_reference and not any(r == "ts-lr" and f != "none"
                                                                 for r, f, _, _ in with_reference)


def test_record_pairs_the_honest_subjects_with_fault_free_projavg(tmp_path, monkeypatch):
    """The record of hand-made fits: per-seed scores of each row, the diagnosis as facts."""
    monkeypatch.setattr(experiment, "RECORDS", tmp_path)
    monkeypatch.setattr(experiment, "costs", lambda root_size: {"reference_step_ms": "12"})
    args = argparse.Namespace(setting="left-right", seeds=[0, 1], rounds=3, faulty=[4], faults=["labels"],
                              rules=["projavg", "fltrust"], root_size=16, out=tmp_path / "fits",
                              report_only=True)
    args.out.mkdir()
    honest_trust, suspects = [1.0] * 20, [0.1, 0.2, 0.3, 0.2] + [1.2] * 16
    fits = [_fit("projavg", "none", 0, s, [2] * 20, honest_trust) for s in (0, 1)]
    fits += [_fit("projavg", "labels", 4, s, [0] * 4 + [2] * 16, honest_trust) for s in (0, 1)]
    fits += [_fit("fltrust", "none", 0, s, [2] * 20, honest_trust if s else [0.4] + [1.0] * 19) for s in (0, 1)]
    fits += [_fit("fltrust", "labels", 4, s, [0] * 4 + [2] * (15 + s) + [1] * (1 - s), suspects if s else
                  honest_trust) for s in (0, 1)]
    for fit in fits:
        path = experiment.fit_path(args.out, fit["rule"], fit["fault"], fit["n_faulty"], fit["seed"], 3, 16)
        path.write_text(json.dumps(fit))
    experiment.record(args, 4, 12.5)
    record = read_record("robust-aggregation-f4", folder=tmp_path)
    assert record["reference"] == "projavg/none" and record["paired_by"] == "seed" and record["wall_seconds"] == 12.5
    assert record["command"].endswith("--root-size 16 --report-only --record")  # what it ran: no fit
    rows = record["rows"]
    assert rows["projavg/labels"]["scores"]["honest"] == {"0": 100.0, "1": 100.0}
    assert rows["projavg/labels"]["scores"]["faulty"] == {"0": 0.0, "1": 0.0}
    assert rows["fltrust/labels"]["scores"]["honest"]["0"] == pytest.approx(100 * (15 + 0.5) / 16)
    facts = record["facts"]
    assert facts["named/fltrust/labels"] == "1 of 2" and facts["false_alarms/fltrust/none"] == "1 of 40"
    assert facts["honest_flagged/fltrust/labels"] == "0 of 32" and facts["faulty_flagged/fltrust/labels"] == "4 of 8"
    assert facts["kept/projavg/none"] == "100.0 %" and facts["named/projavg/labels"] == "0 of 2"
    assert facts["named_all/fltrust"] == "1 of 2 (50 %)" and facts["false_alarm_rate/fltrust"] == "1 of 40 (2 %)"
    # the replaced diagnosis, the mean effective weight, on the same fits (ProjAvg has none)
    assert facts["named_all_by_weight/fltrust"] == "1 of 2 (50 %)"
    assert facts["false_alarm_rate_by_weight/fltrust"] == "1 of 40 (2 %)" and "named_all_by_weight/projavg" not in facts
    assert facts["distance_curves"]["projavg/labels"] == [[1.0] * 20]  # the 5-round means of seed 0
    assert "fltrust/labels" not in facts["distance_curves"]  # the figure's rules only
    experiment.figure(record, tmp_path / "trust.png")
    assert (tmp_path / "trust.png").stat().st_size > 0


def test_client_split_holds_out_each_clients_own_share():
    y = np.tile([0, 1], 40)
    subjects = np.repeat(np.arange(8), 10)
    train, test = client_split(y, subjects, seed=0)
    assert len(set(train) & set(test)) == 0 and len(train) + len(test) == 80
    for pair in range(4):  # each client of 2 subjects holds out 3 of its 20 trials
        assert np.isin(subjects[test], [2 * pair, 2 * pair + 1]).sum() == 3


def test_root_set_is_a_seeded_stratified_draw():
    X, y = make_spd_classification(n_matrices=400, n_channels=4, n_classes=2, seed=0)
    root = draw_root_set(X, y, seed=1)
    assert len(root[1]) == ROOT_SIZE and abs(np.mean(root[1]) - np.mean(y)) < 0.02
    np.testing.assert_array_equal(draw_root_set(X, y, seed=1)[0], root[0])
    assert not np.array_equal(draw_root_set(X, y, seed=2)[0], root[0])


def test_a_reversed_update_is_what_the_reference_disowns():
    """FLTrust sees the corrupted update: the reversed site is the one the reference disowns."""
    previous = _params(0)
    clients = [{**_params(s), "b": previous["b"] + 0.1 * s} for s in (1, 2, 3)]
    clients[2] = corrupt_update(clients[2], previous, KINDS, "reversed")
    reference = {**_params(4), "b": previous["b"] + 0.2}
    rule = FLTrust(np.stack([np.eye(2)] * 2), [0, 1])
    agreement = rule.agreement(clients, reference, previous, KINDS)
    _, effective = rule.aggregate(clients, np.full(3, 1 / 3), previous, KINDS, reference=reference)
    assert agreement[2] < 0 < min(agreement[:2]) and effective[2] == 0 and effective[:2].sum() == pytest.approx(1)


def test_costs_time_the_rule_and_the_reference_step():
    costs = experiment.costs(8, reps=2)
    assert set(costs) == {"aggregation_ms/projavg", "aggregation_ms/fltrust", "aggregation_ms/fltrust-gate",
                          "reference_step_ms"}
    assert all(float(value) > 0 for value in costs.values())
