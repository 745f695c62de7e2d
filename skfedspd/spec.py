"""Estimators as JSON: how a configuration reaches a ServerApp, the sites, and saved files.

Only the estimators of this package can be rebuilt (an allow-list, no pickle), from their
``get_params(deep=False)``: JSON values, tuples (tagged), and nested estimators. A callable
``aggregation`` or a ``RandomState`` cannot travel: use a rule's name and an int seed.
The allow-list names each class by module and is resolved when used, so this module imports
no estimator module (no import cycle with the modules that use it).
"""

import importlib
import json

import numpy as np
from sklearn.base import BaseEstimator

__all__ = ["estimator_to_spec", "estimator_from_spec", "dumps", "loads"]


_ALLOWED = {
    "FederatedSPDnetClassifier": "skfedspd.federated",
    "SPDnetClassifier": "skfedspd.classifier",
    "EEGNetClassifier": "skfedspd.eegnet",
}


def _classes():
    return {name: getattr(importlib.import_module(module), name) for name, module in _ALLOWED.items()}


def _encode(value, where):
    if isinstance(value, BaseEstimator):
        return {"__estimator__": estimator_to_spec(value)}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, where) for v in value]}
    if isinstance(value, (list, np.ndarray)):  # an array (agreed classes) travels as a list
        return [_encode(v, where) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{where}={value!r} cannot be written as JSON: use JSON values "
                    "(an aggregation rule by name, an int random_state)")


def _decode(value):
    if isinstance(value, dict):
        if "__estimator__" in value:
            return estimator_from_spec(value["__estimator__"])
        if "__tuple__" in value:
            return tuple(_decode(v) for v in value["__tuple__"])
        raise ValueError(f"unexpected object in an estimator spec: {value!r}")
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def estimator_to_spec(estimator):
    """``{"class": name, "params": {...}}`` of one of this package's estimators."""
    classes = _classes()
    name = type(estimator).__name__
    if classes.get(name) is not type(estimator):
        raise TypeError(f"{name} cannot be written as JSON; allowed: {sorted(classes)}")
    params = estimator.get_params(deep=False)
    return {"class": name, "params": {k: _encode(v, f"{name}.{k}") for k, v in params.items()}}


def estimator_from_spec(spec):
    """Rebuild an unfitted estimator from :func:`estimator_to_spec`'s output."""
    classes = _classes()
    if not isinstance(spec, dict) or spec.get("class") not in classes or not isinstance(spec.get("params"), dict):
        raise ValueError(f"not an estimator spec of {sorted(classes)}: {spec!r}")
    return classes[spec["class"]](**{k: _decode(v) for k, v in spec["params"].items()})


def dumps(obj):
    return json.dumps(obj, sort_keys=True, allow_nan=True)


def loads(text):
    return json.loads(text)
