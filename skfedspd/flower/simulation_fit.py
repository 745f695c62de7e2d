"""``FederatedSPDnetClassifier(backend="flower").fit``: an in-process Flower simulation.

The data are split into clients exactly as on the local backend (``groups`` or the
seeded partition); virtual SuperNode ``i`` holds client ``i``'s samples and runs the
FedSPDnet ClientApp; the ServerApp runs :func:`skfedspd.flower.server.serve` on this
estimator. See :mod:`skfedspd.flower.simulation` for the engine (no Ray).
"""

import numpy as np
from flwr.serverapp import ServerApp
from sklearn.base import clone

from ..classifier import SPDnetClassifier
from .client import make_client_app
from .server import serve
from .simulation import quiet_flower_logs, run_inprocess_simulation

__all__ = ["fit_simulation"]


def fit_simulation(fed, X, y, groups=None):
    """Fit ``fed`` by an in-process Flower simulation; returns ``fed``."""
    fed._check_params()
    if fed.checkpoint_path:
        raise ValueError("checkpoint_path is not supported by the Flower backend (the local backend only)")
    resume = fed.warm_start and fed.__sklearn_is_fitted__()
    # The local backend's input checks, with its error messages, before any Flower machinery.
    est = clone(fed.global_estimator_ if resume else (fed.estimator if fed.estimator is not None
                                                      else SPDnetClassifier()))
    X = est.check_inputs(X, reset=True)
    est.set_classes(fed.classes_ if resume else y)
    codes = est.encode_labels(y, len(X))
    if resume and X.shape[1] != fed.n_features_in_:
        raise ValueError(f"X has {X.shape[1]} channels, but the estimator was fitted on {fed.n_features_in_}")
    seed = fed._seed_ if resume else fed._draw_seed()
    indices = fed._client_indices(codes, groups, seed)
    y = np.asarray(y)
    sites = [(cid, X[idx], y[idx]) for cid, idx in enumerate(indices)]
    template = clone(est)

    client_app = make_client_app(lambda context: sites[int(context.node_config["partition-id"])],
                                 estimator_factory=lambda: clone(template))
    server_app = ServerApp()

    @server_app.main()
    def _main(grid, context):
        serve(fed, grid, n_sites=len(sites), seed=seed, estimator_factory=lambda: clone(template),
              client_source=fed.client_source_, client_groups=fed.client_groups_, connect_timeout=60.0)

    if fed.verbose:
        run_inprocess_simulation(server_app, client_app, len(sites))
    else:
        with quiet_flower_logs():
            run_inprocess_simulation(server_app, client_app, len(sites))
    return fed
