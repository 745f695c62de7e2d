"""Tests for ``skfedspd.renamed``: the deprecated flat parameter names, accepted with a
``FutureWarning`` and folded into the settings objects they now belong to."""

import warnings

import pytest
from sklearn.base import clone

from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.clients import ClientPartition
from skfedspd.privacy import DPSGD
from skfedspd.renamed import merge_into
from skfedspd.server_optimizer import ServerMomentum
from skfedspd.training import EpochSchedule, RoundSchedule


@pytest.mark.parametrize("old, group, expected", [
    (dict(patience=5, lr_patience=7), "schedule", RoundSchedule(patience=5, lr_patience=7)),
    (dict(lr_factor=0.25), "schedule", RoundSchedule(lr_factor=0.25)),
    (dict(server_momentum=0.9), "server_optimizer", ServerMomentum(lr=1.0, momentum=0.9)),
    (dict(server_lr=0.5), "server_optimizer", ServerMomentum(lr=0.5, momentum=0.0)),
    (dict(dp_epsilon=3.0, dp_clip_norm=0.5), "privacy", DPSGD(epsilon=3.0, clip_norm=0.5)),
    (dict(groups_per_client=2), "clients", ClientPartition(groups_per_client=2)),
    (dict(n_clients=3, partition="dirichlet", alpha=0.1), "clients",
     ClientPartition(n_clients=3, partition="dirichlet", alpha=0.1)),
])
@pytest.mark.parametrize("how", ["init", "set_params"])
def test_old_flat_names_fold_into_their_objects_with_a_future_warning(old, group, expected, how):
    with pytest.warns(FutureWarning, match=r"deprecated and will be removed in 0\.4: use " + group):
        fed = FederatedSPDnetClassifier(**old) if how == "init" else FederatedSPDnetClassifier().set_params(**old)
    assert fed.get_params()[group].get_params() == expected.get_params()
    assert not set(old) & set(fed.get_params())
    assert clone(fed).get_params()[group].get_params() == expected.get_params()


def test_old_names_update_a_set_object_and_dp_epsilon_none_turns_privacy_off():
    fed = FederatedSPDnetClassifier(schedule=RoundSchedule(patience=9), privacy=DPSGD(epsilon=1.0))
    with pytest.warns(FutureWarning):
        fed.set_params(lr_patience=3, dp_epsilon=None)
    assert fed.schedule.get_params() == {"patience": 9, "lr_patience": 3, "lr_factor": 0.5}
    assert fed.privacy is None
    with pytest.raises(ValueError, match="set privacy=DPSGD"):
        FederatedSPDnetClassifier().set_params(dp_delta=1e-6)




@pytest.mark.parametrize("how", ["init", "set_params"])
def test_the_epoch_schedule_names_fold_for_the_local_estimator(how):
    with pytest.warns(FutureWarning, match=r"\['lr_patience', 'patience'\] are deprecated .* use schedule="):
        est = SPDnetClassifier(patience=5, lr_patience=2) if how == "init" else \
            SPDnetClassifier().set_params(patience=5, lr_patience=2)
    assert est.schedule.get_params() == EpochSchedule(patience=5, lr_patience=2).get_params()
    assert "patience" not in est.get_params()


def test_merge_into_never_changes_the_object_it_starts_from():
    default = EpochSchedule()
    merged = merge_into(default)(None, {"patience": 3})
    assert merged.patience == 3 and default.get_params() == EpochSchedule().get_params()
    current = EpochSchedule(lr_factor=0.25)
    assert merge_into(default)(current, {"patience": 4}).get_params() == \
        EpochSchedule(patience=4, lr_factor=0.25).get_params()
    assert current.patience == EpochSchedule().patience


def test_an_unknown_name_is_still_a_type_error():
    with pytest.raises(TypeError, match="no_such_parameter"):
        FederatedSPDnetClassifier(no_such_parameter=1)


def test_current_names_raise_no_future_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        clone(FederatedSPDnetClassifier(schedule=RoundSchedule(patience=3), clients=ClientPartition(n_clients=2)))
