"""Tests for the Flower backend (``skfedspd.flower``, the ``flower`` extra).

- in-process simulation (``FederatedSPDnetClassifier(backend="flower")``): bit-identical
  to ``backend="local"`` for the same ``random_state`` (groups or partitions, partial
  participation, both rules, both weightings, FedBN local arrays, client failures,
  warm start), a few seconds each;
- deployment: a SuperLink and 2 SuperNodes as separate processes on 127.0.0.1 (free
  ports, one Flower home each, stopped by PID), 2 rounds through ``fit_federated``, the
  same model as the local backend. About 1.5 min on two CPU cores (a fresh ClientApp
  process per message: Python + torch start-up, plus the SuperNode's 3 s poll); it runs in
  CI, and alone with ``pytest -q tests/test_flower.py -k deployment``.

Telemetry and update checks are off (set here before flwr is imported); nothing leaves
the loopback interface.
"""

import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"

import pickle  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("flwr")

from conftest import make_eeg_timeseries, make_spd_dataset  # noqa: E402
from skfedspd import EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier  # noqa: E402
from skfedspd.base import TorchClassifierBase  # noqa: E402
from skfedspd.flower import fit_federated, write_app  # noqa: E402
from skfedspd.flower.loopback import LoopbackDeployment  # noqa: E402
from skfedspd.flower.server import SPDnetStrategy  # noqa: E402
from skfedspd.spec import estimator_from_spec, estimator_to_spec  # noqa: E402
from skfedspd.training import derive_seed  # noqa: E402

N_CHANNELS = 6


def _estimator(**kwargs):
    params = dict(hidden_dims=(3,), batch_size=8, lr=0.05)
    params.update(kwargs)
    return SPDnetClassifier(**params)


def _fed(backend, estimator=None, **kwargs):
    params = dict(n_rounds=3, local_epochs=1, n_clients=3, random_state=0)
    params.update(kwargs)
    return FederatedSPDnetClassifier(estimator if estimator is not None else _estimator(), backend=backend, **params)


def _without_time(history):
    return [{k: v for k, v in record.items() if k != "wall_time"} for record in history]


def assert_same_model(a, b):
    """Bit-identical global state, released model, history (but wall times) and metadata."""
    assert a._global.keys() == b._global.keys()
    for name in a._global:
        assert a._global[name].dtype == b._global[name].dtype, name
        np.testing.assert_array_equal(a._global[name], b._global[name], err_msg=name, strict=True)
    released_a = a.global_estimator_.module_.get_parameters()
    released_b = b.global_estimator_.module_.get_parameters()
    for name in released_a:
        np.testing.assert_array_equal(released_a[name], released_b[name], err_msg=name, strict=True)
    assert repr(_without_time(a.history_)) == repr(_without_time(b.history_))  # NaN-aware, exact floats
    assert a.best_round_ == b.best_round_
    np.testing.assert_array_equal(a.classes_, b.classes_)
    assert a.n_features_in_ == b.n_features_in_ and a.n_clients_ == b.n_clients_
    assert a._local_states.keys() == b._local_states.keys()


@pytest.fixture(scope="module")
def spd():
    return make_spd_dataset(60, N_CHANNELS, 3, seed=0)


# ---------------------------------------------------------------------------------------------
# In-process simulation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [
    dict(groups=True, clients_per_round=2),
    dict(groups=False, clients_per_round=1, aggregation="rlavg", weighting="uniform", partition="dirichlet"),
    dict(groups=False, clients_per_round=None, validation_fraction=0.0),
])
def test_simulation_bit_identical_to_local(spd, config):
    X, y = spd
    config = dict(config)
    groups = np.repeat(np.arange(4), 15) if config.pop("groups") else None
    local = _fed("local", **config).fit(X, y, groups=groups)
    flower = _fed("flower", **config).fit(X, y, groups=groups)
    assert_same_model(local, flower)
    assert flower.client_source_ == local.client_source_ and flower.client_groups_ == local.client_groups_
    np.testing.assert_array_equal(flower.predict_proba(X), local.predict_proba(X))
    m = flower._n_selected(flower.n_clients_)
    assert all(len(r["clients"]) == m and r["clients"] == sorted(r["clients"]) for r in flower.history_)


def test_simulation_history_format_and_labels(spd):
    X, codes = spd
    y = np.array(["feet", "left", "right"])[codes]
    local = _fed("local").fit(X, y)
    flower = _fed("flower").fit(X, y)
    assert_same_model(local, flower)
    assert [set(r) for r in flower.history_] == [set(r) for r in local.history_]
    assert all(r["wall_time"] > 0 for r in flower.history_)
    assert flower.predict(X).tolist() == local.predict(X).tolist()
    assert flower.classes_.tolist() == ["feet", "left", "right"]


def test_simulation_fedbn_local_arrays_eegnet():
    X, y = make_eeg_timeseries(n_trials=36, n_channels=4, n_times=32, n_classes=2, seed=0)
    groups = np.repeat([0, 1, 2], 12)
    estimator = EEGNetClassifier(F1=2, D=1, F2=2, p1=2, p2=2, batch_size=8, lr=1e-2, fs=32.0)
    local = _fed("local", estimator, n_rounds=2, clients_per_round=2).fit(X, y, groups=groups)
    flower = _fed("flower", estimator, n_rounds=2, clients_per_round=2).fit(X, y, groups=groups)
    assert local._local_states  # BatchNorm statistics stayed per client
    assert_same_model(local, flower)
    for cid in local._local_states:
        for name, value in local._local_states[cid].items():
            np.testing.assert_array_equal(value, flower._local_states[cid][name], strict=True)


def _failing(monkeypatch, failing_seeds):
    """Make the local estimator's ``local_update`` (both backends) fail for these seeds."""
    original = TorchClassifierBase.local_update

    def wrapper(*args, **kwargs):
        if kwargs["seed"] in failing_seeds:
            raise OSError("simulated site failure")
        return original(*args, **kwargs)

    monkeypatch.setattr(TorchClassifierBase, "local_update", wrapper)


def test_simulation_client_failure_matches_local(spd, monkeypatch):
    X, y = spd
    seed = int(np.random.RandomState(0).randint(0, 2**31 - 1))  # what random_state=0 draws
    failing = {derive_seed(seed, 10, 1, 1)}  # client 1 in round 1
    _failing(monkeypatch, failing)
    local = _fed("local", on_client_error="skip").fit(X, y)
    flower = _fed("flower", on_client_error="skip").fit(X, y)
    assert local.history_[1]["failed_clients"] == [1] and local.history_[1]["clients"] == [0, 2]
    assert_same_model(local, flower)
    with pytest.raises(RuntimeError, match="client 1 failed in round 1"):
        _fed("flower").fit(X, y)


def test_simulation_warm_start_continues_like_local(spd):
    X, y = spd
    local = _fed("local", n_rounds=2, warm_start=True).fit(X, y)
    flower = _fed("flower", n_rounds=2, warm_start=True).fit(X, y)
    local.fit(X, y)
    flower.fit(X, y)
    assert len(flower.history_) == 4
    assert_same_model(local, flower)


def test_simulation_early_stopping_sends_nothing_more(spd):
    X, y = spd
    kwargs = dict(n_rounds=6, estimator=_estimator(patience=1, lr=1e-300))  # no visible training: a flat score
    local = _fed("local", **kwargs).fit(X, y)
    flower = _fed("flower", **kwargs).fit(X, y)
    assert len(local.history_) < 6
    assert_same_model(local, flower)


def test_simulation_input_errors_as_local(spd):
    X, y = spd
    with pytest.raises(ValueError, match="backend must be"):
        _fed("ray").fit(X, y)
    with pytest.raises(ValueError, match="groups has"):
        _fed("flower").fit(X, y, groups=np.arange(3))
    with pytest.raises(ValueError, match="number of classes"):
        _fed("flower").fit(X, np.zeros(len(y)))
    with pytest.raises(ValueError, match="checkpoint_path"):
        _fed("flower", checkpoint_path="state.pkl").fit(X, y)


def test_strategy_samples_exactly_m_nodes(spd):
    X, y = spd
    flower = _fed("flower", clients_per_round=1, n_rounds=2).fit(X, y)
    assert [len(r["clients"]) for r in flower.history_] == [1, 1]
    strategy = SPDnetStrategy(flower, nodes=[11, 12, 13], n_train=[1, 1, 1], n_val=[1, 1, 1], setup_json="{}",
                              batch_size=8, kinds={})
    assert strategy.n_select == strategy.min_train_nodes == 1  # not FedAvg's default of 2


# ---------------------------------------------------------------------------------------------
# Estimator specs, the app
# ---------------------------------------------------------------------------------------------


def test_spec_round_trip():
    fed = _fed("local", estimator=_estimator(hidden_dims=(4, 3), scaling=None), aggregation="rlavg",
               clients_per_round=0.5)
    rebuilt = estimator_from_spec(estimator_to_spec(fed))
    assert type(rebuilt) is FederatedSPDnetClassifier
    assert rebuilt.estimator.get_params() == fed.estimator.get_params()
    assert rebuilt.estimator.hidden_dims == (4, 3)
    assert {k: v for k, v in rebuilt.get_params(deep=False).items() if k != "estimator"} == \
        {k: v for k, v in fed.get_params(deep=False).items() if k != "estimator"}
    with pytest.raises(TypeError, match="aggregation"):
        estimator_to_spec(_fed("local", aggregation=lambda *a: None))
    with pytest.raises(ValueError):
        estimator_from_spec({"class": "os.system", "params": {}})


def test_written_app_is_a_valid_flower_app(tmp_path):
    from flwr.cli.config_utils import load_and_validate

    config, _ = load_and_validate(write_app(tmp_path) / "pyproject.toml")
    components = config["tool"]["flwr"]["app"]["components"]
    assert components == {"serverapp": "skfedspd.flower.app:server_app",
                          "clientapp": "skfedspd.flower.app:client_app"}


# ---------------------------------------------------------------------------------------------
# Deployment: SuperLink + 2 SuperNodes on 127.0.0.1
# ---------------------------------------------------------------------------------------------


def _alive(pid):
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_deployment_loopback_equals_local(tmp_path, spd):
    X, y = spd
    groups = np.repeat([0, 1], 30)
    paths = []
    for g in (0, 1):
        path = tmp_path / f"site{g}.npz"
        np.savez(path, X=X[groups == g], y=y[groups == g])  # each site holds its own file
        paths.append(path)
    config = dict(n_rounds=2, n_clients=2)
    local = _fed("local", **config).fit(X, y, groups=groups)

    deployment = LoopbackDeployment(paths, root=tmp_path / "flower")
    with deployment:
        pids = [p.pid for p in deployment.processes.values()]
        assert len(pids) == 3 and deployment.address.startswith("127.0.0.1:")
        try:
            remote = fit_federated(_fed("local", **config), deployment.address, 2, tmp_path / "model.pkl",
                                   insecure=True, round_timeout=120, connect_timeout=120, timeout=240,
                                   quiet=True, log_path=tmp_path / "run.log")
        except Exception:
            for name in deployment.processes:
                print(f"---- {name}\n{deployment.log(name)[-3000:]}")
            raise
    assert not any(_alive(pid) for pid in pids)  # every process group stopped at exit

    assert_same_model(local, remote)
    assert remote.client_source_ == "flower:client-id"
    with open(tmp_path / "model.pkl", "rb") as f:  # what the server wrote
        np.testing.assert_array_equal(pickle.load(f).predict_proba(X), local.predict_proba(X))
    server_side = (tmp_path / "run.log").read_text() + deployment.log("superlink")
    assert "SPDnetStrategy" in server_side and "model written to" in server_side
    assert "site0.npz" not in server_side and "site1.npz" not in server_side  # paths stay on the sites
