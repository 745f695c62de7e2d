"""The deployed Flower App: ``skfedspd.flower.app:server_app`` and ``:client_app``.

Referenced by the app's ``pyproject.toml`` (:func:`skfedspd.flower.write_app`); the
SuperLink's ServerApp process and each SuperNode's ClientApp process import them from the
installed ``skfedspd[flower]`` (the FAB carries no code, and runtime dependency
installation stays off).

Run configuration (``flwr run --run-config``):

- ``estimator``: the :class:`~skfedspd.FederatedSPDnetClassifier` as a JSON spec
  (:func:`skfedspd.spec.estimator_to_spec`);
- ``output``: where the server writes the fitted estimator
  (:func:`skfedspd.persistence.save_estimator`: a data-only file, no pickle);
- ``n-sites``: SuperNodes to wait for (their ``client-id`` must be ``0..n-sites-1``);
- ``round-timeout``, ``connect-timeout``: seconds.

Examples
--------
The two apps, and a run configuration as :func:`skfedspd.flower.fit_federated` writes it:

>>> from skfedspd import FederatedSPDnetClassifier
>>> from skfedspd.flower.app import client_app, server_app
>>> from skfedspd.spec import dumps, estimator_to_spec
>>> type(server_app).__name__, type(client_app).__name__
('ServerApp', 'ClientApp')
>>> run_config = {"estimator": dumps(estimator_to_spec(FederatedSPDnetClassifier(n_rounds=50, random_state=0))),
...               "output": "/srv/fedspdnet/model.skfedspd", "n-sites": 3}
>>> run_config["estimator"][:47]
'{"class": "FederatedSPDnetClassifier", "params"'
"""

from flwr.serverapp import ServerApp
from flwr.common import log

from .. import spec as _spec
from ..federated import FederatedSPDnetClassifier, set_result
from ..persistence import save_estimator
from ..validation import check_count, check_positive
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
    result = serve(fed, grid, n_sites=check_count(config["n-sites"], "run config 'n-sites'", 1),
                   timeout=check_positive(config["round-timeout"], "run config 'round-timeout'"),
                   connect_timeout=check_positive(config["connect-timeout"], "run config 'connect-timeout'"))
    set_result(fed, result)  # the ServerApp makes its estimator the fitted model
    save_estimator(fed, output)
    best = fed.history_[fed.best_round_]
    log(20, "FedSPDnet: %d rounds, best round %d (val macro-F1 %.4f); model written to %s",
        len(fed.history_), fed.best_round_, best["val_f1"], output)
