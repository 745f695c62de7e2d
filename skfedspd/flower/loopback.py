"""A Flower deployment on this machine: one SuperLink and one SuperNode per site, each a
separate process on 127.0.0.1 with its own ``FLWR_HOME``, stopped by PID.

For the deployment test, the benchmark and trying the setup of ``docs/guide/deployment.md``
before going multi-machine. Plain HTTP (``--insecure``) because everything stays on the
loopback interface; real sites use TLS (see the guide).
"""

import json
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

    SuperNode ``i`` gets ``--node-config 'client-id=i data-path="site_paths[i]"'`` (and
    ``node_config``).

    With ``isolation="process"`` (default) the SuperLink and the SuperNodes run in Flower's
    process isolation mode, each with one long-lived app process of
    :mod:`skfedspd.flower.runtime` (``serverapp`` next to the SuperLink, ``clientapp`` next to
    each SuperNode) that runs every task of the run in-process, and the SuperNodes poll the
    SuperLink with a back-off (``python -m skfedspd.flower.runtime supernode``): a round costs
    its computation plus Flower's message transport. ``isolation="subprocess"``
    is Flower's default, for comparison: a new ``flwr-clientapp`` process (Python, torch,
    skfedspd imports) per message and Flower's 3 s polls.

    Parameters
    ----------
    site_paths : list of str
        Each site's ``.npz`` (arrays ``X`` and ``y``).
    root : str or None
        Folder for the processes' Flower homes and logs (a new temporary one if None,
        removed at exit unless ``keep=True``).
    node_config : dict or None
        More ``--node-config`` entries for every SuperNode, e.g.
        ``{"data-loader": "mypackage.io:load"}``.
    isolation : {"process", "subprocess"}
        How apps run (see above).
    max_poll : float
        Longest idle poll of the SuperNodes and app processes, seconds (``"process"``).
    superexec_poll : float
        ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` of Flower's SuperExecs (``"subprocess"``;
        Flower's default is 1 s).
    torch_threads : int or None
        ``OMP_NUM_THREADS`` of every process (the sites share this machine's cores; torch's
        intra-op threads spin-wait on a busy machine). None: inherited.
    startup_timeout : float
        Seconds to wait for the SuperLink to be healthy.
    keep : bool
        Keep the temporary ``root`` (logs) after exit.

    Attributes
    ----------
    address : str
        The SuperLink's ``host:port`` once started.
    processes : dict
        ``{name: subprocess.Popen}`` of every process started (``superlink``,
        ``serverapp``, ``supernode-i``, ``clientapp-i``), each the leader of its own process
        group, stopped by PID at exit.

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
    ...                         n_sites=2, output="model.skfedspd", insecure=True, quiet=True)
    >>> fed.n_clients_  # doctest: +SKIP
    2
    """

    def __init__(self, site_paths, root=None, *, node_config=None, isolation="process", max_poll=0.5,
                 superexec_poll=0.1, torch_threads=1, startup_timeout=120.0, keep=False):
        if isolation not in ("process", "subprocess"):
            raise ValueError(f"isolation must be 'process' or 'subprocess', got {isolation!r}")
        self.site_paths = [str(Path(p).absolute()) for p in site_paths]
        self.node_config = dict(node_config or {})
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="skfedspd-loopback-") if root is None else root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.isolation = isolation
        self.max_poll = max_poll
        self.superexec_poll = superexec_poll
        self.torch_threads = torch_threads
        self.startup_timeout = startup_timeout
        self.keep = keep
        self.processes = {}
        self.address = None

    # ------------------------------------------------------------------ processes
    def _env(self, home):
        home = self.root / home / "flwr-home"
        home.mkdir(parents=True, exist_ok=True)
        env = flower_env(home)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(self.superexec_poll)
        if self.torch_threads is not None:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.torch_threads)
        return env

    def _start(self, name, command, home=None):
        """Start ``command`` logging to ``<root>/<name>.log``; ``home``: whose Flower home
        (an app process shares its SuperNode's or SuperLink's)."""
        log = open(self.root / f"{name}.log", "w")
        try:
            # A session of its own: the process and the SuperExec / app processes it starts
            # form one process group, signalled through this PID at exit.
            proc = subprocess.Popen(command, env=self._env(home or name), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.root, start_new_session=True)
        finally:
            log.close()
        self.processes[name] = proc
        return proc

    def _bin(self, name):
        local = Path(sys.executable).with_name(name)
        return str(local) if local.exists() else name

    def _runtime(self, *args):
        return [sys.executable, "-m", "skfedspd.flower.runtime", *args]

    # Imported by the app processes at start, not in the first round (torch's first optimizer
    # imports torch._dynamo: seconds).
    PRELOAD = ("--preload", "skfedspd.flower.app", "torch._dynamo")

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
            self._bin("flower-superlink"), "--insecure", "--isolation", self.isolation,
            "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(port)])
        deadline = time.monotonic() + self.startup_timeout
        while not self._healthy():
            if superlink.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with {superlink.returncode}:\n{self.log('superlink')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"flower-superlink not healthy after {self.startup_timeout:.0f} s")
            time.sleep(0.2)
        long_lived = self.isolation == "process"
        if long_lived:
            self._start("serverapp", self._runtime("serverapp", "--runtime-api-address", self.address, "--insecure",
                                                   "--max-poll", str(self.max_poll), "--parent-pid",
                                                   str(superlink.pid), *self.PRELOAD), home="superlink")
        for cid, path in enumerate(self.site_paths):
            name, runtime_port = f"supernode-{cid}", free_port()
            options = ["--insecure", "--superlink", self.address, "--isolation", self.isolation,
                       "--host", "127.0.0.1", "--port", str(runtime_port),
                       "--node-config", " ".join(f"{key}={json.dumps(value)}" for key, value in
                                                 {"client-id": cid, "data-path": path, **self.node_config}.items())]
            if not long_lived:
                self._start(name, [self._bin("flower-supernode"), *options])
                continue
            supernode = self._start(name, self._runtime("supernode", "--max-poll", str(self.max_poll), *options))
            self._start(f"clientapp-{cid}", self._runtime(
                "clientapp", "--runtime-api-address", f"127.0.0.1:{runtime_port}", "--insecure",
                "--max-poll", str(self.max_poll), "--parent-pid", str(supernode.pid), *self.PRELOAD), home=name)
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
