"""Tests for ``skfedspd.SPDnetClassifier`` (scikit-learn API, determinism, validation,
training schedule, partial_fit / warm_start, dtypes, input scaling, pyRiemann pipeline).

scikit-learn's estimator checks
-------------------------------
``SPDnetClassifier`` declares ``input_tags.three_d_array=True, two_d_array=False``.
``check_estimator`` / ``parametrize_with_checks`` therefore skip every data-driven check
(``SkipTestWarning: Can't test estimator ... which requires input of type ...``): the only
check they still yield is

* ``check_estimator_cloneable``

The data-independent checks below are called directly and pass (``SKLEARN_DIRECT_CHECKS``):

* ``check_estimator_cloneable``, ``check_estimator_repr``, ``check_estimator_tags_renamed``,
  ``check_valid_tag_types``, ``check_mixin_order``, ``check_no_attributes_set_in_init``,
  ``check_parameters_default_constructible``, ``check_get_params_invariance``,
  ``check_set_params``, ``check_do_not_raise_errors_in_init_or_set_params``,
* ``check_estimators_unfitted`` (``NotFittedError`` from ``predict``/``predict_proba``/
  ``decision_function`` before ``fit``),
* ``check_fit1d`` (1-D ``X`` raises ``ValueError``),

``check_classifiers_one_label_sample_weights`` fits 2-D data, which SPDnet rejects before it
reads ``sample_weight``: ``test_one_label_after_sample_weight_trimming`` does it on SPD matrices.

Every check that needs 2-D data is re-done here on 3-D SPD input: fit returns self,
clone, get/set_params, overwriting of parameters and of ``X``, pickle and joblib,
one-label ``y``, regression targets, unfitted errors, ``n_features_in_``, ``classes_`` and
label types, ``predict_proba``/``decision_function`` consistency, ``score``, NaN/inf,
empty/complex/object inputs, read-only and non-array (list) inputs, dtypes, fit
idempotence, subset and sample-order invariance of predictions, 2-D column ``y``,
``partial_fit`` with a wrong number of channels, and use inside ``cross_val_score``.
"""

import copy
import pickle
import warnings

import joblib
import numpy as np
import pytest
import sklearn
import torch
from pyriemann.estimation import Covariances
from sklearn.base import clone
from sklearn.exceptions import DataConversionWarning, NotFittedError, SkipTestWarning
from sklearn.metrics import accuracy_score
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.utils import estimator_checks as ec
from sklearn.utils.estimator_checks import parametrize_with_checks

from skfedspd import SPDnetClassifier
from skfedspd.validation import uses_validation
from skfedspd.classifier import auto_hidden_dim
from skfedspd.batchnorm import DomainBatch
from skfedspd.nn import SPDNet

pytestmark = pytest.mark.usefixtures("torch_single_thread")

# Tiny, fast configuration: 8 channels → 4, a few epochs of 1-2 minibatches.
FAST = dict(hidden_dims=(4,), max_epochs=5, batch_size=32, lr=1e-2, random_state=0)


def make_clf(**kwargs):
    params = dict(FAST)
    params.update(kwargs)
    return SPDnetClassifier(**params)


@pytest.fixture(scope="module")
def data(spd_dataset):
    """60 SPD 8x8 matrices, 3 classes (fit on the first 45, test on the last 15)."""
    return spd_dataset(n_matrices=60, n_channels=8, n_classes=3, seed=0)


@pytest.fixture(scope="module")
def fitted(data):
    X, y = data
    return make_clf().fit(X[:45], y[:45])


@pytest.fixture(scope="module")
def noise_data(spd_dataset):
    """SPD matrices with random labels: the validation score only fluctuates. 224 matrices:
    a quarter (56) is a validation part large enough for ``fit`` to hold it out."""
    X, _ = spd_dataset(n_matrices=224, n_channels=8, n_classes=2, seed=1)
    y = np.random.default_rng(2).permutation(np.arange(224) % 2)
    return X, y


def _params(clf):
    return clf.module_.get_parameters()


def _same_params(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------
# scikit-learn estimator checks
# ---------------------------------------------------------------------------------------------


with warnings.catch_warnings():  # "Can't test estimator ... three_d_array=True": expected
    warnings.simplefilter("ignore", SkipTestWarning)
    _SKLEARN_CHECKS = parametrize_with_checks([make_clf()])


@_SKLEARN_CHECKS
def test_sklearn_check_estimator(estimator, check):
    check(estimator)


SKLEARN_DIRECT_CHECKS = [
    ec.check_estimator_cloneable,
    ec.check_estimator_repr,
    ec.check_estimator_tags_renamed,
    ec.check_valid_tag_types,
    ec.check_mixin_order,
    ec.check_no_attributes_set_in_init,
    ec.check_parameters_default_constructible,
    ec.check_get_params_invariance,
    ec.check_set_params,
    ec.check_do_not_raise_errors_in_init_or_set_params,
    ec.check_estimators_unfitted,
    ec.check_fit1d,
]


@pytest.mark.parametrize("check", SKLEARN_DIRECT_CHECKS, ids=lambda c: c.__name__)
def test_sklearn_data_independent_checks(check):
    check(SPDnetClassifier.__name__, make_clf())


def test_one_label_after_sample_weight_trimming(spd_dataset):
    """scikit-learn's check_classifiers_one_label_sample_weights on 3-D input: weights that
    leave one class raise a ValueError naming the class problem."""
    X, y = spd_dataset(n_matrices=10, n_channels=4, n_classes=2, seed=0)
    with pytest.raises(ValueError, match=r"\bclass(es)?\b"):
        make_clf().fit(X, y, sample_weight=(y == 1).astype(float))


def test_estimator_tags():
    tags = make_clf().__sklearn_tags__()
    assert tags.input_tags.three_d_array and not tags.input_tags.two_d_array
    assert tags.estimator_type == "classifier"
    assert tags.requires_fit and not tags.non_deterministic


# ---------------------------------------------------------------------------------------------
# Basic API
# ---------------------------------------------------------------------------------------------


def test_fit_returns_self(data):
    X, y = data
    clf = make_clf(max_epochs=1)
    assert clf.fit(X, y) is clf


def test_partial_fit_returns_self(data):
    X, y = data
    clf = make_clf()
    assert clf.partial_fit(X, y, classes=[0, 1, 2]) is clf
    assert clf.partial_fit(X, y) is clf


def test_clone(fitted):
    cloned = clone(fitted)
    assert cloned.get_params() == fitted.get_params()
    assert not hasattr(cloned, "module_") and not hasattr(cloned, "classes_")
    with pytest.raises(NotFittedError):
        cloned.predict(np.eye(8)[None])


def test_get_params_set_params():
    clf = make_clf()
    params = clf.get_params()
    assert set(params) == {
        "hidden_dims", "eps", "scaling", "lr", "batch_size", "max_epochs", "validation_fraction",
        "early_stopping", "validation_metric", "checkpoint", "schedule", "recenter_every", "dtype", "device",
        "random_state", "verbose", "warm_start", "class_weight", "batchnorm", "domain_adaptation", "trainable",
    }
    assert params["hidden_dims"] == (4,) and params["max_epochs"] == 5
    assert clf.set_params(lr=0.5, hidden_dims=(6, 2)) is clf
    assert clf.lr == 0.5 and clf.get_params()["hidden_dims"] == (6, 2)
    with pytest.raises(ValueError, match="Invalid parameter"):
        clf.set_params(not_a_parameter=1)


def test_defaults():
    clf = SPDnetClassifier()
    assert clf.hidden_dims == "auto" and clf.eps == 1e-2 and clf.scaling == "auto" and clf.lr == 1e-2
    assert clf.dtype == "float64" and clf.device == "cpu" and clf.warm_start is False
    assert clf.class_weight is None and clf.checkpoint == "auto"
    assert clf.early_stopping == "auto" and clf.validation_metric == "loss"


@pytest.mark.parametrize("n_channels, expected", [(2, 2), (3, 3), (8, 8), (16, 8), (22, 8), (32, 9), (60, 17),
                                                  (64, 18), (128, 36)])
def test_auto_hidden_dim(n_channels, expected):
    assert auto_hidden_dim(n_channels) == expected


@pytest.mark.parametrize("n_channels", [3, 10])
def test_hidden_dims_auto_builds_the_rule(spd_dataset, n_channels):
    X, y = spd_dataset(n_matrices=12, n_channels=n_channels, n_classes=2, seed=0)
    clf = SPDnetClassifier(max_epochs=2, random_state=0).fit(X, y)
    assert clf.module_.get_parameters()["bimaps.0.weight"].shape == (n_channels, auto_hidden_dim(n_channels))


@pytest.mark.parametrize("n_matrices, fraction, used", [(40, 0.1, False), (490, 0.1, False), (500, 0.1, True),
                                                        (100, 0.5, True), (500, 0.0, False)])
def test_validation_only_when_large_enough(n_matrices, fraction, used):
    assert uses_validation(n_matrices, 2, fraction) is used
    assert uses_validation(200, 30, 0.25) is False  # 50 < 2 * 30 classes


def test_small_training_set_trains_the_budget_and_keeps_the_last_weights(spd_dataset):
    X, y = spd_dataset(n_matrices=40, n_channels=4, n_classes=2, seed=0)
    clf = SPDnetClassifier(hidden_dims=(3,), max_epochs=7, patience=1, lr_patience=0, random_state=0).fit(X, y)
    assert clf.validation_used_ is False
    assert clf.n_iter_ == 7 and clf.best_epoch_ == 6
    assert all(record["lr"] == clf.lr for record in clf.history_)  # constant learning rate


def test_large_training_set_uses_the_validation_loss(spd_dataset):
    X, y = spd_dataset(n_matrices=100, n_channels=4, n_classes=2, seed=0)
    clf = SPDnetClassifier(hidden_dims=(3,), max_epochs=12, validation_fraction=0.5, random_state=0).fit(X, y)
    assert clf.validation_used_ is True
    losses = [record["val_loss"] for record in clf.history_]
    assert clf.best_epoch_ == int(np.argmin(losses))


@pytest.mark.parametrize("early_stopping, used", [("auto", False), (True, True), (False, False)])
def test_early_stopping_overrides_the_size_rule(spd_dataset, early_stopping, used):
    X, y = spd_dataset(n_matrices=40, n_channels=4, n_classes=2, seed=0)
    clf = SPDnetClassifier(hidden_dims=(3,), max_epochs=3, early_stopping=early_stopping, random_state=0).fit(X, y)
    assert clf.validation_used_ is used
    assert bool(np.isfinite(clf.history_[0]["val_f1"])) is used


def test_validation_metric_f1_selects_the_best_f1_epoch(spd_dataset):
    """The paper's protocol: restore-best on the validation macro-F1 (ties: the lower loss)."""
    X, y = spd_dataset(n_matrices=100, n_channels=4, n_classes=2, seed=0)
    clf = SPDnetClassifier(hidden_dims=(3,), max_epochs=12, validation_fraction=0.5, early_stopping=True,
                           validation_metric="f1", random_state=0).fit(X, y)
    scores = [(r["val_f1"], -r["val_loss"]) for r in clf.history_]
    assert clf.best_epoch_ == max(range(len(scores)), key=lambda i: (scores[i], -i))


@pytest.mark.parametrize("params", [dict(early_stopping="yes"), dict(validation_metric="accuracy"),
                                    dict(checkpoint="mean")])
def test_early_stopping_parameters_are_validated(spd_dataset, params):
    X, y = spd_dataset(n_matrices=20, n_channels=4, n_classes=2, seed=0)
    with pytest.raises(ValueError, match=next(iter(params))):
        SPDnetClassifier(**params).fit(X, y)


@pytest.mark.parametrize("batchnorm, n_groups, checkpoint, averaged", [
    ("domain", 2, "auto", True), ("domain", 1, "auto", False), (None, 2, "auto", False), ("spd", 2, "auto", False),
    ("domain", 2, "best", False), (None, 1, "average", True)])
def test_checkpoint_auto_averages_a_domain_model_of_several_domains(spd_dataset, batchnorm, n_groups, checkpoint,
                                                                    averaged):
    """"auto" averages for a model meant for new domains (domain batch norm, several
    training domains), and keeps the best epoch otherwise."""
    X, y = spd_dataset(n_matrices=100, n_channels=4, n_classes=2, seed=0)
    groups = np.arange(100) % n_groups
    clf = SPDnetClassifier(hidden_dims=(3,), max_epochs=8, validation_fraction=0.5, batchnorm=batchnorm,
                           checkpoint=checkpoint, random_state=0).fit(X, y, groups=groups)
    lowest = min(clf.history_, key=lambda record: record["val_loss"])
    within = [r["epoch"] for r in clf.history_ if r["val_loss"] <= lowest["val_loss"] + lowest["val_loss_se"]]
    assert clf.averaged_epochs_ == (within if averaged else [clf.best_epoch_])
    assert clf.best_epoch_ in clf.averaged_epochs_


def test_checkpoint_average_is_the_projected_mean_of_the_epochs_kept(spd_dataset):
    """Oracle: each kept epoch's weights from the same run stopped there, averaged, the
    BiMap weights projected back by scipy's polar factor."""
    from scipy.linalg import polar
    X, y = spd_dataset(n_matrices=100, n_channels=4, n_classes=2, seed=1)
    kwargs = dict(hidden_dims=(3,), validation_fraction=0.5, lr=5e-2, patience=None, random_state=0)
    clf = SPDnetClassifier(max_epochs=12, checkpoint="average", **kwargs).fit(X, y)
    assert len(clf.averaged_epochs_) > 1  # a real average, not the best epoch alone
    stopped = [SPDnetClassifier(max_epochs=e + 1, checkpoint="best", **kwargs).fit(X, y).module_.get_parameters()
               for e in clf.averaged_epochs_]
    averaged = clf.module_.get_parameters()
    for name in averaged:
        mean = np.mean([params[name] for params in stopped], axis=0)
        expected = polar(mean)[0] if name.startswith("bimaps.") else mean
        np.testing.assert_allclose(averaged[name], expected, rtol=1e-10, atol=1e-12, err_msg=name)


def test_checkpoint_average_passes_over_epochs_without_a_finite_validation_loss(spd_dataset):
    X, y = spd_dataset(n_matrices=40, n_channels=4, n_classes=2, seed=0)
    clf = SPDnetClassifier(hidden_dims=(3,), max_epochs=4, random_state=0).fit(X, y)
    for record, loss in zip(clf.history_, [np.nan, 0.5, 0.52, 0.9]):
        record.update(val_loss=loss, val_loss_se=0.03)
    params = clf.module_.get_parameters()
    checkpoints = [dict(params, **{"head.bias": np.full_like(params["head.bias"], k)}) for k in range(4)]
    assert clf._average_checkpoints(checkpoints, 0) == [1, 2]
    np.testing.assert_allclose(clf.module_.get_parameters()["head.bias"], 1.5)
    for record in clf.history_:
        record.update(val_loss=np.nan)
    assert clf._average_checkpoints(checkpoints, 0) == [clf.best_epoch_]


def test_partial_fit_keeps_the_last_epoch(spd_dataset):
    X, y = spd_dataset(n_matrices=40, n_channels=4, n_classes=2, seed=0)
    clf = SPDnetClassifier(hidden_dims=(3,), batchnorm="domain", random_state=0)
    clf.partial_fit(X, y, classes=[0, 1]).partial_fit(X, y)
    assert clf.averaged_epochs_ == [clf.best_epoch_] == [1]


def test_fit_does_not_change_params_or_input(data):
    X, y = data
    X_copy, y_copy = X.copy(), y.copy()
    clf = make_clf(max_epochs=2)
    params = clone(clf).get_params()
    clf.fit(X, y)
    assert clf.get_params() == params
    np.testing.assert_array_equal(X, X_copy)
    np.testing.assert_array_equal(y, y_copy)
    clf.predict(X)
    np.testing.assert_array_equal(X, X_copy)


def test_fit_sets_only_private_or_trailing_underscore_attributes(data):
    X, y = data
    clf = make_clf(max_epochs=2)
    before = set(vars(clf))
    clf.fit(X, y)
    added = set(vars(clf)) - before
    assert {"classes_", "n_features_in_", "module_", "history_", "best_epoch_", "n_iter_", "scale_"} <= added
    assert all(a.endswith("_") or a.startswith("_") for a in added)


@pytest.mark.parametrize("method", ["pickle", "joblib"])
def test_persistence_round_trip(fitted, data, tmp_path, method):
    X, _ = data
    if method == "pickle":
        restored = pickle.loads(pickle.dumps(fitted))
    else:
        joblib.dump(fitted, tmp_path / "clf.joblib")
        restored = joblib.load(tmp_path / "clf.joblib")
    np.testing.assert_array_equal(restored.decision_function(X), fitted.decision_function(X))
    np.testing.assert_array_equal(restored.predict(X), fitted.predict(X))
    np.testing.assert_array_equal(restored.classes_, fitted.classes_)
    np.testing.assert_equal(restored.history_, fitted.history_)  # NaN validation entries
    assert restored.get_params() == fitted.get_params()


def test_unpickled_model_keeps_training(data):
    X, y = data
    clf = make_clf().partial_fit(X, y, classes=[0, 1, 2])
    restored = pickle.loads(pickle.dumps(clf))
    clf.partial_fit(X, y)
    restored.partial_fit(X, y)
    np.testing.assert_array_equal(restored.decision_function(X), clf.decision_function(X))


@pytest.mark.parametrize("method", ["predict", "predict_proba", "decision_function", "score"])
def test_unfitted_raises_not_fitted(data, method):
    X, y = data
    clf = make_clf()
    args = (X, y) if method == "score" else (X,)
    with pytest.raises(NotFittedError):
        getattr(clf, method)(*args)


def test_n_features_in(fitted):
    assert fitted.n_features_in_ == 8


@pytest.mark.parametrize("labels", [
    [0, 1, 2],
    [3, 7, 11],
    [-1, 5, 2],
    ["feet", "left_hand", "right_hand"],
    ["b", "a", "c"],
    [1.0, 2.0, 3.0],
])
def test_classes_and_label_types(data, labels):
    X, codes = data
    labels = np.asarray(labels)
    y = labels[codes]
    clf = make_clf(max_epochs=3).fit(X[:45], y[:45])
    np.testing.assert_array_equal(clf.classes_, np.unique(labels))
    pred = clf.predict(X[45:])
    assert pred.dtype.kind == labels.dtype.kind
    assert set(pred) <= set(labels)
    # identical model to the one fitted on integer codes, up to relabelling
    ref = make_clf(max_epochs=3).fit(X[:45], np.searchsorted(np.unique(labels), y[:45]))
    np.testing.assert_array_equal(clf.decision_function(X), ref.decision_function(X))


def test_label_list_and_2d_column_y(data):
    X, y = data
    clf = make_clf(max_epochs=2).fit(X, list(y))
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    with pytest.warns(DataConversionWarning):
        clf2 = make_clf(max_epochs=2).fit(X, y[:, None])
    np.testing.assert_array_equal(clf2.decision_function(X), clf.decision_function(X))


@pytest.mark.parametrize("n_classes", [2, 3, 4])
def test_predict_proba_decision_function_score(spd_dataset, n_classes):
    X, y = spd_dataset(n_matrices=40, n_channels=8, n_classes=n_classes, seed=3)
    clf = make_clf(max_epochs=3).fit(X, y)
    scores = clf.decision_function(X)
    proba = clf.predict_proba(X)
    pred = clf.predict(X)
    assert proba.shape == (40, n_classes)
    assert pred.shape == (40,)
    assert scores.dtype == proba.dtype == np.float64
    assert (proba >= 0).all() and (proba <= 1).all()
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(clf.classes_[proba.argmax(axis=1)], pred)
    if n_classes == 2:
        # scikit-learn's binary convention: one score, positive for classes_[1]
        assert scores.shape == (40,)
        np.testing.assert_allclose(scores, np.log(proba[:, 1]) - np.log(proba[:, 0]), atol=1e-10)
        np.testing.assert_array_equal(scores > 0, proba[:, 1] > proba[:, 0])
    else:
        assert scores.shape == (40, n_classes)
        np.testing.assert_array_equal(scores.argmax(axis=1), proba.argmax(axis=1))
        # softmax of the logits: log-probability differences equal logit differences
        np.testing.assert_allclose(np.log(proba) - np.log(proba[:, :1]), scores - scores[:, :1], atol=1e-10)
    assert clf.score(X, y) == pytest.approx(accuracy_score(y, pred))


def test_predictions_independent_of_batch_subset_and_order(fitted, data):
    X, _ = data
    full = fitted.decision_function(X)
    np.testing.assert_allclose(fitted.decision_function(X[10:20]), full[10:20], rtol=1e-12, atol=1e-12)
    perm = np.random.default_rng(0).permutation(len(X))
    np.testing.assert_allclose(fitted.decision_function(X[perm]), full[perm], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fitted.decision_function(X[3:4]), full[3:4], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("convert", [
    lambda X: X.tolist(),
    lambda X: X.astype(np.float32),
    lambda X: np.asfortranarray(X),
    lambda X: np.repeat(X, 2, axis=2)[:, :, ::2],  # non-contiguous view
], ids=["list", "float32", "fortran", "strided"])
def test_accepts_array_likes_and_dtypes(data, convert):
    X, y = data
    ref = make_clf(max_epochs=2).fit(X, y)
    clf = make_clf(max_epochs=2).fit(convert(X), y)
    np.testing.assert_allclose(clf.decision_function(convert(X)), ref.decision_function(X), rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable:UserWarning")
def test_accepts_read_only_input(data):
    X, y = data
    X_ro, y_ro = X.copy(), y.copy()
    X_ro.setflags(write=False)
    y_ro.setflags(write=False)
    clf = make_clf(max_epochs=2).fit(X_ro, y_ro)
    np.testing.assert_array_equal(clf.decision_function(X_ro), make_clf(max_epochs=2).fit(X, y).decision_function(X))


def test_accepts_integer_matrices():
    X = np.stack([np.eye(4, dtype=int) * (1 + i % 3) + np.ones((4, 4), dtype=int) for i in range(12)])
    clf = make_clf(hidden_dims=(2,), max_epochs=2).fit(X, np.arange(12) % 2)
    assert clf.predict(X).shape == (12,)


def test_fit_is_idempotent(data):
    X, y = data
    clf = make_clf(max_epochs=3)
    first = clf.fit(X, y).decision_function(X)
    np.testing.assert_array_equal(clf.fit(X, y).decision_function(X), first)
    assert len(clf.history_) == 3


def test_cross_val_score(data):
    X, y = data
    scores = cross_val_score(make_clf(max_epochs=2), X, y, cv=2)
    assert scores.shape == (2,) and np.isfinite(scores).all()


# ---------------------------------------------------------------------------------------------
# Determinism and RNG hygiene
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("random_state", [0, 7, 2**31 - 1, "rs"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_same_random_state_bit_identical(data, random_state, dtype):
    X, y = data

    def fit():
        rs = np.random.RandomState(42) if random_state == "rs" else random_state
        return make_clf(random_state=rs, dtype=dtype, validation_fraction=0.2).fit(X[:45], y[:45])

    a, b = fit(), fit()
    assert np.array_equal(a.decision_function(X), b.decision_function(X))
    assert _same_params(_params(a), _params(b))
    np.testing.assert_equal(a.history_, b.history_)
    assert a.best_epoch_ == b.best_epoch_


@pytest.mark.parametrize("seeds", [(0, 1), (3, 4)])
def test_different_seeds_differ(data, seeds):
    X, y = data
    a, b = (make_clf(random_state=s).fit(X[:45], y[:45]) for s in seeds)
    assert not np.allclose(a.decision_function(X), b.decision_function(X))
    assert not np.allclose(_params(a)["bimaps.0.weight"], _params(b)["bimaps.0.weight"])


@pytest.mark.parametrize("random_state", [0, None])
def test_global_torch_rng_untouched(data, random_state):
    X, y = data
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    clf = make_clf(random_state=random_state, validation_fraction=0.2).fit(X, y)
    clf.predict(X)
    clf.predict_proba(X)
    clf.partial_fit(X, y)
    clf.score(X, y)
    assert torch.equal(torch.get_rng_state(), state)
    clf2 = make_clf(random_state=random_state).partial_fit(X, y, classes=[0, 1, 2])
    clf2.decision_function(X)
    assert torch.equal(torch.get_rng_state(), state)


def test_global_numpy_rng_untouched_with_int_seed(data):
    X, y = data
    np.random.seed(99)
    state = np.random.get_state()
    make_clf(random_state=3, validation_fraction=0.2).fit(X, y).predict(X)
    after = np.random.get_state()
    assert all(np.array_equal(s, t) for s, t in zip(state, after))


def test_global_torch_rng_does_not_influence_fit(data):
    X, y = data
    torch.manual_seed(1)
    a = make_clf().fit(X, y).decision_function(X)
    torch.manual_seed(2)
    b = make_clf().fit(X, y).decision_function(X)
    assert np.array_equal(a, b)


# ---------------------------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------------------------


def _improves(record, best):
    """The documented improvement rule of ``fit``: a lower validation loss."""
    return record["val_loss"] < best["val_loss"]


def _corrupt(X, kind):
    X = X.copy()
    if kind == "nan":
        X[5, 2, 3] = X[5, 3, 2] = np.nan
    elif kind == "inf":
        X[3, 0, 0] = np.inf
    elif kind == "-inf":
        X[7, 1, 1] = -np.inf
    elif kind == "asymmetric":
        X[4, 0, 1] += 0.5
    elif kind == "indefinite":
        lam, U = np.linalg.eigh(X[6])
        lam[0] = -1.0
        X[6] = (U * lam) @ U.T
        X[6] = 0.5 * (X[6] + X[6].T)
    elif kind == "singular":
        X[2] = np.outer(np.arange(1.0, 9.0), np.arange(1.0, 9.0))
    elif kind == "zero":
        X[9] = 0.0
    return X


BAD_X = [
    ("not_3d_2d", lambda X: X[0], r"3-D array.*got shape \(8, 8\)"),
    ("not_3d_4d", lambda X: X[..., None], r"3-D array.*got shape \(60, 8, 8, 1\)"),
    ("not_3d_1d", lambda X: X[0, 0], r"3-D array"),
    ("not_square", lambda X: X[:, :, :7], r"square matrices, got matrices of shape \(8, 7\)"),
    ("empty", lambda X: X[:0], "0 matrices"),
    ("nan", lambda X: _corrupt(X, "nan"), r"NaN or infinity \(first at matrix 5\)"),
    ("inf", lambda X: _corrupt(X, "inf"), r"NaN or infinity \(first at matrix 3\)"),
    ("-inf", lambda X: _corrupt(X, "-inf"), r"NaN or infinity \(first at matrix 7\)"),
    ("asymmetric", lambda X: _corrupt(X, "asymmetric"), "matrix 4 is not symmetric"),
    ("indefinite", lambda X: _corrupt(X, "indefinite"), "matrix 6 is not positive definite"),
    ("singular", lambda X: _corrupt(X, "singular"), "matrix 2 is not positive definite"),
    ("zero", lambda X: _corrupt(X, "zero"), "matrix 9 is not positive definite"),
    ("complex", lambda X: X.astype(complex), "real numeric"),
    ("object", lambda X: X.astype(object), "real numeric"),
    ("strings", lambda X: X.astype(str), "real numeric"),
]


@pytest.mark.parametrize("name, corrupt, match", BAD_X, ids=[b[0] for b in BAD_X])
def test_fit_rejects_bad_X(data, name, corrupt, match):
    X, y = data
    with pytest.raises(ValueError, match=match):
        make_clf().fit(corrupt(X), y)


@pytest.mark.parametrize("name, corrupt, match", BAD_X, ids=[b[0] for b in BAD_X])
@pytest.mark.parametrize("method", ["predict", "predict_proba", "decision_function"])
def test_predict_rejects_bad_X(fitted, data, name, corrupt, match, method):
    X, _ = data
    with pytest.raises(ValueError, match=match):
        getattr(fitted, method)(corrupt(X))


def test_first_bad_index_is_reported(data):
    X, y = data
    X = _corrupt(_corrupt(X, "indefinite"), "zero")  # matrices 6 and 9
    with pytest.raises(ValueError, match="matrix 6 "):
        make_clf().fit(X, y)
    X = _corrupt(_corrupt(X, "inf"), "nan")  # matrices 3 and 5
    with pytest.raises(ValueError, match="first at matrix 3"):
        make_clf().fit(X, y)


def test_tiny_asymmetry_is_tolerated(data):
    X, y = data
    X = X.copy()
    X[:, 0, 1] *= 1 + 1e-12
    make_clf(max_epochs=1).fit(X, y)


@pytest.mark.parametrize("n_channels", [6, 10])
@pytest.mark.parametrize("method", ["predict", "decision_function", "partial_fit"])
def test_unseen_shape_at_predict(fitted, spd_dataset, n_channels, method):
    X, y = spd_dataset(n_matrices=6, n_channels=n_channels, n_classes=3)
    args = (X, y) if method == "partial_fit" else (X,)
    with pytest.raises(ValueError, match=rf"size {n_channels}x{n_channels}.*fitted on 8x8"):
        getattr(fitted, method)(*args)


@pytest.mark.parametrize("n_labels", [59, 61, 1])
def test_y_length_mismatch(data, n_labels):
    X, _ = data
    y = np.arange(n_labels) % 3
    with pytest.raises(ValueError, match=f"X has 60 samples but y has {n_labels} labels"):
        make_clf().fit(X, y)


@pytest.mark.parametrize("label", [0, "a"])
def test_one_label_y(data, label):
    X, _ = data
    with pytest.raises(ValueError, match=r"number of classes has to be greater than one; got 1 class"):
        make_clf().fit(X, np.full(len(X), label))


def test_one_label_partial_fit_classes(data):
    X, y = data
    with pytest.raises(ValueError, match="greater than one"):
        make_clf().partial_fit(X, np.zeros(len(X)), classes=[0])


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("y", [np.linspace(0, 1, 60), np.full(60, np.nan)], ids=["continuous", "nan"])
def test_non_classification_targets(data, y):
    X, _ = data
    with pytest.raises(ValueError, match="Unknown label type|y contains NaN"):
        make_clf().fit(X, y)


def test_multilabel_target_rejected(data):
    X, y = data
    with pytest.raises(ValueError):
        make_clf().fit(X, np.stack([y, y], axis=1))


def test_single_matrix(data):
    X, y = data
    with pytest.raises(ValueError, match="greater than one"):
        make_clf().fit(X[:1], y[:1])


BAD_PARAMS = [
    (dict(lr=-1e-3), r"The 'lr' parameter of SPDnetClassifier must be a float in the range \(0.0, inf\)\. Got -0.001"),
    (dict(lr=0.0), "'lr' parameter"),
    (dict(lr=np.nan), "'lr' parameter"),
    (dict(lr=np.inf), "'lr' parameter"),
    (dict(lr="0.1"), "'lr' parameter"),
    (dict(batch_size=0),
     r"The 'batch_size' parameter of SPDnetClassifier must be an int \(not a bool\) in the range \[1, inf\)"),
    (dict(batch_size=-4), "'batch_size' parameter"),
    (dict(batch_size=2.5), "'batch_size' parameter"),
    (dict(max_epochs=0), "'max_epochs' parameter"),
    (dict(validation_fraction=1.0), r"'validation_fraction' parameter .* range \[0.0, 1.0\)"),
    (dict(validation_fraction=-0.1), "'validation_fraction' parameter"),
    (dict(dtype="float16"), r"'dtype' parameter .* must be a str among \{'float(32|64)', 'float(32|64)'\}. Got 'float16'"),
    (dict(dtype=torch.float64), "'dtype' parameter"),
    (dict(scaling="bad"), "'scaling' parameter .* Got 'bad'"),
    (dict(scaling=-1.0), "'scaling' parameter"),
    (dict(scaling=0.0), "'scaling' parameter"),
    (dict(scaling=np.nan), "'scaling' parameter"),
    (dict(eps=np.nan), r"The 'eps' parameter of SPDnetClassifier must be a float in the range \(0.0, inf\)\. Got nan"),
    (dict(eps=0.0), "'eps' parameter"),
    (dict(eps=-1e-3), "'eps' parameter"),
    (dict(eps=np.inf), "'eps' parameter"),
    (dict(patience=-1), r"'patience' parameter .* an int \(not a bool\) in the range \[0, inf\) or None"),
    (dict(patience=2.5), "'patience' parameter"),
    (dict(lr_patience=-1), "'lr_patience' parameter"),
    (dict(lr_factor=-0.5), r"'lr_factor' parameter .* range \(0.0, 1.0\)"),
    (dict(lr_factor=0.0), "'lr_factor' parameter"),
    (dict(lr_factor=1.0), "'lr_factor' parameter"),
    (dict(lr_factor=2.0), "'lr_factor' parameter"),
    (dict(random_state="seed"), "'random_state' parameter"),
    (dict(verbose="yes"), "'verbose' parameter"),
    (dict(device=3), "'device' parameter"),
    (dict(hidden_dims=(10,)), r"hidden_dims \(10,\) must not increase from 8 channels"),
    (dict(hidden_dims=(4, 6)), "must not increase"),
    (dict(hidden_dims=(0,)), r"hidden_dims must be positive integers \(an int or a tuple of ints\), got \(0,\)"),
    (dict(hidden_dims=()), "hidden_dims must be positive integers"),
    (dict(hidden_dims=(2.7,)), r"hidden_dims must be positive integers .*got \(2.7,\)"),
    (dict(hidden_dims=(4, True)), "hidden_dims must be positive integers"),
    (dict(hidden_dims=0), "'hidden_dims' parameter"),
    (dict(hidden_dims=2.7), "'hidden_dims' parameter"),
    (dict(recenter_every=0), "'recenter_every' parameter"),
    (dict(trainable="bimap"), "'trainable' parameter"),
]


@pytest.mark.parametrize("params, match", BAD_PARAMS, ids=[str(p[0]) for p in BAD_PARAMS])
@pytest.mark.parametrize("method", ["fit", "partial_fit"])
def test_bad_hyper_parameters(data, params, match, method):
    X, y = data
    clf = make_clf(**params)
    before = _snapshot(clf)
    with pytest.raises(ValueError, match=match):
        if method == "fit":
            clf.fit(X, y)
        else:
            clf.partial_fit(X, y, classes=[0, 1, 2])
    _assert_same_state(clf, before)


@pytest.mark.parametrize("params, match", BAD_PARAMS, ids=[str(p[0]) for p in BAD_PARAMS])
def test_bad_hyper_parameters_leave_a_fitted_model_intact(fitted, data, params, match):
    """``set_params`` then ``fit`` with a bad value: the fitted model is untouched."""
    X, y = data
    clf = clone(fitted)
    clf.__dict__.update(copy.deepcopy(fitted.__dict__))
    clf.set_params(**params)
    before = _snapshot(clf)
    with pytest.raises(ValueError, match=match):
        clf.fit(X, y)
    _assert_same_state(clf, before)
    clf.set_params(**fitted.get_params())
    np.testing.assert_array_equal(clf.decision_function(X), fitted.decision_function(X))


# ---------------------------------------------------------------------------------------------
# Atomic fits: a fit that raises leaves the estimator exactly as it was
# ---------------------------------------------------------------------------------------------


def _plain(value):
    """Modules, optimizers and tensors as (nested) numpy data, other values deep-copied."""
    if isinstance(value, torch.nn.Module):
        value = value.state_dict()
    elif isinstance(value, torch.optim.Optimizer):
        value = value.state_dict()
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, np.random.RandomState):
        return value.get_state()
    return copy.deepcopy(value)


def _snapshot(clf):
    """Everything in ``vars(clf)``, as plain copied data."""
    return {key: _plain(value) for key, value in vars(clf).items()}


def _assert_same_state(clf, before):
    after = _snapshot(clf)
    assert sorted(after) == sorted(before)
    for key in before:
        np.testing.assert_equal(after[key], before[key], err_msg=key)


def _hostile(X, y, what):
    X, y = X.copy(), y.copy()
    if what == "nan":
        X[3, 0, 0] = np.nan
    elif what == "inf":
        X[5, 1, 1] = np.inf
    elif what == "-inf":
        X[5, 1, 2] = X[5, 2, 1] = -np.inf
    elif what == "non_symmetric":
        X[2, 0, 1] += 1.0
    elif what == "not_spd":
        X[4] = -np.eye(X.shape[1])
    elif what == "singular":
        X[4] = 0.0
    elif what == "2d":
        X = X[0]
    elif what == "4d":
        X = X[:, None]
    elif what == "non_square":
        X = X[:, :, :-1]
    elif what == "empty":
        X, y = X[:0], y[:0]
    elif what == "strings":
        X = X.astype(str)
    elif what == "complex":
        X = X.astype(complex)
    elif what == "object":
        X = X.astype(object)
    elif what == "wrong_channels":
        X = X[:, :6, :6]
    elif what == "one_class":
        y = np.zeros_like(y)
    elif what == "y_short":
        y = y[:-1]
    elif what == "y_long":
        y = np.concatenate([y, y[:2]])
    elif what == "y_2d":
        y = np.stack([y, y], axis=1)
    elif what == "y_continuous":
        y = np.linspace(0, 1, len(y))
    elif what == "y_nan":
        y = np.full(len(y), np.nan)
    elif what == "y_unknown_label":
        y = np.where(y == 2, 7, y)
    return X, y


HOSTILE_INPUTS = [
    ("nan", r"X contains NaN or infinity \(first at matrix 3\)"),
    ("inf", r"X contains NaN or infinity \(first at matrix 5\)"),
    ("-inf", "X contains NaN or infinity"),
    ("non_symmetric", r"X matrix 2 is not symmetric"),
    ("not_spd", r"X matrix 4 is not positive definite"),
    ("singular", r"X matrix 4 is not positive definite"),
    ("2d", r"X must be a 3-D array of SPD matrices .* got shape \(8, 8\)"),
    ("4d", "X must be a 3-D array"),
    ("non_square", r"X must hold square matrices, got matrices of shape \(8, 7\)"),
    ("empty", "X holds 0 matrices"),
    ("strings", "X must be a real numeric array, got dtype <U"),
    ("complex", "X must be a real numeric array, got dtype complex128"),
    ("object", "X must be a real numeric array, got dtype object"),
    ("one_class", "number of classes has to be greater than one; got 1 class"),
    ("y_short", "X has 45 samples but y has 44 labels"),
    ("y_long", "X has 45 samples but y has 47 labels"),
    ("y_2d", "y should be a 1d array"),
    ("y_continuous", "Unknown label type"),
    ("y_nan", "Unknown label type|y contains NaN|Input y contains NaN"),
]
# On a fitted model, partial_fit also meets these.
HOSTILE_FITTED = [
    ("wrong_channels", "size 6x6, but the estimator was fitted on 8x8"),
    ("y_unknown_label", r"y contains labels not in classes: \[7\]"),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::sklearn.exceptions.DataConversionWarning")
@pytest.mark.parametrize("what, match", HOSTILE_INPUTS, ids=[c[0] for c in HOSTILE_INPUTS])
@pytest.mark.parametrize("method", ["fit", "partial_fit"])
def test_hostile_input_unfitted_left_unfitted(data, what, match, method):
    X, y = _hostile(*map(np.asarray, (data[0][:45], data[1][:45])), what)
    clf = make_clf()
    before = _snapshot(clf)
    with pytest.raises(ValueError, match=match):
        if method == "fit":
            clf.fit(X, y)
        else:
            clf.partial_fit(X, y, classes=[0, 1, 2] if what != "one_class" else [0])
    _assert_same_state(clf, before)
    assert not clf.__sklearn_is_fitted__()


@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::sklearn.exceptions.DataConversionWarning")
@pytest.mark.parametrize("what, match", HOSTILE_INPUTS + HOSTILE_FITTED,
                         ids=[c[0] for c in HOSTILE_INPUTS + HOSTILE_FITTED])
@pytest.mark.parametrize("method", ["fit", "partial_fit", "warm_fit"])
def test_hostile_input_fitted_model_intact(fitted, data, what, match, method):
    X, y = _hostile(*map(np.asarray, (data[0][:45], data[1][:45])), what)
    if method in ("fit", "warm_fit") and what in ("wrong_channels", "y_unknown_label"):
        if method == "fit":  # a fresh fit accepts other channels and labels
            pytest.skip("a non-warm fit starts over")
    if method != "fit" and what == "one_class":
        pytest.skip("partial_fit batches and warm-start fits may hold one class of classes_")
    clf = copy.deepcopy(fitted)
    if method == "warm_fit":
        clf.set_params(warm_start=True)
    before = _snapshot(clf)
    reference = fitted.decision_function(data[0])
    with pytest.raises(ValueError, match=match):
        if method == "partial_fit":
            clf.partial_fit(X, y)
        else:
            clf.fit(X, y)
    _assert_same_state(clf, before)
    np.testing.assert_array_equal(clf.decision_function(data[0]), reference)


@pytest.mark.parametrize("hidden_dims", [(2.7,), (0,), ()])
def test_warm_start_fit_validates_hidden_dims(fitted, data, hidden_dims):
    clf = copy.deepcopy(fitted).set_params(warm_start=True, hidden_dims=hidden_dims)
    before = _snapshot(clf)
    with pytest.raises(ValueError, match="hidden_dims must be positive integers"):
        clf.fit(*data)
    _assert_same_state(clf, before)


def test_partial_fit_other_classes_rejected_and_atomic(data):
    X, y = data
    clf = make_clf().partial_fit(X, y, classes=[0, 1, 2])
    before = _snapshot(clf)
    with pytest.raises(ValueError, match=r"classes=\[0, 1, 2, 3\] differs from the classes of the previous calls"):
        clf.partial_fit(X, y, classes=[0, 1, 2, 3])
    _assert_same_state(clf, before)


def test_failure_inside_training_rolls_back(data, monkeypatch):
    """An error in the middle of the epochs leaves the estimator as it was before the call."""
    import skfedspd.base as base

    X, y = data
    clf = make_clf().fit(X, y)
    reference = clf.decision_function(X)
    before = _snapshot(clf)
    original, calls = base.train_epochs, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(base, "train_epochs", failing)
    with pytest.raises(KeyboardInterrupt):
        clf.fit(X, y)  # fails in its 3rd epoch
    _assert_same_state(clf, before)
    np.testing.assert_array_equal(clf.decision_function(X), reference)
    calls.clear()
    clf.partial_fit(X, y)
    clf.partial_fit(X, y)
    after_two = _snapshot(clf)
    with pytest.raises(KeyboardInterrupt):
        clf.partial_fit(X, y)
    _assert_same_state(clf, after_two)


@pytest.mark.parametrize("hidden_dims", [4, (4,), [6, 4], (8,), np.array([5, 3])])
def test_hidden_dims_forms(data, hidden_dims):
    X, y = data
    clf = make_clf(hidden_dims=hidden_dims, max_epochs=1).fit(X, y)
    expected = (hidden_dims,) if isinstance(hidden_dims, int) else tuple(hidden_dims)
    assert [b.weight.shape[1] for b in clf.module_.bimaps] == list(expected)


# ---------------------------------------------------------------------------------------------
# Clamping warning
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["fit", "partial_fit"])
def test_warns_when_most_eigenvalues_are_clamped(data, method):
    X, y = data
    clf = make_clf(scaling=None, eps=1e-2, max_epochs=1)
    with pytest.warns(UserWarning, match=r"ReEig clamps 100% of the first BiMap's eigenvalues to eps=0.01"):
        if method == "fit":
            clf.fit(1e-10 * X, y)
        else:
            clf.partial_fit(1e-10 * X, y, classes=[0, 1, 2])


@pytest.mark.parametrize("scaling", ["auto", "trace", None])
def test_no_clamp_warning_on_well_scaled_input(data, scaling):
    X, y = data
    factor = 1.0 if scaling is None else 1e-10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_clf(scaling=scaling, max_epochs=1).fit(factor * X, y)


# ---------------------------------------------------------------------------------------------
# History, early stopping, learning-rate schedule
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("validation_fraction", [0.0, 0.9])  # 0.9 of 60: 54 >= 50, a split
def test_history_records(data, validation_fraction):
    X, y = data
    clf = make_clf(max_epochs=4, validation_fraction=validation_fraction, patience=100).fit(X, y)
    assert len(clf.history_) == clf.n_iter_ == 4
    for i, record in enumerate(clf.history_):
        assert {"train_loss", "val_loss", "val_f1", "lr"} <= set(record)
        assert record["epoch"] == i
        assert np.isfinite(record["train_loss"]) and record["train_loss"] > 0
        assert record["lr"] == pytest.approx(1e-2)
        if validation_fraction:
            assert np.isfinite(record["val_loss"]) and 0 <= record["val_f1"] <= 1
        else:
            assert np.isnan(record["val_loss"]) and np.isnan(record["val_f1"])
    if not validation_fraction:
        assert clf.best_epoch_ == 3


def test_training_loss_decreases(data):
    X, y = data
    clf = make_clf(max_epochs=20, batch_size=16, validation_fraction=0.0).fit(X, y)
    losses = [r["train_loss"] for r in clf.history_]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])


@pytest.mark.parametrize("patience", [1, 2, 3])
def test_early_stopping_restores_best_epoch(noise_data, patience):
    X, y = noise_data
    kwargs = dict(max_epochs=60, lr=2e-3, batch_size=16, validation_fraction=0.25,
                  lr_patience=100, random_state=1)
    clf = make_clf(patience=patience, **kwargs).fit(X, y)
    assert clf.n_iter_ < 60
    assert len(clf.history_) == clf.n_iter_
    # stopped exactly `patience` epochs after the best one ...
    assert clf.n_iter_ == clf.best_epoch_ + patience + 1
    assert clf.best_epoch_ > 0 or patience == 1
    best = clf.history_[clf.best_epoch_]
    assert not any(_improves(r, best) for r in clf.history_)  # best over all epochs ...
    assert all(_improves(best, r) for r in clf.history_[: clf.best_epoch_])  # ... strictly, first
    # ... and holds the weights of the end of that epoch: the same run stopped there.
    reference = make_clf(patience=10_000, **dict(kwargs, max_epochs=clf.best_epoch_ + 1)).fit(X, y)
    np.testing.assert_array_equal(clf.decision_function(X), reference.decision_function(X))


def test_early_stopping_disabled_without_validation(noise_data):
    X, y = noise_data
    clf = make_clf(max_epochs=12, patience=1, validation_fraction=0.0).fit(X, y)
    assert clf.n_iter_ == 12 and clf.best_epoch_ == 11


@pytest.mark.parametrize("lr_patience, lr_factor", [(0, 0.5), (1, 0.5), (2, 0.1)])
def test_lr_reduction_on_plateau(noise_data, lr_patience, lr_factor):
    X, y = noise_data
    clf = make_clf(max_epochs=15, lr=1e-2, batch_size=16, validation_fraction=0.25, patience=1000,
                   lr_patience=lr_patience, lr_factor=lr_factor, random_state=1).fit(X, y)
    lrs = np.array([r["lr"] for r in clf.history_])
    assert lrs[0] == 1e-2
    assert (np.diff(lrs) <= 0).all()
    assert lrs[-1] < 1e-2
    # Replay the documented rule (as torch's ReduceLROnPlateau) on the validation records:
    # the LR is multiplied by lr_factor once more than lr_patience epochs in a row have not
    # improved since the last improvement or reduction; each record holds the LR it used.
    expected, lr, best, since = [], 1e-2, None, 0
    for record in clf.history_:
        expected.append(lr)
        if best is None or _improves(record, best):
            best, since = record, 0
        else:
            since += 1
            if since > lr_patience:
                lr, since = lr * lr_factor, 0
    np.testing.assert_allclose(lrs, expected, rtol=1e-12)


def test_no_lr_reduction_with_large_lr_patience(noise_data):
    X, y = noise_data
    clf = make_clf(max_epochs=8, validation_fraction=0.25, patience=1000, lr_patience=1000).fit(X, y)
    assert all(r["lr"] == 1e-2 for r in clf.history_)


# ---------------------------------------------------------------------------------------------
# partial_fit and warm_start
# ---------------------------------------------------------------------------------------------


def test_partial_fit_requires_classes_first(data):
    X, y = data
    clf = make_clf()
    with pytest.raises(ValueError, match="classes must be passed on the first call to partial_fit"):
        clf.partial_fit(X, y)
    assert not hasattr(clf, "module_")


def test_partial_fit_continues(data):
    X, y = data
    clf = make_clf()
    snapshots = []
    for call in range(4):
        clf.partial_fit(X, y, classes=[0, 1, 2] if call == 0 else None)
        assert len(clf.history_) == call + 1
        assert clf.n_features_in_ == 8
        snapshots.append(_params(clf))
    for before, after in zip(snapshots, snapshots[1:]):
        assert not _same_params(before, after)
    assert all(r["lr"] == 1e-2 and np.isnan(r["val_loss"]) for r in clf.history_)


def test_partial_fit_learns(data):
    X, y = data
    clf = make_clf(batch_size=16)
    for call in range(15):
        clf.partial_fit(X[:45], y[:45], classes=[0, 1, 2])
    losses = [r["train_loss"] for r in clf.history_]
    assert losses[-1] < losses[0]
    assert clf.score(X[45:], y[45:]) > 0.5


def test_partial_fit_batches_with_missing_classes(data):
    X, y = data
    clf = make_clf()
    clf.partial_fit(X[y != 2], y[y != 2], classes=np.array([2, 0, 1]))
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    clf.partial_fit(X[y == 2], y[y == 2])
    assert clf.decision_function(X).shape == (60, 3)


def test_partial_fit_rejects_unknown_labels(data):
    X, y = data
    clf = make_clf().partial_fit(X, y, classes=[0, 1, 2])
    with pytest.raises(ValueError, match=r"labels not in classes: \[5\]"):
        clf.partial_fit(X[:3], [0, 1, 5])
    with pytest.raises(ValueError, match=r"labels not in classes: \[3\]"):
        make_clf().partial_fit(X, np.where(y == 2, 3, y), classes=[0, 1, 2])


def test_partial_fit_is_deterministic(data):
    X, y = data

    def run():
        clf = make_clf(random_state=5)
        for call in range(3):
            clf.partial_fit(X, y, classes=[0, 1, 2])
        return clf.decision_function(X)

    assert np.array_equal(run(), run())


def test_partial_fit_after_fit_continues(data):
    X, y = data
    clf = make_clf(max_epochs=3).fit(X, y)
    before = _params(clf)
    clf.partial_fit(X, y)
    assert len(clf.history_) == 4
    assert not _same_params(before, _params(clf))


def test_partial_fit_after_refit_trains_the_new_module(data):
    X, y = data
    clf = make_clf(max_epochs=2).partial_fit(X, y, classes=[0, 1, 2])
    clf.fit(X, y)  # replaces module_
    before = _params(clf)
    clf.partial_fit(X, y)
    assert not _same_params(before, _params(clf))


@pytest.mark.parametrize("validation_fraction", [0.0, 0.2])
def test_warm_start_continues(data, validation_fraction):
    X, y = data
    kwargs = dict(max_epochs=3, validation_fraction=validation_fraction, patience=100)
    fresh = make_clf(**kwargs).fit(X, y)
    clf = make_clf(warm_start=True, **kwargs).fit(X, y)
    assert _same_params(_params(clf), _params(fresh))  # first fit: a fresh model
    module = clf.module_
    clf.fit(X, y)
    assert clf.module_ is module
    assert len(clf.history_) == 6
    assert not _same_params(_params(clf), _params(fresh))
    assert not np.array_equal(clf.decision_function(X), fresh.decision_function(X))


@pytest.mark.parametrize("batchnorm", [None, "spd"])
def test_trainable_head_updates_the_head_alone(data, batchnorm):
    """trainable="head": a warm-started fit (e.g. from public weights) moves the head and
    leaves the BiMaps (and batch-norm biases) exactly as they were."""
    X, y = data
    clf = make_clf(max_epochs=2, batchnorm=batchnorm).fit(X, y)
    before = _params(clf)
    clf.set_params(trainable="head", warm_start=True).fit(X, y)
    after = _params(clf)
    changed = {name for name in before if not np.array_equal(before[name], after[name])}
    assert {"head.weight", "head.bias"} <= changed
    assert not any(name.startswith(("bimaps.", "batchnorms.")) and "running_mean" not in name for name in changed)
    with pytest.warns(UserWarning, match="frozen random BiMaps"):  # a new model: random spatial filters
        fresh = make_clf(trainable="head", max_epochs=1).fit(X, y)
    assert [n for n, p in fresh.module_.named_parameters() if p.requires_grad] == ["head.weight", "head.bias"]


def test_no_warm_start_refits_from_scratch(data):
    X, y = data
    clf = make_clf(max_epochs=3)
    first = clf.fit(X, y).decision_function(X)
    module = clf.module_
    clf.fit(X, y)
    assert clf.module_ is not module and len(clf.history_) == 3
    np.testing.assert_array_equal(clf.decision_function(X), first)


# ---------------------------------------------------------------------------------------------
# dtype and input scaling
# ---------------------------------------------------------------------------------------------


def test_float32(data):
    X, y = data
    clf = make_clf(dtype="float32", max_epochs=10).fit(X[:45], y[:45])
    assert all(p.dtype == torch.float32 for p in clf.module_.parameters())
    scores = clf.decision_function(X)
    assert scores.dtype == np.float32 and np.isfinite(scores).all()
    np.testing.assert_allclose(clf.predict_proba(X).sum(axis=1), 1.0, rtol=1e-5)
    assert clf.score(X[45:], y[45:]) > 0.5  # chance: 1/3
    # Same Stiefel initialisation as in float64 (the linear head's torch init depends on dtype).
    ref, init32 = make_clf(dtype="float64"), make_clf(dtype="float32")
    for clf in (ref, init32):  # initialised without data, through the protocol
        clf.check_inputs(X, reset=True)
        clf.set_classes(y)
        clf.init_module(seed=0)
    np.testing.assert_allclose(_params(init32)["bimaps.0.weight"], _params(ref)["bimaps.0.weight"], atol=1e-6)


@pytest.mark.parametrize("scaling, expected", [
    ("auto", None), ("trace", 1.0), (None, 1.0), (2.0, 2.0), (1e9, 1e9), (3, 3.0),
])
def test_scale_attribute(data, scaling, expected):
    X, y = data
    clf = make_clf(scaling=scaling, max_epochs=1).fit(1e-9 * X if scaling == 1e9 else X, y)
    if scaling == "auto":
        n = X.shape[-1]
        expected = np.exp(-np.mean(np.log(np.trace(X, axis1=1, axis2=2) / n)))
        assert clf.scale_ == pytest.approx(expected, rel=1e-12)
    else:
        assert clf.scale_ == expected


@pytest.mark.parametrize("scaling", ["auto", "trace"])
@pytest.mark.parametrize("factor", [1e-10, 1e4])
def test_auto_and_trace_scaling_are_scale_invariant(data, scaling, factor):
    X, y = data
    kwargs = dict(scaling=scaling, max_epochs=5, validation_fraction=0.0)
    ref = make_clf(**kwargs).fit(X, y).decision_function(X)
    scaled = make_clf(**kwargs).fit(factor * X, y)
    np.testing.assert_allclose(scaled.decision_function(factor * X), ref, rtol=1e-6, atol=1e-6)


def test_trace_scaling_is_per_matrix(data):
    X, y = data
    factors = np.random.default_rng(0).uniform(1e-3, 1e3, size=len(X))
    kwargs = dict(scaling="trace", max_epochs=5, validation_fraction=0.0)
    ref = make_clf(**kwargs).fit(X, y).decision_function(X)
    Xf = X * factors[:, None, None]
    np.testing.assert_allclose(make_clf(**kwargs).fit(Xf, y).decision_function(Xf), ref, rtol=1e-6, atol=1e-6)


def test_float_scaling_equals_prescaled_input(data):
    X, y = data
    a = make_clf(scaling=4.0).fit(X, y).decision_function(X)
    b = make_clf(scaling=None).fit(4.0 * X, y).decision_function(4.0 * X)
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------------------------
# pyRiemann pipeline on EEG-like time series
# ---------------------------------------------------------------------------------------------


def test_pyriemann_pipeline_learns_class_structure(eeg_timeseries):
    X, y = eeg_timeseries(n_trials=150, n_channels=8, n_times=128, n_classes=3, seed=0)
    pipe = make_pipeline(
        Covariances("oas"),
        SPDnetClassifier(hidden_dims=(4,), max_epochs=30, lr=1e-2, batch_size=16, random_state=0),
    )
    pipe.fit(X[:90], y[:90])
    accuracy = pipe.score(X[90:], y[90:])
    assert accuracy >= 0.8, accuracy  # chance: 1/3
    assert pipe[-1].scale_ > 1e8  # volt-scale covariances were rescaled by 'auto'


# ---------------------------------------------------------------------------------------------
# One training loop: fit and partial_fit share the optimizer, the seeds and the records
# ---------------------------------------------------------------------------------------------


def test_fit_equals_the_same_number_of_partial_fits(data):
    """Without validation, fit(max_epochs=k) and k partial_fit calls are one and the same
    training: same seed stream, same Adam state carried over, same records."""
    X, y = data
    fitted = make_clf(validation_fraction=0.0, max_epochs=3).fit(X, y)
    partial = make_clf(validation_fraction=0.0)
    for _ in range(3):
        partial.partial_fit(X, y, classes=[0, 1, 2])
    np.testing.assert_array_equal(partial.decision_function(X), fitted.decision_function(X))
    np.testing.assert_equal(partial.history_, fitted.history_)
    assert partial.n_iter_ == fitted.n_iter_ == 3


def test_partial_fit_after_fit_continues_the_same_training(data):
    """fit(k epochs) then partial_fit == fit(k + 1 epochs): Adam's moments and the random
    streams carry over from fit to partial_fit."""
    X, y = data
    two = make_clf(validation_fraction=0.0, max_epochs=2).fit(X, y).partial_fit(X, y)
    three = make_clf(validation_fraction=0.0, max_epochs=3).fit(X, y)
    np.testing.assert_array_equal(two.decision_function(X), three.decision_function(X))
    steps = {float(s["step"]) for s in two._optimizer.state_dict()["state"].values()}
    assert steps == {3 * 2.0}  # 60 samples, batch 32: 2 steps per epoch, 3 epochs


def test_adam_state_kept_across_partial_fit(data):
    """A fresh Adam at each call would train differently from the kept one."""
    X, y = data
    kept = make_clf()
    for _ in range(3):
        kept.partial_fit(X, y, classes=[0, 1, 2])
    restarted = make_clf()
    for _ in range(3):
        restarted.partial_fit(X, y, classes=[0, 1, 2])
        restarted._optimizer = torch.optim.Adam(restarted.module_.parameters(), lr=restarted.lr)
    assert not _same_params(_params(kept), _params(restarted))


@pytest.mark.parametrize("validation_fraction", [0.0, 0.2])
def test_n_iter_counts_epochs_like_mlp(data, validation_fraction):
    X, y = data
    clf = make_clf(validation_fraction=validation_fraction, max_epochs=4, patience=100).fit(X, y)
    assert clf.n_iter_ == len(clf.history_) == 4
    clf.partial_fit(X, y)
    assert clf.n_iter_ == 5
    clf.set_params(warm_start=True).fit(X, y)
    assert clf.n_iter_ == 9
    clf.set_params(warm_start=False).fit(X, y)
    assert clf.n_iter_ == 4


def test_best_epoch_indexes_history_after_warm_start(noise_data):
    X, y = noise_data
    clf = make_clf(max_epochs=6, patience=100, validation_fraction=0.25).fit(X, y)
    clf.set_params(warm_start=True).fit(X, y)
    assert 0 <= clf.best_epoch_ < len(clf.history_) == 12
    assert clf.best_epoch_ >= 6 or clf.history_[clf.best_epoch_]["epoch"] == clf.best_epoch_


# ---------------------------------------------------------------------------------------------
# Independent of torch's global grad mode
# ---------------------------------------------------------------------------------------------


def _run_all(X, y):
    fitted = make_clf(max_epochs=3).fit(X, y)
    partial = make_clf().partial_fit(X, y, classes=[0, 1, 2]).partial_fit(X, y)
    return fitted.decision_function(X), partial.predict_proba(X), fitted.predict(X)


@pytest.mark.parametrize("mode", ["set_grad_enabled(False)", "no_grad"])
def test_training_independent_of_global_grad_mode(data, mode):
    X, y = data
    reference = _run_all(X, y)
    if mode == "no_grad":
        with torch.no_grad():
            results = _run_all(X, y)
    else:
        previous = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        try:
            results = _run_all(X, y)
            assert not torch.is_grad_enabled()  # the caller's mode is left as it was
        finally:
            torch.set_grad_enabled(previous)
    for got, expected in zip(results, reference):
        np.testing.assert_array_equal(got, expected)


def test_local_update_independent_of_global_grad_mode(data):
    X, y = data
    clf = make_clf(max_epochs=1).fit(X, y)
    start = clf.get_parameters()
    codes = torch.as_tensor(clf.encode_labels(y))
    Xt = clf.to_tensor(clf.check_inputs(X, reset=False))
    expected = clf.local_update(start, None, Xt, codes, lr=1e-2, n_epochs=2, seed=3)
    with torch.no_grad():
        got = clf.local_update(start, None, Xt.numpy(), codes.numpy(), lr=1e-2, n_epochs=2, seed=3)
    assert got[1] == expected[1] and got[2] == expected[2]
    for name in expected[0]:
        np.testing.assert_array_equal(got[0][name], expected[0][name])


# ---------------------------------------------------------------------------------------------
# SPD batch normalization: batchnorm=None | "spd" | "domain", domains from fit(..., groups=)
# ---------------------------------------------------------------------------------------------

BN = dict(hidden_dims=(4,), max_epochs=30, lr=1e-2, batch_size=40, validation_fraction=0, random_state=0)


def test_batchnorm_parameter_is_validated(data):
    X, y = data
    with pytest.raises(ValueError, match="batchnorm"):
        make_clf(batchnorm="riemann").fit(X, y)


@pytest.mark.parametrize("batchnorm", ["spd", "domain"])
def test_batchnorm_kinds_through_the_protocol(data, batchnorm):
    X, y = data
    clf = make_clf(batchnorm=batchnorm).fit(X, y)
    kinds = clf.parameter_kinds()
    assert kinds["batchnorms.0.log_bias"] == "euclidean"
    assert (kinds.get("batchnorms.0.running_mean") == "local") == (batchnorm == "spd")
    assert set(clf.get_parameters()) == set(kinds)


def test_domain_batchnorm_recognises_an_unseen_domain(spd_domains):
    """Each group seen through its own congruence: with per-domain statistics (training
    domains from groups, the test domain re-centred by its own mean) the new group is
    classified; without batch norm the shift costs accuracy."""
    X, y, groups = spd_domains(n_groups=5, n_per_group=40, n_channels=6, seed=1)
    train, test = groups < 4, groups == 4
    domain = SPDnetClassifier(batchnorm="domain", **BN).fit(X[train], y[train], groups=groups[train])
    plain = SPDnetClassifier(**BN).fit(X[train], y[train])
    assert domain.score(X[test], y[test]) >= 0.9
    assert domain.score(X[test], y[test]) >= plain.score(X[test], y[test]) + 0.2


def test_domain_batchnorm_trains_on_minibatch_domains(spd_domains, monkeypatch):
    """fit(groups=...) hands every minibatch its matrices' domains, one domain a minibatch:
    each domain's 20 matrices in near-equal batches of at most 16 (two of 10)."""
    X, y, groups = spd_domains(n_groups=3, n_per_group=20)
    seen = []
    forward = SPDNet.forward

    def spy(self, X, domains=None):
        if self.training:
            seen.append(X.domains.clone() if isinstance(X, DomainBatch) else None)
        return forward(self, X, domains)

    monkeypatch.setattr(SPDNet, "forward", spy)
    SPDnetClassifier(batchnorm="domain", **{**BN, "max_epochs": 1, "batch_size": 16}).fit(X, y, groups=groups + 10)
    assert len(seen) == 6 and all(d is not None for d in seen)
    assert sorted(len(d) for d in seen) == [10] * 6
    assert all(len(torch.unique(d)) == 1 for d in seen)


@pytest.mark.parametrize("batchnorm", [None, "spd"])
def test_groups_are_ignored_without_domain_batchnorm(spd_domains, batchnorm):
    X, y, groups = spd_domains(n_groups=3, n_per_group=20)
    a = SPDnetClassifier(batchnorm=batchnorm, **{**BN, "max_epochs": 3}).fit(X, y, groups=groups)
    b = SPDnetClassifier(batchnorm=batchnorm, **{**BN, "max_epochs": 3}).fit(X, y)
    for name, value in a.get_parameters().items():
        np.testing.assert_array_equal(value, b.get_parameters()[name])


def test_domain_batchnorm_predicts_the_data_as_one_domain(spd_domains):
    """Without ``domain``, predict/decision_function re-centre all of X as one temporary
    domain started from the prior (weighing 1 of 61 trials): close to X's own means (one
    call of the module on X), and nothing is stored; predicting parts separately re-centres
    each part."""
    X, y, groups = spd_domains(n_groups=3, n_per_group=20)
    clf = SPDnetClassifier(batchnorm="domain", **{**BN, "max_epochs": 5}).fit(X, y, groups=groups)
    clf.module_.eval()
    with torch.no_grad():
        whole = clf.module_(clf.to_tensor(X)).numpy()
    scores = clf.decision_function(X)
    np.testing.assert_allclose(scores, whole[:, 1] - whole[:, 0], atol=0.05)
    assert clf.domains_ == {}
    parts = np.concatenate([clf.decision_function(X[:30]), clf.decision_function(X[30:])])
    assert not np.allclose(parts, scores)
    spd = SPDnetClassifier(batchnorm="spd", **{**BN, "max_epochs": 5}).fit(X, y)
    parts = np.concatenate([spd.decision_function(X[:30]), spd.decision_function(X[30:])])
    np.testing.assert_allclose(parts, spd.decision_function(X), rtol=1e-12, atol=1e-12)


def test_domain_batchnorm_prediction_is_one_call_beyond_predict_chunks(data):
    X, y = data
    clf = make_clf(batchnorm="domain", max_epochs=1).fit(X, y)
    big = np.concatenate([X] * (1100 // len(X) + 1))
    clf.module_.eval()
    with torch.no_grad():
        whole = clf.module_(clf.to_tensor(big)).numpy()
    np.testing.assert_allclose(clf.predict_proba(big).argmax(1), whole.argmax(1))


def test_groups_of_the_wrong_length(data):
    X, y = data
    with pytest.raises(ValueError, match=f"groups has {len(X) - 1} entries but X has {len(X)} samples"):
        make_clf(batchnorm="domain").fit(X, y, groups=np.zeros(len(X) - 1))


@pytest.fixture
def routing():
    with sklearn.config_context(enable_metadata_routing=True):
        yield


@pytest.mark.usefixtures("routing")
def test_groups_routed_through_pipeline_and_cross_validate(spd_domains):
    from sklearn.model_selection import GroupKFold, cross_validate

    from skfedspd import Recenter

    X, y, groups = spd_domains(n_groups=3, n_per_group=20)
    clf = SPDnetClassifier(batchnorm="domain", **{**BN, "max_epochs": 3})
    assert clf.get_metadata_routing().fit.requests == {"groups": True, "sample_weight": None, "subjects": True,
                                                       "X_target_unlabeled": True, "X_target_labeled": True}
    result = cross_validate(make_pipeline(Recenter(), clf), X, y, cv=GroupKFold(n_splits=3),
                            params={"groups": groups}, return_estimator=True)
    _, first_test = next(GroupKFold(n_splits=3).split(X, y, groups))
    train = ~np.isin(np.arange(len(X)), first_test)
    with sklearn.config_context(enable_metadata_routing=False):
        manual = make_pipeline(Recenter(), clone(clf)).fit(
            X[train], y[train], recenter__groups=groups[train], spdnetclassifier__groups=groups[train])
    for name, value in result["estimator"][0][-1].get_parameters().items():
        np.testing.assert_allclose(value, manual[-1].get_parameters()[name], rtol=1e-12, atol=1e-12)


@pytest.mark.usefixtures("routing")
def test_moabb_style_subjects_are_the_domains(spd_domains):
    """MOABB's CrossSubject routes ``subjects`` (not ``groups``), which SPDnet and Recenter
    request by default as an alias of ``groups``: each training subject is a domain."""
    from skfedspd import Recenter

    X, y, groups = spd_domains(n_groups=3, n_per_group=20)
    pipe = make_pipeline(Recenter(), SPDnetClassifier(batchnorm="domain", **{**BN, "max_epochs": 3}))
    pipe.fit(X, y, subjects=groups)
    with sklearn.config_context(enable_metadata_routing=False):
        direct = SPDnetClassifier(batchnorm="domain", **{**BN, "max_epochs": 3}).fit(
            Recenter().fit_transform(X, groups=groups), y, groups=groups)
    for name, value in pipe[-1].get_parameters().items():
        np.testing.assert_allclose(value, direct.get_parameters()[name], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="groups and subjects"):
        SPDnetClassifier(batchnorm="domain", **BN).fit(X, y, groups=groups, subjects=groups[::-1])


@pytest.mark.parametrize("batchnorm", ["spd", "domain"])
def test_batchnorm_clone_pickle_and_saved_file(data, batchnorm, tmp_path):
    from skfedspd import load_estimator, save_estimator

    X, y = data
    clf = make_clf(batchnorm=batchnorm).fit(X, y)
    assert clone(clf).get_params()["batchnorm"] == batchnorm
    restored = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(restored.decision_function(X), clf.decision_function(X))
    save_estimator(clf, tmp_path / "model")
    loaded = load_estimator(tmp_path / "model")
    assert loaded.batchnorm == batchnorm
    np.testing.assert_array_equal(loaded.decision_function(X), clf.decision_function(X))


@pytest.mark.parametrize("batchnorm", ["spd", "domain"])
def test_batchnorm_local_update_protocol(data, batchnorm):
    """A federated round's local training moves the shared bias; "spd" running means come
    back as "local" arrays (kept by the client), "domain" has no statistics to return."""
    X, y = data
    clf = make_clf(batchnorm=batchnorm)
    X = clf.check_inputs(X, reset=True)
    clf.set_classes(y)
    clf.set_input_statistic(clf.input_statistic(X))
    clf.init_module(seed=0)
    start = clf.get_parameters()
    params, loss, skipped = clf.local_update(start, None, clf.to_tensor(X), clf.encode_labels(y),
                                             lr=1e-2, n_epochs=1, seed=1)
    assert np.isfinite(loss) and skipped == 0
    assert not np.allclose(params["batchnorms.0.log_bias"], start["batchnorms.0.log_bias"])
    local = [name for name, kind in clf.parameter_kinds().items() if kind == "local"]
    assert local == (["batchnorms.0.running_mean"] if batchnorm == "spd" else [])
    for name in local:
        assert not np.allclose(params[name], start[name])


@pytest.mark.parametrize("batchnorm, groups, expected", [
    ("domain", ["b", "a", "b", "c"], [1, 0, 1, 2]), ("domain", None, None), (None, ["b", "a", "b", "c"], None),
    ("spd", ["b", "a", "b", "c"], None),
])
def test_fit_domains_and_module_input(batchnorm, groups, expected):
    """Domains only for batchnorm="domain" with groups; module_input carries the rows' domains."""
    clf = SPDnetClassifier(batchnorm=batchnorm)
    X = clf.check_inputs(np.stack([np.eye(3) * (1 + i) for i in range(4)]), reset=True)
    clf.set_input_statistic(clf.input_statistic(X))
    domains = clf.fit_domains(groups, 4)
    assert (domains is None) if expected is None else (domains.tolist() == expected)
    rows = np.array([3, 0, 2])
    batch = clf.module_input(X, rows, domains)
    torch.testing.assert_close(batch.X if expected else batch, clf.to_tensor(X[rows]))
    if expected:
        assert isinstance(batch, DomainBatch) and batch.domains.tolist() == [1, 0, 0]  # c, b, b: coded within the rows


# ---------------------------------------------------------------------------- batchnorm="auto"
@pytest.mark.parametrize("with_groups, expected", [(True, "domain"), (False, None)])
def test_auto_batchnorm_is_domain_batch_norm_exactly_when_fit_gets_groups(spd_domains, with_groups, expected):
    X, y, groups = spd_domains(n_groups=3, n_per_group=20, n_channels=4)
    clf = SPDnetClassifier(hidden_dims=(3,), max_epochs=2, random_state=0)
    clf.fit(X, y, **({"groups": groups} if with_groups else {}))
    explicit = SPDnetClassifier(hidden_dims=(3,), max_epochs=2, random_state=0, batchnorm=expected)
    explicit.fit(X, y, **({"groups": groups} if with_groups else {}))
    assert clf.batchnorm_ == expected and clf.module_.batchnorm == expected
    # the same network as the explicit setting, bit for bit
    np.testing.assert_array_equal(clf.predict_proba(X), explicit.predict_proba(X))


def test_auto_batchnorm_of_a_first_partial_fit_is_none(spd_domains):
    X, y, groups = spd_domains(n_groups=3, n_per_group=20, n_channels=4)
    clf = SPDnetClassifier(hidden_dims=(3,), max_epochs=2, random_state=0).fit(X, y, groups=groups)
    assert clf.batchnorm_ == "domain"
    clf.set_params(warm_start=True).fit(X, y)  # a warm start keeps the network it has
    assert clf.batchnorm_ == "domain"
    fresh = SPDnetClassifier(hidden_dims=(3,), random_state=0).partial_fit(X, y, classes=np.unique(y))
    assert fresh.module_.batchnorm is None


def test_auto_batchnorm_routes_groups_at_fit_but_no_domain_at_predict():
    routing = SPDnetClassifier().get_metadata_routing()
    assert routing.fit.requests["groups"] is True and routing.fit.requests["subjects"] is True
    assert routing.predict.requests["domain"] is False


def test_auto_batchnorm_survives_save_and_load(spd_domains, tmp_path):
    from skfedspd import load_estimator, save_estimator

    X, y, groups = spd_domains(n_groups=3, n_per_group=20, n_channels=4)
    clf = SPDnetClassifier(hidden_dims=(3,), max_epochs=2, random_state=0).fit(X, y, groups=groups)
    clf.predict(X[:5], domain="new")
    save_estimator(clf, tmp_path / "m.safetensors")
    loaded = load_estimator(tmp_path / "m.safetensors")
    assert loaded.batchnorm == "auto" and loaded.batchnorm_ == "domain" and loaded.domains_ == {"new": 5}
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))


@pytest.mark.parametrize("param, saved", [("spd", "domain"), (None, "domain"), ("auto", "spd"), ("domain", None)])
def test_a_saved_batchnorm_that_the_parameter_cannot_build_is_refused(spd_domains, param, saved):
    X, y, groups = spd_domains(n_groups=3, n_per_group=20, n_channels=4)
    clf = SPDnetClassifier(hidden_dims=(3,), max_epochs=1, random_state=0, batchnorm=saved).fit(X, y, groups=groups)
    arrays, meta = clf.fitted_state()
    meta = copy.deepcopy(meta)
    meta["attributes"]["batchnorm_"] = saved
    target = SPDnetClassifier(hidden_dims=(3,), max_epochs=1, random_state=0, batchnorm=param)
    with pytest.raises(ValueError, match="batchnorm_"):
        target.restore_fitted_state(arrays, meta)
    assert not hasattr(target, "module_") and not hasattr(target, "batchnorm_")
