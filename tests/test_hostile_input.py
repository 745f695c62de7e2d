"""Hostile and careless input: every refusal is clear, and leaves the estimator unchanged.

Each case asserts the error type, a message that names the problem, and that the fitted
state (network, domain statistics, fitted attributes, parameters) is the same after the
refused call as before it. Tampered files are refused by ``load_estimator`` before any
network is built.
"""

import json
import os
import warnings

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from skfedspd import FederatedSPDnetClassifier, Recenter, SPDnetClassifier, load_estimator, save_estimator
from skfedspd.online import DomainAdaptation
from skfedspd.validation import INPUT_RANGE_MARGIN, check_spd_batch
from skfedspd.persistence import load_bundle, save_bundle

N_CHANNELS = 6


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_single_thread):
    yield


@pytest.fixture(scope="module")
def data(request):
    from conftest import make_spd_domains

    X, y, groups = make_spd_domains(n_groups=4, n_per_group=20, n_channels=N_CHANNELS, seed=0)
    return X, y, groups


@pytest.fixture(scope="module")
def fitted(data):
    """A domain-BN SPDnet and a Recenter fitted on the first three groups."""
    X, y, groups = data
    train = groups < 3
    clf = SPDnetClassifier(batchnorm="domain", hidden_dims=(4,), max_epochs=3, random_state=0)
    clf.fit(X[train], y[train], groups=groups[train])
    clf.predict(X[groups == 3][:3], domain="p")  # a stored domain
    rc = Recenter().fit(X[train], groups=groups[train])
    rc.adapt(X[groups == 3][:3], domain="p")
    return {"spdnet": clf, "recenter": rc}


def _state(est):
    """Everything an estimator holds, as comparable JSON text and arrays."""
    if hasattr(est, "fitted_state"):
        arrays, meta = est.fitted_state()
    else:
        arrays, meta = est.domain_statistics_.state()
        meta = {"stats": meta, "n_features_in_": est.n_features_in_, "input_range_": est.input_range_}
    meta = {"meta": meta, "params": {k: repr(v) for k, v in est.get_params().items()}}
    return json.dumps(meta, sort_keys=True, default=repr), {k: np.array(v, copy=True) for k, v in arrays.items()}


def _assert_unchanged(before, est):
    meta, arrays = _state(est)
    assert meta == before[0]
    assert set(arrays) == set(before[1])
    for name, value in arrays.items():
        np.testing.assert_array_equal(value, before[1][name], err_msg=name)


def _copy(est):
    import copy

    return copy.deepcopy(est)


def _output(est, X, domain):
    return est.transform(X, domain=domain) if isinstance(est, Recenter) else est.predict_proba(X, domain=domain)


# ------------------------------------------------------------------ trials that cannot be EEG in the fitted units
def _scaled(factor):
    return lambda X: factor * X


def _eigenvalue(value):
    """The trial with its smallest eigenvalue replaced by ``value`` times its largest."""
    def make(X):
        lam, U = np.linalg.eigh(X[0])
        lam[0] = value * lam[-1]
        return ((U * lam) @ U.T)[None]
    return make


BAD_TRIALS = {
    "scale 1e30": (_scaled(1e30), "far outside the matrices the model was fitted on: its scale"),
    "scale 1e12": (_scaled(1e12), "far outside the matrices the model was fitted on: its scale"),
    "scale 1e300": (_scaled(1e300), "far outside the matrices the model was fitted on: its scale"),
    "scale 1e-300": (_scaled(1e-300), "far outside the matrices the model was fitted on: its scale"),
    # the Cholesky factorization fails, or succeeds on rounding and the condition estimate refuses
    "eigenvalue 1e-20": (_eigenvalue(1e-20), "is not (numerically )?positive definite"),
    "eigenvalue 0": (_eigenvalue(0.0), "is not (numerically )?positive definite"),
    "eigenvalue -7.5e-16": (_eigenvalue(-7.5e-16), "is not (numerically )?positive definite"),
    "condition 1e13": (_eigenvalue(1e-13), "far outside the matrices the model was fitted on: its condition number"),
}


@pytest.mark.parametrize("name", ["spdnet", "recenter"])
@pytest.mark.parametrize("call", ["output", "adapt", "no domain"])
@pytest.mark.parametrize("case", list(BAD_TRIALS))
def test_a_trial_outside_the_training_range_is_refused_before_it_touches_a_domain(fitted, data, name, call, case):
    X, _, groups = data
    est = _copy(fitted[name])
    make, message = BAD_TRIALS[case]
    bad = make(X[groups == 3][3:4])
    before = _state(est)
    with pytest.raises(ValueError, match=message):
        if call == "adapt":
            est.adapt(bad, domain="p")
        else:
            _output(est, bad, None if call == "no domain" else "p")
    _assert_unchanged(before, est)


@pytest.mark.parametrize("method", ["predict", "predict_proba", "decision_function"])
def test_the_next_trials_of_a_domain_are_scored_as_if_the_bad_trial_never_came(fitted, data, method):
    """A 1e30-scaled trial once poisoned a persistent domain (every later trial got the
    same probability); refused, it changes nothing."""
    X, _, groups = data
    clean, hit = _copy(fitted["spdnet"]), _copy(fitted["spdnet"])
    with pytest.raises(ValueError, match="training matrices span"):
        getattr(hit, method)(1e30 * X[groups == 3][3:4], domain="p")
    stream = X[groups == 3][4:14]
    expected = [clean.predict_proba(x[None], domain="p") for x in stream]
    got = [hit.predict_proba(x[None], domain="p") for x in stream]
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate(expected))
    assert np.ptp(np.concatenate(got)[:, 1]) > 0.01  # not one constant output


@pytest.mark.parametrize("name", ["spdnet", "recenter"])
@pytest.mark.parametrize("channel", [0, 3])
def test_a_realistic_artifact_is_accepted(fitted, data, name, channel):
    """An electrode pop (one channel at 100 times its amplitude) is EEG: it passes."""
    X, _, groups = data
    est = _copy(fitted[name])
    trial = X[groups == 3][3].copy()
    trial[channel, :] *= 100
    trial[:, channel] *= 100
    out = _output(est, trial[None], "p")
    assert np.isfinite(out).all()
    assert est.domains_["p"] == 4


def test_the_training_range_margin_is_the_documented_one(fitted, data):
    X, _, groups = data
    clf = _copy(fitted["spdnet"])
    low, high = clf.input_range_["log_scale"]
    trial = X[groups == 3][3:4]
    own = check_spd_batch(trial, return_summary=True)[1][0, 0]
    inside = 10.0 ** (high + INPUT_RANGE_MARGIN["log_scale"] - own - 0.01)
    clf.predict(inside * trial, domain="q")
    with pytest.raises(ValueError, match=r"up to 3 decades beyond are accepted"):
        clf.predict(100 * inside * trial, domain="q")


@pytest.mark.parametrize("scaling", [10.0, None, "auto"])
def test_a_1e308_trial_gets_a_clear_error_not_a_linalg_error(data, scaling):
    X, y, _ = data
    clf = SPDnetClassifier(scaling=scaling, hidden_dims=(4,), max_epochs=1, random_state=0).fit(X, y)
    before = _state(clf)
    with pytest.raises(ValueError, match="far outside the matrices the model was fitted on"):
        clf.predict(1e308 * np.eye(N_CHANNELS)[None])
    _assert_unchanged(before, clf)
    if scaling == 10.0:  # in training, the scaled entries would overflow
        huge = X / np.abs(X).max() * 1e308  # the largest entry 1e308 (one training set: a spread of scales refused)
        with pytest.raises(ValueError, match=r"X matrix \d+ has entries of magnitude 1e3\d\d after scaling"):
            SPDnetClassifier(scaling=scaling, max_epochs=1).fit(huge, y)


def test_partial_fit_and_warm_start_widen_the_training_range(data):
    X, y, _ = data
    clf = SPDnetClassifier(hidden_dims=(4,), max_epochs=1, random_state=0).partial_fit(X[:40], y[:40], classes=[0, 1])
    with pytest.raises(ValueError, match="far outside"):
        clf.predict(1e6 * X[:1])
    clf.partial_fit(1e6 * X[40:], y[40:])
    assert clf.input_range_["log_scale"][1] > 5
    clf.predict(1e6 * X[:1])


# ------------------------------------------------------------------ tampered files
def _tamper(path, edit):
    arrays, meta = load_bundle(path, kind="estimator")
    edit(arrays, meta)
    save_bundle(path, arrays, meta, kind="estimator")


def _domain_entry(key, value):
    def edit(arrays, meta):
        meta["state"]["domain_statistics"]["domains"][0][key] = value
    return edit


def _attribute(name, value):
    def edit(arrays, meta):
        meta["state"]["attributes"][name] = value
    return edit


def _array(name, fill):
    def edit(arrays, meta):
        arrays[name] = np.full_like(arrays[name], fill)
    return edit


def _duplicate_label(arrays, meta):
    domains = meta["state"]["domain_statistics"]["domains"]
    domains[1]["label"] = domains[0]["label"]


def _state_null(arrays, meta):
    meta["state"] = None


def _classes(values, dtype=None):
    def edit(arrays, meta):
        meta["state"]["classes"]["values"] = values
        if dtype is not None:
            meta["state"]["classes"]["dtype"] = dtype
    return edit


def _architecture(n):
    """n_features_in_ and hidden_dims set to n: a network of about 8 n² floats."""
    def edit(arrays, meta):
        meta["state"]["attributes"]["n_features_in_"] = n
        meta["estimator"]["params"]["hidden_dims"] = {"__tuple__": [n]}
    return edit


TAMPERED = {
    "domain weight NaN": (_domain_entry("weight", float("nan")), "domain 'p': weight must be a finite number >= 0"),
    "domain weight -3": (_domain_entry("weight", -3), "domain 'p': weight must be a finite number >= 0"),
    "n_trials -7": (_domain_entry("n_trials", -7), "n_trials must be an int >= 0"),
    "n_trials 1.5": (_domain_entry("n_trials", 1.5), "n_trials must be an int >= 0"),
    "domain label a list": (_domain_entry("label", [1]), "domain statistics label"),
    "duplicate domain labels": (_duplicate_label, "domain statistics labels are repeated: 'p'"),
    "all-NaN domain mean": (_array("domain_statistics.domain.0.0", np.nan),
                            "'domain.0.0' is not a finite symmetric positive definite matrix"),
    "negative domain mean": (_array("domain_statistics.domain.0.0", -1.0),
                             "'domain.0.0' is not a finite symmetric positive definite matrix"),
    "NaN head": (_array("module.head.weight", np.nan), "array 'module.head.weight' is not finite numbers"),
    "scale_ NaN": (_attribute("scale_", float("nan")), "scale_ must be a finite number > 0"),
    "scale_ -1": (_attribute("scale_", -1), "scale_ must be a finite number > 0"),
    "scale_ a string": (_attribute("scale_", "1.0"), "scale_ must be a finite number > 0"),
    "n_features_in_ a string": (_attribute("n_features_in_", "6"), "n_features_in_ must be an int >= 1"),
    "n_features_in_ 5": (_attribute("n_features_in_", 5), r"module array 'bimaps.0.V' is float64 \(6, 4\), expected "),
    "history_ a string": (_attribute("history_", "abc"), "history_ must be a list of records"),
    "best_epoch_ -1": (_attribute("best_epoch_", -1), "best_epoch_ must be an int >= 0"),
    "validation_used_ 1": (_attribute("validation_used_", 1), "validation_used_ must be true or false"),
    "input_range_ inverted": (_attribute("input_range_", {"log_scale": [1, 0], "log_condition": [0, 1]}),
                              "input_range_ must be an object"),
    "unknown attribute": (_attribute("evil_", 1), r"unknown fitted attributes \['evil_'\]"),
    "state null": (_state_null, "'state' of a fitted estimator must be an object, got None"),
    "classes [0, 0]": (_classes([0, 0]), "classes must be at least two unique labels in sorted order"),
    "classes unsorted": (_classes([1, 0]), "classes must be at least two unique labels in sorted order"),
    "classes with NaN": (_classes([0.0, float("nan")], "<f8"), "classes contains NaN"),
    "classes <U5000000": (_classes(["a", "b"], "<U5000000"), "classes: dtype '<U5000000' holds 5000000 characters"),
    "classes of dtype S": (_classes(["a", "b"], "|S1"), "classes: labels of dtype '|S1' are not supported"),
    "architecture N=2000": (_architecture(2000), r"domain statistics 'sizes' \[4\] are not the model's batch-norm "
                                                 r"sizes \[2000\]"),
    "hidden_dims -1": (lambda a, m: m["estimator"]["params"].update(hidden_dims=-1), "hidden_dims"),
    "domain_prior_weight inf": (lambda a, m: m["estimator"]["params"].update(domain_prior_weight=float("inf")),
                                "'prior_weight' parameter of DomainAdaptation"),
    "domain sizes": (lambda a, m: m["state"]["domain_statistics"].update(sizes=[5]),
                     r"'sizes' \[5\] are not the model's batch-norm sizes \[4\]"),
    "fitted a string": (lambda a, m: m.update(fitted="yes"), "'fitted' must be true or false"),
    "optimizer not a list": (lambda a, m: m["state"].update(optimizer=3),
                             "the optimizer state must be a list of parameter groups"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_file_is_refused_at_load_naming_the_field(fitted, data, tmp_path, monkeypatch, case):
    X, _, groups = data
    clf = _copy(fitted["spdnet"])
    clf.predict(X[groups == 3][3:5], domain="s2")  # a second stored domain
    path = tmp_path / "model.safetensors"
    save_estimator(clf, path)
    edit, message = TAMPERED[case]
    _tamper(path, edit)
    size = os.path.getsize(path)
    assert size < 20_000
    def never(self, seed):
        raise AssertionError("a network was built before the file was refused")

    monkeypatch.setattr(SPDnetClassifier, "init_module", never)
    with pytest.raises(ValueError, match=f"{path} holds an invalid estimator state: .*{message}"):
        load_estimator(path)


def test_an_untampered_file_loads_and_predicts_identically(fitted, data, tmp_path):
    X, _, groups = data
    path = tmp_path / "model.safetensors"
    save_estimator(fitted["spdnet"], path)
    loaded = load_estimator(path)
    assert loaded.input_range_ == fitted["spdnet"].input_range_
    np.testing.assert_array_equal(loaded.predict_proba(X[:5], domain="p"), _copy(fitted["spdnet"]).predict_proba(
        X[:5], domain="p"))


def test_load_estimator_of_a_directory_says_so(tmp_path):
    with pytest.raises(IsADirectoryError, match=f"{tmp_path} is a directory, not a skfedspd file"):
        load_estimator(tmp_path)


# ------------------------------------------------------------------ labels and groups
BAD_LABELS = {
    "NaN": (np.array([0.0, 1.0, np.nan, 1.0] * 5), "contains NaN at samples"),
    "None": (np.array([0, 1, None, 1] * 5, dtype=object), "contains None at samples"),
    "mixed list": (["a", 1, "a", 1] * 5, r"mixes label types: str \(first 'a' at sample 0\) and number"),
    "mixed object": (np.array(["a", 1, "a", 1] * 5, dtype=object), "mixes label types"),
}


@pytest.mark.parametrize("case", list(BAD_LABELS))
@pytest.mark.parametrize("call", ["SPDnetClassifier.fit", "fit_domain_prior", "Recenter.fit_transform",
                                  "federated fit", "federated fit, 5 groups per client"])
def test_groups_with_nan_none_or_mixed_types_are_refused(fitted, data, case, call):
    X, y, _ = data
    X, y = X[:20], y[:20]
    groups, message = BAD_LABELS[case]
    if call == "fit_domain_prior":
        est = _copy(fitted["spdnet"])
        before = _state(est)
        with pytest.raises(ValueError, match=f"groups {message}"):
            est.fit_domain_prior(X, groups)
        _assert_unchanged(before, est)
        return
    make = {"SPDnetClassifier.fit": lambda: SPDnetClassifier(batchnorm="domain", max_epochs=1).fit(X, y, groups=groups),
            "Recenter.fit_transform": lambda: Recenter().fit_transform(X, groups=groups),
            "federated fit": lambda: FederatedSPDnetClassifier(n_rounds=1).fit(X, y, groups=groups),
            "federated fit, 5 groups per client": lambda: FederatedSPDnetClassifier(
                n_rounds=1, groups_per_client=5).fit(X, y, groups=groups)}[call]
    with pytest.raises(ValueError, match=f"groups {message}") as error:
        make()
    assert "sample_weight" not in str(error.value)


@pytest.mark.parametrize("case", list(BAD_LABELS))
@pytest.mark.parametrize("make", [lambda: SPDnetClassifier(max_epochs=1),
                                  lambda: FederatedSPDnetClassifier(n_rounds=1, partition="stratified")])
def test_labels_with_nan_none_or_mixed_types_are_refused(data, case, make):
    X, _, _ = data
    y, message = BAD_LABELS[case]
    with pytest.raises(ValueError, match=f"y {message}"):
        make().fit(X[:20], y)


@pytest.mark.parametrize("batchnorm", [None, "spd", "domain"])
def test_groups_of_the_wrong_length_are_refused_whatever_the_model(data, batchnorm):
    X, y, _ = data
    with pytest.raises(ValueError, match="groups has 3 entries but X has 80 samples"):
        SPDnetClassifier(batchnorm=batchnorm, max_epochs=1).fit(X, y, groups=[1, 2, 3])


@pytest.mark.parametrize("value", [True, np.bool_(True)])
def test_groups_per_client_true_is_refused(data, value):
    X, y, groups = data
    with pytest.raises(ValueError, match=r"groups_per_client.* [Gg]ot (True|np.True_)"):
        FederatedSPDnetClassifier(n_rounds=1, groups_per_client=value).fit(X, y, groups=groups)


# ------------------------------------------------------------------ set_params after fit
SET_PARAMS = [("memory", np.inf), ("memory", 1), ("memory", "abc"), ("prior_weight", np.inf), ("prior_weight", -1),
              ("prior_weight", 0), ("prior_weight", "abc"), ("include_self", "yes"), ("max_domains", 0),
              ("max_domains", 2.5)]


@pytest.mark.parametrize("param, value", SET_PARAMS)
@pytest.mark.parametrize("name", ["spdnet", "recenter"])
@pytest.mark.parametrize("domain", ["p", "new", None])
def test_set_params_after_fit_is_validated_at_prediction_as_at_fit(fitted, data, param, value, name, domain):
    X, y, groups = data
    est = _copy(fitted[name])
    est.set_params(domain_adaptation=DomainAdaptation(**{param: value}))
    before = _state(est)
    with pytest.raises(ValueError, match=f"The '{param}' parameter of DomainAdaptation must be") as at_predict:
        _output(est, X[groups == 3][3:5], domain)
    _assert_unchanged(before, est)
    with pytest.raises(ValueError) as at_fit:
        est.fit(X, y)
    assert str(at_fit.value) == str(at_predict.value)


# ------------------------------------------------------------------ misleading messages and silent choices
def test_init_that_is_not_a_local_model_says_so(data):
    X, y, groups = data
    logistic = LogisticRegression().fit(X.reshape(len(X), -1), y)
    fed = FederatedSPDnetClassifier(n_rounds=1, init=logistic)
    with pytest.raises(ValueError, match="a LogisticRegression is not one") as e:
        fed.fit(X, y, groups=groups)
    assert "unfitted" not in str(e.value)


def test_checkpoint_path_that_is_a_directory_is_refused_at_fit(data, tmp_path):
    X, y, groups = data
    fed = FederatedSPDnetClassifier(n_rounds=1, checkpoint_path=tmp_path)
    with pytest.raises(ValueError, match=f"checkpoint_path='{tmp_path}' is a directory"):
        fed.fit(X, y, groups=groups)
    assert not hasattr(fed, "global_estimator_")


def test_trainable_head_without_init_warns(data):
    X, y, groups = data
    with pytest.warns(UserWarning, match="frozen random BiMaps"):
        SPDnetClassifier(trainable="head", max_epochs=1).fit(X, y)
    with pytest.warns(UserWarning, match="frozen random BiMaps"):
        SPDnetClassifier(trainable="head", max_epochs=1).partial_fit(X, y, classes=[0, 1])
    with pytest.warns(UserWarning, match="frozen random BiMaps"):
        FederatedSPDnetClassifier(SPDnetClassifier(trainable="head"), n_rounds=1).fit(X, y, groups=groups)
    start = SPDnetClassifier(max_epochs=1, random_state=0).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        start.set_params(trainable="head", warm_start=True).fit(X, y)  # from trained weights: no warning
        FederatedSPDnetClassifier(SPDnetClassifier(trainable="head"), n_rounds=1, init=start).fit(X, y, groups=groups)


# ------------------------------------------------------------------ bounding the domain store
@pytest.mark.parametrize("name", ["spdnet", "recenter"])
def test_reset_domain_forgets_several_labels_or_all(fitted, data, name):
    X, _, groups = data
    est = _copy(fitted[name])
    for label in ("a", "b", 7):
        _output(est, X[groups == 3][:2], label)
    assert list(est.domains_) == ["p", "a", "b", 7]
    before = _state(est)
    with pytest.raises(KeyError, match=r"unknown domain 'zz'; known domains: \['p', 'a', 'b', 7\]"):
        est.reset_domain(["a", "zz"])  # nothing forgotten: every label is checked first
    _assert_unchanged(before, est)
    assert list(est.reset_domain(["a", 7]).domains_) == ["p", "b"]
    assert est.reset_domain().domains_ == {}


@pytest.mark.parametrize("name", ["spdnet", "recenter"])
def test_max_domains_forgets_the_least_recently_used_with_a_warning(fitted, data, name):
    X, _, groups = data
    est = _copy(fitted[name]).set_params(domain_adaptation=DomainAdaptation(max_domains=2))
    trial = X[groups == 3][:1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _output(est, trial, "a")  # "p" and "a": two domains
    _output(est, trial, "p")  # "p" is now the most recently used
    with pytest.warns(UserWarning, match=r"max_domains=2 reached: forgot the statistics of the 1 least recently "
                                         r"used domain\(s\) 'a'"):
        _output(est, trial, "b")
    assert est.domains_ == {"p": 4, "b": 1}


@pytest.mark.parametrize("n", [2000, 4000])
@pytest.mark.parametrize("batchnorm", [None, "spd"])
def test_a_header_cannot_request_a_network_larger_than_its_arrays(data, tmp_path, monkeypatch, n, batchnorm):
    """n_features_in_ and hidden_dims set to n in a small file: refused by the shapes of the
    file's arrays, before the network (8 n² floats: 1 GB at n = 4000) is allocated."""
    X, y, _ = data
    path = tmp_path / "model.safetensors"
    save_estimator(SPDnetClassifier(batchnorm=batchnorm, hidden_dims=(4,), max_epochs=1, random_state=0).fit(X, y),
                   path)
    _tamper(path, _architecture(n))
    assert os.path.getsize(path) < 20_000

    def never(self, seed):
        raise AssertionError("a network was built before the file was refused")

    monkeypatch.setattr(SPDnetClassifier, "init_module", never)
    with pytest.raises(ValueError, match=rf"module array '[\w.]+' is float64 \(\d, \d\), expected shape \({n}, {n}\)"):
        load_estimator(path)


@pytest.mark.parametrize("backend", ["local", "flower"])
def test_a_federated_domain_model_refuses_trials_outside_its_training_range(data, backend):
    """The federated global model gets its training range with its prior (the training
    data are in the process): a mis-scaled trial cannot poison its domains either."""
    if backend == "flower":
        pytest.importorskip("flwr")
    X, y, groups = data
    fed = FederatedSPDnetClassifier(SPDnetClassifier(batchnorm="domain", hidden_dims=(4,)), n_rounds=1,
                                    backend=backend, random_state=0).fit(X[groups < 3], y[groups < 3],
                                                                         groups=groups[groups < 3])
    expected = check_spd_batch(X[groups < 3], return_summary=True)[1]
    assert fed.global_estimator_.input_range_["log_scale"] == [expected[:, 0].min(), expected[:, 0].max()]
    fed.predict(X[groups == 3][:2], domain="s")
    before = _state(fed.global_estimator_)
    with pytest.raises(ValueError, match="far outside the matrices the model was fitted on"):
        fed.predict(1e12 * X[groups == 3][2:3], domain="s")
    _assert_unchanged(before, fed.global_estimator_)


@pytest.mark.parametrize("ratio", [1e-16, 1e-20])
def test_a_matrix_whose_cholesky_succeeds_on_rounding_is_refused(ratio):
    """diag(1, ratio): Cholesky succeeds, but the matrix is singular at float64 precision."""
    matrix = np.diag([1.0, 1.0, ratio])[None]
    np.linalg.cholesky(matrix)
    with pytest.raises(ValueError, match=r"X matrix 0 is not numerically positive definite: its condition number is "
                                         r"about 1e\+(16|20), beyond 1 / \(3 · eps\(float64\)\)"):
        check_spd_batch(matrix)
