"""Tests for a Flower deployment on 127.0.0.1 (``skfedspd.flower.loopback``,
``skfedspd.flower.runtime``, ``skfedspd.flower.deploy``).

The deployment test starts a SuperLink and 2 SuperNodes in Flower's process isolation
mode, each with its long-lived app process, runs 3 rounds through ``fit_federated``, and
checks the model against the local backend's bit for bit, that every site read its data
file at most twice (the ClientApp's prepared state lives across messages) and that every
process started is gone afterwards (by PID). About 20 s on two idle CPU cores; alone:
``pytest -q tests/test_flower_deployment.py``.

Telemetry and update checks are off (set here before flwr is imported); nothing leaves
the loopback interface.
"""

import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("flwr")
psutil = pytest.importorskip("psutil")

from conftest import make_spd_dataset  # noqa: E402
from skfedspd.flower import fit_federated  # noqa: E402
from skfedspd.flower.deploy import RoundProgress  # noqa: E402
from skfedspd.flower.loopback import LoopbackDeployment  # noqa: E402
from skfedspd.flower.runtime import Backoff  # noqa: E402
from skfedspd.persistence import load_estimator  # noqa: E402
from test_flower import _fed, assert_same_model  # noqa: E402

# A site's data loader that records each call: run by the sites' ClientApp processes.
COUNTING_LOADER = '''
import numpy as np

def load(path):
    with open(path + ".loads", "a") as f:
        f.write("load\\n")
    with np.load(path, allow_pickle=False) as data:
        return data["X"], data["y"]
'''


def _gone(pid):
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    return False


@pytest.mark.slow
def test_loopback_deployment_long_lived_equals_local(tmp_path, monkeypatch):
    X, y = make_spd_dataset(60, 6, 3, seed=0)
    groups = np.repeat([0, 1], 30)
    paths = []
    for g in (0, 1):
        path = tmp_path / f"site{g}.npz"
        np.savez(path, X=X[groups == g], y=y[groups == g])  # each site holds its own file
        paths.append(path)
    (tmp_path / "counting_loader.py").write_text(COUNTING_LOADER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    config = dict(n_rounds=3, n_clients=2)
    local = _fed("local", **config).fit(X, y, groups=groups)

    deployment = LoopbackDeployment(paths, root=tmp_path / "flower", node_config={"data-loader": "counting_loader:load"})
    with deployment:
        assert set(deployment.processes) == {"superlink", "serverapp", "supernode-0", "clientapp-0",
                                             "supernode-1", "clientapp-1"}
        assert deployment.address.startswith("127.0.0.1:")
        pids = [p.pid for p in deployment.processes.values()]
        try:
            remote = fit_federated(_fed("local", **config), deployment.address, 2, tmp_path / "model.skfedspd",
                                   insecure=True, round_timeout=120, connect_timeout=120, timeout=240, quiet=True)
        except Exception:
            for name in deployment.processes:
                print(f"---- {name}\n{deployment.log(name)[-3000:]}")
            raise
        # Long-lived: every message was served by the processes started above, none by a new one.
        for proc in deployment.processes.values():
            assert proc.poll() is None
            assert psutil.Process(proc.pid).children(recursive=True) == []
    assert all(_gone(pid) for pid in pids)  # every process (group) stopped at exit

    assert_same_model(local, remote)
    written = load_estimator(tmp_path / "model.skfedspd")  # what the server wrote: data only, no pickle
    np.testing.assert_array_equal(written.predict_proba(X), local.predict_proba(X))
    assert remote.client_source_ == "flower:client-id"
    for path in paths:  # 7 messages per site: the data were read for the set-up, then kept
        assert 1 <= len((path.parent / (path.name + ".loads")).read_text().splitlines()) <= 2
    log = (tmp_path / "model.skfedspd.log").read_text()  # the default log, next to the model
    assert "SPDnetStrategy" in log and "model written to" in log and "\x1b[" not in log
    assert "site0.npz" not in log and "site1.npz" not in log  # paths stay on the sites


def test_round_progress_reads_the_server_log():
    """One step per round the strategy closes (its own log line, not Flower's metrics
    lines); a round without validation score (DP mode) advances without one."""
    progress = RoundProgress(4, disable=True)
    for line in ["INFO :      [ROUND 1/3]",
                 "INFO :      \t└──> Aggregated MetricRecord: {'val-loss': 0.9, 'val-f1': 0.6111, 'lr': 0.05}",
                 "INFO :      FedSPDnet round 0 done: val-f1 0.6111",
                 "INFO :      [ROUND 2/3]",
                 "INFO :      FedSPDnet round 1 done: val-f1 0.5",
                 "INFO :      FedSPDnet round 2 done: val-f1 nan"]:
        progress.feed(line)
    assert progress.scores == [0.6111, 0.5] and progress.rounds == 3
    progress.close()


def test_input_checks():
    with pytest.raises(ValueError, match="isolation"):
        LoopbackDeployment([], isolation="thread")
    with pytest.raises(ValueError, match="floor"):
        Backoff(floor=1.0, cap=0.5)
    backoff = Backoff(floor=0.01, cap=0.02, factor=3.0)
    backoff.sleep()
    assert backoff.delay == 0.02
    backoff.reset()
    assert backoff.delay == 0.01
