"""A Flower deployment on this machine: one SuperLink and one SuperNode per site, each a
separate process on 127.0.0.1 with its own ``FLWR_HOME``, stopped by PID.

For the deployment test, the benchmark and trying the setup of ``docs/deployment.md``
before going multi-machine. Plain HTTP (``--insecure``) because everything stays on the
loopback interface; real sites use TLS (see the guide).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from .deploy import flower_env

__all__ = ["LoopbackDeployment", "free_port"]


def free_port():
    """A TCP port of 127.0.0.1 that is free now (the OS's choice).

    Examples
    --------
    >>> from skfedspd.flower.loopback import free_port
    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LoopbackDeployment:
    """Context manager: a SuperLink and ``len(site_paths)`` SuperNodes on 127.0.0.1.

    SuperNode ``i`` gets ``--node-config 'client-id=i data-path="site_paths[i]"'``.

    Parameters
    ----------
    site_paths : list of str
        Each site's ``.npz`` (arrays ``X`` and ``y``).
    root : str or None
        Folder for the processes' Flower homes and logs (a new temporary one if None,
        removed at exit unless ``keep=True``).
    superexec_poll : float
        ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` of the SuperNodes' and SuperLink's SuperExec
        (Flower's default is 1 s; a shorter poll starts each ClientApp sooner).

    Examples
    --------
    Two sites, each holding its own ``.npz`` file, and a two-round run through
    :func:`~skfedspd.flower.fit_federated` (skipped in the doctests: it starts processes
    and takes minutes; ``examples/plot_06_loopback_deployment.py`` runs it):

    >>> import numpy as np
    >>> from skfedspd import FederatedSPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.flower import fit_federated
    >>> from skfedspd.flower.loopback import LoopbackDeployment
    >>> X, y = make_spd_classification(n_matrices=40, n_channels=4, n_classes=2)
    >>> np.savez("site0.npz", X=X[:20], y=y[:20]); np.savez("site1.npz", X=X[20:], y=y[20:])  # doctest: +SKIP
    >>> with LoopbackDeployment(["site0.npz", "site1.npz"]) as deployment:  # doctest: +SKIP
    ...     fed = fit_federated(FederatedSPDnetClassifier(n_rounds=2, random_state=0), deployment.address,
    ...                         n_sites=2, output="model.pkl", insecure=True, quiet=True)
    >>> fed.n_clients_  # doctest: +SKIP
    2
    """

    def __init__(self, site_paths, root=None, superexec_poll=0.1, startup_timeout=120.0, keep=False):
        self.site_paths = [str(Path(p).absolute()) for p in site_paths]
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="skfedspd-loopback-") if root is None else root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.superexec_poll = superexec_poll
        self.startup_timeout = startup_timeout
        self.keep = keep
        self.processes = {}
        self.address = None

    # ------------------------------------------------------------------ processes
    def _env(self, name):
        home = self.root / name / "flwr-home"
        home.mkdir(parents=True, exist_ok=True)
        env = flower_env(home)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(self.superexec_poll)
        return env

    def _start(self, name, command):
        log = open(self.root / f"{name}.log", "w")
        try:
            # A session of its own: the process and the SuperExec / app processes it starts
            # form one process group, signalled through this PID at exit.
            proc = subprocess.Popen(command, env=self._env(name), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.root, start_new_session=True)
        finally:
            log.close()
        self.processes[name] = proc
        return proc

    def _bin(self, name):
        local = Path(sys.executable).with_name(name)
        return str(local) if local.exists() else name

    def _healthy(self):
        try:
            with urllib.request.urlopen(f"http://{self.address}/health", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def start(self):
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        superlink = self._start("superlink", [
            self._bin("flower-superlink"), "--insecure", "--isolation", "subprocess",
            "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(port)])
        deadline = time.monotonic() + self.startup_timeout
        while not self._healthy():
            if superlink.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with {superlink.returncode}:\n{self.log('superlink')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"flower-superlink not healthy after {self.startup_timeout:.0f} s")
            time.sleep(0.2)
        for cid, path in enumerate(self.site_paths):
            self._start(f"supernode-{cid}", [
                self._bin("flower-supernode"), "--insecure", "--superlink", self.address,
                "--host", "127.0.0.1", "--port", str(free_port()),
                "--node-config", f'client-id={cid} data-path="{path}"'])
        return self

    def stop(self, grace=10.0):
        """SIGTERM each started process group (by the PID of its leader), SIGKILL after
        ``grace`` seconds."""
        for proc in self.processes.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for proc in self.processes.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.processes.values():
            try:  # the group may outlive its leader (a ClientApp still running)
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        deadline = time.monotonic() + grace
        while any(_group_alive(proc.pid) for proc in self.processes.values()) and time.monotonic() < deadline:
            time.sleep(0.05)  # orphans of a killed leader wait for init to reap them

    def log(self, name):
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc):
        self.stop()
        if self._own_root and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
        return False
