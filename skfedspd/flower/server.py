"""The FedSPDnet server on Flower: set-up messages, then :class:`SPDnetStrategy`.

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
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log

from .. import spec as _spec
from ..engine import EvalReply, FederatedEngine, FederatedResult, TrainReply, is_positive_weight, pool_input_statistic
from ..training import draw_seed
from .client import from_array_record, to_array_record

__all__ = ["SPDnetStrategy", "serve", "connect_sites", "ROUND_LOG"]

_INFO, _WARNING = 20, 30
#: Logged by the strategy when a round closes, plain or secure (a deployment's progress
#: bar reads it from the streamed server log): the round and the global validation macro-F1.
ROUND_LOG = "FedSPDnet round %d done: val-f1 %r"


class MalformedReply(ValueError):
    """A site's reply that cannot be read as the message it answers (a failed client)."""


class SPDnetStrategy(FedAvg):
    """FedSPDnet as a Flower strategy: Flower messages in and out of a
    :class:`~skfedspd.engine.FederatedEngine`.

    - ``configure_train``: round ``t``'s participants are the engine's seeded draw of
      exactly ``M`` client ids, sent to the nodes of those client ids (Flower's node ids
      are random; ``nodes[cid]`` maps them), each with its learning rate and seed;
    - ``aggregate_train``: replies in client-id order (missing, failed or malformed ones
      become that client's error) → :meth:`FederatedEngine.aggregate` (checks, failure
      policy, aggregation);
    - ``configure_evaluate`` / ``aggregate_evaluate``: the new global model on every
      client's validation part → :meth:`FederatedEngine.finish_round` (checks, pooled
      score, schedule, history).

    After early stopping the remaining rounds send nothing. Each closed round is logged as
    :data:`ROUND_LOG` and passed to ``on_round``.

    Parameters
    ----------
    engine : FederatedEngine
    nodes : list of int
        Flower node id of each client id.
    setup_json : str
        The run's set-up, sent with every message.
    local_epochs : int
    on_round : callable or None, default=None
        Called with each closed round's history record (e.g. a progress bar).

    Examples
    --------
    :func:`serve` builds it and runs it on a Grid (see its example). For an engine of
    three clients, two per round, on Flower nodes 101, 102 and 103:

    >>> import numpy as np
    >>> from skfedspd.engine import FederatedEngine
    >>> from skfedspd.flower import SPDnetStrategy
    >>> from skfedspd.stiefel import random_stiefel
    >>> engine = FederatedEngine({"W": random_stiefel(4, 2, rng=0), "b": np.zeros(2)},
    ...                          {"W": "stiefel", "b": "euclidean"}, n_train=[20, 30, 25], n_val=[2, 3, 3],
    ...                          seed=0, lr=0.01, clients_per_round=2)
    >>> strategy = SPDnetStrategy(engine, nodes=[101, 102, 103], setup_json="{}", local_epochs=2)
    >>> strategy.min_train_nodes, strategy.min_evaluate_nodes, strategy.client_of
    (2, 3, {101: 0, 102: 1, 103: 2})
    >>> selected, seeds = engine.select(0)  # round 0's train messages go to their nodes
    >>> [strategy.nodes[cid] for cid in selected]
    [101, 102]
    """

    def __init__(self, engine, *, nodes, setup_json, local_epochs, on_round=None):
        n_clients = len(nodes)
        super().__init__(fraction_train=engine.n_select / n_clients, fraction_evaluate=1.0,
                         min_train_nodes=engine.n_select, min_evaluate_nodes=n_clients,
                         min_available_nodes=n_clients, weighted_by_key="num-examples")
        self.engine = engine
        self.nodes = list(nodes)
        self.client_of = {node: cid for cid, node in enumerate(self.nodes)}
        self.setup_json = setup_json
        self.local_epochs = int(local_epochs)
        self.first_round = engine.next_round
        self.on_round = on_round
        self._round = None

    def summary(self):
        log(_INFO, "\t├──> FedSPDnet: %d clients, %d per round, aggregation %r, weighting %r",
            len(self.nodes), self.engine.n_select, self.engine.rule_name, self.engine.weighting)

    # ------------------------------------------------------------------ helpers
    def _message(self, cid, message_type, **config):
        content = RecordDict({"arrays": to_array_record(self.engine.global_params),
                              "local": to_array_record(self.engine.local_state(cid)),
                              "config": ConfigRecord({"client-id": int(cid), "setup": self.setup_json, **config})})
        return Message(content=content, message_type=message_type, dst_node_id=self.nodes[cid])

    def _replies(self, replies, clients, parse):
        """One entry per client id of ``clients``: ``parse(message)``, or the error that
        stands for a missing, failed or malformed reply."""
        by_client = {}
        for message in replies:
            cid = self.client_of.get(message.metadata.src_node_id)
            if cid is None:
                raise RuntimeError(f"reply from unknown node {message.metadata.src_node_id}")
            by_client[cid] = message
        out = []
        for cid in clients:
            message = by_client.get(cid)
            if message is None:
                out.append(TimeoutError(f"no reply from the node of client {cid} in time"))
            elif message.has_error():
                out.append(RuntimeError(f"ClientApp error: {message.error.reason}"))
            else:
                try:
                    metrics = message.content["metrics"]
                    if metrics["client-id"] != cid:
                        raise MalformedReply(f"node {self.nodes[cid]} of client {cid} answered as client "
                                             f"{metrics['client-id']!r}")
                    out.append(parse(message, metrics))
                except MalformedReply as error:
                    out.append(error)
                except Exception as error:  # noqa: BLE001 - any unreadable reply is that client's failure
                    out.append(MalformedReply(f"malformed reply: {type(error).__name__}: {error}"))
        return out

    # ------------------------------------------------------------------ train
    def configure_train(self, server_round, arrays, config, grid):
        engine = self.engine
        if engine.should_stop:
            self._round = None
            return []
        t = self.first_round + server_round - 1
        selected, seeds = engine.select(t)
        self._round = {"t": t, "selected": selected, "start": time.perf_counter()}
        log(_INFO, "configure_train: round %d, clients %s", t, selected)
        return [self._message(cid, MessageType.TRAIN, **{"server-round": server_round, "round": t,
                                                           "lr": float(engine.lr), "local-epochs": self.local_epochs,
                                                           "seed": int(seed), **_dp_config(engine.dp_settings(cid))})
                for cid, seed in zip(selected, seeds)]

    def aggregate_train(self, server_round, replies):
        if self._round is None:
            return None, None
        replies = self._replies(list(replies), self._round["selected"], lambda message, metrics: TrainReply(
            from_array_record(message.content["arrays"]), metrics["train-loss"], metrics["skipped-batches"],
            metrics["num-examples"], metrics.get("weight")))
        return self._after_train(self.engine.aggregate(self._round["t"], self._round["selected"], replies))

    def _after_train(self, record):
        for failure in record["failed_clients"]:
            log(_WARNING, "client %d left out of round %d: %s", failure["client"], record["round"], failure["reason"])
        self._round["record"] = record
        metrics = MetricRecord({"train-loss": record["train_loss"], "n-clients": len(record["clients"]),
                                "n-failed": len(record["failed_clients"])})
        return to_array_record(self.engine.global_params), metrics

    # ------------------------------------------------------------------ evaluate
    def configure_evaluate(self, server_round, arrays, config, grid):
        if self._round is None:
            return []
        return [self._message(cid, MessageType.EVALUATE, **{"server-round": server_round})
                for cid in self.engine.evaluated_clients()]

    def aggregate_evaluate(self, server_round, replies):
        if self._round is None:
            return None
        replies = self._replies(list(replies), self.engine.evaluated_clients(), lambda message, metrics: EvalReply(
            metrics["val-loss"], metrics["val-f1"], metrics["num-examples"]))
        return self._after_evaluate(self.engine.finish_round(self._round["record"], replies,
                                                             wall_time=self._elapsed()))

    def _elapsed(self):
        return time.perf_counter() - self._round["start"]

    def _after_evaluate(self, record):
        self._round = None
        log(_INFO, ROUND_LOG, record["round"], float(record["val_f1"]))
        if self.on_round is not None:
            self.on_round(record)
        return MetricRecord({"val-loss": record["val_loss"], "val-f1": record["val_f1"], "lr": record["lr"]})


def _dp_config(dp):
    """A client's DP-SGD settings as train-message config keys (none without DP)."""
    return {} if dp is None else {f"dp-{key.replace('_', '-')}": float(value) for key, value in dp.items()}


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


def _query(grid, node_ids, action, configs, key, timeout):
    """One ``query.<action>`` message per node; the replies by node (errors raised)."""
    messages = [Message(content=RecordDict({"config": ConfigRecord(configs.get(node, {}))}),
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


def _probe(shape):
    """A one-sample input of the sites' shape that the estimator's validation accepts
    (identity matrices), to set the server's shape attributes without any site data."""
    return np.broadcast_to(np.eye(shape[-2], shape[-1]), (1, *shape)).copy()


def serve(fed, grid, *, n_sites, seed=None, estimator_factory=None, timeout=3600.0, connect_timeout=600.0,
          client_source=None, client_groups=None, on_round=None, validation_fraction=None):
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
        # DP mode: the sites' input statistics are neither sent nor used (docs/privacy.md)
        # pooled as on the local backend: by training size, or by the sum of the training weights
        statistic = None if setup["private"] else pool_input_statistic(
            stats, n_train if weights is None else [n if w is None else w for n, w in zip(n_train, weights)])
        est.set_input_statistic(statistic)
        fed.initialize(est, seed)
    engine = FederatedEngine.from_estimator(fed, est, n_train=n_train, n_val=n_val, seed=seed,
                                            input_statistic=statistic, train_weights=weights)
    if resume:
        engine.load_state_dict(*fed.engine_.state_dict())
    # 2. from here on every message carries the complete set-up
    setup.update(classes=est.classes_.tolist(), input_statistic=statistic, ready=True)

    # 3. the rounds
    strategy_class = SPDnetStrategy
    if fed.secure_aggregation:
        from .secure import SecureSPDnetStrategy as strategy_class  # imports this module
    strategy = strategy_class(engine, nodes=node_of, setup_json=_spec.dumps(setup), local_epochs=fed.local_epochs,
                              on_round=on_round)
    strategy.start(grid, to_array_record(engine.global_params), num_rounds=fed.n_rounds, timeout=timeout)
    est.set_parameters(engine.best_params)
    if client_source is None:
        client_source, client_groups = "flower:client-id", [None] * len(node_of)
    return FederatedResult(est, engine, client_source, list(client_groups))
