"""Tests for the Flower backend (``skfedspd.flower``, the ``flower`` extra).

- in-process simulation (``FederatedSPDnetClassifier(backend="flower")``): bit-identical
  to ``backend="local"`` for the same ``random_state`` (groups or partitions, partial
  participation, both rules, both weightings, FedBN local arrays, client failures,
  warm start, ``sample_weight`` and ``class_weight``), a few seconds each;
- a site's data file as a deployed site reads it (``load_site_from_node_config``, the
  estimator rebuilt from its JSON spec), served in process: its ``sample_weight`` and a
  dict ``class_weight`` used as on the local backend, bad weights named with the file;
- estimator specs and the written Flower App.

The deployment on 127.0.0.1 (SuperLink + SuperNodes as processes) is tested in
``tests/test_flower_deployment.py``.

Telemetry and update checks are off (set here before flwr is imported); nothing leaves
the loopback interface.
"""

import os
import re
import warnings
from types import SimpleNamespace

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("flwr")

from conftest import make_eeg_timeseries, make_spd_dataset  # noqa: E402
from flwr.serverapp import ServerApp  # noqa: E402
from skfedspd import EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier  # noqa: E402
from skfedspd.federated import set_result  # noqa: E402
from skfedspd.validation import stratified_split  # noqa: E402
from skfedspd.flower import make_client_app, run_inprocess_simulation, serve, write_app  # noqa: E402
from skfedspd.flower.client import load_site_from_node_config  # noqa: E402
from skfedspd.flower.records import to_array_record  # noqa: E402
from skfedspd.flower.server import SPDnetStrategy, set_domain_prior_from_sites  # noqa: E402
from skfedspd.flower.simulation import quiet_flower_logs  # noqa: E402
from skfedspd.aggregation import FLTrust, TrimmedMean  # noqa: E402
from skfedspd.privacy import DPSGD  # noqa: E402
from skfedspd.spec import dumps, estimator_from_spec, estimator_to_spec, loads  # noqa: E402
from skfedspd.training import derive_seed  # noqa: E402

N_CHANNELS = 6


def _estimator(**kwargs):
    params = dict(hidden_dims=(3,), batch_size=8, lr=0.05, early_stopping=True)  # validation on small data
    params.update(kwargs)
    return SPDnetClassifier(**params)


def _fed(backend, estimator=None, **kwargs):
    params = dict(n_rounds=3, local_epochs=1, n_clients=3, random_state=0, partition="stratified")
    params.update(kwargs)
    return FederatedSPDnetClassifier(estimator if estimator is not None else _estimator(), backend=backend, **params)


def _without_time(history):
    """History records without wall times, failure reasons reduced to client and stage
    (the reasons' wording differs between backends: an exception vs a ClientApp error)."""
    return [{k: ([(f["client"], f["stage"]) for f in record[k]] if k == "failed_clients" else record[k])
             for k in sorted(record) if k != "wall_time"} for record in history]  # saved files sort keys


def assert_same_model(a, b):
    """Bit-identical global state, released model, history (but wall times) and metadata."""
    ga, gb = a.engine_.global_params, b.engine_.global_params
    assert ga.keys() == gb.keys()
    for name in ga:
        np.testing.assert_array_equal(ga[name], gb[name], err_msg=name, strict=True)
    released_a = a.global_estimator_.module_.get_parameters()
    released_b = b.global_estimator_.module_.get_parameters()
    for name in released_a:
        np.testing.assert_array_equal(released_a[name], released_b[name], err_msg=name, strict=True)
    assert repr(_without_time(a.history_)) == repr(_without_time(b.history_))  # NaN-aware, exact floats
    assert a.best_round_ == b.best_round_
    np.testing.assert_array_equal(a.classes_, b.classes_)
    assert a.n_features_in_ == b.n_features_in_ and a.n_clients_ == b.n_clients_
    assert a.engine_.local_states.keys() == b.engine_.local_states.keys()


@pytest.fixture(scope="module")
def spd():
    return make_spd_dataset(60, N_CHANNELS, 3, seed=0)


# ---------------------------------------------------------------------------------------------
# In-process simulation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [
    dict(groups=True, clients_per_round=2),
    dict(groups=False, clients_per_round=1, aggregation="rlavg", weighting="uniform", partition="dirichlet"),
    dict(groups=False, clients_per_round=None, validation_fraction=0.0),
    dict(groups=False, clients_per_round=2, estimator=_estimator(recenter_every=3, batch_size=16)),
    # clients of two subjects: each subject a domain of the site's domain batch norm
    dict(groups=True, groups_per_client=2, domains="group", estimator=_estimator(batchnorm="domain")),
    # robust rules: one by name, one with its parameters (sent to the ServerApp in the spec)
    dict(groups=True, aggregation="geomedian"),
    dict(groups=True, aggregation=TrimmedMean(trim=0.25)),
    # the server's reference update on a root set, computed where the run's estimator lives
    dict(groups=True, aggregation=FLTrust(*make_spd_dataset(12, N_CHANNELS, 3, seed=1))),
    # its options (the gate), and the reference's Adam state kept between rounds on the server
    dict(groups=True, aggregation=FLTrust(*make_spd_dataset(12, N_CHANNELS, 3, seed=1), agreement_scope="layer",
                                          trust="accept", magnitude="bounded")),
])
def test_simulation_bit_identical_to_local(spd, config):
    X, y = spd
    config = dict(config)
    groups = np.repeat(np.arange(4), 15) if config.pop("groups") else None
    local = _fed("local", **config).fit(X, y, groups=groups)
    flower = _fed("flower", **config).fit(X, y, groups=groups)
    assert_same_model(local, flower)
    assert flower.client_source_ == local.client_source_ and flower.client_groups_ == local.client_groups_
    np.testing.assert_array_equal(flower.predict_proba(X), local.predict_proba(X))
    m = flower.engine_.n_select
    assert all(len(r["clients"]) == m and r["clients"] == sorted(r["clients"]) for r in flower.history_)


def test_simulation_history_format_and_labels(spd):
    X, codes = spd
    y = np.array(["feet", "left", "right"])[codes]
    local = _fed("local").fit(X, y)
    flower = _fed("flower").fit(X, y)
    assert_same_model(local, flower)
    assert [set(r) for r in flower.history_] == [set(r) for r in local.history_]
    assert all(r["wall_time"] > 0 for r in flower.history_)
    assert flower.predict(X).tolist() == local.predict(X).tolist()
    assert flower.classes_.tolist() == ["feet", "left", "right"]


def test_simulation_fedbn_local_arrays_eegnet():
    X, y = make_eeg_timeseries(n_trials=36, n_channels=4, n_times=32, n_classes=2, seed=0)
    groups = np.repeat([0, 1, 2], 12)
    estimator = EEGNetClassifier(F1=2, D=1, F2=2, p1=2, p2=2, batch_size=8, lr=1e-2, fs=32.0)
    local = _fed("local", estimator, n_rounds=2, clients_per_round=2).fit(X, y, groups=groups)
    flower = _fed("flower", estimator, n_rounds=2, clients_per_round=2).fit(X, y, groups=groups)
    assert local.engine_.local_states  # BatchNorm statistics stayed per client
    assert_same_model(local, flower)
    for cid, state in local.engine_.local_states.items():
        for name, value in state.items():
            np.testing.assert_array_equal(value, flower.engine_.local_states[cid][name], strict=True)


def _failing(monkeypatch, failing_seeds):
    """The one local-training routine, failing for the given local-training seeds (both
    backends call it)."""
    original = SPDnetClassifier.local_update

    def wrapper(self, *args, **kwargs):
        if kwargs["seed"] in failing_seeds:
            raise OSError("simulated site failure")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SPDnetClassifier, "local_update", wrapper)


def test_simulation_client_failure_matches_local(spd, monkeypatch):
    X, y = spd
    seed = int(np.random.RandomState(0).randint(0, 2**31 - 1))  # what random_state=0 draws
    failing = {derive_seed(seed, 10, 1, 1)}  # client 1 in round 1
    _failing(monkeypatch, failing)
    local = _fed("local", on_client_error="skip").fit(X, y)
    flower = _fed("flower", on_client_error="skip").fit(X, y)
    assert [f["client"] for f in local.history_[1]["failed_clients"]] == [1]
    assert local.history_[1]["clients"] == [0, 2]
    assert "OSError: simulated site failure" in local.history_[1]["failed_clients"][0]["reason"]
    assert "simulated site failure" in flower.history_[1]["failed_clients"][0]["reason"]
    assert_same_model(local, flower)
    with pytest.raises(RuntimeError, match="client 1 failed in round 1"):
        _fed("flower").fit(X, y)


def test_simulation_warm_start_continues_like_local(spd):
    X, y = spd
    local = _fed("local", n_rounds=2, warm_start=True).fit(X, y)
    flower = _fed("flower", n_rounds=2, warm_start=True).fit(X, y)
    local.fit(X, y)
    flower.fit(X, y)
    assert len(flower.history_) == 4
    assert_same_model(local, flower)


def test_sites_keep_their_optimizer_state_for_one_fit_only(spd):
    """Two fits served one after the other to the same SuperNodes (one Flower run): the
    second starts fresh client optimizers (the sites tag their state with the fit), so it
    equals a fit on its own, and both equal the local backend."""
    X, y = spd
    parts = np.array_split(np.arange(len(y)), 3)
    server_app, results = ServerApp(), []

    @server_app.main()
    def main(grid, context):
        for _ in range(2):
            results.append(serve(_fed("flower"), grid, n_sites=3, connect_timeout=30.0))

    client_app = make_client_app(lambda context: (context.node_config["partition-id"],
                                                  X[parts[context.node_config["partition-id"]]],
                                                  y[parts[context.node_config["partition-id"]]]),
                                 estimator_factory=_estimator)
    with quiet_flower_logs():
        run_inprocess_simulation(server_app, client_app, 3)
    first, second = (set_result(_fed("flower"), result) for result in results)
    assert_same_model(first, second)
    local = _fed("local", partition="contiguous").fit(X, y)
    np.testing.assert_array_equal(second.decision_function(X), local.decision_function(X))


def _frozen(client_params, weights, previous, kinds):
    """A rule that keeps the previous global model: every round scores the same."""
    return {name: value.copy() for name, value in previous.items()}


def test_simulation_early_stopping_sends_nothing_more(spd):
    X, y = spd
    kwargs = dict(n_rounds=6, patience=1, aggregation=_frozen)  # a plateau from round 0
    local = _fed("local", **kwargs).fit(X, y)
    flower = _fed("flower", **kwargs).fit(X, y)
    assert len(local.history_) == 2  # the best round, then `patience` rounds without improvement
    assert_same_model(local, flower)


def _weights(n, seed=0):
    """Non-integer sample weights, some 0: a weighted fit that no repetition of samples gives."""
    w = np.random.default_rng(seed).uniform(0.2, 3.0, n)
    w[::7] = 0.0
    return w


def _imbalanced(X, y, groups):
    """Two thirds of the last class left out: ``class_weight="balanced"`` weighs the classes apart."""
    last = y == y.max()
    keep = ~last | (np.cumsum(last) % 3 == 1)
    return X[keep], y[keep], groups[keep]


@pytest.mark.parametrize("config", [
    dict(groups=True, clients_per_round=2, sample_weight=True),
    dict(groups=False, aggregation="rlavg", weighting="uniform", sample_weight=True),
    dict(groups=True, clients_per_round=2, estimator=_estimator(class_weight="balanced")),
    dict(groups=False, estimator=_estimator(class_weight="balanced", scaling=1.0), sample_weight=True),
], ids=["sample_weight", "rlavg-uniform", "class_weight", "both"])
def test_simulation_sample_weight_bit_identical_to_local(spd, config):
    """The sites train, validate, pool the input statistic and weigh their replies with the
    weights the local backend uses (``sample_weight`` times ``class_weight``, computed on all
    the labels), so the model is the local backend's bit for bit."""
    config = dict(config)
    X, y, groups = _imbalanced(*spd, np.repeat(np.arange(4), 15))
    groups = groups if config.pop("groups") else None
    fit = dict(groups=groups, sample_weight=_weights(len(y)) if config.pop("sample_weight", False) else None)
    local = _fed("local", **config).fit(X, y, **fit)
    flower = _fed("flower", **config).fit(X, y, **fit)
    assert_same_model(local, flower)
    np.testing.assert_array_equal(flower.predict_proba(X), local.predict_proba(X))
    assert flower.get_params()["estimator__class_weight"] == local.get_params()["estimator__class_weight"]
    # the clients' aggregation weights are sums of non-integer weights, not sample counts
    assert all(isinstance(n, float) for record in flower.history_ for n in record["n_samples"])


def test_simulation_weights_refused_under_dp(spd):
    """DP mode keeps refusing sample weights, from ``sample_weight`` or ``class_weight``."""
    X, y = spd
    dp = dict(privacy=DPSGD(epsilon=1.0), validation_fraction=0.0)
    with pytest.raises(ValueError, match="sample_weight is not supported with privacy"):
        _fed("flower", _estimator(scaling="trace"), **dp).fit(X, y, sample_weight=np.ones(len(y)))
    with pytest.raises(ValueError, match="sample_weight is not supported with privacy .*: .* class_weight"):
        _fed("flower", _estimator(scaling="trace", class_weight={0: 2.0}), **dp).fit(X, y)


def _site_files(folder, X, y, groups, sample_weight=None):
    """One ``site<g>.npz`` per group, as a site saves its data for its SuperNode."""
    paths = []
    for g in np.unique(groups):
        arrays = dict(X=X[groups == g], y=y[groups == g])
        if sample_weight is not None:
            arrays["sample_weight"] = sample_weight[groups == g]
        paths.append(folder / f"site{g}.npz")
        np.savez(paths[-1], **arrays)
    return paths


def _read(path, cid=0):
    """What a SuperNode started with ``--node-config 'client-id=<cid> data-path="<path>"'`` reads."""
    return load_site_from_node_config(SimpleNamespace(node_config={"client-id": cid, "data-path": str(path)}))


def _serve_files(fed, paths):
    """``fed`` fitted by :func:`serve` against in-process sites that read ``paths`` and
    rebuild the estimator from the set-up's JSON spec, as deployed sites do."""
    server_app, results = ServerApp(), []

    @server_app.main()
    def main(grid, context):
        results.append(serve(fed, grid, n_sites=len(paths), connect_timeout=30.0))

    client_app = make_client_app(lambda context: _read(paths[context.node_config["partition-id"]],
                                                       context.node_config["partition-id"]))
    with quiet_flower_logs():
        run_inprocess_simulation(server_app, client_app, len(paths))
    return set_result(fed, results[0])


def test_site_data_file_sample_weight_is_read_and_used(spd, tmp_path):
    X, y = spd
    groups, w = np.repeat(np.arange(3), 20), _weights(len(y))
    paths = _site_files(tmp_path, X, y, groups, w)
    site_id, _, _, read, groups_read = _read(paths[1], cid=1)
    assert groups_read is None
    assert site_id == 1
    np.testing.assert_array_equal(read, w[groups == 1], strict=True)
    deployed = _serve_files(_fed("local", n_rounds=2), paths)
    local = _fed("local", n_rounds=2).fit(X, y, groups=groups, sample_weight=w)
    assert_same_model(local, deployed)
    unweighted = _fed("local", n_rounds=2).fit(X, y, groups=groups)
    assert not np.array_equal(deployed.predict_proba(X), unweighted.predict_proba(X))


def test_site_data_file_groups_are_the_sites_domains(spd, tmp_path):
    """A site file's ``groups`` (two subjects per site) are its domains of batch
    normalization, as ``groups_per_client=2, domains="group"`` makes them on the local backend."""
    X, y = spd
    subjects = np.repeat(np.arange(4), 15)
    paths = []
    for site in range(2):
        rows = subjects // 2 == site
        paths.append(tmp_path / f"site{site}.npz")
        np.savez(paths[-1], X=X[rows], y=y[rows], groups=subjects[rows])
    np.testing.assert_array_equal(_read(paths[1], cid=1)[4], subjects[subjects >= 2], strict=True)
    estimator = _estimator(batchnorm="domain")
    deployed = _serve_files(_fed("local", estimator, n_rounds=2), paths)
    local = _fed("local", estimator, n_rounds=2, groups_per_client=2, domains="group").fit(X, y, groups=subjects)
    assert_same_model(local, deployed)
    one_domain = _fed("local", estimator, n_rounds=2).fit(X, y, groups=subjects // 2)
    assert not np.array_equal(deployed.predict_proba(X), one_domain.predict_proba(X))
    # the prior, summed from the sites' statistics, is the one fit computes on the pooled data
    for summed, pooled in zip(deployed.domain_prior_, local.domain_prior_, strict=True):
        np.testing.assert_allclose(summed, pooled, rtol=1e-10)


def test_deployed_sites_without_groups_send_the_prior_of_one_domain_each(spd, tmp_path):
    """Sites without groups: each site one domain, as it trained; the model then predicts
    a single trial of a new domain with the prior, without warning."""
    X, y = spd
    sites = np.repeat(np.arange(3), 20)
    paths = _site_files(tmp_path, X, y, sites)
    estimator = _estimator(batchnorm="domain")
    deployed = _serve_files(_fed("local", estimator, n_rounds=2), paths)
    local = _fed("local", estimator, n_rounds=2).fit(X, y, groups=sites)
    for summed, pooled in zip(deployed.domain_prior_, local.domain_prior_, strict=True):
        np.testing.assert_allclose(summed, pooled, rtol=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(deployed.predict_proba(X[:1], domain="new"),
                                   local.predict_proba(X[:1], domain="new"), rtol=1e-8)


class _PriorGrid:
    """A Grid whose sites answer the prior query with the given ``{name: array}`` replies."""

    def __init__(self, replies):
        self.replies = replies

    def send_and_receive(self, messages, timeout):
        return [SimpleNamespace(metadata=SimpleNamespace(src_node_id=m.metadata.dst_node_id), has_error=lambda: False,
                                content={"prior": to_array_record(reply)})
                for m, reply in zip(messages, self.replies)]


def _bad_count(reply):
    return {**reply, "count": np.asarray(0)}


def _asymmetric(reply):
    S = reply["log-sum.0"].copy()
    S[0, 1] += 1.0
    return {**reply, "log-sum.0": S}


def _extra(reply):
    return {**reply, "log-sum.1": reply["log-sum.0"]}


@pytest.mark.parametrize("corrupt, problem", [(_bad_count, "count"), (_asymmetric, "symmetric"),
                                              (_extra, "arrays"),
                                              (lambda r: {**r, "log-sum.0": r["log-sum.0"][:2, :2]}, "shape")])
def test_a_malformed_prior_reply_is_refused_naming_the_site(spd, corrupt, problem):
    """The server sums the sites' prior statistics only after checking each reply; a good
    pair of replies gives the pooled prior."""
    X, y = spd
    est = _estimator(batchnorm="domain").fit(X, y)
    halves = [est.domain_prior_statistics(X[:30]), est.domain_prior_statistics(X[30:])]
    replies = [{"log-sum.0": sums[0], "count": np.asarray(count)} for sums, count in halves]
    fed = _fed("local", est)
    set_domain_prior_from_sites(fed, est, _PriorGrid(replies), [7, 8], "{}", {}, 1.0)
    np.testing.assert_allclose(est.domain_prior_[0], est.fit_domain_prior(X).domain_prior_[0], rtol=1e-10)
    with pytest.raises(ValueError, match=f"client 1 sent a malformed domain prior reply: .*{problem}"):
        set_domain_prior_from_sites(fed, est, _PriorGrid([replies[0], corrupt(replies[1])]), [7, 8], "{}", {}, 1.0)


@pytest.mark.parametrize("groups, shape", [(np.zeros(19), r"\(19,\)"), (np.zeros((20, 1)), r"\(20, 1\)")])
def test_site_data_file_bad_groups_named(spd, tmp_path, groups, shape):
    X, y = spd
    path = tmp_path / "site0.npz"
    np.savez(path, X=X[:20], y=y[:20], groups=groups)
    with pytest.raises(ValueError, match=rf"site0.npz: groups must be a 1-D array of 20 labels \(one per sample\), "
                                         rf"got shape {shape}"):
        _read(path)


def test_deployed_site_applies_a_dict_class_weight_and_refuses_balanced(spd, tmp_path):
    """A dict ``class_weight`` weighs each label alike at every site, as on the local backend;
    ``"balanced"`` needs the class counts of all the sites: the set-up fails, saying so."""
    X, codes = spd
    y, groups = np.array(["a", "b", "c"])[codes], np.repeat(np.arange(3), 20)
    paths = _site_files(tmp_path, X, y, groups)
    estimator = _estimator(class_weight={"a": 0.5, "b": 1.0, "c": 3.0})
    deployed = _serve_files(_fed("local", estimator, n_rounds=2), paths)
    assert_same_model(_fed("local", estimator, n_rounds=2).fit(X, y, groups=groups), deployed)
    with pytest.raises(RuntimeError, match="failed the setup query: .*class_weight='balanced' is not supported on a "
                                           "Flower deployment"):
        _serve_files(_fed("local", _estimator(class_weight="balanced"), n_rounds=1), paths)


@pytest.mark.parametrize("weights, problem", [
    (lambda n: -np.ones(n), r"contains negative weights \(first at sample 0\)"),
    (lambda n: np.where(np.arange(n) == 3, np.nan, 1.0), r"contains NaN or infinity \(first at sample 3\)"),
    (lambda n: np.ones(n - 1), r"must be a 1-D array of 20 weights \(one per sample\), got shape \(19,\)"),
    (lambda n: np.ones((n, 1)), r"must be a 1-D array of 20 weights \(one per sample\), got shape \(20, 1\)"),
    (lambda n: np.float64(2.0), r"must be a 1-D array of 20 weights \(one per sample\), got shape \(\)"),
    (lambda n: np.zeros(n), r"sums to 0"),
    (lambda n: np.array(["heavy"] * n), r"must be numbers"),
], ids=["negative", "nan", "length", "2-d", "scalar", "all-zero", "strings"])
def test_bad_sample_weight_in_a_site_file_is_named(tmp_path, weights, problem):
    X, y = make_spd_dataset(20, 4, 2, seed=0)
    path = tmp_path / "site0.npz"
    np.savez(path, X=X, y=y, sample_weight=weights(len(y)))
    with pytest.raises(ValueError, match=rf"site data file {re.escape(str(path))}: sample_weight {problem}"):
        _read(path)


def test_bad_site_weights_fail_the_setup(spd, tmp_path):
    """A site whose file has bad weights, whose training part has weight 0 (as the local
    backend refuses it), or that has weights under DP fails the set-up: the run stops before
    any round, with the site's reason."""
    X, y = spd
    groups, w = np.repeat(np.arange(3), 20), np.ones(len(y))
    bad = w.copy()
    bad[25] = -1.0
    with pytest.raises(RuntimeError, match=r"failed the setup query: .*site1\.npz: sample_weight contains negative"):
        _serve_files(_fed("local", n_rounds=1), _site_files(tmp_path, X, y, groups, bad))
    seed = int(np.random.RandomState(0).randint(0, 2**31 - 1))  # what random_state=0 draws
    site_codes = np.unique(y[groups == 1], return_inverse=True)[1]
    _, validation = stratified_split(site_codes, 0.5, derive_seed(seed, 8, 1))  # client 1's split
    validation_only = w.copy()
    validation_only[groups == 1] = np.isin(np.arange(20), validation)
    with pytest.raises(ValueError, match=r"training samples of clients \[1\] all have weight 0"):
        _fed("local", n_rounds=1, validation_fraction=0.5).fit(X, y, groups=groups, sample_weight=validation_only)
    with pytest.raises(ValueError, match=r"training samples of clients \[1\] all have weight 0"):  # the same refusal
        _serve_files(_fed("local", n_rounds=1, validation_fraction=0.5),
                     _site_files(tmp_path, X, y, groups, validation_only))
    with pytest.raises(RuntimeError, match="failed the setup query: .*sample_weight is not supported with privacy"):
        _serve_files(_fed("local", _estimator(scaling="trace"), n_rounds=1, privacy=DPSGD(epsilon=1.0),
                          validation_fraction=0.0),
                     _site_files(tmp_path, X, y, groups, w))


def test_simulation_input_errors_as_local(spd):
    X, y = spd
    with pytest.raises(ValueError, match="'backend' parameter"):
        _fed("ray").fit(X, y)
    with pytest.raises(ValueError, match="groups has"):
        _fed("flower").fit(X, y, groups=np.arange(3))
    with pytest.raises(ValueError, match="number of classes"):
        _fed("flower").fit(X, np.zeros(len(y)))
    with pytest.raises(ValueError, match="checkpoint_path"):
        _fed("flower", checkpoint_path="state.ckpt").fit(X, y)


def test_strategy_samples_exactly_m_nodes(spd):
    X, y = spd
    flower = _fed("flower", clients_per_round=1, n_rounds=2).fit(X, y)
    assert [len(r["clients"]) for r in flower.history_] == [1, 1]
    strategy = SPDnetStrategy(flower.engine_, nodes=[11, 12, 13], setup_json="{}", local_epochs=1)
    assert strategy.engine.n_select == strategy.min_train_nodes == 1  # not FedAvg's default of 2


# ---------------------------------------------------------------------------------------------
# Estimator specs, the app
# ---------------------------------------------------------------------------------------------


def test_spec_round_trip():
    fed = _fed("local", estimator=_estimator(hidden_dims=(4, 3), scaling=None), aggregation="rlavg",
               clients_per_round=0.5)
    rebuilt = estimator_from_spec(estimator_to_spec(fed))
    assert type(rebuilt) is FederatedSPDnetClassifier
    assert rebuilt.estimator.get_params() == fed.estimator.get_params()
    assert rebuilt.estimator.hidden_dims == (4, 3)
    assert {k: v for k, v in rebuilt.get_params(deep=False).items() if k != "estimator"} == \
        {k: v for k, v in fed.get_params(deep=False).items() if k != "estimator"}
    agreed = estimator_from_spec(estimator_to_spec(_fed("local", classes=np.array([2, 1]))))
    assert agreed.classes == [2, 1]  # an array of agreed classes travels as a list
    for class_weight in ({0: 1.0, 1: 3.0}, {"left": 2, "right": 0.5}, {True: 1.0, False: 2.0}):
        text = dumps(estimator_to_spec(_fed("local", estimator=_estimator(class_weight=class_weight))))
        rebuilt = estimator_from_spec(loads(text)).estimator.class_weight
        assert rebuilt == class_weight and [type(k) for k in rebuilt] == [type(k) for k in class_weight]
    with pytest.raises(TypeError, match="aggregation"):
        estimator_to_spec(_fed("local", aggregation=lambda *a: None))
    with pytest.raises(ValueError):
        estimator_from_spec({"class": "os.system", "params": {}})


@pytest.mark.parametrize("class_weight", [{"__dict__": 5}, {"__dict__": [[1]]}, {"__dict__": [[[0], 1.0]]},
                                          {"__tuple__": 5}])
def test_malformed_spec_is_a_value_error(class_weight):
    """A spec comes from a run config or a file: a malformed encoded dict or tuple is a
    ValueError naming it, not a TypeError from inside the decoder."""
    spec = {"class": "SPDnetClassifier", "params": {"class_weight": class_weight}}
    with pytest.raises(ValueError, match="unexpected object in an estimator spec"):
        estimator_from_spec(spec)


def test_written_app_is_a_valid_flower_app(tmp_path):
    from flwr.cli.config_utils import load_and_validate

    config, _ = load_and_validate(write_app(tmp_path) / "pyproject.toml")
    components = config["tool"]["flwr"]["app"]["components"]
    assert components == {"serverapp": "skfedspd.flower.app:server_app",
                          "clientapp": "skfedspd.flower.app:client_app"}


@pytest.mark.parametrize("labels", [np.array([10.0, 20.0, 30.0]), np.array([True, False]), np.array(["a", "b", "c"])])
def test_simulation_accepts_float_bool_and_string_labels(spd, labels):
    X, codes = spd
    y = labels[codes % len(labels)]
    local = _fed("local", n_rounds=1).fit(X, y)
    flower = _fed("flower", n_rounds=1).fit(X, y)
    assert_same_model(local, flower)
    assert flower.classes_.tolist() == sorted(set(labels.tolist()))


def _sites(monkeypatch, relabel=lambda cid, y: y):
    """The simulation's sites with their labels through ``relabel(client_id, y)``; returns
    the list their set-up replies are appended to."""
    from skfedspd.flower import simulation_fit

    real, replies = simulation_fit.make_client_app, []

    def make_client_app(load_site, **kwargs):
        def load(context):
            cid, X, y, sample_weight, groups = load_site(context)
            return cid, X, relabel(cid, y), sample_weight, groups

        app = real(load, **kwargs)

        def spy(message, context):
            reply = app(message=message, context=context)
            if message.metadata.message_type == "query.setup" and not reply.has_error():
                replies.append(dict(reply.content["site"]))
            return reply

        return spy

    monkeypatch.setattr(simulation_fit, "make_client_app", make_client_app)
    return replies


def test_agreed_classes_no_site_sends_its_labels(spd, monkeypatch):
    X, codes = spd
    y = np.array(["a", "c", "d"])[codes]
    replies = _sites(monkeypatch)
    flower = _fed("flower", n_rounds=2, classes=["a", "b", "c", "d"]).fit(X, y)
    assert len(replies) == 3 and not any("labels" in reply for reply in replies)
    assert_same_model(_fed("local", n_rounds=2, classes=["a", "b", "c", "d"]).fit(X, y), flower)
    assert flower.classes_.tolist() == ["a", "b", "c", "d"]
    replies.clear()
    _fed("flower", n_rounds=1).fit(X, y)  # without agreed classes each site declares its own
    assert sorted(reply["labels"] for reply in replies) == ['["a", "c", "d"]'] * 3


def test_site_label_outside_the_agreed_classes_fails_the_setup(spd, monkeypatch):
    """The site checks its labels itself (the server never sees them): one outside the
    agreed classes fails that site's set-up, naming the label."""
    X, codes = spd
    _sites(monkeypatch, lambda cid, y: np.where((cid == 1) & (y == "c"), "z", y))
    with pytest.raises(RuntimeError, match=r"failed the setup query: .*labels \['z'\] that are not in the agreed "
                                           r"classes \['a', 'b', 'c'\]"):
        _fed("flower", classes=["a", "b", "c"]).fit(X, np.array(["a", "b", "c"])[codes])


def test_serve_checks_the_parameters_before_contacting_any_site():
    """The ServerApp gets the estimator as a JSON spec, not through ``fit``: ``serve``
    validates it before waiting for any site (no grid needed to fail)."""
    from skfedspd.flower.server import serve

    with pytest.raises(ValueError, match="n_rounds"):
        serve(_fed("local", n_rounds=0), grid=None, n_sites=2)
    with pytest.raises(ValueError, match="lr"):
        serve(_fed("local", estimator=_estimator(lr=-1.0)), grid=None, n_sites=2)
