"""Server-side aggregation rules of FedSPDnet, as pure functions on named numpy arrays.

Every rule has the signature (any callable with it is accepted as ``aggregation=``)::

    rule(client_params, weights, previous, kinds) -> dict

- ``client_params``: list of ``{name: ndarray}``, one per client that replied;
- ``weights``: 1-D array of non-negative client weights summing to 1;
- ``previous``: the previous global ``{name: ndarray}``;
- ``kinds``: ``{name: "stiefel" | "euclidean" | "local"}``.

It returns the new global ``{name: ndarray}`` for every non-``"local"`` name. ProjAvg and
RLAvg depend only on the weighted sum of the clients' arrays (secure aggregation:
:func:`projavg_from_sum`, :func:`rlavg_from_sum`); :func:`karcher` is an iterative
reference; the robust rules (:class:`RobustAggregation`) need each client's arrays
(``docs/guide/robust-aggregation.md``).
"""

import hashlib
from numbers import Real

import numpy as np
from sklearn.base import BaseEstimator, clone
from sklearn.utils._param_validation import Interval, StrOptions

from .stiefel import lift, polar, retract, stiefel_exp, stiefel_log, tangent_project
from .validation import Count

__all__ = [
    "client_weights",
    "weighted_sum",
    "projavg",
    "rlavg",
    "projavg_from_sum",
    "rlavg_from_sum",
    "karcher",
    "client_distances",
    "RobustAggregation",
    "GeometricMedian",
    "TrimmedMean",
    "Krum",
    "FLTrust",
    "tangent_updates",
    "AGGREGATIONS",
    "SUM_RULES",
    "get_aggregation",
    "check_secure_rule",
    "rule_name",
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
    """Weighted Karcher mean under the canonical metric (Stiefel), weighted mean (others): a
    costly iterative reference, by Riemannian gradient descent from ProjAvg.

    Parameters
    ----------
    client_params, weights, previous, kinds
        As for every rule.
    tol : float, default=1e-11
        Stop when ``‖Σ_i w_i Log_W(W_i)‖_F ≤ tol``.
    max_iter : int, default=200
    return_iterations : bool, default=False
        Also return ``{name: number of gradient steps}``.

    Returns
    -------
    dict or (dict, dict)

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.aggregation import karcher, projavg
    >>> from skfedspd.stiefel import random_stiefel, retract, tangent_project
    >>> W = random_stiefel(5, 2, rng=0)
    >>> rng = np.random.default_rng(1)
    >>> clients = [{"W": retract(W, 0.05 * tangent_project(W, rng.standard_normal((5, 2))))} for _ in range(3)]
    >>> mean = karcher(clients, [0.2, 0.3, 0.5], None, {"W": "stiefel"})
    >>> bool(np.allclose(mean["W"], projavg(clients, [0.2, 0.3, 0.5], None, {"W": "stiefel"})["W"], atol=1e-3))
    True
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


def client_distances(client_params, center, kinds):
    """Each client's Frobenius (chordal, for Stiefel arrays) distance to ``center`` over the
    non-local names.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.aggregation import client_distances
    >>> kinds = {"W": "stiefel", "b": "euclidean", "bn": "local"}
    >>> center = {"W": np.eye(3)[:, :2], "b": np.zeros(2)}
    >>> clients = [{"W": np.eye(3)[:, :2], "b": np.array([3.0, 4.0]), "bn": np.ones(1)},
    ...            {"W": np.eye(3)[:, 1:], "b": np.zeros(2), "bn": np.ones(1)}]
    >>> client_distances(clients, center, kinds)
    array([5., 2.])
    """
    names = [name for name, kind in kinds.items() if kind != "local"]
    return np.array([np.sqrt(sum(np.sum((np.asarray(params[name], dtype=np.float64) - center[name]) ** 2)
                                 for name in names)) for params in client_params])


class RobustAggregation(BaseEstimator):
    """Base class of the robust rules: a callable rule with scikit-learn parameters.

    :meth:`aggregate` returns ``(new global model, effective weights)``, each client's share
    of the model (summing to 1, or all 0 when the rule trusts no client). Subclasses
    implement :meth:`aggregate` and, if needed, :meth:`check_n_clients`. A rule whose
    ``needs_reference`` is true also takes ``reference=``, the server's own update.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.aggregation import TrimmedMean
    >>> rule = TrimmedMean(trim=0.2)
    >>> clients = [{"b": np.array([x])} for x in (0.0, 1.0, 2.0, 3.0, 40.0)]
    >>> rule(clients, np.full(5, 0.2), None, {"b": "euclidean"})
    {'b': array([2.])}
    """

    #: Plain-text name of the rule in error messages.
    label = "robust aggregation"
    #: Whether :meth:`aggregate` needs the server's reference update (``reference=``).
    needs_reference = False

    def __call__(self, client_params, weights, previous, kinds):
        return self.aggregate(client_params, weights, previous, kinds)[0]

    def check_params(self):
        """Raise ValueError (naming the parameter) if a parameter is invalid."""
        self._validate_params()

    def check_n_clients(self, n_clients):
        """Raise ValueError if the rule cannot aggregate ``n_clients`` replies."""
        self.check_params()

    def _normalised_weights(self, client_params, weights, previous=None, kinds=None):
        """Check the parameters and the weights; return the weights normalised to sum 1."""
        self.check_params()
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (len(client_params),):
            raise ValueError(f"{len(client_params)} client parameter sets but weights of shape {weights.shape}")
        if not (np.isfinite(weights).all() and (weights >= 0).all() and weights.sum() > 0):
            raise ValueError(f"{self.label}: client weights must be finite and non-negative with a positive sum, "
                             f"got {weights.tolist()}")
        if kinds is not None and previous is None and "stiefel" in kinds.values():
            raise ValueError(f"{self.label} works in the tangent space at the previous global model: "
                             "previous must be given")
        return weights / weights.sum()


def _tangent_coordinates(client_params, previous, name, kind):
    """The clients' arrays ``name``, Stiefel ones lifted to the tangent space at the previous array."""
    values = [np.asarray(params[name], dtype=np.float64) for params in client_params]
    if kind == "stiefel":
        base = np.asarray(previous[name], dtype=np.float64)
        values = [lift(base, value) for value in values]
    return np.stack(values)


def _from_tangent(mean, previous, name, kind):
    """The global array of a mean of :func:`_tangent_coordinates`."""
    if kind != "stiefel":
        return mean
    base = np.asarray(previous[name], dtype=np.float64)
    return retract(base, tangent_project(base, mean))


class GeometricMedian(RobustAggregation):
    """``"geomedian"``: weighted geometric median of the client models (Weiszfeld iterations in
    the tangent space, from ProjAvg); effective weights: the final Weiszfeld weights.

    Parameters
    ----------
    tol : float, default=1e-6
        Relative stopping tolerance on the Weiszfeld step.
    max_iter : int, default=100
    eps : float, default=1e-9
        Distance floor, in the units of the parameters.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.aggregation import GeometricMedian
    >>> clients = [{"b": np.array([x, -x])} for x in (-0.2, -0.1, 0.0, 0.0, 0.1, 0.2)] + [{"b": np.array([100.0, 0.0])}]
    >>> median, effective = GeometricMedian().aggregate(clients, np.full(7, 1 / 7), None, {"b": "euclidean"})
    >>> bool(np.abs(median["b"]).max() < 1e-3), bool(effective[-1] < 1e-3)
    (True, True)
    """

    label = "the geometric median"
    _parameter_constraints = {
        "tol": [Interval(Real, 0, None, closed="neither")],
        "max_iter": [Count(1)],
        "eps": [Interval(Real, 0, None, closed="neither")],
    }

    def __init__(self, tol=1e-6, max_iter=100, eps=1e-9):
        self.tol = tol
        self.max_iter = max_iter
        self.eps = eps

    def aggregate(self, client_params, weights, previous, kinds):
        weights = self._normalised_weights(client_params, weights)
        current = projavg(client_params, weights, previous, kinds)
        stacks = {name: np.stack([np.asarray(params[name], dtype=np.float64) for params in client_params])
                  for name in current}
        for iteration in range(self.max_iter + 1):
            distances = np.sqrt(sum(((stack - current[name]) ** 2).reshape(len(stack), -1).sum(axis=1)
                                    for name, stack in stacks.items()))
            shares = weights / np.maximum(distances, self.eps)
            shares /= shares.sum()
            target = {name: np.tensordot(shares, stack, axes=1) for name, stack in stacks.items()}
            steps = {name: lift(current[name], target[name]) if kinds[name] == "stiefel"
                     else target[name] - current[name] for name in current}
            step_norm = np.sqrt(sum(np.sum(step ** 2) for step in steps.values()))
            if step_norm <= self.tol * max(float(weights @ distances), self.eps) or iteration == self.max_iter:
                return current, shares
            current = {name: retract(current[name], steps[name]) if kinds[name] == "stiefel" else target[name]
                       for name in current}


class TrimmedMean(RobustAggregation):
    """``"trimmedmean"``: coordinate-wise trimmed mean in the tangent space at the broadcast.

    At every coordinate the ``⌊trim · n⌋`` lowest and highest client values are dropped and
    the rest averaged with their weights; Stiefel arrays are lifted with ``L_{W_prev}`` and
    retracted. Effective weights: each client's share, averaged over the coordinates.

    Parameters
    ----------
    trim : float in [0, 0.5), default=0.25
        Fraction of the clients trimmed from each end at each coordinate; a positive ``trim``
        that trims no client per round is refused at the start of a fit.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.aggregation import TrimmedMean
    >>> clients = [{"b": np.array([1.0, 2.0])}, {"b": np.array([2.0, 3.0])}, {"b": np.array([3.0, 4.0])},
    ...            {"b": np.array([1e6, -1e6])}]
    >>> mean, effective = TrimmedMean(trim=0.25).aggregate(clients, np.full(4, 0.25), None, {"b": "euclidean"})
    >>> mean["b"], effective
    (array([2.5, 2.5]), array([0.25, 0.5 , 0.25, 0.  ]))
    """

    label = "the trimmed mean"
    _parameter_constraints = {"trim": [Interval(Real, 0, 0.5, closed="left")]}

    def __init__(self, trim=0.25):
        self.trim = trim

    def n_trimmed(self, n_clients):
        """Clients trimmed from each end at each coordinate: ``⌊trim · n_clients⌋``."""
        return int(np.floor(self.trim * n_clients + 1e-9))  # 0.29 · 100 is 28.999…

    def check_n_clients(self, n_clients):
        super().check_n_clients(n_clients)
        if self.trim > 0 and self.n_trimmed(n_clients) == 0:
            raise ValueError(f"TrimmedMean(trim={self.trim}) trims no client of {n_clients} per round "
                             f"(⌊trim · {n_clients}⌋ = 0): use trim >= 1/{n_clients}, "
                             "or trim=0 for the plain mean")

    def aggregate(self, client_params, weights, previous, kinds):
        # Per round, fewer clients than planned (failed replies) may trim none: not an error.
        weights = self._normalised_weights(client_params, weights, previous, kinds)
        n = len(client_params)
        k = self.n_trimmed(n)
        out, shares, n_coordinates = {}, np.zeros(n), 0
        for name, kind in kinds.items():
            if kind == "local":
                continue
            values = _tangent_coordinates(client_params, previous, name, kind)
            kept = np.argsort(values, axis=0, kind="stable")[k:n - k]
            kept_weights = weights[kept]
            total = kept_weights.sum(axis=0)
            if not (total > 0).all():
                raise ValueError(f"the trimmed mean of {name!r}: the clients kept at some coordinate all have "
                                 "zero weight")
            mean = (kept_weights * np.take_along_axis(values, kept, axis=0)).sum(axis=0) / total
            out[name] = _from_tangent(mean, previous, name, kind)
            shares += np.bincount(kept.ravel(), weights=(kept_weights / total).ravel(), minlength=n)
            n_coordinates += mean.size
        return out, (shares / n_coordinates if n_coordinates else weights)


class Krum(RobustAggregation):
    """``"krum"``: multi-Krum (Blanchard et al., 2017) with distances in the tangent space at the
    broadcast; the ``n_selected`` clients of lowest score are averaged. Needs ``n > 2f + 2``.

    Parameters
    ----------
    n_faulty : int, default=1
        ``f``, the number of faulty clients tolerated.
    n_selected : int or None, default=None
        The clients averaged: 1 is Krum; None: ``n − f``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.aggregation import Krum
    >>> clients = [{"b": np.array([x])} for x in (1.0, 1.1, 0.9, 1.05, 50.0)]
    >>> Krum(n_faulty=1).aggregate(clients, np.full(5, 0.2), {"b": np.zeros(1)}, {"b": "euclidean"})[1]
    array([0.25, 0.25, 0.25, 0.25, 0.  ])
    """

    label = "Krum"
    _parameter_constraints = {
        "n_faulty": [Count(0)],
        "n_selected": [None, Count(1)],
    }

    def __init__(self, n_faulty=1, n_selected=None):
        self.n_faulty = n_faulty
        self.n_selected = n_selected

    def check_n_clients(self, n_clients):
        super().check_n_clients(n_clients)
        f = self.n_faulty
        if not n_clients > 2 * f + 2:
            raise ValueError(f"Krum(n_faulty={f}) needs more than 2·n_faulty + 2 = {2 * f + 2} clients per round, "
                             f"got {n_clients}")
        if self.n_selected is not None and self.n_selected > n_clients - f:
            raise ValueError(f"Krum(n_selected={self.n_selected}) may select at most n − n_faulty = "
                             f"{n_clients - f} of {n_clients} clients")

    def aggregate(self, client_params, weights, previous, kinds):
        self.check_n_clients(len(client_params))
        weights = self._normalised_weights(client_params, weights, previous, kinds)
        n, f = len(client_params), self.n_faulty
        names = [name for name, kind in kinds.items() if kind != "local"]
        coordinates = {name: _tangent_coordinates(client_params, previous, name, kinds[name]) for name in names}
        flat = np.concatenate([coordinates[name].reshape(n, -1) for name in names], axis=1)
        squared = ((flat[:, None, :] - flat[None, :, :]) ** 2).sum(axis=2)
        scores = [np.sort(np.delete(squared[i], i))[:n - f - 2].sum() for i in range(n)]
        selected = np.sort(np.argsort(scores, kind="stable")[:self.n_selected or n - f])
        if not weights[selected].sum() > 0:
            raise ValueError(f"Krum selected clients {selected.tolist()}, all of zero weight")
        shares = np.zeros(n)
        shares[selected] = weights[selected] / weights[selected].sum()
        out = {name: _from_tangent(np.tensordot(shares, coordinates[name], axes=1), previous, name, kinds[name])
               for name in names}
        return out, shares


def tangent_updates(client_params, previous, kinds):
    """``(n_clients, d)`` matrix of the clients' updates in the tangent space at ``previous``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.aggregation import tangent_updates
    >>> kinds = {"b": "euclidean", "bn": "local"}
    >>> tangent_updates([{"b": np.array([1.0, 2.0]), "bn": np.ones(1)}], {"b": np.array([1.0, 0.0])}, kinds)
    array([[0., 2.]])
    """
    names = [name for name, kind in kinds.items() if kind != "local"]
    rows = []
    for params in client_params:
        parts = []
        for name in names:
            value, base = np.asarray(params[name], dtype=np.float64), np.asarray(previous[name], dtype=np.float64)
            parts.append((lift(base, value) if kinds[name] == "stiefel" else value - base).ravel())
        rows.append(np.concatenate(parts) if parts else np.zeros(0))
    return np.stack(rows)


def _cosines(updates, ref):
    """``cos(g_i, g_0)`` of each row of ``updates`` with ``ref`` (0 where either is zero)."""
    norms = np.linalg.norm(updates, axis=1) * np.linalg.norm(ref)
    dots = updates @ ref
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


class FLTrust(RobustAggregation):
    """Trust by agreement with the server's own update on a public root set (FLTrust, Cao et al.,
    2021, on the Stiefel manifold).

    Client ``i``'s tangent update ``g_i`` gets the weight ``a_i ∝ w_i c_i`` with
    ``c_i = cos(g_i, g_0)`` if ``c_i > threshold`` (else 0), ``g_0`` the server's update on
    ``(X, y)``, each update scaled to ``‖g_0‖``. Options and threat model:
    ``docs/guide/robust-aggregation.md``.

    Parameters
    ----------
    X : array-like of shape (n_root, n_channels, n_channels)
        The root set's inputs: public data of the federation's task.
    y : array-like of shape (n_root,)
    threshold : float in [0, 1), default=0.0
    agreement_scope : {"model", "layer"}, default="model"
        The cosine of the whole update, or the mean of the per-layer cosines.
    trust : {"cosine", "accept"}, default="cosine"
        An agreeing client's weight times its cosine, or its weight.
    magnitude : {"reference", "bounded"}, default="reference"
        Each update stretched or cut to the reference's length, or only cut.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.aggregation import FLTrust
    >>> rule = FLTrust(X=np.stack([np.eye(2)] * 4), y=[0, 1, 0, 1])
    >>> clients = [{"b": np.array([1.0, 0.1])}, {"b": np.array([2.0, -0.1])}, {"b": np.array([-5.0, 0.0])}]
    >>> mean, effective = rule.aggregate(clients, np.full(3, 1 / 3), {"b": np.zeros(2)}, {"b": "euclidean"},
    ...                                  reference={"b": np.array([0.5, 0.0])})
    >>> effective.round(3)
    array([0.499, 0.501, 0.   ])
    """

    label = "FLTrust"
    #: The engine computes the server's reference update each round and passes it as ``reference``.
    needs_reference = True
    _parameter_constraints = {"X": ["array-like"], "y": ["array-like"],
                              "threshold": [Interval(Real, 0, 1, closed="left")],
                              "agreement_scope": [StrOptions({"model", "layer"})],
                              "trust": [StrOptions({"cosine", "accept"})],
                              "magnitude": [StrOptions({"reference", "bounded"})]}

    def __init__(self, X, y, threshold=0.0, agreement_scope="model", trust="cosine", magnitude="reference"):
        self.X = X
        self.y = y
        self.threshold = threshold
        self.agreement_scope = agreement_scope
        self.trust = trust
        self.magnitude = magnitude

    def check_params(self):
        super().check_params()
        X, y = np.asarray(self.X), np.asarray(self.y)
        if X.ndim < 3 or len(X) == 0:
            raise ValueError(f"FLTrust: X must be a non-empty root set of matrices (n_root, n_channels, n_channels), "
                             f"got shape {X.shape}")
        if y.shape != (len(X),):
            raise ValueError(f"FLTrust: y must hold one label per root matrix ({len(X)}), got shape {y.shape}")

    def __repr__(self, N_CHAR_MAX=700):
        # The root set by its shape and digest: a stable, short name (rule_name, checkpoints).
        X, y = np.ascontiguousarray(self.X), np.asarray(self.y)
        digest = hashlib.sha256(X.tobytes() + repr(y.tolist()).encode()).hexdigest()[:12]
        threshold = "" if self.threshold == 0 else f", threshold={self.threshold!r}"
        options = "".join(f", {name}={getattr(self, name)!r}" for name, default in
                          (("agreement_scope", "model"), ("trust", "cosine"), ("magnitude", "reference"))
                          if getattr(self, name) != default)
        return f"FLTrust(X=<root set {X.shape} {digest}>, y=<{len(y)} labels>{threshold}{options})"

    def agreement(self, client_params, reference, previous, kinds):
        """Each client's agreement (cosine) with the reference update at ``previous``."""
        updates, ref = self._tangent_vectors(client_params, reference, previous, kinds)
        return self._agreement(updates, ref, self._blocks(previous, kinds))

    @staticmethod
    def _tangent_vectors(client_params, reference, previous, kinds):
        """The clients' and the reference's updates as tangent vectors at ``previous``, in one pass."""
        vectors = tangent_updates([*client_params, reference], previous, kinds)
        return vectors[:-1], vectors[-1]

    def _blocks(self, previous, kinds):
        """The coordinate slices compared apart: the whole vector, or one per layer."""
        names = [name for name, kind in kinds.items() if kind != "local"]
        sizes = [np.asarray(previous[name]).size for name in names]
        if self.agreement_scope == "model":
            return [slice(0, sum(sizes))]
        blocks, start = {}, 0
        for name, size in zip(names, sizes):
            layer = name.rsplit(".", 1)[0]
            first, _ = blocks.get(layer, (start, start))
            blocks[layer] = (first, start + size)
            start += size
        return [slice(first, end) for first, end in blocks.values()]

    @staticmethod
    def _agreement(updates, ref, blocks):
        """The mean, over ``blocks`` (each counting the same), of each client's cosine with the reference."""
        return np.mean([_cosines(updates[:, block], ref[block]) for block in blocks], axis=0)

    def aggregate(self, client_params, weights, previous, kinds, reference=None):
        weights = self._normalised_weights(client_params, weights, previous, kinds)
        if reference is None:
            raise ValueError("FLTrust needs the server's reference update (reference=...): a federated fit's engine "
                             "computes it on the root set each round")
        if previous is None:
            raise ValueError("FLTrust works in the tangent space at the previous global model: previous must be given")
        names = [name for name, kind in kinds.items() if kind != "local"]
        updates, ref = self._tangent_vectors(client_params, reference, previous, kinds)
        blocks = self._blocks(previous, kinds)
        agreement = self._agreement(updates, ref, blocks)
        trust = np.where(agreement > self.threshold, agreement if self.trust == "cosine" else 1.0, 0.0) * weights
        if not trust.sum() > 0:
            return {name: np.asarray(previous[name], dtype=np.float64) for name in names}, np.zeros(len(weights))
        shares = trust / trust.sum()
        step = np.zeros_like(ref)
        for block in blocks:  # each update at the reference's length, block by block
            norms = np.linalg.norm(updates[:, block], axis=1)
            scale = np.divide(np.linalg.norm(ref[block]), norms, out=np.zeros_like(norms), where=norms > 0)
            if self.magnitude == "bounded":  # at most the reference's length: a short update keeps its own
                scale = np.minimum(scale, 1.0)
            step[block] = (shares * scale) @ updates[:, block]
        out, start = {}, 0
        for name in names:
            base = np.asarray(previous[name], dtype=np.float64)
            part = step[start:start + base.size].reshape(base.shape)
            start += base.size
            out[name] = retract(base, tangent_project(base, part)) if kinds[name] == "stiefel" else base + part
        return out, shares


#: The rules that ``FederatedSPDnetClassifier(aggregation=...)`` accepts by name (the robust
#: ones with their default parameters).
AGGREGATIONS = {"projavg": projavg, "rlavg": rlavg, "karcher": karcher, "geomedian": GeometricMedian(),
                "trimmedmean": TrimmedMean(), "krum": Krum()}
#: The rules that are functions of the weighted sum only (usable under secure aggregation).
SUM_RULES = {"projavg": projavg_from_sum, "rlavg": rlavg_from_sum}


def get_aggregation(aggregation, *, secure=False):
    """Resolve a rule's name (:data:`AGGREGATIONS`) or a callable to a checked rule.

    Examples
    --------
    >>> from skfedspd.aggregation import get_aggregation, rlavg
    >>> get_aggregation("rlavg") is rlavg
    True
    >>> get_aggregation("trimmedmean")
    TrimmedMean()
    """
    if isinstance(aggregation, str) and aggregation in AGGREGATIONS:
        rule = AGGREGATIONS[aggregation]
        rule = clone(rule) if isinstance(rule, RobustAggregation) else rule
    elif callable(aggregation):
        rule = aggregation
    else:
        raise ValueError(f"aggregation must be one of {sorted(AGGREGATIONS)} or a callable, got {aggregation!r}")
    if isinstance(rule, RobustAggregation):
        rule.check_params()  # the clients per round are checked by the engine, when they are known
    if secure:
        check_secure_rule(rule_name(aggregation))
    return rule


def rule_name(aggregation):
    """A stable name for an aggregation rule (never a memory address).

    Examples
    --------
    >>> from skfedspd.aggregation import TrimmedMean, karcher, rule_name
    >>> rule_name("projavg"), rule_name(karcher), rule_name(TrimmedMean(trim=0.3))
    ('projavg', 'skfedspd.aggregation.karcher', 'skfedspd.aggregation.TrimmedMean(trim=0.3)')
    """
    if isinstance(aggregation, str):
        return aggregation
    if isinstance(aggregation, RobustAggregation):
        return f"{type(aggregation).__module__}.{aggregation!r}"
    target = aggregation if hasattr(aggregation, "__qualname__") else type(aggregation)
    return f"{getattr(target, '__module__', '?')}.{target.__qualname__}"


def check_secure_rule(name):
    """Raise ValueError unless the rule called ``name`` is in :data:`SUM_RULES`.

    Examples
    --------
    >>> from skfedspd.aggregation import check_secure_rule
    >>> check_secure_rule("rlavg")
    """
    if name not in SUM_RULES:
        raise ValueError(
            f"secure aggregation reveals only the clients' weighted sum, but aggregation={name!r} is not a "
            "function of the weighted sum: it needs each client's update (a robust rule compares the clients "
            "to down-weight or drop outliers; the Karcher mean and custom callables use each client's arrays): "
            f"use {sorted(SUM_RULES)} under secure aggregation, "
            "or a robust rule without it (secure aggregation hides each update from the server, a robust rule "
            "limits what a faulty update does: one mode addresses each threat)")
