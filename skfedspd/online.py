"""Persistent domain statistics that adapt online from unlabeled trials.

A *domain* (subject, session), named by a str or int label, keeps at each re-centring
layer a Riemannian mean ``M`` and its weight ``w``, updated trial by trial with the
geodesic running mean (Zanini et al., 2018; Kobler et al., 2022)::

    M ← M^{1/2} (M^{-1/2} X M^{-1/2})^{1/(w+1)} M^{1/2},   w ← w + 1.

A new domain starts from the log-Euclidean prior of the training data; a trial is scored
without itself; the settings are one :class:`DomainAdaptation`. Why these choices:
``docs/guide/online-adaptation.md``.
"""

import warnings
from numbers import Real

import numpy as np
import torch
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

from .functional import expm_sym, logeig
from .training import Settings
from .validation import Count

__all__ = [
    "DomainAdaptation",
    "NO_PRIOR_WARNING",
    "PRIOR_LOG_BOUND",
    "check_prior_statistics",
    "RunningMean",
    "DomainStatistics",
    "DomainUpdate",
    "geodesic_running_mean",
    "check_domain_label",
    "domain_labels",
    "log_euclidean_sum",
    "drop_domain_requests",
    "DomainStatisticsMixin",
]


class DomainAdaptation(Settings):
    """How a domain's statistics adapt from its unlabeled trials at prediction.

    Parameters
    ----------
    prior_weight : float > 0, default=1.0
        Weight, in trials, of the prior a new domain starts from.
    memory : float >= 2 or None, default=None
        How many recent trials a domain's statistics remember (exponential forgetting once
        a domain weighs that many); None: every trial weighs the same.
    include_self : bool, default=False
        Whether a trial's statistics at prediction include the trial itself.
    max_domains : int >= 1 or None, default=None
        The most domains stored; beyond it the least recently used are forgotten, with a
        ``UserWarning``. None: no bound.

    Examples
    --------
    >>> from skfedspd import Recenter
    >>> from skfedspd.online import DomainAdaptation
    >>> Recenter(domain_adaptation=DomainAdaptation(memory=40)).domain_adaptation.memory
    40
    """

    _parameter_constraints = {
        "prior_weight": [Interval(Real, 0, np.inf, closed="neither")],
        "memory": [Interval(Real, 2, None, closed="left"), None],
        "include_self": ["boolean"],
        "max_domains": [Count(1), None],
    }

    def __init__(self, prior_weight=1.0, memory=None, include_self=False, max_domains=None):
        self.prior_weight = prior_weight
        self.memory = memory
        self.include_self = include_self
        self.max_domains = max_domains


def adaptation_of(estimator):
    """The :class:`DomainAdaptation` of ``estimator`` (the defaults for None)."""
    return getattr(estimator, "domain_adaptation", None) or DomainAdaptation()


def _sym(A):
    return 0.5 * (A + A.transpose(-1, -2))


def _sqrt_invsqrt(M):
    lam, U = torch.linalg.eigh(M)
    Ut = U.transpose(-1, -2)
    return (U * lam.sqrt()) @ Ut, (U * lam.rsqrt()) @ Ut


class RunningMean:
    """An immutable geodesic running mean: ``mean``, ``weight`` (prior included), ``n_trials``,
    ``memory`` (the most weight it keeps; None: no limit) and the cached ``mean^{±1/2}``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.online import RunningMean
    >>> start = RunningMean(torch.eye(2, dtype=torch.float64), weight=1.0)
    >>> after = start.add(torch.diag(torch.tensor([4.0, 1.0], dtype=torch.float64)))
    >>> after.mean.diagonal(), after.weight, after.n_trials  # halfway along the geodesic
    (tensor([2., 1.], dtype=torch.float64), 2.0, 1)
    """

    __slots__ = ("mean", "weight", "n_trials", "memory", "half", "inv_half")

    def __init__(self, mean, weight, n_trials=0, memory=None, *, halves=None):
        self.mean = mean
        self.weight = float(weight)
        self.n_trials = int(n_trials)
        self.memory = None if memory is None else float(memory)
        self.half, self.inv_half = _sqrt_invsqrt(mean) if halves is None else halves

    def next_weight(self):
        """The weight after one more trial."""
        return self.weight + 1.0 if self.memory is None else min(self.weight + 1.0, self.memory)

    def add(self, X):
        """The running mean with the SPD matrix ``X`` added with weight 1 (a new object)."""
        weight = self.next_weight()
        lam, U = torch.linalg.eigh(_sym(self.inv_half @ X @ self.inv_half))
        power = (U * lam ** (1.0 / weight)) @ U.transpose(-1, -2)
        return RunningMean(_sym(self.half @ power @ self.half), weight, self.n_trials + 1, self.memory)

    def without(self, X, share):
        """The mean with ``X``, which makes up ``share`` (< 1) of it, taken out (undoes :meth:`add`).

        Examples
        --------
        >>> import torch
        >>> from skfedspd.online import RunningMean
        >>> start = RunningMean(torch.eye(2, dtype=torch.float64), weight=3.0)
        >>> X = torch.diag(torch.tensor([16.0, 1.0], dtype=torch.float64))
        >>> back = start.add(X).without(X, share=0.25)
        >>> bool(torch.allclose(back.mean, start.mean)), back.weight
        (True, 3.0)
        """
        lam, U = torch.linalg.eigh(_sym(self.inv_half @ X @ self.inv_half))
        power = (U * lam ** (-share / (1.0 - share))) @ U.transpose(-1, -2)
        return RunningMean(_sym(self.half @ power @ self.half), self.weight * (1.0 - share), memory=self.memory)

    def with_memory(self, memory):
        """The same mean with ``memory`` (no new eigendecomposition)."""
        if memory == self.memory:
            return self
        return RunningMean(self.mean, self.weight, self.n_trials, memory, halves=(self.half, self.inv_half))

    def __getstate__(self):
        return {"mean": self.mean, "weight": self.weight, "n_trials": self.n_trials, "memory": self.memory}

    def __setstate__(self, state):
        self.__init__(state["mean"], state["weight"], state["n_trials"], state.get("memory"))


def geodesic_running_mean(X, mean, weight):
    """Add the SPD matrices ``X`` in order, each with weight 1, to a running mean.

    Parameters
    ----------
    X : torch.Tensor of shape (n_matrices, n, n)
    mean : torch.Tensor of shape (n, n)
        The current mean (the prior for a new domain).
    weight : float
        Its total weight (0: the first matrix becomes the mean).

    Returns
    -------
    mean : torch.Tensor of shape (n, n)
    weight : float

    Examples
    --------
    >>> import torch
    >>> from skfedspd.online import geodesic_running_mean
    >>> X = torch.diag_embed(torch.tensor([[1.0, 8.0], [8.0, 1.0], [1.0, 1.0]], dtype=torch.float64))
    >>> M, w = geodesic_running_mean(X, torch.eye(2, dtype=torch.float64), weight=0.0)
    >>> M.diagonal().round(decimals=12), w
    (tensor([2., 2.], dtype=torch.float64), 3.0)
    """
    state = RunningMean(mean, weight)
    for matrix in X:
        state = state.add(matrix)
    return state.mean, state.weight


def check_domain_label(label):
    """A domain label as a plain ``str`` or ``int``; a TypeError for anything else.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.online import check_domain_label
    >>> check_domain_label(np.int64(17)), check_domain_label("s17")
    (17, 's17')
    """
    if isinstance(label, np.generic):
        label = label.item()
    if isinstance(label, str) or (isinstance(label, int) and not isinstance(label, bool)):
        return label
    raise TypeError(f"a domain label must be a str or an int, got {type(label).__name__} {label!r}")


def domain_labels(domain, n_matrices):
    """One domain label per matrix: ``domain`` a label (all matrices) or one per row.

    Examples
    --------
    >>> from skfedspd.online import domain_labels
    >>> domain_labels("s1", 2), domain_labels(["s1", 2], 2)
    (['s1', 's1'], ['s1', 2])
    """
    if not isinstance(domain, (str, bytes)) and np.ndim(domain) > 0:  # a list, an array, a pandas Series...
        labels = np.asarray(domain, dtype=object)
        if labels.ndim != 1 or len(labels) != n_matrices:
            raise ValueError(f"domain must be one label or one label per matrix: X has {n_matrices} matrices, "
                             f"domain has shape {labels.shape}")
        return [check_domain_label(label) for label in labels]
    return [check_domain_label(domain)] * n_matrices


def drop_domain_requests(estimator, requests):
    """``requests`` without ``domain`` for the prediction methods of an estimator without domain
    statistics (explicit requests kept).

    Examples
    --------
    >>> from skfedspd import SPDnetClassifier
    >>> SPDnetClassifier().get_metadata_routing().predict.requests
    {'domain': False}
    """
    if not hasattr(estimator, "_metadata_request"):
        for method in ("predict", "predict_proba", "decision_function"):
            getattr(requests, method).add_request(param="domain", alias=False)
    return requests


def log_euclidean_sum(Z):
    """``Σ_i log Z_i`` of an SPD batch: the additive part of the log-Euclidean mean.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.functional import expm_sym
    >>> from skfedspd.online import log_euclidean_sum
    >>> Z = torch.diag_embed(torch.tensor([[1.0, 4.0], [4.0, 1.0]], dtype=torch.float64))
    >>> expm_sym(log_euclidean_sum(Z) / 2).diagonal()
    tensor([2., 2.], dtype=torch.float64)
    """
    return logeig(Z).sum(0)


#: The largest accepted ``|eigenvalue|`` of a domain prior's log-mean ``log_sums[i] / count``
#: (:func:`check_prior_statistics`): the prior's eigenvalues lie in ``[e^-50, e^50]``. The
#: batch-norm inputs of a model on scaled EEG stay far inside: on PhysioNet motor imagery
#: (6 subjects, 2 classes, 64 channels, ``hidden_dims`` 8 or 18) each subject's log-mean
#: has a spectral norm of 3.1-5.9. ``e^50`` and its inverse square root are far from
#: overflowing even in float32, whose ``exp`` overflows beyond 88.
PRIOR_LOG_BOUND = 50.0


def check_prior_statistics(log_sums, count, sizes, *, bound=PRIOR_LOG_BOUND):
    """The additive statistics ``(log_sums, count)`` of a domain prior, validated: one finite
    symmetric matrix per layer, a whole ``count >= 1``, a log-mean within ``bound``
    (:data:`PRIOR_LOG_BOUND`).

    Returns
    -------
    log_sums : list of ndarray of float64
    count : int

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.online import check_prior_statistics
    >>> sums, count = check_prior_statistics([np.eye(2)], 3, [2])
    >>> count
    3
    """
    if isinstance(count, np.ndarray) and count.shape == ():
        count = count.item()
    if (isinstance(count, (bool, np.bool_)) or not isinstance(count, (int, float, np.integer, np.floating))
            or not np.isfinite(count) or count < 1 or count != int(count)):
        raise ValueError(f"count must be a finite whole number >= 1 (the trials the sums are over), got {count!r}")
    if isinstance(log_sums, (str, bytes, dict)) or not hasattr(log_sums, "__len__") or len(log_sums) != len(sizes):
        raise ValueError(f"log_sums must hold one matrix per batch-norm layer ({len(sizes)}), got "
                         f"{type(log_sums).__name__} of length {len(log_sums) if hasattr(log_sums, '__len__') else '?'}")
    count, checked = int(count), []
    for i, (S, n) in enumerate(zip(log_sums, sizes)):
        S = np.asarray(S)
        if S.dtype.kind not in "fiu" or S.shape != (n, n):
            raise ValueError(f"log_sums[{i}] must be a real ({n}, {n}) matrix, got dtype {S.dtype} shape {S.shape}")
        S = S.astype(np.float64)
        if not np.isfinite(S).all():
            raise ValueError(f"log_sums[{i}] has {int((~np.isfinite(S)).sum())} non-finite values")
        asym = float(np.abs(S - S.T).max())
        if asym > 1e-5 * max(float(np.abs(S).max()), np.finfo(np.float64).tiny):
            raise ValueError(f"log_sums[{i}] is not symmetric: max |S - Sᵀ| = {asym:.3g}")
        largest = float(np.abs(np.linalg.eigvalsh(S / count)).max())
        if not largest <= bound:
            raise ValueError(f"log_sums[{i}] / count has an eigenvalue of absolute value {largest:.3g} > {bound:g} "
                             f"(PRIOR_LOG_BOUND): the prior exp(log_sums[{i}] / count) would have eigenvalues beyond "
                             f"e^±{bound:g}, which no scaled data give")
        checked.append(S)
    return checked, count


class DomainStatistics:
    """The running means of named domains at each re-centring layer, and the prior.

    Parameters
    ----------
    sizes : sequence of int
        Matrix size at each layer.
    dtype : torch.dtype
    device : str or torch.device, default="cpu"
    prior : list of torch.Tensor or None
        Mean a new domain starts from at each layer; None: new domains start empty.

    Attributes
    ----------
    domains : dict
        Label → list of :class:`RunningMean`, one per layer.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.online import DomainStatistics
    >>> stats = DomainStatistics([2], torch.float64, prior=[torch.eye(2, dtype=torch.float64)])
    >>> update = stats.update(["s1", "s1"], prior_weight=1.0)
    >>> _ = update.add_in_order(4 * torch.eye(2, dtype=torch.float64).expand(2, 2, 2), layer=0)
    >>> update.commit()
    >>> stats.trials_seen()
    {'s1': 2}
    """

    def __init__(self, sizes, dtype, device="cpu", prior=None):
        self.sizes = [int(n) for n in sizes]
        self.dtype = dtype
        self.device = device
        self.prior = prior
        self.domains = {}

    def start(self, prior_weight, memory=None):
        """The statistics of a new domain: the prior with ``prior_weight``, or empty."""
        if not prior_weight > 0:  # the estimators validate it first; this guards direct use
            raise ValueError(f"prior_weight must be > 0, got {prior_weight!r}")
        if self.prior is None:
            return [RunningMean(torch.eye(n, dtype=self.dtype, device=self.device), 0.0, memory=memory)
                    for n in self.sizes]
        return [RunningMean(M, prior_weight, memory=memory) for M in self.prior]

    def update(self, labels, prior_weight, memory=None):
        """A :class:`DomainUpdate` of the domains of ``labels``; nothing stored changes until its commit."""
        if memory is not None and not memory >= 2:  # one trial of memory would re-centre a trial by itself
            raise ValueError(f"memory must be None or >= 2, got {memory!r}")
        states = {label: [state.with_memory(memory) for state in self.domains[label]] if label in self.domains
                  else self.start(prior_weight, memory) for label in dict.fromkeys(labels)}
        return DomainUpdate(self, labels, states)

    def commit(self, states, max_domains=None):
        """Store the updated domains; forget the least recently used beyond ``max_domains``."""
        for label in states:
            self.domains.pop(label, None)
        self.domains.update(states)
        if max_domains is not None and len(self.domains) > max_domains:
            evicted = list(self.domains)[: len(self.domains) - max_domains]
            for label in evicted:
                del self.domains[label]
            shown = ", ".join(repr(label) for label in evicted[:10]) + (" ..." if len(evicted) > 10 else "")
            warnings.warn(f"max_domains={max_domains} reached: forgot the statistics of the {len(evicted)} least "
                          f"recently used domain(s) {shown}; a forgotten domain starts again from the prior",
                          UserWarning, stacklevel=5)

    def reset(self, domain=None):
        """Forget one domain, several or all (None); all labels are checked first."""
        if domain is None:
            self.domains.clear()
            return
        labels = [domain] if isinstance(domain, (str, bytes)) or np.ndim(domain) == 0 else list(domain)
        labels = [check_domain_label(label) for label in labels]
        unknown = [label for label in labels if label not in self.domains]
        if unknown:
            raise KeyError(f"unknown domain{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                           f"known domains: {list(self.domains)}")
        for label in dict.fromkeys(labels):
            del self.domains[label]

    def trials_seen(self):
        """Label → number of trials added."""
        return {label: states[0].n_trials for label, states in self.domains.items()}

    def set_prior(self, log_sums, count):
        """Set the prior to ``exp(log_sums[i] / count)`` at each layer (log-Euclidean mean)."""
        self.prior = [expm_sym(torch.as_tensor(s, dtype=self.dtype, device=self.device) / count) for s in log_sums]

    # ------------------------------------------------------------------ persistence
    def state(self):
        """``(arrays, meta)``: numeric arrays and JSON metadata (labels, weights)."""
        arrays = {}
        if self.prior is not None:
            arrays.update({f"prior.{i}": M.cpu().numpy() for i, M in enumerate(self.prior)})
        meta = {"sizes": self.sizes, "prior": self.prior is not None, "domains": []}
        for j, (label, states) in enumerate(self.domains.items()):
            meta["domains"].append({"label": label, "weight": states[0].weight, "n_trials": states[0].n_trials})
            arrays.update({f"domain.{j}.{i}": s.mean.cpu().numpy() for i, s in enumerate(states)})
        return arrays, meta

    @classmethod
    def from_state(cls, arrays, meta, dtype, device="cpu", sizes=None):
        """Inverse of :meth:`state`: everything is validated before any tensor is built.

        Parameters
        ----------
        arrays, meta
            From :meth:`state`.
        dtype : torch.dtype
        device : str or torch.device, default="cpu"
        sizes : list of int or None
            The layer sizes the statistics must have; None: those of ``meta``.
        """
        saved = meta.get("sizes") if isinstance(meta, dict) else None
        if (not isinstance(saved, list) or not saved
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in saved)):
            raise ValueError(f"domain statistics 'sizes' must be a non-empty list of positive ints, got {saved!r}")
        if sizes is not None and saved != [int(n) for n in sizes]:
            raise ValueError(f"domain statistics 'sizes' {saved} are not the model's batch-norm sizes {list(sizes)}")
        sizes = saved
        if not isinstance(meta.get("prior"), bool):
            raise ValueError(f"domain statistics 'prior' must be true or false, got {meta.get('prior')!r}")
        entries = meta.get("domains")
        if not isinstance(entries, list) or not all(isinstance(e, dict) and set(e) == {"label", "weight", "n_trials"}
                                                    for e in entries):
            raise ValueError("domain statistics 'domains' must be a list of {label, weight, n_trials} objects")
        labels = []
        for entry in entries:
            try:
                labels.append(check_domain_label(entry["label"]))
            except TypeError as error:
                raise ValueError(f"domain statistics label: {error}") from None
            weight, n_trials = entry["weight"], entry["n_trials"]
            if (isinstance(weight, bool) or not isinstance(weight, (int, float)) or not np.isfinite(weight)
                    or weight < 0):
                raise ValueError(f"domain {entry['label']!r}: weight must be a finite number >= 0, got {weight!r}")
            if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 0:
                raise ValueError(f"domain {entry['label']!r}: n_trials must be an int >= 0, got {n_trials!r}")
        repeated = sorted({repr(label) for label in labels if labels.count(label) > 1})
        if repeated:
            raise ValueError(f"domain statistics labels are repeated: {', '.join(repeated)}")
        expected = {f"prior.{i}" for i in range(len(sizes))} if meta["prior"] else set()
        expected |= {f"domain.{j}.{i}" for j in range(len(entries)) for i in range(len(sizes))}
        if set(arrays) != expected:
            raise ValueError(f"domain statistics arrays {sorted(arrays)} do not match their metadata")
        for name, value in arrays.items():
            n = sizes[int(name.rsplit(".", 1)[1])]
            if value.shape != (n, n) or value.dtype.kind != "f":
                raise ValueError(f"domain statistics array {name!r} is {value.dtype} {value.shape}, expected a float "
                                 f"array of shape {(n, n)}")
            if (not np.isfinite(value).all() or np.abs(value - value.T).max() > 1e-6 * np.abs(value).max()
                    or np.linalg.eigvalsh(value)[0] <= 0):
                raise ValueError(f"domain statistics array {name!r} is not a finite symmetric positive definite matrix")
        stats = cls(sizes, dtype, device)

        def tensor(name):
            return torch.as_tensor(arrays[name], dtype=dtype, device=device)

        if meta["prior"]:
            stats.prior = [tensor(f"prior.{i}") for i in range(len(sizes))]
        for j, entry in enumerate(entries):
            stats.domains[labels[j]] = [
                RunningMean(tensor(f"domain.{j}.{i}"), entry["weight"], entry["n_trials"])
                for i in range(len(sizes))]
        return stats


class DomainStatisticsMixin:
    """``reset_domain`` and ``domains_`` of an estimator that keeps a :class:`DomainStatistics`.

    Examples
    --------
    >>> from skfedspd import Recenter
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, _ = make_spd_classification(n_matrices=10, n_channels=3, seed=0)
    >>> rc = Recenter().fit(X).adapt(X[:4], domain="s1").adapt(X[4:], domain=2)
    >>> rc.domains_, rc.reset_domain("s1").domains_
    ({'s1': 4, 2: 6}, {2: 6})
    """

    def _check_domain_support(self, what):
        """Raise for a configuration without domain statistics (default: every one has them)."""

    def reset_domain(self, domain=None):
        """Forget the statistics of ``domain``: one label, a list of labels, or None (every domain).

        Parameters
        ----------
        domain : str, int, list of str or int, or None, default=None

        Returns
        -------
        self
        """
        check_is_fitted(self)
        self._check_domain_support("reset_domain")
        stats = self._domain_statistics()
        stats.reset(domain)
        self.domain_statistics_ = stats
        return self

    @property
    def domains_(self):
        """Label → number of trials seen, from the least to the most recently updated."""
        check_is_fitted(self)
        self._check_domain_support("domains_")
        return self._domain_statistics().trials_seen()


class DomainUpdate:
    """One call's update of its domains, stored by :meth:`commit` (made by
    :meth:`DomainStatistics.update`).

    Attributes
    ----------
    labels : list
        Each trial's domain.
    states : dict
        Domain label → list of :class:`RunningMean`, one per layer.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.online import DomainStatistics
    >>> stats = DomainStatistics([2], torch.float64, prior=[torch.eye(2, dtype=torch.float64)])
    >>> update = stats.update(["s1", "s1"], prior_weight=1.0)
    >>> _ = update.add_in_order(4 * torch.eye(2, dtype=torch.float64).expand(2, 2, 2), layer=0)
    >>> update.inv_halves(0)[1].diagonal()  # re-centred by the prior and the first trial
    tensor([0.7071, 0.7071], dtype=torch.float64)
    """

    def __init__(self, statistics, labels, states):
        self.statistics, self.labels, self.states = statistics, list(labels), states
        self._added = {}  # layer → (what each trial added, its domain's statistics just before)

    def add_in_order(self, Z, layer):
        """Add each ``Z[t]`` to its domain at ``layer``, in order; return each trial's ``inv_half``."""
        before, inv_halves = [], []
        for matrix, label in zip(Z, self.labels):
            states = self.states[label]
            before.append(states[layer])
            states[layer] = states[layer].add(matrix)
            inv_halves.append(states[layer].inv_half)
        self._added[layer] = (Z, before)
        return torch.stack(inv_halves)

    def inv_halves(self, layer, include_self=False):
        """``mean^{-1/2}`` of each trial's domain at ``layer``, without the trial itself unless
        ``include_self`` (taken out with :meth:`RunningMean.without`).
        """
        if include_self:
            if len(self.states) == 1:
                (states,) = self.states.values()
                return states[layer].inv_half.expand(len(self.labels), -1, -1)
            return torch.stack([self.states[label][layer].inv_half for label in self.labels])
        Z, before = self._added[layer]
        result, kept = [None] * len(self.labels), {}
        for t in range(len(self.labels) - 1, -1, -1):
            label, prior_state = self.labels[t], before[t]
            weight = prior_state.next_weight()
            final = self.states[label][layer]
            if label not in kept:  # nothing before it (a new domain without a prior): itself
                result[t] = (prior_state if prior_state.weight > 0 else final).inv_half
            else:
                result[t] = final.without(Z[t], kept[label] / weight).inv_half
            kept[label] = kept.get(label, 1.0) * (1.0 - 1.0 / weight)
        return torch.stack(result)

    @property
    def starts_without_prior(self):
        """Whether a domain of this call holds a single trial and no prior (scored by itself)."""
        return self.statistics.prior is None and any(states[0].n_trials == 1 for states in self.states.values())

    def commit(self, max_domains=None):
        """Store the updated domains (:meth:`DomainStatistics.commit`)."""
        self.statistics.commit(self.states, max_domains)


#: A call's own temporary domain (``predict(X)`` without ``domain``): never a user label,
#: which is a str or an int.
THIS_CALL = ("this call",)


NO_PRIOR_WARNING = (
    "this model has no domain prior (domain_prior_ is None: saved before it existed, trained by partial_fit, or "
    "deployed without it), so the first trial of a new domain is re-centred by itself alone and its output is the "
    "same whatever the trial. Call fit_domain_prior(X_train, groups) once, and pass domain=... to predict (or "
    "adapt(X_calibration, domain=...) first) so that a domain's statistics persist across calls"
)
