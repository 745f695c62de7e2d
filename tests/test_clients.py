"""Tests for ``skfedspd.clients``: client index arrays from groups, the seeded partitions,
and ``ClientPartition``, the setting that chooses between them."""

import warnings

import numpy as np
import pytest
import sklearn
from sklearn.base import clone

from skfedspd.clients import ClientPartition, make_clients, partition_indices


def test_make_clients():
    groups = np.array([3, 1, 2, 3, 1, 5, 2, 5, 5])
    indices, client_groups = make_clients(groups, 2)
    assert client_groups == [(1, 2), (3, 5)]
    np.testing.assert_array_equal(indices[0], [1, 2, 4, 6])
    np.testing.assert_array_equal(indices[1], [0, 3, 5, 7, 8])
    with pytest.raises(ValueError, match="1-D"):
        make_clients(groups.reshape(3, 3))


@pytest.mark.parametrize("partition", ["stratified", "contiguous", "dirichlet"])
@pytest.mark.parametrize("n_clients", [1, 3, 7])
def test_partition_covers_every_sample_once(partition, n_clients):
    y = np.arange(63) % 3
    parts = partition_indices(y, n_clients, partition, alpha=1.0, seed=0)
    assert len(parts) == n_clients
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(63))
    if partition == "contiguous":
        for part in parts:
            np.testing.assert_array_equal(part, np.arange(part[0], part[-1] + 1))
    if partition == "stratified":
        for part in parts:
            counts = np.bincount(y[part], minlength=3)
            assert counts.max() - counts.min() <= 1 and len(part) in (63 // n_clients, 63 // n_clients + 1)


@pytest.mark.parametrize("groups_per_client, expected", [(1, [(1,), (2,), (3,)]), (2, [(1, 2), (3,)]),
                                                          (5, [(1, 2, 3)])])
def test_split_by_groups_merges_sorted_groups(groups_per_client, expected):
    groups = np.array([3, 1, 2, 2, 1, 3])
    indices, source, client_groups = ClientPartition(groups_per_client=groups_per_client).split(
        np.zeros(6), groups, seed=0)
    assert source == "groups" and client_groups == expected
    for idx, chunk in zip(indices, expected):
        np.testing.assert_array_equal(idx, np.flatnonzero(np.isin(groups, chunk)))


def test_split_refuses_groups_of_another_length():
    with pytest.raises(ValueError, match="groups has 3 entries but X has 4 samples"):
        ClientPartition().split(np.zeros(4), np.array([1, 2, 3]), seed=0)


@pytest.mark.parametrize("partition", ["contiguous", "dirichlet"])
def test_split_refuses_more_clients_than_samples(partition):
    with pytest.raises(ValueError, match="n_clients=9 exceeds the 4 samples"):
        ClientPartition(n_clients=9, partition=partition).split(np.array([0, 1, 0, 1]), None, seed=0)


def test_split_without_groups_is_seeded_and_warns_only_when_groups_were_probably_meant():
    codes = np.arange(40) % 2
    with pytest.warns(UserWarning, match="received no groups"):
        first, source, client_groups = ClientPartition(n_clients=4).split(codes, None, seed=3)
    assert source == "partition:stratified" and client_groups == [None] * 4
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        again, _, _ = ClientPartition(n_clients=4, partition="stratified").split(codes, None, seed=3)
        with sklearn.config_context(enable_metadata_routing=True):
            ClientPartition(n_clients=4).split(codes, None, seed=3)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_stratified_split_clamps_the_clients_to_the_smallest_class():
    codes = np.array([0, 0, 0, 1, 1, 1])
    with pytest.warns(UserWarning, match="n_clients=5 reduced to 3"):
        indices, _, _ = ClientPartition(partition="stratified").split(codes, None, seed=0)
    assert len(indices) == 3 and all(len(np.unique(codes[idx])) == 2 for idx in indices)


def test_a_dirichlet_split_that_leaves_a_client_empty_is_refused():
    with pytest.raises(ValueError, match=r"clients \[.*\] received no samples \(partition='dirichlet'\)"):
        ClientPartition(n_clients=6, partition="dirichlet", alpha=1e-3).split(np.arange(8) % 2, None, seed=0)


@pytest.mark.parametrize("params, field", [({"groups_per_client": 0}, "groups_per_client"),
                                           ({"n_clients": True}, "n_clients"),
                                           ({"partition": "random"}, "partition"),
                                           ({"alpha": 0.0}, "alpha")])
def test_settings_are_checked_by_name(params, field):
    with pytest.raises(ValueError, match=field):
        ClientPartition(**params).check_params()


def test_partition_is_a_cloneable_setting():
    setting = ClientPartition(groups_per_client=2, alpha=0.3)
    assert clone(setting).get_params() == setting.get_params()
