"""The server side of a federated run: :class:`FederatedEngine`, one class for every transport.

The engine owns the run's state and every server decision of a round: the global model,
the clients' ``"local"`` arrays, the seeded choice of clients, the aggregation and the
server optimizer, the plateau schedule in rounds, the history, the failure policy and the
checks of every reply. Each round every transport calls :meth:`FederatedEngine.select`,
:meth:`~FederatedEngine.aggregate` and :meth:`~FederatedEngine.finish_round`, so the same
seed gives the same model on every transport. A reply that fails a check (names, shapes,
dtypes, finite values, orthonormal Stiefel arrays, the update norm, sample counts, metrics
in range) is a failed client, handled by ``on_client_error``.
"""

import copy
import numbers
import warnings

import numpy as np

from .aggregation import RobustAggregation, client_distances, client_weights, get_aggregation, rule_name
from .messages import EvalReply, TrainReply
from .server_optimizer import ServerMomentum, is_identity_step, server_step
from .stiefel import orthonormality_error, orthonormality_problem, stiefel_tolerance
from .training import RoundSchedule, derive_seed
from .validation import is_count, is_positive

__all__ = [
    "FederatedEngine",
    "check_aggregate",
    "client_trust",
    "declared_weights",
    "is_positive_weight",
    "n_selected",
    "stiefel_tolerance",
    "within_declared_weight",
]

STATE_VERSION = 1
_SCHEDULE_CONFIG = ("patience", "lr_patience", "lr_factor", "min_lr")
# A client's weight is summed at set-up (numpy) and after training (torch): the order of
# the summands may differ, not more.
_WEIGHT_RTOL = 1e-9


def n_selected(clients_per_round, n_clients):
    """Clients per round: None → all; int → exactly that many; float in (0, 1] →
    ``max(1, floor(fraction · n_clients))``.

    Examples
    --------
    >>> from skfedspd.engine import n_selected
    >>> n_selected(None, 9), n_selected(4, 9), n_selected(0.5, 9)
    (9, 4, 4)
    """
    m = clients_per_round
    if m is None:
        return n_clients
    if isinstance(m, bool):
        raise ValueError(f"clients_per_round must be None, an int or a float in (0, 1], got {m!r}")
    if isinstance(m, numbers.Integral):
        if not 1 <= m <= n_clients:
            raise ValueError(f"clients_per_round={m} must be between 1 and the {n_clients} clients")
        return int(m)
    if isinstance(m, numbers.Real) and 0 < m <= 1:
        return max(1, int(np.floor(m * n_clients)))
    raise ValueError(f"clients_per_round must be None, an int or a float in (0, 1], got {m!r}")


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_positive_weight(value):
    """Whether ``value`` is a finite real client weight > 0 (not a boolean).

    Examples
    --------
    >>> from skfedspd.engine import is_positive_weight
    >>> is_positive_weight(12), is_positive_weight(0), is_positive_weight(True)
    (True, False, False)
    """
    return is_positive(value)


def within_declared_weight(weight, declared):
    """Whether a client weight is at most the ``declared`` one, up to a relative 1e-9.

    Examples
    --------
    >>> from skfedspd.engine import within_declared_weight
    >>> within_declared_weight(3.0 + 1e-12, 3.0), within_declared_weight(3.1, 3.0)
    (True, False)
    """
    return weight <= declared * (1 + _WEIGHT_RTOL)


def declared_weights(n_train, train_weights):
    """Each client's aggregation weight declared at set-up: its sum of sample weights, else its
    training size.

    Examples
    --------
    >>> from skfedspd.engine import declared_weights
    >>> declared_weights([20, 30], None), declared_weights([20, 30], [12.5, None])
    ([20, 30], [12.5, 30])
    """
    if train_weights is None:
        return list(n_train)
    return [n if w is None else w for n, w in zip(n_train, train_weights)]


def _as_number(weight):
    """A client weight for the history: an int when it is one (sums of integer weights)."""
    weight = float(weight)
    return int(weight) if weight.is_integer() else weight


def _check_arrays(arrays, template, *, what):
    """Why ``arrays`` do not match ``template`` (names, types, shapes, dtypes, finiteness), or None."""
    if not isinstance(arrays, dict):
        return f"{what} are a {type(arrays).__name__}, not a dict of arrays"
    missing = [n for n in template if n not in arrays]
    extra = sorted(str(n) for n in arrays if n not in template)
    if missing:
        return f"{what} lack {missing}"
    if extra:
        return f"{what} have unexpected names {extra}"
    for name, (shape, dtype) in template.items():
        value = arrays[name]
        if not isinstance(value, np.ndarray):
            return f"{what}[{name!r}] is a {type(value).__name__}, not an ndarray"
        if value.shape != tuple(shape):
            return f"{what}[{name!r}] has shape {value.shape}, expected {tuple(shape)}"
        if dtype is not None and value.dtype != dtype:
            return f"{what}[{name!r}] has dtype {value.dtype}, expected {np.dtype(dtype)}"
        if dtype is None and value.dtype.kind != "f":
            return f"{what}[{name!r}] has dtype {value.dtype}, expected a floating dtype"
        if not np.isfinite(value).all():
            return f"{what}[{name!r}] has {int((~np.isfinite(value)).sum())} non-finite values"
    return None


def _check_stiefel(arrays, kinds, what):
    for name, kind in kinds.items():
        if kind == "stiefel":
            problem = orthonormality_problem(arrays[name])
            if problem:
                return f"{what}[{name!r}] {problem}"
    return None


#: An aggregate's Euclidean array may be at most this many times ``1 + ‖broadcast‖ +
#: max_i ‖client_i‖`` in norm (:func:`check_aggregate`). Every built-in rule returns a
#: weighted mean, a coordinate-wise median or trimmed mean, or FLTrust's broadcast plus
#: rescaled updates: at most about ``‖broadcast‖ + max_i ‖client_i‖``, ten times below.
AGGREGATE_NORM_FACTOR = 10.0


def _copies(arrays):
    """A copy of each array of a dict (what a rule receives: it cannot change the engine's)."""
    return {n: np.array(v, copy=True) for n, v in arrays.items()}


def check_aggregate(name, output, template, kinds, *, previous=None, client_params=None):
    """Raise ValueError (naming the rule and the array) if a rule's output is not a valid model.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.engine import check_aggregate
    >>> template, kinds = {"W": ((3, 2), np.float64)}, {"W": "stiefel"}
    >>> check_aggregate("mean", {"W": np.ones((3, 2))}, template, kinds)
    Traceback (most recent call last):
    ...
    ValueError: aggregation rule 'mean' returned an invalid global model: its arrays['W'] is not orthonormal: ...
    """
    expected = {n: (template[n][0], None) for n, kind in kinds.items() if kind != "local"}
    reason = _check_arrays(output, expected, what="its arrays") or _check_stiefel(
        output, {n: k for n, k in kinds.items() if n in expected}, "its arrays")
    if reason is None and previous is not None:
        for n, kind in kinds.items():
            if kind == "euclidean":
                largest = max((np.linalg.norm(p[n]) for p in client_params or ()), default=0.0)
                bound = AGGREGATE_NORM_FACTOR * (1 + np.linalg.norm(previous[n]) + largest)
                norm = np.linalg.norm(np.asarray(output[n], dtype=np.float64))
                if not norm <= bound:
                    reason = (f"its arrays[{n!r}] has norm {norm:.3g} > {AGGREGATE_NORM_FACTOR:g}·(1 + ‖broadcast‖ "
                              f"+ largest client's) = {bound:.3g}")
                    break
    if reason:
        raise ValueError(f"aggregation rule {name!r} returned an invalid global model: {reason}")


def _pool_scores(scores):
    """Validation ``(loss, macro-F1)`` pooled by validation size (NaN without validation data)."""
    if not scores:
        return float("nan"), float("nan")
    n, loss, f1 = map(np.asarray, zip(*scores))
    return float(np.average(loss, weights=n)), float(np.average(f1, weights=n))


#: A robust rule down-weights a client whose effective weight is below this fraction of its weight.
DOWNWEIGHT_RATIO = 0.5


def _robustness_entries(clients, aggregate, kinds, diagnostics):
    """The record's ``client_distance``, ``effective_weights``, ``downweighted_clients`` and
    ``client_agreement`` (all None when the server saw only sums).
    """
    if diagnostics is None:
        return {"client_distance": None, "effective_weights": None, "downweighted_clients": None,
                "client_agreement": None}
    client_params, weights, effective, agreement = diagnostics
    distances = client_distances(client_params, aggregate, kinds)
    entries = {"client_distance": [float(d) for d in distances], "effective_weights": None,
               "downweighted_clients": None,
               "client_agreement": None if agreement is None else [float(a) for a in agreement]}
    if effective is not None:
        entries["effective_weights"] = [float(w) for w in effective]
        entries["downweighted_clients"] = [cid for cid, w, e in zip(clients, weights, effective)
                                           if e < DOWNWEIGHT_RATIO * w]
    return entries


#: Over a fit, a site whose updates lay on average more than this many times as far from the
#: aggregate as the round's median site's is a suspect (its trust below ``1 / SUSPECT_DISTANCE``).
SUSPECT_DISTANCE = 1.5


def distance_ratios(distance):
    """Each site's distance to the aggregate over the round's median distance (None if it is 0).

    Examples
    --------
    >>> from skfedspd.engine import distance_ratios
    >>> distance_ratios([1.0, 2.0, 6.0]).tolist()
    [0.5, 1.0, 3.0]
    """
    distance = np.asarray(distance, dtype=float)
    median = float(np.median(distance))
    return distance / median if median > 0 else None


def client_trust(history, n_clients, weighting="n_samples"):
    """Each site's trust over a fit (the inverse of its mean :func:`distance_ratios`; NaN if never
    aggregated), and why a site is suspect (``docs/guide/robust-aggregation.md``).

    Returns
    -------
    trust : ndarray of shape (n_clients,)
    summary : list of dict
        One per site: ``client``, ``rounds``, ``trust``, ``distance_ratio``, ``flagged``,
        ``weight``, ``downweighted``, ``failed``, ``agreement`` and ``reason``.

    Examples
    --------
    >>> from skfedspd.engine import client_trust
    >>> history = [{"clients": [0, 1, 2], "n_samples": [10, 10, 20], "effective_weights": [0.4, 0.0, 0.6],
    ...             "downweighted_clients": [1], "client_distance": [1.0, 3.0, 1.0],
    ...             "client_agreement": [0.7, -0.5, 0.8], "failed_clients": []}]
    >>> client_trust(history, 3)[0].round(2).tolist()
    [1.0, 0.33, 1.0]
    """
    ratios = [[] for _ in range(n_clients)]
    agreements, distances = [[] for _ in range(n_clients)], [[] for _ in range(n_clients)]
    downweighted, failed = np.zeros(n_clients, dtype=int), np.zeros(n_clients, dtype=int)
    for record in history:
        for entry in record.get("failed_clients", []):
            failed[entry["client"]] += entry["stage"] == "train"
        if record.get("client_distance") is None:  # sums only: nothing per client
            continue
        clients = record["clients"]
        weights = client_weights(record["n_samples"], weighting)
        effective = record.get("effective_weights") or weights
        distance = distance_ratios(record["client_distance"])
        for k, cid in enumerate(clients):
            ratios[cid].append(effective[k] / weights[k])
            if distance is not None:
                distances[cid].append(distance[k])
            if record.get("client_agreement") is not None:
                agreements[cid].append(record["client_agreement"][k])
        for cid in record.get("downweighted_clients") or []:
            downweighted[cid] += 1

    def mean(values):
        return float(np.mean(values)) if values else None

    trust = np.array([1 / np.mean(d) if d else np.nan for d in distances])
    mean_agreement = [mean(a) for a in agreements]
    typical = [a for a in mean_agreement if a is not None]
    typical = float(np.median(typical)) if typical else None
    summary = []
    for cid in range(n_clients):
        rounds, ratio = len(ratios[cid]), mean(distances[cid])
        flagged = ratio is not None and ratio > SUSPECT_DISTANCE
        reasons = []
        if flagged:
            reasons.append(f"its updates lay {ratio:.2f} times as far from the aggregate as the median site's "
                           f"(mean over {len(distances[cid])} rounds)")
        if downweighted[cid] and (flagged or 2 * downweighted[cid] > rounds):
            reasons.append(f"the rule down-weighted it in {downweighted[cid]} of {rounds} rounds")
        if reasons and mean_agreement[cid] is not None:
            reasons.append(f"mean agreement with the server's reference update {mean_agreement[cid]:.2f} "
                           f"(median site {typical:.2f})")
        summary.append({"client": cid, "rounds": rounds, "trust": None if np.isnan(trust[cid]) else float(trust[cid]),
                        "distance_ratio": ratio, "flagged": bool(flagged), "weight": mean(ratios[cid]),
                        "downweighted": int(downweighted[cid]), "failed": int(failed[cid]),
                        "agreement": mean_agreement[cid], "reason": "; ".join(reasons) or None})
    return trust, summary


def _describe(error):
    return f"{type(error).__name__}: {error}"


class FederatedEngine:
    """The state and the server steps of a federated run (see the module docstring).

    Parameters
    ----------
    initial_params : dict of str to ndarray
        The initial global model; its shapes and dtypes are what replies must have.
    kinds : dict of str to {"stiefel", "euclidean", "local"}
    n_train, n_val : sequence of int
        Training and validation samples of each client declared at set-up.
    train_weights : sequence of (float or None) or None, default=None
        Each client's declared sum of training sample weights.
    seed : int
    lr : float
    clients_per_round, aggregation, weighting, on_client_error, max_update_norm, schedule, server_optimizer
        As for :class:`~skfedspd.FederatedSPDnetClassifier`.
    input_statistic : float or None

    Attributes
    ----------
    global_params : dict
    local_states : dict of int to dict
        Each client's ``"local"`` arrays.
    history : list of dict
        One JSON-able record per finished round.
    reference_update : callable or None
        The server's own update, for a rule that needs one (:class:`~skfedspd.aggregation.FLTrust`).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.engine import FederatedEngine
    >>> from skfedspd.messages import EvalReply, TrainReply
    >>> engine = FederatedEngine({"b": np.zeros(2)}, {"b": "euclidean"}, n_train=[30, 10], n_val=[4, 4], seed=0, lr=0.01)
    >>> selected, seeds = engine.select(0)
    >>> replies = [TrainReply({"b": np.full(2, float(cid))}, 0.7, 0, engine.n_train[cid]) for cid in selected]
    >>> record = engine.aggregate(0, selected, replies)
    >>> record = engine.finish_round(record, [EvalReply(0.6, 0.5, 4), EvalReply(0.8, 1.0, 4)])
    >>> engine.global_params["b"], record["val_f1"]
    (array([0.25, 0.25]), 0.75)
    """

    def __init__(self, initial_params, kinds, *, n_train, n_val, seed, lr, clients_per_round=None,
                 aggregation="projavg", weighting="n_samples", schedule=None, on_client_error="raise",
                 max_update_norm=1e3, input_statistic=None, server_optimizer=None, train_weights=None):
        self.kinds = dict(kinds)
        self.template = {n: (tuple(np.shape(initial_params[n])), np.asarray(initial_params[n]).dtype)
                         for n in self.kinds}
        self.n_train = [int(n) for n in n_train]
        self.n_val = [int(n) for n in n_val]
        if len(self.n_val) != len(self.n_train):
            raise ValueError(f"{len(self.n_train)} training sizes but {len(self.n_val)} validation sizes")
        self.train_weights = None if train_weights is None else [None if w is None else float(w) for w in train_weights]
        if self.train_weights is not None and len(self.train_weights) != len(self.n_train):
            raise ValueError(f"{len(self.n_train)} training sizes but {len(self.train_weights)} training weights")
        self.n_select = n_selected(clients_per_round, len(self.n_train))
        self.seed = int(seed)
        self.aggregation = aggregation
        self.rule = get_aggregation(aggregation)
        self.rule_name = rule_name(aggregation)
        if isinstance(self.rule, RobustAggregation):  # a bad setting fails before any round
            self.rule.check_n_clients(self.n_select)
        self.weighting = weighting
        client_weights([1.0], weighting)
        if on_client_error not in ("raise", "skip"):
            raise ValueError(f"on_client_error must be 'raise' or 'skip', got {on_client_error!r}")
        self.on_client_error = on_client_error
        self.max_update_norm = max_update_norm
        self.input_statistic = input_statistic
        server_optimizer = server_optimizer if server_optimizer is not None else ServerMomentum(momentum=0.0)
        server_optimizer.check_params()  # an engine built by hand gets the estimator's check
        self.server_lr, self.server_momentum = float(server_optimizer.lr), float(server_optimizer.momentum)
        self.server_momentum_buffer = {}
        schedule = schedule if schedule is not None else RoundSchedule()
        schedule.check_params()
        self.schedule = schedule.plateau(lr, monitor="f1")  # the best round: the highest validation macro-F1
        self.global_params = {n: np.array(initial_params[n], copy=True) for n in self.kinds}
        self.schedule.best_state = copy.deepcopy(self.global_params)
        self.local_states = {}
        self.client_optimizer_states = {}
        self.history = []
        self.privacy = None
        self.reference_update = None

    # ------------------------------------------------------------------ properties
    @property
    def n_clients(self):
        return len(self.n_train)

    @property
    def lr(self):
        """Learning rate of this round's local training."""
        return self.schedule.lr

    @property
    def should_stop(self):
        """Early stopping (``patience`` rounds without improvement)."""
        return self.schedule.should_stop

    @property
    def best_params(self):
        """The global model of the best round (highest validation macro-F1)."""
        return self.schedule.best_state

    @property
    def best_round(self):
        return self.schedule.best_step

    @property
    def next_round(self):
        return len(self.history)

    # ------------------------------------------------------------------ privacy
    def plan_privacy(self, target_epsilon, delta, *, clip_norm, batch_size, local_epochs, n_rounds,
                     domain_release=None):
        """Switch the run to DP-SGD (:func:`skfedspd.privacy.plan_dp`) for the next ``n_rounds``."""
        from .privacy import plan_dp

        counts = np.zeros(self.n_clients, dtype=int)
        for t in range(self.next_round, self.next_round + n_rounds):
            counts[self.select(t)[0]] += 1
        plan = plan_dp(self.n_train, batch_size, local_epochs, n_rounds, counts.tolist(), target_epsilon, delta,
                       domain_release=domain_release)
        self.privacy = dict(plan, clip_norm=float(clip_norm))

    def dp_settings(self, cid):
        """Client ``cid``'s DP-SGD settings (``local_update(dp=...)``), None without DP."""
        if self.privacy is None:
            return None
        site = self.privacy["sites"][cid]
        settings = {"noise_multiplier": site["noise_multiplier"], "clip_norm": self.privacy["clip_norm"],
                    "sample_rate": site["sample_rate"]}
        release = self.privacy.get("domain_release")
        if release is not None:
            settings.update(domain_noise_multiplier=release["noise_multiplier"], domain_clip=release["clip"])
        return settings

    def privacy_report(self):
        """:attr:`privacy` with each site's rounds run and ε spent; None without DP."""
        if self.privacy is None:
            return None
        from .privacy import epsilon_spent

        report = copy.deepcopy(self.privacy)
        trained = np.zeros(self.n_clients, dtype=int)
        for record in self.history:
            for cid in record["clients"] + [f["client"] for f in record["failed_clients"] if f["stage"] == "train"]:
                trained[cid] += 1
        for cid, site in enumerate(report["sites"]):
            site["rounds_run"] = int(trained[cid])
            site["steps_run"] = int(trained[cid]) * report["local_epochs"] * site["steps_per_epoch"]
            release = report.get("domain_release")
            domain = None if not release or not release["noise_multiplier"] else release
            site["epsilon"] = epsilon_spent(site["noise_multiplier"], report["delta"], site["sample_rate"],
                                            site["steps_run"], accountant=report["accountant"]["name"], domain=domain)
        return report

    # ------------------------------------------------------------------ one round
    def select(self, t):
        """Round ``t``'s participants (sorted client ids) and their local-training seeds."""
        rng = np.random.default_rng(derive_seed(self.seed, 9, t))
        selected = np.sort(rng.choice(self.n_clients, size=self.n_select, replace=False))
        return [int(i) for i in selected], [derive_seed(self.seed, 10, t, int(i)) for i in selected]

    def local_state(self, cid):
        """Client ``cid``'s ``"local"`` arrays (empty before its first round)."""
        return self.local_states.get(int(cid), {})

    def client_optimizer_state(self, cid):
        """A copy of client ``cid``'s kept Adam state (empty before its first round)."""
        return dict(self.client_optimizer_states.get(int(cid), {}))

    def evaluation_params(self, cid):
        """What client ``cid`` validates: the global model with its own ``"local"`` arrays."""
        return {**self.global_params, **self.local_state(cid)}

    def check_train_reply(self, cid, reply):
        """Why client ``cid``'s train reply is unacceptable, or None."""
        if not isinstance(reply, TrainReply):
            return f"not a train reply ({type(reply).__name__})"
        if not is_count(reply.n_examples) or not 1 <= reply.n_examples <= self.n_train[cid]:
            return (f"num-examples {reply.n_examples!r} is not an int between 1 and the {self.n_train[cid]} "
                    "training samples declared at set-up")
        if reply.weight is not None and not is_positive_weight(reply.weight):
            return f"client weight {reply.weight!r} is not a finite number > 0"
        declared = None if self.train_weights is None else self.train_weights[cid]
        if (declared is None) != (reply.weight is None):
            return ("the reply carries a client weight but the client declared no sample weights at set-up"
                    if declared is None else "the reply carries no client weight but the client declared sample "
                    "weights at set-up")
        if declared is not None and not within_declared_weight(reply.weight, declared):
            return f"client weight {reply.weight!r} exceeds the {declared!r} declared at set-up"
        if not is_count(reply.n_skipped) or reply.n_skipped < 0:
            return f"skipped-batches {reply.n_skipped!r} is not an int >= 0"
        loss = reply.loss
        if self.privacy is not None:  # DP: the loss is not released
            if not (_is_real(loss) and np.isnan(loss)):
                return f"train-loss {reply.loss!r} is released in DP mode (NaN expected: it is outside the budget)"
        elif not (_is_real(loss) and ((np.isfinite(loss) and loss >= 0) or (np.isnan(loss) and reply.n_skipped > 0))):
            return f"train-loss {reply.loss!r} is not a finite number >= 0 (NaN only if batches were skipped)"
        return (_check_arrays(reply.params, self.template, what="arrays")
                or _check_stiefel(reply.params, self.kinds, "arrays") or self._update_problem(reply.params, "arrays"))

    def _update_problem(self, params, what):
        """Why ``params`` moved farther than ``max_update_norm·(1 + ‖broadcast‖)``, or None."""
        if self.max_update_norm is None:
            return None
        for name, kind in self.kinds.items():
            if kind != "local":
                g = self.global_params[name]
                step, bound = np.linalg.norm(params[name] - g), self.max_update_norm * (1 + np.linalg.norm(g))
                if not step <= bound:
                    return f"{what}[{name!r}] moved by {step:.3g} > max_update_norm·(1 + ‖broadcast‖) = {bound:.3g}"
        return None

    def check_eval_reply(self, cid, reply):
        """Why client ``cid``'s validation reply is unacceptable, or None."""
        if not isinstance(reply, EvalReply):
            return f"not a validation reply ({type(reply).__name__})"
        if not is_count(reply.n_examples) or not 1 <= reply.n_examples <= self.n_val[cid]:
            return (f"num-examples {reply.n_examples!r} is not an int between 1 and the {self.n_val[cid]} "
                    "validation samples declared at set-up")
        if not _is_real(reply.loss) or not (np.isfinite(reply.loss) and reply.loss >= 0):
            return f"val-loss {reply.loss!r} is not a finite number >= 0"
        if not _is_real(reply.f1) or not 0 <= reply.f1 <= 1:
            return f"val-f1 {reply.f1!r} is not in [0, 1]"
        return None

    def _sort_replies(self, t, stage, selected, replies, check):
        """``(accepted [(cid, reply)], failed [records])`` after the failure policy."""
        accepted, failed = [], []
        for cid, reply in zip(selected, replies):
            reason = _describe(reply) if isinstance(reply, BaseException) else check(cid, reply)
            if reason is None:
                accepted.append((int(cid), reply))
            else:
                failed.append({"client": int(cid), "stage": stage, "reason": reason})
        if failed and (self.on_client_error == "raise" or not accepted):
            first = failed[0]
            verb = "failed" if stage == "train" else "failed to evaluate"
            everyone = " (every client failed)" if not accepted else ""
            error = RuntimeError(f"client {first['client']} {verb} in round {t}{everyone}: {first['reason']}")
            cause = replies[list(selected).index(first["client"])]
            raise error from (cause if isinstance(cause, BaseException) else None)
        for record in failed:
            warnings.warn(f"round {t}: client {record['client']} left out ({record['stage']}): {record['reason']}",
                          RuntimeWarning, stacklevel=3)
        return accepted, failed

    def aggregate(self, t, selected, replies):
        """Check the train replies, apply the failure policy and aggregate the accepted ones.

        ``replies[k]`` is client ``selected[k]``'s :class:`TrainReply` or the exception it
        raised. The engine changes only if the round succeeds. Returns the round's record.
        """
        accepted, failed = self._sort_replies(t, "train", selected, replies, self.check_train_reply)
        n_samples = [int(r.n_examples) if r.weight is None else _as_number(r.weight) for _, r in accepted]
        weights = client_weights(n_samples, self.weighting)
        client_params = [r.params for _, r in accepted]
        previous, agreement = self._previous(), None

        def inputs():  # copies: a rule that writes into what it receives changes nothing of the engine's
            return [_copies(p) for p in client_params], np.array(weights, copy=True), _copies(previous), dict(self.kinds)

        if getattr(self.rule, "needs_reference", False):
            reference = self.reference(t)
            new_global, effective_weights = self.rule.aggregate(*inputs(), reference=_copies(reference))
            clients, _, prev, kinds = inputs()
            agreement = self.rule.agreement(clients, _copies(reference), prev, kinds)
        elif isinstance(self.rule, RobustAggregation):
            new_global, effective_weights = self.rule.aggregate(*inputs())
        else:
            new_global, effective_weights = self.rule(*inputs()), None
        local_names = [n for n, kind in self.kinds.items() if kind == "local"]
        local_states = {cid: {n: reply.params[n] for n in local_names} for cid, reply in accepted} if local_names else {}
        losses = np.array([r.loss for _, r in accepted], dtype=np.float64)
        train_loss = float(np.average(losses, weights=weights)) if np.isfinite(losses).all() else float("nan")
        record = self._commit(t, new_global, [cid for cid, _ in accepted], n_samples, failed, train_loss,
                              int(sum(r.n_skipped for _, r in accepted)), local_states,
                              diagnostics=(client_params, weights, effective_weights, agreement), aggregated=client_params)
        self.client_optimizer_states.update({cid: r.optimizer_state for cid, r in accepted
                                             if r.optimizer_state is not None})
        return record

    def aggregate_from_sum(self, t, selected, clients, reasons, *, summed, weight, n_examples, loss, n_nan_loss,
                           n_skipped, pooled_local=None, total_weight=None):
        """:meth:`aggregate` when the server sees only sums (secure aggregation).

        ``summed`` is ``{name: Σ_i r_i θ_i}`` over ``clients``, with the sums ``weight``,
        ``n_examples``, ``loss``, ``n_nan_loss``, ``n_skipped``, the pooled ``"local"`` arrays
        ``pooled_local`` and ``total_weight``. The totals are checked; a bad one raises whatever
        the policy.
        """
        from .aggregation import SUM_RULES

        if self.rule_name not in SUM_RULES:
            raise ValueError(f"aggregation {self.rule_name!r} is not a function of the weighted sum")
        clients = sorted(int(c) for c in clients)
        replies = [None if cid in clients else RuntimeError(
            "dropped out of the secure aggregation" + (f" ({reasons[cid]})" if cid in reasons else ""))
            for cid in selected]
        _, failed = self._sort_replies(t, "train", selected, replies, lambda cid, reply: None)
        template = {n: (shape, None) for n, (shape, _) in self.template.items() if self.kinds[n] != "local"}
        n_total, declared = int(np.rint(n_examples)), sum(self.n_train[c] for c in clients)
        local_template = {n: (shape, None) for n, (shape, _) in self.template.items() if self.kinds[n] == "local"}
        reason = _check_arrays(summed, template, what="summed arrays") or (
            _check_arrays(pooled_local, local_template, what="pooled local arrays") if local_template else None)
        if reason is None and not (np.isfinite(weight) and weight > 0):
            reason = f"the summed weight {weight!r} is not positive"
        if reason is None and not len(clients) <= n_total <= declared:
            reason = (f"num-examples total {n_examples:.6g} is not between {len(clients)} and the {declared} "
                      "training samples these clients declared at set-up")
        if reason is None and not (np.isfinite(loss) and np.isfinite(n_skipped) and np.rint(n_skipped) >= 0):
            reason = f"train-loss sum {loss!r} or skipped-batches total {n_skipped!r} is invalid"
        if reason is None and total_weight is not None:
            declared_total = sum(self.declared_weight(c) for c in clients)
            if not (np.isfinite(total_weight) and total_weight > 0
                    and within_declared_weight(total_weight, declared_total)):
                reason = (f"client weight total {total_weight!r} is not in (0, {declared_total!r}], the total these "
                          "clients declared at set-up")
        if reason:
            raise RuntimeError(f"round {t}: the secure sum of clients {clients} is invalid: {reason}")
        mean = {n: np.asarray(v, dtype=np.float64) / weight for n, v in summed.items()}
        # each client's update is at most max_update_norm·(1 + ‖θ‖): so is their weighted mean
        reason = self._update_problem(mean, "the summed arrays' mean")
        if reason:
            raise RuntimeError(f"round {t}: the secure sum of clients {clients} is invalid: {reason}")
        new_global = SUM_RULES[self.rule_name](mean, self._previous(), self.kinds)
        train_loss = float("nan") if np.rint(n_nan_loss) > 0 else max(0.0, float(loss / weight))
        n_samples = [n_total if total_weight is None else _as_number(total_weight)]
        return self._commit(t, new_global, clients, n_samples, failed, train_loss, int(np.rint(n_skipped)),
                            pooled_local=pooled_local, aggregated=[mean])

    def reference(self, t):
        """The server's own update of round ``t``, for a rule that needs one."""
        if self.reference_update is None:
            raise RuntimeError(f"aggregation {self.rule_name!r} needs the server's reference update, and this engine "
                               "has none: FederatedRun.start provides it from the rule's root set")
        return self.reference_update(dict(self.global_params), derive_seed(self.seed, 11, t), self.lr)

    def declared_weight(self, cid):
        """Client ``cid``'s aggregation weight declared at set-up."""
        return declared_weights(self.n_train, self.train_weights)[cid]

    def _previous(self):
        return {n: v for n, v in self.global_params.items() if self.kinds[n] != "local"}

    def _commit(self, t, new_global, clients, n_samples, failed, train_loss, skipped, local_states=None,
                pooled_local=None, diagnostics=None, aggregated=()):
        """Check the rule's output, then make it the global model; return the round's record."""
        previous = self._previous()
        check_aggregate(self.rule_name, new_global, self.template, self.kinds, previous=previous,
                        client_params=aggregated)
        new_global = {n: new_global[n] for n in previous}
        robustness = _robustness_entries(clients, new_global, self.kinds, diagnostics)
        momentum = self.server_momentum_buffer
        if not is_identity_step(self.server_lr, self.server_momentum):
            new_global, momentum = server_step(new_global, previous, momentum, self.kinds, lr=self.server_lr,
                                               beta=self.server_momentum)
            reason = _check_arrays(new_global, {n: (self.template[n][0], None) for n in previous},
                                   what="the server step's arrays")
            if reason:
                raise ValueError(f"round {t}: server_lr={self.server_lr!r}, server_momentum={self.server_momentum!r} "
                                 f"gave an invalid global model: {reason}")
        self.local_states.update(local_states or {})
        for name, kind in self.kinds.items():
            if kind == "local":
                new_global[name] = pooled_local[name] if pooled_local is not None else self._pooled_local(name)
        self.global_params = new_global
        self.server_momentum_buffer = momentum
        return {
            "round": int(t),
            "clients": clients,
            "n_samples": n_samples,
            "failed_clients": failed,
            "train_loss": train_loss,
            "val_loss": None,
            "val_f1": None,
            "orthonormality": {n: orthonormality_error(new_global[n]) for n, k in self.kinds.items() if k == "stiefel"},
            "lr": float(self.schedule.lr),
            "skipped_batches": skipped,
            **robustness,
        }

    def evaluated_clients(self):
        """Clients holding validation data (the ones :meth:`finish_round` expects)."""
        return [cid for cid in range(self.n_clients) if self.n_val[cid] > 0]

    def finish_round(self, record, replies, wall_time=None):
        """Check the validation replies, pool the scores, step the schedule, append the record."""
        t = record["round"]
        clients = self.evaluated_clients()
        if len(replies) != len(clients):
            raise ValueError(f"{len(replies)} validation replies for the {len(clients)} clients with validation data")
        accepted, failed = self._sort_replies(t, "evaluate", clients, replies, self.check_eval_reply)
        val_loss, val_f1 = _pool_scores([(r.n_examples, r.loss, r.f1) for _, r in accepted])
        return self._close_round(record, failed, val_loss, val_f1, wall_time)

    def finish_round_from_sum(self, record, clients, reasons, *, n_examples, loss, f1, wall_time=None):
        """:meth:`finish_round` from validation totals (secure aggregation), checked."""
        t = record["round"]
        expected, clients = self.evaluated_clients(), sorted(int(c) for c in clients)
        replies = [None if cid in clients else RuntimeError(
            "dropped out of the secure aggregation" + (f" ({reasons[cid]})" if cid in reasons else ""))
            for cid in expected]
        _, failed = self._sort_replies(t, "evaluate", expected, replies, lambda cid, reply: None)
        n_total, declared = int(np.rint(n_examples)), sum(self.n_val[c] for c in clients)
        reason = None
        if not len(clients) <= n_total <= declared:
            reason = (f"num-examples total {n_examples:.6g} is not between {len(clients)} and the {declared} "
                      "validation samples these clients declared at set-up")
        elif not (np.isfinite(loss) and loss >= -1e-6 and np.isfinite(f1) and -1e-6 <= f1 <= 1 + 1e-6):
            reason = f"pooled val-loss {loss!r} or val-f1 {f1!r} out of range"
        if reason:
            raise RuntimeError(f"round {t}: the secure validation sum of clients {clients} is invalid: {reason}")
        return self._close_round(record, failed, max(0.0, float(loss)), float(np.clip(f1, 0, 1)), wall_time)

    def _close_round(self, record, failed, val_loss, val_f1, wall_time):
        self.schedule.step(val_f1, val_loss, self.global_params)
        record = dict(record, val_loss=val_loss, val_f1=val_f1,
                      failed_clients=record["failed_clients"] + failed)
        record["wall_time"] = wall_time
        self.history.append(record)
        return record

    def _pooled_local(self, name):
        """Training-size-weighted mean of a client-local array, for the released model."""
        owners = sorted(self.local_states)
        weights = np.array([self.n_train[i] for i in owners], dtype=np.float64)
        return sum(w * self.local_states[i][name] for w, i in zip(weights / weights.sum(), owners))

    # ------------------------------------------------------------------ state
    def state_dict(self):
        """``(arrays, meta)``: the run's state (:func:`skfedspd.persistence.save_bundle`)."""
        arrays = {f"global/{n}": v for n, v in self.global_params.items()}
        arrays.update({f"momentum/{n}": v for n, v in self.server_momentum_buffer.items()})
        for cid, state in self.local_states.items():
            arrays.update({f"local/{cid}/{n}": v for n, v in state.items()})
        for cid, state in self.client_optimizer_states.items():
            arrays.update({f"optimizer/{cid}/{n}": v for n, v in state.items()})
        schedule = self.schedule.state_dict()
        best = schedule.pop("best_state", None)
        if best is not None:
            arrays.update({f"best/{n}": v for n, v in best.items()})
        meta = {"version": STATE_VERSION, "kinds": self.kinds, "n_train": self.n_train, "n_val": self.n_val,
                "seed": self.seed, "input_statistic": self.input_statistic, "schedule": schedule,
                "history": copy.deepcopy(self.history), "has_best": best is not None,
                "privacy": copy.deepcopy(self.privacy)}
        return arrays, meta

    def load_state_dict(self, arrays, meta):
        """Inverse of :meth:`state_dict`; names and shapes checked first."""
        if not isinstance(meta, dict) or meta.get("version") != STATE_VERSION:
            raise ValueError(f"engine state version {meta.get('version') if isinstance(meta, dict) else None!r}, "
                             f"expected {STATE_VERSION}")
        if meta.get("kinds") != self.kinds:
            raise ValueError(f"engine state of another model (parameter kinds {meta.get('kinds')!r}, "
                             f"expected {self.kinds!r})")
        shapes = {n: (shape, None) for n, (shape, _) in self.template.items()}
        arrays = {n: np.array(v, copy=True) for n, v in arrays.items()}
        global_params = {n[len("global/"):]: v for n, v in arrays.items() if n.startswith("global/")}
        best = {n[len("best/"):]: v for n, v in arrays.items() if n.startswith("best/")}
        momentum = {n[len("momentum/"):]: v for n, v in arrays.items() if n.startswith("momentum/")}
        local_states, optimizer_states = {}, {}
        for key, value in arrays.items():
            if key.startswith("local/"):
                _, cid, name = key.split("/", 2)
                if not cid.isdigit() or int(cid) >= self.n_clients or self.kinds.get(name) != "local":
                    raise ValueError(f"engine state has an unexpected array {key!r}")
                local_states.setdefault(int(cid), {})[name] = value
            elif key.startswith("optimizer/"):
                # Checked against the model when the client's optimizer loads it.
                _, cid, name = key.split("/", 2)
                if not cid.isdigit() or int(cid) >= self.n_clients:
                    raise ValueError(f"engine state has an unexpected array {key!r}")
                if value.dtype.kind != "f" or not np.isfinite(value).all():
                    raise ValueError(f"engine state does not fit the model: {key!r} is not a finite floating array")
                optimizer_states.setdefault(int(cid), {})[name] = value
        local_template = {n: s for n, s in shapes.items() if self.kinds[n] == "local"}
        reason = _check_arrays(global_params, shapes, what="global arrays") or (
            _check_arrays(best, shapes, what="best arrays") if meta.get("has_best") else None) or (
            _check_arrays(momentum, {n: shapes[n] for n in momentum if self.kinds.get(n, "local") != "local"},
                          what="momentum arrays"))
        for cid, state in local_states.items():
            reason = reason or _check_arrays(state, local_template, what=f"client {cid}'s local arrays")
        if reason:
            raise ValueError(f"engine state does not fit the model: {reason}")
        unknown = set(arrays) - {f"global/{n}" for n in global_params} - {f"best/{n}" for n in best} - {
            f"momentum/{n}" for n in momentum} - {
            f"local/{c}/{n}" for c, s in local_states.items() for n in s} - {
            f"optimizer/{c}/{n}" for c, s in optimizer_states.items() for n in s}
        if unknown:
            raise ValueError(f"engine state has unexpected arrays {sorted(unknown)}")
        # The schedule's progress from the state, its configuration (patience...) this engine's.
        config = {k: v for k, v in self.schedule.state_dict().items() if k in _SCHEDULE_CONFIG}
        schedule = dict(meta["schedule"], **config, best_state=best if meta.get("has_best") else None)
        self.schedule.load_state_dict(schedule)
        self.global_params = global_params
        self.local_states = local_states
        self.client_optimizer_states = optimizer_states
        self.server_momentum_buffer = momentum
        self.history = copy.deepcopy(meta["history"])
        self.seed = int(meta["seed"])
        self.input_statistic = meta["input_statistic"]
        self.privacy = copy.deepcopy(meta.get("privacy"))
