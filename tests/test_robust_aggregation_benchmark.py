"""The fault-injection harness's faults (``benchmarks/robust_aggregation.py``): what each does to
a site's data or update, on small synthetic arrays (no EEG, no fitting); the restated
protocol's scores (honest sites' subjects against fault-free ProjAvg, faulty sites' subjects
apart, the diagnosis) on hand-made records; the left/right protocol's root set."""

import numpy as np
import pytest

from benchmarks.robust_aggregation import (
    MAX_UPDATE_NORM,
    ROOT_SIZE,
    CorruptedUpdates,
    draw_root_set,
    inject_data_fault,
    restated_report,
    subject_score,
)
from skfedspd.aggregation import FLTrust, projavg
from skfedspd.datasets import make_spd_classification
from skfedspd.stiefel import lift, random_stiefel

KINDS = {"W": "stiefel", "b": "euclidean", "m": "local"}


def _params(seed):
    return {"W": random_stiefel(6, 3, rng=seed), "b": np.full(3, float(seed)), "m": np.eye(2)}


def test_reversed_update_points_the_other_way():
    previous = _params(0)
    client = _params(1)
    out = CorruptedUpdates("projavg", "reversed", [0]).corrupt(client, previous, KINDS)
    np.testing.assert_allclose(out["b"] - previous["b"], -(client["b"] - previous["b"]))
    step, reversed_step = lift(previous["W"], client["W"]), lift(previous["W"], out["W"])
    assert float(np.sum(step * reversed_step)) < 0  # the tangent step turned around
    np.testing.assert_allclose(out["W"].T @ out["W"], np.eye(3), atol=1e-10)
    assert out["m"] is client["m"]  # local arrays never leave a client: untouched


def test_scaled_update_stays_inside_the_bound():
    previous, client = _params(0), _params(1)
    out = CorruptedUpdates("projavg", "scaled", [0]).corrupt(client, previous, KINDS)
    step = out["b"] - previous["b"]
    assert np.linalg.norm(step) == pytest.approx(0.99 * MAX_UPDATE_NORM * (1 + np.linalg.norm(previous["b"])))
    assert np.allclose(step / np.linalg.norm(step), (client["b"] - previous["b"]) / np.linalg.norm(client["b"]
                                                                                                  - previous["b"]))


def test_only_the_chosen_clients_are_corrupted():
    previous = _params(0)
    clients = [_params(s) for s in (1, 2, 3)]
    weights = np.full(3, 1 / 3)
    honest = projavg(clients, weights, previous, KINDS)
    np.testing.assert_allclose(CorruptedUpdates("projavg", "reversed", [])(clients, weights, previous, KINDS)["b"],
                               honest["b"])
    assert not np.allclose(CorruptedUpdates("projavg", "reversed", [2])(clients, weights, previous, KINDS)["b"],
                           honest["b"])


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


def _fit_record(rule, fault, n_faulty, seed, correct, trust, n_classes=2):
    """A fit's record: one test trial of each class per site of 8, the first ``correct[site]`` right."""
    site = np.repeat(np.arange(8), n_classes)
    y_test = np.tile(np.arange(n_classes), 8)
    pred = np.where(np.tile(np.arange(n_classes), 8) < np.repeat(correct, n_classes), y_test, (y_test + 1) % n_classes)
    return {"rule": rule, "fault": fault, "n_faulty": n_faulty, "seed": seed, "site": site.tolist(),
            "y_test": y_test.tolist(), "pred": pred.tolist(), "trust": trust}


@pytest.mark.parametrize("n_classes", [2, 4])  # balanced accuracy, macro-F1
def test_subject_score_scores_the_chosen_sites_only(n_classes):
    record = _fit_record("projavg", "none", 0, 0, [n_classes] * 4 + [0] * 4, [1.0] * 8, n_classes=n_classes)
    assert subject_score(record, range(4)) == 1.0 and subject_score(record, range(4, 8)) == 0.0
    assert subject_score(record, range(2, 6)) == pytest.approx(0.5)


def test_restated_report_pairs_honest_subjects_and_names_the_faulty_sites():
    honest_trust, suspects = [1.0] * 8, [0.0, 0.1] + [1.2] * 6
    records = [_fit_record("projavg", "none", 0, seed, [2] * 8, honest_trust) for seed in (0, 1)]
    records += [_fit_record("fltrust", "none", 0, seed, [2] * 8, [0.4] + [1.1] * 7 if seed else honest_trust)
                for seed in (0, 1)]
    # the faulty sites' own subjects lose, the honest ones keep all (seed 0) or lose one site (seed 1)
    records += [_fit_record("fltrust", "labels", 2, seed, [0, 0] + [2] * (5 + seed) + [1] * (1 - seed),
                            suspects if seed else honest_trust) for seed in (0, 1)]
    text = restated_report(records, ["projavg", "fltrust"], ["labels"], 2)
    rows = {tuple(line.split(" | ")[:2]): line for line in text.splitlines() if line.startswith("| ")}
    assert rows[("| projavg", "none")].endswith("| 100.0 | +0.0 ± 0.0 | 100.0% | 100.0 | false alarms 0/2 |")
    assert rows[("| fltrust", "none")].endswith("| false alarms 1/2 |")
    labels = rows[("| fltrust", "labels")].split(" | ")
    assert labels[2] == "2" and labels[6] == "0.0" and labels[7] == "1/2 |"  # seed 0's equal trusts name nobody
    assert float(labels[4].split(" ± ")[0]) < 0 and 0.9 < float(labels[5].rstrip("%")) / 100 < 1


def test_root_set_is_a_seeded_stratified_draw_of_the_public_corpus():
    X, y = make_spd_classification(n_matrices=200, n_channels=4, n_classes=2, seed=0)
    root = draw_root_set((X, y), seed=1)
    assert len(root[1]) == ROOT_SIZE and abs(np.mean(root[1]) - np.mean(y)) < 0.02
    np.testing.assert_array_equal(draw_root_set((X, y), seed=1)[0], root[0])
    assert not np.array_equal(draw_root_set((X, y), seed=2)[0], root[0])


def test_corrupted_updates_reach_a_rule_with_a_reference():
    """FLTrust behind the corruption: the reversed site is the one the reference disowns."""
    previous = _params(0)
    clients = [{**_params(s), "b": previous["b"] + 0.1 * s} for s in (1, 2, 3)]
    reference = {**_params(4), "b": previous["b"] + 0.2}
    rule = CorruptedUpdates(FLTrust(np.stack([np.eye(2)] * 2), [0, 1]), "reversed", [2])
    assert rule.needs_reference and not CorruptedUpdates("projavg", "reversed", [2]).needs_reference
    assert rule.X is rule.rule.X and rule.y is rule.rule.y  # the root set the run trains the reference on
    agreement = rule.agreement(clients, reference, previous, KINDS)
    _, effective = rule.aggregate(clients, np.full(3, 1 / 3), previous, KINDS, reference=reference)
    assert agreement[2] < 0 < min(agreement[:2]) and effective[2] == 0 and effective[:2].sum() == pytest.approx(1)
