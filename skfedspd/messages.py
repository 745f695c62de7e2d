"""The messages of a federated run: what a client replies to the server.

A transport (the local backend's function calls, Flower's messages) only moves them; the
client side (:mod:`skfedspd.client`) builds them and the server side
(:mod:`skfedspd.engine`, :mod:`skfedspd.run`) checks every one before it is used.
"""

from dataclasses import dataclass

__all__ = ["SetupReply", "TrainReply", "EvalReply"]


@dataclass
class SetupReply:
    """One client's answer to the set-up: its ``client_id``, sample ``shape``, the
    ``labels`` it holds (None when the classes were agreed in advance), its training and
    validation sizes ``n_train`` and ``n_val``, ``weight`` (the sum of its training sample
    weights; None without sample weights) and ``statistic`` (its input statistic; None when
    the model has none or the run is private).

    Examples
    --------
    >>> from skfedspd.messages import SetupReply
    >>> SetupReply(0, [4, 4], [0, 1], n_train=27, n_val=3).weight is None
    True
    """

    client_id: int
    shape: list
    labels: list
    n_train: int
    n_val: int
    weight: float = None
    statistic: float = None


@dataclass
class TrainReply:
    """One client's answer to a train message: ``params`` (``{name: ndarray}``, every name
    of the model, ``"local"`` ones included), ``loss`` (mean training loss), ``n_skipped``
    (batches with a non-finite loss or gradient), ``n_examples`` (training samples) and
    ``weight`` (the sum of its training samples' weights when it trained with
    ``sample_weight``; None: ``n_examples``), its aggregation weight; and, from a client
    simulated by the local backend that keeps its optimizer state, ``optimizer_state``
    (its Adam state after the round), which no server step reads: the engine only keeps it
    for that client (:attr:`~skfedspd.engine.FederatedEngine.client_optimizer_states`). A
    Flower site keeps its own and never sends it.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.messages import TrainReply
    >>> from skfedspd.stiefel import random_stiefel
    >>> reply = TrainReply({"W": random_stiefel(4, 2, rng=0), "b": np.zeros(2)}, loss=0.69, n_skipped=0,
    ...                    n_examples=30)
    >>> reply.weight is None  # aggregated with weight n_examples
    True
    """

    params: dict
    loss: float
    n_skipped: int
    n_examples: int
    weight: float = None
    optimizer_state: dict = None


@dataclass
class EvalReply:
    """One client's validation of the global model: ``loss``, macro-``f1``, ``n_examples``.

    Examples
    --------
    >>> from skfedspd.messages import EvalReply
    >>> EvalReply(loss=0.61, f1=0.75, n_examples=4)
    EvalReply(loss=0.61, f1=0.75, n_examples=4)
    """

    loss: float
    f1: float
    n_examples: int
