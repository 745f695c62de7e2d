"""Tests for ``skfedspd.server_optimizer`` (FedAvgM on the Stiefel manifold) and its wiring in
the engine and ``FederatedSPDnetClassifier``: the defaults are the paper bit for bit, the
unit step reproduces the rule, the geometry (orthonormality, tangent momentum, exact inverse
retraction), checkpoint resume, the secure-aggregation property (weighted sum only) and
convergence on a small federated problem."""

import re

import numpy as np
import pytest
import torch

from conftest import make_spd_dataset
from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.aggregation import get_aggregation, projavg_from_sum, rlavg_from_sum
from skfedspd.engine import FederatedEngine
from skfedspd.messages import TrainReply
from skfedspd.persistence import load_bundle
from skfedspd.server_optimizer import ServerMomentum, inverse_retract, server_step
from skfedspd.stiefel import orthonormality_error, random_stiefel, retract, tangent_project

KINDS = {"W": "stiefel", "b": "euclidean", "s": "local"}
P, K = 8, 3


def _tangent(W, rng, scale):
    return scale * tangent_project(W, rng.standard_normal(W.shape))


def _model(rng):
    return {"W": random_stiefel(P, K, rng), "b": rng.standard_normal(4), "s": rng.standard_normal(2)}


def _clients(global_params, rng, n=4, scale=0.2):
    W, b = global_params["W"], global_params["b"]
    return [{"W": retract(W, _tangent(W, rng, scale)), "b": b + scale * rng.standard_normal(4),
             "s": rng.standard_normal(2)} for _ in range(n)]


def _engine(params, **kwargs):
    return FederatedEngine(params, KINDS, n_train=[10, 20, 30, 40], n_val=[0, 0, 0, 0], seed=0, lr=1e-3, **kwargs)


def _run(engine, rounds, rng):
    """Rounds of made-up client replies drawn around the current global model."""
    for t in range(engine.next_round, engine.next_round + rounds):
        replies = [TrainReply(p, 1.0, 0, n) for p, n in zip(_clients(engine.global_params, rng), engine.n_train)]
        engine.history.append(engine.aggregate(t, [0, 1, 2, 3], replies))
    return engine


@pytest.mark.parametrize("scale", [1e-3, 0.3, 1.0])
def test_inverse_retract_is_exact(scale):
    rng = np.random.default_rng(0)
    W = random_stiefel(P, K, rng)
    W_bar = retract(W, _tangent(W, rng, scale))
    xi = inverse_retract(W, W_bar)
    np.testing.assert_allclose(W.T @ xi + xi.T @ W, 0, atol=1e-12)  # tangent at W
    np.testing.assert_allclose(retract(W, xi), W_bar, atol=1e-12)


def test_inverse_retract_falls_back_to_projection_beyond_90_degrees():
    W = np.eye(P, K)
    W_bar = -W  # WᵀW̄ = −I: no tangent retracts to it
    np.testing.assert_array_equal(inverse_retract(W, W_bar), tangent_project(W, W_bar - W))


@pytest.mark.parametrize("rule", ["projavg", "rlavg", "karcher"])
def test_unit_step_without_momentum_equals_the_rule(rule):
    """η = 1, β = 0 through the general step gives the rule's aggregate (float precision)."""
    rng = np.random.default_rng(1)
    previous = _model(rng)
    clients = _clients(previous, rng)
    weights = np.array([0.1, 0.2, 0.3, 0.4])
    shared = {n: v for n, v in previous.items() if KINDS[n] != "local"}
    aggregate = get_aggregation(rule)(clients, weights, shared, KINDS)
    stepped, momentum = server_step(aggregate, shared, {}, KINDS, lr=1.0, beta=0.0)
    for name in shared:
        np.testing.assert_allclose(stepped[name], aggregate[name], atol=1e-12)
    np.testing.assert_allclose(momentum["b"], aggregate["b"] - previous["b"], atol=1e-15)


@pytest.mark.parametrize("lr,beta", [(1.0, 0.9), (0.1, 0.9), (2.0, 0.5), (1.0, 0.99)])
def test_geometry_along_a_run(lr, beta):
    """Orthonormal global weights to float precision, momentum tangent at the new weight,
    Euclidean arrays exactly FedAvgM, local arrays never stepped."""
    rng = np.random.default_rng(2)
    engine = _engine(_model(rng), server_optimizer=ServerMomentum(lr=lr, momentum=beta))
    for _ in range(15):
        b_prev = engine.global_params["b"].copy()
        _run(engine, 1, rng)
        W, m = engine.global_params["W"], engine.server_momentum_buffer["W"]
        assert orthonormality_error(W) < 1e-13
        np.testing.assert_allclose(W.T @ m + m.T @ W, 0, atol=1e-12)
        np.testing.assert_allclose(engine.global_params["b"] - b_prev, lr * engine.server_momentum_buffer["b"],
                                   rtol=1e-10, atol=1e-14)
    assert set(engine.server_momentum_buffer) == {"W", "b"}
    assert engine.history[-1]["orthonormality"]["W"] < 1e-13


def test_fedavgm_euclidean_recursion():
    previous = {"b": np.zeros(3)}
    aggregate = {"b": np.ones(3)}
    new, m = server_step(aggregate, previous, {"b": np.full(3, 2.0)}, {"b": "euclidean"}, lr=0.5, beta=0.9)
    np.testing.assert_allclose(m["b"], 0.9 * 2 + 1)
    np.testing.assert_allclose(new["b"], 0.5 * (0.9 * 2 + 1))


def test_momentum_is_transported_by_projection():
    rng = np.random.default_rng(3)
    W = random_stiefel(P, K, rng)
    m0 = _tangent(W, rng, 0.3)
    W_bar = retract(W, _tangent(W, rng, 0.2))
    new, m = server_step({"W": W_bar}, {"W": W}, {"W": m0}, {"W": "stiefel"}, lr=0.7, beta=0.5)
    full = 0.5 * m0 + inverse_retract(W, W_bar)
    np.testing.assert_allclose(new["W"], retract(W, 0.7 * full), atol=1e-14)
    np.testing.assert_allclose(m["W"], tangent_project(new["W"], full), atol=1e-14)


@pytest.mark.parametrize("rule,from_sum", [("projavg", projavg_from_sum), ("rlavg", rlavg_from_sum)])
def test_server_step_is_a_function_of_the_masked_sum(rule, from_sum):
    """Secure aggregation: the server sees only Σ_i (w_i θ_i + mask_i) with masks summing to
    zero; the rule from that sum, then the server step from the server's own state, gives
    the engine's global model (to the rounding of the masks)."""
    rng = np.random.default_rng(4)
    engine = _engine(_model(rng), aggregation=rule, server_optimizer=ServerMomentum(lr=1.0, momentum=0.9))
    _run(engine, 3, rng)  # a non-zero momentum
    previous = {n: v.copy() for n, v in engine.global_params.items() if KINDS[n] != "local"}
    momentum = {n: v.copy() for n, v in engine.server_momentum_buffer.items()}
    clients = _clients(engine.global_params, rng)
    replies = [TrainReply(p, 1.0, 0, n) for p, n in zip(clients, engine.n_train)]
    engine.aggregate(3, [0, 1, 2, 3], replies)

    weights = np.array(engine.n_train, dtype=np.float64) / sum(engine.n_train)
    masked = {}
    for name in previous:
        masks = [rng.standard_normal(previous[name].shape) for _ in clients[:-1]]
        masks.append(-sum(masks))
        masked[name] = sum(w * c[name] + mask for w, c, mask in zip(weights, clients, masks))
    expected, expected_momentum = server_step(from_sum(masked, previous, KINDS), previous, momentum, KINDS,
                                              lr=1.0, beta=0.9)
    for name in previous:
        np.testing.assert_allclose(engine.global_params[name], expected[name], atol=1e-12)
        np.testing.assert_allclose(engine.server_momentum_buffer[name], expected_momentum[name], atol=1e-12)


def test_engine_state_round_trip_resumes_bit_identically():
    rng = np.random.default_rng(5)
    start = _model(rng)
    straight = _run(_engine(start, server_optimizer=ServerMomentum(momentum=0.9)), 5, np.random.default_rng(6))
    rng_b = np.random.default_rng(6)
    first = _run(_engine(start, server_optimizer=ServerMomentum(momentum=0.9)), 2, rng_b)
    arrays, meta = first.state_dict()
    assert {"momentum/W", "momentum/b"} <= set(arrays)
    resumed = _engine(start, server_optimizer=ServerMomentum(momentum=0.9))
    resumed.load_state_dict(arrays, meta)
    _run(resumed, 3, rng_b)
    for name in ("W", "b"):
        np.testing.assert_array_equal(resumed.global_params[name], straight.global_params[name])
        np.testing.assert_array_equal(resumed.server_momentum_buffer[name], straight.server_momentum_buffer[name])


def test_engine_state_rejects_bad_momentum():
    rng = np.random.default_rng(7)
    engine = _run(_engine(_model(rng), server_optimizer=ServerMomentum(momentum=0.5)), 1, rng)
    arrays, meta = engine.state_dict()
    with pytest.raises(ValueError, match="momentum arrays"):
        engine.load_state_dict(dict(arrays, **{"momentum/W": np.zeros((2, 2))}), meta)
    with pytest.raises(ValueError, match="momentum arrays"):
        engine.load_state_dict(dict(arrays, **{"momentum/s": np.zeros(2)}), meta)


@pytest.mark.parametrize("params", [{"lr": 0}, {"lr": -1.0}, {"momentum": 1.0}, {"momentum": -0.1}, {"lr": "1"}])
def test_invalid_parameters(params):
    X, y = make_spd_dataset(20, 6, 2, seed=0)
    with pytest.raises(ValueError, match=f"'{next(iter(params))}' parameter of ServerMomentum"):
        _fed(server_optimizer=ServerMomentum(**params)).fit(X, y)


# ---------------------------------------------------------------------- the estimator
def _fed(**kwargs):
    params = dict(n_rounds=3, local_epochs=1, n_clients=3, random_state=0, partition="stratified")
    params.update(kwargs)
    return FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=(3,), batch_size=8, lr=0.05, early_stopping=True), **params)


def test_defaults_are_the_paper_bit_for_bit(monkeypatch):
    """ServerMomentum(lr=1, momentum=0) (explicit, or None by default) never calls the server step and
    gives the fit of the plain rule bit for bit."""
    import skfedspd.engine as engine_module

    X, y = make_spd_dataset(60, 6, 3, seed=0)
    plain = _fed().fit(X, y)

    def forbidden(*args, **kwargs):
        raise AssertionError("server step called at the defaults")

    monkeypatch.setattr(engine_module, "server_step", forbidden)
    explicit = _fed(server_optimizer=ServerMomentum(lr=1.0, momentum=0.0)).fit(X, y)
    np.testing.assert_array_equal(explicit.decision_function(X), plain.decision_function(X))
    for name, value in plain.engine_.global_params.items():
        np.testing.assert_array_equal(explicit.engine_.global_params[name], value)
    assert explicit.engine_.server_momentum_buffer == {}
    monkeypatch.undo()
    moved = _fed(server_optimizer=ServerMomentum(momentum=0.5)).fit(X, y)
    assert not np.array_equal(moved.decision_function(X), plain.decision_function(X))


def test_checkpoint_resume_with_momentum_is_bit_identical(tmp_path, monkeypatch):
    X, y = make_spd_dataset(60, 6, 3, seed=0)
    params = dict(n_rounds=4, server_optimizer=ServerMomentum(), clients_per_round=2, n_clients=4)
    uninterrupted = _fed(checkpoint_path=str(tmp_path / "A.ckpt"), **params).fit(X, y)

    original, calls = SPDnetClassifier.local_update, []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # first client of round 3
            raise RuntimeError("interrupted")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SPDnetClassifier, "local_update", failing)
    with pytest.raises(RuntimeError, match="round 2"):
        _fed(checkpoint_path=str(tmp_path / "B.ckpt"), **params).fit(X, y)
    arrays, meta = load_bundle(tmp_path / "B.ckpt", kind="federated-checkpoint")
    assert len(meta["history"]) == 2
    monkeypatch.undo()
    resumed = _fed(checkpoint_path=str(tmp_path / "B.ckpt"), **params).fit(X, y)
    np.testing.assert_array_equal(resumed.decision_function(X), uninterrupted.decision_function(X))
    for name, value in uninterrupted.engine_.server_momentum_buffer.items():
        np.testing.assert_array_equal(resumed.engine_.server_momentum_buffer[name], value)


def test_server_momentum_still_converges():
    """A small federated problem (3 clients, separable classes): FedAvgM on the Stiefel
    manifold (η = 1, β = 0.9) learns it as well as the paper's rule, with the paper's clients
    (a fresh Adam every round), with which the setting was validated."""
    torch.manual_seed(0)
    X, y = make_spd_dataset(150, 6, 2, seed=1)
    X_test, y_test = make_spd_dataset(90, 6, 2, seed=2)
    paper = _fed(n_rounds=15, client_optimizer_state="reset").fit(X, y)
    momentum = _fed(n_rounds=15, server_optimizer=ServerMomentum(), client_optimizer_state="reset").fit(X, y)
    assert momentum.score(X_test, y_test) >= min(0.9, paper.score(X_test, y_test) - 0.05)
    assert all(max(r["orthonormality"].values()) < 1e-10 for r in momentum.history_)


def test_saved_estimator_keeps_the_momentum(tmp_path):
    from skfedspd.persistence import load_estimator, save_estimator

    X, y = make_spd_dataset(40, 6, 2, seed=0)
    fitted = _fed(n_rounds=2, server_optimizer=ServerMomentum(lr=0.5, momentum=0.9)).fit(X, y)
    save_estimator(fitted, tmp_path / "fed.skfedspd")
    loaded = load_estimator(tmp_path / "fed.skfedspd")
    assert loaded.get_params()["server_optimizer"].get_params() == {"lr": 0.5, "momentum": 0.9}
    assert set(loaded.engine_.server_momentum_buffer) == set(fitted.engine_.server_momentum_buffer) != set()
    for name, value in fitted.engine_.server_momentum_buffer.items():
        np.testing.assert_array_equal(loaded.engine_.server_momentum_buffer[name], value)
    np.testing.assert_array_equal(loaded.decision_function(X), fitted.decision_function(X))


@pytest.mark.parametrize("momentum, state, warns", [(0.9, "keep", True), (0.5, "keep", True), (0.9, "reset", False),
                                                    (0.0, "keep", False)])
def test_server_momentum_with_kept_client_state_warns(momentum, state, warns):
    """The pair measured bad in Table I (docs/design-decisions.md) is named at fit."""
    import warnings

    from skfedspd.federated import KEEP_WITH_SERVER_MOMENTUM_WARNING

    X, y = make_spd_dataset(40, 4, 2, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fed(n_rounds=1, server_optimizer=ServerMomentum(momentum=momentum), client_optimizer_state=state).fit(X, y)
    assert (KEEP_WITH_SERVER_MOMENTUM_WARNING in [str(w.message) for w in caught]) == warns


def test_fit_federated_warns_about_server_momentum_with_kept_client_state(tmp_path):
    """A deployed run is warned before it is submitted, as ``fit`` is."""
    pytest.importorskip("flwr")
    from skfedspd.federated import KEEP_WITH_SERVER_MOMENTUM_WARNING
    from skfedspd.flower import fit_federated

    taken = tmp_path / "model.skfedspd"
    taken.write_text("an earlier model")
    with pytest.warns(UserWarning, match=re.escape(KEEP_WITH_SERVER_MOMENTUM_WARNING)):
        with pytest.raises(FileExistsError):  # stops before anything is submitted
            fit_federated(_fed(server_optimizer=ServerMomentum()), "127.0.0.1:1", 2, taken)
