"""The FedSPDnet server on Flower: set-up messages, then the rounds of :class:`SPDnetStrategy`
(:class:`~skfedspd.flower.secure.SecureSPDnetStrategy` under secure aggregation).

The run's set-up and end are :class:`skfedspd.run.FederatedRun`'s, the rounds
:class:`skfedspd.engine.FederatedEngine`'s (seeded client selection, reply validation, the
failure policy, the aggregation rules of :mod:`skfedspd.aggregation`, the pooled validation
score, the plateau schedule, the history); this module only moves them onto Flower messages
and turns each reply into a :mod:`skfedspd.messages` reply (or into the reason it is
malformed), so that the same ``random_state`` gives the same model bit for bit on
``backend="local"``, in the in-process Flower simulation and in a real deployment.
"""

import secrets
import time

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log

from .. import spec as _spec
from ..backends import uses_secure_aggregation
from ..messages import SetupReply
from ..online import check_prior_statistics
from ..run import FederatedRun
from ..validation import is_count
from .records import from_array_record, to_array_record
from .secure import SecureSPDnetStrategy
from .strategy import ROUND_LOG, SPDnetStrategy

__all__ = ["SPDnetStrategy", "serve", "connect_sites", "ROUND_LOG"]

_INFO = 20


# ---------------------------------------------------------------------- set-up
def connect_sites(grid, n_sites, timeout):
    """Wait until ``n_sites`` SuperNodes are connected; return their node ids.

    Examples
    --------
    With a stand-in for the Grid (``get_node_ids`` is all that is asked of it):

    >>> from skfedspd.flower.server import connect_sites
    >>> class Grid:
    ...     def get_node_ids(self):
    ...         return [7312, 91, 4405]
    >>> connect_sites(Grid(), 3, timeout=1.0)
    [91, 4405, 7312]
    >>> connect_sites(Grid(), 4, timeout=0.1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TimeoutError: 3 of the 4 sites connected within ...
    """
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= n_sites:
            return nodes
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(nodes)} of the {n_sites} sites connected within {timeout:.0f} s")
        log(_INFO, "waiting for sites: %d of %d connected", len(nodes), n_sites)
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))


def _query(grid, node_ids, action, configs, key, timeout, arrays=None):
    """One ``query.<action>`` message per node (with the ArrayRecord ``arrays``, if any);
    the replies by node (errors raised)."""
    extra = {} if arrays is None else {"arrays": arrays}
    messages = [Message(content=RecordDict({"config": ConfigRecord(configs.get(node, {})), **extra}),
                        message_type=f"{MessageType.QUERY}.{action}", dst_node_id=node) for node in node_ids]
    replies = {m.metadata.src_node_id: m for m in grid.send_and_receive(messages, timeout=timeout)}
    missing = [node for node in node_ids if node not in replies]
    if missing:
        raise TimeoutError(f"nodes {missing} did not answer the {action} query in {timeout:.0f} s")
    for node, message in replies.items():
        if message.has_error():
            raise RuntimeError(f"node {node} failed the {action} query: {message.error.reason}")
    return {node: message.content[key] for node, message in replies.items()}


def _setup_reply(info, node):
    """A site's set-up reply (a Flower ConfigRecord) as a :class:`~skfedspd.messages.SetupReply`
    (checked by :func:`skfedspd.run.check_setup_replies`); a ValueError names the node when
    it cannot be read."""
    try:
        labels = _spec.loads(str(info["labels"])) if "labels" in info else None
        return SetupReply(info["client-id"], list(info["shape"]), labels, n_train=info.get("num-examples"),
                          n_val=info.get("n-val"), weight=info.get("weight"), statistic=info.get("input-statistic"))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"node {node} sent a malformed set-up reply: {error!r}") from None


def _by_client_id(replies, nodes):
    """``(node of each client id, their SetupReply in client-id order)``; the client ids must
    be ``0..len(nodes)-1``, each on one node."""
    client_node = {}
    for node, reply in replies.items():
        cid = reply.client_id
        if not is_count(cid, 0):
            raise ValueError(f"node {node} declared an invalid client id {cid!r}")
        if cid in client_node:
            raise ValueError(f"client id {cid} is configured on two nodes ({client_node[cid]}, {node})")
        client_node[cid] = node
    if sorted(client_node) != list(range(len(nodes))):
        raise ValueError(f"the sites' client ids must be 0..{len(nodes) - 1}, got {sorted(client_node)}")
    node_of = [client_node[cid] for cid in range(len(nodes))]
    return node_of, [replies[node] for node in node_of]


def set_domain_prior_from_sites(fed, est, grid, node_of, setup_json, params, timeout):
    """Give the trained global model ``est`` the domain prior of the sites' data
    (``batchnorm="domain"``; a no-op otherwise).

    One ``query.prior`` message a site carries the final weights ``params``; each site
    answers :meth:`~skfedspd.SPDnetClassifier.domain_prior_statistics` on all its data (its
    groups the domains, or the site one domain, as it trained): per batch-norm layer the sum
    of ``log Z`` and the count. The server adds them up, so the prior is the pooled
    log-Euclidean mean that ``fit`` computes where it holds the data. Not under
    ``privacy`` (a statistic of the sites' data outside the privacy budget) nor under
    secure aggregation (a site's sums would reach the server in clear): the model then
    has no prior and warns when a single trial starts a domain
    (:meth:`~skfedspd.FederatedSPDnetClassifier.fit_domain_prior` sets one later).
    """
    if not est.federation_traits().domains:
        return
    est.clear_domain_statistics()  # stored domains belong to earlier weights
    if fed.privacy is not None or uses_secure_aggregation(fed.backend):
        return
    configs = {node: {"setup": setup_json, "client-id": cid} for cid, node in enumerate(node_of)}
    replies = _query(grid, node_of, "prior", configs, "prior", timeout, arrays=to_array_record(params))
    shapes = [(n, n) for n in est.domain_layer_sizes()]
    sums, count = [np.zeros(shape) for shape in shapes], 0
    for cid, node in enumerate(node_of):
        site_sums, site_count = _read_prior_reply(from_array_record(replies[node]), shapes, cid)
        sums = [a + b for a, b in zip(sums, site_sums)]
        count += site_count
    est.set_domain_prior(sums, count)


def _read_prior_reply(reply, shapes, cid):
    """``(log-sums, count)`` of one site's prior reply, checked: the arrays ``log-sum.i``
    (one per batch-norm layer) and ``count``, nothing else, valid statistics of a prior
    (:func:`~skfedspd.online.check_prior_statistics`: finite, symmetric, a whole count >= 1,
    a log-mean within :data:`~skfedspd.online.PRIOR_LOG_BOUND`); a ValueError naming the
    client and the field otherwise."""
    names = [f"log-sum.{i}" for i in range(len(shapes))]
    if set(reply) != {*names, "count"}:
        raise ValueError(f"client {cid} sent a malformed domain prior reply: arrays {sorted(reply)}, expected "
                         f"{[*names, 'count']}")
    count = reply["count"]
    if np.shape(count) != () or not is_count(count.item(), 1):
        raise ValueError(f"client {cid} sent a malformed domain prior reply: count {count!r} (an integer >= 1)")
    try:
        return check_prior_statistics([reply[name] for name in names], count, [n for n, _ in shapes])
    except ValueError as error:
        raise ValueError(f"client {cid} sent a malformed domain prior reply: {error}") from None


def serve(fed, grid, *, n_sites, run=None, estimator_factory=None, timeout=3600.0, connect_timeout=600.0,
          client_source=None, client_groups=None, on_round=None, prior=None):
    """Fit a :class:`~skfedspd.FederatedSPDnetClassifier`'s configuration through a Flower Grid.

    The ServerApp body of both the in-process simulation and a deployment: the Flower
    transport of a :class:`~skfedspd.run.FederatedRun`. The client ids are the sites'
    (``client-id`` of each node's configuration, or the simulation's ``partition-id``); they
    must be ``0..n_sites-1``. ``fed`` is read, never changed (its fitted state when
    ``warm_start`` continues a fit).

    Parameters
    ----------
    run : FederatedRun or None
        The run (the simulation's, seeded and with the validation share of the whole data);
        None: ``FederatedRun(fed)`` (a deployment's server does not see the data: its sites
        hold out ``validation_fraction`` as given, 0 in DP mode).
    estimator_factory : callable or None
        Passed on by the simulation (the sites clone the server's estimator); None: the
        sites rebuild it from its JSON spec.
    timeout : float
        Seconds to wait for the replies of one message round.
    client_source, client_groups
        What ``client_source_`` / ``client_groups_`` record (the simulation's partition);
        None: ``"flower:client-id"`` and no groups.
    on_round : callable or None
        Called with each closed round's history record (the simulation's progress bar).
    prior : callable or None
        How the released model gets its domain prior (``batchnorm="domain"``, outside DP
        mode): the simulation passes the prior of the data it holds
        (:func:`skfedspd.run.domain_prior_from_data`); None: one ``query.prior`` round
        (:func:`set_domain_prior_from_sites`).

    Returns
    -------
    FederatedResult

    Examples
    --------
    A ServerApp running ``serve`` against three sites of an in-process simulation (a
    deployment's ServerApp, :mod:`skfedspd.flower.app`, does the same on a real Grid):

    >>> import numpy as np
    >>> from flwr.serverapp import ServerApp
    >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.flower import make_client_app, run_inprocess_simulation, serve
    >>> from skfedspd.flower.simulation import quiet_flower_logs
    >>> X, y = make_spd_classification(n_matrices=45, n_channels=4, n_classes=3, seed=0)
    >>> parts = np.array_split(np.arange(45), 3)
    >>> def load_site(context):  # virtual SuperNode i holds site i
    ...     i = int(context.node_config["partition-id"])
    ...     return i, X[parts[i]], y[parts[i]]
    >>> fed = FederatedSPDnetClassifier(SPDnetClassifier(), n_rounds=2, random_state=0)
    >>> server_app, results = ServerApp(), []
    >>> @server_app.main()
    ... def main(grid, context):
    ...     results.append(serve(fed, grid, n_sites=3, connect_timeout=30.0))
    >>> with quiet_flower_logs():
    ...     _ = run_inprocess_simulation(server_app, make_client_app(load_site), num_supernodes=3)
    >>> result = results[0]  # a FederatedResult (a deployment's ServerApp saves the fitted estimator)
    >>> result.engine.n_clients, len(result.engine.history), result.estimator.predict(X[:4]).shape
    (3, 2, (4,))
    """
    fed.check_params()
    run = FederatedRun(fed) if run is None else run
    if getattr(run.backend, "checkpoint_path", None):
        raise ValueError("checkpoint_path is not supported by the Flower backend (the local backend only)")
    nodes = connect_sites(grid, n_sites, connect_timeout)

    # 1. set-up: who is who, the sites' labels (none with agreed classes: each site checks
    # its own against them), shapes, split sizes and input statistics
    setup = dict(run.site_setup(), estimator=None if estimator_factory is not None else
                 _spec.estimator_to_spec(run.estimator),
                 fit=secrets.token_hex(8))  # sites tag the optimizer state they keep with this fit's token
    infos = _query(grid, nodes, "setup", {node: {"setup": _spec.dumps(setup)} for node in nodes}, "site", timeout)
    node_of, replies = _by_client_id({node: _setup_reply(info, node) for node, info in infos.items()}, nodes)
    engine = run.start(replies)
    # 2. from here on every message carries the complete set-up
    setup.update(run.site_setup())

    # 3. the rounds
    strategy_class = SecureSPDnetStrategy if uses_secure_aggregation(run.backend) else SPDnetStrategy
    strategy = strategy_class(engine, nodes=node_of, setup_json=_spec.dumps(setup), local_epochs=fed.local_epochs,
                              on_round=on_round)
    strategy.start(grid, to_array_record(engine.global_params), num_rounds=fed.n_rounds, timeout=timeout)
    if prior is None:
        def prior(est):
            set_domain_prior_from_sites(fed, est, grid, node_of, _spec.dumps(setup), engine.best_params, timeout)
    if client_source is None:
        client_source, client_groups = "flower:client-id", [None] * len(node_of)
    return run.finish(client_source, client_groups, prior=prior)
