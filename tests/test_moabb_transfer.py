"""MOABB's cross-subject transfer protocols (``CrossSubjectEvaluation(cs_mode=...)``): the
calibration slice of a new subject as its domain statistics (:mod:`skfedspd.transfer`)."""

import warnings

import numpy as np
import pytest
import sklearn
from pyriemann.estimation import Covariances
from pyriemann.tangentspace import TangentSpace
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from skfedspd import FederatedSPDnetClassifier, Recenter, SPDnetClassifier
from skfedspd.clients import ClientPartition
from skfedspd.datasets import make_spd_classification
from skfedspd.transfer import TARGET_DOMAIN, TARGET_INPUTS

SMALL = dict(hidden_dims=3, max_epochs=3, batch_size=32, random_state=0)


@pytest.fixture
def routing():
    with sklearn.config_context(enable_metadata_routing=True):
        yield


def shifted_subjects(n_subjects=4, n_per_subject=20, n_channels=4, seed=0):
    """SPD matrices of ``n_subjects`` subjects, each seen through its own congruence."""
    X, y = make_spd_classification(n_matrices=n_subjects * n_per_subject, n_channels=n_channels, n_classes=2,
                                   seed=seed)
    subjects = np.repeat(np.arange(1, n_subjects + 1), n_per_subject)
    rng = np.random.default_rng(seed)
    for s in range(1, n_subjects + 1):
        A = np.eye(n_channels) + 0.5 * rng.standard_normal((n_channels, n_channels))
        X[subjects == s] = A @ X[subjects == s] @ A.T
    return X, y, subjects


# ---------------------------------------------------------------------------------------------
# The calibration slice sets the new subject's domain statistics
# ---------------------------------------------------------------------------------------------

def test_recenter_slice_is_the_target_domain():
    """``fit(X_target_unlabeled=C)`` equals ``fit`` then ``adapt(C, domain="target")``; one
    test trial is then re-centred by the calibration trials, not by the prior."""
    X, _, subjects = shifted_subjects()
    train, new = subjects < 4, np.flatnonzero(subjects == 4)
    calibration, test = X[new[:10]], X[new[10:]]
    rc = Recenter().fit(X[train], groups=subjects[train], X_target_unlabeled=calibration)
    explicit = Recenter().fit(X[train], groups=subjects[train]).adapt(calibration, domain="t")
    assert rc.domains_ == {TARGET_DOMAIN: 10}
    for k in range(3):  # one trial per call, as MOABB's trialwise scoring
        np.testing.assert_allclose(rc.transform(test[k:k + 1]), explicit.transform(test[k:k + 1], domain="t"),
                                   atol=1e-10)
        explicit.reset_domain("t").adapt(calibration, domain="t")
    assert rc.domains_ == {TARGET_DOMAIN: 10}  # prediction without domain keeps nothing
    without = Recenter().fit(X[train], groups=subjects[train])
    assert not np.allclose(without.transform(test[:1]), rc.transform(test[:1]))
    # a block: the calibration and the block itself, each trial without itself
    block = rc.transform(test)
    np.testing.assert_allclose(block, explicit.transform(test, domain="t"), atol=1e-10)


def test_labeled_slice_is_used_as_unlabeled_calibration():
    X, _, subjects = shifted_subjects()
    train, new = subjects < 4, np.flatnonzero(subjects == 4)
    both = Recenter().fit(X[train], groups=subjects[train], X_target_unlabeled=X[new[:5]],
                          X_target_labeled=X[new[5:10]])
    stacked = Recenter().fit(X[train], groups=subjects[train], X_target_unlabeled=X[new[:10]])
    assert both.domains_ == {TARGET_DOMAIN: 10}
    np.testing.assert_allclose(both.transform(X[new[10:11]]), stacked.transform(X[new[10:11]]), atol=1e-12)


def test_spdnet_slice_is_the_target_domain():
    """Domain batch norm: prediction without ``domain`` after ``fit(X_target_unlabeled=C)``
    equals prediction after an explicit ``adapt(C)`` of the same trained network."""
    X, y, subjects = shifted_subjects()
    train, new = subjects < 4, np.flatnonzero(subjects == 4)
    calibration, test = X[new[:10]], X[new[10:]]
    clf = SPDnetClassifier(batchnorm="domain", **SMALL).fit(X[train], y[train], groups=subjects[train],
                                                            X_target_unlabeled=calibration)
    assert clf.domains_ == {TARGET_DOMAIN: 10}
    trialwise = np.concatenate([clf.decision_function(test[k:k + 1]) for k in range(len(test))])
    clf.reset_domain()
    assert not np.allclose(trialwise, np.concatenate([clf.decision_function(t[None]) for t in test]))
    clf.adapt(calibration, domain="t")
    explicit = [clf.decision_function(t[None], domain="t") for t in test]  # stored: adapts as it goes
    np.testing.assert_allclose(trialwise[:1], explicit[0], atol=1e-8)
    clf.reset_domain("t").adapt(calibration, domain=TARGET_DOMAIN)
    np.testing.assert_allclose(trialwise, np.concatenate([clf.decision_function(t[None]) for t in test]),
                               atol=1e-10)


def test_federated_slice_is_the_target_domain():
    X, y, subjects = shifted_subjects()
    train, new = subjects < 4, np.flatnonzero(subjects == 4)
    fed = FederatedSPDnetClassifier(SPDnetClassifier(batchnorm="domain", **SMALL), n_rounds=2, local_epochs=1,
                                    clients=ClientPartition(groups_per_client=1), random_state=0)
    fed.fit(X[train], y[train], groups=subjects[train], X_target_unlabeled=X[new[:10]])
    assert fed.domains_ == {TARGET_DOMAIN: 10}
    scores = fed.decision_function(X[new[10:11]])
    fed.reset_domain()
    fed.adapt(X[new[:10]], domain=TARGET_DOMAIN)
    np.testing.assert_allclose(fed.decision_function(X[new[10:11]]), scores, atol=1e-10)


@pytest.mark.usefixtures("routing")
def test_requests_follow_the_domain_statistics():
    for est in (Recenter(), SPDnetClassifier(), SPDnetClassifier(batchnorm="domain"),
                FederatedSPDnetClassifier(SPDnetClassifier(batchnorm="domain"))):
        requests = est.get_metadata_routing().fit.requests
        assert all(requests[name] is True for name in TARGET_INPUTS), type(est).__name__
        assert "y_target_labeled" not in requests
    for est in (SPDnetClassifier(batchnorm=None), SPDnetClassifier(batchnorm="spd"), FederatedSPDnetClassifier()):
        requests = est.get_metadata_routing().fit.requests
        assert all(requests[name] is False for name in TARGET_INPUTS), est
    explicit = SPDnetClassifier(batchnorm=None).set_fit_request(X_target_unlabeled=True)
    assert explicit.get_metadata_routing().fit.requests["X_target_unlabeled"] is True


def test_model_without_domain_statistics_warns_that_it_ignores_the_slice():
    X, y, _ = shifted_subjects()
    with pytest.warns(UserWarning, match="X_target_unlabeled / X_target_labeled ignored"):
        SPDnetClassifier(**SMALL).fit(X[:60], y[:60], X_target_unlabeled=X[60:70])  # "auto", no groups


# ---------------------------------------------------------------------------------------------
# Bad calibration slices: clear errors, nothing changed
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: Recenter(), lambda: SPDnetClassifier(batchnorm="domain", **SMALL)])
def test_raw_slice_is_refused_with_the_fix(make):
    X, y, subjects = shifted_subjects()
    raw = np.random.default_rng(0).standard_normal((5, 4, 64))
    est = make()
    with pytest.raises(ValueError, match=r"X_target_unlabeled has shape \(5, 4, 64\): raw trials.*transform_input"):
        est.fit(X, y, groups=subjects, X_target_unlabeled=raw)
    assert not hasattr(est, "n_features_in_")


@pytest.mark.parametrize("bad, message", [
    (np.stack([np.eye(4), np.diag([1.0, 1.0, 1.0, -1.0])]), "X_target_unlabeled: X matrix 1 is not positive definite"),
    (np.stack([np.eye(3)] * 2), "X_target_unlabeled: X has matrices of size 3x3"),
    (np.eye(4), "X_target_unlabeled: X must be a 3-D array"),
])
def test_bad_slice_is_refused_before_anything_changes(bad, message):
    X, y, subjects = shifted_subjects()
    rc = Recenter().fit(X, groups=subjects)
    prior = rc.domain_prior_.copy()
    with pytest.raises(ValueError, match=message):
        rc.fit(X[:40], groups=subjects[:40], X_target_unlabeled=bad)
    np.testing.assert_array_equal(rc.domain_prior_, prior)
    clf = SPDnetClassifier(batchnorm="domain", **SMALL)
    with pytest.raises(ValueError, match=message):
        clf.fit(X, y, groups=subjects, X_target_unlabeled=bad)
    assert not hasattr(clf, "module_")


def test_slice_beyond_the_training_range_leaves_the_model_as_it_was():
    X, y, subjects = shifted_subjects()
    rc = Recenter().fit(X, groups=subjects)
    prior = rc.domain_prior_.copy()
    with pytest.raises(ValueError, match="X_target_unlabeled / X_target_labeled: X matrix 0 is far outside"):
        rc.fit(X[:40], groups=subjects[:40], X_target_unlabeled=1e12 * X[60:65])
    np.testing.assert_array_equal(rc.domain_prior_, prior)
    assert rc.domains_ == {}


# ---------------------------------------------------------------------------------------------
# In a Pipeline: the raw slice transformed by the earlier steps (transform_input)
# ---------------------------------------------------------------------------------------------

@pytest.mark.usefixtures("routing")
def test_pipeline_transforms_the_raw_slice_with_its_covariances():
    rng = np.random.default_rng(0)
    epochs = rng.standard_normal((60, 4, 128))
    y = np.arange(60) % 2
    subjects = np.repeat([1, 2, 3], 20)
    calibration = rng.standard_normal((8, 4, 128)) * 3.0
    pipe = make_pipeline(Covariances("oas"), Recenter(), TangentSpace(), LogisticRegression(),
                         transform_input=TARGET_INPUTS)
    pipe.fit(epochs, y, subjects=subjects, X_target_unlabeled=calibration)
    direct = Recenter().fit(Covariances("oas").transform(epochs), groups=subjects).adapt(
        Covariances("oas").transform(calibration), domain="t")
    assert pipe[1].domains_ == {TARGET_DOMAIN: 8}
    np.testing.assert_allclose(pipe[:2].transform(epochs[:1]),
                               direct.transform(Covariances("oas").transform(epochs[:1]), domain="t"), atol=1e-10)
    plain = make_pipeline(Covariances("oas"), Recenter(), TangentSpace(), LogisticRegression())
    with pytest.raises(ValueError, match="raw trials"):
        plain.fit(epochs, y, subjects=subjects, X_target_unlabeled=calibration)


# ---------------------------------------------------------------------------------------------
# MOABB CrossSubjectEvaluation under every cs_mode preset (FakeDataset, offline)
# ---------------------------------------------------------------------------------------------

def moabb_pipelines():
    cov = dict(transform_input=TARGET_INPUTS)
    spdnet = SPDnetClassifier(**SMALL)  # "auto": domain batch norm from MOABB's routed subjects
    federated = FederatedSPDnetClassifier(SPDnetClassifier(batchnorm="domain", **SMALL), n_rounds=2, local_epochs=1,
                                          random_state=0)
    return {
        "TS+LR": make_pipeline(Covariances("oas"), TangentSpace(), LogisticRegression()),
        "Recenter+TS+LR": make_pipeline(Covariances("oas"), Recenter(), TangentSpace(), LogisticRegression(), **cov),
        "SPDnet": make_pipeline(Covariances("oas"), spdnet, **cov),
        "FedSPDnet + domain BN": make_pipeline(Covariances("oas"), federated, **cov),
    }


@pytest.fixture
def spy(monkeypatch):
    """Record, per fit of the package's estimators, the calibration trials they stored."""
    seen = []
    # a Pipeline fits Recenter by fit_transform
    for cls, method in ((Recenter, "fit_transform"), (SPDnetClassifier, "fit"), (FederatedSPDnetClassifier, "fit")):
        original = getattr(cls, method)

        def fit(self, *args, _original=original, **kwargs):
            out = _original(self, *args, **kwargs)
            if type(self) is not SPDnetClassifier or self.batchnorm_ == "domain":
                seen.append((type(self).__name__, dict(self.domains_), kwargs.get("X_target_unlabeled") is not None,
                             kwargs.get("X_target_labeled") is not None))
            return out

        monkeypatch.setattr(cls, method, fit)
    return seen


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::RuntimeWarning")
def test_every_cs_mode_runs_the_package_pipelines(fake_moabb, tmp_path, spy, request):
    import mne
    from moabb.evaluations import CrossSubjectEvaluation, CrossSubjectMode
    from moabb.paradigms import LeftRightImagery

    previous = mne.set_log_level("ERROR", return_old_level=True)
    request.addfinalizer(lambda: mne.set_log_level(previous))
    dataset = fake_moabb(event_list=("left_hand", "right_hand"), n_subjects=3, n_sessions=1, n_runs=1,
                         n_events=16, duration=40, channels=("C3", "Cz", "C4", "FC3"))
    paradigm = LeftRightImagery()  # ROC-AUC: one of the two scorers trialwise scoring takes
    assert {m.name for m in CrossSubjectMode} == {
        "TRAIN", "TRAIN_TRIALWISE", "TRAIN_AND_TARGET_UNLABELED_20P", "TRAIN_AND_TARGET_UNLABELED_50P",
        "TRAIN_AND_TARGET_UNLABELED_FULL", "TRAIN_AND_TARGET_LABELED_20P", "TRAIN_AND_TARGET_LABELED_50P"}
    for mode in CrossSubjectMode:
        spy.clear()
        evaluation = CrossSubjectEvaluation(paradigm=paradigm, datasets=[dataset], cs_mode=mode, overwrite=True,
                                            hdf5_path=str(tmp_path / "hdf5" / mode.value), random_state=0,
                                            n_jobs=1, error_score="raise")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            results = evaluation.process(moabb_pipelines())
        assert sorted(results["pipeline"].unique()) == sorted(moabb_pipelines()), mode
        assert len(results) == 4 * 3, mode
        assert results["score"].between(0, 1).all(), mode
        assert len(spy) == 3 * 3, mode  # Recenter, SPDnet, the federation; once per held-out subject
        for name, domains, unlabeled, labeled in spy:
            calibrated = mode.calibration_size > 0
            assert unlabeled == (calibrated and not mode.calibration_labeled), (mode, name)
            assert labeled == (calibrated and mode.calibration_labeled), (mode, name)
            if calibrated:  # the slice: a fraction of the held-out subject's trials (all of them in FULL)
                assert set(domains) == {TARGET_DOMAIN}
                expected = int(np.floor(mode.calibration_size * 16)) if mode.calibration_size < 1 else 16
                assert domains[TARGET_DOMAIN] == expected, (mode, name, domains)
            else:
                assert domains == {}, (mode, name)
