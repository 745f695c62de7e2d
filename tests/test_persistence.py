"""Tests of :mod:`skfedspd.persistence`: data-only bundles, estimators saved without pickle,
and hostile files (pickle payloads, truncation, random bytes, other kinds/versions/configs)."""

import json
import os
import pickle
import struct

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from conftest import make_eeg_timeseries, make_spd_dataset
from skfedspd import EEGNetClassifier, SPDnetClassifier, load_estimator, save_estimator
from skfedspd.persistence import FORMAT_VERSION, load_bundle, save_bundle

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _spd(**kwargs):
    return SPDnetClassifier(**{**dict(hidden_dims=(4,), max_epochs=3, batch_size=16, lr=1e-2, random_state=0),
                               **kwargs})


def _eeg(**kwargs):
    return EEGNetClassifier(**{**dict(F1=2, D=1, F2=2, p1=2, p2=2, fs=32.0, max_epochs=3, batch_size=8, lr=1e-2,
                                      random_state=0), **kwargs})


def _data(kind, labels):
    if kind == "spd":
        X, y = make_spd_dataset(n_matrices=30, n_channels=6, n_classes=3, seed=0)
    else:
        X, y = make_eeg_timeseries(n_trials=30, n_channels=4, n_times=32, n_classes=3, seed=0)
    return X, np.asarray(labels)[y]


LABELS = {
    "int64": np.array([3, 7, 11]),
    "int32": np.array([-1, 0, 1], dtype=np.int32),
    "uint8": np.array([0, 1, 2], dtype=np.uint8),
    "float": np.array([-1.0, 0.0, 2.0]),
    "int16": np.array([10, 20, 30], dtype=np.int16),
    "str": np.array(["feet", "left_hand", "right_hand"]),
    "object-str": np.array(["a", "bb", "ccc"], dtype=object),
    "unicode": np.array(["α", "β", "γ"]),
}


def _assert_same_fitted(a, b, X):
    np.testing.assert_array_equal(a.decision_function(X), b.decision_function(X), strict=True)
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X), strict=True)
    np.testing.assert_array_equal(a.predict(X), b.predict(X), strict=True)
    np.testing.assert_array_equal(a.classes_, b.classes_, strict=True)
    assert a.classes_.dtype == b.classes_.dtype
    np.testing.assert_equal(a.history_, b.history_)
    for name in ("n_features_in_", "best_epoch_", "averaged_epochs_", "n_iter_", "scale_", "n_times_"):
        assert getattr(a, name, None) == getattr(b, name, None), name
    assert a.get_params() == b.get_params()


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("labels", LABELS, ids=list(LABELS))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", ["spd", "eeg"])
def test_round_trip_predicts_the_same_bits(tmp_path, kind, dtype, labels):
    X, y = _data(kind, LABELS[labels])
    clf = (_spd if kind == "spd" else _eeg)(dtype=dtype).fit(X, y)
    path = tmp_path / "model.safetensors"
    save_estimator(clf, path)
    loaded = load_estimator(path)
    assert type(loaded) is type(clf)
    _assert_same_fitted(loaded, clf, X)


@pytest.mark.parametrize("kind", ["spd", "eeg"])
def test_loaded_model_keeps_training_identically(tmp_path, kind):
    """Adam state and random streams are saved: partial_fit after a load continues exactly."""
    X, y = _data(kind, [0, 1, 2])
    clf = (_spd if kind == "spd" else _eeg)(validation_fraction=0.0).fit(X, y)
    save_estimator(clf, tmp_path / "m.safetensors")
    loaded = load_estimator(tmp_path / "m.safetensors")
    clf.partial_fit(X, y)
    loaded.partial_fit(X, y)
    _assert_same_fitted(loaded, clf, X)


def test_partial_fit_state_round_trip(tmp_path):
    X, y = _data("spd", [0, 1, 2])
    clf = _spd().partial_fit(X, y, classes=[0, 1, 2])
    save_estimator(clf, tmp_path / "m.safetensors")
    loaded = load_estimator(tmp_path / "m.safetensors")
    _assert_same_fitted(loaded, clf, X)


@pytest.mark.parametrize("params", [dict(scaling="trace"), dict(scaling=2.5), dict(scaling=None),
                                    dict(hidden_dims=(5, 3), recenter_every=3), dict(hidden_dims=4),
                                    dict(validation_fraction=0.0), dict(patience=None)])
def test_round_trip_spd_parameters(tmp_path, params):
    X, y = _data("spd", [0, 1, 2])
    clf = _spd(**params).fit(X, y)
    save_estimator(clf, tmp_path / "m.safetensors")
    loaded = load_estimator(tmp_path / "m.safetensors")
    _assert_same_fitted(loaded, clf, X)


def test_unfitted_round_trip(tmp_path):
    clf = _eeg(standardize="channel", dropout=0.5)
    save_estimator(clf, tmp_path / "m.safetensors")
    loaded = load_estimator(tmp_path / "m.safetensors")
    assert loaded.get_params() == clf.get_params()
    with pytest.raises(NotFittedError):
        loaded.predict(np.zeros((1, 4, 32)))


def test_warm_start_after_load(tmp_path):
    X, y = _data("spd", [0, 1, 2])
    clf = _spd(warm_start=True).fit(X, y)
    save_estimator(clf, tmp_path / "m.safetensors")
    loaded = load_estimator(tmp_path / "m.safetensors")
    _assert_same_fitted(loaded.fit(X, y), clf.fit(X, y), X)


def test_bundle_round_trip_dtypes_and_shapes(tmp_path):
    arrays = {"f64": np.random.default_rng(0).normal(size=(3, 4)), "f32": np.ones(5, np.float32),
              "i64": np.arange(6).reshape(2, 3), "u8": np.arange(7, dtype=np.uint8), "b": np.array([True, False]),
              "scalar": np.array(2.5), "empty": np.zeros((0, 3)), "fortran": np.asfortranarray(np.eye(3) * 2)}
    meta = {"nan": float("nan"), "nested": {"list": [1, 2.5, "x", None]}, "np": np.int64(3)}
    save_bundle(tmp_path / "b", arrays, meta, kind="test", fingerprint="abc")
    loaded, loaded_meta = load_bundle(tmp_path / "b", kind="test", fingerprint="abc")
    assert sorted(loaded) == sorted(arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(loaded[name], value, strict=True)
        assert loaded[name].flags.writeable
    assert np.isnan(loaded_meta["nan"]) and loaded_meta["nested"] == meta["nested"] and loaded_meta["np"] == 3
    assert load_bundle(tmp_path / "b", kind="test")[1]["np"] == 3  # no fingerprint asked: not checked
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


@pytest.mark.parametrize("value, match", [(np.array(["a"]), "dtype <U1"), (np.array([object()]), "dtype object"),
                                          (np.array([1j]), "dtype complex128")])
def test_save_rejects_non_numeric_arrays(tmp_path, value, match):
    with pytest.raises(TypeError, match=match):
        save_bundle(tmp_path / "b", {"x": value}, {}, kind="test")
    assert not os.listdir(tmp_path)


def test_save_rejects_non_json_meta(tmp_path):
    with pytest.raises(TypeError, match="is not JSON data"):
        save_bundle(tmp_path / "b", {}, {"f": print}, kind="test")
    assert not os.listdir(tmp_path)


def test_save_rejects_unsavable_parameters(tmp_path):
    with pytest.raises(TypeError, match="random_state"):
        save_estimator(_spd(random_state=np.random.RandomState(0)), tmp_path / "m")


def test_save_is_atomic_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    save_bundle(path, {"a": np.ones(2)}, {}, kind="test")
    original = os.replace

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        save_bundle(path, {"a": np.zeros(2)}, {}, kind="test")
    monkeypatch.setattr(os, "replace", original)
    np.testing.assert_array_equal(load_bundle(path, kind="test")[0]["a"], np.ones(2))
    assert os.listdir(tmp_path) == ["m.safetensors"]


def test_package_level_exports():
    import skfedspd

    assert skfedspd.save_estimator is save_estimator and skfedspd.load_estimator is load_estimator


# ---------------------------------------------------------------------------------------------
# Hostile files
# ---------------------------------------------------------------------------------------------


class _RunsCode:
    """Unpickling this calls os.system (creates a marker file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def saved(tmp_path):
    X, y = _data("spd", ["a", "b", "c"])
    path = tmp_path / "model.safetensors"
    save_estimator(_spd().fit(X, y), path)
    return path


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return path


def _safetensors_file(path, header, body=b""):
    raw = json.dumps(header).encode()
    return _write(path, struct.pack("<Q", len(raw)) + raw + body)


def test_pickle_payload_runs_no_code(tmp_path):
    marker = tmp_path / "pwned"
    path = _write(tmp_path / "evil.safetensors", pickle.dumps({"state": _RunsCode(marker)}))
    with pytest.raises(ValueError, match=rf"{path} is not a skfedspd file"):
        load_estimator(path)
    with pytest.raises(ValueError, match=rf"{path} is not a skfedspd file"):
        load_bundle(path, kind="checkpoint")
    assert not marker.exists()
    pickle.loads(path.read_bytes())  # the payload is live: the test can fail
    assert marker.exists()


def test_pickle_payload_inside_a_valid_container_runs_no_code(tmp_path):
    """A well-formed safetensors file whose array bytes are a pickle: arrays are raw bytes."""
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_RunsCode(marker))
    payload += b"\0" * (-len(payload) % 8)
    header = {"__metadata__": {"format": "skfedspd", "format_version": str(FORMAT_VERSION), "kind": "estimator",
                               "fingerprint": "", "meta": json.dumps({"estimator": {"class": "SPDnetClassifier",
                                                                                     "params": {}}, "fitted": False})},
              "x": {"dtype": "U8", "shape": [len(payload)], "data_offsets": [0, len(payload)]}}
    path = _safetensors_file(tmp_path / "evil.safetensors", header, payload)
    with pytest.raises(ValueError, match=str(path)):
        load_estimator(path)
    assert not marker.exists()


@pytest.mark.parametrize("spec", [{"class": "os.system", "params": {}},
                                  {"class": "SPDnetClassifier", "params": {"hidden_dims": {"__reduce__": 1}}},
                                  {"class": "SPDnetClassifier", "params": {"no_such_param": 1}},
                                  {"class": "SPDnetClassifier", "params": ["x"]}, ["SPDnetClassifier"]])
def test_unknown_class_or_params_in_spec(tmp_path, spec):
    path = tmp_path / "m.safetensors"
    save_bundle(path, {}, {"estimator": spec, "fitted": False}, kind="estimator")
    with pytest.raises(ValueError, match=rf"{path} holds an invalid estimator state"):
        load_estimator(path)


def test_empty_file(tmp_path):
    path = _write(tmp_path / "empty.safetensors", b"")
    with pytest.raises(ValueError, match=rf"{path} is empty"):
        load_estimator(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        load_estimator(tmp_path / "nope")


@pytest.mark.parametrize("keep", [0.99, 0.5, 0.1, 12 / 10_000])
def test_truncated_file(saved, keep):
    data = saved.read_bytes()
    path = _write(saved, data[: max(9, int(len(data) * keep))])
    with pytest.raises(ValueError, match=rf"{path} (is truncated or corrupted|is not a skfedspd file)"):
        load_estimator(path)


def test_truncated_in_the_arrays_says_truncated(saved):
    data = saved.read_bytes()
    path = _write(saved, data[:-3])
    with pytest.raises(ValueError, match=rf"{path} is truncated or corrupted: its size does not match its header"):
        load_estimator(path)


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes(tmp_path, seed):
    path = _write(tmp_path / "noise.safetensors", np.random.default_rng(seed).bytes(4096))
    with pytest.raises(ValueError, match=rf"{path} is not a skfedspd file"):
        load_estimator(path)


def test_npz_or_text_file(tmp_path):
    np.savez(tmp_path / "data.npz", X=np.ones(3))
    with pytest.raises(ValueError, match="data.npz is not a skfedspd file"):
        load_estimator(tmp_path / "data.npz")
    path = _write(tmp_path / "notes.txt", b"hello world, not a model")
    with pytest.raises(ValueError, match="notes.txt is not a skfedspd file"):
        load_estimator(path)


def test_foreign_safetensors_file(tmp_path):
    from safetensors.numpy import save_file

    save_file({"w": np.ones(3)}, str(tmp_path / "hf.safetensors"))
    with pytest.raises(ValueError, match="hf.safetensors is not a skfedspd file .*without the skfedspd header"):
        load_estimator(tmp_path / "hf.safetensors")


def test_wrong_kind(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    save_bundle(path, {"a": np.ones(2)}, {}, kind="checkpoint", fingerprint="f")
    with pytest.raises(ValueError, match=rf"{path} holds a 'checkpoint', not a 'estimator'"):
        load_estimator(path)


def test_wrong_version(tmp_path, monkeypatch):
    import skfedspd.persistence as persistence

    path = tmp_path / "future.safetensors"
    monkeypatch.setattr(persistence, "FORMAT_VERSION", FORMAT_VERSION + 1)
    save_bundle(path, {}, {}, kind="estimator")
    monkeypatch.undo()
    with pytest.raises(ValueError, match=rf"{path} was written in skfedspd file format version "
                                         rf"'{FORMAT_VERSION + 1}'; this version of skfedspd reads version "
                                         rf"{FORMAT_VERSION}$"):
        load_estimator(path)


def _recording_safe_open(monkeypatch):
    """Wrap persistence's safe_open to record every array read."""
    import skfedspd.persistence as persistence

    reads, original = [], persistence.safe_open

    class Recording:
        def __init__(self, *args, **kwargs):
            self.file = original(*args, **kwargs)

        def __enter__(self):
            self.inner = self.file.__enter__()
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

        def metadata(self):
            return self.inner.metadata()

        def keys(self):
            return self.inner.keys()

        def get_tensor(self, name):
            reads.append(name)
            return self.inner.get_tensor(name)

    monkeypatch.setattr(persistence, "safe_open", Recording)
    return reads


@pytest.mark.parametrize("kind, fingerprint, match", [
    ("checkpoint", "config-B", r"was written for another configuration \(fingerprint 'config-A', expected 'config-B'\)"),
    ("estimator", None, "holds a 'checkpoint', not a 'estimator'"),
])
def test_header_errors_come_before_any_array_is_read(tmp_path, monkeypatch, kind, fingerprint, match):
    path = tmp_path / "ckpt.safetensors"
    save_bundle(path, {"a": np.ones(2)}, {"round": 3}, kind="checkpoint", fingerprint="config-A")
    reads = _recording_safe_open(monkeypatch)
    with pytest.raises(ValueError, match=rf"{path} {match}"):
        load_bundle(path, kind=kind, fingerprint=fingerprint)
    assert reads == []
    arrays, meta = load_bundle(path, kind="checkpoint", fingerprint="config-A")
    assert reads == ["a"] and meta == {"round": 3}


def test_header_checked_before_any_array_is_read(tmp_path):
    """Arrays with inconsistent offsets behind a wrong kind: the kind error comes first."""
    header = {"__metadata__": {"format": "skfedspd", "format_version": str(FORMAT_VERSION), "kind": "other",
                               "fingerprint": "", "meta": "{}"},
              "a": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}}
    path = _safetensors_file(tmp_path / "x.safetensors", header, b"\0" * 16)
    with pytest.raises(ValueError, match="holds a 'other', not a 'estimator'"):
        load_estimator(path)


def test_corrupted_meta_json(tmp_path):
    header = {"__metadata__": {"format": "skfedspd", "format_version": str(FORMAT_VERSION), "kind": "estimator",
                               "fingerprint": "", "meta": "{not json", "digest": "sha256:" + "0" * 64}}
    path = _safetensors_file(tmp_path / "x.safetensors", header)
    with pytest.raises(ValueError, match=rf"{path} is corrupted: its metadata is not JSON"):
        load_estimator(path)


def _tamper(saved, arrays_fn=None, meta_fn=None):
    arrays, meta = load_bundle(saved, kind="estimator")
    if arrays_fn:
        arrays_fn(arrays)
    if meta_fn:
        meta_fn(meta)
    save_bundle(saved, arrays, meta, kind="estimator")
    return saved


TAMPERING = [
    ("missing module array", lambda a: a.pop("module.head.bias"), None, "missing \\['head.bias'\\]"),
    ("extra module array", lambda a: a.update({"module.evil": np.ones(1)}), None, "unexpected \\['evil'\\]"),
    ("wrong shape", lambda a: a.update({"module.head.bias": np.ones(7)}), None, "'head.bias' is float64 \\(7,\\)"),
    ("wrong dtype", lambda a: a.update({"module.head.bias": a["module.head.bias"].astype(np.float32)}), None,
     "'head.bias' is float32"),
    ("stray array", lambda a: a.update({"evil": np.ones(1)}), None, "unknown arrays \\['evil'\\]"),
    ("unknown attribute", None, lambda m: m["state"]["attributes"].update({"__class__": 1}),
     "unknown fitted attributes \\['__class__'\\]"),
    ("bad label dtype", None, lambda m: m["state"]["classes"].update({"dtype": "V8"}), "labels of dtype 'V8'"),
    ("bad labels", None, lambda m: m["state"]["classes"].update({"values": [{"a": 1}]}), "not a list of numbers"),
    ("optimizer mismatch", None, lambda m: m["state"]["optimizer"][0].update({"params": [0]}),
     "optimizer state does not match"),
    ("optimizer shape", lambda a: a.update({"optimizer.0.exp_avg": np.ones(3)}), None,
     "optimizer state 'optimizer.0.exp_avg' has shape"),
    ("bad rng", lambda a: a.update({"rng.torch": np.ones(3, np.uint8)}), None, "rng.torch is missing"),
    ("bad params", None, lambda m: m["estimator"]["params"].update({"eps": -1.0}), "'eps' parameter"),
]


@pytest.mark.parametrize("name, arrays_fn, meta_fn, match", TAMPERING, ids=[t[0] for t in TAMPERING])
def test_tampered_state_is_named(saved, name, arrays_fn, meta_fn, match):
    path = _tamper(saved, arrays_fn, meta_fn)
    with pytest.raises(ValueError, match=rf"{path} holds an invalid estimator state: .*{match}"):
        load_estimator(path)


def test_restore_fitted_state_is_atomic(saved):
    arrays, meta = load_bundle(saved, kind="estimator")
    clf = clone(_spd())
    arrays.pop("module.head.bias")
    before = set(vars(clf))
    with pytest.raises(ValueError, match="missing"):
        clf.restore_fitted_state(arrays, meta["state"])
    assert set(vars(clf)) == before and not clf.__sklearn_is_fitted__()


def test_fitted_state_is_json_and_arrays(saved):
    X, y = _data("eeg", ["x", "y", "z"])
    clf = _eeg().fit(X, y)
    arrays, meta = clf.fitted_state()
    json.dumps(meta, allow_nan=True)
    assert all(isinstance(v, np.ndarray) for v in arrays.values())
    assert any(k.startswith("module.bn1.running_mean") for k in arrays)  # buffers too
    with pytest.raises(NotFittedError):
        _eeg().fitted_state()
    assert isinstance(torch.from_numpy(arrays["rng.torch"]), torch.Tensor)
