"""``sample_weight`` and ``class_weight``: tests of the design.

Design under test
-----------------
* ``fit(X, y, sample_weight=None)`` on ``SPDnetClassifier``, ``EEGNetClassifier`` and
  ``FederatedSPDnetClassifier`` (and ``partial_fit`` of the local estimators). The loss of a
  minibatch is the weighted mean ``sum(w_i l_i) / sum(w_i)``; so integer weights are the same
  as repeating samples, and multiplying every weight by a constant changes nothing.
* Every statistic fitted on the training inputs is weighted the same way (SPDnet's
  ``scaling="auto"`` statistic, the federated pooled statistic), so repetition equivalence
  holds with the default scaling too.
* ``class_weight=None | "balanced" | dict`` on the local estimators: per-sample weights
  ``class_weight[y_i]`` (``"balanced"``: ``n / (n_classes * count(y_i))``, as
  ``sklearn.utils.class_weight.compute_sample_weight``), multiplied into ``sample_weight``.
* Federated: each client trains on its samples' weights, and a client's aggregation weight
  (``weighting="n_samples"``) is the SUM of its training samples' weights.
* Bad weights (wrong length, negative, NaN, all zero) raise ``ValueError`` naming
  ``sample_weight``.
* The Flower backend uses the same weights as the local backend, bit for bit (simulation,
  a deployed site's data file, SecAgg+ sums): ``tests/test_flower.py``,
  ``tests/test_secure_aggregation.py``.

Why the equivalence tests are exact: float64, ``validation_fraction=0`` (a split would draw
different samples from weighted and from repeated data) and ``batch_size`` at least the
number of (repeated) samples, so every optimizer step sees one batch holding every sample
in both fits, and the seeds are the same. Only the order of the summands within the batch
differs (the shuffle permutes n vs. sum(w) indices), so the results agree to rounding
(``rtol=1e-9``), not bit for bit.

EEGNet's BatchNorm normalizes with the (unweighted) statistics of the batch, which
repetition changes: its tests are constant-weight invariance, balanced-on-balanced
invariance and that non-uniform weights do change the fit.
"""

import numpy as np
import pytest
from sklearn.utils.class_weight import compute_sample_weight

from skfedspd import EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier

RTOL, ATOL = 1e-9, 1e-12


@pytest.fixture(autouse=True)
def _single_thread(torch_single_thread):
    yield


def spdnet(**kwargs):
    params = dict(hidden_dims=(3,), lr=1e-2, batch_size=4096, max_epochs=6, validation_fraction=0.0,
                  dtype="float64", random_state=0)
    return SPDnetClassifier(**{**params, **kwargs})


def eegnet(**kwargs):
    params = dict(fs=64.0, dropout=0.0, lr=1e-2, batch_size=4096, max_epochs=3, validation_fraction=0.0,
                  dtype="float64", random_state=0)
    return EEGNetClassifier(**{**params, **kwargs})


def federated(estimator=None, **kwargs):
    params = dict(n_rounds=3, local_epochs=2, validation_fraction=0.0, random_state=0)
    return FederatedSPDnetClassifier(spdnet() if estimator is None else estimator, **{**params, **kwargs})


def assert_same_model(a, b, X):
    pa, pb = a.module_.get_parameters(), b.module_.get_parameters()
    assert pa.keys() == pb.keys()
    for name in pa:
        np.testing.assert_allclose(pa[name], pb[name], rtol=RTOL, atol=ATOL, err_msg=name)
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), rtol=RTOL, atol=ATOL)


def assert_different_model(a, b):
    pa, pb = a.module_.get_parameters(), b.module_.get_parameters()
    assert any(not np.allclose(pa[k], pb[k], rtol=1e-6, atol=1e-9) for k in pa)


def integer_weights(n, seed=0, with_zero=True):
    w = np.random.default_rng(seed).integers(1, 4, size=n)
    if with_zero:
        w[1] = 0  # a zero weight is a removed sample (labels alternate: its class stays present)
    return w


# ---------------------------------------------------------------------------- SPDnet
@pytest.mark.parametrize("scaling", ["auto", 1.0])
def test_spdnet_integer_weights_equal_repetition(spd_dataset, scaling):
    X, y = spd_dataset(n_matrices=20, n_channels=4, n_classes=2, seed=1)
    w = integer_weights(len(y))
    weighted = spdnet(scaling=scaling).fit(X, y, sample_weight=w)
    repeated = spdnet(scaling=scaling).fit(np.repeat(X, w, axis=0), np.repeat(y, w))
    if scaling == "auto":
        assert weighted.scale_ == pytest.approx(repeated.scale_, rel=1e-12)
    assert_same_model(weighted, repeated, X)
    assert_different_model(weighted, spdnet(scaling=scaling).fit(X, y))  # the weights do act


def test_spdnet_constant_weights_change_nothing(spd_dataset):
    X, y = spd_dataset(n_matrices=20, n_channels=4, n_classes=3, seed=2)
    assert_same_model(spdnet().fit(X, y, sample_weight=np.full(len(y), 2.5)), spdnet().fit(X, y), X)


def test_spdnet_sample_weight_none_is_unweighted(spd_dataset):
    X, y = spd_dataset(n_matrices=20, n_channels=4, n_classes=2, seed=3)
    assert_same_model(spdnet().fit(X, y, sample_weight=None), spdnet().fit(X, y), X)


def test_spdnet_partial_fit_integer_weights_equal_repetition(spd_dataset):
    X, y = spd_dataset(n_matrices=20, n_channels=4, n_classes=2, seed=4)
    w = integer_weights(len(y), with_zero=False)
    weighted, repeated = spdnet(), spdnet()
    for _ in range(3):
        weighted.partial_fit(X, y, classes=[0, 1], sample_weight=w)
        repeated.partial_fit(np.repeat(X, w, axis=0), np.repeat(y, w), classes=[0, 1])
    assert_same_model(weighted, repeated, X)


def test_spdnet_class_weight_balanced_equals_its_sample_weight(spd_dataset):
    X, y = spd_dataset(n_matrices=30, n_channels=4, n_classes=3, seed=5)
    keep = np.flatnonzero((y != 2) | (np.arange(len(y)) % 9 == 2))  # class 2 under-represented (4 of 24)
    X, y = X[keep], y[keep]
    balanced = spdnet(class_weight="balanced").fit(X, y)
    explicit = spdnet().fit(X, y, sample_weight=compute_sample_weight("balanced", y))
    assert_same_model(balanced, explicit, X)
    assert_different_model(balanced, spdnet().fit(X, y))


def test_spdnet_class_weight_dict_equals_repetition(spd_dataset):
    X, y = spd_dataset(n_matrices=20, n_channels=4, n_classes=2, seed=6)
    y = np.where(y == 0, "left", "right")  # labels of any type
    counts = np.where(y == "right", 3, 1)
    weighted = spdnet(class_weight={"left": 1, "right": 3}).fit(X, y)
    repeated = spdnet().fit(np.repeat(X, counts, axis=0), np.repeat(y, counts))
    assert_same_model(weighted, repeated, X)


def test_spdnet_class_weight_multiplies_sample_weight(spd_dataset):
    X, y = spd_dataset(n_matrices=20, n_channels=4, n_classes=2, seed=7)
    w = integer_weights(len(y), with_zero=False)
    both = spdnet(class_weight={0: 2, 1: 1}).fit(X, y, sample_weight=w)
    product = spdnet().fit(X, y, sample_weight=w * np.where(y == 0, 2, 1))
    assert_same_model(both, product, X)


@pytest.mark.parametrize("make", [spdnet, eegnet], ids=["spdnet", "eegnet"])
def test_class_weight_is_a_parameter(make):
    assert make().get_params()["class_weight"] is None


def test_spdnet_bad_class_weight(spd_dataset):
    X, y = spd_dataset(n_matrices=12, n_channels=4, n_classes=2, seed=8)
    with pytest.raises(ValueError, match="class_weight"):
        spdnet(class_weight="unbalanced").fit(X, y)


@pytest.mark.parametrize(
    "weights, message",
    [
        (np.ones(11), "sample_weight"),          # wrong length
        (-np.ones(12), "sample_weight"),         # negative
        (np.r_[np.nan, np.ones(11)], "sample_weight"),
        (np.zeros(12), "sample_weight"),         # nothing to learn from
        (np.ones((12, 2)), "sample_weight"),     # not 1-D
    ],
    ids=["length", "negative", "nan", "all-zero", "2-d"],
)
@pytest.mark.parametrize("make", [spdnet, federated], ids=["spdnet", "federated"])
def test_bad_sample_weight_is_named(spd_dataset, make, weights, message):
    X, y = spd_dataset(n_matrices=12, n_channels=4, n_classes=2, seed=9)
    with pytest.raises(ValueError, match=message):
        make().fit(X, y, sample_weight=weights)


# ---------------------------------------------------------------------------- EEGNet
def test_eegnet_constant_weights_change_nothing(eeg_timeseries):
    X, y = eeg_timeseries(n_trials=24, n_channels=4, n_times=128, n_classes=2, seed=0)
    assert_same_model(eegnet().fit(X, y, sample_weight=np.full(len(y), 3.0)), eegnet().fit(X, y), X)


def test_eegnet_balanced_on_balanced_data_changes_nothing(eeg_timeseries):
    X, y = eeg_timeseries(n_trials=24, n_channels=4, n_times=128, n_classes=2, seed=1)
    assert_same_model(eegnet(class_weight="balanced").fit(X, y), eegnet().fit(X, y), X)


def test_eegnet_weights_act_on_the_loss(eeg_timeseries):
    X, y = eeg_timeseries(n_trials=24, n_channels=4, n_times=128, n_classes=2, seed=2)
    w = integer_weights(len(y), with_zero=False).astype(float)
    assert_different_model(eegnet().fit(X, y, sample_weight=w), eegnet().fit(X, y))
    balanced = eegnet(class_weight="balanced").fit(X[:-5], y[:-5])
    explicit = eegnet().fit(X[:-5], y[:-5], sample_weight=compute_sample_weight("balanced", y[:-5]))
    assert_same_model(balanced, explicit, X)


# ---------------------------------------------------------------------------- federated
def three_subjects(spd_dataset, seed):
    X, y = spd_dataset(n_matrices=24, n_channels=4, n_classes=2, seed=seed)
    return X, y, np.repeat([1, 2, 3], 8)


def test_federated_integer_weights_equal_repetition(spd_dataset):
    """Weights in the clients' losses, in the pooled input statistic and in the client weights."""
    X, y, groups = three_subjects(spd_dataset, seed=10)
    w = integer_weights(len(y))
    weighted = federated().fit(X, y, groups=groups, sample_weight=w)
    repeated = federated().fit(np.repeat(X, w, axis=0), np.repeat(y, w), groups=np.repeat(groups, w))
    assert weighted.global_estimator_.scale_ == pytest.approx(repeated.global_estimator_.scale_, rel=1e-12)
    assert_same_model(weighted.global_estimator_, repeated.global_estimator_, X)
    assert [r["n_samples"] for r in weighted.history_] == [r["n_samples"] for r in repeated.history_]


def test_federated_client_weight_is_the_sum_of_its_sample_weights(spd_dataset):
    """Constant weights within each client leave every local loss unchanged: only the
    aggregation weights (sum of sample weights per client) can make the difference."""
    X, y, groups = three_subjects(spd_dataset, seed=11)
    w = np.where(groups == 2, 3, 1)
    weighted = federated(estimator=spdnet(scaling=1.0)).fit(X, y, groups=groups, sample_weight=w)
    repeated = federated(estimator=spdnet(scaling=1.0)).fit(np.repeat(X, w, axis=0), np.repeat(y, w),
                                                           groups=np.repeat(groups, w))
    assert_same_model(weighted.global_estimator_, repeated.global_estimator_, X)
    plain = federated(estimator=spdnet(scaling=1.0)).fit(X, y, groups=groups)
    assert_different_model(weighted.global_estimator_, plain.global_estimator_)
    assert weighted.history_[0]["n_samples"] == [8, 24, 8]


def test_federated_uniform_weighting_ignores_client_totals(spd_dataset):
    X, y, groups = three_subjects(spd_dataset, seed=12)
    w = np.where(groups == 2, 3, 1)
    est = spdnet(scaling=1.0)
    weighted = federated(estimator=est, weighting="uniform").fit(X, y, groups=groups, sample_weight=w)
    plain = federated(estimator=est, weighting="uniform").fit(X, y, groups=groups)
    assert_same_model(weighted.global_estimator_, plain.global_estimator_, X)


def test_federated_sample_weight_routed_with_groups(spd_dataset):
    """Under metadata routing, a Pipeline hands ``sample_weight`` and ``groups`` to ``fit``."""
    import sklearn
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    X, y, groups = three_subjects(spd_dataset, seed=13)
    w = integer_weights(len(y))
    with sklearn.config_context(enable_metadata_routing=True):
        step = federated().set_fit_request(sample_weight=True)
        pipe = make_pipeline(FunctionTransformer(), step).fit(X, y, groups=groups, sample_weight=w)
    direct = federated().fit(X, y, groups=groups, sample_weight=w)
    assert_same_model(pipe[-1].global_estimator_, direct.global_estimator_, X)
