"""Saving and loading without pickle: data-only files for models and federated state.

One safetensors file per bundle: named arrays, and in the header JSON metadata with
``format``, ``format_version``, ``kind``, ``fingerprint``, ``meta`` and a SHA-256
``digest`` (:func:`digest`), all checked before anything is returned (files of format
version 1 are refused). Why this format: ``docs/design-decisions.md``. The checks of what a
saved state may hold live here too (:func:`check_fields`).
"""

import hashlib
import json
import os
import tempfile

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as _safetensors_bytes
from sklearn.base import clone

from . import spec
from .validation import check_label_values, is_count, is_positive

__all__ = ["save_bundle", "load_bundle", "save_estimator", "load_estimator", "FORMAT_VERSION", "check_fields",
           "MAX_STATE_MAGNITUDE"]

FORMAT_VERSION = 2
_FORMAT = "skfedspd"
_ESTIMATOR_KIND = "estimator"
#: What each older format version lacks, for the message that refuses it.
_OLD_VERSIONS = {"1": "it has no integrity digest of its arrays (skfedspd 0.2); fit and save the model again"}


def digest(kind, fingerprint, meta_text, arrays):
    """``"sha256:<hex>"`` of a bundle's kind, fingerprint, meta text and arrays (sorted by name).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.persistence import digest
    >>> a = digest("demo", "", "{}", {"W": np.eye(2)})
    >>> a == digest("demo", "", "{}", {"W": np.eye(2).astype(">f8")}), a == digest("demo", "", "{}", {"W": 2 * np.eye(2)})
    (True, False)
    """
    sha = hashlib.sha256()
    for text in (kind, fingerprint, meta_text):
        sha.update(len(text.encode()).to_bytes(8, "little") + text.encode())
    for name in sorted(arrays):
        value = np.asarray(arrays[name])
        value = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
        sha.update(json.dumps([name, value.dtype.str, list(value.shape)]).encode() + b"\0")
        sha.update(value.tobytes())
    return "sha256:" + sha.hexdigest()


def _to_json(meta, path):
    def default(value):
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return value.tolist()
        raise TypeError(f"cannot write {path}: {type(value).__name__} {value!r} is not JSON data")

    return json.dumps(meta, default=default, allow_nan=True, sort_keys=True)


def save_bundle(path, arrays, meta, *, kind, fingerprint=None):
    """Write named numeric ``arrays`` and JSON ``meta`` to ``path`` atomically, as a bundle of
    ``kind`` for the configuration ``fingerprint``.

    Examples
    --------
    >>> import os
    >>> import tempfile
    >>> import numpy as np
    >>> from safetensors import safe_open
    >>> from skfedspd.persistence import save_bundle
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = os.path.join(folder.name, "state.safetensors")
    >>> save_bundle(path, {"W": np.eye(3)}, {"round": 4}, kind="demo")
    >>> with safe_open(path, framework="numpy") as f:
    ...     f.metadata()["kind"], f.get_tensor("W").shape
    ('demo', (3, 3))
    >>> folder.cleanup()
    """
    path = os.fspath(path)
    tensors = {}
    for name, value in arrays.items():
        value = np.asarray(value, order="C")  # keeps 0-d arrays 0-d
        if value.dtype.kind not in "biuf":
            raise TypeError(f"cannot write {path}: array {name!r} has dtype {value.dtype}; only numeric "
                            "and boolean arrays are stored (put labels and strings in meta)")
        tensors[str(name)] = value
    header = {"format": _FORMAT, "format_version": str(FORMAT_VERSION), "kind": str(kind),
              "fingerprint": "" if fingerprint is None else str(fingerprint), "meta": _to_json(meta, path)}
    header["digest"] = digest(header["kind"], header["fingerprint"], header["meta"], tensors)
    data = _safetensors_bytes(tensors, metadata=header)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_header(path, f, kind, fingerprint):
    header = f.metadata() or {}
    if header.get("format") != _FORMAT:
        raise ValueError(f"{path} is not a skfedspd file (a safetensors file without the skfedspd header)")
    version = header.get("format_version")
    if version != str(FORMAT_VERSION):
        why = f" ({_OLD_VERSIONS[version]})" if version in _OLD_VERSIONS else ""
        raise ValueError(f"{path} was written in skfedspd file format version {version!r}; this version of "
                         f"skfedspd reads version {FORMAT_VERSION!r}{why}")
    if header.get("kind") != kind:
        raise ValueError(f"{path} holds a {header.get('kind')!r}, not a {kind!r}")
    saved = header.get("fingerprint") or None
    if fingerprint is not None and saved != fingerprint:
        raise ValueError(f"{path} was written for another configuration (fingerprint {saved!r}, expected "
                         f"{fingerprint!r})")
    saved_digest = header.get("digest")
    if not isinstance(saved_digest, str) or not saved_digest.startswith("sha256:"):
        raise ValueError(f"{path} has no integrity digest ('digest' of its header is {saved_digest!r}): it was "
                         "not written by skfedspd's save_bundle, or its header was edited")
    try:
        return spec.parse_json(header.get("meta", ""), "its metadata")
    except ValueError as error:
        raise ValueError(f"{path} is corrupted: {error}") from None


def _check_digest(path, f, arrays):
    header = f.metadata()
    expected = digest(header["kind"], header["fingerprint"], header.get("meta", ""), arrays)
    if header["digest"] != expected:
        raise ValueError(f"{path} is corrupted: its arrays or metadata do not match its integrity digest (saved "
                         f"{header['digest']!r}, computed {expected!r}); it was damaged or edited after it was "
                         "written")


def load_bundle(path, *, kind, fingerprint=None):
    """``(arrays, meta)`` of a file written by :func:`save_bundle`, its header and digest checked
    first: a ValueError naming ``path`` for a truncated or corrupted file, or one of another
    ``kind`` or ``fingerprint``.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import numpy as np
    >>> from skfedspd.persistence import load_bundle, save_bundle
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = Path(folder.name) / "checkpoint.safetensors"
    >>> save_bundle(path, {"step": np.array(3)}, {}, kind="checkpoint", fingerprint="config-a")
    >>> load_bundle(path, kind="checkpoint", fingerprint="config-a")[0]
    {'step': array(3)}
    >>> folder.cleanup()
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory, not a skfedspd file")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path} is empty (not a skfedspd file)")
    try:
        with safe_open(path, framework="numpy") as f:
            meta = _read_header(path, f, kind, fingerprint)
            arrays = {name: np.array(f.get_tensor(name)) for name in f.keys()}
            _check_digest(path, f, arrays)
    except SafetensorError as error:
        message = str(error)
        if "incomplete metadata" in message or "invalid header length" in message:
            raise ValueError(f"{path} is truncated or corrupted: its size does not match its header "
                             f"({message})") from None
        raise ValueError(f"{path} is not a skfedspd file ({message})") from None
    return arrays, meta


def save_estimator(estimator, path):
    """Save an estimator of this package, fitted or not, without pickle (its JSON spec and
    ``fitted_state()``); only what :func:`load_estimator` would load again is written.

    Examples
    --------
    >>> import os
    >>> import tempfile
    >>> import numpy as np
    >>> from skfedspd import SPDnetClassifier, load_estimator, save_estimator
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=30, n_channels=4, n_classes=3, seed=0)
    >>> clf = SPDnetClassifier(max_epochs=2, random_state=0).fit(X, y)
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = os.path.join(folder.name, "model.safetensors")
    >>> save_estimator(clf, path)
    >>> bool(np.array_equal(load_estimator(path).predict_proba(X), clf.predict_proba(X)))
    True
    >>> folder.cleanup()
    """
    path = os.fspath(path)
    # a path of this machine (the estimator's _local_paths, nested names included) is written as null
    paths = {name: None for name in getattr(estimator, "_local_paths", ()) if estimator.get_params().get(name) is not None}
    meta = {"estimator": spec.estimator_to_spec(clone(estimator).set_params(**paths) if paths else estimator),
            "fitted": False}
    arrays = {}
    try:
        estimator.check_params()
        if estimator.__sklearn_is_fitted__():
            arrays, meta["state"] = estimator.fitted_state()
            meta["fitted"] = True
            # what load_estimator does, on what would be written (JSON and back, as in the file)
            _restore(json.loads(_to_json(meta, path)), {k: np.array(v, copy=True) for k, v in arrays.items()})
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"cannot save {path}: {error}") from None
    save_bundle(path, arrays, meta, kind=_ESTIMATOR_KIND)


def _restore(meta, arrays):
    """The estimator of a file's ``meta`` and ``arrays``, validated before it is built."""
    if not isinstance(meta, dict) or not isinstance(meta.get("estimator"), dict):
        raise ValueError("the metadata has no estimator spec (an object under 'estimator')")
    if not isinstance(meta.get("fitted"), bool):
        raise ValueError(f"'fitted' must be true or false, got {meta.get('fitted')!r}")
    if meta["fitted"] and not isinstance(meta.get("state"), dict):
        raise ValueError(f"'state' of a fitted estimator must be an object, got {meta.get('state')!r}")
    estimator = spec.estimator_from_spec(meta["estimator"])
    for name in getattr(estimator, "_local_paths", ()):
        if (value := estimator.get_params().get(name)) is not None:
            raise ValueError(f"{name}={value!r}: a file never chooses a path this process "
                             f"writes to (save_estimator writes {name} as null); set it after loading")
    estimator.check_params()  # the parameters, before anything is built from them
    if meta["fitted"]:
        estimator.restore_fitted_state(arrays, meta["state"])
    elif arrays:
        raise ValueError(f"an unfitted estimator with arrays {sorted(arrays)}")
    return estimator


def load_estimator(path):
    """Load an estimator written by :func:`save_estimator` (predicting bit-identically); the
    whole file is validated before anything is built (errors as :func:`load_bundle`'s).

    Examples
    --------
    >>> import os
    >>> import tempfile
    >>> from skfedspd import FederatedSPDnetClassifier, load_estimator, save_estimator
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = os.path.join(folder.name, "config.safetensors")
    >>> save_estimator(FederatedSPDnetClassifier(n_rounds=20), path)
    >>> load_estimator(path).n_rounds
    20
    >>> folder.cleanup()
    """
    path = os.fspath(path)
    arrays, meta = load_bundle(path, kind=_ESTIMATOR_KIND)
    try:
        return _restore(meta, arrays)
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"{path} holds an invalid estimator state: {error}") from None


#: The largest magnitude a saved network value may have. Trained weights are of order 1 to 100
#: (Adam moves each by about ``lr`` per step); 1e6 leaves room for any of them while keeping the
#: logits of any input in the working range finite (a head of 1e308 predicts NaN).
MAX_STATE_MAGNITUDE = 1e6


def labels_to_json(classes):
    """``classes_`` as JSON: its dtype and values (numbers, booleans or strings)."""
    if classes.dtype.kind == "O" and not all(isinstance(c, (str, int, float, bool)) for c in classes.tolist()):
        raise TypeError(f"classes of types {sorted({type(c).__name__ for c in classes})} cannot be saved; "
                        "use numbers or strings as labels")
    dtype = "object" if classes.dtype.kind == "O" else classes.dtype.str
    return {"dtype": dtype, "values": classes.tolist()}


def labels_from_json(saved):
    """``classes_`` from :func:`labels_to_json`'s output, validated before anything is allocated."""
    if not isinstance(saved, dict) or set(saved) != {"dtype", "values"}:
        raise ValueError(f"classes must be an object with 'dtype' and 'values', got {saved!r}")
    values = saved["values"]
    if not isinstance(values, list) or not all(isinstance(v, (str, int, float, bool)) for v in values):
        raise ValueError("classes: the saved labels are not a list of numbers or strings")
    try:
        dtype = np.dtype(saved["dtype"])
    except TypeError:
        raise ValueError(f"classes: {saved['dtype']!r} is not a dtype") from None
    if dtype.kind not in "biufUO":
        raise ValueError(f"classes: labels of dtype {saved['dtype']!r} are not supported")
    longest = max((len(v) for v in values if isinstance(v, str)), default=0)
    if dtype.kind == "U" and dtype.itemsize // 4 > max(longest, _MAX_LABEL_WIDTH):
        raise ValueError(f"classes: dtype {saved['dtype']!r} holds {dtype.itemsize // 4} characters per label, but the "
                         f"longest label has {longest}")
    check_label_values(values, "classes")
    classes = np.empty(len(values), dtype=dtype) if dtype.kind == "O" else np.array(values, dtype=dtype)
    if dtype.kind == "O":
        classes[:] = values
    if len(classes) < 2 or len(np.unique(classes)) != len(classes) or not np.array_equal(np.unique(classes), classes):
        raise ValueError(f"classes must be at least two unique labels in sorted order, got {values!r}")
    return classes


#: Characters per label a saved ``classes_`` dtype may reserve beyond its longest label
#: (labels from a fixed-width string array keep its width).
_MAX_LABEL_WIDTH = 1024


def _check_history(value):
    return isinstance(value, list) and all(isinstance(record, dict) for record in value)


def _check_epochs(value):
    return isinstance(value, list) and all(is_count(epoch) for epoch in value)


def _check_input_range(value):
    return (isinstance(value, dict) and set(value) == {"log_scale", "log_condition"}
            and all(isinstance(pair, list) and len(pair) == 2
                    and all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in pair)
                    and pair[0] <= pair[1] for pair in value.values()))


#: How a saved fitted attribute is checked: ``(test, what it must be, required)``.
ATTRIBUTE_CHECKS = {
    "n_features_in_": (lambda v: is_count(v, 1), "an int >= 1", True),
    "history_": (_check_history, "a list of records (objects)", False),
    "best_epoch_": (lambda v: is_count(v, 0), "an int >= 0", False),
    "averaged_epochs_": (_check_epochs, "a list of ints >= 0", False),
    "n_iter_": (lambda v: is_count(v, 0), "an int >= 0", False),
    "validation_used_": (lambda v: isinstance(v, bool), "true or false", False),
    "scale_": (is_positive, "a finite number > 0", True),
    "input_range_": (_check_input_range, 'an object {"log_scale": [low, high], "log_condition": [low, high]} of '
                     "finite numbers, low <= high", False),
    "n_times_": (lambda v: is_count(v, 1), "an int >= 1", True),
    "batchnorm_": (lambda v: v in (None, "spd", "domain"), 'null, "spd" or "domain"', False),
}


def check_fields(values, checks, what, allowed=None):
    """Validate the JSON fields of a saved state by a table ``checks`` (name → ``(test, what it
    must be, required)``).

    Parameters
    ----------
    values : dict
    checks : dict
    what : str
        What one field is, for the messages.
    allowed : sequence of str or None
        The names allowed (None: those of ``checks``).

    Examples
    --------
    >>> from skfedspd.persistence import check_fields
    >>> checks = {"seed": (lambda v: isinstance(v, int), "an int", True)}
    >>> check_fields({"seed": "x"}, checks, "engine field")
    Traceback (most recent call last):
    ...
    ValueError: the engine field seed must be an int, got 'x'
    """
    allowed = list(checks) if allowed is None else list(allowed)
    if not isinstance(values, dict):
        raise ValueError(f"the {what}s must be a JSON object, got {type(values).__name__}")
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {what}s {unknown}")
    for name in allowed:
        if name not in checks:  # e.g. a third-party estimator's own attribute
            continue
        test, must, required = checks[name]
        if name not in values:
            if required:
                raise ValueError(f"the {what} {name} is missing")
            continue
        if not test(values[name]):
            raise ValueError(f"the {what} {name} must be {must}, got {values[name]!r}")


def check_fitted_attributes(attributes, allowed):
    """Validate saved fitted attributes (:func:`check_fields` with :data:`ATTRIBUTE_CHECKS`).

    Parameters
    ----------
    attributes : dict
    allowed : sequence of str
    """
    check_fields(attributes, ATTRIBUTE_CHECKS, "fitted attribute", allowed)


def check_module_values(arrays):
    """Require module values no larger than :data:`MAX_STATE_MAGNITUDE` and running variances >= 0."""
    for name, value in arrays.items():
        if value.dtype.kind == "f" and value.size and np.abs(value).max() > MAX_STATE_MAGNITUDE:
            raise ValueError(f"module array {name!r} has values of magnitude {np.abs(value).max():.3g} > "
                             f"{MAX_STATE_MAGNITUDE:g}: no trained network holds such values")
        if name.endswith("running_var") and (value < 0).any():
            raise ValueError(f"module array {name!r} has negative variances")


def check_module_arrays(arrays, shapes, source):
    """Require the names and shapes ``shapes`` of a module state's ``arrays``."""
    if set(arrays) != set(shapes):
        missing, extra = sorted(set(shapes) - set(arrays)), sorted(set(arrays) - set(shapes))
        raise ValueError(f"the module state does not match the parameters: missing {missing}, unexpected {extra}")
    for name, value in arrays.items():
        if value.shape != tuple(shapes[name]):
            raise ValueError(f"module array {name!r} is {value.dtype} {value.shape}, expected shape "
                             f"{tuple(shapes[name])} ({source})")


def load_module_state(module, arrays):
    """``module.load_state_dict`` from numpy arrays, requiring the same names, shapes and dtypes."""
    expected = module.state_dict()
    check_module_arrays(arrays, {name: tuple(t.shape) for name, t in expected.items()}, "the module's")
    for name, value in arrays.items():
        target = expected[name]
        if torch.from_numpy(value).dtype != target.dtype:
            raise ValueError(f"module array {name!r} is {value.dtype} {value.shape}, expected "
                             f"{target.dtype} {tuple(target.shape)}")
    module.load_state_dict({name: torch.from_numpy(value) for name, value in arrays.items()}, strict=True)
