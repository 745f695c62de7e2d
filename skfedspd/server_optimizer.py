"""Server optimizer of a federated round: FedAvgM on the Stiefel manifold, as pure functions.

With the aggregate ``θ̄``, the previous model ``θ``, the buffer ``m``, the server learning
rate ``η`` and momentum ``β``: Euclidean arrays ``m ← β m + (θ̄ − θ)``, ``θ ← θ + η m``;
Stiefel arrays ``m ← β m + R_W⁻¹(W̄)``, ``W⁺ = uf(W + η m)``, ``m ← P_{W⁺}(m)``. The
inverse polar retraction makes the unit step exact (``η = 1, β = 0`` returns ``W̄``).
The step uses only ``θ̄`` and the server's state, so it runs under secure aggregation
(``docs/guide/federation.md``).
"""

from numbers import Real

import numpy as np
import scipy.linalg
from sklearn.utils._param_validation import Interval

from .stiefel import lift, retract, tangent_project
from .training import Settings

__all__ = ["ServerMomentum", "inverse_retract", "server_step", "is_identity_step"]


def is_identity_step(lr, momentum):
    """Whether ``(η, β)`` make the new global model the aggregate itself (the paper).

    Examples
    --------
    >>> from skfedspd.server_optimizer import is_identity_step
    >>> is_identity_step(1.0, 0.0), is_identity_step(1.0, 0.9)
    (True, False)
    """
    return lr == 1 and momentum == 0


def inverse_retract(W, W_bar):
    """``R_W⁻¹(W̄)``: the tangent ``ξ`` at ``W`` with ``uf(W + ξ) = W̄`` (a Lyapunov solve);
    ``P_W(W̄ − W)`` where it does not exist.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.server_optimizer import inverse_retract
    >>> from skfedspd.stiefel import random_stiefel, retract
    >>> W = random_stiefel(5, 2, rng=0)
    >>> W_bar = retract(W, 0.5 * np.random.default_rng(1).standard_normal((5, 2)))
    >>> bool(np.allclose(retract(W, inverse_retract(W, W_bar)), W_bar))
    True
    """
    W, W_bar = np.asarray(W, dtype=np.float64), np.asarray(W_bar, dtype=np.float64)
    A = W.T @ W_bar
    k = A.shape[0]
    if np.linalg.eigvals(A).real.min() > 0:
        M = scipy.linalg.solve_continuous_lyapunov(A, 2.0 * np.eye(k))
        M = 0.5 * (M + M.T)
        if np.isfinite(M).all() and np.linalg.eigvalsh(M).min() > 0:
            return tangent_project(W, W_bar @ M - W)  # tangent already; projection removes round-off
    return lift(W, W_bar)


def server_step(aggregate, previous, momentum, kinds, *, lr=1.0, beta=0.0):
    """One server-optimizer step (formulas in the module docstring).

    Parameters
    ----------
    aggregate : dict of str to ndarray
        The aggregation rule's output ``θ̄``.
    previous : dict of str to ndarray
        The previous global model ``θ``.
    momentum : dict of str to ndarray
        The buffer ``m``; a missing name is zero.
    kinds : dict of str to {"stiefel", "euclidean", "local"}
    lr : float, default=1.0
    beta : float, default=0.0

    Returns
    -------
    new_global, new_momentum : dict, dict

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.server_optimizer import server_step
    >>> kinds = {"b": "euclidean"}
    >>> new, m = server_step({"b": np.ones(2)}, {"b": np.zeros(2)}, {"b": np.ones(2)}, kinds, lr=1.0, beta=0.9)
    >>> new["b"]
    array([1.9, 1.9])
    """
    new_global, new_momentum = {}, {}
    for name in aggregate:
        kind = kinds[name]
        theta = np.asarray(previous[name], dtype=np.float64)
        target = np.asarray(aggregate[name], dtype=np.float64)
        m = beta * np.asarray(momentum.get(name, 0.0), dtype=np.float64)
        if kind == "stiefel":
            m = m + inverse_retract(theta, target)
            updated = retract(theta, lr * m)
            new_momentum[name] = tangent_project(updated, m)
        elif kind == "euclidean":
            m = m + (target - theta)
            updated = theta + lr * m
            new_momentum[name] = m
        else:
            raise ValueError(f"server_step got the {kind!r} array {name!r}: only shared arrays are stepped")
        new_global[name] = updated
    return new_global, new_momentum


class ServerMomentum(Settings):
    """The server optimizer of a federated fit: FedAvgM on the Stiefel manifold
    (:func:`server_step`); its buffer is part of the checkpoint.

    Parameters
    ----------
    lr : float, default=1.0
        Server learning rate ``η``, > 0.
    momentum : float in [0, 1), default=0.9
        Server momentum ``β``.

    Examples
    --------
    >>> from sklearn.base import clone
    >>> from skfedspd.server_optimizer import ServerMomentum
    >>> clone(ServerMomentum()).set_params(momentum=0.5)
    ServerMomentum(momentum=0.5)
    """

    _parameter_constraints = {
        "lr": [Interval(Real, 0, None, closed="neither")],
        "momentum": [Interval(Real, 0, 1, closed="left")],
    }

    def __init__(self, lr=1.0, momentum=0.9):
        self.lr = lr
        self.momentum = momentum
