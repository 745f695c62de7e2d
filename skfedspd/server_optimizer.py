"""Server optimizer of a federated round: FedAvgM on the Stiefel manifold, as pure functions.

The aggregation rule (:mod:`skfedspd.aggregation`) turns the clients' replies into an
aggregate ``θ̄``; the server optimizer turns ``θ̄`` into the new global model using only
``θ̄``, the previous global model ``θ`` and its own momentum buffer ``m``. With the
server learning rate ``η`` and momentum ``β``, per array:

- Euclidean (FedAvgM, Hsu et al. 2019; Reddi et al. 2021)::

      Δ = θ̄ − θ,    m ← β m + Δ,    θ ← θ + η m

- Stiefel, ``W ∈ St(p, k)`` (the same step, in the tangent space at ``W``)::

      Δ = R_W⁻¹(W̄)                      pseudo-gradient: inverse polar retraction
      m ← β m + Δ                        m ∈ T_W St (transported there last round)
      W⁺ = R_W(η m) = uf(W + η m)        polar retraction, as the rest of the package
      m ← P_{W⁺}(m)                      vector transport by projection

``R_W⁻¹(W̄)`` is the tangent ``ξ ∈ T_W St`` with ``uf(W + ξ) = W̄``: ``W + ξ = W̄ M`` with
``M`` symmetric positive definite, and ``sym(Wᵀξ) = 0`` is the Lyapunov equation
``A M + M Aᵀ = 2 I``, ``A = WᵀW̄`` (Kaneko, Fiori & Tanaka 2013), so ``ξ = W̄ M − W``. It
exists whenever every eigenvalue of ``A`` has a positive real part (then ``M ≻ 0``), which
holds for any aggregate less than 90° from ``W``; otherwise the projection
``P_W(W̄ − W)`` (the lifting ``L_W``, equal to ``R_W⁻¹`` to second order) is used. The
inverse retraction, not the projection or the Stiefel logarithm, is the pseudo-gradient
because it makes the unit step exact: with ``η = 1, β = 0`` the update returns ``W̄``
itself (to float precision), as FedAvgM with ``η = 1, β = 0`` is FedAvg. The projection
would shrink every step (``uf(W + P_W(W̄ − W)) ≠ W̄``), the logarithm is iterative,
canonical-metric and inconsistent with the polar retraction used for the update.

Secure aggregation: ``θ̄`` is a function of the clients' weighted sum (ProjAvg, RLAvg), and
the step uses nothing else from the clients, so the server optimizer keeps the round a
function of that sum. ``"local"`` arrays are never touched.
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
    """``R_W⁻¹(W̄)``: the tangent ``ξ`` at ``W`` with ``uf(W + ξ) = W̄`` (see module
    docstring); ``P_W(W̄ − W)`` where it does not exist. Numpy, one matrix.

    Examples
    --------
    Unlike the lifting, the unit step along ``ξ`` lands on ``W̄`` exactly:

    >>> import numpy as np
    >>> from skfedspd.server_optimizer import inverse_retract
    >>> from skfedspd.stiefel import lift, random_stiefel, retract
    >>> W = random_stiefel(5, 2, rng=0)
    >>> W_bar = retract(W, 0.5 * np.random.default_rng(1).standard_normal((5, 2)))
    >>> xi = inverse_retract(W, W_bar)
    >>> bool(np.allclose(W.T @ xi + xi.T @ W, 0))  # tangent at W
    True
    >>> bool(np.allclose(retract(W, xi), W_bar)), bool(np.allclose(retract(W, lift(W, W_bar)), W_bar))
    (True, False)
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
        The aggregation rule's output ``θ̄`` (every non-``"local"`` name).
    previous : dict of str to ndarray
        The previous global model ``θ`` (the round's broadcast).
    momentum : dict of str to ndarray
        The buffer ``m`` (tangent at ``previous`` for Stiefel arrays); a missing name is zero.
    kinds : dict of str to {"stiefel", "euclidean", "local"}
    lr : float, default=1.0
        Server learning rate ``η > 0``.
    beta : float, default=0.0
        Server momentum ``β ∈ [0, 1)``.

    Returns
    -------
    new_global, new_momentum : dict, dict
        The new global model (float64) and the buffer, transported to it.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.server_optimizer import server_step
    >>> from skfedspd.stiefel import orthonormality_error, random_stiefel, retract
    >>> kinds = {"W": "stiefel", "b": "euclidean"}
    >>> W = random_stiefel(5, 2, rng=0)
    >>> previous = {"W": W, "b": np.zeros(2)}
    >>> aggregate = {"W": retract(W, 0.5 * np.random.default_rng(1).standard_normal((5, 2))), "b": np.ones(2)}
    >>> new, m = server_step(aggregate, previous, {}, kinds)  # η = 1, β = 0: the aggregate itself
    >>> bool(np.allclose(new["W"], aggregate["W"])), new["b"]
    (True, array([1., 1.]))
    >>> new, m = server_step(aggregate, previous, {"b": np.ones(2)}, kinds, lr=1.0, beta=0.9)
    >>> new["b"], bool(orthonormality_error(new["W"]) < 1e-12)  # 0 + (0.9 · 1 + 1)
    (array([1.9, 1.9]), True)
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
    (``FederatedSPDnetClassifier(server_optimizer=ServerMomentum())``; :func:`server_step`).

    With ``Δ`` the aggregate's tangent vector at the previous global weight ``W`` (inverse
    polar retraction, ``uf(W + Δ)`` = the aggregate) and ``m`` the momentum:
    ``m ← β m + Δ``, ``W ← uf(W + η m)``, then ``m`` is projected onto the tangent space at
    the new ``W``; Euclidean arrays: ``m ← β m + (θ̄ − θ)``, ``θ ← θ + η m``. ``"local"``
    arrays are untouched. The step uses only the aggregate and the server's own state, so it
    keeps the round a function of the clients' weighted sum (secure aggregation). The buffer
    is part of the checkpoint, so a resumed run continues bit for bit.

    Parameters
    ----------
    lr : float, default=1.0
        Server learning rate ``η``, > 0.
    momentum : float in [0, 1), default=0.9
        Server momentum ``β``. With ``lr=1.0`` and ``momentum=0.0`` the aggregate is the new
        global model exactly (the paper; ``server_optimizer=None``).

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
