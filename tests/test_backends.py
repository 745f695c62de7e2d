"""Tests for ``skfedspd.backends``: the transports' settings and their registry, and the
deprecated flat names (``n_jobs``, ``checkpoint_path``, ``secure_aggregation``) folded into them."""

import warnings

import pytest
from sklearn.base import clone

from skfedspd import FederatedSPDnetClassifier
from skfedspd.backends import (BACKEND_GROUP, FlowerBackend, LocalBackend, backend_names, resolve_backend,
                               uses_secure_aggregation)
from skfedspd.federated import get_backend


def test_the_package_registers_flower_as_an_entry_point():
    from importlib.metadata import entry_points

    assert {ep.name for ep in entry_points(group=BACKEND_GROUP)} >= {"flower"}
    assert backend_names() >= {"local", "flower"}


@pytest.mark.parametrize("backend, expected", [("local", LocalBackend()), ("flower", FlowerBackend()),
                                               (LocalBackend(n_jobs=2), LocalBackend(n_jobs=2))])
def test_resolve_backend_gives_settings(backend, expected):
    assert resolve_backend(backend).get_params() == expected.get_params()
    assert type(resolve_backend(backend)) is type(expected)


def test_a_registered_name_without_settings_stays_a_name():
    assert resolve_backend("elsewhere") == "elsewhere"


@pytest.mark.parametrize("backend, secure", [("local", False), ("flower", False), (LocalBackend(), False),
                                             (FlowerBackend(secure_aggregation=True), True)])
def test_uses_secure_aggregation(backend, secure):
    assert uses_secure_aggregation(backend) is secure


def test_a_checkpoint_path_that_is_a_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="checkpoint_path=.* is a directory"):
        LocalBackend(checkpoint_path=tmp_path).check_params()
    LocalBackend(checkpoint_path=tmp_path / "run.safetensors").check_params()


@pytest.mark.parametrize("setting, params, field", [(LocalBackend, {"n_jobs": True}, "n_jobs"),
                                                    (LocalBackend, {"checkpoint_path": 3}, "checkpoint_path"),
                                                    (FlowerBackend, {"secure_aggregation": "yes"}, "secure_aggregation")])
def test_settings_are_checked_by_name(setting, params, field):
    with pytest.raises(ValueError, match=field):
        setting(**params).check_params()


def test_an_unknown_backend_name_is_refused_with_the_names_it_knows():
    with pytest.raises(ValueError, match="local"):
        get_backend("nowhere")


@pytest.mark.parametrize("flat, expected", [
    ({"n_jobs": 2}, LocalBackend(n_jobs=2)),
    ({"checkpoint_path": "run.ckpt"}, LocalBackend(checkpoint_path="run.ckpt")),
    ({"secure_aggregation": True}, FlowerBackend(secure_aggregation=True)),
    ({"backend": "flower", "secure_aggregation": False}, FlowerBackend()),
])
def test_the_flat_names_fold_into_the_backend_with_a_future_warning(flat, expected):
    with pytest.warns(FutureWarning, match="backend="):
        fed = FederatedSPDnetClassifier(**flat)
    assert type(fed.backend) is type(expected) and fed.backend.get_params() == expected.get_params()
    assert clone(fed).backend.get_params() == expected.get_params()


def test_a_flat_checkpoint_path_on_flower_is_refused_and_n_jobs_warned():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError, match="checkpoint_path is not supported by the Flower backend"):
            FederatedSPDnetClassifier(backend="flower", checkpoint_path="run.ckpt")
        with pytest.warns(UserWarning, match="n_jobs"):
            fed = FederatedSPDnetClassifier(backend="flower", n_jobs=2)
    assert isinstance(fed.backend, FlowerBackend)
