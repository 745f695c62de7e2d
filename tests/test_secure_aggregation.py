"""Tests for secure aggregation on Flower (``skfedspd.flower.secure``, SecAgg+).

In the in-process Flower simulation, ``secure_aggregation=True`` gives the plain global
model within 1e-5 (ProjAvg and RLAvg, also with a site dropping out of a round, with sample
weights and class weights), the server receives only masked vectors and totals, and the
totals are checked by the engine.
A few seconds per fit on two CPU cores.
"""

import contextlib
import logging
import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("flwr")

from conftest import make_eeg_timeseries, make_spd_dataset  # noqa: E402
from flwr.common import bytes_to_ndarray  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key  # noqa: E402

from skfedspd import EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier  # noqa: E402
from skfedspd.backends import FlowerBackend  # noqa: E402
from skfedspd.clients import ClientPartition  # noqa: E402
from skfedspd.engine import FederatedEngine  # noqa: E402
from skfedspd.flower import secure  # noqa: E402
from skfedspd.training import derive_seed  # noqa: E402
from test_flower import _failing  # noqa: E402

TOL = 1e-5  # the target; measured: ~1e-12 (two 24-bit limbs per entry)


@pytest.fixture(scope="module")
def spd():
    return make_spd_dataset(n_matrices=120, n_channels=6, n_classes=3, seed=0)


def _fed(backend, secure_aggregation=False, estimator=None, **kwargs):
    """``backend`` "local" or "flower"; ``secure_aggregation`` (Flower's SecAgg+) makes it a
    ``FlowerBackend(secure_aggregation=True)``."""
    params = dict(n_rounds=3, local_epochs=1, random_state=0, clients=ClientPartition(n_clients=3, partition="stratified"))
    params.update(kwargs)
    estimator = estimator if estimator is not None else SPDnetClassifier(hidden_dims=(3,), batch_size=8, lr=0.05, early_stopping=True)
    if secure_aggregation:
        backend = FlowerBackend(secure_aggregation=True)
    return FederatedSPDnetClassifier(estimator, backend=backend, **params)


def assert_close_runs(plain, secured):
    """Same global model within TOL every round's end, same participants, totals of the
    plain per-client values."""
    for name, value in plain.engine_.global_params.items():
        np.testing.assert_allclose(secured.engine_.global_params[name], value, rtol=0, atol=TOL, err_msg=name)
    assert len(plain.history_) == len(secured.history_)
    for a, b in zip(plain.history_, secured.history_):
        assert b["clients"] == a["clients"]
        assert [(f["client"], f["stage"]) for f in b["failed_clients"]] == [
            (f["client"], f["stage"]) for f in a["failed_clients"]]
        assert b["n_samples"] == pytest.approx([sum(a["n_samples"])], rel=1e-12)  # counts, or sums of weights
        assert b["skipped_batches"] == a["skipped_batches"]
        np.testing.assert_allclose(b["train_loss"], a["train_loss"], rtol=0, atol=1e-4)
        np.testing.assert_allclose(b["val_loss"], a["val_loss"], rtol=0, atol=1e-4)
        np.testing.assert_allclose(b["val_f1"], a["val_f1"], rtol=0, atol=1e-6)
        for name, error in b["orthonormality"].items():
            assert error < 1e-12, name


@pytest.mark.parametrize("server", [{}, {"server_momentum": 0.9}], ids=["paper", "server-momentum"])
@pytest.mark.parametrize("aggregation", ["projavg", "rlavg"])
def test_secure_matches_plain(spd, aggregation, server):
    """Also with the server optimizer: its step uses the aggregate of the weighted sum and
    the server's own state only, so secure aggregation gives the same model."""
    X, y = spd
    plain = _fed("local", aggregation=aggregation, **server).fit(X, y)
    secured = _fed("flower", True, aggregation=aggregation, **server).fit(X, y)
    assert_close_runs(plain, secured)
    for name, value in plain.engine_.server_momentum_buffer.items():
        np.testing.assert_allclose(secured.engine_.server_momentum_buffer[name], value, rtol=0, atol=TOL)


@pytest.mark.parametrize("aggregation, weights", [
    ("projavg", dict(sample_weight=True)),
    ("rlavg", dict(sample_weight=True, class_weight="balanced")),
], ids=["projavg-sample_weight", "rlavg-both"])
def test_secure_with_sample_weight_matches_plain(spd, aggregation, weights):
    """Each site's weighted arrays and loss enter the masked sum with ``r_i = w_i / w_max``
    (``w_i`` the sum of its training sample weights), and ``w_i / w_max`` gives the round's
    total weight: the plain weighted model and totals."""
    X, y = spd
    last = y == y.max()
    keep = ~last | (np.cumsum(last) % 2 == 1)  # half of the last class: the classes weigh apart
    X, y = X[keep], y[keep]
    w = np.random.default_rng(1).uniform(0.2, 3.0, len(y)) if weights.get("sample_weight") else None
    estimator = SPDnetClassifier(hidden_dims=(3,), batch_size=8, lr=0.05, early_stopping=True, class_weight=weights.get("class_weight"))
    plain = _fed("local", estimator=estimator, aggregation=aggregation).fit(X, y, sample_weight=w)
    secured = _fed("flower", True, estimator=estimator, aggregation=aggregation).fit(X, y, sample_weight=w)
    assert all(isinstance(n, float) for record in plain.history_ for n in record["n_samples"])
    assert_close_runs(plain, secured)
    unweighted = _fed("local", aggregation=aggregation).fit(X, y)
    assert not np.allclose(unweighted.engine_.global_params["head.weight"], secured.engine_.global_params[
        "head.weight"], rtol=0, atol=1e-3)


def test_secure_dp_matches_plain_dp(spd):
    """DP noise is added on each site before the secure sum, which only sums: the secure DP
    run is the plain Flower DP run (same seeds, partial participation), with its budget."""
    X, y = spd
    dp = dict(estimator=SPDnetClassifier(hidden_dims=(3,), scaling="trace", batch_size=8, lr=0.05), n_clients=4,
              clients_per_round=3, validation_fraction=0.0, dp_epsilon=4.0, dp_delta=1e-3)
    plain = _fed("flower", **dp).fit(X, y)
    secured = _fed("flower", True, **dp).fit(X, y)
    assert_close_runs(plain, secured)
    assert secured.privacy_ == plain.privacy_ and secured.privacy_ is not None
    assert [s["rounds_run"] for s in secured.privacy_["sites"]] == [s["rounds"] for s in plain.privacy_["sites"]]
    assert all(0 < s["epsilon"] <= 4.0 for s in secured.privacy_["sites"])
    assert all(np.isnan(r["train_loss"]) and np.isnan(r["val_f1"]) for r in secured.history_)


@pytest.mark.parametrize("estimator", [
    # float64: in float32 a mean can sit exactly on a rounding midpoint, and local Adam turns
    # the last bit into an lr-sized step where a gradient is ~0 (bn1.bias, cancelled by bn2)
    EEGNetClassifier(batch_size=8, lr=1e-2, dtype="float64"),
    SPDnetClassifier(hidden_dims=(3,), batchnorm="spd", batch_size=8, lr=0.05, early_stopping=True),
], ids=["eegnet-batchnorm", "spdnet-batchnorm"])
def test_secure_with_client_local_arrays_matches_plain(estimator):
    """Client-local arrays (BatchNorm statistics) stay on their site under secure
    aggregation: the server holds none per client, the sites validate with their own, and
    the released model's pooled statistics come from the secure sum; all as in plain mode."""
    if isinstance(estimator, EEGNetClassifier):
        X, y = make_eeg_timeseries(n_trials=60, n_channels=4, n_times=64, n_classes=2, seed=0)
    else:
        X, y = make_spd_dataset(n_matrices=120, n_channels=6, n_classes=3, seed=0)
    plain = _fed("local", estimator=estimator).fit(X, y)
    secured = _fed("flower", True, estimator=estimator).fit(X, y)
    local = [n for n, kind in plain.engine_.kinds.items() if kind == "local"]
    assert local and sorted(plain.engine_.local_states) == [0, 1, 2]
    assert secured.engine_.local_states == {}
    assert_close_runs(plain, secured)


def test_secure_bounds_of_a_count_grow_with_the_rounds():
    """BatchNorm's num_batches_tracked only grows: its secure-sum bound covers what it can
    reach by each round (at most one batch per sample and epoch), however long the run,
    while the running statistics keep LOCAL_RANGE."""
    X, y = make_eeg_timeseries(n_trials=60, n_channels=4, n_times=64, n_classes=2, seed=0)
    engine = _fed("local", estimator=EEGNetClassifier(batch_size=8), n_rounds=1).fit(X, y).engine_
    strategy = secure.SecureSPDnetStrategy(engine, nodes=[1, 2, 3], setup_json="{}", local_epochs=2)
    batches = max(engine.n_train) * 2
    for t in (0, 10_000):
        bounds = dict(strategy.local_bounds(t, batches))
        counts = {n: b for n, b in bounds.items() if n.endswith("num_batches_tracked")}
        assert counts and all(b == max(secure.LOCAL_RANGE, (t + 1) * batches) for b in counts.values())
        assert all(b == secure.LOCAL_RANGE for n, b in bounds.items() if n not in counts)
    assert max(counts.values()) > secure.LOCAL_RANGE  # where a fixed range failed the site


def test_progress_advances_every_secure_round(spd, monkeypatch):
    """verbose: the simulation's bar takes one step per secure round, with the pooled
    validation macro-F1; a deployment's bar reads the same from the server's log."""
    from skfedspd.flower import deploy, simulation_fit

    bars, lines = [], []

    class Recording(deploy.RoundProgress):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(simulation_fit, "RoundProgress", Recording)
    monkeypatch.setattr(simulation_fit, "quiet_flower_logs", contextlib.nullcontext)  # keep the INFO lines
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("flwr").addHandler(handler)
    try:
        secured = _fed("flower", True, verbose=True).fit(*spd)
    finally:
        logging.getLogger("flwr").removeHandler(handler)
    scores = [record["val_f1"] for record in secured.history_]
    (bar,) = bars
    assert bar.rounds == bar.bar.n == 3 and bar.scores == scores
    from_log = deploy.RoundProgress(3, disable=True)
    for line in lines:
        from_log.feed(line)
    assert from_log.rounds == 3 and from_log.scores == scores


def test_two_limbs_keep_float64_precision_through_flower_quantization():
    """Flower's stochastic 24-bit quantization of the two limbs of M vectors, summed and
    dequantized as the SecAgg+ server does, gives the sum to ~1e-14 (one limb: ~1e-7)."""
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    rng = np.random.default_rng(0)
    vectors = [[rng.uniform(-1, 1, (50, 7))] for _ in range(5)]
    q = 2**secure.QUANTIZATION_BITS
    quantized = [quantize(secure.split_limbs(v), 1.0, q) for v in vectors]
    summed = [sum(parts) for parts in zip(*quantized)]
    recovered = secure.join_limbs([a + 1.0 - len(vectors) for a in dequantize(summed, 1.0, q)])[0]
    exact = sum(v[0] for v in vectors)
    assert np.abs(recovered - exact).max() < 1e-13
    one_limb = dequantize([sum(quantize(v, 1.0, q)[0] for v in vectors)], 1.0, q)[0] + 1.0 - len(vectors)
    assert np.abs(one_limb - exact).max() > 1e-9  # what a single limb would give


@pytest.mark.parametrize("aggregation", ["projavg", "rlavg"])
def test_secure_with_a_dropped_site_matches_plain(spd, monkeypatch, aggregation):
    """3 sites: SecAgg+ recovers a secret from 2 shares, so one site may drop out after
    the key exchange; its pairwise masks are reconstructed and the sum covers the others."""
    assert secure.SecureSum().threshold(3) == 2
    X, y = spd
    seed = int(np.random.RandomState(0).randint(0, 2**31 - 1))  # what random_state=0 draws
    _failing(monkeypatch, {derive_seed(seed, 10, 1, 1)})  # client 1 in round 1
    plain = _fed("local", aggregation=aggregation, on_client_error="skip").fit(X, y)
    with pytest.warns(RuntimeWarning, match="client 1 left out"):
        secured = _fed("flower", True, aggregation=aggregation, on_client_error="skip").fit(X, y)
    assert secured.history_[1]["clients"] == [0, 2]
    reason = secured.history_[1]["failed_clients"][0]["reason"]
    assert "dropped out of the secure aggregation" in reason and "simulated site failure" in reason
    assert_close_runs(plain, secured)
    with pytest.raises(RuntimeError, match="client 1 failed in round 1"):
        _fed("flower", True, aggregation=aggregation).fit(X, y)


def test_server_sees_only_masked_vectors(spd, monkeypatch):
    """Every train/validation reply the server receives carries no clear array, metric or
    count, and its masked vector is far from the site's true (scaled, weighted) vector."""
    X, y = spd
    true_vectors, replies = [], []
    for name in ("train_vector", "eval_vector"):
        original = getattr(secure, name)

        def recording(*args, _original=original, **kwargs):
            vector = _original(*args, **kwargs)
            true_vectors.append(vector)
            return vector

        monkeypatch.setattr(secure, name, recording)
    original_send = secure._RecordingGrid.send_and_receive

    def spy(self, messages, *, timeout=None):
        received = original_send(self, messages, timeout=timeout)
        replies.extend(m for m in received if not m.has_error())
        return received

    monkeypatch.setattr(secure._RecordingGrid, "send_and_receive", spy)
    _fed("flower", True, n_rounds=2).fit(X, y)

    masked = [m for m in replies if Key.MASKED_PARAMETERS in m.content.config_records[RECORD_KEY_CONFIGS]]
    assert len(masked) == 2 * (3 + 3) == len(true_vectors)  # 2 rounds × (3 train + 3 validation)
    q = 2**secure.QUANTIZATION_BITS
    limbs = [np.concatenate([np.ravel(a) for a in secure.split_limbs(v)]) for v in true_vectors]
    sizes = {true.size for true in limbs}
    assert len(sizes) == 2  # train and validation vectors
    for message in masked:
        content = message.content
        assert all(len(record) == 0 for record in content.array_records.values())  # no clear arrays
        assert "metrics" not in content and "arrays" not in content
        assert content.metric_records["fitres.num_examples"]["num_examples"] == 1  # a constant, not n_i
        assert len(content.config_records["fitres.metrics"]) == 0
        vector = np.concatenate([np.ravel(bytes_to_ndarray(b)) for b in
                                 content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]])
        seen = vector[1:] * 2.0 / q - 1.0  # as the server would dequantize it (after the weight factor)
        assert seen.size in sizes
        for true in limbs:
            if true.size == seen.size:
                assert np.median(np.abs(seen - true)) > 10.0  # masks are uniform on [0, 2**32)
    # and the true vectors are the scaled weighted values, all in [-1, 1]
    assert all(np.abs(v).max() <= 1.0 for v in limbs)


def test_site_values_outside_the_range_fail_the_site():
    layout = {"stage": "train", "arrays": [["W", 1.0], ["head", secure.EUCLIDEAN_RANGE]], "weighting": "n_samples",
              "n-max": 10, "skipped-range": 100.0}
    ok = secure.train_vector(layout, {"W": np.eye(3, 2), "head": np.full(4, 3.0)}, 0.5, 0, 5)
    np.testing.assert_allclose(ok[0], 0.5 * np.eye(3, 2))
    np.testing.assert_allclose(ok[1], 0.5 * 3.0 / secure.EUCLIDEAN_RANGE)
    np.testing.assert_allclose(ok[2], [0.5, 0.5, 0.5 * 0.5 / secure.LOSS_RANGE, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"array 'head' leaves the secure-aggregation range ±16$"):
        secure.train_vector(layout, {"W": np.eye(3, 2), "head": np.full(4, 20.0)}, 0.5, 0, 5)
    with pytest.raises(ValueError, match="train-loss leaves"):
        secure.train_vector(layout, {"W": np.eye(3, 2), "head": np.zeros(4)}, 1e3, 0, 5)
    with pytest.raises(ValueError, match=r"num-examples outside \[1, 10\]"):
        secure.train_vector(layout, {"W": np.eye(3, 2), "head": np.zeros(4)}, 0.5, 0, 11)
    nan = secure.train_vector(layout, {"W": np.eye(3, 2), "head": np.zeros(4)}, float("nan"), 2, 5)
    np.testing.assert_allclose(nan[2], [0.5, 0.5, 0.0, 1.0, 0.02])
    with pytest.raises(ValueError, match="val-f1 leaves"):
        secure.eval_vector({"stage": "evaluate", "n-max": 4}, 0.3, 1.5, 2)
    weighted = dict(layout, **{"weight-max": 8.0})
    params = {"W": np.eye(3, 2), "head": np.full(4, 3.0)}
    np.testing.assert_allclose(secure.train_vector(weighted, params, 0.5, 0, 5, weight=2.0)[2],
                               [0.25, 0.5, 0.25 * 0.5 / secure.LOSS_RANGE, 0.0, 0.0, 0.25])
    unweighted_site = secure.train_vector(weighted, params, 0.5, 0, 5)[2]  # weighs its 5 samples
    np.testing.assert_allclose(unweighted_site[[0, 5]], [5 / 8, 5 / 8])
    with pytest.raises(ValueError, match=r"client weight outside \(0, 8\]"):
        secure.train_vector(weighted, params, 0.5, 0, 5, weight=8.5)


def _engine(**kwargs):
    W = np.linalg.qr(np.random.default_rng(0).standard_normal((4, 2)))[0]
    params = dict(n_train=[10, 20, 30], n_val=[2, 2, 2], seed=0, lr=0.1)
    params.update(kwargs)
    return FederatedEngine({"W": W, "b": np.zeros(3)}, {"W": "stiefel", "b": "euclidean"}, **params)


def test_engine_checks_the_totals():
    engine = _engine(on_client_error="skip")
    W = engine.global_params["W"]
    summed = {"W": 60 * W, "b": np.ones(3)}
    args = dict(summed=summed, weight=60.0, loss=30.0, n_nan_loss=0.0, n_skipped=0.0)
    with pytest.raises(RuntimeError, match="num-examples total 61 is not between 3 and the 60"):
        engine.aggregate_from_sum(0, [0, 1, 2], [0, 1, 2], {}, n_examples=61.0, **args)
    with pytest.raises(RuntimeError, match="non-finite"):
        engine.aggregate_from_sum(0, [0, 1, 2], [0, 1, 2], {}, n_examples=60.0,
                                  **dict(args, summed={"W": np.full((4, 2), np.nan), "b": np.ones(3)}))
    assert engine.history == [] and np.array_equal(engine.global_params["W"], W)  # untouched
    with pytest.warns(RuntimeWarning, match="client 1 left out .*dropped out of the secure aggregation .timeout"):
        record = engine.aggregate_from_sum(0, [0, 1, 2], [0, 2], {1: "timeout"}, n_examples=40.0,
                                           **dict(args, weight=40.0, summed={"W": 40 * W, "b": np.ones(3)}))
    np.testing.assert_allclose(engine.global_params["W"], W, atol=1e-12)
    np.testing.assert_allclose(engine.global_params["b"], np.ones(3) / 40)
    assert record["n_samples"] == [40] and record["train_loss"] == 0.75
    with pytest.raises(RuntimeError, match="val-f1 1.2 out of range"):
        engine.finish_round_from_sum(record, [0, 1, 2], {}, n_examples=6.0, loss=0.5, f1=1.2)
    with pytest.raises(RuntimeError, match="client 1 failed to evaluate in round 0"):
        _engine().finish_round_from_sum(record, [0, 2], {}, n_examples=4.0, loss=0.5, f1=0.5)


def test_engine_checks_the_total_weight():
    """With sample weights the total weight is checked against the clients' declared sums
    (a client without weights counts its training size) and recorded as ``n_samples``."""
    engine = _engine(train_weights=[2.5, None, 12.0])
    W = engine.global_params["W"]
    args = dict(summed={"W": W, "b": np.ones(3)}, weight=1.0, n_examples=60.0, loss=0.5, n_nan_loss=0.0, n_skipped=0.0)
    with pytest.raises(RuntimeError, match=r"client weight total 35.0 is not in \(0, 34.5\]"):
        engine.aggregate_from_sum(0, [0, 1, 2], [0, 1, 2], {}, total_weight=35.0, **args)
    with pytest.raises(RuntimeError, match="client weight total 0.0 is not in"):
        engine.aggregate_from_sum(0, [0, 1, 2], [0, 1, 2], {}, total_weight=0.0, **args)
    record = engine.aggregate_from_sum(0, [0, 1, 2], [0, 1, 2], {}, total_weight=30.25, **args)
    assert record["n_samples"] == [30.25]


def test_secure_configuration_errors(spd):
    X, y = spd
    with pytest.warns(FutureWarning, match="backend=FlowerBackend"):  # the flat name of before chooses Flower
        assert FederatedSPDnetClassifier(secure_aggregation=True).backend.get_params() == {"secure_aggregation": True}
    for aggregation in ("karcher", "geomedian"):  # rules that need each client's update
        with pytest.raises(ValueError, match="not a function of the weighted sum: it needs each client's update"):
            secure.check_secure_engine(_engine(aggregation=aggregation))
    with pytest.raises(ValueError, match="between 3 and 255 sites per round"):
        secure.check_secure_engine(_engine(clients_per_round=2))
    engine = FederatedEngine({"w": np.zeros(2), "bn": np.zeros(2)}, {"w": "euclidean", "bn": "local"},
                             n_train=[1, 1, 1], n_val=[1, 1, 1], seed=0, lr=0.1)
    secure.check_secure_engine(engine)  # client-local arrays stay on the sites
    args = dict(summed={"w": np.ones(2)}, weight=3.0, n_examples=3.0, loss=0.0, n_nan_loss=0.0, n_skipped=0.0)
    with pytest.raises(RuntimeError, match="pooled local arrays are a NoneType"):
        engine.aggregate_from_sum(0, [0, 1, 2], [0, 1, 2], {}, **args)
    engine.aggregate_from_sum(0, [0, 1, 2], [0, 1, 2], {}, pooled_local={"bn": np.full(2, 0.5)}, **args)
    np.testing.assert_array_equal(engine.global_params["bn"], [0.5, 0.5])
    assert engine.local_states == {}
