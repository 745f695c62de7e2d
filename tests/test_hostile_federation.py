"""Hostile site replies, aggregates, weights and data: refused where they enter, named, harmless.

Each refusal asserts the error type, a message naming the field, and that the model (or the
engine) is the same after the refused call as before it. Four families:

- domain priors: ``set_domain_prior`` and each site's reply to the server's prior query
  (:func:`skfedspd.online.check_prior_statistics`);
- aggregates: a custom rule's output bounded and checked on its manifold before it is
  committed, the secure sum's mean and the server step likewise, ``set_parameters``
  refusing non-finite and non-orthonormal arrays, a rule unable to corrupt what the trust
  diagnosis reads;
- weights: overflowing or subnormal sums, bad ``class_weight`` named as such, a site's
  weights named with the site, a fit in which nothing trained;
- data: one-trial domains, training scales spread beyond what prediction accepts.

Forty 4×4 trials in four groups, one-epoch fits: well under a minute in all.
"""

import copy
import warnings

import numpy as np
import pytest

from conftest import make_spd_domains
from skfedspd import FederatedSPDnetClassifier, Recenter, SPDnetClassifier
from skfedspd.aggregation import projavg
from skfedspd.validation import TRAINING_SCALE_SPREAD
from skfedspd.engine import AGGREGATE_NORM_FACTOR, FederatedEngine
from skfedspd.messages import TrainReply
from skfedspd.online import PRIOR_LOG_BOUND
from skfedspd.server_optimizer import ServerMomentum
from skfedspd.stiefel import random_stiefel
from test_hostile_input import _assert_unchanged, _state


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_single_thread):
    yield


def mk(**kwargs):
    return SPDnetClassifier(hidden_dims=(2,), max_epochs=1, random_state=0, **kwargs)


@pytest.fixture(scope="module")
def data():
    return make_spd_domains(n_groups=4, n_per_group=10, n_channels=4, seed=0)


@pytest.fixture(scope="module")
def domain_model(data):
    X, y, groups = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mk(batchnorm="domain").fit(X, y, groups=groups)


@pytest.fixture(scope="module")
def plain_model(data):
    X, y, _ = data
    return mk().fit(X, y)


def _refused(est, call, error, match):
    """``call(est)`` raises ``error`` matching ``match``, and ``est`` is unchanged."""
    before = _state(est)
    with pytest.raises(error, match=match):
        call(est)
    _assert_unchanged(before, est)


# ------------------------------------------------------------------ domain priors
BAD_PRIORS = {
    "poisoned-site-1e6": ([1e6 * np.eye(2)], 1, r"log_sums\[0\] / count has an eigenvalue of absolute value 1e\+06"),
    "overflowing-1e4": ([1e4 * np.eye(2)], 1, r"log_sums\[0\] / count .* > 50"),
    "underflowing": ([-1e4 * np.eye(2)], 1, r"log_sums\[0\] / count .* > 50"),
    "just-beyond-the-bound": ([(PRIOR_LOG_BOUND + 1) * np.eye(2)], 1, r"log_sums\[0\] / count"),
    "nan": ([np.full((2, 2), np.nan)], 1, r"log_sums\[0\] has 4 non-finite"),
    "inf": ([np.diag([np.inf, 0.0])], 1, r"log_sums\[0\] has 1 non-finite"),
    "non-symmetric": ([np.array([[0.0, 1.0], [0.0, 0.0]])], 1, r"log_sums\[0\] is not symmetric"),
    "wrong-shape": ([np.zeros((3, 3))], 1, r"log_sums\[0\] must be a real \(2, 2\) matrix"),
    "complex": ([np.eye(2) * 1j], 1, r"log_sums\[0\] must be a real"),
    "two-layers": ([np.eye(2), np.eye(2)], 1, r"log_sums must hold one matrix per batch-norm layer \(1\)"),
    "a-string": ("xx", 1, "log_sums must hold one matrix"),
    "count-inf": ([np.eye(2)], np.inf, "count must be a finite whole number >= 1"),
    "count-nan": ([np.eye(2)], np.nan, "count must be a finite whole number"),
    "count-zero": ([np.eye(2)], 0, "count must be"),
    "count-negative": ([np.eye(2)], -3, "count must be"),
    "count-fraction": ([np.eye(2)], 1.5, "count must be a finite whole number"),
    "count-bool": ([np.eye(2)], True, "count must be"),
    "count-string": ([np.eye(2)], "40", "count must be"),
}


@pytest.mark.parametrize("log_sums, count, match", BAD_PRIORS.values(), ids=BAD_PRIORS)
def test_set_domain_prior_refuses_what_no_data_give(domain_model, log_sums, count, match):
    _refused(copy.deepcopy(domain_model), lambda est: est.set_domain_prior(log_sums, count), ValueError, match)


def test_the_sites_own_statistics_are_accepted_and_new_subjects_predict(domain_model, data):
    X, _, groups = data
    est = copy.deepcopy(domain_model)
    sites = [est.domain_prior_statistics(X[groups == g], groups[groups == g]) for g in range(4)]
    for log_sums, _ in sites:  # real statistics lie far inside the bound
        assert np.abs(np.linalg.eigvalsh(log_sums[0] / 10)).max() < PRIOR_LOG_BOUND / 5
    est.set_domain_prior([sum(s[0][0] for s in sites)], np.int64(sum(s[1] for s in sites)))
    assert np.isfinite(est.predict_proba(X[:5], domain="new")).all()


def _reply(log_sums, count):
    return {**{f"log-sum.{i}": np.asarray(S) for i, S in enumerate(log_sums)}, "count": np.asarray(count)}


SITE_REPLIES = {name: case for name, case in BAD_PRIORS.items()
                if not name.startswith(("two-layers", "a-string", "count-string", "count-bool"))}


@pytest.mark.parametrize("log_sums, count, match", SITE_REPLIES.values(), ids=SITE_REPLIES)
def test_a_sites_prior_reply_is_refused_naming_the_site_and_field(log_sums, count, match):
    pytest.importorskip("flwr")
    from skfedspd.flower.server import _read_prior_reply

    match = match if not match.startswith("count") else "count"
    with pytest.raises(ValueError, match=f"client 3 sent a malformed domain prior reply: .*{match}"):
        _read_prior_reply(_reply(log_sums, count), [(2, 2)], 3)


def test_an_honest_prior_reply_is_read(domain_model, data):
    pytest.importorskip("flwr")
    from skfedspd.flower.server import _read_prior_reply

    X, _, groups = data
    log_sums, count = domain_model.domain_prior_statistics(X, groups)
    sums, n = _read_prior_reply(_reply(log_sums, count), [(2, 2)], 0)
    np.testing.assert_array_equal(sums[0], log_sums[0])
    assert n == count == 40


# ------------------------------------------------------------------ aggregates
KINDS = {"W": "stiefel", "b": "euclidean", "bn": "local"}


def _engine(**kwargs):
    initial = {"W": random_stiefel(5, 2, 0), "b": np.zeros(3), "bn": np.ones(2)}
    return FederatedEngine(initial, KINDS, **{**dict(n_train=[10, 20, 30], n_val=[2, 0, 3], seed=0, lr=0.1),
                                              **kwargs})


def _replies(engine, shift=0.01):
    g, replies = engine.global_params, []
    for cid in range(3):
        W = g["W"] + shift * np.random.default_rng(cid).standard_normal(g["W"].shape)
        u, _, vt = np.linalg.svd(W, full_matrices=False)
        replies.append(TrainReply({"W": u @ vt, "b": g["b"] + shift * (cid + 1), "bn": np.full(2, float(cid))},
                                  0.5, 0, engine.n_train[cid]))
    return replies


def _engine_state(engine):
    arrays, meta = engine.state_dict()
    return repr(meta), {k: np.array(v, copy=True) for k, v in arrays.items()}


def _engine_unchanged(before, engine):
    meta, arrays = _engine_state(engine)
    assert meta == before[0] and set(arrays) == set(before[1])
    for name, value in arrays.items():
        np.testing.assert_array_equal(value, before[1][name], err_msg=name)


def _output_rule(change):
    def rule(client_params, weights, previous, kinds):
        out = projavg(client_params, weights, previous, kinds)
        change(out)
        return out
    return rule


def _set(name, value):
    def change(out):
        out[name] = value(out[name]) if callable(value) else value
    return change


BAD_AGGREGATES = {
    "head-1e308": (_set("b", np.array([1e308, -1e308, 1e308])), r"its arrays\['b'\] has norm inf > 10·\(1 \+ ‖broadcast‖ \+ largest client's\) = 10\.5"),
    "head-1e6": (_set("b", np.full(3, 1e6)), r"its arrays\['b'\] has norm"),
    "nan": (_set("b", lambda b: b * np.nan), r"its arrays\['b'\] has 3 non-finite"),
    "inf-bimap": (_set("W", lambda W: W * np.inf), r"its arrays\['W'\] has 10 non-finite"),
    "scaled-bimap": (_set("W", lambda W: 2 * W), r"its arrays\['W'\] is not orthonormal"),
    "zero-bimap": (_set("W", np.zeros((5, 2))), r"its arrays\['W'\] is not orthonormal"),
}


@pytest.mark.parametrize("change, match", BAD_AGGREGATES.values(), ids=BAD_AGGREGATES)
@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_an_invalid_aggregate_is_never_committed(change, match, policy):
    engine = _engine(aggregation=_output_rule(change), on_client_error=policy)
    before = _engine_state(engine)
    with pytest.raises(ValueError, match=f"aggregation rule .* returned an invalid global model: {match}"):
        engine.aggregate(0, [0, 1, 2], _replies(engine))
    _engine_unchanged(before, engine)


@pytest.mark.parametrize("rule", ["projavg", "rlavg", "karcher", "geomedian", "trimmedmean", "krum"])
@pytest.mark.parametrize("shift", [1e-3, 0.3])
def test_the_size_bound_never_fires_on_honest_rounds(rule, shift):
    engine = _engine(aggregation=rule, n_train=[10, 20, 30, 10, 20], n_val=[2] * 5)
    for t in range(3):
        replies = _replies(engine, shift) + _replies(engine, shift)[:2]
        record = engine.aggregate(t, list(range(5)), [TrainReply(r.params, r.loss, 0, engine.n_train[c])
                                                      for c, r in enumerate(replies)])
        assert np.isfinite(record["client_distance"]).all()
    largest = max(np.linalg.norm(r.params["b"]) for r in replies)
    assert np.linalg.norm(engine.global_params["b"]) < AGGREGATE_NORM_FACTOR * largest


def test_a_rule_that_writes_into_its_inputs_cannot_reach_the_engine():
    def vandal(client_params, weights, previous, kinds):
        out = projavg(client_params, weights, previous, kinds)
        for params in client_params:
            for value in params.values():
                value[...] = np.nan
        for value in previous.values():
            value[...] = np.nan
        weights[...] = np.nan
        return out

    engine = _engine(aggregation=vandal)
    replies = _replies(engine)
    sent = [{n: v.copy() for n, v in r.params.items()} for r in replies]
    record = engine.aggregate(0, [0, 1, 2], replies)
    assert np.isfinite(record["client_distance"]).all() and record["client_distance"][0] > 0
    for reply, params in zip(replies, sent):
        for name, value in params.items():
            np.testing.assert_array_equal(reply.params[name], value)
    assert all(np.isfinite(v).all() for v in engine.global_params.values())


def test_a_secure_sum_whose_mean_moved_too_far_is_refused():
    engine = _engine(max_update_norm=10.0)
    before = _engine_state(engine)
    summed = {"W": 60 * engine.global_params["W"], "b": np.full(3, 60 * 1e3)}
    with pytest.raises(RuntimeError, match=r"secure sum of clients \[0, 1, 2\] is invalid: the summed arrays' "
                                           r"mean\['b'\] moved by 1\.73e\+03 > max_update_norm"):
        engine.aggregate_from_sum(0, [0, 1, 2], [0, 1, 2], {}, summed=summed, weight=60.0, n_examples=60,
                                  loss=30.0, n_nan_loss=0, n_skipped=0, pooled_local={"bn": np.ones(2)})
    _engine_unchanged(before, engine)


def test_a_server_step_that_overflows_is_refused():
    engine = _engine(server_optimizer=ServerMomentum(lr=1e308, momentum=0.0))
    before = _engine_state(engine)
    with pytest.raises(ValueError, match=r"server_lr=1e\+308, .* gave an invalid global model: the server step's "
                                         r"arrays\['b'\] has 3 non-finite"):
        engine.aggregate(0, [0, 1, 2], _replies(engine, shift=10.0))
    _engine_unchanged(before, engine)


def _module_params(est):
    return {n: v.copy() for n, v in est.get_parameters().items()}


BAD_PARAMETERS = {
    "nan-head": ("head.weight", lambda v: v * np.nan, r"parameter 'head.weight' must be a finite real array, got "
                                                      r"dtype float64 with \d+ non-finite"),
    "inf-bias": ("head.bias", lambda v: v + np.inf, r"parameter 'head.bias' must be a finite"),
    "bool-bias": ("head.bias", lambda v: v > 0, r"parameter 'head.bias' must be a finite real array, got dtype bool"),
    "scaled-bimap": ("bimaps.0.weight", lambda v: 3 * v, r"parameter 'bimaps.0.weight' is not orthonormal"),
    "zero-bimap": ("bimaps.0.weight", lambda v: 0 * v, r"parameter 'bimaps.0.weight' is not orthonormal"),
    "nan-bimap": ("bimaps.0.weight", lambda v: v * np.nan, r"parameter 'bimaps.0.weight' must be a finite"),
    "shape": ("head.bias", lambda v: v[:1], r"parameter 'head.bias' has shape \(1,\)"),
}


@pytest.mark.parametrize("name, change, match", BAD_PARAMETERS.values(), ids=BAD_PARAMETERS)
def test_set_parameters_refuses_what_is_not_a_model(plain_model, name, change, match):
    est = copy.deepcopy(plain_model)
    params = _module_params(est)
    arrays = {**params, name: change(params[name])}
    _refused(est, lambda est: est.set_parameters(arrays), ValueError, match)


def test_set_parameters_takes_a_valid_model_and_float32_rounding(plain_model, data):
    est = copy.deepcopy(plain_model)
    params = _module_params(est)
    est.set_parameters({**params, "head.bias": params["head.bias"] + 1})
    np.testing.assert_array_equal(est.get_parameters()["head.bias"], params["head.bias"] + 1)
    f32 = mk(dtype="float32").fit(*data[:2])
    f32.set_parameters({n: v.astype(np.float32) for n, v in _module_params(f32).items()})


def _fed(aggregation, **kwargs):
    return FederatedSPDnetClassifier(mk(), n_rounds=2, n_clients=2, local_epochs=1, random_state=0,
                                     aggregation=aggregation, **kwargs)


def test_a_federated_fit_with_a_poisoning_rule_raises_and_stays_unfitted(data):
    X, y, _ = data
    fed = _fed(_output_rule(_set("head.weight", lambda w: np.where(w >= 0, 1e308, -1e308))))
    with pytest.raises(ValueError, match=r"returned an invalid global model: its arrays\['head\.weight'\] has norm"):
        fed.fit(X, y)
    assert not hasattr(fed, "global_estimator_")


def test_client_trust_survives_a_rule_that_writes_nan_into_its_inputs(data):
    X, y, _ = data

    def vandal(client_params, weights, previous, kinds):
        out = projavg(client_params, weights, previous, kinds)
        for params in client_params:
            for value in params.values():
                value[...] = np.nan
        return out

    vandalized, honest = _fed(vandal).fit(X, y), _fed(projavg).fit(X, y)
    assert np.isfinite(vandalized.client_trust_).all()
    np.testing.assert_array_equal(vandalized.client_trust_, honest.client_trust_)


# ------------------------------------------------------------------ weights
BAD_WEIGHTS = {
    "sample-1e308": (dict(), dict(sample_weight=np.full(40, 1e308)), r"sample_weight sums to inf, beyond the normal"),
    "sample-1e-320": (dict(), dict(sample_weight=np.full(40, 1e-320)), r"sample_weight sums to 4e-319, below the"),
    "class-1e308": (dict(class_weight={0: 1e308, 1: 1e308}), dict(), r"class_weight sums to inf"),
    "class-times-sample": (dict(class_weight={0: 1e200, 1: 1e200}), dict(sample_weight=np.full(40, 1e200)),
                           r"class_weight × sample_weight contains NaN or infinity"),
    "class-negative": (dict(class_weight={0: -1, 1: 1}), dict(), r"class_weight of class 0 must be a finite number "
                                                                 r">= 0, got -1"),
    "class-nan": (dict(class_weight={0: np.nan, 1: 1}), dict(), r"class_weight of class 0 must be a finite"),
    "class-inf": (dict(class_weight={0: 1, 1: np.inf}), dict(), r"class_weight of class 1 must be a finite"),
    "class-bool": (dict(class_weight={0: True, 1: 1}), dict(), r"class_weight of class 0 must be a finite"),
    "class-string": (dict(class_weight={0: "1", 1: 1}), dict(), r"class_weight of class 0 must be a finite"),
    "class-zeros": (dict(class_weight={0: 0, 1: 0}), dict(), r"class_weight sums to 0"),
    "class-one-class": (dict(class_weight={0: 0, 1: 1}), dict(), r"class_weight leaves a positive weight to one class"),
}


@pytest.mark.parametrize("params, fit_kwargs, match", BAD_WEIGHTS.values(), ids=BAD_WEIGHTS)
@pytest.mark.parametrize("method", ["fit", "partial_fit"])
def test_weights_that_would_train_nothing_are_refused_by_name(plain_model, data, params, fit_kwargs, match, method):
    X, y, _ = data
    if method == "partial_fit" and "leaves a positive weight" in match:
        pytest.skip("a partial_fit batch may hold one class")
    est = copy.deepcopy(plain_model).set_params(**params)
    kwargs = dict(fit_kwargs, **({"classes": [0, 1]} if method == "partial_fit" else {}))
    before_params = est.get_params()
    _refused(est, lambda est: getattr(est, method)(X, y, **kwargs), ValueError, match)
    assert est.get_params() == before_params


def test_a_site_whose_weights_are_all_zero_is_named(data):
    X, y, _ = data
    weights = np.ones(40)
    weights[:20] = 0  # contiguous partition: client 0 holds the first 20 trials
    fed = FederatedSPDnetClassifier(mk(), n_rounds=1, n_clients=2, partition="contiguous", random_state=0)
    with pytest.raises(ValueError, match=r"^client 0: sample_weight sums to 0"):
        fed.fit(X, y, sample_weight=weights)
    assert not hasattr(fed, "global_estimator_")


@pytest.mark.parametrize("method", ["fit", "partial_fit"])
def test_a_fit_in_which_no_minibatch_trained_is_refused(data, method):
    X, y, _ = data
    est = SPDnetClassifier(hidden_dims=(2,), max_epochs=2, random_state=0, dtype="float32").fit(X, y)
    kwargs = {"classes": [0, 1]} if method == "partial_fit" else {}
    # 1e-300 is a normal float64, but 0 in float32: every weighted loss is 0 / 0
    with pytest.warns(RuntimeWarning, match="skipped"):
        _refused(est, lambda est: getattr(est, method)(X, y, sample_weight=np.full(40, 1e-300), **kwargs),
                 RuntimeError, "no minibatch trained: all [12] had a non-finite loss or gradient")


# ------------------------------------------------------------------ data
@pytest.mark.parametrize("make, call", [
    (lambda data: copy.deepcopy(mk(batchnorm="domain").fit(data[0], data[1], groups=data[2])),
     lambda est, X, y, groups: est.fit(X, y, groups=groups)),
    (lambda data: Recenter().fit(data[0], groups=data[2]),
     lambda est, X, y, groups: est.fit_transform(X, groups=groups)),
], ids=["domain-bn", "recenter"])
@pytest.mark.parametrize("labels", ["ints", "strings"])
def test_domains_of_one_trial_each_are_refused(data, make, call, labels):
    X, y, _ = data
    est = make(data)
    groups = np.arange(len(X)) if labels == "ints" else np.array([f"s{i}" for i in range(len(X))])
    _refused(est, lambda est: call(est, X, y, groups), ValueError, r"groups gives each of the 40 domains a single trial")


@pytest.mark.parametrize("kind", ["domain-bn", "recenter"])
def test_some_one_trial_domains_are_warned_about_and_the_rest_trains(data, kind):
    X, y, groups = data
    groups = groups.copy()
    groups[:3] = [100, 101, 102]  # three singletons among four groups
    with pytest.warns(UserWarning, match=r"3 of the 7 domains of groups hold a single trial \(100, 101, 102\)"):
        if kind == "recenter":
            Y = Recenter().fit_transform(X, groups=groups)
            assert not np.allclose(Y[3:], np.eye(4))
        else:
            mk(batchnorm="domain").fit(X, y, groups=groups)


@pytest.mark.parametrize("low, high", [(1e-100, 1e100), (1, 1e7), (1e-4, 1e4)])
@pytest.mark.parametrize("scaling", ["auto", 1.0, None])
@pytest.mark.parametrize("method", ["fit", "partial_fit"])
def test_training_scales_spread_beyond_prediction_are_refused(data, low, high, scaling, method):
    X, y, _ = data
    mixed = X.copy()
    mixed[::2] *= low
    mixed[1::2] *= high
    est = mk(scaling=scaling).fit(X, y)  # fitted with it: partial_fit continues with the same scaling
    kwargs = {"classes": [0, 1]} if method == "partial_fit" else {}
    _refused(est, lambda est: getattr(est, method)(mixed, y, **kwargs), ValueError,
             rf"X matrices \d+ and \d+ differ in scale .* by [\d.]+ decades, more than the {TRAINING_SCALE_SPREAD:g} "
             "accepted in one fit")


def test_a_spread_within_the_bound_or_with_trace_scaling_trains(data):
    X, y, _ = data
    mixed = X.copy()
    mixed[::2] *= 1e-2
    mixed[1::2] *= 1e2  # 4 decades: e.g. subjects or amplifiers apart
    assert np.isfinite(mk().fit(mixed, y).predict_proba(mixed)).all()
    far = X.copy()
    far[::2] *= 1e-100
    far[1::2] *= 1e100
    assert np.isfinite(mk(scaling="trace").fit(far, y).predict_proba(far)).all()
