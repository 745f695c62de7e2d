"""Server-side aggregation rules of FedSPDnet, as pure functions on named numpy arrays.

Every rule has the signature used by :class:`~skfedspd.FederatedSPDnetClassifier`
(its ``aggregation=`` parameter also accepts any callable with this signature)::

    rule(client_params, weights, previous, kinds) -> dict

- ``client_params``: list of ``{name: ndarray}``, one per client that replied;
- ``weights``: 1-D array of non-negative client weights summing to 1;
- ``previous``: the previous global ``{name: ndarray}`` (the broadcast of this round);
- ``kinds``: ``{name: "stiefel" | "euclidean" | "local"}``.

It returns the new global ``{name: ndarray}`` for every non-``"local"`` name (``"local"``
arrays, e.g. BatchNorm statistics, never leave a client).

Secure-aggregation compatibility: ProjAvg and RLAvg depend on the clients *only through the
weighted sum* ``Σ_i w_i θ_i`` of their arrays (ProjAvg: ``uf(Σ w_i W_i)``; RLAvg:
``R_W(Σ w_i L_W(W_i)) = R_W(P_W(Σ w_i W_i − W))`` because ``L_W`` is affine and
``Σ w_i = 1``). A secure-aggregation protocol that reveals only that sum therefore gives
the identical result: see :func:`projavg_from_sum` / :func:`rlavg_from_sum`.

Reference rule, for research use: :func:`karcher`, the weighted Karcher (Fréchet) mean of the
clients' Stiefel arrays under the canonical metric, by Riemannian gradient descent with the
Stiefel exponential / logarithm of :mod:`skfedspd.stiefel`. It is exact but iterative and
costly (~10²–10³× one ProjAvg/RLAvg step: 5·10²–2.5·10³× for 53 clients on ``St(64, 18)``
in ``benchmarks/bench_federated.py``, P4), and it does not reduce to the weighted sum.

Why there is no "R-barycenter" (RLAvg iterated at its own output until it stops moving): its
fixed points are ProjAvg. With ``S = Σ_i w_i W_i`` and ``Σ w_i = 1``, a fixed point ``W``
satisfies ``0 = Σ w_i L_W(W_i) = P_W(S − W) = P_W(S)`` (``P_W(W) = 0`` on the manifold), i.e.
``S = W sym(WᵀS)``. When ``sym(WᵀS)`` is positive definite this is the polar decomposition
of ``S``, so by its uniqueness ``W = uf(S)`` = ProjAvg; conversely ``W = uf(S)`` gives
``WᵀS = (SᵀS)^{1/2}``, symmetric, hence ``P_W(S) = 0``. (The other solutions, with
``sym(WᵀS)`` indefinite, are for distinct singular values the sign-flipped polar factors
``U diag(±1) Vᵀ`` of ``S = U Σ Vᵀ``: not means.) Started from ProjAvg the iteration does not
move, so the R-barycenter is ProjAvg at a greater cost, not an independent reference.
"""

import numpy as np

from .stiefel import lift, polar, retract, stiefel_exp, stiefel_log

__all__ = [
    "client_weights",
    "weighted_sum",
    "projavg",
    "rlavg",
    "projavg_from_sum",
    "rlavg_from_sum",
    "karcher",
    "AGGREGATIONS",
    "SUM_RULES",
    "get_aggregation",
]


def client_weights(n_samples, weighting="n_samples"):
    """Normalised client weights: proportional to sample counts, or uniform.

    Examples
    --------
    >>> from skfedspd.aggregation import client_weights
    >>> client_weights([10, 30])
    array([0.25, 0.75])
    >>> client_weights([10, 30], weighting="uniform")
    array([0.5, 0.5])
    """
    n_samples = np.asarray(n_samples, dtype=np.float64)
    if weighting == "uniform":
        raw = np.ones_like(n_samples)
    elif weighting == "n_samples":
        raw = n_samples
    else:
        raise ValueError(f"weighting must be 'n_samples' or 'uniform', got {weighting!r}")
    if raw.ndim != 1 or len(raw) == 0 or (n_samples < 0).any() or (raw < 0).any() or raw.sum() <= 0:
        raise ValueError(f"client weights must be non-negative with a positive sum, got {n_samples.tolist()}")
    return raw / raw.sum()


def weighted_sum(client_params, weights, kinds):
    """``{name: Σ_i w_i θ_i[name]}`` over the non-local names.

    Examples
    --------
    ``"local"`` arrays (e.g. BatchNorm statistics) are left out:

    >>> import numpy as np
    >>> from skfedspd.aggregation import weighted_sum
    >>> clients = [{"b": np.array([0.0, 1.0]), "bn": np.ones(2)}, {"b": np.array([2.0, 3.0]), "bn": np.ones(2)}]
    >>> weighted_sum(clients, [0.5, 0.5], {"b": "euclidean", "bn": "local"})
    {'b': array([1., 2.])}
    """
    if len(client_params) != len(weights):
        raise ValueError(f"{len(client_params)} client parameter sets but {len(weights)} weights")
    names = [name for name, kind in kinds.items() if kind != "local"]
    return {
        name: sum(w * np.asarray(params[name], dtype=np.float64) for w, params in zip(weights, client_params))
        for name in names
    }


def projavg_from_sum(summed, previous, kinds):
    """ProjAvg from the weighted sum: Stiefel arrays → polar factor (eq. 7), others as is.

    Examples
    --------
    What a secure-aggregation protocol reveals (the weighted sum) is enough:

    >>> import numpy as np
    >>> from skfedspd.aggregation import projavg, projavg_from_sum, weighted_sum
    >>> from skfedspd.stiefel import random_stiefel
    >>> kinds = {"W": "stiefel"}
    >>> clients = [{"W": random_stiefel(5, 2, rng=seed)} for seed in range(3)]
    >>> weights = [0.2, 0.3, 0.5]
    >>> summed = weighted_sum(clients, weights, kinds)
    >>> bool(np.allclose(projavg_from_sum(summed, None, kinds)["W"], projavg(clients, weights, None, kinds)["W"]))
    True
    """
    return {name: polar(value) if kinds[name] == "stiefel" else value for name, value in summed.items()}


def rlavg_from_sum(summed, previous, kinds):
    """RLAvg from the weighted sum: ``R_W(P_W(Σ w_i W_i − W))`` (eq. 10–11) on Stiefel arrays.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.aggregation import rlavg, rlavg_from_sum, weighted_sum
    >>> from skfedspd.stiefel import random_stiefel
    >>> kinds = {"W": "stiefel"}
    >>> previous = {"W": random_stiefel(5, 2, rng=0)}
    >>> clients = [{"W": random_stiefel(5, 2, rng=seed)} for seed in (1, 2)]
    >>> summed = weighted_sum(clients, [0.5, 0.5], kinds)
    >>> bool(np.allclose(rlavg_from_sum(summed, previous, kinds)["W"], rlavg(clients, [0.5, 0.5], previous, kinds)["W"]))
    True
    """
    out = {}
    for name, value in summed.items():
        if kinds[name] == "stiefel":
            W = np.asarray(previous[name], dtype=np.float64)
            out[name] = retract(W, lift(W, value))
        else:
            out[name] = value
    return out


def projavg(client_params, weights, previous, kinds):
    """ProjAvg: polar projection of the weighted arithmetic mean (Stiefel), weighted mean (others).

    Examples
    --------
    Two clients, each with a Stiefel weight ``W`` and a Euclidean bias ``b``:

    >>> import numpy as np
    >>> from skfedspd.aggregation import client_weights, projavg
    >>> from skfedspd.stiefel import orthonormality_error, random_stiefel
    >>> kinds = {"W": "stiefel", "b": "euclidean"}
    >>> clients = [{"W": random_stiefel(6, 3, rng=0), "b": np.zeros(2)},
    ...            {"W": random_stiefel(6, 3, rng=1), "b": np.ones(2)}]
    >>> new = projavg(clients, client_weights([30, 10]), None, kinds)
    >>> orthonormality_error(new["W"]) < 1e-14, new["b"]
    (True, array([0.25, 0.25]))
    """
    return projavg_from_sum(weighted_sum(client_params, weights, kinds), previous, kinds)


def rlavg(client_params, weights, previous, kinds):
    """RLAvg: ``R_{W_prev}(Σ_i w_i L_{W_prev}(W_i))`` (Stiefel), weighted mean (others).

    Examples
    --------
    Clients that moved a little from the broadcast ``previous``: RLAvg and ProjAvg agree to
    second order in the clients' spread.

    >>> import numpy as np
    >>> from skfedspd.aggregation import projavg, rlavg
    >>> from skfedspd.stiefel import random_stiefel, retract, tangent_project
    >>> kinds = {"W": "stiefel"}
    >>> W = random_stiefel(6, 3, rng=0)
    >>> rng = np.random.default_rng(1)
    >>> clients = [{"W": retract(W, 1e-3 * tangent_project(W, rng.standard_normal((6, 3))))} for _ in range(4)]
    >>> weights = np.full(4, 0.25)
    >>> gap = np.abs(rlavg(clients, weights, {"W": W}, kinds)["W"] - projavg(clients, weights, {"W": W}, kinds)["W"]).max()
    >>> bool(gap < 1e-5)
    True
    """
    return rlavg_from_sum(weighted_sum(client_params, weights, kinds), previous, kinds)


def karcher(client_params, weights, previous, kinds, tol=1e-11, max_iter=200, return_iterations=False):
    """Weighted Karcher (Fréchet) mean under the canonical metric (Stiefel), weighted mean (others).

    For each Stiefel array, the minimiser of ``Σ_i w_i d(W, W_i)²`` with ``d`` the geodesic
    distance of the canonical metric, found by Riemannian gradient descent with unit step

        ``W ← Exp_W(Σ_i w_i Log_W(W_i))``

    started from ProjAvg, until the Riemannian gradient ``Σ_i w_i Log_W(W_i)`` has Frobenius
    norm ``≤ tol`` (first-order optimality; the returned ``W`` is the last iterate at which
    it was measured). ``Exp`` / ``Log`` are :func:`~skfedspd.stiefel.stiefel_exp` /
    :func:`~skfedspd.stiefel.stiefel_log`. Euclidean arrays: the weighted mean; ``"local"``
    arrays are left out, as in every rule.

    The *research-use iterative reference* of the aggregation benchmark: each iteration
    takes one Stiefel logarithm per client (itself iterative), so it costs ~10²–10³ times one
    ProjAvg/RLAvg step (hundreds of ms for 53 clients on ``St(64, 18)``); and it depends on
    each client's array, not only on their weighted sum (no secure aggregation). Like ProjAvg
    it ignores ``previous``. ProjAvg and RLAvg agree with it to ``O(δ²)`` for clients within
    ``δ`` of each other.

    Parameters
    ----------
    client_params, weights, previous, kinds
        As for every rule (see the module docstring).
    tol : float, default=1e-11
        Stop when ``‖Σ_i w_i Log_W(W_i)‖_F ≤ tol``.
    max_iter : int, default=200
        Maximum number of gradient steps per Stiefel array.
    return_iterations : bool, default=False
        Also return ``{name: number of gradient steps}`` (Stiefel arrays).

    Returns
    -------
    dict or (dict, dict)
        The new global ``{name: ndarray}``, and the iteration counts if requested.

    Raises
    ------
    RuntimeError
        If the descent does not converge in ``max_iter`` steps, or if the Stiefel logarithm
        from the current iterate to some client fails (that client is too far from the
        others: beyond the range where the mean and the logarithm are well defined).

    References
    ----------
    .. [1] H. Karcher, "Riemannian center of mass and mollifier smoothing", Comm. Pure Appl.
       Math. 30(5):509–541, 1977.
    .. [2] A. Edelman, T. A. Arias and S. T. Smith, "The geometry of algorithms with
       orthogonality constraints", SIAM J. Matrix Anal. Appl. 20(2):303–353, 1998.
    .. [3] R. Zimmermann, "A matrix-algebraic algorithm for the Riemannian logarithm on the
       Stiefel manifold under the canonical metric", SIAM J. Matrix Anal. Appl.
       38(2):322–342, 2017.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.aggregation import karcher, projavg
    >>> from skfedspd.stiefel import random_stiefel, retract, tangent_project
    >>> kinds = {"W": "stiefel"}
    >>> W = random_stiefel(5, 2, rng=0)
    >>> rng = np.random.default_rng(1)
    >>> clients = [{"W": retract(W, 0.05 * tangent_project(W, rng.standard_normal((5, 2))))} for _ in range(3)]
    >>> mean, iterations = karcher(clients, [0.2, 0.3, 0.5], None, kinds, return_iterations=True)
    >>> iterations["W"] > 0, bool(np.allclose(mean["W"], projavg(clients, [0.2, 0.3, 0.5], None, kinds)["W"], atol=1e-3))
    (True, True)
    """
    weights = np.asarray(weights, dtype=np.float64)
    summed = weighted_sum(client_params, weights, kinds)
    current = projavg_from_sum(summed, previous, kinds)
    iterations = {}
    for name, kind in kinds.items():
        if kind != "stiefel":
            continue
        Ws = [np.asarray(params[name], dtype=np.float64) for params in client_params]
        W = current[name]
        for it in range(max_iter + 1):
            grad = np.zeros_like(W)
            for i, (w, Wi) in enumerate(zip(weights, Ws)):
                if w == 0:
                    continue
                try:
                    grad += w * stiefel_log(W, Wi)
                except RuntimeError as err:
                    raise RuntimeError(
                        f"Karcher mean of {name!r}: client {i} is too far from the current mean for the "
                        f"Stiefel logarithm (gradient step {it}): {err}"
                    ) from err
            norm = np.linalg.norm(grad)
            if norm <= tol:
                break
            if it == max_iter:
                raise RuntimeError(
                    f"Karcher mean of {name!r} did not converge in {max_iter} iterations "
                    f"(gradient norm {norm:.2e} > tol = {tol:g})"
                )
            W = stiefel_exp(W, grad)
        current[name] = W
        iterations[name] = it
    return (current, iterations) if return_iterations else current


#: The rules that ``FederatedSPDnetClassifier(aggregation=...)`` accepts by name.
AGGREGATIONS = {"projavg": projavg, "rlavg": rlavg, "karcher": karcher}
#: The rules that are functions of the weighted sum only (usable under secure aggregation).
SUM_RULES = {"projavg": projavg_from_sum, "rlavg": rlavg_from_sum}


def get_aggregation(aggregation):
    """Resolve ``"projavg" | "rlavg" | "karcher"`` or a callable to a rule.

    Examples
    --------
    >>> from skfedspd.aggregation import get_aggregation, rlavg
    >>> get_aggregation("rlavg") is rlavg
    True
    """
    if callable(aggregation):
        return aggregation
    if aggregation in AGGREGATIONS:
        return AGGREGATIONS[aggregation]
    raise ValueError(f"aggregation must be one of {sorted(AGGREGATIONS)} or a callable, got {aggregation!r}")
