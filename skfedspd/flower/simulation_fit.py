"""``FederatedSPDnetClassifier(backend="flower").fit``: an in-process Flower simulation.

:func:`fit_simulation` is the ``"flower"`` transport (``pyproject.toml`` registers it under
:data:`skfedspd.federated.BACKEND_GROUP`).
The data are split into clients by ``fit`` (``groups`` or the
seeded partition, in :class:`~skfedspd.run.ClientData`); virtual SuperNode ``i`` holds
client ``i``'s samples, with their training weights when the fit has any (``sample_weight``
times the local estimator's ``class_weight``, computed on all the labels as on the local
backend) and their groups (the domains of ``batchnorm="domain"``), and runs the FedSPDnet ClientApp; the ServerApp runs
:func:`skfedspd.flower.server.serve`. See :mod:`skfedspd.flower.simulation` for the
runtime (no Ray).
"""

from flwr.serverapp import ServerApp
from sklearn.base import clone

from ..local import site_estimator
from ..run import domain_prior_from_data
from .client import make_client_app
from .progress import RoundProgress
from .server import serve
from .simulation import quiet_flower_logs, run_inprocess_simulation

__all__ = ["fit_simulation"]


def fit_simulation(run, data):
    """Fit the run's configuration on ``data`` by an in-process Flower simulation.

    Returns
    -------
    FederatedResult

    Examples
    --------
    ``backend="flower"`` runs this; the same seed gives the local backend's model:

    >>> import numpy as np
    >>> from sklearn.base import clone
    >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=30, n_channels=4, n_classes=2, seed=0)
    >>> subjects = np.repeat(["a", "b", "c"], 10)
    >>> fed = FederatedSPDnetClassifier(SPDnetClassifier(), n_rounds=2, backend="flower", random_state=0)
    >>> on_flower = clone(fed).fit(X, y, groups=subjects)
    >>> on_local = clone(fed).set_params(backend="local").fit(X, y, groups=subjects)
    >>> bool(np.array_equal(on_flower.predict_proba(X), on_local.predict_proba(X)))
    True
    """
    fed = run.fed
    sites = [(cid, *data.site_arrays(cid)) for cid in range(len(data.indices))]
    template = site_estimator(run)  # unfitted: each site builds its model from the set-up

    def factory():
        return clone(template)

    client_app = make_client_app(lambda context: sites[int(context.node_config["partition-id"])],
                                 estimator_factory=factory)
    server_app = ServerApp()
    results = []
    progress = RoundProgress(fed.n_rounds, disable=not fed.verbose)

    @server_app.main()
    def _main(grid, context):
        results.append(serve(fed, grid, n_sites=len(sites), run=run, estimator_factory=factory,
                             client_source=data.client_source, client_groups=data.client_groups,
                             prior=domain_prior_from_data(data), connect_timeout=60.0,
                             on_round=lambda record: progress.round_done(record["val_f1"])))

    try:
        with quiet_flower_logs():
            run_inprocess_simulation(server_app, client_app, len(sites))
    finally:
        progress.close()
    return results[0]
