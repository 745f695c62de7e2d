"""Tests for ``skfedspd.run``: the sites' declarations checked before any round, the pooled
input statistic, and the validation share a federation holds out."""

import pytest

from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.messages import SetupReply
from skfedspd.privacy import DPSGD
from skfedspd.run import check_setup_replies, held_out_fraction, pool_input_statistic


def _reply(cid=0, shape=(4, 4), labels=(0, 1), n_train=20, n_val=2, weight=None):
    return SetupReply(cid, list(shape), None if labels is None else list(labels), n_train, n_val, weight=weight)


def test_pool_input_statistic():
    assert pool_input_statistic([None, None], [1, 2]) is None
    assert pool_input_statistic([1.0, 4.0], [1, 2]) == pytest.approx(3.0)
    for bad in (float("nan"), float("inf"), None, "1.0", True):
        with pytest.raises(ValueError, match=f"client 1 declared an invalid input statistic {bad!r}"):
            pool_input_statistic([1.0, bad], [1, 2])


def test_setup_replies_agreeing_give_their_shape():
    assert check_setup_replies([_reply(0), _reply(1, labels=(1, 2), weight=3.5)]) == (4, 4)
    assert check_setup_replies([_reply(0, labels=None), _reply(1, labels=None)], with_labels=False) == (4, 4)


@pytest.mark.parametrize("bad, message", [
    ({"shape": ()}, "client 1 declared an invalid sample shape"),
    ({"shape": (4, 0)}, "client 1 declared an invalid sample shape"),
    ({"shape": (4, True)}, "client 1 declared an invalid sample shape"),
    ({"labels": ()}, "client 1 declared invalid labels"),
    ({"labels": (0, 0)}, "client 1 declared invalid labels"),
    ({"labels": (0, float("nan"))}, "client 1 declared invalid labels"),
    ({"n_train": 0}, "client 1 declared invalid sample counts"),
    ({"n_val": -1}, "client 1 declared invalid sample counts"),
    ({"n_train": True}, "client 1 declared invalid sample counts"),
    ({"weight": float("inf")}, "client 1 declared an invalid training weight"),
    ({"weight": -2.0}, "client 1 declared an invalid training weight"),
    ({"weight": 0.0}, r"sample_weight: the training samples of clients \[1\] all have weight 0"),
    ({"shape": (5, 5)}, "the sites' samples differ in shape"),
    ({"labels": ("a", "b")}, "the sites declare labels of different types"),
])
def test_a_bad_declaration_is_refused_naming_the_client(bad, message):
    with pytest.raises(ValueError, match=message):
        check_setup_replies([_reply(0), _reply(1, **bad)])


@pytest.mark.parametrize("early_stopping, n_samples, expected", [
    ("auto", 45, 0.0), ("auto", 1000, 0.1), (True, 45, 0.1), (False, 1000, 0.0)])
def test_held_out_fraction_follows_the_local_rule(early_stopping, n_samples, expected):
    est = SPDnetClassifier(early_stopping=early_stopping)
    assert held_out_fraction(FederatedSPDnetClassifier(est), est, n_samples, 2) == expected


def test_private_runs_hold_nothing_out():
    est = SPDnetClassifier(early_stopping=True)
    fed = FederatedSPDnetClassifier(est, privacy=DPSGD(epsilon=8.0))
    assert held_out_fraction(fed, est, 1000, 2) == 0.0
