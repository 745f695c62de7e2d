"""Tests of :mod:`skfedspd.online`: the geodesic running mean against pyRiemann's weighted
Riemannian mean, and the persistent domain statistics of ``SPDnetClassifier(batchnorm=
"domain")``, ``Recenter`` and ``FederatedSPDnetClassifier``: update-then-predict, adapting in
chunks, the prior, online prediction in Pipelines under metadata routing, persistence, bad
input that leaves the estimator unchanged."""

import os
import pickle
import warnings

import numpy as np
import pytest
import sklearn
import torch
from pyriemann.geometry.distance import distance_riemann
from pyriemann.geometry.mean import mean_riemann
from pyriemann.tangentspace import TangentSpace
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from skfedspd import FederatedSPDnetClassifier, Recenter, SPDnetClassifier, load_estimator, save_estimator
from skfedspd.online import (
    DomainAdaptation,
    DomainStatistics,
    RunningMean,
    check_domain_label,
    domain_labels,
    geodesic_running_mean,
)
from skfedspd.recenter import recenter_groups

pytestmark = pytest.mark.usefixtures("torch_single_thread")

NET = dict(hidden_dims=(4,), max_epochs=30, lr=1e-2, batch_size=40, validation_fraction=0, random_state=0)


def _weighted_karcher(prior, w0, X):
    """pyRiemann's weighted Riemannian mean of the prior (weight ``w0``) and ``X`` (weight 1 each)."""
    points = np.concatenate([prior[None], X])
    return mean_riemann(points, sample_weight=np.r_[w0, np.ones(len(X))], tol=1e-14, maxiter=500)


def _running(X, prior, w0):
    M, w = geodesic_running_mean(torch.as_tensor(X), torch.as_tensor(prior), w0)
    assert w == w0 + len(X)
    return M.numpy()


# ---------------------------------------------------------------------------------------------
# The geodesic running mean against pyRiemann's weighted Karcher mean
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("w0", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("n_channels", [3, 8])
def test_one_trial_is_the_exact_weighted_mean(spd_dataset, w0, n_channels):
    """Prior and one trial: two points, the geodesic point at 1/(w0+1) is their weighted mean."""
    X, _ = spd_dataset(n_matrices=6, n_channels=n_channels, seed=1)
    prior = mean_riemann(X[1:])
    np.testing.assert_allclose(_running(X[:1], prior, w0), _weighted_karcher(prior, w0, X[:1]), atol=1e-12)


@pytest.mark.parametrize("k", [2, 5, 20])
def test_commuting_trials_give_the_exact_weighted_mean(k):
    """Matrices of one eigenbasis: the update is log-domain averaging, exact for every k."""
    rng = np.random.default_rng(k)
    Q = np.linalg.qr(rng.standard_normal((5, 5)))[0]
    X = (Q * np.exp(rng.standard_normal((k, 1, 5)))) @ Q.T
    prior = (Q * np.exp(rng.standard_normal(5))) @ Q.T
    np.testing.assert_allclose(_running(X, prior, 1.0), _weighted_karcher(prior, 1.0, X), atol=1e-10)


@pytest.mark.parametrize("n_channels", [4, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [2, 5, 30])
def test_many_trials_approximate_the_weighted_mean(spd_dataset, n_channels, seed, k):
    """Non-commuting trials: the running mean differs from the Karcher mean by terms of
    second order in the dispersion. On these data (mean distance 0.9-2.3 from the mean)
    it was measured within 1.5 % of that distance; the bound of 3 % leaves a factor 2."""
    X, _ = spd_dataset(n_matrices=k + 10, n_channels=n_channels, seed=seed)
    prior = mean_riemann(X[k:])
    M = _running(X[:k], prior, 1.0)
    reference = _weighted_karcher(prior, 1.0, X[:k])
    dispersion = np.mean([distance_riemann(x, reference) for x in X[:k]])
    assert distance_riemann(M, reference) <= 0.03 * dispersion


@pytest.mark.parametrize("memory", [2, 3.5, 10])
@pytest.mark.parametrize("w0", [1.0, 4.0])
def test_memory_is_an_exponentially_weighted_mean(memory, w0):
    """Commuting matrices (log-domain averaging, exact): once the weight reaches the memory
    m, each trial moves the log-mean 1/m of the way; before, the running mean's 1/(w+1)."""
    rng = np.random.default_rng(int(memory * 10))
    Q = np.linalg.qr(rng.standard_normal((4, 4)))[0]
    logs = rng.standard_normal((25, 4))
    prior_log = rng.standard_normal(4)
    state = RunningMean(torch.as_tensor((Q * np.exp(prior_log)) @ Q.T), w0, memory=memory)
    expected, weight = prior_log.copy(), w0
    for d in logs:
        state = state.add(torch.as_tensor((Q * np.exp(d)) @ Q.T))
        weight = min(weight + 1, memory)
        expected += (d - expected) / weight
    assert (state.weight, state.n_trials, state.memory) == (min(w0 + len(logs), memory), len(logs), memory)
    np.testing.assert_allclose(state.mean.numpy(), (Q * np.exp(expected)) @ Q.T, atol=1e-10)


def test_memory_none_is_the_running_mean_and_pickles():
    X = torch.diag_embed(torch.exp(torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(6, 2)))
    a, b = RunningMean(torch.eye(2, dtype=torch.float64), 1.0), RunningMean(torch.eye(2, dtype=torch.float64), 1.0,
                                                                               memory=100)
    for x in X:
        a, b = a.add(x), b.add(x)
    assert torch.equal(a.mean, b.mean) and a.weight == b.weight == 7.0
    restored = pickle.loads(pickle.dumps(b))
    assert restored.memory == 100 and torch.equal(restored.mean, b.mean)
    legacy = RunningMean.__new__(RunningMean)
    legacy.__setstate__({"mean": a.mean, "weight": a.weight, "n_trials": a.n_trials})  # pickled before the memory
    assert legacy.memory is None and legacy.add(X[0]).weight == 8.0


def test_running_mean_pickles_with_its_square_roots():
    state = RunningMean(torch.diag(torch.tensor([4.0, 9.0], dtype=torch.float64)), 2.0, 1)
    restored = pickle.loads(pickle.dumps(state))
    assert (restored.weight, restored.n_trials) == (2.0, 1)
    torch.testing.assert_close(restored.inv_half, torch.diag(torch.tensor([0.5, 1 / 3], dtype=torch.float64)))


@pytest.mark.parametrize("label", [1.5, True, None, ("s", 1), ["s1"], {"s": 1}])
def test_labels_that_are_not_str_or_int_are_refused(label):
    with pytest.raises(TypeError, match="must be a str or an int"):
        check_domain_label(label)


def test_one_label_per_row_of_the_right_length():
    assert domain_labels(np.array([3, 4]), 2) == [3, 4]
    with pytest.raises(ValueError, match="X has 3 matrices, domain has shape \\(2,\\)"):
        domain_labels(["a", "b"], 3)


def test_statistics_state_round_trip_and_reset():
    stats = DomainStatistics([2], torch.float64, prior=[2 * torch.eye(2, dtype=torch.float64)])
    labels = ["a", 7, "a"]
    update = stats.update(labels, prior_weight=1.0)
    update.add_in_order(torch.eye(2, dtype=torch.float64).expand(3, 2, 2) * 3, layer=0)
    update.commit()
    restored = DomainStatistics.from_state(*stats.state(), torch.float64)
    assert restored.trials_seen() == {"a": 2, 7: 1}
    torch.testing.assert_close(restored.domains["a"][0].mean, stats.domains["a"][0].mean)
    with pytest.raises(KeyError, match="unknown domain 'b'; known domains: \\['a', 7\\]"):
        restored.reset("b")
    restored.reset(7)
    assert restored.trials_seen() == {"a": 2}


# ---------------------------------------------------------------------------------------------
# The estimators: SPDnetClassifier(batchnorm="domain") and Recenter
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def domains_data():
    from conftest import make_spd_domains

    return make_spd_domains(n_groups=5, n_per_group=40, n_channels=6, seed=1)


@pytest.fixture(scope="module")
def fitted(domains_data):
    """Each estimator fitted on groups 0-3; group 4 is the new subject."""
    X, y, groups = domains_data
    train = groups < 4
    return {
        "spdnet": SPDnetClassifier(batchnorm="domain", **NET).fit(X[train], y[train], groups=groups[train]),
        "spdnet-2": SPDnetClassifier(batchnorm="domain", **{**NET, "hidden_dims": (5, 3), "max_epochs": 5}).fit(
            X[train], y[train], groups=groups[train]),
        "recenter": Recenter().fit(X[train], groups=groups[train]),
    }


def _output(est, X, domain=None):
    """What each estimator returns for X: SPDnet's logits, Recenter's matrices."""
    if isinstance(est, Recenter):
        return est.transform(X, domain=domain)
    return est.predict_proba(X, domain=domain)


def _copy(est):
    return pickle.loads(pickle.dumps(est))


ESTIMATORS = ["spdnet", "spdnet-2", "recenter"]


@pytest.mark.parametrize("name", ESTIMATORS)
def test_adapting_in_chunks_equals_adapting_at_once(fitted, domains_data, name):
    """Each trial's update depends only on the trials before it (with two batch-norm
    layers too: a trial reaches the next layer re-centred by the statistics right after
    its own update), so how the trials are split into calls does not matter (to rounding:
    batched products of other shapes may round differently)."""
    X, _, groups = domains_data
    new = X[groups == 4]
    chunked, whole = _copy(fitted[name]), _copy(fitted[name])
    for part in np.array_split(new, [1, 2, 7, 20]):
        chunked.adapt(part, domain="s17")
    whole.adapt(new, domain="s17")
    assert chunked.domains_ == whole.domains_ == {"s17": 40}
    np.testing.assert_allclose(_output(chunked, new[:3], "s17"), _output(whole, new[:3], "s17"), rtol=1e-12,
                               atol=1e-14)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_predict_updates_first_then_predicts_every_trial(fitted, domains_data, name):
    """predict(X, domain) = adapt(X, domain), then every trial with the final statistics:
    the last trial of one call equals that trial predicted after adapting on the others."""
    X, _, groups = domains_data
    new = X[groups == 4][:10]
    a, b = _copy(fitted[name]), _copy(fitted[name])
    together = _output(a, new, "s17")
    b.adapt(new[:-1], domain="s17")
    np.testing.assert_allclose(_output(b, new[-1:], "s17")[0], together[-1], rtol=1e-12, atol=1e-12)
    c = _copy(fitted[name])
    assert not np.allclose(_output(c, new[:1], "s17")[0], together[0])  # before the others


@pytest.mark.parametrize("name", ESTIMATORS)
def test_one_label_per_row_updates_each_domain_in_order(fitted, domains_data, name):
    X, _, groups = domains_data
    rows = X[np.isin(groups, [3, 4])]
    labels = np.where(groups[np.isin(groups, [3, 4])] == 3, "a", "b")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(rows))
    mixed, apart = _copy(fitted[name]), _copy(fitted[name])
    out = _output(mixed, rows[order], labels[order])
    for label in ("a", "b"):
        mine = labels[order] == label
        np.testing.assert_allclose(_output(apart, rows[order][mine], label), out[mine], rtol=1e-12, atol=1e-12)
    assert mixed.domains_ == {"b": 40, "a": 40}


@pytest.mark.parametrize("name", ESTIMATORS)
def test_a_call_without_domain_is_a_temporary_domain_from_the_prior(fitted, domains_data, name):
    """Nothing stored; one trial is re-centred by the geodesic midpoint of the prior and
    itself (never by itself alone); a whole subject nearly by its own mean."""
    X, _, groups = domains_data
    est = _copy(fitted[name])
    single = [_output(est, x[None])[0] for x in X[groups == 4][:6]]
    assert est.domains_ == {}
    assert not all(np.allclose(s, single[0]) for s in single[1:])
    np.testing.assert_array_equal(_output(est, X[groups == 4][:6]), _output(est, X[groups == 4][:6], ["t"] * 6))


@pytest.mark.parametrize("include_self", [False, True])
def test_recenter_one_matrix_uses_the_prior(fitted, domains_data, include_self):
    """A single new matrix is re-centred by the prior; with ``include_self``, by the
    weighted mean of the prior (1) and itself."""
    X, _, groups = domains_data
    rc = clone(fitted["recenter"]).set_params(domain_adaptation=DomainAdaptation(include_self=include_self)).fit(X[groups < 4],
                                                                                   groups=groups[groups < 4])
    x = X[groups == 4][0]
    M = _weighted_karcher(rc.domain_prior_, 1.0, x[None]) if include_self else rc.domain_prior_
    W = _inv_half(M)
    np.testing.assert_allclose(rc.transform(x[None])[0], W @ x @ W, rtol=1e-9, atol=1e-10)


def _inv_half(M):
    lam, U = np.linalg.eigh(M)
    return (U / np.sqrt(lam)) @ U.T


def test_whole_subject_call_leaves_each_trial_out_of_its_own_mean(fitted, domains_data):
    """The whole subject in one call: each matrix re-centred by (nearly) the weighted
    Karcher mean of the prior (1) and the subject's other matrices."""
    X, _, groups = domains_data
    new, rc = X[groups == 4], fitted["recenter"]
    expected = []
    for t, x in enumerate(new):
        W = _inv_half(_weighted_karcher(rc.domain_prior_, 1.0, np.delete(new, t, axis=0)))
        expected.append(W @ x @ W)
    np.testing.assert_allclose(rc.transform(new), expected, atol=0.03)


def test_whole_subject_call_is_close_to_the_former_own_mean_rule(fitted, domains_data):
    """The whole subject in one call: the prior weighs 1 of 41 and the running mean is near
    the Karcher mean, so the output is near the former rule (X re-centred by its own mean),
    itself included or not."""
    X, y, groups = domains_data
    new, y_new = X[groups == 4], y[groups == 4]
    rc = clone(fitted["recenter"]).set_params(domain_adaptation=DomainAdaptation(include_self=True)).fit(X[groups < 4], groups=groups[groups < 4])
    np.testing.assert_allclose(rc.transform(new), recenter_groups(new), atol=0.05)
    clf = _copy(fitted["spdnet"])
    clf.module_.eval()
    with torch.no_grad():
        former = torch.softmax(clf.module_(clf.to_tensor(new)), 1).numpy()  # one batch: its own means
    for include_self in (False, True):
        clf.set_params(domain_adaptation=DomainAdaptation(include_self=include_self))
        np.testing.assert_allclose(clf.predict_proba(new), former, atol=0.05)
        assert (clf.predict(new) == clf.classes_[former.argmax(1)]).mean() >= 0.95
        assert clf.score(new, y_new) >= 0.9


@pytest.mark.parametrize("memory", [None, 3.0])
def test_leaving_a_trial_out_is_exact_for_commuting_matrices(memory):
    """Diagonal matrices: each trial's statistics without itself are the exact weighted
    log-Euclidean mean of the prior and the other trials, with each trial's weight in the
    running mean (exponential with a memory)."""
    rng = np.random.default_rng(0)
    Z = torch.diag_embed(torch.as_tensor(np.exp(rng.standard_normal((6, 3)))))
    labels = ["a", "b", "a", "a", "b", "a"]
    stats = DomainStatistics([3], torch.float64, prior=[torch.diag(torch.tensor([2.0, 1.0, 0.5], dtype=torch.float64))])
    update = stats.update(labels, prior_weight=1.5, memory=memory)
    update.add_in_order(Z, layer=0)
    got = update.inv_halves(0)
    for label in ("a", "b"):
        mine = [t for t, lab in enumerate(labels) if lab == label]
        shares, weight = [1.0], 1.5  # each component's share of the final mean, prior first
        for _ in mine:
            weight = weight + 1 if memory is None else min(weight + 1, memory)
            shares = [s * (1 - 1 / weight) for s in shares] + [1 / weight]
        logs = [np.log(np.diag(stats.prior[0].numpy()))] + [np.log(np.diag(Z[t].numpy())) for t in mine]
        for j, t in enumerate(mine):
            rest = [s for i, s in enumerate(shares) if i != j + 1]
            mean = sum(s * v for i, (s, v) in enumerate(zip(shares, logs)) if i != j + 1) / sum(rest)
            np.testing.assert_allclose(np.diag(got[t].numpy()), np.exp(-mean / 2), rtol=1e-10)


def test_first_trial_of_a_domain_is_predicted_as_without_adaptation(fitted, domains_data):
    """One trial of a new domain is scored with the prior alone: as with statistics frozen
    at the prior (no adaptation), and different once the trial itself is included."""
    X, _, groups = domains_data
    clf = _copy(fitted["spdnet"])
    x = X[groups == 4][:1]
    first = clf.predict_proba(x, domain="new")
    frozen = _copy(fitted["spdnet"]).set_params(domain_adaptation=DomainAdaptation(prior_weight=1e12, include_self=True))
    np.testing.assert_allclose(first, frozen.predict_proba(x, domain="new"), atol=1e-9)
    assert clf.domains_ == {"new": 1}
    inclusive = _copy(fitted["spdnet"]).set_params(domain_adaptation=DomainAdaptation(include_self=True))
    assert not np.allclose(first, inclusive.predict_proba(x, domain="new"), atol=1e-6)


def test_online_prediction_recognises_the_new_subject(fitted, domains_data):
    """One trial per call, the new subject's statistics adapting: as accurate as the
    whole-subject call after a short start (the former rule predicted one class only)."""
    X, y, groups = domains_data
    clf = _copy(fitted["spdnet"])
    new, y_new = X[groups == 4], y[groups == 4]
    online = np.array([clf.predict(x[None], domain="s17")[0] for x in new])
    assert clf.domains_ == {"s17": 40}
    assert len(np.unique(online)) == 2
    assert (online[10:] == y_new[10:]).mean() >= 0.85


@pytest.mark.parametrize("name", ESTIMATORS)
def test_reset_domain(fitted, domains_data, name):
    X, _, _ = domains_data
    est = _copy(fitted[name])
    est.adapt(X[:3], domain="a").adapt(X[3:5], domain=2)
    with pytest.raises(KeyError, match="unknown domain 'b'; known domains: \\['a', 2\\]"):
        est.reset_domain("b")
    assert est.reset_domain("a").domains_ == {2: 2}
    assert est.reset_domain().domains_ == {}


def _state(est):
    """Everything the domain statistics hold, as comparable arrays."""
    arrays, meta = est.domain_statistics_.state()
    return arrays, meta


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("call", ["adapt", "output"])
def test_bad_input_leaves_the_statistics_unchanged(fitted, domains_data, name, call):
    X, _, _ = domains_data
    est = _copy(fitted[name])
    est.adapt(X[:4], domain="a")
    before = _state(est)
    act = (lambda Z, d: est.adapt(Z, d)) if call == "adapt" else (lambda Z, d: _output(est, Z, d))
    bad = X[:5].copy()
    bad[3] = -bad[3]  # the 4th trial is not SPD: nothing before it may be added either
    with pytest.raises(ValueError, match="matrix 3 is not positive definite"):
        act(bad, "a")
    with pytest.raises(ValueError, match="X has 5 matrices, domain has shape \\(4,\\)"):
        act(X[:5], ["a", "b", "a", "b"])
    with pytest.raises(ValueError, match="X has 2 matrices, domain has shape \\(2, 1\\)"):
        act(X[:2], [["a"], ["b"]])
    with pytest.raises(TypeError, match="must be a str or an int, got set"):
        act(X[:2], [{"a"}, {"b"}])
    with pytest.raises(TypeError, match="must be a str or an int, got float"):
        act(X[:2], 1.5)
    after = _state(est)
    assert after[1] == before[1]
    for key in before[0]:
        np.testing.assert_array_equal(after[0][key], before[0][key])


@pytest.mark.parametrize("batchnorm", [None, "spd"])
def test_domains_need_domain_batchnorm(domains_data, batchnorm):
    X, y, groups = domains_data
    clf = SPDnetClassifier(batchnorm=batchnorm, **{**NET, "max_epochs": 2}).fit(X, y)
    for call in (lambda: clf.adapt(X[:2], domain="a"), lambda: clf.predict(X[:2], domain="a"),
                 lambda: clf.reset_domain(), lambda: clf.fit_domain_prior(X)):
        with pytest.raises(ValueError, match="batchnorm='domain'"):
            call()
    clf.predict(X[:1])  # no domain: the former prediction


@pytest.mark.parametrize("param, value", [("prior_weight", 0), ("prior_weight", -1.0),
                                          # a memory of one trial would re-centre each trial by itself
                                          ("memory", 1), ("memory", 1.99), ("memory", 0)])
@pytest.mark.parametrize("make", [lambda **p: SPDnetClassifier(batchnorm="domain", **p, **NET), Recenter])
def test_domain_parameters_out_of_range_are_refused(domains_data, param, value, make):
    X, y, _ = domains_data
    with pytest.raises(ValueError, match=f"'{param}' parameter of DomainAdaptation"):
        make(domain_adaptation=DomainAdaptation(**{param: value})).fit(X, y)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_memory_set_after_fit_is_checked_before_anything_changes(fitted, domains_data, name):
    X, _, groups = domains_data
    est = _copy(fitted[name]).set_params(domain_adaptation=DomainAdaptation(memory=1))
    with pytest.raises(ValueError, match=r"'memory' parameter of DomainAdaptation must be a float in the range \[2.0, inf\)"):
        _output(est, X[groups == 4][:3], domain="a")
    assert est.domains_ == {}


@pytest.mark.parametrize("name", ESTIMATORS)
def test_memory_follows_a_drifting_domain(fitted, domains_data, name):
    """A domain whose trials switch to another subject's: with a memory its mean (at the
    first re-centring layer) ends near that subject's own, without one between the two."""
    X, _, groups = domains_data
    first, second = X[groups == 4][:30], X[groups == 3][:30]
    own = _copy(fitted[name]).adapt(second, domain="b").domain_statistics_.domains["b"][0].mean.numpy()
    distance = {}
    for memory in (None, 5):
        est = _copy(fitted[name]).set_params(domain_adaptation=DomainAdaptation(memory=memory)).adapt(first, domain="a").adapt(second, domain="a")
        distance[memory] = distance_riemann(est.domain_statistics_.domains["a"][0].mean.numpy(), own)
    assert distance[5] < 0.5 * distance[None]


@pytest.mark.parametrize("name", ESTIMATORS)
def test_memory_none_and_a_memory_never_reached_are_identical(fitted, domains_data, name):
    X, _, groups = domains_data
    x = X[groups == 4][:12]
    a = _output(_copy(fitted[name]), x, domain="a")
    b = _output(_copy(fitted[name]).set_params(domain_adaptation=DomainAdaptation(memory=50)), x, domain="a")
    np.testing.assert_array_equal(a, b)


def test_prior_weight_sets_the_geodesic_step(fitted, domains_data):
    """With weight w0 the first trial moves the mean 1/(w0+1) of the way to itself."""
    X, _, groups = domains_data
    rc = _copy(fitted["recenter"]).set_params(domain_adaptation=DomainAdaptation(prior_weight=3.0))
    x = X[groups == 4][:1]
    rc.adapt(x, domain="a")
    np.testing.assert_allclose(rc.domain_statistics_.domains["a"][0].mean.numpy(),
                               _weighted_karcher(rc.domain_prior_, 3.0, x), atol=1e-12)


def test_prior_is_the_log_euclidean_mean_of_the_layer_inputs(fitted, domains_data):
    """SPDnet: of the BiMap outputs (one layer), whatever the training domains; Recenter:
    of the training matrices."""
    X, _, groups = domains_data
    train = groups < 4

    def log_euclidean(Z):
        lam, U = np.linalg.eigh(Z)
        L = ((U * np.log(lam)[:, None, :]) @ U.transpose(0, 2, 1)).mean(0)
        lam, U = np.linalg.eigh(L)
        return (U * np.exp(lam)) @ U.T

    np.testing.assert_allclose(fitted["recenter"].domain_prior_, log_euclidean(X[train]), rtol=1e-10)
    clf = fitted["spdnet"]
    W = clf.module_.bimaps[0].weight.detach().numpy()
    Z = W.T @ (X[train] * clf.scale_) @ W
    np.testing.assert_allclose(clf.domain_prior_[0], log_euclidean(Z), rtol=1e-10)


# ---------------------------------------------------------------------------------------------
# A model without a prior
# ---------------------------------------------------------------------------------------------

def test_without_a_prior_a_first_trial_warns(fitted, domains_data):
    X, y, groups = domains_data
    clf = _copy(fitted["spdnet"])
    clf.domain_statistics_ = None  # as a model saved before the prior existed
    with pytest.warns(UserWarning, match="no domain prior.*fit_domain_prior.*domain="):
        clf.predict(X[:1])
    with pytest.warns(UserWarning, match="no domain prior"):
        clf.predict(X[:1], domain="a")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clf.predict(X[1:2], domain="a")  # its second trial
        clf.predict(X[:5])
        clf.fit_domain_prior(X[groups < 4], groups[groups < 4]).predict(X[:1])
    np.testing.assert_allclose(clf.domain_prior_[0], fitted["spdnet"].domain_prior_[0], rtol=1e-12)


def test_partial_fit_drops_the_statistics_of_the_old_weights(domains_data):
    X, y, _ = domains_data
    clf = SPDnetClassifier(batchnorm="domain", **NET).partial_fit(X, y, classes=[0, 1])
    assert clf.domain_prior_ is None
    with pytest.warns(UserWarning, match="no domain prior"):
        clf.predict(X[:1])
    clf.fit_domain_prior(X).adapt(X[:3], domain="a")
    clf.partial_fit(X, y)
    assert clf.domains_ == {} and clf.domain_prior_ is None


def test_fit_forgets_the_domains(fitted, domains_data):
    X, y, groups = domains_data
    clf = _copy(fitted["spdnet"]).set_params(max_epochs=1)
    clf.adapt(X[:3], domain="a")
    assert clf.fit(X, y, groups=groups).domains_ == {}


# ---------------------------------------------------------------------------------------------
# Persistence
# ---------------------------------------------------------------------------------------------

def test_domains_and_prior_persist_through_save_and_load(fitted, domains_data, tmp_path):
    X, _, groups = domains_data
    clf = _copy(fitted["spdnet-2"])
    clf.adapt(X[groups == 4][:7], domain="s17").adapt(X[:2], domain=3)
    path = os.path.join(tmp_path, "model.safetensors")
    save_estimator(clf, path)
    loaded = load_estimator(path)
    assert loaded.domains_ == {"s17": 7, 3: 2}
    for a, b in zip(loaded.domain_prior_, clf.domain_prior_):
        np.testing.assert_array_equal(a, b)
    new = X[groups == 4][7:12]
    np.testing.assert_array_equal(loaded.predict_proba(new, domain="s17"), clf.predict_proba(new, domain="s17"))


def test_a_file_without_domain_statistics_loads_without_a_prior(fitted, domains_data, tmp_path):
    """What a model saved before this feature holds: no domain statistics at all."""
    from skfedspd.persistence import _ESTIMATOR_KIND, load_bundle, save_bundle

    X, _, _ = domains_data
    path = os.path.join(tmp_path, "model.safetensors")
    save_estimator(fitted["spdnet"], path)
    arrays, meta = load_bundle(path, kind=_ESTIMATOR_KIND)
    del meta["state"]["domain_statistics"]
    save_bundle(path, {k: v for k, v in arrays.items() if not k.startswith("domain_statistics.")}, meta,
                kind=_ESTIMATOR_KIND)
    loaded = load_estimator(path)
    assert loaded.domain_prior_ is None
    with pytest.warns(UserWarning, match="no domain prior"):
        loaded.predict(X[:1])


# ---------------------------------------------------------------------------------------------
# Pipelines with metadata routing: online end to end
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def routing():
    with sklearn.config_context(enable_metadata_routing=True):
        yield


@pytest.mark.usefixtures("routing")
@pytest.mark.parametrize("last", ["lr", "spdnet"])
def test_pipeline_runs_online_with_a_routed_domain(domains_data, last):
    X, y, groups = domains_data
    train = groups < 4
    steps = [TangentSpace(), LogisticRegression()] if last == "lr" else [SPDnetClassifier(**NET)]
    pipe = make_pipeline(Recenter(), *steps).fit(X[train], y[train], groups=groups[train])
    new, y_new = X[groups == 4], y[groups == 4]
    online = np.array([pipe.predict(x[None], domain="s17")[0] for x in new])
    assert pipe[0].domains_ == {"s17": 40}
    assert len(np.unique(online)) == 2 and (online[10:] == y_new[10:]).mean() >= 0.8
    if last == "spdnet":
        clf = make_pipeline(SPDnetClassifier(batchnorm="domain", **NET)).fit(X[train], y[train], groups=groups[train])
        clf.predict_proba(new[:1], domain="s17")
        clf.decision_function(new[1:2], domain="s17")
        assert clf[-1].domains_ == {"s17": 2}


@pytest.mark.usefixtures("routing")
def test_domain_is_requested_by_default_where_there_are_domain_statistics():
    """By Recenter, and by the classifiers with batchnorm="domain": a Pipeline passes a
    domain meant for Recenter to an SPDnet without domain statistics no more."""
    domain = SPDnetClassifier(batchnorm="domain")
    for method in ("predict", "predict_proba", "decision_function"):
        assert getattr(domain.get_metadata_routing(), method).requests == {"domain": True}
        assert getattr(SPDnetClassifier().get_metadata_routing(), method).requests == {"domain": False}
    assert FederatedSPDnetClassifier(domain).get_metadata_routing().decision_function.requests == {"domain": True}
    assert FederatedSPDnetClassifier().get_metadata_routing().predict.requests == {"domain": False}
    assert SPDnetClassifier().set_predict_request(domain=True).get_metadata_routing().predict.requests == {
        "domain": True}
    assert Recenter().get_metadata_routing().transform.requests == {"groups": True, "domain": True}


def test_recenter_refuses_groups_and_domain_together(fitted, domains_data):
    X, _, groups = domains_data
    with pytest.raises(ValueError, match="either domain.*or groups"):
        fitted["recenter"].transform(X[:4], groups=[0, 0, 1, 1], domain="a")


# ---------------------------------------------------------------------------------------------
# Federated
# ---------------------------------------------------------------------------------------------

def test_federated_model_has_the_centralized_prior_and_adapts(domains_data, tmp_path):
    X, y, groups = domains_data
    train = groups < 4
    fed = FederatedSPDnetClassifier(SPDnetClassifier(batchnorm="domain", hidden_dims=(4,)), n_rounds=2,
                                    local_epochs=1, validation_fraction=0, random_state=0)
    fed.fit(X[train], y[train], groups=groups[train])
    again = _copy(fed.global_estimator_).fit_domain_prior(X[train], groups[train])
    np.testing.assert_array_equal(fed.domain_prior_[0], again.domain_prior_[0])
    new = X[groups == 4]
    fed.adapt(new[:5], domain="s17")
    assert fed.predict(new[5:6], domain="s17").shape == (1,)
    assert fed.predict_proba(new[6:7], domain="s17").shape == (1, 2)
    assert fed.domains_ == {"s17": 7}
    path = os.path.join(tmp_path, "federated.safetensors")
    save_estimator(fed, path)
    loaded = load_estimator(path)
    assert loaded.domains_ == {"s17": 7}
    np.testing.assert_array_equal(loaded.predict_proba(new[7:9], domain="s17"), fed.predict_proba(new[7:9], domain="s17"))
    assert fed.reset_domain("s17").domains_ == {}
    plain = FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=(4,)), n_rounds=1, local_epochs=1,
                                      validation_fraction=0, random_state=0).fit(X[train], y[train],
                                                                                groups=groups[train])
    with pytest.raises(ValueError, match="batchnorm='domain'"):
        plain.predict(new[:1], domain="s17")


@pytest.mark.parametrize("name", ["spdnet", "recenter"])
def test_a_prior_weight_set_after_fit_is_checked_when_a_domain_starts(fitted, domains_data, name):
    X, _, _ = domains_data
    est = _copy(fitted[name]).set_params(domain_adaptation=DomainAdaptation(prior_weight=0.0))
    with pytest.raises(ValueError, match=r"'prior_weight' parameter of DomainAdaptation .* in the range \(0.0, inf\)\. Got 0.0"):
        _output(est, X[:2], "a")
    assert est.domains_ == {}


def test_a_recenter_pickled_before_domain_statistics_warns_on_one_matrix(fitted, domains_data):
    X, _, _ = domains_data
    old = _copy(fitted["recenter"])
    del old.domain_statistics_
    assert old.domain_prior_ is None
    with pytest.warns(UserWarning, match="no domain prior.*fit\\(X_train\\)"):
        old.transform(X[:1])
    old.transform(X[:2], domain="a")
    assert old.domains_ == {"a": 2}


@pytest.mark.parametrize("groups", [None, "groups"])
def test_global_domain_prior_from_the_training_domains(fitted, domains_data, groups):
    """Each group a domain, or without groups each client."""
    from skfedspd.run import ClientData, domain_prior_from_data

    X, y, subjects = domains_data
    train = subjects < 4
    indices = [np.flatnonzero(subjects[train] == s) for s in range(4)]
    data = ClientData(X[train], y[train], indices, groups=subjects[train] if groups else None)
    est = _copy(fitted["spdnet-2"])
    domain_prior_from_data(data)(est)
    # The second layer's inputs depend on the domains (each normalized by its own means at
    # the first); the clients here are the subjects, so both ways give the subjects' prior.
    by_subject = _copy(est).fit_domain_prior(X[train], subjects[train]).domain_prior_
    as_one = _copy(est).fit_domain_prior(X[train]).domain_prior_
    for got, expected in zip(est.domain_prior_, by_subject):
        np.testing.assert_array_equal(got, expected)
    assert not np.allclose(est.domain_prior_[1], as_one[1])


@pytest.mark.parametrize("dp_epsilon", [None, 1.0])
def test_federated_model_forgets_stored_domains_and_has_no_prior_under_dp(dp_epsilon):
    """A statistic of the sites' data outside the privacy budget is not computed: no prior
    under dp_epsilon."""
    from skfedspd.run import FederatedRun

    est = SPDnetClassifier(batchnorm="domain")
    assert FederatedRun(FederatedSPDnetClassifier(est, dp_epsilon=dp_epsilon)).wants_domain_prior == (
        dp_epsilon is None)
