"""Where a federated fit runs: the transports' settings, :class:`LocalBackend` and
:class:`FlowerBackend`, and the registry of transports by name.

``FederatedSPDnetClassifier(backend=...)`` takes a name (``"local"``, ``"flower"`` or any
transport an installed package registers under :data:`BACKEND_GROUP`) or a settings object
with the transport's own options. The settings live here, below every transport, so that the
run and the Flower wing read them without the core importing the wing.
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
    """The names ``FederatedSPDnetClassifier(backend=...)`` accepts: ``"local"`` and every
    transport registered under :data:`BACKEND_GROUP`.

    Examples
    --------
    >>> from skfedspd.backends import backend_names
    >>> sorted(backend_names())
    ['flower', 'local']
    """
    return {"local"} | {ep.name for ep in entry_points(group=BACKEND_GROUP)}


class LocalBackend(Settings):
    """The clients' sites in this process (``backend=LocalBackend(...)``; ``"local"``: the
    defaults).

    Parameters
    ----------
    n_jobs : int or None, default=None
        Processes for the clients' local training: this one and ``n_jobs − 1`` joblib
        workers, each training an equal share of the round's clients with one torch thread
        (None or 1: serial). The model is the same bit for bit; with ``n_jobs > 1`` each
        record's ``wall_time`` also covers the next round's training, which runs beside its
        validation.
    checkpoint_path : str, path-like or None, default=None
        The federated state is written there after every round, in a data-only file
        (:mod:`skfedspd.persistence`, never a pickle). A fit that finds a checkpoint of the
        same configuration and data resumes from it and ends bit-identical to an
        uninterrupted fit; one of another configuration is replaced (with a
        ``UserWarning``); a file there that is not a skfedspd checkpoint stops the fit with a
        ValueError naming it, and is left alone. A path of this machine:
        :func:`~skfedspd.save_estimator` writes it as null and
        :func:`~skfedspd.load_estimator` refuses a file that sets it.

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
        """:meth:`Settings.check_params`, and what the constraints cannot say:
        ``checkpoint_path`` is not a directory."""
        super().check_params()
        if self.checkpoint_path is not None and os.path.isdir(self.checkpoint_path):
            raise ValueError(f"checkpoint_path={os.fspath(self.checkpoint_path)!r} is a directory; give the path of "
                             "a file to write (e.g. inside it: 'checkpoint.safetensors')")


class FlowerBackend(Settings):
    """A Flower run (``backend=FlowerBackend(...)``; ``"flower"``: the defaults): ``fit``
    runs an in-process simulation, one virtual SuperNode per client (the ``flower`` extra),
    and :func:`skfedspd.flower.fit_federated` deploys the same estimator on real sites. The
    same ``random_state`` gives the local backend's model bit for bit.

    Parameters
    ----------
    secure_aggregation : bool, default=False
        Every round's train and validation replies reach the server only as sums, by
        Flower's SecAgg+ protocol (:mod:`skfedspd.flower.secure`); ProjAvg / RLAvg are
        computed from the summed weighted arrays and match the plain run to ~1e-7. Needs
        ``aggregation`` "projavg" or "rlavg" (a robust rule needs each client's update) and
        at least 3 clients per round; tolerates ``M − round(2M/3)`` dropouts per round.
        Client-local arrays stay on their site (only their weighted sum joins the masked
        sum); combines with ``privacy`` (the noise is added on the site before the sum);
        ``history_`` then holds totals only. Threat model: ``docs/guide/privacy.md``.

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
    """The settings of ``backend``: a name of :func:`backend_names` (``"local"`` and
    ``"flower"``: their defaults; another registered name has no settings and stays a name)
    or a settings object, returned as it is.

    Examples
    --------
    >>> from skfedspd.backends import resolve_backend
    >>> resolve_backend("local"), resolve_backend("flower").secure_aggregation
    (LocalBackend(), False)
    """
    if isinstance(backend, str):
        return {"local": LocalBackend, "flower": FlowerBackend}.get(backend, lambda: backend)()
    return backend


def uses_secure_aggregation(backend):
    """Whether ``backend`` (a name or settings) runs Flower's secure aggregation.

    Examples
    --------
    >>> from skfedspd.backends import FlowerBackend, uses_secure_aggregation
    >>> uses_secure_aggregation("flower"), uses_secure_aggregation(FlowerBackend(secure_aggregation=True))
    (False, True)
    """
    return bool(getattr(resolve_backend(backend), "secure_aggregation", False))
