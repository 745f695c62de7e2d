"""Tests for ``skfedspd.local``, the in-process transport: serial and parallel rounds bit for
bit, and checkpoints written after every round and resumed."""

import os
import tempfile

import numpy as np
import pytest

from conftest import count_local_updates as _counting_local_update, small_data as _data, \
    small_estimator as _estimator, small_federation as _fed, without_time as _without_time
from skfedspd.aggregation import TrimmedMean
from skfedspd.persistence import load_bundle
from skfedspd.training import RoundSchedule


@pytest.fixture(scope="module")
def fitted():
    X, y = _data()
    return _fed(n_rounds=4).fit(X, y), X, y


def _temp_folders():
    return {os.path.join(d, f) for d in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(d)
            for f in os.listdir(d) if f.startswith("skfedspd-")}


@pytest.mark.parametrize("est_params, fed_params", [
    # re-centred charts, partial participation
    (dict(recenter_every=3, batch_size=16), dict(n_rounds=3, clients_per_round=2)),
    # the learning rate halves and the run stops early: the parallel loop's speculative
    # training is redone at the new rate, then dropped
    (dict(batch_size=16, lr=0.5), dict(n_rounds=12, schedule=RoundSchedule(lr_patience=0, patience=2))),
    # client-local arrays (SPD batch norm statistics) in training and validation
    (dict(batchnorm="spd", batch_size=16), dict(n_rounds=3)),
    # clients of two groups, each group a domain (their matrices go to the workers with their domains)
    (dict(batchnorm="domain", batch_size=16), dict(n_rounds=3, groups_per_client=2, domains="group")),
    # robust rules (their diagnostics in the history too)
    (dict(batch_size=16), dict(n_rounds=2, n_clients=5, aggregation="geomedian")),
    (dict(batch_size=16), dict(n_rounds=2, n_clients=5, aggregation=TrimmedMean(trim=0.2))),
])
def test_reproducible_serial_and_parallel(est_params, fed_params):
    """Same random_state: bit-identical with one or two processes (the only test that starts
    loky workers); the workers' data files are removed after the fit."""
    X, y = _data(n=60)
    groups = np.arange(len(y)) % 4 if "groups_per_client" in fed_params else None
    est = _estimator(**est_params)
    before = _temp_folders()
    serial = _fed(est, n_jobs=1, **fed_params).fit(X, y, groups=groups)
    parallel = _fed(est, n_jobs=2, **fed_params).fit(X, y, groups=groups)
    assert _temp_folders() <= before
    np.testing.assert_array_equal(serial.decision_function(X), parallel.decision_function(X))
    assert _without_time(serial.history_) == _without_time(parallel.history_)
    if "schedule" in fed_params:  # the paths this case is for were taken
        lrs = [r["lr"] for r in serial.history_]
        assert len(set(lrs)) > 1 and len(lrs) < fed_params["n_rounds"]


def test_checkpoint_written(tmp_path, fitted):
    reference, X, y = fitted
    path = tmp_path / "ckpt.skfedspd"
    clf = _fed(n_rounds=4, checkpoint_path=path).fit(X, y)
    np.testing.assert_array_equal(clf.decision_function(X), reference.decision_function(X))
    _, meta = load_bundle(path, kind="federated-checkpoint")
    assert len(meta["history"]) == 4
    assert os.listdir(tmp_path) == ["ckpt.skfedspd"]  # the temporary file was renamed


@pytest.mark.parametrize("recenter_every", [1, 3])
def test_checkpoint_resume_is_bit_identical(tmp_path, monkeypatch, recenter_every):
    """Uninterrupted fit (checkpoint A) vs. a fit interrupted in round 3 (checkpoint B) and
    then re-run with the same parameters: the re-run resumes from round 2 and ends
    bit-identical (also when the charts are re-centred every few steps)."""
    X, y = _data(n=60)
    params = dict(n_rounds=4, clients_per_round=2, n_clients=4,
                  estimator=_estimator(recenter_every=recenter_every, batch_size=16))
    uninterrupted = _fed(checkpoint_path=str(tmp_path / "A.ckpt"), **params).fit(X, y)

    calls = _counting_local_update(monkeypatch, fail=lambda call: call == 4)  # 1st call of round 3
    with pytest.raises(RuntimeError, match="failed in round 2"):
        _fed(checkpoint_path=str(tmp_path / "B.ckpt"), **params).fit(X, y)
    assert len(calls) == 6  # round 3's other client still ran
    assert len(load_bundle(tmp_path / "B.ckpt", kind="federated-checkpoint")[1]["history"]) == 2

    calls.clear()
    monkeypatch.undo()
    calls = _counting_local_update(monkeypatch)
    resumed = _fed(checkpoint_path=str(tmp_path / "B.ckpt"), **params).fit(X, y)
    assert len(calls) == 4  # only rounds 3 and 4 were trained
    np.testing.assert_array_equal(resumed.decision_function(X), uninterrupted.decision_function(X))
    assert [r["round"] for r in resumed.history_] == [0, 1, 2, 3]
    for key in ("val_f1", "val_loss", "train_loss", "clients", "lr"):
        assert [r[key] for r in resumed.history_] == [r[key] for r in uninterrupted.history_], key
    assert resumed.best_round_ == uninterrupted.best_round_


def test_checkpoint_with_a_bad_client_optimizer_state_is_named(tmp_path):
    from safetensors import safe_open

    from skfedspd.persistence import save_bundle

    X, y = _data(n=30)
    path = tmp_path / "ckpt"
    _fed(n_rounds=2, checkpoint_path=str(path)).fit(X, y)
    arrays, meta = load_bundle(path, kind="federated-checkpoint")
    with safe_open(path, framework="numpy") as f:  # the run's fingerprint, from the file's header
        fingerprint = f.metadata()["fingerprint"]
    assert "optimizer/1/0.exp_avg" in arrays  # the clients' states are in the checkpoint
    arrays["optimizer/1/0.exp_avg"] = np.zeros(3)
    save_bundle(path, arrays, meta, kind="federated-checkpoint", fingerprint=fingerprint)
    with pytest.raises(ValueError, match=r"does not fit this run: client 1's optimizer state '0.exp_avg' has shape"):
        _fed(n_rounds=2, checkpoint_path=str(path)).fit(X, y)


def test_checkpoint_of_other_configuration_ignored(tmp_path, monkeypatch):
    X, y = _data(n=30)
    path = str(tmp_path / "ckpt")
    _fed(n_rounds=2, checkpoint_path=path).fit(X, y)
    calls = _counting_local_update(monkeypatch)
    with pytest.warns(UserWarning, match="another configuration"):
        clf = _fed(_estimator(lr=0.02), n_rounds=2, checkpoint_path=path).fit(X, y)
    assert len(calls) == 6  # trained from scratch
    assert [r["lr"] for r in clf.history_] == [0.02, 0.02]
    fresh = _fed(_estimator(lr=0.02), n_rounds=2).fit(X, y)
    np.testing.assert_array_equal(clf.decision_function(X), fresh.decision_function(X))


def test_checkpoint_of_other_data_ignored(tmp_path, monkeypatch):
    X, y = _data(n=30)
    path = str(tmp_path / "ckpt")
    _fed(n_rounds=2, checkpoint_path=path).fit(X, y)
    calls = _counting_local_update(monkeypatch)
    X2, y2 = _data(n=30, seed=5)
    with pytest.warns(UserWarning, match="another configuration"):
        _fed(n_rounds=2, checkpoint_path=path).fit(X2, y2)
    assert len(calls) == 6
