"""FedSPDnet on Flower (the ``flower`` extra: ``pip install skfedspd[flower]``).

- ``FederatedSPDnetClassifier(backend="flower").fit(X, y, groups=...)``: an in-process
  Flower simulation (:mod:`.simulation_fit`);
- :func:`fit_federated`: a run on a real SuperLink with one SuperNode per site
  (``docs/guide/deployment.md``); :mod:`.app` holds the deployed ServerApp and ClientApp;
- :class:`SPDnetStrategy` / :func:`make_client_app`: the glue (a Strategy whose aggregation
  is :mod:`skfedspd.aggregation`, a ClientApp running the local estimator's ``local_update``); the server state is
  :class:`skfedspd.engine.FederatedEngine`'s.

Each module imports only modules listed before it: :mod:`.records` (arrays in Flower
records), :mod:`.strategy` (the rounds in clear), :mod:`.secure` (SecAgg+: a site's masked
vectors and the secure strategy), :mod:`.client` (the ClientApp) and :mod:`.server` (the
set-up and :func:`serve`, which picks the strategy), :mod:`.progress`, :mod:`.simulation`,
then the entry points :mod:`.simulation_fit`, :mod:`.deploy`, :mod:`.app`.

Only :mod:`._internals`, imported first, uses Flower beyond its public API and checks
the installed Flower.
"""

from . import _internals  # noqa: F401 - first: it checks the installed Flower
from .client import load_site_from_node_config, make_client_app
from .deploy import fit_federated, write_app
from .server import serve
from .simulation import InProcessBackend, run_inprocess_simulation
from .strategy import SPDnetStrategy

__all__ = ["fit_federated", "write_app", "SPDnetStrategy", "serve", "make_client_app",
           "load_site_from_node_config", "InProcessBackend", "run_inprocess_simulation"]
