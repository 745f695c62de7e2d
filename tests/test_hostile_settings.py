"""Hostile and careless settings: counts, tuples, messages and the deployment entry points.

Every case asserts the error type, that its message names the field, and that the model
(or the file, or the process table) is unchanged: a bool is never taken as a count, a
mapping or a set never as a tuple, and the deployment entry points refuse a bad argument
before any process starts (``subprocess.Popen`` is replaced by a trap in those cases).
"""

import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from sklearn.utils._param_validation import InvalidParameterError

from skfedspd import EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.aggregation import GeometricMedian, Krum
from skfedspd.backends import LocalBackend
from skfedspd.clients import make_clients
from skfedspd.online import DomainAdaptation
from skfedspd.privacy import DPSGD, MAX_EPSILON, epsilon_spent, group_epsilon, plan_dp
from skfedspd.training import EpochSchedule, RoundSchedule
from skfedspd.validation import Count, Sequence, check_count, check_positive, is_count

from test_hostile_input import _assert_unchanged, _copy, _state

BOOLS = [True, False, np.True_]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_single_thread):
    yield


@pytest.fixture(scope="module")
def data():
    from conftest import make_spd_domains

    return make_spd_domains(n_groups=4, n_per_group=10, n_channels=4, seed=0)


@pytest.fixture(scope="module")
def fitted(data):
    X, y, _ = data
    return SPDnetClassifier(hidden_dims=(2,), max_epochs=1, random_state=0).fit(X, y)


# ------------------------------------------------------------------ the shared predicates
@pytest.mark.parametrize("value, minimum, expected", [
    (0, 0, True), (3, 1, True), (np.int64(3), 1, True), (-5, None, True), (0, 1, False),
    (True, 0, False), (False, 0, False), (np.True_, 0, False), (1.0, 0, False), (1.7, 0, False),
    ("1", 0, False), (None, 0, False), ([1], 0, False),
])
def test_is_count(value, minimum, expected):
    assert is_count(value, minimum) is expected
    assert Count(minimum).is_satisfied_by(value) is expected
    if not expected:
        with pytest.raises(ValueError, match="^n_things must be an int"):
            check_count(value, "n_things", minimum)


@pytest.mark.parametrize("value", [True, np.False_, 0, -1.0, float("inf"), float("nan"), "1", None])
def test_check_positive_names_the_field(value):
    with pytest.raises(ValueError, match="^round_timeout must be a finite positive number"):
        check_positive(value, "round_timeout")


@pytest.mark.parametrize("value, expected", [
    ((2,), True), ([4, 2], True), (np.array([4, 2]), True), ({2: "x"}, False), ({2}, False),
    (frozenset({2}), False), ("42", False), (b"42", False), (np.array(2), False), (2, False), (None, False),
])
def test_sequence(value, expected):
    assert Sequence().is_satisfied_by(value) is expected


# ------------------------------------------------------------------ counts refuse booleans in every estimator
def _eegnet(**kw):
    return EEGNetClassifier(**kw)


COUNT_PARAMS = [
    *[(SPDnetClassifier, name) for name in ("batch_size", "max_epochs", "recenter_every")],
    *[(_eegnet, name) for name in ("batch_size", "max_epochs", "F1", "D", "F2", "p1", "p2")],
    *[(FederatedSPDnetClassifier, name) for name in ("n_rounds", "local_epochs", "groups_per_client", "n_clients",
                                                     "clients_per_round", "n_jobs")],
    (DomainAdaptation, "max_domains"),
    *[(cls, name) for cls in (EpochSchedule, RoundSchedule) for name in ("patience", "lr_patience")],
    (GeometricMedian, "max_iter"), (Krum, "n_faulty"), (Krum, "n_selected"),
]


def _check(est):
    """The estimator's own parameter check (``fit`` runs it first)."""
    if hasattr(est, "check_params"):
        est.check_params()
    else:
        est._validate_params()


@pytest.mark.parametrize("value", BOOLS)
@pytest.mark.parametrize("factory, name", COUNT_PARAMS, ids=lambda v: getattr(v, "__name__", v))
def test_a_bool_is_never_a_count(factory, name, value):
    est = factory(**{name: value})
    before = est.get_params(deep=False)
    with pytest.raises(InvalidParameterError, match=rf"'{name}' parameter .*\(not a bool\)"):
        _check(est)
    assert est.get_params(deep=False) == before


@pytest.mark.parametrize("name", ["batch_size", "max_epochs", "recenter_every", "max_domains"])
def test_a_bool_count_refused_by_fit_leaves_the_fitted_model_unchanged(fitted, data, name):
    X, y, _ = data
    est = _copy(fitted).set_params(**{name: True})
    before = _state(est)
    with pytest.raises(InvalidParameterError, match=f"'{name}'"):
        est.fit(X, y)
    _assert_unchanged(before, est)


@pytest.mark.parametrize("name", ["n_rounds", "local_epochs", "n_clients"])
def test_a_bool_count_refused_by_a_federated_fit(data, name):
    X, y, groups = data
    fed = FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=(2,)), random_state=0, **{name: True})
    with pytest.raises(InvalidParameterError, match=f"'{name}'"):
        fed.fit(X, y)
    assert not fed.__sklearn_is_fitted__()


@pytest.mark.parametrize("dims", [{2: "x"}, {2}, frozenset({2}), "2", True, (True,), (2, 1.0), (), (0,), {}])
def test_hidden_dims_refuse_mappings_sets_and_bools(fitted, data, dims):
    X, y, _ = data
    est = _copy(fitted)
    before = _state(est)
    est.set_params(hidden_dims=dims)
    with pytest.raises(ValueError, match="hidden_dims"):
        est.fit(X, y)
    _assert_unchanged(before, est.set_params(hidden_dims=fitted.hidden_dims))


@pytest.mark.parametrize("classes", [{0: 1, 1: 2}, {0, 1}, "01"])
def test_federated_classes_refuse_mappings_and_sets(classes):
    with pytest.raises(InvalidParameterError, match="'classes'"):
        FederatedSPDnetClassifier(classes=classes).check_params()


# ------------------------------------------------------------------ counts of the plain functions
@pytest.mark.parametrize("value", [True, 0, 1.0, "2"])
def test_make_clients_refuses_a_bad_groups_per_client(value):
    with pytest.raises(ValueError, match="^groups_per_client must be an int >= 1"):
        make_clients(np.array([1, 1, 2, 2]), value)


PRIVACY_COUNTS = {
    "steps": lambda v: epsilon_spent(1.0, 1e-5, 0.1, v),
    "group_size": lambda v: group_epsilon(1.0, 1e-5, 10, group_size=v),
    "domain['layers']": lambda v: epsilon_spent(1.0, 1e-5, 0.1, 10, domain={"noise_multiplier": 1.0, "layers": v}),
    "batch_size": lambda v: plan_dp([100, 100], v, 1, 5, 1.0, 1.0),
    "local_epochs": lambda v: plan_dp([100, 100], 10, v, 5, 1.0, 1.0),
    "n_rounds": lambda v: plan_dp([100, 100], 10, 1, v, 1.0, 1.0),
    "n_train_per_site": lambda v: plan_dp([100, v], 10, 1, 5, 1.0, 1.0),
}


@pytest.mark.parametrize("value", [True, 1.5, "3"])
@pytest.mark.parametrize("name", list(PRIVACY_COUNTS))
def test_privacy_functions_refuse_a_bool_count(name, value):
    pytest.importorskip("dp_accounting")
    with pytest.raises(ValueError, match=f"^{re.escape(name)} must be"):
        PRIVACY_COUNTS[name](value)


@pytest.mark.parametrize("value", [True, float("inf"), 0.0])
def test_privacy_positive_numbers_refuse_bools_and_infinities(value):
    from skfedspd.dp_sgd import clip_and_sum, domain_mean_sensitivity

    with pytest.raises(ValueError, match="^clip_norm must be a finite positive number"):
        clip_and_sum({"w": torch.ones(2, 3)}, clip_norm=value)
    with pytest.raises(ValueError, match="^clip must be a finite positive number"):
        domain_mean_sensitivity(value)


# ------------------------------------------------------------------ messages that name the problem
@pytest.mark.parametrize("factor", [1e-310, 1e-320])
def test_a_subnormal_input_is_refused_as_too_small(fitted, data, factor):
    X, y, _ = data
    est = _copy(fitted)
    before = _state(est)
    with pytest.raises(ValueError) as error:
        est.fit(X * factor, y)
    message = str(error.value)
    assert message.startswith("X matrix 0 is too small") and "subnormal" in message and "inf" not in message
    _assert_unchanged(before, est)


@pytest.mark.parametrize("epsilon", [1e300, MAX_EPSILON * 1.01, float("inf"), 0.0, -1.0])
def test_dpsgd_epsilon_out_of_range_is_refused_up_front(epsilon):
    fed = FederatedSPDnetClassifier(privacy=DPSGD(epsilon=epsilon))
    before = fed.get_params(deep=False)
    with pytest.raises(ValueError, match="'epsilon' parameter of DPSGD"):
        fed.check_params()
    assert fed.get_params(deep=False) == before


def test_dpsgd_largest_epsilon_is_accepted():
    DPSGD(epsilon=MAX_EPSILON).check_params()


NESTED = [
    (lambda: SPDnetClassifier(), {"schedule__patience": 5}, "pass schedule=EpochSchedule(patience=5)"),
    (lambda: FederatedSPDnetClassifier(), {"schedule__patience": 5}, "pass schedule=RoundSchedule(patience=5)"),
    (lambda: FederatedSPDnetClassifier(aggregation="trimmedmean"), {"aggregation__trim": 0.1},
     "pass aggregation=TrimmedMean(trim=0.1)"),
    (lambda: FederatedSPDnetClassifier(aggregation="krum"), {"aggregation__n_faulty": 1},
     "pass aggregation=Krum(n_faulty=1)"),
    (lambda: FederatedSPDnetClassifier(), {"aggregation__trim": 0.1}, "an object that has the parameter 'trim'"),
    (lambda: FederatedSPDnetClassifier(), {"estimator__lr": 0.1}, "pass estimator=SPDnetClassifier(lr=0.1)"),
    (lambda: FederatedSPDnetClassifier(), {"server_optimizer__momentum": 0.5},
     "pass server_optimizer=ServerMomentum(momentum=0.5)"),
    (lambda: FederatedSPDnetClassifier(), {"privacy__epsilon": 1.0}, "pass privacy=DPSGD(epsilon=1.0)"),
    (lambda: FederatedSPDnetClassifier(), {"estimator__schedule__patience": 5},
     "pass estimator=SPDnetClassifier(schedule__patience=5)"),
]


@pytest.mark.parametrize("with_valid", [False, True])
@pytest.mark.parametrize("make, params, hint", NESTED, ids=lambda v: next(iter(v)) if isinstance(v, dict) else None)
def test_set_params_on_a_value_without_parameters_names_what_to_pass(make, params, hint, with_valid):
    est = make()
    before = est.get_params(deep=False)
    key = next(iter(params))
    params = {"verbose": True, **params} if with_valid else params  # nothing is set, not even the valid one
    with pytest.raises(ValueError, match="no parameters") as error:
        est.set_params(**params)
    assert str(error.value).startswith(f"{key}: {key.partition('__')[0]} is ") and hint in str(error.value)
    assert est.get_params(deep=False) == before


def test_set_params_of_a_nested_object_given_in_the_same_call_still_works():
    est = SPDnetClassifier().set_params(schedule=EpochSchedule(), schedule__patience=3)
    assert est.schedule == EpochSchedule(patience=3)


# ------------------------------------------------------------------ the deployment: refused before any process
flower = pytest.importorskip("flwr")
from skfedspd.flower import __main__ as cli  # noqa: E402
from skfedspd.flower import deploy  # noqa: E402
from skfedspd.flower.client import load_site_from_node_config  # noqa: E402


@pytest.fixture
def no_process(monkeypatch):
    """``subprocess.Popen`` replaced by a trap: the calls it got (none, for a refusal)."""
    started = []

    def trap(*args, **kwargs):
        started.append(args)
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess, "Popen", trap)
    return started


def _fed(**kw):
    return FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=(2,)), n_rounds=2, random_state=0, **kw)


def _args(tmp_path, **kw):
    args = dict(estimator=_fed(), superlink="127.0.0.1:9093", n_sites=2, output=str(tmp_path / "model.skfedspd"),
                insecure=True, quiet=True, log_path=str(tmp_path / "run.log"))
    return {**args, **kw}


def _bad_estimator(**params):
    est = _fed()
    est.__dict__.update(params)  # as a careless caller sets it, past set_params
    return est


BAD_DEPLOY_ARGS = {
    "n_rounds=-1": ({"estimator": _bad_estimator(n_rounds=-1)}, ValueError, "'n_rounds'"),
    "n_rounds=True": ({"estimator": _bad_estimator(n_rounds=True)}, ValueError, "'n_rounds'"),
    "estimator": ({"estimator": SPDnetClassifier()}, TypeError, "estimator must be"),
    "n_sites=-3": ({"n_sites": -3}, ValueError, "^n_sites must be"),
    "n_sites=0": ({"n_sites": 0}, ValueError, "^n_sites must be"),
    "n_sites=True": ({"n_sites": True}, ValueError, "^n_sites must be"),
    "n_sites=1.5": ({"n_sites": 1.5}, ValueError, "^n_sites must be"),
    "n_sites='2'": ({"n_sites": "2"}, ValueError, "^n_sites must be"),
    "superlink no port": ({"superlink": "127.0.0.1"}, ValueError, "^superlink must be"),
    "superlink port 0": ({"superlink": "127.0.0.1:0"}, ValueError, "^superlink must be"),
    "superlink port text": ({"superlink": "127.0.0.1:http"}, ValueError, "^superlink must be"),
    "superlink int": ({"superlink": 9093}, ValueError, "^superlink must be"),
    "output empty": ({"output": ""}, ValueError, "^output must be"),
    "output None": ({"output": None}, ValueError, "^output must be"),
    "round_timeout=0": ({"round_timeout": 0}, ValueError, "^round_timeout must be"),
    "round_timeout=inf": ({"round_timeout": float("inf")}, ValueError, "^round_timeout must be"),
    "round_timeout=True": ({"round_timeout": True}, ValueError, "^round_timeout must be"),
    "connect_timeout=-1": ({"connect_timeout": -1.0}, ValueError, "^connect_timeout must be"),
    "timeout=nan": ({"timeout": float("nan")}, ValueError, "^timeout must be"),
    "insecure='yes'": ({"insecure": "yes"}, TypeError, "^insecure must be"),
    "quiet=1": ({"quiet": 1}, TypeError, "^quiet must be"),
    "overwrite='no'": ({"overwrite": "no"}, TypeError, "^overwrite must be"),
    "secure_aggregation='yes'": ({"secure_aggregation": "yes"}, TypeError, "^secure_aggregation must be"),
    "secure with krum": ({"estimator": _fed(aggregation="krum"), "secure_aggregation": True}, ValueError,
                         "secure"),
    "both TLS modes": ({"root_certificates": "ca.crt"}, ValueError, "insecure=True or root_certificates"),
    "missing CA": ({"insecure": False, "root_certificates": "/nonexistent/ca.crt"}, FileNotFoundError,
                   "root_certificates="),
    "log_path dir": ({"log_path": "."}, ValueError, "^log_path must be"),
}


@pytest.mark.parametrize("case", list(BAD_DEPLOY_ARGS))
def test_fit_federated_refuses_a_bad_argument_before_starting_anything(tmp_path, no_process, case):
    changes, error, match = BAD_DEPLOY_ARGS[case]
    output = tmp_path / "model.skfedspd"
    output.write_bytes(b"the previous model")
    args = {**_args(tmp_path, overwrite=True), **changes}
    estimator = args["estimator"]
    before = dict(estimator.__dict__) if isinstance(estimator, FederatedSPDnetClassifier) else None
    with pytest.raises(error, match=match):
        deploy.fit_federated(**args)
    assert no_process == []
    assert output.read_bytes() == b"the previous model"  # overwrite=True deletes nothing before the checks
    assert not (tmp_path / "run.log").exists()
    if before is not None:
        assert estimator.__dict__ == before


def test_fit_federated_refuses_an_existing_output_without_overwrite(tmp_path, no_process):
    output = tmp_path / "model.skfedspd"
    output.write_bytes(b"the previous model")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        deploy.fit_federated(**_args(tmp_path))
    assert no_process == [] and output.read_bytes() == b"the previous model"


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """``flwr`` replaced by a script (``FAKE_FLWR``: its body), ``Popen`` recorded."""
    processes = []

    class Recording(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            processes.append(self)

    script = tmp_path / "fake-flwr"

    def write(body):
        script.write_text(f"#!{sys.executable}\n{body}\n")
        script.chmod(0o755)

    monkeypatch.setattr(subprocess, "Popen", Recording)
    monkeypatch.setattr(deploy, "_flwr_executable", lambda: str(script))
    return processes, write


def test_a_failed_run_closes_its_pipe_and_waits_for_its_process(tmp_path, recorded):
    processes, write = recorded
    write("import sys\nprint('INFO : starting')\nsys.exit(3)")
    with pytest.raises(RuntimeError, match="exit code 3"):
        deploy.fit_federated(**_args(tmp_path))
    (proc,) = processes
    assert proc.stdout.closed and proc.returncode == 3
    assert "starting" in (tmp_path / "run.log").read_text()


def test_a_run_past_its_timeout_is_killed_and_its_pipe_closed(tmp_path, recorded):
    processes, write = recorded
    write("import time\nprint('INFO : waiting', flush=True)\ntime.sleep(60)")
    with pytest.raises(TimeoutError, match="timeout=0.5"):
        deploy.fit_federated(**_args(tmp_path, timeout=0.5))
    (proc,) = processes
    assert proc.stdout.closed and proc.returncode is not None and proc.returncode != 0


# ------------------------------------------------------------------ n_jobs on Flower: warned
def test_n_jobs_with_the_flower_backend_is_warned():
    with pytest.warns(FutureWarning), pytest.warns(UserWarning, match="n_jobs=2 is ignored on Flower"):
        FederatedSPDnetClassifier(backend="flower", n_jobs=2)
    with pytest.warns(UserWarning, match="n_jobs=2 is ignored on Flower"):
        FederatedSPDnetClassifier(backend=LocalBackend(n_jobs=2)).warn_about_settings(on_flower=True)


@pytest.mark.parametrize("kwargs, on_flower", [({"backend": "flower"}, True), ({"backend": LocalBackend(n_jobs=1)}, True),
                                               ({"backend": LocalBackend(n_jobs=2)}, None)])
def test_n_jobs_warning_only_where_it_is_ignored(kwargs, on_flower):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FederatedSPDnetClassifier(**kwargs).warn_about_settings(on_flower=on_flower)


def test_fit_federated_warns_about_n_jobs(tmp_path, recorded):
    _, write = recorded
    write("import sys\nsys.exit(1)")
    with pytest.warns(UserWarning, match="n_jobs=4 is ignored on Flower"), pytest.raises(RuntimeError):
        deploy.fit_federated(**_args(tmp_path, estimator=_fed(backend=LocalBackend(n_jobs=4))))


# ------------------------------------------------------------------ the command line
CLI_BASE = ["fit", "--superlink", "127.0.0.1:9093", "--output", "model.skfedspd", "--insecure"]
BAD_CLI = {
    "params list": (["--n-sites", "2", "--params", "[1, 2]"], "argument --params: must be a JSON object"),
    "params not json": (["--n-sites", "2", "--params", "not json"], "argument --params: must be a JSON object"),
    "params string": (["--n-sites", "2", "--params", '"n_rounds"'], "argument --params: must be a JSON object"),
    "params null": (["--n-sites", "2", "--params", "null"], "argument --params: must be a JSON object"),
    "params bool count": (["--n-sites", "2", "--params", '{"n_rounds": true}'], "argument --params: .*'n_rounds'"),
    "params unknown": (["--n-sites", "2", "--params", '{"nope": 1}'], "argument --params: Invalid parameter 'nope'"),
    "params nested on None": (["--n-sites", "2", "--params", '{"schedule__patience": 5}'],
                              "argument --params: schedule__patience"),
    "params dims dict": (["--n-sites", "2", "--params", '{"estimator__hidden_dims": {"2": 1}}'],
                         "argument --params: .*'hidden_dims'"),
    "n-sites -3": (["--n-sites", "-3"], "argument --n-sites: must be an int >= 1"),
    "n-sites 0": (["--n-sites", "0"], "argument --n-sites: must be an int >= 1"),
    "n-sites 1.5": (["--n-sites", "1.5"], "argument --n-sites: must be an int >= 1"),
    "n-sites abc": (["--n-sites", "abc"], "argument --n-sites: must be an int >= 1"),
    "round-timeout 0": (["--n-sites", "2", "--round-timeout", "0"], "argument --round-timeout: must be a finite"),
    "round-timeout inf": (["--n-sites", "2", "--round-timeout", "inf"], "argument --round-timeout: must be a finite"),
    "connect-timeout nan": (["--n-sites", "2", "--connect-timeout", "nan"],
                            "argument --connect-timeout: must be a finite"),
}


@pytest.mark.parametrize("case", list(BAD_CLI))
def test_the_command_line_refuses_a_bad_argument_naming_it(capsys, no_process, case):
    argv, match = BAD_CLI[case]
    with pytest.raises(SystemExit) as exit_:
        cli.main(CLI_BASE + argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err
    assert "Traceback" not in err and no_process == []


# ------------------------------------------------------------------ node config and site files
@pytest.fixture
def site_file(tmp_path, data):
    X, y, _ = data
    path = tmp_path / "site0.npz"
    np.savez(path, X=X[:10], y=y[:10])
    return path


def _context(config):
    from flwr.app import Context, RecordDict

    return Context(run_id=1, node_id=7, node_config=config, state=RecordDict(), run_config={})


@pytest.mark.parametrize("client_id", ["abc", 1.7, 1.0, True, -1, "1", None])
def test_client_id_must_be_an_int_written_as_an_int(site_file, client_id):
    with pytest.raises(ValueError, match=r"--node-config: client-id must be an int >= 0 .*got"):
        load_site_from_node_config(_context({"client-id": client_id, "data-path": str(site_file)}))


def test_a_valid_client_id_is_read(site_file):
    assert load_site_from_node_config(_context({"client-id": 3, "data-path": str(site_file)}))[0] == 3


def _random_bytes(path, X, y):
    path.write_bytes(np.random.default_rng(0).bytes(512))


def _truncated(path, X, y):
    np.savez(path, X=X, y=y)
    path.write_bytes(path.read_bytes()[:200])


BAD_SITE_FILES = {
    "random bytes": (_random_bytes, "read it as a pickle"),
    "truncated": (_truncated, "not a zip file|zip"),
    "object arrays": (lambda p, X, y: np.savez(p, X=np.array([object()] * 3, dtype=object), y=y[:3]), "pickle"),
    "a .npy": (lambda p, X, y: np.save(open(p, "wb"), X), "one array"),
    "no y": (lambda p, X, y: np.savez(p, X=X), "no y array"),
    "no X": (lambda p, X, y: np.savez(p, data=X, y=y), "no X array"),
    "empty": (lambda p, X, y: p.write_bytes(b""), "."),
}


@pytest.mark.parametrize("case", list(BAD_SITE_FILES))
def test_a_corrupt_site_file_is_refused_naming_it(tmp_path, data, case):
    X, y, _ = data
    write, reason = BAD_SITE_FILES[case]
    path = tmp_path / "site0.npz"
    write(path, X[:10], y[:10])
    with pytest.raises(ValueError) as error:
        load_site_from_node_config(_context({"client-id": 0, "data-path": str(path)}))
    message = str(error.value)
    assert message.startswith(f"site data file {path} is not a valid .npz site file")
    assert re.search(reason, message, flags=re.IGNORECASE), message
    assert "allow_pickle" not in message

