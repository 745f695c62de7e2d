"""Tests for ``skfedspd.federated_module``: a module's state exported and loaded as named
numpy arrays with kinds, every array checked before any is loaded."""

import numpy as np
import pytest
import torch

from skfedspd.federated_module import FederatedModule
from skfedspd.nn import SPDNet


def _make_net(*args, **kwargs):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return SPDNet(*args, **kwargs)


def test_spdnet_get_parameters_returns_copies():
    net = _make_net(8, (4,), 3, seed=0)
    params = net.get_parameters()
    before = {k: v.copy() for k, v in params.items()}
    for value in params.values():
        value += 1.0
    for name, value in net.get_parameters().items():
        np.testing.assert_array_equal(value, before[name])


def test_spdnet_set_parameters_subset():
    net = _make_net(8, (6, 4), 3, seed=0)
    before = net.get_parameters()
    net.set_parameters({"head.bias": np.array([1.0, 2.0, 3.0])})
    after = net.get_parameters()
    np.testing.assert_array_equal(after["head.bias"], [1.0, 2.0, 3.0])
    for name in ("bimaps.0.weight", "bimaps.1.weight", "head.weight"):
        np.testing.assert_array_equal(after[name], before[name])


@pytest.mark.parametrize("bad_name", ["bimaps.2.weight", "head.weigth", "bimaps.0.W_ref", "bimaps.0.V"])
def test_spdnet_set_parameters_rejects_unknown_names(bad_name):
    net = _make_net(8, (6, 4), 3, seed=0)
    before = net.get_parameters()
    arrays = {"head.bias": np.zeros(3), bad_name: np.zeros((8, 6))}
    with pytest.raises(KeyError, match="unknown parameter names"):
        net.set_parameters(arrays)
    for name, value in net.get_parameters().items():  # nothing was loaded
        np.testing.assert_array_equal(value, before[name])


@pytest.mark.parametrize("name, shape", [
    ("bimaps.0.weight", (6, 8)),
    ("bimaps.1.weight", (6, 3)),
    ("head.weight", (3, 9)),
    ("head.bias", (4,)),
    ("head.bias", ()),
])
def test_spdnet_set_parameters_rejects_wrong_shapes(name, shape):
    net = _make_net(8, (6, 4), 3, seed=0)
    with pytest.raises(ValueError, match=rf"parameter '{name}' has shape .*expected"):
        net.set_parameters({name: np.zeros(shape)})


@pytest.mark.parametrize("name, value, message", [
    ("head.bias", np.array([0.0, np.nan, 1.0]), "must be a finite real array.*1 non-finite"),
    ("head.bias", np.array(["a", "b", "c"]), "must be a finite real array"),
    ("bimaps.1.weight", np.ones((6, 4)), "bimaps.1.weight"),
])
def test_set_parameters_refuses_bad_values_and_loads_nothing(name, value, message):
    net = _make_net(8, (6, 4), 3, seed=0)
    before = net.get_parameters()
    with pytest.raises(ValueError, match=message):
        net.set_parameters({"head.weight": np.zeros((3, 10)), name: value})
    for key, array in net.get_parameters().items():
        np.testing.assert_array_equal(array, before[key])


class _Scaled(FederatedModule):
    """A third-party module: a Euclidean weight and a statistic that stays local."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2, dtype=torch.float64)
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def parameter_kinds(self):
        return {"fc.weight": "euclidean", "fc.bias": "euclidean", "count": "local"}


def test_a_module_declares_its_kinds_and_integer_state_is_rounded():
    module = _Scaled()
    assert list(module.get_parameters()) == ["fc.weight", "fc.bias", "count"]
    module.set_parameters({"count": np.array(2.6)})  # a pooled (weighted-mean) count
    assert int(module.count) == 3
    with pytest.raises(NotImplementedError):
        FederatedModule().parameter_kinds()
