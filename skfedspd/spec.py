"""Estimators as JSON: how a configuration reaches a ServerApp, the sites, and saved files.

Only this package's estimators can be rebuilt (an allow-list, no pickle), from their
``get_params(deep=False)``: JSON values, tagged tuples and dicts, and nested estimators
(aggregation rules, settings objects). A callable ``aggregation`` or a ``RandomState``
cannot travel; parameters in ``_params_not_in_spec`` (a fitted ``init``) are written as None.
"""

import importlib
import json
import re

import numpy as np
from sklearn.base import BaseEstimator

__all__ = ["estimator_to_spec", "estimator_from_spec", "dumps", "loads", "parse_json", "MAX_JSON_DEPTH"]

#: The deepest nesting of arrays and objects a JSON text read by this package may have. The
#: deepest it writes is about 12 (a federated estimator's spec with an FLTrust root set inside a
#: saved file); a header nested 100 000 deep would exhaust Python's recursion instead.
MAX_JSON_DEPTH = 64

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


_ALLOWED = {
    "FederatedSPDnetClassifier": "skfedspd.federated",
    "SPDnetClassifier": "skfedspd.classifier",
    "EEGNetClassifier": "skfedspd.eegnet",
}
#: Allowed as a parameter's value only (``aggregation=``), never as the saved estimator.
_NESTED = {**{name: "skfedspd.aggregation" for name in ("GeometricMedian", "TrimmedMean", "Krum", "FLTrust")},
           "RoundSchedule": "skfedspd.training", "EpochSchedule": "skfedspd.training",
           "ServerMomentum": "skfedspd.server_optimizer",
           "DPSGD": "skfedspd.privacy", "ClientPartition": "skfedspd.clients", "DomainAdaptation": "skfedspd.online",
           "LocalBackend": "skfedspd.backends", "FlowerBackend": "skfedspd.backends"}


def _classes(nested=False):
    allowed = {**_ALLOWED, **_NESTED} if nested else _ALLOWED
    return {name: getattr(importlib.import_module(module), name) for name, module in allowed.items()}


def _encode(value, where):
    if isinstance(value, BaseEstimator):
        return {"__estimator__": _to_spec(value, _classes(nested=True))}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, where) for v in value]}
    if isinstance(value, dict):  # keys of any JSON type (labels), in order
        return {"__dict__": [[_encode(k, where), _encode(v, where)] for k, v in value.items()]}
    if isinstance(value, np.ndarray):  # an array (agreed classes) travels as a list
        return _encode(value.tolist(), where)
    if isinstance(value, list):
        return [_encode(v, where) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{where}={value!r} cannot be written as JSON: use JSON values "
                    "(an aggregation rule by name, an int random_state)")


def _is_pair_list(pairs):
    """Whether an encoded dict is a list of ``[key, value]`` pairs with scalar keys."""
    return isinstance(pairs, list) and all(
        isinstance(p, list) and len(p) == 2 and (p[0] is None or isinstance(p[0], (bool, int, float, str)))
        for p in pairs)


def _decode(value):
    if isinstance(value, dict):
        if "__estimator__" in value:
            return _from_spec(value["__estimator__"], _classes(nested=True))
        if "__tuple__" in value and isinstance(value["__tuple__"], list):
            return tuple(_decode(v) for v in value["__tuple__"])
        if "__dict__" in value and _is_pair_list(value["__dict__"]):
            return {_decode(k): _decode(v) for k, v in value["__dict__"]}
        raise ValueError(f"unexpected object in an estimator spec: {value!r}")
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def estimator_to_spec(estimator):
    """``{"class": name, "params": {...}}`` of one of this package's estimators.

    Examples
    --------
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.spec import estimator_to_spec
    >>> estimator_to_spec(SPDnetClassifier(class_weight={0: 1.0, 1: 3.0}))["params"]["class_weight"]
    {'__dict__': [[0, 1.0], [1, 3.0]]}
    """
    return _to_spec(estimator, _classes())


def _to_spec(estimator, classes):
    name = type(estimator).__name__
    if classes.get(name) is not type(estimator):
        raise TypeError(f"{name} cannot be written as JSON; allowed: {sorted(classes)}")
    params = estimator.get_params(deep=False)
    params.update(dict.fromkeys(getattr(estimator, "_params_not_in_spec", ())))
    return {"class": name, "params": {k: _encode(v, f"{name}.{k}") for k, v in params.items()}}


def estimator_from_spec(spec):
    """Rebuild an unfitted estimator from :func:`estimator_to_spec`'s output.

    Examples
    --------
    >>> from skfedspd import FederatedSPDnetClassifier
    >>> from skfedspd.aggregation import TrimmedMean
    >>> from skfedspd.spec import estimator_from_spec, estimator_to_spec
    >>> estimator_from_spec(estimator_to_spec(FederatedSPDnetClassifier(aggregation=TrimmedMean(trim=0.3)))).aggregation
    TrimmedMean(trim=0.3)
    """
    return _from_spec(spec, _classes())


def _from_spec(spec, classes):
    if not isinstance(spec, dict) or spec.get("class") not in classes or not isinstance(spec.get("params"), dict):
        raise ValueError(f"not an estimator spec of {sorted(classes)}: {spec!r}")
    return classes[spec["class"]](**{k: _decode(v) for k, v in spec["params"].items()})


def dumps(obj):
    """JSON text of a spec (sorted keys; NaN and infinity allowed).

    Examples
    --------
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.spec import dumps, estimator_to_spec
    >>> dumps(estimator_to_spec(SPDnetClassifier()))[:30]
    '{"class": "SPDnetClassifier", '
    """
    return json.dumps(obj, sort_keys=True, allow_nan=True)


def parse_json(text, what="the JSON text"):
    """``json.loads(text)`` after checking that it nests no deeper than :data:`MAX_JSON_DEPTH`.

    Examples
    --------
    >>> from skfedspd.spec import parse_json
    >>> parse_json('{"a": [1, "]]"]}')
    {'a': [1, ']]']}
    """
    if not isinstance(text, str):
        raise ValueError(f"{what} is a {type(text).__name__}, not JSON text")
    skeleton = np.frombuffer(_JSON_STRING.sub("", text).encode(), dtype=np.uint8)
    steps = (np.isin(skeleton, (ord("["), ord("{"))).astype(np.int64)
             - np.isin(skeleton, (ord("]"), ord("}"))).astype(np.int64))
    depth = int(np.cumsum(steps).max()) if len(steps) else 0
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{what} nests arrays and objects {depth} deep; at most {MAX_JSON_DEPTH} are allowed")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{what} is not JSON ({error})") from None


def loads(text):
    """Inverse of :func:`dumps` (:func:`parse_json`).

    Examples
    --------
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.spec import dumps, estimator_from_spec, estimator_to_spec, loads
    >>> estimator_from_spec(loads(dumps(estimator_to_spec(SPDnetClassifier(lr=0.05))))).lr
    0.05
    """
    return parse_json(text, "the estimator spec")
