"""The messages of a federated run: what a client replies to the server (built by
:mod:`skfedspd.client`, checked by :mod:`skfedspd.engine` and :mod:`skfedspd.run`).
"""

from dataclasses import dataclass

__all__ = ["SetupReply", "TrainReply", "EvalReply"]


@dataclass
class SetupReply:
    """One client's answer to the set-up: ``client_id``, sample ``shape``, ``labels`` (None when
    agreed), ``n_train``, ``n_val``, ``weight`` and ``statistic``.

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
    """One client's answer to a train message: ``params``, ``loss``, ``n_skipped``,
    ``n_examples``, ``weight`` (None: ``n_examples``) and, for a local client that keeps it,
    its ``optimizer_state``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.messages import TrainReply
    >>> TrainReply({"b": np.zeros(2)}, loss=0.69, n_skipped=0, n_examples=30).weight is None
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
