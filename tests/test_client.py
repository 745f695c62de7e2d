"""Tests for ``skfedspd.client`` and the messages it sends (``skfedspd.messages``): a
``Site`` splits and declares its data, trains from a broadcast and validates a model."""

import numpy as np
import pytest

from conftest import make_spd_dataset
from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.client import Site
from skfedspd.messages import EvalReply, SetupReply, TrainReply
from skfedspd.run import FederatedRun

SETUP = {"seed": 0, "validation_fraction": 0.2, "classes": None, "private": False, "ready": False}


def _sites(n_sites=2, n=30, weights=None, estimator=None):
    X, y = make_spd_dataset(n_matrices=n_sites * n, n_channels=4, n_classes=2)
    run = FederatedRun(FederatedSPDnetClassifier(estimator or SPDnetClassifier(hidden_dims=(2,)), random_state=0),
                       validation_fraction=0.2)
    parts = np.array_split(np.arange(len(y)), n_sites)
    sites = [Site(cid, X[idx], y[idx], None if weights is None else weights[idx], None, run.site_setup(),
                  run.estimator) for cid, idx in enumerate(parts)]
    engine = run.start([site.reply for site in sites])
    for site in sites:
        site.prepare(run.site_setup())
    return sites, engine


def test_a_site_declares_its_split_labels_and_statistic():
    X, y = make_spd_dataset(n_matrices=20, n_channels=4, n_classes=2)
    site = Site(3, X, y, None, None, SETUP, SPDnetClassifier())
    reply = site.reply
    assert isinstance(reply, SetupReply)
    assert (reply.client_id, reply.shape, reply.labels) == (3, [4, 4], [0, 1])
    assert reply.n_train + reply.n_val == 20 and reply.n_val == len(site.val) == 4
    assert sorted(np.concatenate([site.train, site.val]).tolist()) == list(range(20))
    assert reply.weight is None and np.isfinite(reply.statistic)
    assert site.est is None  # built once the server has read every declaration


def test_a_site_with_agreed_classes_declares_no_labels_and_refuses_others():
    X, y = make_spd_dataset(n_matrices=20, n_channels=4, n_classes=2)
    assert Site(0, X, y, None, None, {**SETUP, "classes": [0, 1]}, SPDnetClassifier()).reply.labels is None
    with pytest.raises(ValueError, match=r"labels \[1\] that are not in the agreed classes \[0\]"):
        Site(0, X, y, None, None, {**SETUP, "classes": [0]}, SPDnetClassifier())


def test_a_site_whose_weights_are_all_zero_is_named():
    X, y = make_spd_dataset(n_matrices=20, n_channels=4, n_classes=2)
    with pytest.raises(ValueError, match="client 5: sample_weight sums to 0"):
        Site(5, X, y, np.zeros(20), None, SETUP, SPDnetClassifier())


def test_a_private_site_sends_no_statistic_and_refuses_sample_weights():
    X, y = make_spd_dataset(n_matrices=20, n_channels=4, n_classes=2)
    assert Site(0, X, y, None, None, {**SETUP, "private": True}, SPDnetClassifier()).reply.statistic is None
    with pytest.raises(ValueError, match="sample_weight"):
        Site(0, X, y, np.ones(20), None, {**SETUP, "private": True}, SPDnetClassifier())


def test_train_and_validate_replies_carry_every_array_and_their_sizes():
    sites, engine = _sites()
    site = sites[1]
    reply = site.train_update(engine.global_params, None, seed=1, lr=1e-2, n_epochs=1)
    assert isinstance(reply, TrainReply)
    assert set(reply.params) == set(site.est.parameter_kinds())
    assert reply.n_examples == len(site.train) and reply.weight is None and reply.n_skipped == 0
    assert any(not np.allclose(reply.params[k], engine.global_params[k]) for k in reply.params)
    evaluation = site.validate(reply.params)
    assert isinstance(evaluation, EvalReply) and evaluation.n_examples == len(site.val)
    assert np.isfinite(evaluation.loss) and 0.0 <= evaluation.f1 <= 1.0


def test_the_same_seed_trains_the_same_update():
    sites, engine = _sites()
    first = sites[0].train_update(engine.global_params, None, seed=7, lr=1e-2, n_epochs=1)
    again = sites[0].train_update(engine.global_params, None, seed=7, lr=1e-2, n_epochs=1)
    for name, value in first.params.items():
        np.testing.assert_array_equal(value, again.params[name])


def test_a_weighted_site_declares_and_replies_its_weight_sum():
    weights = np.repeat([1.0, 3.0], 30)
    sites, engine = _sites(weights=weights)
    assert sites[1].reply.weight == pytest.approx(3.0 * len(sites[1].train))
    reply = sites[1].train_update(engine.global_params, None, seed=1, lr=1e-2, n_epochs=1)
    assert reply.weight == pytest.approx(3.0 * len(sites[1].train))
