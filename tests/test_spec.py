"""Tests for ``skfedspd.spec``: estimators as JSON, with their settings objects, and the
guards of the JSON a file or a run configuration brings."""

import pytest

from skfedspd import EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.aggregation import TrimmedMean
from skfedspd.backends import FlowerBackend, LocalBackend
from skfedspd.clients import ClientPartition
from skfedspd.privacy import DPSGD
from skfedspd.server_optimizer import ServerMomentum
from skfedspd.spec import MAX_JSON_DEPTH, dumps, estimator_from_spec, estimator_to_spec, loads, parse_json
from skfedspd.training import EpochSchedule, RoundSchedule

SETTINGS = {"schedule": RoundSchedule(lr_patience=40), "server_optimizer": ServerMomentum(),
            "privacy": DPSGD(epsilon=8.0), "clients": ClientPartition(groups_per_client=2, alpha=0.2),
            "aggregation": TrimmedMean(trim=0.3)}


@pytest.mark.parametrize("backend", [LocalBackend(n_jobs=2), FlowerBackend(secure_aggregation=True), "local"])
def test_settings_objects_travel_as_json(backend):
    fed = FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=(8, 4), schedule=EpochSchedule(patience=9)),
                                    backend=backend, **SETTINGS)
    again = estimator_from_spec(loads(dumps(estimator_to_spec(fed))))
    for name, value in {**SETTINGS, "backend": backend}.items():
        mine = again.get_params()[name]
        assert type(mine) is type(value)
        assert mine == value if isinstance(value, str) else mine.get_params() == value.get_params()
    assert again.estimator.hidden_dims == (8, 4) and again.estimator.schedule.patience == 9


@pytest.mark.parametrize("estimator", [SPDnetClassifier(class_weight={0: 1.0, 1: 2.0}), EEGNetClassifier()])
def test_every_saved_estimator_round_trips(estimator):
    again = estimator_from_spec(loads(dumps(estimator_to_spec(estimator))))
    assert type(again) is type(estimator) and repr(again) == repr(estimator)


def test_a_foreign_estimator_is_refused_both_ways():
    from sklearn.linear_model import LogisticRegression

    with pytest.raises(TypeError, match="LogisticRegression cannot be written as JSON"):
        estimator_to_spec(LogisticRegression())
    with pytest.raises(ValueError, match="not an estimator spec"):
        estimator_from_spec({"class": "LogisticRegression", "params": {}})
    with pytest.raises(ValueError, match="not an estimator spec"):
        estimator_from_spec({"class": "SPDnetClassifier", "params": []})


@pytest.mark.parametrize("text, message", [
    ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), f"at most {MAX_JSON_DEPTH} are allowed"),
    ("{'single': 1}", "is not JSON"),
    (b"{}", "is a bytes, not JSON text"),
])
def test_parse_json_refuses_naming_what_it_read(text, message):
    with pytest.raises(ValueError, match=f"the header.*{message}|{message}"):
        parse_json(text, "the header")


def test_brackets_inside_strings_do_not_count_as_depth():
    deep_string = '"' + "[" * 1000 + '"'
    assert parse_json("[" + deep_string + "]") == ["[" * 1000]
