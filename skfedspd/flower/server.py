"""The FedSPDnet server on Flower: set-up messages, then the rounds of :class:`SPDnetStrategy`
(:class:`~skfedspd.flower.secure.SecureSPDnetStrategy` under secure aggregation).

The server logic is :class:`skfedspd.engine.FederatedEngine`'s (seeded client selection,
reply validation, the failure policy, the aggregation rules of :mod:`skfedspd.aggregation`,
the pooled validation score, the plateau schedule, the history); this module only moves it
onto Flower messages and turns each reply into an engine reply (or into the reason it is
malformed), so that the same ``random_state`` gives the same model bit for bit on
``backend="local"``, in the in-process Flower simulation and in a real deployment.
"""

import copy
import numbers
import secrets
import time

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.supercore import log

from .. import spec as _spec
from ..engine import FederatedEngine, FederatedResult, declared_weights, is_positive_weight, pool_input_statistic
from ..training import draw_seed
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


def _count(value, minimum):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum


def _label_kind(label):
    """"str", "bool" or "number" (a finite int or float); None for anything else."""
    if isinstance(label, (str, bool)):
        return type(label).__name__
    if isinstance(label, numbers.Real) and np.isfinite(label):
        return "number"
    return None


def _read_setup(infos, nodes, with_labels=True):
    """The sites' set-up declarations, checked: ``(node of each client id, shape, labels of
    each client, n_train, n_val, input statistics, training weights)`` (a client's training
    weight: the sum of its training sample weights, None when it has none; the list is None
    when no client has any). Any bad declaration raises a ValueError naming the client
    (set-up failures end the run whatever the failure policy: the federation's membership
    and data shape must be settled first). ``with_labels=False`` (agreed ``classes``): the
    sites declare no labels (None each)."""
    client_node = {}
    for node, info in infos.items():
        cid = info.get("client-id") if hasattr(info, "get") else None
        if not _count(cid, 0):
            raise ValueError(f"node {node} declared an invalid client id {cid!r}")
        if cid in client_node:
            raise ValueError(f"client id {cid} is configured on two nodes ({client_node[cid]}, {node})")
        client_node[cid] = node
    if sorted(client_node) != list(range(len(nodes))):
        raise ValueError(f"the sites' client ids must be 0..{len(nodes) - 1}, got {sorted(client_node)}")
    node_of = [client_node[cid] for cid in range(len(nodes))]
    shapes, labels, n_train, n_val, stats, weights = set(), [], [], [], [], []
    for cid, node in enumerate(node_of):
        info = infos[node]
        try:
            shape = tuple(info["shape"])
            declared = _spec.loads(str(info["labels"])) if with_labels else None
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"client {cid} sent a malformed set-up reply: {error!r}") from None
        if not shape or not all(_count(s, 1) for s in shape):
            raise ValueError(f"client {cid} declared an invalid sample shape {list(shape)}")
        kinds = {_label_kind(label) for label in declared} if isinstance(declared, list) else {None}
        if with_labels and (not declared or None in kinds or len(set(declared)) != len(declared)):
            raise ValueError(f"client {cid} declared invalid labels {declared!r} (a non-empty list of "
                             "distinct strings, booleans or finite numbers)")
        if not _count(info.get("num-examples"), 1) or not _count(info.get("n-val"), 0):
            raise ValueError(f"client {cid} declared invalid sample counts (num-examples "
                             f"{info.get('num-examples')!r}, n-val {info.get('n-val')!r})")
        weight = info.get("weight")
        if weight is not None and not is_positive_weight(weight):
            raise ValueError(f"client {cid} declared an invalid training weight {weight!r} (the sum of its training "
                             "sample weights: a finite number > 0)")
        shapes.add(shape)
        labels.append(declared)
        n_train.append(int(info["num-examples"]))
        n_val.append(int(info["n-val"]))
        stats.append(info.get("input-statistic"))
        weights.append(None if weight is None else float(weight))
    if len(shapes) != 1:
        raise ValueError(f"the sites' samples differ in shape: {sorted(shapes)}")
    kinds = {cid: {_label_kind(label) for label in site} for cid, site in enumerate(labels) if site is not None}
    if with_labels and len(set().union(*kinds.values())) != 1:
        raise ValueError(f"the sites declare labels of different types: {kinds} (a label must mean the same "
                         "class at every site)")
    return node_of, shapes.pop(), labels, n_train, n_val, stats, None if weights == [None] * len(weights) else weights


def set_domain_prior_from_sites(fed, est, grid, node_of, setup_json, params, timeout):
    """Give the trained global model ``est`` the domain prior of the sites' data
    (``batchnorm="domain"``; a no-op otherwise).

    One ``query.prior`` message a site carries the final weights ``params``; each site
    answers :meth:`~skfedspd.SPDnetClassifier.domain_prior_statistics` on all its data (its
    groups the domains, or the site one domain, as it trained): per batch-norm layer the sum
    of ``log Z`` and the count. The server adds them up, so the prior is the pooled
    log-Euclidean mean that ``fit`` computes where it holds the data. Not under
    ``dp_epsilon`` (a statistic of the sites' data outside the privacy budget) nor under
    ``secure_aggregation`` (a site's sums would reach the server in clear): the model then
    has no prior and warns when a single trial starts a domain
    (:meth:`~skfedspd.FederatedSPDnetClassifier.fit_domain_prior` sets one later).
    """
    if getattr(est, "batchnorm", None) != "domain":
        return
    est.domain_statistics_ = None  # stored domains belong to earlier weights
    if fed.dp_epsilon is not None or fed.secure_aggregation:
        return
    configs = {node: {"setup": setup_json, "client-id": cid} for cid, node in enumerate(node_of)}
    replies = _query(grid, node_of, "prior", configs, "prior", timeout, arrays=to_array_record(params))
    shapes = [(n, n) for n in est._domain_statistics().sizes]
    sums, count = [np.zeros(shape) for shape in shapes], 0
    for cid, node in enumerate(node_of):
        site_sums, site_count = _read_prior_reply(from_array_record(replies[node]), shapes, cid)
        sums = [a + b for a, b in zip(sums, site_sums)]
        count += site_count
    est.set_domain_prior(sums, count)


def _read_prior_reply(reply, shapes, cid):
    """``(log-sums, count)`` of one site's prior reply, checked: a finite symmetric
    ``log-sum.i`` of each batch-norm layer's shape and an integer ``count`` >= 1, nothing
    else; a ValueError naming the client otherwise."""
    names = [f"log-sum.{i}" for i in range(len(shapes))]
    count = reply.get("count")
    problem = None
    if set(reply) != {*names, "count"}:
        problem = f"arrays {sorted(reply)}, expected {[*names, 'count']}"
    elif np.shape(count) != () or not _count(count.item(), 1):
        problem = f"count {count!r} (an integer >= 1)"
    else:
        for name, shape in zip(names, shapes):
            S = reply[name]
            if S.shape != shape or not np.all(np.isfinite(S)) or not np.allclose(S, S.T):
                problem = f"{name} of shape {S.shape}, expected a finite symmetric {shape}"
                break
    if problem is not None:
        raise ValueError(f"client {cid} sent a malformed domain prior reply: {problem}")
    return [reply[name] for name in names], int(count)


def _probe(shape):
    """A one-sample input of the sites' shape that the estimator's validation accepts
    (identity matrices), to set the server's shape attributes without any site data."""
    return np.broadcast_to(np.eye(shape[-2], shape[-1]), (1, *shape)).copy()


def serve(fed, grid, *, n_sites, seed=None, estimator_factory=None, timeout=3600.0, connect_timeout=600.0,
          client_source=None, client_groups=None, on_round=None, validation_fraction=None, domain_prior=True):
    """Fit a :class:`~skfedspd.FederatedSPDnetClassifier`'s configuration through a Flower Grid.

    The ServerApp body of both the in-process simulation and a deployment. The client ids
    are the sites' (``client-id`` of each node's configuration, or the simulation's
    ``partition-id``); they must be ``0..n_sites-1``. ``fed`` is read, never changed
    (its fitted state when ``warm_start`` continues a fit).

    Parameters
    ----------
    seed : int or None
        The run's seed (None: drawn from ``fed.random_state``, as the local backend does).
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
    validation_fraction : float or None
        Share of each site's data held out for validation (the simulation passes
        :meth:`~skfedspd.FederatedSPDnetClassifier.held_out_fraction` of the whole data);
        None: ``fed.validation_fraction`` (a deployment's server does not see the data, so
        its sites hold out the fraction as given; 0 in DP mode, as
        :meth:`~skfedspd.FederatedSPDnetClassifier.resolved_settings` says).
    domain_prior : bool, default=True
        With ``batchnorm="domain"``, end with one ``query.prior`` round
        (:func:`set_domain_prior_from_sites`). The simulation passes False: ``fit``
        computes the prior from the data it holds, as on the local backend.

    Returns
    -------
    FederatedResult
        For ``fed.set_result``.

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
    >>> fed = fed.set_result(results[0])
    >>> fed.n_clients_, len(fed.history_), fed.predict(X[:4]).shape
    (3, 2, (4,))
    """
    fed.check_params()
    if fed.checkpoint_path:
        raise ValueError("checkpoint_path is not supported by the Flower backend (the local backend only)")
    resume = fed.warm_start and fed.__sklearn_is_fitted__()
    est = copy.deepcopy(fed.global_estimator_) if resume else fed.local_estimator()
    nodes = connect_sites(grid, n_sites, connect_timeout)
    seed = fed.engine_.seed if resume else (draw_seed(fed.random_state) if seed is None else int(seed))

    # 1. set-up: who is who, the sites' labels (none with agreed classes: each site checks
    # its own against them), shapes, split sizes and input statistics
    agreed = fed.agreed_classes(est, resume)
    setup = {"estimator": None if estimator_factory is not None else _spec.estimator_to_spec(est),
             "classes": agreed, "seed": seed,
             "validation_fraction": (fed.resolved_settings(est)["validation_fraction"] if validation_fraction is None
                                     else validation_fraction),
             "input_statistic": None, "ready": False, "private": fed.dp_epsilon is not None,
             # sites tag the optimizer state they keep with this fit's token
             "client_optimizer_state": fed.client_optimizer_state, "fit": secrets.token_hex(8)}
    infos = _query(grid, nodes, "setup", {node: {"setup": _spec.dumps(setup)} for node in nodes}, "site", timeout)
    node_of, shape, labels, n_train, n_val, stats, weights = _read_setup(infos, nodes, with_labels=agreed is None)
    known = est.classes_ if resume else None
    for cid, site in enumerate(labels if agreed is None else []):
        unknown = [] if known is None else sorted(set(site) - set(np.asarray(known).tolist()))
        if unknown:
            raise ValueError(f"client {cid} declared labels {unknown} that are not in classes {known.tolist()}")
    est.check_inputs(_probe(shape), reset=not resume)
    if resume:
        statistic = fed.engine_.input_statistic
    else:
        if agreed is None:
            est.set_classes(np.unique(np.concatenate([np.asarray(site) for site in labels])))
        fed.check_init(est)
        # DP mode: the sites' input statistics are neither sent nor used (docs/guide/privacy.md)
        # pooled as on the local backend: by training size, or by the sum of the training weights
        statistic = None if setup["private"] else pool_input_statistic(stats, declared_weights(n_train, weights))
        est.set_input_statistic(statistic)
        fed.initialize(est, seed)
    engine = FederatedEngine.from_estimator(fed, est, n_train=n_train, n_val=n_val, seed=seed,
                                            input_statistic=statistic, train_weights=weights)
    if resume:
        engine.load_state_dict(*fed.engine_.state_dict())
    # 2. from here on every message carries the complete set-up
    setup.update(classes=est.classes_.tolist(), input_statistic=statistic, ready=True)

    # 3. the rounds
    strategy_class = SecureSPDnetStrategy if fed.secure_aggregation else SPDnetStrategy
    strategy = strategy_class(engine, nodes=node_of, setup_json=_spec.dumps(setup), local_epochs=fed.local_epochs,
                              on_round=on_round)
    strategy.start(grid, to_array_record(engine.global_params), num_rounds=fed.n_rounds, timeout=timeout)
    est.set_parameters(engine.best_params)
    if domain_prior:
        set_domain_prior_from_sites(fed, est, grid, node_of, _spec.dumps(setup), engine.best_params, timeout)
    if client_source is None:
        client_source, client_groups = "flower:client-id", [None] * len(node_of)
    return FederatedResult(est, engine, client_source, list(client_groups))
