"""Tests for ``skfedspd.protocol``: what each local model declares to the federation
(``federation_traits``), read from its parameters by the model itself."""

import dataclasses

import pytest

from skfedspd import EEGNetClassifier, SPDnetClassifier
from skfedspd.protocol import FederationTraits


@pytest.mark.parametrize("params, expected", [
    ({}, {}),  # "auto" batch norm: a site has no groups, so no domains
    ({"batchnorm": "domain"}, {"domains": True}),
    ({"batchnorm": "spd"}, {"batch_statistics": True}),
    ({"batchnorm": None}, {}),
    ({"trainable": "head"}, {"head_only": True}),
    ({"class_weight": "balanced"}, {"class_weight": "balanced"}),
    ({"early_stopping": False}, {"early_stopping": False}),
    ({"lr": 3e-3, "batch_size": 16}, {"lr": 3e-3, "batch_size": 16}),
])
def test_spdnet_declares_what_its_parameters_mean(params, expected):
    traits = SPDnetClassifier(**params).federation_traits()
    defaults = {"lr": 1e-2, "batch_size": 64, "early_stopping": "auto"}
    assert traits == FederationTraits(**{**defaults, **expected})


def test_eegnet_declares_no_domains_and_holds_out_validation_when_asked():
    traits = EEGNetClassifier(lr=1e-3, batch_size=32).federation_traits()
    assert (traits.domains, traits.batch_statistics, traits.head_only) == (False, False, False)
    assert (traits.lr, traits.batch_size) == (1e-3, 32)


def test_traits_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        FederationTraits().domains = True
