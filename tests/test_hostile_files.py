"""Hostile files and settings changed after fit: refused clearly, never applied in silence.

A crafted or damaged file is refused by ``load_estimator`` with a ValueError naming the path
and the field, before any network is built; every file ``save_estimator`` writes loads again.
A parameter that a fitted model's network or input transform was built with, changed by
``set_params`` since, is refused (naming the parameter) by every call that would use the model,
and the refused call leaves the model as it was.
"""

import copy
import json
import re
import struct

import numpy as np
import pytest
import torch

from skfedspd import (EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier, load_estimator,
                      save_estimator)
from skfedspd.backends import LocalBackend
from skfedspd.online import DomainAdaptation
from skfedspd.persistence import FORMAT_VERSION, load_bundle, save_bundle
from skfedspd.spec import MAX_JSON_DEPTH, loads

N_CHANNELS = 6


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_single_thread):
    yield


@pytest.fixture(scope="module")
def data():
    from conftest import make_spd_domains

    return make_spd_domains(n_groups=4, n_per_group=20, n_channels=N_CHANNELS, seed=0)


@pytest.fixture(scope="module")
def models(data):
    """Fitted models of every kind whose state a file holds (with an Adam session)."""
    X, y, groups = data
    train = groups < 3
    domain = SPDnetClassifier(batchnorm="domain", hidden_dims=(4,), max_epochs=2, random_state=0)
    domain.fit(X[train], y[train], groups=groups[train])
    domain.predict(X[groups == 3][:3], domain="p")
    spd = SPDnetClassifier(batchnorm="spd", hidden_dims=(4,), max_epochs=2, random_state=0).fit(X, y)
    plain = SPDnetClassifier(hidden_dims=(4,), scaling=10.0, max_epochs=2, random_state=0).fit(X, y)
    eeg_X = np.random.default_rng(0).standard_normal((24, 3, 64))
    eeg = EEGNetClassifier(fs=64, F1=2, D=1, F2=2, max_epochs=1, random_state=0).fit(eeg_X, np.arange(24) % 2)
    fed = FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=(4,), max_epochs=1), n_rounds=1, random_state=0)
    fed.fit(X, y, groups=groups)
    return {"domain": domain, "spd": spd, "plain": plain, "eeg": eeg, "fed": fed, "eeg_X": eeg_X}


def _state(est):
    """Everything an estimator holds, as comparable JSON text and arrays."""
    arrays, meta = est.fitted_state()
    meta = {"meta": meta, "params": {k: repr(v) for k, v in est.get_params().items()}}
    return json.dumps(meta, sort_keys=True, default=repr), {k: np.array(v, copy=True) for k, v in arrays.items()}


def _assert_same_state(before, after):
    assert after[0] == before[0]
    assert set(after[1]) == set(before[1])
    for name, value in after[1].items():
        np.testing.assert_array_equal(value, before[1][name], err_msg=name)


def _forbid_networks(monkeypatch):
    """From now on, fail if any network is built (a file must be refused before)."""
    def never(self, seed):
        raise AssertionError("a network was built before the file was refused")

    for cls in (SPDnetClassifier, EEGNetClassifier):
        monkeypatch.setattr(cls, "init_module", never)


def _saved(models, kind, tmp_path):
    path = tmp_path / f"{kind}.safetensors"
    save_estimator(models[kind], path)
    return path


def _tamper(path, edit):
    """Edit a file's arrays and metadata, then write it with a valid digest (as an attacker would)."""
    arrays, meta = load_bundle(path, kind="estimator")
    edit(arrays, meta)
    save_bundle(path, arrays, meta, kind="estimator")


# ------------------------------------------------------------------ crafted files: the state is validated
def _optimizer(**settings):
    def edit(arrays, meta):
        meta["state"]["optimizer"][0].update(settings)
    return edit


def _module(name, make):
    def edit(arrays, meta):
        key = next(k for k in arrays if k.endswith(f"module.{name}"))
        arrays[key] = make(arrays[key])
    return edit


def _param(**params):
    def edit(arrays, meta):
        meta["estimator"]["params"].update(params)
    return edit


def _engine(**fields):
    def edit(arrays, meta):
        meta["state"]["engine"].update(fields)
    return edit


def _fed_state(**fields):
    def edit(arrays, meta):
        meta["state"].update(fields)
    return edit


def _drop_engine_field(name):
    def edit(arrays, meta):
        del meta["state"]["engine"][name]
    return edit


CRAFTED = {
    # Adam's settings: a closed list of names, each value validated
    "maximize true": ("domain", _optimizer(maximize=True), "optimizer setting 'maximize' of parameter group 0 must be "
                                                           "false, got True"),
    "betas [2, 2]": ("domain", _optimizer(betas=[2, 2]), r"optimizer setting 'betas' .* must be two numbers in \[0, 1\)"),
    "betas one number": ("plain", _optimizer(betas=[0.9]), "optimizer setting 'betas'"),
    "betas NaN": ("plain", _optimizer(betas=[float("nan"), 0.9]), "optimizer setting 'betas'"),
    "amsgrad true": ("plain", _optimizer(amsgrad=True), "optimizer setting 'amsgrad' .* must be false"),
    "amsgrad a string": ("plain", _optimizer(amsgrad="yes"), "optimizer setting 'amsgrad' .* must be false"),
    "weight_decay 'x'": ("domain", _optimizer(weight_decay="x"), "optimizer setting 'weight_decay' .* must be a finite "
                                                                 "number >= 0, got 'x'"),
    "weight_decay -1": ("plain", _optimizer(weight_decay=-1), "optimizer setting 'weight_decay'"),
    "weight_decay inf": ("plain", _optimizer(weight_decay=float("inf")), "optimizer setting 'weight_decay'"),
    "eps 0": ("plain", _optimizer(eps=0), "optimizer setting 'eps' .* must be a finite number > 0"),
    "lr -1": ("plain", _optimizer(lr=-1), "optimizer setting 'lr' .* must be a finite number > 0"),
    "lr true": ("plain", _optimizer(lr=True), "optimizer setting 'lr'"),
    "capturable true": ("plain", _optimizer(capturable=True), "optimizer setting 'capturable'"),
    "differentiable true": ("plain", _optimizer(differentiable=True), "optimizer setting 'differentiable'"),
    "foreach a string": ("plain", _optimizer(foreach="x"), "optimizer setting 'foreach' .* must be null or false"),
    "fused true": ("plain", _optimizer(fused=True), "optimizer setting 'fused'"),
    "an unknown setting": ("plain", _optimizer(momentum=0.9), "the optimizer state does not match"),
    "negative exp_avg_sq": ("plain", lambda a, m: a.update({"optimizer.0.exp_avg_sq": -np.abs(
        a["optimizer.0.exp_avg_sq"]) - 1}), "optimizer state 'optimizer.0.exp_avg_sq' has negative values"),
    # the network's values: finite, bounded, orthonormal BiMaps
    "head 1e308": ("plain", _module("head.weight", lambda v: np.full_like(v, 1e308)),
                   "module array 'head.weight' has values of magnitude 1e\\+308 > 1e\\+06"),
    "bias -1e308": ("domain", _module("head.bias", lambda v: np.full_like(v, -1e308)), "module array 'head.bias'"),
    "head 1e7": ("plain", _module("head.weight", lambda v: np.full_like(v, 1e7)), "module array 'head.weight'"),
    "tangent V 1e300": ("plain", _module("bimaps.0.V", lambda v: np.full_like(v, 1e300)), "module array 'bimaps.0.V'"),
    "all-zero BiMap": ("plain", _module("bimaps.0.W_ref", np.zeros_like), "module array 'bimaps.0.W_ref' is not "
                                                                          "orthonormal"),
    "BiMap times 2": ("domain", _module("bimaps.0.W_ref", lambda v: 2 * v), "module array 'bimaps.0.W_ref' is not "
                                                                           "orthonormal"),
    "BiMap off by 1e-3": ("spd", _module("bimaps.0.W_ref", lambda v: v + 1e-3), "'bimaps.0.W_ref' is not orthonormal"),
    "federated zero BiMap": ("fed", _module("bimaps.0.W_ref", np.zeros_like), "'bimaps.0.W_ref' is not orthonormal"),
    "batch-norm bias e^1000": ("spd", _module("batchnorms.0.log_bias", lambda v: 1000 * np.eye(len(v))),
                               "module array 'batchnorms.0.log_bias' makes a batch-norm bias with eigenvalues"),
    "running mean -I": ("spd", _module("batchnorms.0.running_mean", lambda v: -np.eye(len(v))),
                        "module array 'batchnorms.0.running_mean' is not a symmetric positive definite matrix"),
    "EEGNet negative running_var": ("eeg", _module("bn1.running_var", lambda v: v - 10), "has negative variances"),
    "EEGNet weight 1e30": ("eeg", _module("temporal_conv.weight", lambda v: np.full_like(v, 1e30)),
                           "module array .temporal_conv.weight. has values of magnitude"),
    # device and dtype
    "device meta": ("plain", _param(device="meta"), "device='meta' cannot hold a model"),
    "device nonsense": ("plain", _param(device="nonsense"), "device='nonsense' is not a torch device"),
    "device a number": ("plain", _param(device=3), "The 'device' parameter of SPDnetClassifier must be"),
    "dtype float16": ("plain", _param(dtype="float16"), "'dtype' parameter"),
    "EEGNet device meta": ("eeg", _param(device="meta"), "device='meta'"),
    # no path from a file
    "checkpoint_path": ("fed", _param(checkpoint_path="/tmp/evil.safetensors"),
                        "checkpoint_path='/tmp/evil.safetensors': a file never chooses a path"),
    # wrong-typed fields of a federated state
    "engine history 'x'": ("fed", _engine(history="x"), "engine state field history must be a list of records"),
    "engine n_train 'x'": ("fed", _engine(n_train="x"), "engine state field n_train must be"),
    "engine n_train [-1, ...]": ("fed", _engine(n_train=[-1, 1, 1, 1]), "engine state field n_train"),
    "engine n_val too short": ("fed", _engine(n_val=[0]), "n_train and n_val must have one entry per client"),
    "engine seed -1": ("fed", _engine(seed=-1), "engine state field seed must be an int >= 0"),
    "engine seed 1.5": ("fed", _engine(seed=1.5), "engine state field seed"),
    "engine input_statistic NaN": ("fed", _engine(input_statistic=float("nan")), "engine state field input_statistic"),
    "engine has_best 1": ("fed", _engine(has_best=1), "engine state field has_best must be true or false"),
    "engine schedule a list": ("fed", _engine(schedule=[]), "engine state field schedule must be an object"),
    "engine without seed": ("fed", _drop_engine_field("seed"), "engine state field seed is missing"),
    "engine unknown field": ("fed", _engine(evil=1), r"unknown engine state fields \['evil'\]"),
    "client_groups 'x'": ("fed", _fed_state(client_groups="x"), "federated state field client_groups"),
    "client_source 3": ("fed", _fed_state(client_source=3), "federated state field client_source must be a string"),
    "engine a list": ("fed", _fed_state(engine=[]), "federated state field engine must be an object"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_file_is_refused_naming_the_field_before_any_network_is_built(models, tmp_path, case, monkeypatch):
    kind, edit, message = CRAFTED[case]
    path = _saved(models, kind, tmp_path)
    _tamper(path, edit)
    before = path.read_bytes()
    _forbid_networks(monkeypatch)
    with pytest.raises(ValueError, match=f"{path} holds an invalid estimator state: .*{message}"):
        load_estimator(path)
    assert path.read_bytes() == before  # the file is left alone


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_file_for_a_device_this_machine_lacks_is_refused_naming_it(models, tmp_path, monkeypatch, device):
    path = _saved(models, "plain", tmp_path)
    _tamper(path, _param(device=device))
    _forbid_networks(monkeypatch)
    with pytest.raises(ValueError, match=rf"device='{device}' is not available: this machine has 0 CUDA device"):
        load_estimator(path)


@pytest.mark.parametrize("device, message", [("meta", "device='meta' cannot hold a model"),
                                             ("nonsense", "device='nonsense' is not a torch device")])
def test_a_device_that_cannot_hold_a_model_is_refused_at_fit(data, device, message):
    X, y, _ = data
    clf = SPDnetClassifier(hidden_dims=(2,), max_epochs=1, device=device)
    with pytest.raises(ValueError, match=message):
        clf.fit(X, y)
    assert not clf.__sklearn_is_fitted__()


@pytest.mark.parametrize("kind", ["domain", "spd", "plain", "eeg", "fed"])
def test_an_untampered_file_of_every_kind_loads_and_predicts_the_same(models, data, tmp_path, kind):
    path = _saved(models, kind, tmp_path)
    loaded = load_estimator(path)
    X = models["eeg_X"][:4] if kind == "eeg" else data[0][:4]
    np.testing.assert_array_equal(loaded.predict_proba(X), copy.deepcopy(models[kind]).predict_proba(X))
    if kind == "fed":
        assert loaded.get_params().get("backend__checkpoint_path") is None


# ------------------------------------------------------------------ damaged files: the digest
def _header(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_header(path, header, body):
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


def _flip_bit(name, bit):
    """Flip one bit of the first value of array ``name`` in the file's bytes."""
    def edit(header, body):
        start = header[name]["data_offsets"][0]
        body = bytearray(body)
        body[start + bit // 8] ^= 1 << (bit % 8)
        return header, bytes(body)
    return edit


def _metadata(**fields):
    def edit(header, body):
        header["__metadata__"].update(fields)
        return header, body
    return edit


def _meta_text(old, new):
    def edit(header, body):
        meta = header["__metadata__"]["meta"]
        assert old in meta
        header["__metadata__"]["meta"] = meta.replace(old, new, 1)
        return header, body
    return edit


def _without_digest(header, body):
    del header["__metadata__"]["digest"]
    return header, body


DEEP = "[" * 100_000 + "]" * 100_000

DAMAGED = {
    "exponent bit of the head": (_flip_bit("module.head.weight", 62), "do not match its integrity digest"),
    "lowest bit of the head": (_flip_bit("module.head.weight", 0), "do not match its integrity digest"),
    "a bit of the BiMap": (_flip_bit("module.bimaps.0.W_ref", 40), "do not match its integrity digest"),
    "a bit of the Adam state": (_flip_bit("optimizer.0.exp_avg", 52), "do not match its integrity digest"),
    "a digit of the meta": (_meta_text('"n_features_in_": 6', '"n_features_in_": 7'),
                            "do not match its integrity digest"),
    "no digest": (_without_digest, "has no integrity digest"),
    "a digest of another kind": (_metadata(digest="md5:0"), "has no integrity digest"),
    "a wrong digest": (_metadata(digest="sha256:" + "0" * 64), "do not match its integrity digest"),
    "format version 1": (_metadata(format_version="1"), "format version '1'; this version of skfedspd reads version "
                                                         f"{FORMAT_VERSION} .it has no integrity digest"),
    "meta nested 100 000 deep": (_metadata(meta=DEEP), f"its metadata nests arrays and objects 100000 deep; at most "
                                                       f"{MAX_JSON_DEPTH}"),
    "meta not JSON": (_metadata(meta="{not json"), "its metadata is not JSON"),
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_file_is_refused_by_load_bundle_naming_the_problem(models, tmp_path, monkeypatch, case):
    edit, message = DAMAGED[case]
    path = _saved(models, "plain", tmp_path)
    header, body = _header(path)
    _write_header(path, *edit(header, body))
    _forbid_networks(monkeypatch)
    with pytest.raises(ValueError, match=rf"{path} .*{message}"):
        load_estimator(path)
    with pytest.raises(ValueError, match=rf"{path} .*{message}"):
        load_bundle(path, kind="estimator")


def test_the_deepest_file_the_package_writes_is_far_within_the_depth_bound(models, tmp_path):
    from skfedspd.aggregation import FLTrust

    X = np.stack([np.eye(N_CHANNELS)] * 3)
    fed = FederatedSPDnetClassifier(SPDnetClassifier(class_weight={0: 1.0, 1: 2.0}),
                                    aggregation=FLTrust(X, [0, 1, 0]))
    path = tmp_path / "deep.safetensors"
    save_estimator(fed, path)
    meta = _header(path)[0]["__metadata__"]["meta"]
    depth = max(np.cumsum([{"[": 1, "{": 1, "]": -1, "}": -1}.get(c, 0) for c in meta]))
    assert 8 <= depth <= MAX_JSON_DEPTH // 2
    assert list(load_estimator(path).aggregation.y) == [0, 1, 0]


@pytest.mark.parametrize("text, message", [(DEEP, "nests arrays and objects 100000 deep"),
                                           ("[" * 65 + "]" * 65, "nests arrays and objects 65 deep; at most 64"), ("not json", "is not JSON")])
def test_a_spec_text_nested_too_deep_or_not_json_is_a_value_error(text, message):
    with pytest.raises(ValueError, match=f"the estimator spec {message}"):
        loads(text)


# ------------------------------------------------------------------ settings changed after fit
AFTER_FIT = {  # model → (parameter, new value) that its network or input transform was not built with
    "domain": [("scaling", "trace"), ("scaling", 2.0), ("scaling", None), ("batchnorm", None), ("batchnorm", "spd"),
               ("hidden_dims", (3,)), ("hidden_dims", 3), ("eps", 0.1), ("recenter_every", 2), ("dtype", "float32"),
               ("device", "meta"), ("device", "cuda:7")],
    "plain": [("scaling", 5.0), ("scaling", "auto"), ("batchnorm", "domain"), ("hidden_dims", (2,)),
              ("dtype", "float32"), ("device", "meta")],
    "eeg": [("F1", 3), ("fs", 128.0), ("dropout", 0.5), ("standardize", "channel"), ("norm", "group"),
            ("dtype", "float64"), ("device", "meta")],
}
CASES = [(kind, param, value) for kind, changes in AFTER_FIT.items() for param, value in changes]


def _inputs(models, data, kind):
    if kind == "eeg":
        return models["eeg_X"][:4], np.arange(4) % 2
    X, y, groups = data
    return X[groups == 3][:4], y[groups == 3][:4]


def _calls(kind):
    calls = {
        "predict_proba": lambda est, X, y, path: est.predict_proba(X),
        "predict": lambda est, X, y, path: est.predict(X),
        "decision_function": lambda est, X, y, path: est.decision_function(X),
        "partial_fit": lambda est, X, y, path: est.partial_fit(X, y),
        "warm-started fit": lambda est, X, y, path: est.set_params(warm_start=True).fit(X, y),
        "save_estimator": lambda est, X, y, path: save_estimator(est, path),
    }
    if kind == "domain":
        calls.update({
            "predict_proba(domain=)": lambda est, X, y, path: est.predict_proba(X, domain="p"),
            "adapt": lambda est, X, y, path: est.adapt(X, domain="q"),
            "fit_domain_prior": lambda est, X, y, path: est.fit_domain_prior(X),
            "domains_": lambda est, X, y, path: est.domains_,
        })
    return calls


@pytest.mark.parametrize("kind, param, value", CASES)
def test_a_meaning_parameter_changed_after_fit_is_refused_by_every_use(models, data, tmp_path, kind, param, value):
    est = copy.deepcopy(models[kind])
    fitted = est.get_params()[param]
    before = _state(est)
    X, y = _inputs(models, data, kind)
    expected = est.predict_proba(X)
    path = tmp_path / "model.safetensors"
    est.set_params(**{param: value})  # permissive, as scikit-learn requires
    changed = (rf"{param}={re.escape(repr(value))} is not the {param}={re.escape(repr(fitted))} this model was "
               rf"fitted with .*refit with fit\(\), or set it back with set_params\({param}="
               rf"{re.escape(repr(fitted))}\)")
    # a value fit would refuse anyway gets its own error where the parameters are validated
    invalid = rf"{param}={re.escape(repr(value))} (cannot hold a model|is not available)"
    for name, call in _calls(kind).items():
        with pytest.raises(ValueError, match=rf"^(cannot save {path}: )?({changed}|{invalid})"):
            call(est, X, y, path)
        assert not path.exists(), name
        est.set_params(**{param: value, "warm_start": False})
    est.set_params(**{param: fitted})
    _assert_same_state(before, _state(est))
    np.testing.assert_array_equal(est.predict_proba(X), expected)


@pytest.mark.parametrize("kind, param, value", [case for case in CASES if case[2] not in ("meta", "cuda:7")])
def test_refitting_after_the_change_gives_a_model_of_the_new_settings(models, data, kind, param, value):
    est = copy.deepcopy(models[kind]).set_params(**{param: value})
    X, y = _inputs(models, data, kind)
    if kind != "eeg":
        X, y, _ = data
    est.fit(X, y)
    assert est.fitted_params_[param] == value
    assert est.predict_proba(X[:2]).shape == (2, 2)


@pytest.mark.parametrize("param, value", [("scaling", 10), ("scaling", np.float64(10.0)), ("hidden_dims", [4]),
                                          ("lr", 0.5), ("max_epochs", 7), ("trainable", "head")])
def test_a_parameter_that_does_not_change_the_fitted_model_is_accepted_after_fit(models, data, tmp_path, param,
                                                                                  value):
    est = copy.deepcopy(models["plain"])
    X, _, _ = data
    expected = est.predict_proba(X[:4])
    est.set_params(**{param: value})
    np.testing.assert_array_equal(est.predict_proba(X[:4]), expected)
    save_estimator(est, tmp_path / "model.safetensors")
    np.testing.assert_array_equal(load_estimator(tmp_path / "model.safetensors").predict_proba(X[:4]), expected)


# ------------------------------------------------------------------ save_estimator writes only what loads again
@pytest.mark.parametrize("kind, params, message", [
    ("plain", {"lr": -1}, "The 'lr' parameter of SPDnetClassifier must be"),
    ("plain", {"batch_size": 0}, "The 'batch_size' parameter"),
    ("domain", {"domain_adaptation": DomainAdaptation(prior_weight=float("inf"))}, "The 'prior_weight' parameter"),
    ("domain", {"hidden_dims": (3,)}, r"hidden_dims=\(3,\) is not the hidden_dims=\(4,\)"),
    ("domain", {"batchnorm": "spd"}, "batchnorm='spd' is not the batchnorm='domain'"),
    ("eeg", {"lr": 0.0}, "The 'lr' parameter of EEGNetClassifier"),
    ("fed", {"n_rounds": 0}, "The 'n_rounds' parameter"),
    ("fed", {"estimator__lr": -1}, "The 'lr' parameter"),
])
def test_save_estimator_refuses_what_load_estimator_would_refuse(models, tmp_path, kind, params, message):
    est = copy.deepcopy(models[kind])
    est.set_params(**params)
    path = tmp_path / "model.safetensors"
    with pytest.raises(ValueError, match=f"cannot save {path}: {message}"):
        save_estimator(est, path)
    assert not path.exists()


def test_save_estimator_refuses_a_model_whose_weights_would_not_load(models, tmp_path):
    est = copy.deepcopy(models["plain"])
    with torch.no_grad():
        est.module_.head.weight.fill_(1e300)
    path = tmp_path / "model.safetensors"
    with pytest.raises(ValueError, match=f"cannot save {path}: module array 'head.weight' has values of magnitude"):
        save_estimator(est, path)
    assert not path.exists()


def test_a_federated_file_never_carries_its_checkpoint_path(models, tmp_path):
    where = str(tmp_path / "ckpt.safetensors")
    est = copy.deepcopy(models["fed"]).set_params(backend=LocalBackend(n_jobs=2, checkpoint_path=where))
    path = tmp_path / "model.safetensors"
    save_estimator(est, path)
    saved = load_bundle(path, kind="estimator")[1]["estimator"]["params"]["backend"]["__estimator__"]
    assert saved == {"class": "LocalBackend", "params": {"checkpoint_path": None, "n_jobs": 2}}
    assert load_estimator(path).get_params()["backend__checkpoint_path"] is None
    assert est.backend.checkpoint_path == where  # the estimator keeps its own
