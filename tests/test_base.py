"""The local-estimator protocol (``skfedspd.base.TorchClassifierBase``, ``docs/guide/protocol.md``):
the documented third-party example runs, and every estimator implements the protocol."""

import pathlib
import re

import numpy as np
import pytest
import torch
from sklearn.base import clone

from conftest import make_eeg_timeseries, make_spd_dataset
from skfedspd import EEGNetClassifier, SPDnetClassifier

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide" / "protocol.md"


@pytest.fixture(scope="module")
def doc_example():
    """The namespace of the Python example in docs/guide/protocol.md, after running it."""
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    namespace = {"__name__": "protocol_example"}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - our own documentation
    return namespace


def test_doc_example_trains_centrally_and_federated(doc_example):
    X, y = doc_example["X"], doc_example["y"]
    assert doc_example["central"].score(X, y) > 0.8
    assert doc_example["federated"].score(X, y) > 0.8
    assert doc_example["federated"].classes_.tolist() == ["move", "rest"]


def _estimators(doc_example):
    X_spd, y_spd = make_spd_dataset(n_matrices=24, n_channels=6, n_classes=3, seed=0)
    X_eeg, y_eeg = make_eeg_timeseries(n_trials=24, n_channels=4, n_times=32, n_classes=2, seed=0)
    return [
        (SPDnetClassifier(hidden_dims=(4,), random_state=0), X_spd, y_spd),
        (EEGNetClassifier(F1=2, D=1, F2=2, p1=2, p2=2, fs=32.0, random_state=0), X_eeg, y_eeg),
        (doc_example["LinearClassifier"](random_state=0), doc_example["X"], doc_example["y"]),
    ]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["spdnet", "eegnet", "third-party"])
def test_protocol_end_to_end(doc_example, which):
    """Two 'sites' and a 'server' driving the protocol by hand, as the engine does."""
    template, X, y = _estimators(doc_example)[which]
    halves = [np.arange(0, len(y), 2), np.arange(1, len(y), 2)]
    server, sites = clone(template), [clone(template) for _ in halves]
    stats = []
    for site, idx in zip(sites, halves):
        Xs = site.check_inputs(X[idx], reset=True)
        stats.append(site.input_statistic(Xs))
    server.check_inputs(X[:1], reset=True)
    server.set_classes(y)
    pooled = None if stats[0] is None else float(np.mean(stats))
    server.set_input_statistic(pooled)
    server.init_module(seed=5)
    kinds = server.parameter_kinds()
    broadcast = server.get_parameters()
    assert list(kinds) == list(broadcast) and set(kinds.values()) <= {"stiefel", "euclidean", "local"}
    replies = []
    for site, idx in zip(sites, halves):
        site.set_classes(y)
        site.set_input_statistic(pooled)
        site.init_module(seed=5)  # same seed, no data: the same module as the server's
        for name, value in site.get_parameters().items():
            np.testing.assert_array_equal(value, broadcast[name])
        codes = site.encode_labels(y[idx], len(idx))
        Xt = site.to_tensor(site.check_inputs(X[idx], reset=False))
        params, loss, skipped = site.local_update(broadcast, None, Xt, torch.as_tensor(codes), lr=1e-2,
                                                  n_epochs=1, seed=11)
        assert list(params) == list(kinds) and np.isfinite(loss) and skipped == 0
        replies.append(params)
    # The same call gives the same reply (the seed fixes everything).
    again = sites[0].local_update(broadcast, None, sites[0].to_tensor(sites[0].check_inputs(X[halves[0]], reset=False)),
                                  torch.as_tensor(sites[0].encode_labels(y[halves[0]])), lr=1e-2, n_epochs=1, seed=11)
    for name in kinds:
        np.testing.assert_array_equal(again[0][name], replies[0][name])
    server.set_parameters({name: replies[1][name] for name in kinds})
    np.testing.assert_array_equal(server.get_parameters()[list(kinds)[-1]], replies[1][list(kinds)[-1]])


@pytest.mark.parametrize("which", [0, 1, 2], ids=["spdnet", "eegnet", "third-party"])
def test_local_update_resumes_and_refreshes_the_clients_optimizer_state(doc_example, which):
    est, X, y = _estimators(doc_example)[which]
    est = clone(est).set_params(batch_size=8)
    Xc = est.check_inputs(X, reset=True)
    est.set_classes(y)
    est.set_input_statistic(est.input_statistic(Xc))
    est.init_module(seed=5)
    Xt = est.to_tensor(Xc)
    codes, broadcast = torch.as_tensor(est.encode_labels(y)), est.get_parameters()
    steps_per_round = -(-len(y) // 8)

    def update(state, seed=1):
        return est.local_update(broadcast, None, Xt, codes, lr=1e-2, n_epochs=1, seed=seed, optimizer_state=state)

    state = {}
    first = update(state)
    fresh = update(None)
    for name in broadcast:  # an empty state is a fresh Adam
        np.testing.assert_array_equal(first[0][name], fresh[0][name])
    assert {float(v) for k, v in state.items() if k.endswith(".step")} == {steps_per_round}
    kept = {k: v.copy() for k, v in state.items()}
    resumed = update(state)
    assert {float(v) for k, v in state.items() if k.endswith(".step")} == {2 * steps_per_round}
    assert any(not np.array_equal(resumed[0][n], fresh[0][n]) for n in broadcast)  # the moments were used
    again = update(dict(kept))
    for name in broadcast:  # resuming is deterministic
        np.testing.assert_array_equal(again[0][name], resumed[0][name])


@pytest.mark.parametrize("which", [0, 1, 2], ids=["spdnet", "eegnet", "third-party"])
def test_fitted_state_round_trip(doc_example, which):
    template, X, y = _estimators(doc_example)[which]
    fitted = clone(template).set_params(max_epochs=3).fit(X, y)
    arrays, meta = fitted.fitted_state()
    restored = clone(fitted)
    restored.restore_fitted_state(arrays, meta)
    np.testing.assert_array_equal(restored.predict_proba(X), fitted.predict_proba(X))
    np.testing.assert_array_equal(restored.classes_, fitted.classes_)


def test_encode_labels_errors():
    clf = SPDnetClassifier()
    clf.set_classes(["a", "b"])
    np.testing.assert_array_equal(clf.encode_labels(["b", "a", "b"]), [1, 0, 1])
    with pytest.raises(ValueError, match=r"y contains labels not in classes: \['c'\]"):
        clf.encode_labels(["a", "c"])
    with pytest.raises(ValueError, match="X has 3 samples but y has 2 labels"):
        clf.encode_labels(["a", "b"], n_samples=3)
    with pytest.raises(ValueError, match="greater than one; got 1 class"):
        SPDnetClassifier().set_classes(["a", "a"])


@pytest.mark.parametrize("cls", [SPDnetClassifier, EEGNetClassifier])
def test_every_parameter_is_constrained(cls):
    assert set(cls._parameter_constraints) == set(cls().get_params(deep=False))
    cls().check_params()  # the defaults are valid
