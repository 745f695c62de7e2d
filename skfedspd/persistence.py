"""Saving and loading without pickle: data-only files for models and federated state.

Format: one `safetensors <https://github.com/huggingface/safetensors>`_ file per bundle. It
was chosen over ``.npz`` + JSON because a safetensors file *is* a JSON header followed by
raw little-endian array bytes, parsed by a maintained, fuzzed library that never executes
anything from the file, that validates the header (offsets, sizes, dtypes) before handing out
an array, and that reports a truncated file as such; an ``.npz`` is a zip whose members are
each parsed by ``np.load`` (``allow_pickle=False`` helps, but the zip directory, the member
order and the JSON member would be ours to validate). Non-array state (labels of any type,
the history, the estimator's parameters) lives in the header as JSON, so a bundle can be
inspected with any JSON tool.

The header's ``__metadata__`` holds ``format`` (``"skfedspd"``), ``format_version``,
``kind`` (what the file holds: ``"estimator"``, ``"checkpoint"``...), ``fingerprint`` (the
configuration it was written for, or empty), ``meta`` (JSON, nested at most
:data:`skfedspd.spec.MAX_JSON_DEPTH` deep) and ``digest``, the SHA-256 of the kind, the
fingerprint, the meta text and every array's name, dtype, shape and bytes (:func:`digest`).
:func:`load_bundle` reads and checks the header before it reads any array, then checks the
digest before it returns anything: a flipped bit anywhere in the arrays or the meta is refused,
not loaded. (The digest detects corruption, not forgery: whoever can write a file can write
its digest; what a file may hold is what :func:`load_estimator` validates.) Every error names
the path and the problem.

Format version 2 added the digest; files of version 1 (skfedspd 0.2) are refused with a
message saying so.

The checks of what a file may hold live here too: the fields of a saved state
(:func:`check_fields`), an estimator's fitted attributes, labels and module arrays.
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
    """``"sha256:<hex>"`` of a bundle: its kind, fingerprint and meta text, then every array
    (sorted by name) as its name, little-endian dtype, shape and bytes.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.persistence import digest
    >>> a = digest("demo", "", "{}", {"W": np.eye(2)})
    >>> a == digest("demo", "", "{}", {"W": np.eye(2).astype(">f8")})  # the bytes as stored
    True
    >>> a == digest("demo", "", "{}", {"W": 2 * np.eye(2)}), a == digest("demo", "", '{"x": 1}', {"W": np.eye(2)})
    (False, False)
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
    """Write named arrays and JSON metadata to ``path`` (atomically).

    Parameters
    ----------
    path : str or path-like
    arrays : dict of str to ndarray
        Numeric or boolean arrays of any shape (strings go in ``meta``).
    meta : dict
        JSON data (numpy scalars and arrays are converted; NaN and infinity allowed).
    kind : str
        What the file holds; :func:`load_bundle` must be asked for the same kind.
    fingerprint : str or None
        The configuration the state belongs to; :func:`load_bundle` given another one refuses
        the file.

    Raises
    ------
    TypeError
        If an array has a dtype safetensors cannot store (e.g. strings) or ``meta`` is not
        JSON data; nothing is written.

    Examples
    --------
    Any safetensors reader opens the file; its header is JSON:

    >>> import json
    >>> import os
    >>> import tempfile
    >>> import numpy as np
    >>> from safetensors import safe_open
    >>> from skfedspd.persistence import save_bundle
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = os.path.join(folder.name, "state.safetensors")
    >>> save_bundle(path, {"W": np.eye(3)}, {"round": 4, "labels": ["left", "right"]}, kind="demo")
    >>> with safe_open(path, framework="numpy") as f:
    ...     header, W = f.metadata(), f.get_tensor("W")
    >>> header["kind"], json.loads(header["meta"]), W.shape
    ('demo', {'labels': ['left', 'right'], 'round': 4}, (3, 3))
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
    """Read a file written by :func:`save_bundle`, checking its header first.

    Parameters
    ----------
    path : str or path-like
    kind : str
        The kind the file must hold.
    fingerprint : str or None
        When given, the file must have been written with this fingerprint.

    Returns
    -------
    arrays : dict of str to ndarray
    meta : dict

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    IsADirectoryError
        If ``path`` is a directory.
    ValueError
        Naming ``path`` and the problem: empty, truncated or corrupted, not a skfedspd file,
        another format version, another kind, another configuration (fingerprint), no
        integrity digest, metadata nested deeper than :data:`skfedspd.spec.MAX_JSON_DEPTH`,
        arrays or metadata that do not match the digest. The format version, kind,
        fingerprint and the presence of the digest are checked before any array is read, the
        digest itself before anything is returned; nothing in the file is ever executed or
        unpickled.

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
    >>> load_bundle(path, kind="checkpoint", fingerprint="config-b")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ...checkpoint.safetensors was written for another configuration (fingerprint 'config-a', ...
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
    """Save an estimator of this package, fitted or not, without pickle.

    The parameters are written as the JSON spec of :mod:`skfedspd.spec` (only this package's
    estimators; a callable ``aggregation`` or a ``RandomState`` cannot be saved), the fitted
    state as ``estimator.fitted_state()``. A parameter that names a path on this machine
    (``FederatedSPDnetClassifier(backend=LocalBackend(checkpoint_path=...))``) is written as None: a file never
    chooses where a later fit writes.

    Only what :func:`load_estimator` would load again is written: the parameters are
    validated as ``fit`` validates them, a fitted model whose meaning parameters were changed
    by ``set_params`` since it was fitted (``scaling``, ``batchnorm``, ``hidden_dims``,
    ``dtype``, ``device``...: see the estimator's ``fitted_params_``) is refused, and the state
    is checked by rebuilding the estimator from what would be written, as
    :func:`load_estimator` does. Nothing is written then.

    Parameters
    ----------
    estimator : SPDnetClassifier, EEGNetClassifier or FederatedSPDnetClassifier
    path : str or path-like

    Raises
    ------
    ValueError
        Naming ``path``, the parameter or the field that :func:`load_estimator` would refuse.

    Examples
    --------
    >>> import os
    >>> import tempfile
    >>> import numpy as np
    >>> from skfedspd import SPDnetClassifier, load_estimator, save_estimator
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=30, n_channels=4, n_classes=3, seed=0)
    >>> clf = SPDnetClassifier(max_epochs=3, random_state=0).fit(X, y)
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = os.path.join(folder.name, "model.safetensors")
    >>> save_estimator(clf, path)
    >>> loaded = load_estimator(path)
    >>> bool(np.array_equal(loaded.predict_proba(X), clf.predict_proba(X)))
    True
    >>> save_estimator(clf.set_params(scaling="trace"), path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: cannot save ...model.safetensors: scaling='trace' is not the scaling='auto' this model was fitted with...
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
    """The estimator of a file's ``meta`` and ``arrays``, everything validated before it is built."""
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
    """Load an estimator written by :func:`save_estimator`.

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    estimator
        Predicts bit-identically to the saved one.

    Raises
    ------
    FileNotFoundError, IsADirectoryError, ValueError
        As :func:`load_bundle`, and when the saved state is invalid (message naming the
        path and the field). The whole header is validated before anything is built: the
        parameters (as ``fit`` validates them: ``device`` one this machine has, ``dtype``
        one of the list), no path (``checkpoint_path`` must be null: refused, not dropped,
        since ``save_estimator`` never writes one), the fitted attributes (types,
        finiteness, ranges), the labels (unique, of one type, a dtype the values justify),
        the domain statistics (unique labels, finite weights >= 0, counts >= 0, SPD means),
        the optimizer's settings (Adam's, from a closed list: ``lr`` finite > 0, ``betas`` in
        [0, 1), ``eps`` finite > 0, ``weight_decay`` finite >= 0, the flags ``amsgrad``,
        ``maximize``... false), the network's shapes against ``n_features_in_``,
        ``hidden_dims`` and the classes, so a header cannot make it allocate more than its
        file's arrays hold, and its values (finite, bounded, orthonormal BiMaps: refused, never
        replaced).

    Examples
    --------
    An unfitted estimator keeps its parameters; a fitted one, its model too (see
    :func:`save_estimator`):

    >>> import os
    >>> import tempfile
    >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier, load_estimator, save_estimator
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = os.path.join(folder.name, "config.safetensors")
    >>> save_estimator(FederatedSPDnetClassifier(SPDnetClassifier(lr=0.05), n_rounds=20), path)
    >>> loaded = load_estimator(path)
    >>> loaded.n_rounds, loaded.estimator.lr
    (20, 0.05)
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
    """``classes_`` from :func:`labels_to_json`'s output, validated before anything is
    allocated: a supported dtype whose item size the values justify, a list of numbers or
    strings of one type, without NaN, unique and sorted (as ``np.unique`` gives them)."""
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
    """Validate the JSON fields ``values`` of a saved state by a table ``checks`` (name →
    ``(test, what it must be, required)``) before anything is built from them.

    Parameters
    ----------
    values : dict
    checks : dict
    what : str
        What one field is, for the messages (``"fitted attribute"``).
    allowed : sequence of str or None
        The names allowed (None: those of ``checks``); an allowed name without a check is not
        tested.

    Raises
    ------
    ValueError
        Naming the field: unknown, missing (when required) or of the wrong type or range.

    Examples
    --------
    >>> from skfedspd.persistence import check_fields
    >>> checks = {"seed": (lambda v: isinstance(v, int), "an int", True)}
    >>> check_fields({"seed": 3}, checks, "engine field")
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
    """Validate saved fitted attributes (JSON) before anything is built from them
    (:func:`check_fields` with :data:`ATTRIBUTE_CHECKS`).

    Parameters
    ----------
    attributes : dict
        Name → value, as :meth:`TorchClassifierBase.fitted_state` writes them.
    allowed : sequence of str
        The estimator's ``_fitted_attributes()``.

    Raises
    ------
    ValueError
        Naming the attribute: unknown, missing (those a model cannot be built without) or
        of the wrong type or range (:data:`ATTRIBUTE_CHECKS`).
    """
    check_fields(attributes, ATTRIBUTE_CHECKS, "fitted attribute", allowed)


def check_module_values(arrays):
    """Require module values (finite numbers: checked by the caller with every array) no larger
    than :data:`MAX_STATE_MAGNITUDE`, and batch-norm running variances >= 0 (torch's ``running_var``)."""
    for name, value in arrays.items():
        if value.dtype.kind == "f" and value.size and np.abs(value).max() > MAX_STATE_MAGNITUDE:
            raise ValueError(f"module array {name!r} has values of magnitude {np.abs(value).max():.3g} > "
                             f"{MAX_STATE_MAGNITUDE:g}: no trained network holds such values")
        if name.endswith("running_var") and (value < 0).any():
            raise ValueError(f"module array {name!r} has negative variances")


def check_module_arrays(arrays, shapes, source):
    """Require the names and shapes ``shapes`` (name → shape, ``source`` says where they
    come from) of the numpy ``arrays`` of a module state."""
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
