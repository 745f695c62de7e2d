"""The deployed Flower App: ``skfedspd.flower.app:server_app`` and ``:client_app``.

Referenced by the app's ``pyproject.toml`` (:func:`skfedspd.flower.write_app`); the
SuperLink's ServerApp process and each SuperNode's ClientApp process import them from the
installed ``skfedspd[flower]`` (the FAB carries no code, and runtime dependency
installation stays off).

Run configuration (``flwr run --run-config``):

- ``estimator``: the :class:`~skfedspd.FederatedSPDnetClassifier` as a JSON spec
  (:func:`skfedspd.spec.estimator_to_spec`);
- ``output``: where the server writes the fitted estimator (a pickle, on the server);
- ``n-sites``: SuperNodes to wait for (their ``client-id`` must be ``0..n-sites-1``);
- ``round-timeout``, ``connect-timeout``: seconds.
"""

import os
import pickle

from flwr.serverapp import ServerApp
from flwr.supercore import log

from ..federated import FederatedSPDnetClassifier
from .. import spec as _spec
from .client import load_site_from_node_config, make_client_app
from .server import serve

__all__ = ["server_app", "client_app"]

client_app = make_client_app(load_site_from_node_config)
server_app = ServerApp()


@server_app.main()
def _main(grid, context):
    config = context.run_config
    fed = _spec.estimator_from_spec(_spec.loads(str(config["estimator"])))
    if not isinstance(fed, FederatedSPDnetClassifier):
        raise TypeError(f"run config 'estimator' must be a FederatedSPDnetClassifier, got {type(fed).__name__}")
    output = str(config["output"])
    if not output:
        raise ValueError("run config 'output' (where to write the fitted model) is empty")
    serve(fed, grid, n_sites=int(config["n-sites"]), timeout=float(config["round-timeout"]),
          connect_timeout=float(config["connect-timeout"]))
    tmp = f"{output}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(fed, f)
    os.replace(tmp, output)
    log(20, "FedSPDnet: %d rounds, best round %d (val macro-F1 %.4f); model written to %s",
        len(fed.history_), fed.best_round_, fed._schedule.best_score[0], output)
