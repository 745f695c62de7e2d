"""The FedSPDnet server on Flower: set-up messages, then :class:`SPDnetStrategy`.

The server logic is the estimator's own (:class:`~skfedspd.FederatedSPDnetClassifier`:
seeded client selection, the failure policy, the aggregation rules of
:mod:`skfedspd.aggregation`, the pooled validation score, the plateau schedule, the
history); this module only moves it onto Flower messages, so that the same
``random_state`` gives the same model bit for bit on ``backend="local"``, in the
in-process Flower simulation and in a real deployment.
"""

import time

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log
from sklearn.base import clone

from ..aggregation import get_aggregation
from ..classifier import SPDnetClassifier
from ..federated import _pool_scores
from .. import spec as _spec
from .client import from_array_record, to_array_record

__all__ = ["SPDnetStrategy", "serve", "connect_sites"]

_INFO, _WARNING = 20, 30


class SPDnetStrategy(FedAvg):
    """FedSPDnet as a Flower strategy.

    - ``configure_train``: round ``t``'s participants are the estimator's seeded draw of
      exactly ``M`` client ids (``clients_per_round``), sent to the nodes of those client
      ids (Flower's node ids are random; ``nodes[cid]`` maps them), each with its
      learning rate and local-training seed;
    - ``aggregate_train``: replies sorted by client id (missing or failed ones become that
      client's error), then the estimator's ``_aggregate_train``, i.e. the failure policy,
      sample-count weights and the rule of :mod:`skfedspd.aggregation`;
    - ``configure_evaluate`` / ``aggregate_evaluate``: the new global model on every
      client's validation part, pooled by validation size; the plateau schedule steps and
      the round's record joins ``history_``.

    After early stopping the remaining rounds send nothing.
    """

    def __init__(self, fed, *, nodes, n_train, n_val, setup_json, batch_size, kinds, first_round=0):
        n_clients = len(nodes)
        self.n_select = fed._n_selected(n_clients)
        super().__init__(fraction_train=self.n_select / n_clients, fraction_evaluate=1.0,
                         min_train_nodes=self.n_select, min_evaluate_nodes=n_clients,
                         min_available_nodes=n_clients, weighted_by_key="num-examples")
        self.fed = fed
        self.nodes = list(nodes)
        self.client_of = {node: cid for cid, node in enumerate(self.nodes)}
        self.n_train, self.n_val = list(n_train), list(n_val)
        self.setup_json = setup_json
        self.batch_size = batch_size
        self.kinds = kinds
        self.aggregate = get_aggregation(fed.aggregation)
        self.first_round = first_round
        self._round = None

    def summary(self):
        log(_INFO, "\t├──> FedSPDnet: %d clients, %d per round, aggregation %r, weighting %r",
            len(self.nodes), self.n_select, self.fed.aggregation, self.fed.weighting)

    # ------------------------------------------------------------------ helpers
    def _config(self, cid, **extra):
        return ConfigRecord({"client-id": int(cid), "setup": self.setup_json, **extra})

    def _local(self, cid):
        return to_array_record(self.fed._local_states.get(int(cid), {}))

    def _replies_by_client(self, replies, key):
        """``{client id: reply}``; replies from unknown nodes or with a wrong id are errors."""
        out = {}
        for message in replies:
            cid = self.client_of.get(message.metadata.src_node_id)
            if cid is None:
                raise RuntimeError(f"reply from unknown node {message.metadata.src_node_id}")
            if not message.has_error() and int(message.content[key]["client-id"]) != cid:
                raise RuntimeError(f"node {message.metadata.src_node_id} of client {cid} answered as "
                                   f"client {message.content[key]['client-id']}")
            out[cid] = message
        return out

    # ------------------------------------------------------------------ train
    def configure_train(self, server_round, arrays, config, grid):
        fed = self.fed
        if fed._schedule.should_stop:
            self._round = None
            return []
        t = self.first_round + server_round - 1
        start = time.perf_counter()
        selected, seeds = fed._select_clients(t, len(self.nodes), self.n_select)
        self._round = {"t": t, "selected": selected, "start": start}
        messages = []
        for cid, seed in zip(selected, seeds):
            cfg = self._config(cid, **{"server-round": server_round, "round": t, "lr": float(fed._schedule.lr),
                                       "local-epochs": int(fed.local_epochs), "batch-size": int(self.batch_size),
                                       "seed": int(seed)})
            content = RecordDict({"arrays": arrays, "local": self._local(cid), "config": cfg})
            messages.append(Message(content=content, message_type=MessageType.TRAIN,
                                    dst_node_id=self.nodes[cid]))
        log(_INFO, "configure_train: round %d, clients %s", t, selected.tolist())
        return messages

    def aggregate_train(self, server_round, replies):
        if self._round is None:
            return None, None
        t, selected = self._round["t"], self._round["selected"]
        by_client = self._replies_by_client(list(replies), "metrics")
        results = []
        for cid in selected:  # sorted client ids
            message = by_client.get(int(cid))
            if message is None:
                results.append(TimeoutError(f"no reply from the node of client {cid} in time"))
            elif message.has_error():
                results.append(RuntimeError(f"ClientApp error: {message.error.reason}"))
            else:
                metrics = message.content["metrics"]
                results.append((from_array_record(message.content["arrays"]), float(metrics["train-loss"]),
                                int(metrics["skipped-batches"])))
        record = self.fed._aggregate_train(t, selected, results, self.n_train, self.kinds, self.aggregate)
        self._round["record"] = record
        metrics = MetricRecord({"train-loss": record["train_loss"], "n-clients": len(record["clients"]),
                                "n-failed": len(record["failed_clients"])})
        return to_array_record(self.fed._global), metrics

    # ------------------------------------------------------------------ evaluate
    def configure_evaluate(self, server_round, arrays, config, grid):
        if self._round is None:
            return []
        return [Message(content=RecordDict({"arrays": arrays, "local": self._local(cid),
                                            "config": self._config(cid, **{"server-round": server_round})}),
                        message_type=MessageType.EVALUATE, dst_node_id=node)
                for cid, node in enumerate(self.nodes) if self.n_val[cid] > 0]

    def aggregate_evaluate(self, server_round, replies):
        if self._round is None:
            return None
        fed, t, record = self.fed, self._round["t"], self._round["record"]
        by_client = self._replies_by_client(list(replies), "metrics")
        scores = []
        for cid in range(len(self.nodes)):
            if self.n_val[cid] == 0:
                continue
            message = by_client.get(cid)
            if message is None or message.has_error():
                reason = "no reply in time" if message is None else message.error.reason
                if fed.on_client_error == "raise":
                    raise RuntimeError(f"client {cid} failed to evaluate in round {t}: {reason}")
                log(_WARNING, "client %d left out of round %d's validation: %s", cid, t, reason)
                continue
            metrics = message.content["metrics"]
            scores.append((int(metrics["num-examples"]), float(metrics["val-loss"]), float(metrics["val-f1"])))
        record = fed._finish_round(record, *_pool_scores(scores))
        record["wall_time"] = time.perf_counter() - self._round["start"]
        fed.history_.append(record)
        self._round = None
        return MetricRecord({"val-loss": record["val_loss"], "val-f1": record["val_f1"], "lr": record["lr"]})


# ---------------------------------------------------------------------- set-up
def connect_sites(grid, n_sites, timeout):
    """Wait until ``n_sites`` SuperNodes are connected; return their node ids."""
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


def _probe(shape):
    """A one-sample input of the sites' shape that the estimator's validation accepts
    (identity matrices), to set the server's shape attributes without any site data."""
    return np.broadcast_to(np.eye(shape[-2], shape[-1]), (1, *shape)).copy()


def serve(fed, grid, *, n_sites, seed=None, estimator_factory=None, timeout=3600.0, connect_timeout=600.0,
          client_source=None, client_groups=None):
    """Fit ``fed`` (a :class:`~skfedspd.FederatedSPDnetClassifier`) through a Flower Grid.

    The ServerApp body of both the in-process simulation and a deployment. The client ids
    are the sites' (``client-id`` of each node's configuration, or the simulation's
    ``partition-id``); they must be ``0..n_sites-1``.

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
    """
    fed._check_params()
    if fed.checkpoint_path:
        raise ValueError("checkpoint_path is not supported by the Flower backend (the local backend only)")
    resume = fed.warm_start and fed.__sklearn_is_fitted__()
    if resume and not hasattr(fed, "_flower_statistic"):
        raise ValueError("warm_start continues a Flower fit only from a Flower fit")
    est = fed.global_estimator_ if resume else clone(fed.estimator if fed.estimator is not None else SPDnetClassifier())
    est.check_params()
    nodes = connect_sites(grid, n_sites, connect_timeout)
    seed = fed._seed_ if resume else (fed._draw_seed() if seed is None else int(seed))

    # 1. set-up: who is who, the sites' labels, shapes, split sizes and input statistics
    setup = {"estimator": None if estimator_factory is not None else _spec.estimator_to_spec(est),
             "classes": None, "seed": seed, "validation_fraction": fed.validation_fraction,
             "input_statistic": None, "ready": False}
    infos = _query(grid, nodes, "setup", {node: {"setup": _spec.dumps(setup)} for node in nodes}, "site", timeout)
    client_node = {}
    for node, info in infos.items():
        cid = int(info["client-id"])
        if cid in client_node:
            raise ValueError(f"client id {cid} is configured on two nodes ({client_node[cid]}, {node})")
        client_node[cid] = node
    if sorted(client_node) != list(range(len(nodes))):
        raise ValueError(f"the sites' client ids must be 0..{len(nodes) - 1}, got {sorted(client_node)}")
    node_of = [client_node[cid] for cid in range(len(nodes))]
    shapes = {tuple(infos[node]["shape"]) for node in node_of}
    if len(shapes) != 1:
        raise ValueError(f"the sites' samples differ in shape: {sorted(shapes)}")
    labels = np.unique(np.concatenate([np.asarray(_spec.loads(infos[node]["labels"])) for node in node_of]))
    if resume:
        unseen = np.setdiff1d(labels, fed.classes_)
        if len(unseen):
            raise ValueError(f"y contains labels not in classes: {unseen.tolist()}")
    else:
        est.check_inputs(_probe(shapes.pop()), reset=True)
        est.set_classes(labels)
    n_train = [int(infos[node]["num-examples"]) for node in node_of]
    n_val = [int(infos[node]["n-val"]) for node in node_of]
    if not resume:
        stats = [infos[node].get("input-statistic") for node in node_of]
        stats = [None if s is None else float(s) for s in stats]
        fed._init_state(est, seed, stats, n_train)
        fed._flower_statistic = None if stats[0] is None else float(np.average(stats, weights=n_train))
    # 2. from here on every message carries the complete set-up
    setup.update(classes=est.classes_.tolist(), input_statistic=fed._flower_statistic, ready=True)

    fed.classes_ = est.classes_
    fed.n_features_in_ = est.n_features_in_
    fed.n_clients_ = len(node_of)
    fed.global_estimator_ = est
    if client_source is not None:
        fed.client_source_, fed.client_groups_ = client_source, list(client_groups)
    else:
        fed.client_source_, fed.client_groups_ = "flower:client-id", [None] * len(node_of)

    # 3. the rounds
    strategy = SPDnetStrategy(fed, nodes=node_of, n_train=n_train, n_val=n_val, setup_json=_spec.dumps(setup),
                              batch_size=est.batch_size, kinds=est.parameter_kinds(),
                              first_round=len(fed.history_))
    strategy.start(grid, to_array_record(fed._global), num_rounds=fed.n_rounds, timeout=timeout)
    est.set_parameters(fed._schedule.best_state)
    fed.best_round_ = fed._schedule.best_step
    return fed
