"""FedSPDnet's rounds as a Flower strategy: :class:`SPDnetStrategy`.

The plain strategy, whose sites reply in clear; :class:`~skfedspd.flower.secure.SecureSPDnetStrategy`
builds on it for secure aggregation, and :func:`skfedspd.flower.server.serve` runs either
after the set-up.
"""

import time

from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from flwr.common import log

from ..engine import EvalReply, TrainReply
from .records import from_array_record, to_array_record

__all__ = ["SPDnetStrategy", "ROUND_LOG"]

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
