"""Launch a FedSPDnet run on a Flower deployment and get the fitted model back.

The sites run SuperNodes that hold their data (``docs/guide/deployment.md``); the researcher
calls :func:`fit_federated`, which writes the Flower App (:func:`write_app`: a
``pyproject.toml`` naming :mod:`skfedspd.flower.app`), submits it with ``flwr run`` to
the SuperLink, writes the server's streamed log to a file while a progress bar shows the
rounds, and loads the model that the ServerApp wrote.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import tomli_w
from sklearn.base import clone

from .. import spec as _spec
from ..backends import FlowerBackend
from ..federated import FederatedSPDnetClassifier
from ..persistence import load_estimator
from ..validation import check_count, check_positive
from ._internals import SUPPORTED_FLWR
from .progress import RoundProgress

__all__ = ["write_app", "fit_federated", "flower_env"]

APP_PYPROJECT = f"""\
# FedSPDnet (skfedspd) as a Flower App. The code is the installed skfedspd[flower] on the
# SuperLink and on every SuperNode: this bundle carries configuration only.
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "skfedspd-fedspdnet"
version = "0.1.0"
description = "FedSPDnet (SPDnet on EEG covariance matrices) with skfedspd"
license = "BSD-3-Clause"
dependencies = ["flwr{SUPPORTED_FLWR}", "skfedspd[flower]"]

[tool.flwr.app]
publisher = "skfedspd"

[tool.flwr.app.components]
serverapp = "skfedspd.flower.app:server_app"
clientapp = "skfedspd.flower.app:client_app"

[tool.flwr.app.config]
estimator = ""
output = ""
n-sites = 2
round-timeout = 3600.0
connect-timeout = 600.0
"""

CONNECTION = "skfedspd"


def flower_env(flwr_home, base=None):
    """Environment for a Flower process: its own ``FLWR_HOME``, telemetry and update
    checks off.

    Examples
    --------
    >>> from skfedspd.flower.deploy import flower_env
    >>> env = flower_env("/srv/site0/flwr-home", base={"PATH": "/usr/bin"})
    >>> sorted(env.items())  # doctest: +NORMALIZE_WHITESPACE
    [('FLWR_DISABLE_UPDATE_CHECK', '1'), ('FLWR_HOME', '/srv/site0/flwr-home'),
     ('FLWR_TELEMETRY_ENABLED', '0'), ('PATH', '/usr/bin')]
    """
    env = dict(os.environ if base is None else base)
    env.update(FLWR_HOME=str(flwr_home), FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    return env


def _flwr_executable():
    local = Path(sys.executable).with_name("flwr")
    found = str(local) if local.exists() else shutil.which("flwr")
    if not found:
        raise FileNotFoundError("the `flwr` command was not found: install skfedspd[flower]")
    return found


def write_app(directory):
    """Write the FedSPDnet Flower App (its ``pyproject.toml``) into ``directory``.

    Examples
    --------
    The App that ``flwr run`` submits (``python -m skfedspd.flower write-app DIR`` does the
    same):

    >>> import tempfile
    >>> from skfedspd.flower import write_app
    >>> folder = tempfile.TemporaryDirectory()
    >>> app = write_app(folder.name)
    >>> text = (app / "pyproject.toml").read_text()
    >>> 'serverapp = "skfedspd.flower.app:server_app"' in text, 'clientapp = "skfedspd.flower.app:client_app"' in text
    (True, True)
    >>> folder.cleanup()
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pyproject.toml").write_text(APP_PYPROJECT)
    return directory


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _default_log_path(output):
    """Next to the model where that folder is on this machine, else a temporary file."""
    if output.parent.is_dir():
        return output.with_name(output.name + ".log")
    fd, path = tempfile.mkstemp(prefix="skfedspd-flower-", suffix=".log")
    os.close(fd)
    return Path(path)


def _check_arguments(estimator, superlink, n_sites, output, *, insecure, root_certificates, round_timeout,
                     connect_timeout, timeout, overwrite, log_path, quiet, secure_aggregation):
    """:func:`fit_federated`'s arguments, every one checked before anything is written or
    started (a ValueError or TypeError naming the argument); returns the estimator to run
    (its parameters checked, ``secure_aggregation`` applied), ``n_sites`` as an int and the
    absolute ``output``."""
    if not isinstance(estimator, FederatedSPDnetClassifier):
        raise TypeError(f"estimator must be a FederatedSPDnetClassifier, got {type(estimator).__name__}")
    host, _, port = superlink.rpartition(":") if isinstance(superlink, str) else ("", "", "")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"superlink must be the SuperLink's address 'host:port' (port 1..65535), got {superlink!r}")
    n_sites = check_count(n_sites, "n_sites", 1)
    if not isinstance(output, (str, os.PathLike)) or not os.fspath(output):
        raise ValueError(f"output must be a file path (where the server writes the model), got {output!r}")
    for name, value in (("insecure", insecure), ("overwrite", overwrite), ("quiet", quiet)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    if secure_aggregation is not None and not isinstance(secure_aggregation, bool):
        raise TypeError(f"secure_aggregation must be None, True or False, got {secure_aggregation!r}")
    if insecure and root_certificates:
        raise ValueError("pass either insecure=True or root_certificates, not both")
    if root_certificates is not None and not Path(root_certificates).is_file():
        raise FileNotFoundError(f"root_certificates={root_certificates!r} is not a file (the CA certificate, PEM)")
    check_positive(round_timeout, "round_timeout")
    check_positive(connect_timeout, "connect_timeout")
    if timeout is not None:
        check_positive(timeout, "timeout")
    if log_path is not None and (not isinstance(log_path, (str, os.PathLike)) or os.path.isdir(log_path)):
        raise ValueError(f"log_path must be None or the path of a file to write, got {log_path!r}")
    if secure_aggregation is not None:
        estimator = clone(estimator).set_params(backend=FlowerBackend(secure_aggregation=secure_aggregation))
    estimator.check_params()
    estimator.warn_about_settings(on_flower=True)  # before a refusal below: the settings are the user's to fix too
    output = Path(output).absolute()
    if output.exists() and not overwrite:
        raise FileExistsError(f"{output} exists (overwrite=True replaces it)")
    return estimator, n_sites, output


def fit_federated(estimator, superlink, n_sites, output, *, insecure=False, root_certificates=None,
                  round_timeout=3600.0, connect_timeout=600.0, timeout=None, overwrite=False,
                  log_path=None, quiet=False, secure_aggregation=None):
    """Train ``estimator`` on the sites of a running Flower deployment.

    Parameters
    ----------
    estimator : FederatedSPDnetClassifier
        The configuration (its ``backend`` serves only for ``secure_aggregation``: a local
        backend's ``n_jobs`` is ignored, with a ``UserWarning`` when not None or 1); JSON values only: an int ``random_state``, an
        aggregation rule by name.
    superlink : str
        The SuperLink's address ``host:port`` (its ``--host``/``--port``).
    n_sites : int
        SuperNodes to wait for; their ``client-id`` must be ``0..n_sites-1``.
    output : str
        Where the ServerApp writes the fitted estimator, **on the SuperLink's machine**;
        read back from here when that is this machine (or a shared file system).
    insecure : bool
        Plain HTTP to the SuperLink (tests on 127.0.0.1 only).
    root_certificates : str or None
        CA certificate (PEM) that signed the SuperLink's TLS certificate.
    round_timeout, connect_timeout : float
        Seconds to wait for one round's replies / for the sites to connect.
    timeout : float or None
        Wall-clock limit of the whole run (``flwr run`` is stopped, then an error).
    overwrite : bool
        Replace an existing ``output`` (otherwise an error).
    log_path : str or None
        Where to write the run's log (``flwr run`` and the server's log, streamed).
        None: ``<output>.log`` when the folder of ``output`` exists on this machine, else
        a new temporary file; its path is in the error of a failed run.
    quiet : bool
        No progress bar. Otherwise a bar on standard error advances per round and shows
        the global model's pooled validation macro-F1 (``val_f1``) and the best so far;
        nothing else reaches the console.
    secure_aggregation : bool or None
        Run the rounds under Flower's SecAgg+ (the server sees only sums; see
        ``docs/guide/privacy.md``); None: the estimator's own (``backend=FlowerBackend(secure_aggregation=True)``). It travels
        in the run configuration with the estimator's spec.

    Returns
    -------
    FederatedSPDnetClassifier
        Fitted, as written by the server (``history_``, ``global_estimator_``...).

    Raises
    ------
    ValueError, TypeError, FileNotFoundError, FileExistsError
        An argument (or a parameter of ``estimator``) is invalid, naming it: every one is
        checked before anything is written or ``flwr run`` is started.
    RuntimeError, TimeoutError
        The run failed or took longer than ``timeout`` (``flwr run``'s pipe is closed and
        its process waited for on every path).

    Examples
    --------
    Each site saves its data for its SuperNode (``--node-config 'client-id=<i>
    data-path="site<i>.npz"'``, ``docs/guide/deployment.md``; optionally with a ``sample_weight``
    array, which the site trains with as ``fit(..., sample_weight=...)`` does on the local
    backend, and a ``groups`` array, its subjects or sessions: the domains of
    ``batchnorm="domain"``); the researcher then submits the
    run to the SuperLink. That step needs a running deployment and is skipped here
    (:class:`~skfedspd.flower.loopback.LoopbackDeployment` starts one on this machine):

    >>> import os
    >>> import tempfile
    >>> import numpy as np
    >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.flower import fit_federated
    >>> folder = tempfile.TemporaryDirectory()
    >>> X, y = make_spd_classification(n_matrices=60, n_channels=4, n_classes=2, seed=0)
    >>> for i, part in enumerate(np.array_split(np.arange(60), 3)):  # one file per site
    ...     np.savez(os.path.join(folder.name, f"site{i}.npz"), X=X[part], y=y[part])
    >>> sorted(os.listdir(folder.name))
    ['site0.npz', 'site1.npz', 'site2.npz']
    >>> fed = FederatedSPDnetClassifier(SPDnetClassifier(), n_rounds=50, random_state=0)
    >>> fed = fit_federated(fed, "superlink.example.org:9093", n_sites=3,  # doctest: +SKIP
    ...                     output="/srv/fedspdnet/model.skfedspd", root_certificates="ca.crt")
    >>> fed.n_clients_, len(fed.history_)  # doctest: +SKIP
    (3, 50)
    >>> folder.cleanup()
    """
    estimator, n_sites, output = _check_arguments(
        estimator, superlink, n_sites, output, insecure=insecure, root_certificates=root_certificates,
        round_timeout=round_timeout, connect_timeout=connect_timeout, timeout=timeout, overwrite=overwrite,
        log_path=log_path, quiet=quiet, secure_aggregation=secure_aggregation)
    run_config = {"estimator": _spec.dumps(_spec.estimator_to_spec(estimator)), "output": str(output),
                  "n-sites": n_sites, "round-timeout": float(round_timeout),
                  "connect-timeout": float(connect_timeout)}
    if output.exists():
        output.unlink()
    log_path = Path(log_path) if log_path is not None else _default_log_path(output)
    with tempfile.TemporaryDirectory(prefix="skfedspd-flwr-") as tmp:
        tmp = Path(tmp)
        app = write_app(tmp / "app")
        home = tmp / "flwr-home"
        home.mkdir()
        connection = {"address": str(superlink)}
        if insecure:
            connection["insecure"] = True
        elif root_certificates:
            connection["root-certificates"] = str(Path(root_certificates).absolute())
        (home / "config.toml").write_text(tomli_w.dumps({"superlink": {"default": CONNECTION,
                                                                         CONNECTION: connection}}))
        overrides = tmp / "run-config.toml"
        overrides.write_text(tomli_w.dumps(run_config))
        command = [_flwr_executable(), "run", str(app), CONNECTION, "--run-config", str(overrides), "--stream"]
        tail = []
        expired = threading.Event()
        # the log file first (a bad log_path starts nothing); leaving the Popen block closes its
        # pipe and waits for the process, on every path
        with open(log_path, "w") as log_file, subprocess.Popen(
                command, env=flower_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                cwd=tmp) as proc:

            def expire():
                expired.set()
                proc.kill()

            progress = RoundProgress(estimator.n_rounds, disable=quiet)
            watchdog = threading.Timer(timeout, expire) if timeout is not None else None
            try:
                if watchdog:
                    watchdog.start()
                for line in proc.stdout:
                    line = _ANSI.sub("", line)
                    log_file.write(line)
                    tail = (tail + [line])[-40:]
                    progress.feed(line)
                proc.wait()
            except BaseException:
                proc.kill()
                raise
            finally:
                progress.close()
                if watchdog:
                    watchdog.cancel()
    if expired.is_set():
        raise TimeoutError(f"the Flower run took more than timeout={timeout} s (log: {log_path})")
    if proc.returncode != 0 or not output.exists():
        raise RuntimeError(f"the Flower run did not produce {output} (flwr run exit code {proc.returncode}; "
                           f"log: {log_path}):\n{''.join(tail)}")
    return load_estimator(output)
