"""A hostile site in the Flower simulation: malicious replies never reach the aggregate.

The simulation's ClientApp is wrapped (``skfedspd.flower.simulation_fit.make_client_app``
monkeypatched by a factory that calls the real one and then tampers one reply), so the
whole production path runs: ``FederatedSPDnetClassifier(backend="flower").fit`` → Flower
messages → :class:`~skfedspd.flower.SPDnetStrategy` → :class:`~skfedspd.engine.FederatedEngine`.

- train replies of client 1 in round 1 (NaN, Inf, wrong shapes, missing / extra names, huge
  norm, non-orthonormal Stiefel array, wrong dtype, inflated count, metrics out of range,
  wrong client id): with ``on_client_error="skip"`` the run equals, bit for bit, the local
  backend's run in which client 1 simply failed in round 1 (the aggregate of the honest
  clients only), and the failure is in ``history_`` with its reason; with ``"raise"`` the
  fit raises naming the client and the reason, and the estimator is left unfitted;
- validation replies of client 1 in round 0 (val-f1 = 1e9, negative / NaN val-loss,
  inflated count): left out of the pooled score, which stays in [0, 1], aggregates as in
  the honest run;
- set-up replies (NaN input statistic, labels of another type, a label outside the
  classes of a warm-started model, invalid counts): the fit raises naming the client,
  before any round, and the estimator is left as it was.

Three clients, two rounds of one local epoch on 60 6×6 matrices: a few seconds per run.
"""

import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"

import copy  # noqa: E402
import re  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("flwr")

import skfedspd.flower.simulation_fit as simulation_fit  # noqa: E402
from conftest import make_spd_dataset  # noqa: E402
from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier  # noqa: E402
from skfedspd.flower.client import from_array_record, to_array_record  # noqa: E402
from skfedspd.training import derive_seed  # noqa: E402

BAD_CLIENT, BAD_ROUND = 1, 1
pytestmark = pytest.mark.filterwarnings("ignore:round .* left out:RuntimeWarning")


def _fed(backend, **kwargs):
    params = dict(n_rounds=2, local_epochs=1, n_clients=3, random_state=0, partition="stratified",
                  on_client_error="skip", backend=backend)
    params.update(kwargs)
    return FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=(3,), batch_size=8, lr=0.05, early_stopping=True), **params)


@pytest.fixture(scope="module")
def data():
    return make_spd_dataset(60, 6, 3, seed=0)


@pytest.fixture(scope="module")
def honest(data):
    return _fed("local").fit(*data)


@pytest.fixture(scope="module")
def without_bad_client(data):
    """The local backend's run in which client 1's local training raised in round 1."""
    seed = int(np.random.RandomState(0).randint(0, 2**31 - 1))  # what random_state=0 draws
    failing = derive_seed(seed, 10, BAD_ROUND, BAD_CLIENT)
    original = SPDnetClassifier.local_update

    def local_update(self, *args, **kwargs):
        if kwargs["seed"] == failing:
            raise OSError("simulated failure")
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SPDnetClassifier, "local_update", local_update)
        return _fed("local").fit(*data)


def _tamper_with(monkeypatch, stage, change, client=BAD_CLIENT, round_=None):
    """Make the simulation's ClientApp apply ``change(reply)`` to client ``client``'s reply
    to its ``stage`` message ("train", "evaluate" or "query.setup") of round ``round_``."""
    real = simulation_fit.make_client_app
    hits = []

    def make_client_app(*args, **kwargs):
        app = real(*args, **kwargs)

        def hostile(message, context):
            reply = app(message=message, context=context)
            if message.metadata.message_type != stage or reply.has_error():
                return reply
            if stage == "query.setup":
                cid = reply.content["site"]["client-id"]
                this_round = None
            else:
                config = message.content["config"]
                cid = config["client-id"]
                this_round = config["round"] if stage == "train" else config["server-round"] - 1
            if cid == client and (round_ is None or this_round == round_):
                change(reply)
                hits.append(this_round)
            return reply

        return hostile

    monkeypatch.setattr(simulation_fit, "make_client_app", make_client_app)
    return hits


def _arrays(edit):
    def change(reply):
        params = from_array_record(reply.content["arrays"])
        edit(params)
        reply.content["arrays"] = to_array_record(params)
    return change


def _metric(name, value):
    def change(reply):
        if value is None:
            del reply.content["metrics"][name]
        else:
            reply.content["metrics"][name] = value
    return change


def _set(name, make):
    return _arrays(lambda p: p.__setitem__(name, make(p[name])))


W, BIAS, HEAD = "bimaps.0.weight", "head.bias", "head.weight"

HOSTILE_TRAIN = {
    "nan_bias": (_set(BIAS, lambda b: np.where(np.arange(b.size) == 0, np.nan, b)),
                 r"arrays\['head.bias'\] has 1 non-finite values"),
    "inf_weight": (_set(HEAD, lambda a: np.where(np.ones_like(a, bool), np.inf, a)), r"'head.weight'\] has 18 non-finite"),
    "all_nan": (_arrays(lambda p: [p.__setitem__(n, np.full_like(v, np.nan)) for n, v in list(p.items())]),
                r"non-finite values"),
    "shape_7x4": (_set(W, lambda a: np.zeros((7, 4))), r"shape \(7, 4\), expected \(6, 3\)"),
    "broadcastable_6x1": (_set(W, lambda a: a[:, :1].copy()), r"shape \(6, 1\), expected \(6, 3\)"),
    "missing_name": (_arrays(lambda p: p.pop(BIAS)), r"arrays lack \['head.bias'\]"),
    "extra_name": (_arrays(lambda p: p.__setitem__("head.backdoor", np.zeros(3))), r"unexpected names"),
    "huge_norm": (_set(HEAD, lambda a: a * 1e8), r"'head.weight'\] moved by .* > max_update_norm"),
    "not_orthonormal": (_set(W, lambda a: 1.05 * a), r"'bimaps.0.weight'\] is not orthonormal"),
    "random_stiefel_slot": (_set(W, lambda a: np.random.default_rng(0).standard_normal(a.shape)), "not orthonormal"),
    "wrong_dtype": (_set(HEAD, lambda a: a.astype(np.float32)), r"dtype float32, expected float64"),
    "inflated_num_examples": (_metric("num-examples", 10**9), r"num-examples 1000000000 is not an int between 1"),
    "float_num_examples": (_metric("num-examples", 1e9), r"num-examples 1000000000.0"),
    "undeclared_weight": (_metric("weight", 1e9), r"carries a client weight but the client declared no sample weights"),
    "negative_train_loss": (_metric("train-loss", -5.0), r"train-loss -5.0"),
    "nan_train_loss": (_metric("train-loss", float("nan")), r"train-loss nan"),
    "negative_skipped": (_metric("skipped-batches", -1), r"skipped-batches -1"),
    "missing_metric": (_metric("train-loss", None), r"malformed reply: KeyError"),
    "impersonation": (_metric("client-id", 2), r"answered as client 2"),
}


def _without_reasons(history):
    return [{k: ([(f["client"], f["stage"]) for f in record[k]] if k == "failed_clients" else record[k])
             for k in sorted(record) if k != "wall_time"} for record in history]


def _assert_same_run(a, b):
    for name, value in a.engine_.global_params.items():
        np.testing.assert_array_equal(b.engine_.global_params[name], value, err_msg=name, strict=True)
    assert repr(_without_reasons(a.history_)) == repr(_without_reasons(b.history_))
    assert a.best_round_ == b.best_round_


@pytest.mark.parametrize("case", sorted(HOSTILE_TRAIN))
def test_hostile_train_reply_is_skipped_and_never_aggregated(case, data, without_bad_client, monkeypatch):
    change, reason = HOSTILE_TRAIN[case]
    hits = _tamper_with(monkeypatch, "train", change, round_=BAD_ROUND)
    fed = _fed("flower").fit(*data)
    assert hits == [BAD_ROUND]
    _assert_same_run(without_bad_client, fed)  # the aggregate of the honest clients only
    failures = fed.history_[BAD_ROUND]["failed_clients"]
    assert [(f["client"], f["stage"]) for f in failures] == [(BAD_CLIENT, "train")]
    assert re.search(reason, failures[0]["reason"]), failures[0]["reason"]
    assert fed.history_[BAD_ROUND]["clients"] == [0, 2]
    assert np.isfinite(fed.predict_proba(data[0])).all()


@pytest.mark.parametrize("case", ["nan_bias", "shape_7x4", "inflated_num_examples", "not_orthonormal"])
def test_hostile_train_reply_under_raise_fails_the_fit_cleanly(case, data, monkeypatch):
    change, reason = HOSTILE_TRAIN[case]
    _tamper_with(monkeypatch, "train", change, round_=BAD_ROUND)
    fed = _fed("flower", on_client_error="raise")
    before = dict(vars(fed))
    with pytest.raises(RuntimeError, match=rf"client {BAD_CLIENT} failed in round {BAD_ROUND}: .*{reason}"):
        fed.fit(*data)
    assert vars(fed) == before  # unfitted, nothing left behind


HOSTILE_EVAL = {
    "val_f1_1e9": (_metric("val-f1", 1e9), r"val-f1 1000000000.0 is not in \[0, 1\]"),
    "val_f1_negative": (_metric("val-f1", -1.0), r"val-f1 -1.0"),
    "val_loss_negative": (_metric("val-loss", -3.0), r"val-loss -3.0"),
    "val_loss_nan": (_metric("val-loss", float("nan")), r"val-loss nan"),
    "inflated_n_val": (_metric("num-examples", 10**6), r"num-examples 1000000 is not an int between 1"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_EVAL))
def test_hostile_validation_reply_is_left_out_of_the_score(case, data, honest, monkeypatch):
    change, reason = HOSTILE_EVAL[case]
    hits = _tamper_with(monkeypatch, "evaluate", change)  # every round
    fed = _fed("flower").fit(*data)
    assert hits == [0, 1]
    for name, value in honest.engine_.global_params.items():  # aggregates untouched
        np.testing.assert_array_equal(fed.engine_.global_params[name], value, strict=True)
    for record, reference in zip(fed.history_, honest.history_):
        assert record["clients"] == reference["clients"] and record["train_loss"] == reference["train_loss"]
        assert 0.0 <= record["val_f1"] <= 1.0 and record["val_loss"] >= 0.0  # no take-over of model selection
        assert [(f["client"], f["stage"]) for f in record["failed_clients"]] == [(BAD_CLIENT, "evaluate")]
        assert re.search(reason, record["failed_clients"][0]["reason"])


def _setup(name, value):
    def change(reply):
        reply.content["site"][name] = value
    return change


HOSTILE_SETUP = {
    "nan_input_statistic": (_setup("input-statistic", float("nan")),
                            r"client 1 declared an invalid input statistic nan"),
    "labels_of_another_type": (_setup("labels", '["0", "1", "2"]'), r"labels of different types"),
    "labels_not_a_list": (_setup("labels", '{"0": 1}'), r"client 1 declared invalid labels"),
    "label_not_a_scalar": (_setup("labels", '[0, 1, [2]]'), r"client 1 declared invalid labels"),
    "label_nan": (_setup("labels", '[0, 1, NaN]'), r"client 1 declared invalid labels"),
    "duplicate_labels": (_setup("labels", "[0, 0, 1]"), r"client 1 declared invalid labels"),
    "zero_num_examples": (_setup("num-examples", 0), r"client 1 declared invalid sample counts"),
    "other_shape": (_setup("shape", [7, 7]), r"samples differ in shape"),
    "duplicate_client_id": (_setup("client-id", 0), r"client id 0 is configured on two nodes"),
    "negative_weight": (_setup("weight", -3.0), r"client 1 declared an invalid training weight -3.0"),
    "nan_weight": (_setup("weight", float("nan")), r"client 1 declared an invalid training weight nan"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SETUP))
def test_hostile_setup_reply_stops_the_fit_before_any_round(case, data, monkeypatch):
    change, message = HOSTILE_SETUP[case]
    _tamper_with(monkeypatch, "query.setup", change)
    fed = _fed("flower")
    before = dict(vars(fed))
    with pytest.raises(ValueError, match=message):
        fed.fit(*data)
    assert vars(fed) == before


def test_label_outside_the_classes_of_a_warm_started_model(data, honest, monkeypatch):
    """A site that declares a class the model does not have (a phantom class) is refused
    when the classes are known; the fitted model is left exactly as it was."""
    fed = copy.deepcopy(honest).set_params(warm_start=True, backend="flower")
    _tamper_with(monkeypatch, "query.setup", _setup("labels", "[0, 1, 2, 99]"))
    before = {k: id(v) for k, v in vars(fed).items()}
    n_rounds = len(fed.history_)
    with pytest.raises(ValueError, match=r"client 1 declared labels \[99\] that are not in classes \[0, 1, 2\]"):
        fed.fit(*data)
    assert {k: id(v) for k, v in vars(fed).items()} == before and len(fed.history_) == n_rounds
    np.testing.assert_array_equal(fed.predict_proba(data[0]), honest.predict_proba(data[0]))
