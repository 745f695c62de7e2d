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

Secure-aggregation compatibility: both rules depend on the clients *only through the
weighted sum* ``Σ_i w_i θ_i`` of their arrays (ProjAvg: ``uf(Σ w_i W_i)``; RLAvg:
``R_W(Σ w_i L_W(W_i)) = R_W(P_W(Σ w_i W_i − W))`` because ``L_W`` is affine and
``Σ w_i = 1``). A secure-aggregation protocol that reveals only that sum therefore gives
the identical result: see :func:`projavg_from_sum` / :func:`rlavg_from_sum`.
"""

import numpy as np

from .stiefel import lift, polar, retract

__all__ = [
    "client_weights",
    "weighted_sum",
    "projavg",
    "rlavg",
    "projavg_from_sum",
    "rlavg_from_sum",
    "r_barycenter",
    "AGGREGATIONS",
    "get_aggregation",
]


def client_weights(n_samples, weighting="n_samples"):
    """Normalised client weights: proportional to sample counts, or uniform."""
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
    """``{name: Σ_i w_i θ_i[name]}`` over the non-local names."""
    if len(client_params) != len(weights):
        raise ValueError(f"{len(client_params)} client parameter sets but {len(weights)} weights")
    names = [name for name, kind in kinds.items() if kind != "local"]
    return {
        name: sum(w * np.asarray(params[name], dtype=np.float64) for w, params in zip(weights, client_params))
        for name in names
    }


def projavg_from_sum(summed, previous, kinds):
    """ProjAvg from the weighted sum: Stiefel arrays → polar factor (eq. 7), others as is."""
    return {name: polar(value) if kinds[name] == "stiefel" else value for name, value in summed.items()}


def rlavg_from_sum(summed, previous, kinds):
    """RLAvg from the weighted sum: ``R_W(P_W(Σ w_i W_i − W))`` (eq. 10–11) on Stiefel arrays."""
    out = {}
    for name, value in summed.items():
        if kinds[name] == "stiefel":
            W = np.asarray(previous[name], dtype=np.float64)
            out[name] = retract(W, lift(W, value))
        else:
            out[name] = value
    return out


def projavg(client_params, weights, previous, kinds):
    """ProjAvg: polar projection of the weighted arithmetic mean (Stiefel), weighted mean (others)."""
    return projavg_from_sum(weighted_sum(client_params, weights, kinds), previous, kinds)


def rlavg(client_params, weights, previous, kinds):
    """RLAvg: ``R_{W_prev}(Σ_i w_i L_{W_prev}(W_i))`` (Stiefel), weighted mean (others)."""
    return rlavg_from_sum(weighted_sum(client_params, weights, kinds), previous, kinds)


def r_barycenter(client_params, weights, previous, kinds, tol=1e-12, max_iter=500):
    """R-barycenter: RLAvg iterated at its own output until it stops moving.

    The fixed point ``W* = R_{W*}(Σ w_i L_{W*}(W_i))`` satisfies ``Σ w_i L_{W*}(W_i) = 0``:
    the weighted lifted vectors balance at ``W*``, a retraction-based counterpart of the
    Karcher mean (exact Riemannian mean needs an iterative Stiefel logarithm). Starts from
    ProjAvg; for research use and as the reference of the aggregation benchmark, far costlier
    than one ProjAvg/RLAvg step. Raises ``RuntimeError`` if it does not converge.
    """
    summed = weighted_sum(client_params, weights, kinds)
    current = projavg_from_sum(summed, previous, kinds)
    for name, kind in kinds.items():
        if kind != "stiefel":
            continue
        W = current[name]
        for _ in range(max_iter):
            W_next = retract(W, lift(W, summed[name]))
            moved = np.linalg.norm(W_next - W)
            W = W_next
            if moved <= tol:
                break
        else:
            raise RuntimeError(f"R-barycenter of {name!r} did not converge in {max_iter} iterations")
        current[name] = W
    return current


AGGREGATIONS = {"projavg": projavg, "rlavg": rlavg, "r_barycenter": r_barycenter}


def get_aggregation(aggregation):
    """Resolve ``"projavg" | "rlavg" | "r_barycenter"`` or a callable to a rule."""
    if callable(aggregation):
        return aggregation
    if aggregation in AGGREGATIONS:
        return AGGREGATIONS[aggregation]
    raise ValueError(f"aggregation must be one of {sorted(AGGREGATIONS)} or a callable, got {aggregation!r}")
