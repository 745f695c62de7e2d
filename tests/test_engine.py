"""Tests for ``skfedspd.engine``: the federated engine on its own (no training).

A toy model with one Stiefel array, one Euclidean array and one client-local array, three
clients, replies built by hand: every check of a reply, the failure policy, the
aggregation-rule check, the schedule in rounds, the state round trip. Milliseconds each.
"""

import json
import re

import numpy as np
import pytest

from skfedspd.aggregation import FLTrust, GeometricMedian, Krum, TrimmedMean, client_distances, projavg, rule_name
from skfedspd.engine import (
    SUSPECT_DISTANCE,
    FederatedEngine,
    check_aggregate,
    client_trust,
    n_selected,
    stiefel_tolerance,
)
from skfedspd.messages import EvalReply, TrainReply
from skfedspd.stiefel import random_stiefel
from skfedspd.training import RoundSchedule, derive_seed

KINDS = {"W": "stiefel", "b": "euclidean", "bn": "local"}


def _initial(dtype=np.float64):
    return {"W": random_stiefel(5, 2, 0).astype(dtype), "b": np.zeros(3, dtype), "bn": np.ones(2, dtype)}


def _engine(**kwargs):
    params = dict(n_train=[10, 20, 30], n_val=[2, 0, 3], seed=0, lr=0.1, on_client_error="skip")
    params.update(kwargs)
    return FederatedEngine(_initial(params.pop("dtype", np.float64)), KINDS, **params)


def _honest(engine, cid, shift=0.01):
    """A plausible reply of client ``cid``: a small step from the broadcast."""
    g = engine.global_params
    rng = np.random.default_rng(cid)
    W = g["W"] + shift * rng.standard_normal(g["W"].shape)
    u, _, vt = np.linalg.svd(W, full_matrices=False)
    params = {"W": (u @ vt).astype(engine.template["W"][1]), "b": (g["b"] + shift * (cid + 1)).astype(g["b"].dtype),
              "bn": np.full(2, float(cid), dtype=engine.template["bn"][1])}
    return TrainReply(params, 0.5, 0, engine.n_train[cid])


def _tampered(engine, cid, change):
    reply = _honest(engine, cid)
    change(reply)
    return reply


def _set(name, value):
    def change(reply):
        reply.params[name] = value(reply.params[name]) if callable(value) else value
    return change


def _attr(name, value):
    def change(reply):
        setattr(reply, name, value)
    return change


def _drop(name):
    def change(reply):
        del reply.params[name]
    return change


BAD_TRAIN_REPLIES = {
    "nan": (_set("b", lambda b: np.where(np.arange(3) == 0, np.nan, b)), r"arrays\['b'\] has 1 non-finite"),
    "inf": (_set("W", lambda W: np.full_like(W, np.inf)), r"arrays\['W'\] has 10 non-finite"),
    "nan_local": (_set("bn", lambda a: a * np.nan), r"arrays\['bn'\] has 2 non-finite"),
    "wrong_shape": (_set("W", np.zeros((7, 4))), r"arrays\['W'\] has shape \(7, 4\), expected \(5, 2\)"),
    "broadcastable_shape": (_set("b", np.zeros((3, 1))), r"shape \(3, 1\), expected \(3,\)"),
    "missing_name": (_drop("b"), r"arrays lack \['b'\]"),
    "extra_name": (_set("head.extra", np.zeros(2)), r"unexpected names \['head.extra'\]"),
    "not_an_array": (_set("b", [0.0, 0.0, 0.0]), r"arrays\['b'\] is a list"),
    "wrong_dtype": (_set("b", lambda b: b.astype(np.float32)), r"dtype float32, expected float64"),
    "integer_dtype": (_set("b", lambda b: b.astype(np.int64)), r"dtype int64, expected float64"),
    "not_orthonormal": (_set("W", lambda W: 1.01 * W), r"arrays\['W'\] is not orthonormal"),
    "huge_norm": (_set("b", lambda b: b + 1e7), r"arrays\['b'\] moved by .* > max_update_norm"),
    "inflated_count": (_attr("n_examples", 10**9), r"num-examples 1000000000 is not an int between 1 and the 20"),
    "zero_count": (_attr("n_examples", 0), r"num-examples 0"),
    "float_count": (_attr("n_examples", 20.0), r"num-examples 20.0"),
    "bool_count": (_attr("n_examples", True), r"num-examples True"),
    "negative_loss": (_attr("loss", -1.0), r"train-loss -1.0"),
    "inf_loss": (_attr("loss", np.inf), r"train-loss inf"),
    "nan_loss_without_skips": (_attr("loss", np.nan), r"train-loss nan"),
    "string_loss": (_attr("loss", "0.5"), r"train-loss '0.5'"),
    "negative_skips": (_attr("n_skipped", -1), r"skipped-batches -1"),
    "params_not_a_dict": (_attr("params", [1, 2]), r"arrays are a list"),
}


@pytest.mark.parametrize("case", sorted(BAD_TRAIN_REPLIES))
def test_bad_train_reply_is_a_failed_client_and_never_aggregated(case):
    change, reason = BAD_TRAIN_REPLIES[case]
    honest_only, engine = _engine(), _engine()
    replies = [_honest(engine, 0), _tampered(engine, 1, change), _honest(engine, 2)]
    assert engine.check_train_reply(1, replies[1]) is not None
    with pytest.warns(RuntimeWarning, match="client 1 left out"):
        record = engine.aggregate(0, [0, 1, 2], replies)
    expected = honest_only.aggregate(0, [0, 2], [_honest(honest_only, 0), _honest(honest_only, 2)])
    for name, value in honest_only.global_params.items():  # the aggregate of the honest clients only
        np.testing.assert_array_equal(engine.global_params[name], value, strict=True)
    assert record["clients"] == expected["clients"] == [0, 2]
    assert len(record["failed_clients"]) == 1
    failure = record["failed_clients"][0]
    assert failure["client"] == 1 and failure["stage"] == "train"
    assert re.search(reason, failure["reason"]), failure["reason"]
    assert 1 not in engine.local_states
    json.dumps(record)  # JSON-able, reasons included


@pytest.mark.parametrize("case", ["nan", "wrong_shape", "inflated_count", "not_orthonormal"])
def test_bad_train_reply_raises_and_leaves_the_engine_untouched(case):
    change, reason = BAD_TRAIN_REPLIES[case]
    engine = _engine(on_client_error="raise")
    before = {n: v.copy() for n, v in engine.global_params.items()}
    replies = [_honest(engine, 0), _tampered(engine, 1, change), _honest(engine, 2)]
    with pytest.raises(RuntimeError, match=rf"client 1 failed in round 0: .*{reason}"):
        engine.aggregate(0, [0, 1, 2], replies)
    for name, value in before.items():
        np.testing.assert_array_equal(engine.global_params[name], value, strict=True)
    assert engine.local_states == {} and engine.history == []


def test_honest_replies_pass_in_float32():
    engine = _engine(dtype=np.float32)
    replies = [_honest(engine, cid) for cid in range(3)]
    assert [engine.check_train_reply(cid, r) for cid, r in enumerate(replies)] == [None] * 3
    record = engine.aggregate(0, [0, 1, 2], replies)
    assert record["failed_clients"] == [] and record["clients"] == [0, 1, 2]


def test_nan_loss_accepted_when_every_batch_was_skipped():
    engine = _engine()
    reply = _honest(engine, 0)
    reply.loss, reply.n_skipped = float("nan"), 3
    assert engine.check_train_reply(0, reply) is None


def test_exception_is_a_failed_client_with_its_reason():
    engine = _engine()
    with pytest.warns(RuntimeWarning):
        record = engine.aggregate(0, [0, 1, 2], [_honest(engine, 0), OSError("disk"), _honest(engine, 2)])
    assert record["failed_clients"] == [{"client": 1, "stage": "train", "reason": "OSError: disk"}]


def test_every_client_failing_raises_even_when_skipping():
    engine = _engine()
    with pytest.raises(RuntimeError, match="every client failed"):
        engine.aggregate(0, [0, 1, 2], [OSError("a"), _tampered(engine, 1, _drop("b")), OSError("c")])
    assert engine.history == []


@pytest.mark.parametrize("declared, weight, reason", [
    ([2.5, 12.5, 4.0], 12.6, r"client weight 12.6 exceeds the 12.5 declared at set-up"),
    ([2.5, 12.5, 4.0], None, r"carries no client weight but the client declared sample weights"),
    ([2.5, None, 4.0], 3.0, r"carries a client weight but the client declared no sample weights"),
    ([2.5, 12.5, 4.0], 0.0, r"client weight 0.0 is not a finite number > 0"),
], ids=["inflated", "missing", "undeclared", "zero"])
def test_reply_weight_checked_against_the_declared_training_weight(declared, weight, reason):
    """A client's aggregation weight (the sum of its training sample weights) may not exceed
    what it declared at set-up, as its sample count may not."""
    engine = _engine(train_weights=declared)
    reply = _honest(engine, 1)
    reply.weight = weight
    assert re.search(reason, engine.check_train_reply(1, reply))
    reply.weight = declared[1] * (1 - 1e-12) if declared[1] is not None else None  # summed in another order
    assert engine.check_train_reply(1, reply) is None


def test_declared_weights_are_the_aggregation_weights():
    engine = _engine(train_weights=[1.0, None, 3.0])
    replies = [_honest(engine, cid) for cid in range(3)]
    replies[0].weight, replies[2].weight = 1.0, 3.0
    record = engine.aggregate(0, [0, 1, 2], replies)
    assert record["n_samples"] == [1, 20, 3]  # client 1 has no sample weights: its training size
    np.testing.assert_allclose(engine.global_params["b"], (1 * 0.01 + 20 * 0.02 + 3 * 0.03) / 24)
    assert [engine.declared_weight(cid) for cid in range(3)] == [1.0, 20, 3.0]
    with pytest.raises(ValueError, match="3 training sizes but 2 training weights"):
        _engine(train_weights=[1.0, 2.0])


def test_max_update_norm_none_disables_the_bound():
    engine = _engine(max_update_norm=None)
    reply = _tampered(engine, 1, _set("b", lambda b: b + 1e7))
    assert engine.check_train_reply(1, reply) is None


def test_stiefel_tolerance_by_dtype():
    assert stiefel_tolerance(np.float64, 4) == pytest.approx(2e-6)
    assert stiefel_tolerance(np.float32, 4) == pytest.approx(2e-3)


BAD_EVAL_REPLIES = {
    "f1_huge": (EvalReply(0.5, 1e9, 2), r"val-f1 1000000000.0 is not in \[0, 1\]"),
    "f1_negative": (EvalReply(0.5, -0.1, 2), r"val-f1 -0.1"),
    "f1_nan": (EvalReply(0.5, float("nan"), 2), r"val-f1 nan"),
    "loss_negative": (EvalReply(-1.0, 0.5, 2), r"val-loss -1.0"),
    "loss_nan": (EvalReply(float("nan"), 0.5, 2), r"val-loss nan"),
    "count_inflated": (EvalReply(0.5, 0.5, 10**6), r"num-examples 1000000 is not an int between 1 and the 3"),
    "count_zero": (EvalReply(0.5, 0.5, 0), r"num-examples 0"),
}


@pytest.mark.parametrize("case", sorted(BAD_EVAL_REPLIES))
def test_bad_eval_reply_is_left_out_of_the_score(case):
    bad, reason = BAD_EVAL_REPLIES[case]
    engine = _engine()
    record = engine.aggregate(0, [0, 1, 2], [_honest(engine, c) for c in range(3)])
    assert engine.evaluated_clients() == [0, 2]  # client 1 has no validation data
    with pytest.warns(RuntimeWarning, match="client 2 left out .evaluate."):
        record = engine.finish_round(record, [EvalReply(0.7, 0.25, 2), bad], wall_time=0.0)
    assert record["val_f1"] == 0.25 and record["val_loss"] == 0.7  # client 0's score alone
    assert record["failed_clients"][0]["stage"] == "evaluate"
    assert re.search(reason, record["failed_clients"][0]["reason"])
    assert engine.best_round == 0 and engine.schedule.best_score[0] == 0.25
    with pytest.raises(RuntimeError, match="client 2 failed to evaluate in round 1"):
        strict = _engine(on_client_error="raise")
        strict.finish_round(strict.aggregate(1, [0, 1, 2], [_honest(strict, c) for c in range(3)]),
                            [EvalReply(0.7, 0.25, 2), bad])


def test_callable_rule_output_checked_with_its_name():
    def nan_rule(client_params, weights, previous, kinds):
        return {n: v * np.nan for n, v in projavg(client_params, weights, previous, kinds).items()}

    engine = _engine(aggregation=nan_rule)
    before = {n: v.copy() for n, v in engine.global_params.items()}
    with pytest.raises(ValueError, match=r"aggregation rule 'test_engine\..*nan_rule' returned an invalid global "
                                         r"model: its arrays\['W'\] has 10 non-finite"):
        engine.aggregate(0, [0, 1, 2], [_honest(engine, c) for c in range(3)])
    for name, value in before.items():
        np.testing.assert_array_equal(engine.global_params[name], value)


@pytest.mark.parametrize("output, reason", [
    ({"W": np.zeros((5, 2)), "b": np.zeros(3)}, "not orthonormal"),
    ({"W": random_stiefel(5, 2, 1)}, r"lack \['b'\]"),
    ({"W": random_stiefel(5, 2, 1), "b": np.zeros(3), "bn": np.zeros(2)}, r"unexpected names \['bn'\]"),
    ({"W": random_stiefel(5, 2, 1), "b": np.zeros((3, 1))}, "shape"),
    ({"W": random_stiefel(5, 2, 1), "b": np.zeros(3, dtype=int)}, "floating dtype"),
    (None, "a NoneType, not a dict"),
])
def test_check_aggregate(output, reason):
    template = {n: (v.shape, v.dtype) for n, v in _initial().items()}
    with pytest.raises(ValueError, match=f"aggregation rule 'mine' returned an invalid global model: .*{reason}"):
        check_aggregate("mine", output, template, KINDS)


class CallableRule:
    def __call__(self, *args):
        return projavg(*args)


def test_rule_name_is_stable():
    assert rule_name("rlavg") == "rlavg"
    assert rule_name(projavg) == "skfedspd.aggregation.projavg"
    assert rule_name(Krum(n_faulty=2)) == "skfedspd.aggregation.Krum(n_faulty=2)"
    assert rule_name(CallableRule()) == "test_engine.CallableRule"
    assert "0x" not in rule_name(lambda *a: None)


def test_local_arrays_stay_per_client_and_are_pooled_for_the_release():
    seen = []

    def rule(client_params, weights, previous, kinds):
        seen.append((set(previous), [set(p) for p in client_params]))
        return projavg(client_params, weights, previous, kinds)

    engine = _engine(aggregation=rule)
    engine.aggregate(0, [0, 1, 2], [_honest(engine, c) for c in range(3)])
    assert seen[0][0] == {"W", "b"}  # the rule never gets a previous "local" array
    assert {c: s["bn"].tolist() for c, s in engine.local_states.items()} == {0: [0, 0], 1: [1, 1], 2: [2, 2]}
    np.testing.assert_allclose(engine.global_params["bn"], (0 * 10 + 1 * 20 + 2 * 30) / 60)
    assert engine.evaluation_params(2)["bn"].tolist() == [2, 2]


def _with_optimizer_state(reply, step):
    reply.optimizer_state = {"0.step": np.array(float(step), np.float32), "0.exp_avg": np.full(3, float(step))}
    return reply


def test_client_optimizer_state_is_kept_per_accepted_client_and_never_aggregated():
    seen = []

    def rule(client_params, weights, previous, kinds):
        seen.append([set(p) for p in client_params])
        return projavg(client_params, weights, previous, kinds)

    engine = _engine(aggregation=rule)
    bad = _with_optimizer_state(_tampered(engine, 1, _set("b", np.zeros(7))), step=9)
    with pytest.warns(RuntimeWarning, match="client 1 left out"):
        engine.aggregate(0, [0, 1, 2], [_with_optimizer_state(_honest(engine, 0), 1), bad, _honest(engine, 2)])
    assert seen == [[{"W", "b", "bn"}] * 2]  # parameters only
    assert sorted(engine.client_optimizer_states) == [0]  # refused (1) and stateless (2) replies keep nothing
    state = engine.client_optimizer_state(0)
    assert state["0.exp_avg"].tolist() == [1.0, 1.0, 1.0]
    state.clear()  # a copy: the engine's is untouched
    assert engine.client_optimizer_state(0) and engine.client_optimizer_state(2) == {}
    assert "0.step" not in engine.global_params


def test_failed_round_keeps_no_client_optimizer_state():
    engine = _engine(aggregation=lambda client_params, weights, previous, kinds: {"W": np.ones((5, 2))})
    with pytest.raises(ValueError, match="invalid global model"):
        engine.aggregate(0, [0, 1, 2], [_with_optimizer_state(_honest(engine, c), 1) for c in range(3)])
    assert engine.client_optimizer_states == {}


def test_client_optimizer_state_round_trip():
    engine = _engine()
    engine.aggregate(0, [0, 1, 2], [_with_optimizer_state(_honest(engine, c), c + 1) for c in range(3)])
    arrays, meta = engine.state_dict()
    assert "optimizer/2/0.exp_avg" in arrays
    restored = _engine()
    restored.load_state_dict(arrays, json.loads(json.dumps(meta)))
    for cid in range(3):
        for name, value in engine.client_optimizer_state(cid).items():
            np.testing.assert_array_equal(restored.client_optimizer_state(cid)[name], value, strict=True)


@pytest.mark.parametrize("key, value, message", [
    ("optimizer/3/0.exp_avg", np.zeros(3), "unexpected array 'optimizer/3/0.exp_avg'"),
    ("optimizer/x/0.exp_avg", np.zeros(3), "unexpected array 'optimizer/x/0.exp_avg'"),
    ("optimizer/0/0.exp_avg", np.full(3, np.nan), "'optimizer/0/0.exp_avg' is not a finite floating array"),
    ("optimizer/0/0.step", np.array(1), "'optimizer/0/0.step' is not a finite floating array"),
])
def test_load_state_dict_rejects_a_bad_client_optimizer_state(key, value, message):
    engine = _engine()
    arrays, meta = engine.state_dict()
    arrays[key] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        _engine().load_state_dict(arrays, meta)


def test_select_is_seeded_and_sorted():
    a, b = _engine(clients_per_round=2), _engine(clients_per_round=2)
    assert [a.select(t) for t in range(5)] == [b.select(t) for t in range(5)]
    assert all(s == sorted(s) and len(s) == 2 for s, _ in (a.select(t) for t in range(5)))
    assert len({tuple(a.select(t)[0]) for t in range(10)}) > 1


@pytest.mark.parametrize("m, expected", [(None, 5), (2, 2), (0.5, 2), (1.0, 5), (0.01, 1)])
def test_n_selected(m, expected):
    assert n_selected(m, 5) == expected


@pytest.mark.parametrize("m", [0, 6, True, 1.5, 0.0, "half"])
def test_n_selected_rejects(m):
    with pytest.raises(ValueError, match="clients_per_round"):
        n_selected(m, 5)


def test_schedule_in_rounds_and_early_stopping():
    engine = _engine(schedule=RoundSchedule(patience=2, lr_patience=0, lr_factor=0.5))
    scores = [0.5, 0.4, 0.4]
    for t, f1 in enumerate(scores):
        record = engine.aggregate(t, [0, 1, 2], [_honest(engine, c) for c in range(3)])
        engine.finish_round(record, [EvalReply(0.5, f1, 2), EvalReply(0.5, f1, 3)])
    assert [r["lr"] for r in engine.history] == [0.1, 0.1, 0.05]
    assert engine.best_round == 0 and engine.should_stop


def test_state_round_trip_is_exact_and_json_able():
    engine = _engine(clients_per_round=2)
    for t in range(3):
        selected, _ = engine.select(t)
        record = engine.aggregate(t, selected, [_honest(engine, c) for c in selected])
        engine.finish_round(record, [EvalReply(0.5, 0.1 * t, 2), EvalReply(0.4, 0.2, 3)], wall_time=1.0)
    arrays, meta = engine.state_dict()
    meta = json.loads(json.dumps(meta))
    restored = _engine(clients_per_round=2)
    restored.load_state_dict(arrays, meta)
    for t in range(3, 5):  # continues exactly like the original
        for e in (engine, restored):
            selected, _ = e.select(t)
            record = e.aggregate(t, selected, [_honest(e, c) for c in selected])
            e.finish_round(record, [EvalReply(0.5, 0.3, 2), EvalReply(0.4, 0.2, 3)], wall_time=1.0)
    assert repr(restored.history) == repr(engine.history)
    for name in engine.global_params:
        np.testing.assert_array_equal(restored.global_params[name], engine.global_params[name], strict=True)
    assert restored.local_states.keys() == engine.local_states.keys()
    assert restored.best_round == engine.best_round and restored.lr == engine.lr


@pytest.mark.parametrize("tamper, message", [
    (lambda a, m: a.update({"global/W": np.zeros((7, 4))}), "global arrays.*shape"),
    (lambda a, m: a.pop("global/b"), r"global arrays lack \['b'\]"),
    (lambda a, m: a.update({"local/9/bn": np.zeros(2)}), "unexpected array 'local/9/bn'"),
    (lambda a, m: a.update({"other": np.zeros(2)}), "unexpected arrays"),
    (lambda a, m: m.update(kinds={"W": "euclidean"}), "another model"),
    (lambda a, m: m.update(version=99), "version 99"),
])
def test_load_state_dict_rejects_a_state_of_another_model(tamper, message):
    engine = _engine()
    engine.aggregate(0, [0, 1, 2], [_honest(engine, c) for c in range(3)])
    arrays, meta = engine.state_dict()
    tamper(arrays, meta)
    fresh = _engine()
    before = fresh.state_dict()
    with pytest.raises(ValueError, match=message):
        fresh.load_state_dict(arrays, meta)
    assert repr(fresh.state_dict()[1]) == repr(before[1])


def test_loaded_state_keeps_this_engines_schedule_configuration():
    """A warm start after set_params(patience=..., lr_patience=...) continues the progress
    (learning rate, counters, best model) under the new configuration."""
    engine = _engine(schedule=RoundSchedule(patience=None, lr_patience=0, lr_factor=0.5))
    for t, f1 in enumerate([0.5, 0.4]):
        record = engine.aggregate(t, [0, 1, 2], [_honest(engine, c) for c in range(3)])
        engine.finish_round(record, [EvalReply(0.5, f1, 2), EvalReply(0.5, f1, 3)])
    restored = _engine(schedule=RoundSchedule(patience=1, lr_patience=7, lr_factor=0.25))
    restored.load_state_dict(*engine.state_dict())
    assert (restored.schedule.patience, restored.schedule.lr_patience, restored.schedule.lr_factor) == (1, 7, 0.25)
    assert restored.lr == engine.lr == 0.05 and restored.best_round == 0 and restored.should_stop


# ---------------------------------------------------------------------------------------------
# Robust rules: diagnostics in the history, settings checked before any round
# ---------------------------------------------------------------------------------------------


def _hostile(engine, cid, shift=50.0):
    """A reply within the update-norm bound that moves the Euclidean array far."""
    return _tampered(engine, cid, _set("b", lambda b: b + shift))


@pytest.mark.parametrize("aggregation", ["projavg", "rlavg", "geomedian", "trimmedmean", "krum"])
def test_record_has_each_clients_distance_to_the_aggregate(aggregation):
    """Every rule: each accepted client's distance to the rule's aggregate, in client order;
    JSON-able. Robust rules add effective weights and the down-weighted clients."""
    engine = _engine(n_train=[10, 20, 30, 10, 20], n_val=[2, 0, 3, 2, 2], aggregation=aggregation)
    previous = dict(engine.global_params)
    replies = [_honest(engine, c) for c in range(4)] + [_hostile(engine, 4)]
    record = engine.aggregate(0, list(range(5)), replies)
    expected = client_distances([r.params for r in replies], engine.global_params, KINDS)
    np.testing.assert_allclose(record["client_distance"], expected, rtol=1e-12)
    assert np.argmax(record["client_distance"]) == 4
    json.dumps(record)
    if aggregation in ("projavg", "rlavg"):
        assert record["effective_weights"] is None and record["downweighted_clients"] is None
        assert not np.allclose(engine.global_params["b"], previous["b"], atol=1)  # the hostile site moved it
    else:
        assert len(record["effective_weights"]) == 5 and sum(record["effective_weights"]) == pytest.approx(1)
        assert record["downweighted_clients"][-1] == 4
        if aggregation != "trimmedmean":  # which trims the hostile site in its 3 moved coordinates of 13 only
            assert record["effective_weights"][4] < 0.01
        np.testing.assert_allclose(engine.global_params["b"], previous["b"], atol=0.1)


def test_downweighted_clients_are_those_below_half_their_weight():
    engine = _engine(aggregation=TrimmedMean(trim=0.34))
    record = engine.aggregate(0, [0, 1, 2], [_honest(engine, c) for c in range(3)])
    weights = np.array([10, 20, 30]) / 60  # three clients, one trimmed per end: the median of each coordinate
    assert record["downweighted_clients"] == [c for c in range(3) if record["effective_weights"][c] < weights[c] / 2]


@pytest.mark.parametrize("aggregation, match", [
    (Krum(n_faulty=1), r"needs more than 2·n_faulty \+ 2 = 4 clients per round, got 3"),
    (TrimmedMean(trim=0.2), r"trims no client of 3 per round"),
    (TrimmedMean(trim=0.7), "'trim' parameter"),
    (GeometricMedian(eps=-1), "'eps' parameter"),
])
def test_robust_rule_settings_refused_before_any_round(aggregation, match):
    with pytest.raises(ValueError, match=match):
        _engine(aggregation=aggregation)


def test_robust_rule_failing_in_a_round_leaves_the_engine_unchanged():
    """Five clients planned, one left out: Krum(n_faulty=1) cannot rank the four others; the
    round raises and the engine is as it was."""
    engine = _engine(n_train=[10] * 5, n_val=[2] * 5, aggregation=Krum(n_faulty=1))
    before = {n: v.copy() for n, v in engine.global_params.items()}
    replies = [_honest(engine, c) for c in range(4)] + [RuntimeError("site down")]
    with pytest.warns(RuntimeWarning, match="client 4 left out"), pytest.raises(ValueError, match="needs more than"):
        engine.aggregate(0, list(range(5)), replies)
    assert engine.history == [] and engine.local_states == {}
    for name, value in before.items():
        np.testing.assert_array_equal(engine.global_params[name], value)


def test_secure_sums_record_no_per_client_diagnostics():
    engine = _engine()
    W = engine.global_params["W"]
    record = engine.aggregate_from_sum(0, [0, 1, 2], [0, 1, 2], {}, summed={"W": W, "b": np.ones(3)}, weight=1.0,
                                       n_examples=60.0, loss=0.5, n_nan_loss=0.0, n_skipped=0.0,
                                       pooled_local={"bn": np.ones(2)})
    assert record["client_distance"] is record["effective_weights"] is record["downweighted_clients"] is None


# ---------------------------------------------------------------------------------------------
# A rule with the server's reference update (FLTrust), and the trust over a fit
# ---------------------------------------------------------------------------------------------

ROOT = (np.stack([np.eye(5)] * 4), [0, 1, 0, 1])


def _against(engine, cid):
    """A reply that moves the Euclidean array against the honest clients (a plausible size)."""
    return _tampered(engine, cid, _set("b", lambda b: b - 0.05 * (cid + 1)))


def test_reference_rule_without_a_reference_update_fails_the_round_untouched():
    engine = _engine(aggregation=FLTrust(*ROOT))
    before = {n: v.copy() for n, v in engine.global_params.items()}
    with pytest.raises(RuntimeError, match=r"aggregation 'skfedspd.aggregation.FLTrust\(X=<root set .* needs the "
                                           "server's reference update, and this engine has none"):
        engine.aggregate(0, [0, 1, 2], [_honest(engine, c) for c in range(3)])
    assert engine.history == []
    for name, value in before.items():
        np.testing.assert_array_equal(engine.global_params[name], value)


@pytest.mark.parametrize("t", [0, 3])
def test_reference_update_is_asked_for_each_round_and_its_agreement_recorded(t):
    """The engine asks for the reference from the broadcast with the round's seed and learning
    rate; the client against it gets no weight, and the record says why."""
    engine = _engine(aggregation=FLTrust(*ROOT))
    calls = []

    def reference_update(global_params, seed, lr):
        calls.append((global_params, seed, lr))
        return dict(global_params, b=global_params["b"] + 0.01)

    engine.reference_update = reference_update
    broadcast = {n: v.copy() for n, v in engine.global_params.items()}
    record = engine.aggregate(t, [0, 1, 2], [_honest(engine, 0), _honest(engine, 1), _against(engine, 2)])
    (params, seed, lr), = calls
    assert seed == derive_seed(0, 11, t) and lr == engine.lr
    for name, value in broadcast.items():
        np.testing.assert_array_equal(params[name], value)
    assert record["client_agreement"][0] > 0 and record["client_agreement"][2] < 0
    assert record["effective_weights"][2] == 0 and record["downweighted_clients"] == [2]
    json.dumps(record)


@pytest.mark.parametrize("aggregation", ["projavg", "geomedian"])
def test_rules_without_a_reference_record_no_agreement(aggregation):
    engine = _engine(aggregation=aggregation)
    record = engine.aggregate(0, [0, 1, 2], [_honest(engine, c) for c in range(3)])
    assert record["client_agreement"] is None


def _record(clients, n_samples, effective, distance, agreement=None, downweighted=None, failed=()):
    return {"clients": clients, "n_samples": n_samples, "effective_weights": effective, "client_distance": distance,
            "client_agreement": agreement, "downweighted_clients": downweighted,
            "failed_clients": [{"client": c, "stage": "train", "reason": "down"} for c in failed]}


@pytest.mark.parametrize("history, trust", [
    # the inverse of the mean distance to the aggregate over the round's median distance
    ([_record([0, 1, 2], [10, 20, 30], None, [1.0, 1.0, 2.0])], [1.0, 1.0, 0.5]),
    ([_record([0, 1], [10, 30], [0.5, 0.5], [1.0, 3.0]),  # median 2
      _record([1, 2], [10, 10], [1.0, 0.0], [1.0, 3.0])], [2.0, 1 / ((1.5 + 0.5) / 2), 1 / 1.5]),
    # a round whose sites all sit on the aggregate says nothing; a site never aggregated: NaN
    ([_record([0, 1], [10, 30], [0.25, 0.75], [0.0, 0.0]), _record([0, 1], [10, 30], None, [1.0, 1.0])],
     [1.0, 1.0, np.nan]),
    # secure sums: nothing per site
    ([_record([0, 1, 2], [60], None, None)], [np.nan] * 3),
])
def test_client_trust_is_the_inverse_mean_distance_ratio(history, trust):
    values, summary = client_trust(history, 3)
    np.testing.assert_allclose(values, trust, rtol=1e-12)
    assert [s["client"] for s in summary] == [0, 1, 2]
    assert [s["trust"] for s in summary] == [None if np.isnan(v) else v for v in values]
    assert [s["flagged"] for s in summary] == [bool(v < 1 / SUSPECT_DISTANCE) for v in values]
    json.dumps(summary)


@pytest.mark.parametrize("weighting, weight", [("n_samples", [2.0, (2 / 3 + 2) / 2, 0.0]),
                                               ("uniform", [1.0, 1.5, 0.0])])
def test_client_trust_summary_gives_the_rules_mean_relative_weight(weighting, weight):
    history = [_record([0, 1], [10, 30], [0.5, 0.5], [1.0, 1.0]), _record([1, 2], [10, 10], [1.0, 0.0], [1.0, 3.0])]
    _, summary = client_trust(history, 3, weighting)
    assert [s["weight"] for s in summary] == pytest.approx(weight)


def test_client_trust_summary_counts_and_explains():
    history = [_record([0, 1, 2], [10, 10, 10], [0.5, 0.5, 0.0], [1.0, 1.0, 1.5], agreement=[0.8, 0.6, -0.4],
                       downweighted=[2]),
               _record([0, 2], [10, 10], [1.0, 0.0], [1.0, 4.0], agreement=[0.9, -0.2], downweighted=[2], failed=[1])]
    _, summary = client_trust(history, 3)
    assert [s["downweighted"] for s in summary] == [0, 0, 2] and [s["failed"] for s in summary] == [0, 1, 0]
    assert [s["rounds"] for s in summary] == [2, 1, 2]
    assert summary[2]["agreement"] == pytest.approx(-0.3)
    assert summary[2]["distance_ratio"] == pytest.approx((1.5 + 4 / 2.5) / 2)  # the rounds' medians 1 and 2.5
    assert [s["flagged"] for s in summary] == [False, False, True]
    assert summary[0]["reason"] is summary[1]["reason"] is None
    assert summary[2]["reason"] == ("its updates lay 1.55 times as far from the aggregate as the median site's (mean "
                                    "over 2 rounds); the rule down-weighted it in 2 of 2 rounds; mean agreement with "
                                    "the server's reference update -0.30 (median site 0.60)")
    # left out in most rounds without being far: said, but not flagged
    history = [_record([0, 1, 2], [10, 10, 10], [0.5, 0.5, 0.0], [1.0, 1.0, 1.2], downweighted=[2])]
    _, summary = client_trust(history, 3)
    assert not summary[2]["flagged"] and summary[2]["reason"] == "the rule down-weighted it in 1 of 1 rounds"
    # down-weighted in a minority of its rounds, close to the others: nothing to say
    history += [_record([0, 1, 2], [10, 10, 10], None, [1.0, 1.0, 1.0])] * 2
    assert client_trust(history, 3)[1][2]["reason"] is None
