"""Where a federated fit runs: :class:`LocalBackend`, :class:`FlowerBackend`, and the registry
of transports by name (:data:`BACKEND_GROUP`), below every transport.
"""

import os
from importlib.metadata import entry_points

from .training import Settings
from .validation import Count

__all__ = ["LocalBackend", "FlowerBackend", "BACKEND_GROUP", "backend_names", "resolve_backend", "uses_secure_aggregation"]

#: The entry-point group of the transports: an installed package registers one as
#: ``name = "module:function"``, ``function(run, data) -> FederatedResult`` with the
#: :class:`~skfedspd.run.FederatedRun` and the :class:`~skfedspd.run.ClientData`. skfedspd
#: registers ``"flower"`` (:func:`skfedspd.flower.simulation_fit.fit_simulation`), so that the
#: core never imports its Flower wing; ``"local"`` (:func:`skfedspd.local.fit_local`) is built in.
BACKEND_GROUP = "skfedspd.backends"


def backend_names():
    """The names ``FederatedSPDnetClassifier(backend=...)`` accepts.

    Examples
    --------
    >>> from skfedspd.backends import backend_names
    >>> sorted(backend_names())
    ['flower', 'local']
    """
    return {"local"} | {ep.name for ep in entry_points(group=BACKEND_GROUP)}


class LocalBackend(Settings):
    """The clients' sites in this process (``"local"``: the defaults).

    Parameters
    ----------
    n_jobs : int or None, default=None
        Processes for the clients' local training (None or 1: serial); the same model bit
        for bit.
    checkpoint_path : str, path-like or None, default=None
        The federated state is written there after every round (:mod:`skfedspd.persistence`);
        a fit that finds a checkpoint of the same configuration and data resumes from it.

    Examples
    --------
    >>> from skfedspd.backends import LocalBackend
    >>> LocalBackend(n_jobs=2)
    LocalBackend(n_jobs=2)
    """

    name = "local"
    _parameter_constraints = {"n_jobs": [None, Count(None)], "checkpoint_path": [None, str, os.PathLike]}

    def __init__(self, n_jobs=None, checkpoint_path=None):
        self.n_jobs = n_jobs
        self.checkpoint_path = checkpoint_path

    def check_params(self):
        """:meth:`Settings.check_params`, and ``checkpoint_path`` not a directory."""
        super().check_params()
        if self.checkpoint_path is not None and os.path.isdir(self.checkpoint_path):
            raise ValueError(f"checkpoint_path={os.fspath(self.checkpoint_path)!r} is a directory; give the path of "
                             "a file to write (e.g. inside it: 'checkpoint.safetensors')")


class FlowerBackend(Settings):
    """A Flower simulation, one virtual SuperNode per client (the ``flower`` extra;
    ``"flower"``: the defaults), bit for bit the local backend's model.

    Parameters
    ----------
    secure_aggregation : bool, default=False
        Replies reach the server only as sums (Flower's SecAgg+, :mod:`skfedspd.flower.secure`);
        needs "projavg" or "rlavg" and at least 3 clients per round
        (``docs/guide/privacy.md``).

    Examples
    --------
    >>> from skfedspd.backends import FlowerBackend
    >>> FlowerBackend(secure_aggregation=True).secure_aggregation
    True
    """

    name = "flower"
    _parameter_constraints = {"secure_aggregation": ["boolean"]}

    def __init__(self, secure_aggregation=False):
        self.secure_aggregation = secure_aggregation


def resolve_backend(backend):
    """The settings of ``backend``: a name of :func:`backend_names` or a settings object.

    Examples
    --------
    >>> from skfedspd.backends import resolve_backend
    >>> resolve_backend("local")
    LocalBackend()
    """
    if isinstance(backend, str):
        return {"local": LocalBackend, "flower": FlowerBackend}.get(backend, lambda: backend)()
    return backend


def uses_secure_aggregation(backend):
    """Whether ``backend`` (a name or settings) runs Flower's secure aggregation.

    Examples
    --------
    >>> from skfedspd.backends import uses_secure_aggregation
    >>> uses_secure_aggregation("flower")
    False
    """
    return bool(getattr(resolve_backend(backend), "secure_aggregation", False))
