"""Tests for ``skfedspd.federated``: ``FederatedSPDnetClassifier``, clients, partitions,
failure policy, checkpoints (crafted files included), atomic fits, grad mode.

Tiny SPD problems (6 channels, ``hidden_dims=(3,)``, a few rounds of one local epoch); most
failing fits stop before any training. One test uses joblib workers (``n_jobs=2``), whose
first start takes 10-25 s.
"""

import copy
import os
import pickle
import re
import warnings

import joblib
import numpy as np
import pytest
import sklearn
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.metrics import get_scorer
from sklearn.model_selection import GridSearchCV, GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.utils.validation import check_is_fitted

from conftest import make_eeg_timeseries, make_spd_dataset
from conftest import count_local_updates as _counting_local_update, small_data as _data, small_estimator as _estimator, small_federation as _fed, without_time as _without_time  # noqa: E501
from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.aggregation import FLTrust, Krum, TrimmedMean, projavg
from skfedspd.clients import partition_indices
from skfedspd.batchnorm import DomainBatch
from skfedspd.nn import SPDNet
from skfedspd.persistence import load_estimator, save_estimator
from skfedspd.run import held_out_fraction, resolved_settings
from skfedspd.server_optimizer import ServerMomentum
from skfedspd.training import RoundSchedule
from skfedspd.stiefel import orthonormality_error

N_CHANNELS = 6
HISTORY_KEYS = {"round", "clients", "n_samples", "failed_clients", "train_loss", "val_loss", "val_f1",
                "orthonormality", "lr", "skipped_batches", "wall_time", "client_distance", "effective_weights",
                "downweighted_clients", "client_agreement"}


def _groups(n, n_groups):
    """Group labels, each group holding every class (labels of the data are interleaved)."""
    return np.repeat(np.arange(n_groups), int(np.ceil(n / n_groups)))[:n]


@pytest.fixture(scope="module")
def fitted():
    X, y = _data()
    return _fed(n_rounds=4).fit(X, y), X, y


class RecordingRule:
    """A custom aggregation: ProjAvg, recording what it receives and returns."""

    def __init__(self):
        self.calls = []

    def __call__(self, client_params, weights, previous, kinds):
        out = projavg(client_params, weights, previous, kinds)
        self.calls.append({
            "client_params": [{n: a.copy() for n, a in p.items()} for p in client_params],
            "weights": np.array(weights, copy=True),
            "previous": {n: a.copy() for n, a in previous.items()},
            "kinds": dict(kinds),
            "out": {n: a.copy() for n, a in out.items()},
        })
        return out


# ---------------------------------------------------------------------------------------------
# Basic estimator API
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("labels", ["int", "str", "offset"])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_fit_predict_proba_score(labels, n_classes):
    X, codes = _data(n_classes=n_classes)
    names = {"int": np.arange(n_classes), "str": np.array(["feet", "left", "right"][:n_classes]),
             "offset": np.arange(n_classes) * 10 + 7}[labels]
    y = names[codes]
    clf = _fed()
    assert clf.fit(X, y) is clf
    np.testing.assert_array_equal(clf.classes_, names)
    assert clf.n_features_in_ == N_CHANNELS
    pred = clf.predict(X)
    assert pred.shape == (len(X),) and set(pred) <= set(names)
    proba = clf.predict_proba(X)
    assert proba.shape == (len(X), n_classes)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(clf.classes_[proba.argmax(axis=1)], pred)
    scores = clf.decision_function(X)
    expected = (len(X),) if n_classes == 2 else (len(X), n_classes)  # sklearn's binary convention
    assert scores.shape == expected and np.isfinite(scores).all()
    score = clf.score(X, y)
    assert 0.0 <= score <= 1.0
    assert score == pytest.approx(np.mean(pred == y))


def test_learns_separable_problem():
    X, y = _data(n=90, seed=1)
    clf = _fed(n_rounds=5).fit(X, y)
    assert clf.score(X, y) >= 0.8


def test_classes_global_when_client_lacks_classes():
    X, y = _data(n=60)
    groups = np.where(y == 2, 2, np.arange(60) % 2)  # clients 0 and 1 never see class 2
    clf = _fed().fit(X, y, groups=groups)
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    np.testing.assert_array_equal(clf.global_estimator_.classes_, [0, 1, 2])
    assert clf.predict_proba(X).shape == (60, 3)


def test_history(fitted):
    clf, X, y = fitted
    assert len(clf.history_) == 4
    for t, record in enumerate(clf.history_):
        assert HISTORY_KEYS <= set(record)
        assert record["round"] == t
        assert record["clients"] == [0, 1, 2]
        assert record["failed_clients"] == []
        assert len(record["n_samples"]) == 3 and all(n > 0 for n in record["n_samples"])
        assert sum(record["n_samples"]) < len(X)  # validation parts stay on the clients
        assert np.isfinite(record["train_loss"]) and np.isfinite(record["val_loss"])
        assert 0.0 <= record["val_f1"] <= 1.0
        assert record["lr"] == 0.05
        assert record["wall_time"] >= 0.0
        assert set(record["orthonormality"]) == {"bimaps.0.weight"}
        assert all(err <= 1e-10 for err in record["orthonormality"].values())
    assert 0 <= clf.best_round_ < 4


@pytest.mark.parametrize("hidden_dims", [(3,), (5, 3), (4, 4, 2)])
def test_orthonormality_every_stiefel_weight(hidden_dims):
    X, y = _data()
    clf = _fed(_estimator(hidden_dims=hidden_dims), n_rounds=2).fit(X, y)
    names = {f"bimaps.{i}.weight" for i in range(len(hidden_dims))}
    for record in clf.history_:
        assert set(record["orthonormality"]) == names
        assert max(record["orthonormality"].values()) <= 1e-10
    for bimap in clf.global_estimator_.module_.bimaps:
        assert orthonormality_error(bimap.weight.detach()) <= 1e-10


def test_global_estimator(fitted):
    clf, X, y = fitted
    est = clf.global_estimator_
    assert isinstance(est, SPDnetClassifier)
    check_is_fitted(est)
    assert est is not clf.estimator
    assert not hasattr(clf.estimator, "module_")  # the parameter is left untouched
    np.testing.assert_array_equal(est.predict(X), clf.predict(X))
    np.testing.assert_array_equal(est.decision_function(X), clf.decision_function(X))
    np.testing.assert_array_equal(est.classes_, clf.classes_)


def test_default_estimator():
    X, y = make_spd_dataset(30, 20, 2)  # the default SPDnetClassifier: hidden_dims="auto", 20 -> 8
    clf = FederatedSPDnetClassifier(n_rounds=1, local_epochs=1, n_clients=2, random_state=0).fit(X, y)
    assert isinstance(clf.global_estimator_, SPDnetClassifier)
    assert clf.global_estimator_.hidden_dims == "auto"
    assert clf.global_estimator_.get_parameters()["bimaps.0.weight"].shape == (20, 8)
    assert clf.estimator is None


def test_nested_params():
    clf = _fed()
    params = clf.get_params()
    assert params["estimator__lr"] == 0.05
    assert params["estimator__hidden_dims"] == (3,)
    assert clf.set_params(estimator__lr=0.01, n_rounds=2) is clf
    assert clf.estimator.lr == 0.01 and clf.n_rounds == 2
    X, y = _data(n=30)
    clf.fit(X, y)
    assert [r["lr"] for r in clf.history_] == [0.01, 0.01]


def test_clone(fitted):
    clf, _, _ = fitted
    cloned = clone(clf)
    assert not hasattr(cloned, "global_estimator_")
    assert cloned.estimator is not clf.estimator
    a, b = clf.get_params(deep=True), cloned.get_params(deep=True)
    assert set(a) == set(b)
    for key in a:
        if key != "estimator":
            assert a[key] == b[key], key


@pytest.mark.parametrize("method", ["pickle", "joblib"])
def test_persistence(fitted, method, tmp_path):
    clf, X, y = fitted
    if method == "pickle":
        loaded = pickle.loads(pickle.dumps(clf))
    else:
        joblib.dump(clf, tmp_path / "clf.joblib")
        loaded = joblib.load(tmp_path / "clf.joblib")
    np.testing.assert_array_equal(loaded.decision_function(X), clf.decision_function(X))
    np.testing.assert_array_equal(loaded.predict(X), clf.predict(X))
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))
    assert loaded.history_ == clf.history_


def test_save_estimator_round_trip(fitted, tmp_path):
    """skfedspd's own data-only persistence (no pickle) keeps the model, the history and
    the engine state that warm_start continues."""
    clf, X, y = fitted
    save_estimator(clf, tmp_path / "fed.skfedspd")
    loaded = load_estimator(tmp_path / "fed.skfedspd")
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))
    assert loaded.history_ == clf.history_
    assert loaded.best_round_ == clf.best_round_ and loaded.client_groups_ == clf.client_groups_
    for name, value in clf.engine_.global_params.items():
        np.testing.assert_array_equal(loaded.engine_.global_params[name], value, strict=True)
    continued = loaded.set_params(warm_start=True, n_rounds=1).fit(X, y)
    reference = copy.deepcopy(clf).set_params(warm_start=True, n_rounds=1).fit(X, y)
    np.testing.assert_array_equal(continued.decision_function(X), reference.decision_function(X))
    assert _without_time(continued.history_) == _without_time(reference.history_)
@pytest.mark.parametrize("method", ["predict", "predict_proba", "decision_function", "score"])
def test_not_fitted(method):
    X, y = _data(n=6)
    clf = _fed()
    assert "__sklearn_is_fitted__" in vars(FederatedSPDnetClassifier)
    assert not clf.__sklearn_is_fitted__()
    with pytest.raises(NotFittedError):
        getattr(clf, method)(*((X, y) if method == "score" else (X,)))


def test_sklearn_is_fitted(fitted):
    clf, _, _ = fitted
    assert clf.__sklearn_is_fitted__()
    check_is_fitted(clf)


def test_tags():
    tags = _fed().__sklearn_tags__()
    assert tags.input_tags.three_d_array and not tags.input_tags.two_d_array
    assert tags.estimator_type == "classifier"


def test_verbose():
    X, y = _data(n=30)
    clf = _fed(n_rounds=2, verbose=True).fit(X, y)
    assert len(clf.history_) == 2


def test_predict_rejects_wrong_channels(fitted):
    clf, _, _ = fitted
    X, _ = make_spd_dataset(4, N_CHANNELS + 1, 2)
    with pytest.raises(ValueError, match="fitted on"):
        clf.predict(X)


def test_binary_roc_auc_scorer():
    X, y = _data(n=30, n_classes=2)
    clf = _fed(n_rounds=1).fit(X, y)
    assert clf.decision_function(X).shape == (30,)
    assert 0.0 <= get_scorer("roc_auc")(clf, X, y) <= 1.0


# ---------------------------------------------------------------------------------------------
# Parameter checking
def test_agreed_classes():
    """``classes``: the model's classes are the agreed set (a class nobody holds included);
    labels outside it are named; the agreed set equal to the labels changes nothing."""
    X, y = _data(n=60)
    labels = np.array(["a", "c", "d"])[y]  # "b" is agreed, held by no client
    clf = _fed(classes=["d", "c", "b", "a"]).fit(X, labels)
    assert clf.classes_.tolist() == clf.global_estimator_.classes_.tolist() == ["a", "b", "c", "d"]
    assert clf.predict_proba(X).shape == (60, 4)
    same = _fed(classes=np.array(["a", "c", "d"])).fit(X, labels)
    np.testing.assert_array_equal(same.decision_function(X), _fed().fit(X, labels).decision_function(X))
    with pytest.raises(ValueError, match=r"y contains labels not in classes: \['d'\]"):
        _fed(classes=["a", "b", "c"]).fit(X, labels)
    warm = _fed(n_rounds=1, warm_start=True, classes=["a", "c", "d"]).fit(X, labels)
    with pytest.raises(ValueError, match=r"classes=\['a', 'c', 'd', 'e'\] differ from the classes \['a', 'c', 'd'\]"):
        warm.set_params(classes=["a", "c", "d", "e"]).fit(X, labels)


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [
    {"n_rounds": 0}, {"n_rounds": 1.5}, {"local_epochs": 0}, {"groups_per_client": 0},
    {"n_clients": 0}, {"n_clients": 100, "partition": "contiguous"}, {"on_client_error": "ignore"},
    {"validation_fraction": 1.0}, {"validation_fraction": -0.1}, {"aggregation": "mean"},
    {"weighting": "equal"}, {"partition": "random"}, {"clients_per_round": 0},
    {"clients_per_round": -1}, {"clients_per_round": 4}, {"clients_per_round": 0.0},
    {"clients_per_round": 1.5}, {"clients_per_round": "half"}, {"clients_per_round": True},
    {"clients_per_round": False}, {"clients_per_round": np.nan},
    {"estimator": SPDnetClassifier(lr=-1.0)}, {"estimator": SPDnetClassifier(hidden_dims=(8,))},
    {"estimator": "SPDnetClassifier"}, {"estimator": object()},
    {"patience": 0}, {"patience": -1}, {"patience": 2.5}, {"lr_patience": -1}, {"lr_factor": 0.0},
    {"lr_factor": -0.5}, {"lr_factor": 1.5}, {"lr_factor": np.nan}, {"alpha": 0.0}, {"alpha": np.nan},
    {"max_update_norm": 0.0}, {"max_update_norm": np.nan}, {"max_update_norm": -1.0},
    {"validation_fraction": np.nan}, {"n_rounds": np.nan}, {"backend": "ray"}, {"warm_start": "yes"},
    {"checkpoint_path": 3}, {"n_jobs": 1.5}, {"random_state": "seed"}, {"classes": 3}, {"classes": [0]},
])
def test_bad_params(params):
    X, y = _data(n=30)
    clf = _fed(**params)
    before = dict(vars(clf))
    with pytest.raises(ValueError):
        clf.fit(X, y)
    assert vars(clf).keys() == before.keys()  # nothing fitted is left behind


@pytest.mark.parametrize("groups", [np.zeros(29), np.zeros((30, 2))])
def test_bad_groups(groups):
    X, y = _data(n=30)
    with pytest.raises(ValueError, match="groups"):
        _fed().fit(X, y, groups=groups)


def test_groups_and_subjects():
    X, y = _data(n=30)
    g = _groups(30, 3)
    with pytest.raises(ValueError, match="differ"):
        _fed().fit(X, y, groups=g, subjects=g[::-1])
    clf = _fed(n_rounds=1).fit(X, y, groups=g, subjects=g.copy())
    assert clf.client_source_ == "groups"


def test_subjects_alias():
    X, y = _data(n=30)
    g = _groups(30, 3)
    a = _fed(n_rounds=2).fit(X, y, groups=g)
    b = _fed(n_rounds=2).fit(X, y, subjects=g)
    assert b.client_source_ == "groups" and b.client_groups_ == [(0,), (1,), (2,)]
    np.testing.assert_array_equal(a.decision_function(X), b.decision_function(X))


def test_single_class_rejected():
    X, _ = _data(n=30)
    with pytest.raises(ValueError, match="greater than one"):
        _fed().fit(X, np.zeros(30))


# ---------------------------------------------------------------------------------------------
# Clients: groups, partitions, participation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("groups_per_client, expected", [
    (1, [("a",), ("b",), ("c",), ("d",), ("e",), ("f",)]),
    (2, [("a", "b"), ("c", "d"), ("e", "f")]),
    (4, [("a", "b", "c", "d"), ("e", "f")]),
    (6, [("a", "b", "c", "d", "e", "f")]),
    (10, [("a", "b", "c", "d", "e", "f")]),
])
def test_groups_to_clients(groups_per_client, expected):
    X, y = _data(n=60)
    rng = np.random.default_rng(0)
    groups = np.array(list("fedcba"))[_groups(60, 6)]  # reverse order ...
    order = rng.permutation(60)  # ... and shuffled samples
    X, y, groups = X[order], y[order], groups[order]
    clf = _fed(n_rounds=1, groups_per_client=groups_per_client, validation_fraction=0.0)
    clf.fit(X, y, groups=groups)
    assert clf.client_source_ == "groups"
    assert clf.client_groups_ == expected
    assert clf.n_clients_ == len(expected)
    sizes = [int(np.isin(groups, chunk).sum()) for chunk in expected]
    assert clf.history_[0]["n_samples"] == sizes  # validation_fraction=0: all samples train


@pytest.mark.parametrize("partition", ["stratified", "contiguous", "dirichlet"])
@pytest.mark.parametrize("n_clients", [2, 3, 5])
def test_partition_fallback(partition, n_clients):
    X, y = _data(n=60)
    clf = _fed(n_rounds=1, n_clients=n_clients, partition=partition, alpha=50.0).fit(X, y)
    assert clf.client_source_ == f"partition:{partition}"
    assert clf.n_clients_ == n_clients
    assert clf.client_groups_ == [None] * n_clients
    assert clf.history_[0]["clients"] == list(range(n_clients))


def test_partition_fallback_warns_when_groups_were_probably_meant():
    X, y = _data(n=30)
    with pytest.warns(UserWarning, match="received no groups.*groups=subjects.*enable_metadata_routing.*"
                                         "partition='stratified'"):
        clf = _fed(n_rounds=1, partition=None).fit(X, y)
    assert clf.client_source_ == "partition:stratified"
    explicit = _fed(n_rounds=1, partition="stratified")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        explicit.fit(X, y)  # an explicit partition is silent ...
        _fed(n_rounds=1, partition=None).fit(X, y, groups=_groups(30, 3))  # ... and so are groups
        with sklearn.config_context(enable_metadata_routing=True):  # routing on: no groups was meant
            _fed(n_rounds=1, partition=None).fit(X, y)
    np.testing.assert_array_equal(clf.decision_function(X), explicit.decision_function(X))


def test_partition_stratified_clients_see_all_classes(monkeypatch):
    X, y = _data(n=60)
    calls = _counting_local_update(monkeypatch)
    _fed(n_rounds=1, n_clients=4, partition="stratified").fit(X, y)
    assert len(calls) == 4
    for call in calls:
        assert set(call["y"].tolist()) == {0, 1, 2}


@pytest.mark.parametrize("clients_per_round, expected", [
    (None, 5), (1, 1), (3, 3), (5, 5), (np.int64(2), 2), (0.5, 2), (0.2, 1), (0.1, 1), (1.0, 5), (0.99, 4),
])
def test_clients_per_round(clients_per_round, expected):
    X, y = _data(n=60)
    clf = _fed(n_rounds=4, n_clients=5, clients_per_round=clients_per_round).fit(X, y)
    selections = [r["clients"] for r in clf.history_]
    for selected in selections:
        assert len(selected) == expected
        assert selected == sorted(set(selected)) and set(selected) <= set(range(5))
    if 1 < expected < 5:
        assert len({tuple(s) for s in selections}) > 1  # sampled anew each round


def test_clients_per_round_with_groups():
    X, y = _data(n=60)
    clf = _fed(n_rounds=3, clients_per_round=0.5).fit(X, y, groups=_groups(60, 6))
    assert clf.n_clients_ == 6
    assert all(len(r["clients"]) == 3 for r in clf.history_)


@pytest.mark.parametrize("weighting", ["n_samples", "uniform"])
def test_weighting(weighting):
    X, y = _data(n=60)
    groups = np.repeat([0, 1, 2], [10, 20, 30])
    rule = RecordingRule()
    clf = _fed(n_rounds=2, aggregation=rule, weighting=weighting).fit(X, y, groups=groups)
    for call, record in zip(rule.calls, clf.history_):
        n = np.asarray(record["n_samples"], float)
        expected = n / n.sum() if weighting == "n_samples" else np.full(3, 1 / 3)
        np.testing.assert_allclose(call["weights"], expected, rtol=1e-15)


# ---------------------------------------------------------------------------------------------
# Reproducibility
# ---------------------------------------------------------------------------------------------


def test_reproducible_refit_and_seed_matters(fitted):
    clf, X, y = fitted
    again = clone(clf).fit(X, y)
    np.testing.assert_array_equal(again.decision_function(X), clf.decision_function(X))
    other = clone(clf).set_params(random_state=1).fit(X, y)
    assert not np.array_equal(other.decision_function(X), clf.decision_function(X))


def test_random_state_instance():
    X, y = _data(n=30)
    a = _fed(n_rounds=2, random_state=np.random.RandomState(3)).fit(X, y)
    b = _fed(n_rounds=2, random_state=np.random.RandomState(3)).fit(X, y)
    np.testing.assert_array_equal(a.decision_function(X), b.decision_function(X))


def test_global_torch_rng_untouched():
    X, y = _data(n=30)
    torch.manual_seed(1234)
    state = torch.random.get_rng_state().clone()
    np_state = np.random.get_state()[1].copy()
    _fed(n_rounds=2).fit(X, y)
    assert torch.equal(torch.random.get_rng_state(), state)
    np.testing.assert_array_equal(np.random.get_state()[1], np_state)


# ---------------------------------------------------------------------------------------------
# Awkward clients
# ---------------------------------------------------------------------------------------------


def _awkward_groups(y, case):
    """Groups over 60 interleaved samples with one awkward client (group 9)."""
    groups = np.arange(len(y)) % 3
    if case == "one_class":
        groups[np.flatnonzero(y == 0)[:8]] = 9
    elif case == "smaller_than_batch":
        groups[:5] = 9
    elif case == "single_sample":
        groups[0] = 9
    elif case == "all":
        groups[np.flatnonzero(y == 0)[:8]] = 7
        groups[np.flatnonzero(y == 1)[:5]] = 8
        groups[np.flatnonzero(y == 2)[0]] = 9
    return groups


@pytest.mark.parametrize("case", ["one_class", "smaller_than_batch", "single_sample", "all"])
@pytest.mark.parametrize("aggregation", ["projavg", "rlavg"])
def test_awkward_clients(case, aggregation):
    X, y = _data(n=60)
    groups = _awkward_groups(y, case)
    clf = _fed(_estimator(batch_size=16), n_rounds=2, aggregation=aggregation).fit(X, y, groups=groups)
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    assert clf.n_clients_ == len(np.unique(groups))
    for record in clf.history_:
        assert record["clients"] == list(range(clf.n_clients_)) and record["failed_clients"] == []
        assert max(record["orthonormality"].values()) <= 1e-10
        assert np.isfinite(record["train_loss"])
    if case == "single_sample":
        assert clf.history_[0]["n_samples"][-1] == 1
    assert np.isfinite(clf.decision_function(X)).all()
    assert clf.predict_proba(X).shape == (60, 3)


# ---------------------------------------------------------------------------------------------
# Client failures
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, 1, 2])
def test_on_client_error_skip(monkeypatch, bad):
    X, y = _data(n=60)
    _counting_local_update(monkeypatch, fail=lambda call: call % 3 == bad)
    rule = RecordingRule()
    with pytest.warns(RuntimeWarning, match=f"client {bad} left out"):
        clf = _fed(n_rounds=3, on_client_error="skip", aggregation=rule).fit(X, y)
    others = [i for i in range(3) if i != bad]
    for record, call in zip(clf.history_, rule.calls):
        assert [f["client"] for f in record["failed_clients"]] == [bad]
        assert record["failed_clients"][0]["stage"] == "train"
        assert "OSError: simulated failure" in record["failed_clients"][0]["reason"]
        assert record["clients"] == others
        assert len(record["n_samples"]) == 2
        assert len(call["client_params"]) == 2
        np.testing.assert_allclose(call["weights"].sum(), 1.0)
    assert len(clf.history_) == 3
    check_is_fitted(clf)


@pytest.mark.parametrize("bad", [0, 2])
def test_on_client_error_raise(monkeypatch, bad):
    X, y = _data(n=60)
    _counting_local_update(monkeypatch, fail=lambda call: call % 3 == bad)
    with pytest.raises(RuntimeError, match=f"client {bad} failed in round 0") as info:
        _fed(n_rounds=3).fit(X, y)
    assert isinstance(info.value.__cause__, OSError)


def test_on_client_error_skip_all_fail(monkeypatch):
    X, y = _data(n=60)
    _counting_local_update(monkeypatch, fail=lambda call: True)
    with pytest.raises(RuntimeError, match="client 0 failed in round 0 .every client failed."):
        _fed(on_client_error="skip").fit(X, y)


# ---------------------------------------------------------------------------------------------
# Aggregation rules
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("aggregation", ["projavg", "rlavg", "karcher", "geomedian", TrimmedMean(trim=1 / 3)])
def test_aggregation_rules(aggregation, fitted):
    reference, X, y = fitted
    clf = _fed(n_rounds=4, aggregation=aggregation).fit(X, y)
    assert all(max(r["orthonormality"].values()) <= 1e-10 for r in clf.history_)
    assert clf.score(X, y) >= 0.5
    W = clf.global_estimator_.module_.get_parameters()["bimaps.0.weight"]
    W_ref = reference.global_estimator_.module_.get_parameters()["bimaps.0.weight"]
    if aggregation == "projavg":
        np.testing.assert_array_equal(W, W_ref)
    else:
        assert not np.array_equal(W, W_ref)


def test_custom_aggregation_arguments():
    X, y = _data(n=60)
    rule = RecordingRule()
    clf = _fed(n_rounds=3, aggregation=rule).fit(X, y)
    kinds = clf.global_estimator_.module_.parameter_kinds()
    assert len(rule.calls) == 3
    for t, (call, record) in enumerate(zip(rule.calls, clf.history_)):
        assert call["kinds"] == dict(kinds)
        assert len(call["client_params"]) == len(record["clients"]) == 3
        for params in call["client_params"]:
            assert list(params) == list(kinds)
        assert call["weights"].ndim == 1
        np.testing.assert_allclose(call["weights"], np.asarray(record["n_samples"]) / sum(record["n_samples"]))
        assert set(call["previous"]) == {n for n, k in kinds.items() if k != "local"}
        if t > 0:  # the broadcast of round t is the aggregate of round t - 1
            for name, value in rule.calls[t - 1]["out"].items():
                np.testing.assert_array_equal(call["previous"][name], value)
    best = rule.calls[clf.best_round_]["out"]
    final = clf.global_estimator_.module_.get_parameters()
    for name, value in best.items():
        np.testing.assert_allclose(final[name], value, rtol=0, atol=1e-12)


def test_custom_aggregation_output_is_used():
    """A rule that ignores the clients keeps the initial global model."""
    X, y = _data(n=30)
    rule = RecordingRule()
    _fed(n_rounds=1, aggregation=rule).fit(X, y)
    initial = rule.calls[0]["previous"]
    frozen = _fed(n_rounds=3, aggregation=lambda c, w, prev, kinds: {n: a.copy() for n, a in prev.items()})
    frozen.fit(X, y)
    final = frozen.global_estimator_.module_.get_parameters()
    for name, value in initial.items():
        np.testing.assert_allclose(final[name], value, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# warm_start and checkpoints
# ---------------------------------------------------------------------------------------------


def test_warm_start_continues():
    X, y = _data(n=60)
    rule = RecordingRule()
    clf = _fed(n_rounds=2, warm_start=True, aggregation=rule)
    clf.fit(X, y)
    assert len(clf.history_) == 2
    clf.fit(X, y)
    assert [r["round"] for r in clf.history_] == [0, 1, 2, 3]
    assert len(rule.calls) == 4
    for name, value in rule.calls[1]["out"].items():  # round 2 starts from the last global model
        np.testing.assert_array_equal(rule.calls[2]["previous"][name], value)


def test_warm_start_equals_uninterrupted_with_fresh_client_optimizers():
    """A warm start continues the global model; the clients' optimizers start afresh (their
    state lasts one fit), so it equals an uninterrupted fit when they reset every round."""
    X, y = _data()
    reference = _fed(n_rounds=4, client_optimizer_state="reset").fit(X, y)
    clf = _fed(n_rounds=2, warm_start=True, client_optimizer_state="reset")
    clf.fit(X, y).fit(X, y)
    np.testing.assert_array_equal(clf.decision_function(X), reference.decision_function(X))
    assert [r["val_loss"] for r in clf.history_] == [r["val_loss"] for r in reference.history_]


def _recording_optimizer_states(monkeypatch):
    """Wrap ``local_update``: record each call's incoming optimizer state (None: not kept;
    else the step count of its first parameter, 0 when empty) and its seed."""
    original = SPDnetClassifier.local_update
    calls = []

    def wrapper(self, global_params, local_state, X, y, **kwargs):
        state = kwargs.get("optimizer_state")
        calls.append(None if state is None else float(state.get("0.step", 0)))
        return original(self, global_params, local_state, X, y, **kwargs)

    monkeypatch.setattr(SPDnetClassifier, "local_update", wrapper)
    return calls


def test_kept_optimizer_state_returns_to_its_own_client_only(monkeypatch):
    """(The parallel workers get and return the same states: test_reproducible_serial_and_parallel.)"""
    X, y = _data(n=60)
    calls = _recording_optimizer_states(monkeypatch)
    clf = _fed(n_rounds=4, clients_per_round=2, estimator=_estimator(batch_size=8)).fit(X, y)
    steps = -(-clf.engine_.n_train[0] // 8)  # minibatches per local epoch (equal clients)
    assert len(set(clf.engine_.n_train)) == 1
    rounds_so_far, expected = {}, []
    for record in clf.history_:
        for cid in record["clients"]:
            expected.append(float(steps * rounds_so_far.get(cid, 0)))
            rounds_so_far[cid] = rounds_so_far.get(cid, 0) + 1
    assert calls == expected and max(rounds_so_far.values()) > 1
    assert clf.engine_.client_optimizer_states == {}  # it ended with the fit
    arrays, _ = clf.fitted_state()
    assert not [k for k in arrays if "optimizer" in k]


def test_reset_passes_no_optimizer_state_and_keep_changes_the_model(monkeypatch, fitted):
    keep, X, y = fitted
    calls = _recording_optimizer_states(monkeypatch)
    reset = _fed(n_rounds=4, client_optimizer_state="reset").fit(X, y)
    assert calls == [None] * 12
    assert not np.array_equal(reset.decision_function(X), keep.decision_function(X))


def test_warm_start_starts_fresh_client_optimizers(monkeypatch):
    X, y = _data(n=30)
    clf = _fed(n_rounds=2, warm_start=True).fit(X, y)
    calls = _recording_optimizer_states(monkeypatch)
    clf.fit(X, y)
    assert calls[:3] == [0.0] * 3 and all(c > 0 for c in calls[3:])


def test_skipped_client_keeps_its_previous_optimizer_state(monkeypatch):
    """A reply refused under on_client_error="skip" leaves its client's kept state as it was."""
    X, y = _data(n=30)
    original = SPDnetClassifier.local_update
    calls = []

    def wrapper(self, global_params, local_state, X, y, **kwargs):
        calls.append(float(kwargs["optimizer_state"].get("0.step", 0)))
        params = original(self, global_params, local_state, X, y, **kwargs)
        if len(calls) == 4:  # round 1, client 0: a reply the engine refuses
            params[0]["head.bias"] = params[0]["head.bias"] * np.nan
        return params

    monkeypatch.setattr(SPDnetClassifier, "local_update", wrapper)
    with pytest.warns(RuntimeWarning, match="client 0 left out"):
        _fed(n_rounds=3, on_client_error="skip", estimator=_estimator(batch_size=64)).fit(X, y)
    assert calls[3] == 1.0 and calls[6] == 1.0  # round 2, client 0: still its round-0 state
    assert calls[7] == 2.0


def test_warm_start_false_restarts():
    X, y = _data(n=30)
    clf = _fed(n_rounds=2)
    first = clf.fit(X, y).decision_function(X)
    assert len(clf.fit(X, y).history_) == 2
    np.testing.assert_array_equal(clf.decision_function(X), first)


def test_warm_start_unknown_label():
    X, y = _data(n=30)
    clf = _fed(n_rounds=1, warm_start=True).fit(X, y)
    with pytest.raises(ValueError, match="not in classes"):
        clf.fit(X, np.where(y == 0, 5, y))


# ---------------------------------------------------------------------------------------------
# scikit-learn metadata routing
# ---------------------------------------------------------------------------------------------


class RecordingFederated(FederatedSPDnetClassifier):
    """Records what ``fit`` receives (class-level, so that clones share the record)."""

    records = []

    def fit(self, X, y, groups=None, subjects=None):
        super().fit(X, y, groups=groups, subjects=subjects)
        type(self).records.append({
            "n": len(X),
            "groups": None if groups is None else np.asarray(groups).copy(),
            "subjects": None if subjects is None else np.asarray(subjects).copy(),
            "client_source": self.client_source_,
            "client_groups": list(self.client_groups_),
        })
        return self


@pytest.fixture
def recorder():
    RecordingFederated.records = []
    yield RecordingFederated.records
    RecordingFederated.records = []


def _timeseries():
    X, y = make_eeg_timeseries(n_trials=48, n_channels=N_CHANNELS, n_times=64, n_classes=3)
    subjects = np.repeat([11, 12, 13, 14], 12)
    return X, y, subjects


def test_grid_search_routes_groups():
    pytest.importorskip("pyriemann")
    from pyriemann.estimation import Covariances

    X, y, subjects = _timeseries()
    pipe = make_pipeline(Covariances("oas"), _fed(n_rounds=2))
    with sklearn.config_context(enable_metadata_routing=True):
        search = GridSearchCV(pipe, {"federatedspdnetclassifier__local_epochs": [1]}, cv=GroupKFold(2))
        search.fit(X, y, groups=subjects)
    best = search.best_estimator_[-1]
    assert best.client_source_ == "groups"
    assert best.client_groups_ == [(11,), (12,), (13,), (14,)]


def test_grid_search_routes_groups_to_every_fit(recorder):
    pytest.importorskip("pyriemann")
    from pyriemann.estimation import Covariances

    X, y, subjects = _timeseries()
    pipe = make_pipeline(Covariances("oas"), RecordingFederated(_estimator(), n_rounds=1, local_epochs=1,
                                                                 n_clients=3, random_state=0))
    with sklearn.config_context(enable_metadata_routing=True):
        search = GridSearchCV(pipe, {"recordingfederated__local_epochs": [1]}, cv=GroupKFold(2))
        search.fit(X, y, groups=subjects)
    assert len(recorder) == 3  # two folds and the refit
    folds, refit = recorder[:2], recorder[2]
    for record in folds:
        assert record["client_source"] == "groups" and record["subjects"] is None
        assert len(record["groups"]) == record["n"] == 24
        assert len(np.unique(record["groups"])) == 2
    assert sorted(np.concatenate([np.unique(r["groups"]) for r in folds]).tolist()) == [11, 12, 13, 14]
    np.testing.assert_array_equal(refit["groups"], subjects)
    assert refit["client_groups"] == [(11,), (12,), (13,), (14,)]


def test_without_routing_groups_only_reach_the_splitter(recorder):
    pytest.importorskip("pyriemann")
    from pyriemann.estimation import Covariances

    X, y, subjects = _timeseries()
    pipe = make_pipeline(Covariances("oas"), RecordingFederated(_estimator(), n_rounds=1, local_epochs=1,
                                                                 n_clients=3, random_state=0))
    with pytest.warns(UserWarning, match="received no groups") as caught:
        GridSearchCV(pipe, {"recordingfederated__local_epochs": [1]}, cv=GroupKFold(2)).fit(X, y, groups=subjects)
    assert all(r["groups"] is None and r["client_source"] == "partition:stratified" for r in recorder)
    assert sum("received no groups" in str(w.message) for w in caught) == len(recorder)  # every fit says so
    # Without routing, a pipeline passes step parameters explicitly.
    pipe.fit(X, y, recordingfederated__groups=subjects)
    assert recorder[-1]["client_source"] == "groups"


# ---------------------------------------------------------------------------------------------
# MOABB evaluations
# ---------------------------------------------------------------------------------------------

MOABB_SUBJECTS, MOABB_SESSIONS = 3, 2


@pytest.fixture
def moabb_setup(tmp_path, fake_moabb):
    """An offline MOABB FakeDataset (3 subjects, 2 sessions, 3 motor-imagery classes, 6
    channels) whose paths all point into ``tmp_path``."""
    from moabb.paradigms import MotorImagery

    dataset = fake_moabb(event_list=("left_hand", "right_hand", "feet"), n_subjects=MOABB_SUBJECTS,
                         n_sessions=MOABB_SESSIONS, n_runs=1, n_events=20, duration=70,
                         channels=("C3", "Cz", "C4", "FC3", "FC4", "CP3"))
    paradigm = MotorImagery(n_classes=3, events=["left_hand", "right_hand", "feet"])
    return dataset, paradigm, tmp_path


def _moabb_pipeline():
    from pyriemann.estimation import Covariances

    return {"fed": make_pipeline(Covariances("oas"), RecordingFederated(
        _estimator(), n_rounds=2, local_epochs=1, n_clients=2, random_state=0))}


def _evaluate(evaluation_class, moabb_setup):
    dataset, paradigm, tmp_path = moabb_setup
    evaluation = evaluation_class(paradigm=paradigm, datasets=[dataset], overwrite=True, save_model=False,
                                  hdf5_path=str(tmp_path / "hdf5"), random_state=0, n_jobs=1)
    results = evaluation.process(_moabb_pipeline())
    assert len(results) == MOABB_SUBJECTS * MOABB_SESSIONS
    assert results["score"].between(0, 1).all()
    return results


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("evaluation", ["WithinSessionEvaluation", "CrossSessionEvaluation"])
def test_moabb_within_and_cross_session_use_partition(evaluation, moabb_setup, recorder):
    import moabb.evaluations

    _evaluate(getattr(moabb.evaluations, evaluation), moabb_setup)
    n_fits = MOABB_SUBJECTS * MOABB_SESSIONS * (5 if evaluation == "WithinSessionEvaluation" else 1)
    assert len(recorder) == n_fits
    for record in recorder:
        assert record["groups"] is None and record["subjects"] is None
        assert record["client_source"].startswith("partition")
        assert record["client_groups"] == [None, None]


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")
def test_moabb_cross_subject_routes_training_subjects(moabb_setup, recorder):
    """MOABB 1.7.2 routes ``subjects`` (the training subjects) to every pipeline step whose
    fit requests it: ``CrossSubjectSplitter`` always reports ``calibration_size`` (0.0 by
    default) in its split metadata, which is the condition of ``_evaluate_fold``."""
    from moabb.evaluations import CrossSubjectEvaluation

    _evaluate(CrossSubjectEvaluation, moabb_setup)
    assert len(recorder) == MOABB_SUBJECTS  # leave one subject out
    held_out = []
    for record in recorder:
        assert record["groups"] is None
        assert record["subjects"] is not None and len(record["subjects"]) == record["n"]
        training = np.unique(record["subjects"]).tolist()
        assert len(training) == MOABB_SUBJECTS - 1
        assert record["client_source"] == "groups"
        assert record["client_groups"] == [(s,) for s in training]
        held_out += sorted(set(range(1, MOABB_SUBJECTS + 1)) - set(training))
    assert sorted(held_out) == list(range(1, MOABB_SUBJECTS + 1))


def test_without_validation_data_keeps_the_latest_global_model():
    """validation_fraction=0: no score to select on, so the last round's model is returned."""
    X, y = _data(n_classes=2)
    clf = _fed(n_rounds=3, validation_fraction=0.0).fit(X, y)
    assert clf.best_round_ == 2
    assert all(np.isnan(h["val_f1"]) for h in clf.history_)
    released = clf.global_estimator_.module_.get_parameters()
    for name, value in clf.engine_.global_params.items():  # the last aggregation, not the initial model
        np.testing.assert_allclose(released[name], value, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Atomic fits: a fit that raises leaves the estimator exactly as it was
# ---------------------------------------------------------------------------------------------


def _nan_rule(client_params, weights, previous, kinds):
    return {n: np.full_like(v, np.nan) for n, v in projavg(client_params, weights, previous, kinds).items()}


def _shape_rule(client_params, weights, previous, kinds):
    out = projavg(client_params, weights, previous, kinds)
    out["head.bias"] = out["head.bias"][:, None]
    return out


class FlakyRule:
    """ProjAvg, then a NaN model from the second call on (a failure after round 0)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return projavg(*args) if self.calls == 1 else _nan_rule(*args)


def _all_clients_fail(monkeypatch):
    _counting_local_update(monkeypatch, fail=lambda call: True)


FAILING_FITS = {
    # name: (parameters, how to call fit, expected error)
    "clients_per_round_above_n_clients": ({"clients_per_round": 10}, {}, "clients_per_round=10"),
    "nan_aggregate_from_callable_rule": ({"aggregation": _nan_rule}, {}, "aggregation rule .*_nan_rule"),
    "wrong_shape_from_callable_rule": ({"aggregation": _shape_rule}, {}, "aggregation rule .*_shape_rule"),
    "callable_rule_failing_in_round_1": ({"aggregation": FlakyRule(), "n_rounds": 2}, {}, "FlakyRule"),
    "bad_n_rounds": ({"n_rounds": 0}, {}, "n_rounds"),
    "bad_lr_factor": ({"lr_factor": np.nan}, {}, "lr_factor"),
    "bad_inner_estimator": ({"estimator": _estimator(lr=-1.0)}, {}, "lr"),
    "nan_in_X": ({}, {"X": "nan"}, "NaN or infinity"),
    "y_of_other_length": ({}, {"y": "short"}, "labels"),
    "groups_of_other_length": ({}, {"groups": np.zeros(7)}, "groups has 7 entries"),
    "groups_and_subjects_differ": ({}, {"groups": "g", "subjects": "reversed"}, "differ"),
    "single_class": ({}, {"y": "one class"}, "greater than one|labels not in classes"),
    "n_clients_above_n_samples": ({"n_clients": 100, "partition": "contiguous"}, {}, "n_clients=100 exceeds"),
    "all_clients_fail": ({"on_client_error": "skip"}, {"patch": _all_clients_fail}, "every client failed"),
    "corrupt_checkpoint_file": ({"checkpoint_path": "corrupt"}, {}, "corrupt"),
}


def _call(case_kwargs, X, y, tmp_path, monkeypatch):
    X, y = X.copy(), y.copy()
    kwargs = {}
    if case_kwargs.get("X") == "nan":
        X[3, 0, 0] = np.nan
    if case_kwargs.get("y") == "short":
        y = y[:-1]
    if case_kwargs.get("y") == "one class":
        y = np.zeros_like(y)
    if "groups" in case_kwargs:
        kwargs["groups"] = _groups(len(y), 3) if isinstance(case_kwargs["groups"], str) else case_kwargs["groups"]
    if case_kwargs.get("subjects") == "reversed":
        kwargs["subjects"] = kwargs["groups"][::-1]
    if "patch" in case_kwargs:
        case_kwargs["patch"](monkeypatch)
    return X, y, kwargs


def _snapshot(clf):
    """The attribute objects, and the content of a fitted state."""
    objects = {k: id(v) for k, v in vars(clf).items()}
    if not clf.__sklearn_is_fitted__():
        return objects, None
    return objects, (repr(clf.history_), clf.best_round_, clf.engine_.state_dict()[0],
                     clf.global_estimator_.get_parameters())


def _assert_snapshot(clf, snapshot):
    objects, fitted = snapshot
    assert {k: id(v) for k, v in vars(clf).items()} == objects
    if fitted is not None:
        history, best, engine_arrays, released = _snapshot(clf)[1]
        assert (history, best) == fitted[:2]
        for before, after in ((fitted[2], engine_arrays), (fitted[3], released)):
            assert before.keys() == after.keys()
            for name in before:
                np.testing.assert_array_equal(before[name], after[name], strict=True)


@pytest.mark.parametrize("start", ["unfitted", "fitted", "warm_start"])
@pytest.mark.parametrize("case", sorted(FAILING_FITS))
def test_failing_fit_leaves_the_estimator_unchanged(case, start, fitted, tmp_path, monkeypatch):
    params, case_kwargs, message = FAILING_FITS[case]
    if (case, start) == ("single_class", "warm_start"):
        pytest.skip("a warm start continues with the classes it knows: one-class data is valid there")
    reference, X, y = fitted
    clean = X[:5]
    clf = copy.deepcopy(reference) if start != "unfitted" else _fed(n_rounds=4)
    params = dict(params, warm_start=start == "warm_start")
    if params.get("checkpoint_path") == "corrupt":
        params["checkpoint_path"] = tmp_path / "corrupt"
        params["checkpoint_path"].write_bytes(b"PK\x03\x04 not really a zip")
    clf.set_params(**params)
    X, y, kwargs = _call(case_kwargs, X, y, tmp_path, monkeypatch)
    snapshot = _snapshot(clf)
    prediction = clf.predict_proba(clean) if start != "unfitted" else None
    with pytest.raises((ValueError, RuntimeError), match=message):
        clf.fit(X, y, **kwargs)
    _assert_snapshot(clf, snapshot)
    if prediction is not None:  # the fitted model still predicts as before
        np.testing.assert_array_equal(clf.predict_proba(clean), prediction)
    else:
        assert not clf.__sklearn_is_fitted__()
        assert not any(k.endswith("_") and not k.startswith("__") for k in vars(clf))


def test_warm_start_with_unknown_label_leaves_the_model_unchanged(fitted):
    reference, X, y = fitted
    clf = copy.deepcopy(reference).set_params(warm_start=True)
    snapshot = _snapshot(clf)
    with pytest.raises(ValueError, match="not in classes"):
        clf.fit(X, np.where(y == 0, 5, y))
    _assert_snapshot(clf, snapshot)


# ---------------------------------------------------------------------------------------------
# Grad mode, re-centring, checkpoints of a callable rule, crafted checkpoint files
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_fit_and_predict_do_not_depend_on_the_global_grad_mode(mode, fitted):
    """pyRiemann's own test configuration turns gradients off globally."""
    reference, X, y = fitted
    context = torch.set_grad_enabled(False) if mode == "no_grad" else torch.inference_mode()
    with context:
        clf = _fed(n_rounds=4).fit(X, y)
        proba = clf.predict_proba(X)
        assert not torch.is_grad_enabled()
    np.testing.assert_array_equal(proba, reference.predict_proba(X))
    assert repr(_without_time(clf.history_)) == repr(_without_time(reference.history_))


def test_recentring_counter_restarts_at_every_local_update():
    """With recenter_every > 1 a client's reply does not depend on the client that the
    shared module trained before it (as on the local backend) or not (a Flower site's own
    module): the same replies either way."""
    X, y = _data(n=60)
    est = _estimator(recenter_every=3, batch_size=16)  # 2 steps per local update: the count would carry over
    shared = _fed(est, n_rounds=2, aggregation=RecordingRule()).fit(X, y)
    original = SPDnetClassifier.local_update
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SPDnetClassifier, "local_update", lambda self, *a, **k: original(copy.deepcopy(self), *a, **k))
        separate = _fed(est, n_rounds=2, aggregation=RecordingRule()).fit(X, y)
    for call_a, call_b in zip(shared.aggregation.calls, separate.aggregation.calls):
        for a, b in zip(call_a["client_params"], call_b["client_params"]):
            for name in a:
                np.testing.assert_array_equal(a[name], b[name], strict=True)


def test_checkpoint_of_a_callable_rule_resumes_with_another_instance(tmp_path, monkeypatch):
    """The rule is fingerprinted by its qualified name: a new instance (a new process would
    give a new address) resumes the checkpoint instead of restarting at round 0."""
    X, y = _data(n=30)
    path = tmp_path / "ckpt"
    calls = _counting_local_update(monkeypatch, fail=lambda call: call == 3)  # round 1, client 0
    with pytest.raises(RuntimeError, match="failed in round 1"):
        _fed(n_rounds=2, aggregation=RecordingRule(), checkpoint_path=path).fit(X, y)
    monkeypatch.undo()
    calls = _counting_local_update(monkeypatch)
    resumed = _fed(n_rounds=2, aggregation=RecordingRule(), checkpoint_path=path).fit(X, y)
    assert len(calls) == 3  # round 1 only
    uninterrupted = _fed(n_rounds=2, aggregation=RecordingRule()).fit(X, y)
    np.testing.assert_array_equal(resumed.decision_function(X), uninterrupted.decision_function(X))


class _Exploit:
    """A pickle payload that would create ``marker`` when unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("content", ["pickle_payload", "npz_with_pickled_object", "truncated", "random_bytes",
                                     "empty", "other_kind_of_file"])
def test_crafted_checkpoint_file_is_refused_and_runs_nothing(content, tmp_path, fitted):
    reference, X, y = fitted
    path, marker = tmp_path / "ckpt", tmp_path / "code-ran"
    if content == "pickle_payload":
        path.write_bytes(pickle.dumps({"fingerprint": "x", "history": _Exploit(marker)}))
    elif content == "npz_with_pickled_object":
        with open(path, "wb") as f:
            np.savez(f, history=np.array([_Exploit(marker)], dtype=object))
    elif content == "truncated":
        _fed(n_rounds=1, checkpoint_path=path).fit(X, y)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif content == "random_bytes":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif content == "empty":
        path.write_bytes(b"")
    else:
        save_estimator(reference, path)
    original = path.read_bytes()
    clf = _fed(n_rounds=1, checkpoint_path=path)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        clf.fit(X, y)
    assert not marker.exists()  # no code ran
    assert path.read_bytes() == original  # the file is left alone
    assert not clf.__sklearn_is_fitted__()


def test_local_backend_checks_replies_like_flower(monkeypatch):
    """A local client whose update returns a NaN array is a failed client too (same engine
    checks): the run equals the one in which that client raised."""
    X, y = _data(n=60)
    original = SPDnetClassifier.local_update
    bad_seed = {}

    def poisoned(self, *args, **kwargs):
        params, loss, skipped = original(self, *args, **kwargs)
        if kwargs["seed"] == bad_seed.setdefault("seed", kwargs["seed"]):  # the first client of round 0
            params = {**params, "head.bias": np.full_like(params["head.bias"], np.nan)}
        return params, loss, skipped

    monkeypatch.setattr(SPDnetClassifier, "local_update", poisoned)
    with pytest.warns(RuntimeWarning, match="client 0 left out"):
        poisoned_fit = _fed(n_rounds=2, on_client_error="skip").fit(X, y)
    failure = poisoned_fit.history_[0]["failed_clients"][0]
    assert failure["client"] == 0 and "arrays['head.bias'] has 3 non-finite values" in failure["reason"]
    monkeypatch.undo()
    _counting_local_update(monkeypatch, fail=lambda call: call == 0)
    failed_fit = _fed(n_rounds=2, on_client_error="skip").fit(X, y)
    np.testing.assert_array_equal(poisoned_fit.decision_function(X), failed_fit.decision_function(X))
    assert np.isfinite(poisoned_fit.predict_proba(X)).all()


def test_stratified_partition_clamps_n_clients_to_the_smallest_class():
    """pyRiemann-sized data (6 matrices, 2 classes): the default 5 clients become 3, each
    holding both classes, with a warning naming the rule."""
    X, y = make_spd_dataset(6, 3, 2)
    with pytest.warns(UserWarning, match="n_clients=5 reduced to 3"):
        clf = FederatedSPDnetClassifier(n_rounds=2, partition="stratified", random_state=0).fit(X, y)
    assert clf.n_clients_ == 3
    assert len(clf.engine_.n_train) == 3
    for indices in partition_indices(clf.global_estimator_.encode_labels(y), 3, "stratified", 0.5, 0):
        assert len(np.unique(y[indices])) == 2


@pytest.mark.parametrize("early_stopping, held_out", [("auto", 0.0), (True, 0.1), (False, 0.0)])
def test_validation_is_held_out_by_the_local_estimators_rule(early_stopping, held_out):
    """A few pooled validation trials would pick the released round on noise: with the
    default rule ("auto") a small federation trains on everything and keeps the last round."""
    X, y = _data(45, n_classes=2)
    fed = FederatedSPDnetClassifier(SPDnetClassifier(early_stopping=early_stopping), n_rounds=4, n_clients=3,
                                    partition="stratified", random_state=0).fit(X, y)
    assert held_out_fraction(fed, fed.global_estimator_, 45, 2) == held_out
    assert (sum(fed.engine_.n_val) > 0) == (held_out > 0)
    if held_out == 0:
        assert fed.engine_.best_round == 3 and all(np.isnan(h["val_f1"]) for h in fed.history_)
        assert sum(fed.engine_.n_train) == 45
    est = fed.global_estimator_.set_params(early_stopping="auto")
    assert held_out_fraction(fed, est, 1000, 2) == 0.1  # 100 pooled validation samples: enough


@pytest.mark.parametrize("domains", ["group", "client"])
@pytest.mark.parametrize("groups_per_client", [1, 2, 4])
def test_domain_batchnorm_domains_of_a_client(spd_domains, monkeypatch, groups_per_client, domains):
    """With ``batchnorm="domain"`` a client of several groups (subjects) trains and validates
    with each group a domain (``domains="group"``), or as one domain (``"client"``)."""
    X, y, groups = spd_domains(n_groups=4, n_per_group=20)
    seen = []
    forward = SPDNet.forward

    def spy(self, X, domains=None):
        seen.append(len(torch.unique(X.domains)) if isinstance(X, DomainBatch) else None)
        return forward(self, X, domains)

    monkeypatch.setattr(SPDNet, "forward", spy)
    est = SPDnetClassifier(batchnorm="domain", batch_size=1000, early_stopping=True, validation_fraction=0.2)
    FederatedSPDnetClassifier(est, n_rounds=2, groups_per_client=groups_per_client, domains=domains,
                              random_state=0).fit(X, y, groups=groups + 10)
    if domains == "client":  # one domain a client: its matrices go to the module as a plain batch
        assert seen and set(seen) == {None}
    else:  # training minibatches hold one domain each (training.minibatches); validation all of them
        assert None not in seen and max(seen) == groups_per_client


def test_domain_batchnorm_client_domains_change_the_model(spd_domains):
    """The groups inside a client matter with ``domains="group"``: the same clients, each one
    domain, train another model; ``domains="client"`` (the default) trains exactly the model
    of clients that are one group each."""
    X, y, groups = spd_domains(n_groups=4, n_per_group=20)
    fed = FederatedSPDnetClassifier(SPDnetClassifier(batchnorm="domain", batch_size=1000), n_rounds=2,
                                    random_state=0)
    per_group = clone(fed).set_params(groups_per_client=2, domains="group").fit(X, y, groups=groups)
    per_client = clone(fed).fit(X, y, groups=groups // 2)
    assert per_group.client_groups_ == [(0, 1), (2, 3)] and per_client.client_groups_ == [(0,), (1,)]
    assert not np.allclose(per_group.decision_function(X), per_client.decision_function(X))
    client_default = clone(fed).set_params(groups_per_client=2).fit(X, y, groups=groups)
    np.testing.assert_array_equal(client_default.decision_function(X), per_client.decision_function(X))
    plain = FederatedSPDnetClassifier(SPDnetClassifier(batch_size=1000), n_rounds=2, random_state=0)
    np.testing.assert_array_equal(clone(plain).set_params(groups_per_client=2).fit(X, y, groups=groups)
                                  .decision_function(X), clone(plain).fit(X, y, groups=groups // 2).decision_function(X))


def test_shared_clients_map_a_domain_batch_and_the_worker_gets_it_back():
    """A client's DomainBatch reaches the workers with its matrices memory-mapped (as plain
    tensors are) and its domains, and local training receives it as a DomainBatch of tensors."""
    from skfedspd.base import _as_tensor
    from skfedspd.local import _SharedClients

    X = torch.randn(200, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))  # 1.6 MiB
    batch = DomainBatch(X, np.arange(200) % 3)
    with _SharedClients([(batch, torch.zeros(200, dtype=torch.long), None)]) as shared:
        sent, labels, weights = shared[0]
        assert isinstance(sent, DomainBatch) and isinstance(sent.X, np.memmap) and weights is None
        received = _as_tensor(pickle.loads(pickle.dumps(sent)))
        assert isinstance(received, DomainBatch) and isinstance(received.X, torch.Tensor)
        torch.testing.assert_close(received.X, X, rtol=0, atol=0)
        assert torch.equal(received.domains, batch.domains)


# ---------------------------------------------------------------------- init: start from a fitted model
@pytest.fixture(scope="module")
def public():
    """A model fitted on other ("public") data of the same task: the starting point of init."""
    X, y = _data(n=60, seed=7)
    return _estimator(max_epochs=3, random_state=0).fit(X, y)


def _same_params(a, b):
    return all(np.array_equal(a[name], b[name]) for name in a)


@pytest.mark.parametrize("wrap", [False, True])
def test_init_starts_the_global_model_from_a_fitted_model(public, wrap):
    """The global model starts from init's weights (every array): with the head alone
    trained, the BiMap stays init's to rounding; init itself is only read. A fitted
    federated model works as well as a local one."""
    X, y = _data()
    start = _fed(n_rounds=1).fit(*_data(n=60, seed=7)) if wrap else public
    weights = (start.global_estimator_ if wrap else start).get_parameters()
    fed = _fed(_estimator(trainable="head"), init=start, validation_fraction=0.0).fit(X, y)
    after = fed.global_estimator_.get_parameters()
    np.testing.assert_allclose(after["bimaps.0.weight"], weights["bimaps.0.weight"], rtol=0, atol=1e-12)
    assert not np.array_equal(after["head.weight"], weights["head.weight"])
    assert _same_params((start.global_estimator_ if wrap else start).get_parameters(), weights)
    with pytest.warns(UserWarning, match="frozen random BiMaps"):  # no init: random spatial filters
        scratch = _fed(_estimator(trainable="head"), validation_fraction=0.0).fit(X, y).global_estimator_
    assert not np.allclose(scratch.get_parameters()["bimaps.0.weight"], weights["bimaps.0.weight"])


@pytest.mark.parametrize("scaling, adopted", [("auto", "scale_"), ("trace", "trace"), (3.0, 3.0)])
def test_init_input_scaling_is_adopted(scaling, adopted):
    """The weights expect init's input: its scaling ("trace", or its fitted scale_ as a
    constant) replaces the local estimator's, whatever that is."""
    X, y = _data()
    start = _estimator(max_epochs=1, scaling=scaling, random_state=0).fit(*_data(seed=7))
    fed = _fed(_estimator(scaling="auto"), n_rounds=1, init=start).fit(X, y)
    expected = start.scale_ if adopted == "scale_" else adopted
    assert fed.global_estimator_.scaling == expected == resolved_settings(fed)["scaling"]
    assert fed.estimator.scaling == "auto"


def _other_data(kind):
    X, y = _data(n=30, seed=7)
    if kind == "classes":
        return X, np.where(y == 2, 9, y)
    return make_spd_dataset(30, N_CHANNELS - 1, 3, seed=7)


@pytest.mark.parametrize("init, match", [
    (lambda: _estimator(), "unfitted SPDnetClassifier"),
    (lambda: _fed(), "unfitted FederatedSPDnetClassifier"),
    (lambda: _estimator(max_epochs=1).fit(*_other_data("classes")), r"classes \[0, 1, 9\], but this fit has"),
    (lambda: _estimator(max_epochs=1).fit(*_other_data("features")), "fitted on 5 features"),
    (lambda: _estimator(max_epochs=1, hidden_dims=(2,)).fit(*_data(n=30, seed=7)), "architecture differs"),
    (lambda: _estimator(max_epochs=1, batchnorm="spd").fit(*_data(n=30, seed=7)), "architecture differs"),
])
def test_init_mismatch_is_named_and_leaves_the_estimator_unchanged(init, match):
    X, y = _data()
    fed = _fed(init=init())
    with pytest.raises(ValueError, match=match):
        fed.fit(X, y)
    assert not hasattr(fed, "global_estimator_")


def test_init_of_another_model_class_is_refused():
    from skfedspd import EEGNetClassifier

    X, y = make_eeg_timeseries(n_trials=30, n_channels=N_CHANNELS, n_times=64, n_classes=3, seed=0)
    eegnet = EEGNetClassifier(fs=64, max_epochs=1, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="init is a fitted EEGNetClassifier, but the local estimator is a "
                                         "SPDnetClassifier"):
        _fed(init=eegnet).fit(*_data())


def test_clone_keeps_init_and_spec_stores_none(public, tmp_path):
    """clone keeps the fitted init (cloning it would unfit it); the JSON spec and the saved
    file store none of it: the fitted model holds what it contributed."""
    from skfedspd.spec import estimator_to_spec

    with sklearn.config_context(enable_metadata_routing=True):
        fed = _fed(init=public).set_fit_request(sample_weight=True)
        cloned = clone(fed)
        assert cloned.get_metadata_routing().fit.requests["sample_weight"] is True
    assert cloned.init is public and cloned.estimator is not fed.estimator
    assert estimator_to_spec(fed)["params"]["init"] is None
    X, y = _data()
    fed.fit(X, y)
    save_estimator(fed, tmp_path / "fed.skfedspd")
    loaded = load_estimator(tmp_path / "fed.skfedspd")
    assert loaded.init is None
    assert loaded.global_estimator_.scaling == fed.global_estimator_.scaling == public.scale_
    np.testing.assert_array_equal(loaded.predict_proba(X), fed.predict_proba(X))


def test_checkpoint_of_another_init_is_not_resumed(public, tmp_path):
    X, y = _data()
    path = tmp_path / "run.ckpt"
    _fed(n_rounds=1, init=public, checkpoint_path=path).fit(X, y)
    other = _estimator(max_epochs=2, random_state=1).fit(*_data(seed=7))
    with pytest.warns(UserWarning, match="another configuration or data"):
        _fed(n_rounds=1, init=other, checkpoint_path=path).fit(X, y)
# ---------------------------------------------------------------------------------------------
# Robust aggregation rules as estimator parameters
# ---------------------------------------------------------------------------------------------


def test_robust_rule_parameters_are_nested_params_and_saved(tmp_path):
    """``aggregation__trim`` like any nested parameter; a fitted estimator saved and loaded
    keeps its rule with its parameters (and its history's robustness entries)."""
    X, y = _data(n=60)
    fed = _fed(n_rounds=2, n_clients=5, aggregation=TrimmedMean())
    assert fed.get_params()["aggregation__trim"] == 0.25
    fed.set_params(aggregation__trim=0.2).fit(X, y)
    assert clone(fed).aggregation.get_params() == {"trim": 0.2} and clone(fed).aggregation is not fed.aggregation
    assert all(len(r["effective_weights"]) == len(r["clients"]) == len(r["client_distance"]) for r in fed.history_)
    save_estimator(fed, tmp_path / "fed.skfedspd")
    loaded = load_estimator(tmp_path / "fed.skfedspd")
    assert repr(loaded.aggregation) == "TrimmedMean(trim=0.2)" and loaded.history_ == fed.history_
    np.testing.assert_array_equal(loaded.predict_proba(X), fed.predict_proba(X))


@pytest.mark.parametrize("aggregation, match", [
    (TrimmedMean(trim=0.1), r"trims no client of 3 per round"),
    (Krum(n_faulty=1), r"needs more than 2·n_faulty \+ 2 = 4 clients per round, got 3"),
    (TrimmedMean(trim=0.5), "'trim' parameter of TrimmedMean"),
])
def test_robust_rule_settings_refused_at_fit_leaving_the_estimator_unchanged(aggregation, match, fitted):
    clf, X, y = fitted
    reference = copy.deepcopy(clf).set_params(aggregation=aggregation, warm_start=False)
    before = reference.decision_function(X)
    with pytest.raises(ValueError, match=match):
        reference.fit(X, y)
    np.testing.assert_array_equal(reference.decision_function(X), before)
    assert reference.history_ == clf.history_


@pytest.mark.parametrize("aggregation", ["geomedian", "trimmedmean", "krum", TrimmedMean(trim=0.3), "karcher",
                                         FLTrust(np.stack([np.eye(3)] * 2), [0, 1])])
def test_secure_aggregation_refuses_rules_of_individual_updates(aggregation):
    """Before any round or data check, and from check_params (what a ServerApp calls)."""
    fed = _fed(aggregation=aggregation, backend="flower", secure_aggregation=True)
    with pytest.raises(ValueError, match="secure aggregation reveals only the clients' weighted sum.*needs each "
                                         "client's update"):
        fed.check_params()
    with pytest.raises(ValueError, match="needs each client's update"):
        fed.fit(np.zeros((2, 3, 3)), [0, 1])


# ---------------------------------------------------------------------------------------------
# Settings grouped by concern
def test_settings_objects_are_validated_at_fit_naming_their_parameter():
    X, y = _data(n=30, n_classes=2)
    with pytest.raises(ValueError, match="'lr_patience' parameter of RoundSchedule"):
        _fed(schedule=RoundSchedule(lr_patience=-1)).fit(X, y)
    with pytest.raises(ValueError, match="'momentum' parameter of ServerMomentum"):
        _fed(server_optimizer=ServerMomentum(momentum=1.0)).fit(X, y)


# ---------------------------------------------------------------------------------------------
# FLTrust in a fit: the server's reference update, and the sites' trust
# ---------------------------------------------------------------------------------------------


def _broken_federation(seed, fault, n_sites=8, n_per_site=30, n_root=40):
    """``(X, y, groups, root, broken)``: ``n_sites`` sites of one 2-class problem, a public
    root set of ``n_root`` matrices, and two sites with a data fault: ``"swap"`` (labels
    swapped), ``"permute"`` (channels permuted), ``"noise"`` (random labels) or ``None``."""
    X, y = make_spd_dataset(n_sites * n_per_site + n_root, N_CHANNELS, 2, seed=seed)
    root, X, y = (X[-n_root:], y[-n_root:]), X[:-n_root].copy(), y[:-n_root].copy()
    groups = np.repeat(np.arange(n_sites), n_per_site)
    broken = [] if fault is None else [seed % n_sites, (seed + 3) % n_sites]
    rng = np.random.default_rng(seed)
    for site in broken:
        at = groups == site
        if fault == "swap":
            y[at] = 1 - y[at]
        elif fault == "noise":
            y[at] = rng.integers(0, 2, at.sum())
        else:
            P = np.eye(N_CHANNELS)[rng.permutation(N_CHANNELS)]
            X[at] = P @ X[at] @ P.T
    return X, y, groups, root, broken


@pytest.mark.parametrize("fault", ["swap", "permute", "noise"])
@pytest.mark.parametrize("seed", [0, 1])
def test_fltrust_names_the_sites_with_broken_data(fault, seed):
    """Two of eight sites with a data fault rank lowest in trust, are flagged, and the summary says why."""
    X, y, groups, root, broken = _broken_federation(seed, fault)
    fed = _fed(aggregation=FLTrust(*root), n_rounds=5, random_state=seed).fit(X, y, groups=groups)
    assert sorted(np.argsort(fed.client_trust_)[:2]) == broken
    for entry in fed.trust_summary_:
        assert entry["flagged"] == (entry["client"] in broken) == (entry["reason"] is not None)
        assert entry["rounds"] == 5 and entry["failed"] == 0
    assert all("times as far from the aggregate" in fed.trust_summary_[c]["reason"] for c in broken)
    assert all(r["client_agreement"] is not None and len(r["client_agreement"]) == 8 for r in fed.history_)


@pytest.mark.parametrize("fault", ["swap", "permute", "noise"])
def test_the_diagnosis_names_the_broken_sites_under_projavg_too(fault):
    """The trust is read from the distances to the aggregate: a plain rule's fit names them as well."""
    X, y, groups, _, broken = _broken_federation(0, fault)
    fed = _fed(n_rounds=5, random_state=0).fit(X, y, groups=groups)
    assert sorted(np.argsort(fed.client_trust_)[:2]) == broken
    assert [entry["client"] for entry in fed.trust_summary_ if entry["flagged"]] == broken
    assert all(entry["weight"] == 1.0 and entry["downweighted"] == 0 for entry in fed.trust_summary_)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fltrust_raises_no_false_alarm_on_a_fault_free_federation(seed):
    X, y, groups, root, _ = _broken_federation(seed, None)
    fed = _fed(aggregation=FLTrust(*root), n_rounds=5, random_state=seed).fit(X, y, groups=groups)
    assert not any(entry["flagged"] for entry in fed.trust_summary_)
    assert sum(entry["downweighted"] for entry in fed.trust_summary_) <= 2  # of 40 site-rounds
    projavg_fit = _fed(n_rounds=5, random_state=seed).fit(X, y, groups=groups)
    assert all(entry["reason"] is None and entry["weight"] == 1.0 for entry in projavg_fit.trust_summary_)


def test_fltrust_fit_saved_and_loaded_keeps_its_rule_and_the_trust(tmp_path):
    X, y, groups, root, broken = _broken_federation(0, "swap", n_sites=4, n_per_site=20, n_root=20)
    fed = _fed(aggregation=FLTrust(*root, threshold=0.1), n_rounds=2).fit(X, y, groups=groups)
    save_estimator(fed, tmp_path / "fed.skfedspd")
    loaded = load_estimator(tmp_path / "fed.skfedspd")
    assert repr(loaded.aggregation) == repr(fed.aggregation)  # the root set travels with the rule
    np.testing.assert_array_equal(loaded.aggregation.X, root[0])
    np.testing.assert_array_equal(loaded.client_trust_, fed.client_trust_)
    assert loaded.trust_summary_ == fed.trust_summary_ and loaded.history_ == fed.history_
    refit = clone(loaded).fit(X, y, groups=groups)
    np.testing.assert_array_equal(refit.predict_proba(X), fed.predict_proba(X))


@pytest.mark.parametrize("root, match", [
    ((np.stack([np.eye(4)] * 4), [0, 1, 0, 1]), r"the root set does not fit this fit: its matrices have shape "
                                                r"\(4, 4\), the sites' \(6, 6\)"),
    ((np.stack([np.eye(6)] * 3), [0, 1, 7]), r"the root set does not fit this fit: this site holds labels \[7\]"),
])
def test_fltrust_root_set_that_does_not_fit_is_refused_before_any_round(root, match):
    X, y = _data(n=60)
    fed = _fed(aggregation=FLTrust(*root), n_rounds=1)
    with pytest.raises(ValueError, match=r"aggregation=FLTrust\(X=<root set .*" + match):
        fed.fit(X, y)
    assert not hasattr(fed, "history_")


@pytest.mark.parametrize("class_weight", ["balanced", {0: 1.0, 1: 3.0}])
def test_fltrust_reference_step_trains_with_the_class_weights(class_weight):
    """The root set is all the server's data: a "balanced" weighting is computed on it."""
    X, y, groups, root, _ = _broken_federation(0, None, n_sites=3, n_per_site=20, n_root=20)
    fed = _fed(_estimator(class_weight=class_weight), aggregation=FLTrust(*root), n_rounds=1).fit(X, y, groups=groups)
    assert len(fed.history_[0]["client_agreement"]) == 3


@pytest.mark.parametrize("policy", ["keep", "reset"])
def test_fltrust_reference_step_keeps_its_adam_state_as_the_clients_do(policy, monkeypatch):
    """The server trains its reference as a client trains: with ``client_optimizer_state="keep"``
    its Adam state carries from round to round (a fresh Adam each round moves much farther than
    the clients' kept ones, and every client's step is scaled to the reference's length), with
    ``"reset"`` it starts afresh every round."""
    from skfedspd.client import Site

    X, y, groups, root, _ = _broken_federation(0, None, n_sites=3, n_per_site=20, n_root=20)
    seen, original = [], Site.train_update

    def spy(self, global_params, local_state, **kwargs):
        reply = original(self, global_params, local_state, **kwargs)
        if self.client_id == 3:  # the server's root-set site, numbered after the 3 sites
            seen.append((kwargs.get("optimizer_state"), reply.optimizer_state))
        return reply

    monkeypatch.setattr(Site, "train_update", spy)
    _fed(aggregation=FLTrust(*root), n_rounds=3, client_optimizer_state=policy).fit(X, y, groups=groups)
    assert len(seen) == 3
    if policy == "reset":
        assert all(given is None for given, _ in seen)
    else:
        assert seen[0][0] == {}
        for (_, after), (given, _) in zip(seen, seen[1:]):
            assert given is after  # the state the previous round's reference step left
