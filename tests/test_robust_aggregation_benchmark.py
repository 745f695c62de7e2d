"""The fault-injection harness's faults (``benchmarks/robust_aggregation.py``): what each does to
a site's data or update, on small synthetic arrays (no EEG, no fitting)."""

import numpy as np
import pytest

from benchmarks.robust_aggregation import MAX_UPDATE_NORM, CorruptedUpdates, inject_data_fault
from skfedspd.aggregation import projavg
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
