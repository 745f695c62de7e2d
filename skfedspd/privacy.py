"""Sample-level differential privacy, the accounting: what DP-SGD spends, and its settings.

The mechanism (:mod:`skfedspd.dp_sgd`) is accounted as ``steps`` Poisson-subsampled
Gaussian mechanisms (add/remove-one adjacency) by Google's ``dp-accounting`` (RDP by
default, PLD on request): :func:`epsilon_spent`, :func:`calibrate_noise` and, for a
federated run, :func:`plan_dp`. :class:`DPSGD` groups a federated fit's settings.
"""

import contextlib
import logging
import math
import numbers

from numbers import Real

from sklearn.utils._param_validation import Interval

from .dp_sgd import DOMAIN_COUNT_WEIGHT, domain_mean_sensitivity, steps_per_epoch
from .training import Settings
from .validation import check_count, check_positive, is_count

__all__ = [
    "DPSGD",
    "ACCOUNTANTS",
    "epsilon_spent",
    "calibrate_noise",
    "calibrate_release_noise",
    "group_epsilon",
    "default_delta",
    "plan_dp",
]

#: Accountants of ``dp-accounting`` by name: RDP (Mironov 2017; fast, an upper bound) and
#: PLD (privacy loss distributions; tighter, slower).
ACCOUNTANTS = {
    "rdp": "dp_accounting.rdp.RdpAccountant",
    "pld": "dp_accounting.pld.PLDAccountant",
}

def _dp_accounting():
    try:
        import dp_accounting
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("privacy accounting needs Google's dp-accounting: "
                          "pip install 'skfedspd[privacy]'") from err
    return dp_accounting


def _accountant(name):
    if name not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {sorted(ACCOUNTANTS)}, got {name!r}")
    dpa = _dp_accounting()
    return dpa.rdp.RdpAccountant() if name == "rdp" else dpa.pld.PLDAccountant()


@contextlib.contextmanager
def _quiet_absl():
    """Silence the RDP accountant's warnings about skipped fractional orders."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _check_accounting_args(delta, sample_rate, steps):
    if not (isinstance(delta, numbers.Real) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if not (isinstance(sample_rate, numbers.Real) and 0 < sample_rate <= 1):
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    check_count(steps, "steps", 0)


def _release_event(domain):
    """The domain means' release: one Gaussian mechanism per batch-norm layer."""
    dpa = _dp_accounting()
    return dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(float(domain["noise_multiplier"])), int(domain["layers"]))


def _event(noise_multiplier, sample_rate, steps, domain=None):
    dpa = _dp_accounting()
    step = dpa.PoissonSampledDpEvent(float(sample_rate), dpa.GaussianDpEvent(float(noise_multiplier)))
    training = dpa.SelfComposedDpEvent(step, int(steps))
    return training if domain is None else dpa.ComposedDpEvent([_release_event(domain), training])


def _check_domain(domain):
    if domain is None:
        return
    check_count(domain.get("layers"), "domain['layers']", 1)
    check_positive(domain.get("noise_multiplier"), "domain['noise_multiplier']")


def epsilon_spent(noise_multiplier, delta, sample_rate, steps, *, accountant="rdp", domain=None):
    """ε of ``steps`` Poisson-subsampled (rate ``sample_rate``) Gaussian mechanisms of multiplier
    ``noise_multiplier`` at ``delta`` (add/remove-one adjacency), by the ``"rdp"`` or ``"pld"``
    accountant; ``domain``: a release of domain means composed before the steps
    (``{"noise_multiplier": σ_s, "layers": L}``).

    Examples
    --------
    >>> from skfedspd.privacy import epsilon_spent
    >>> round(epsilon_spent(1.1, 1e-5, sample_rate=0.01, steps=1000), 1)
    1.7
    """
    _check_accounting_args(delta, sample_rate, steps)
    check_positive(noise_multiplier, "noise_multiplier", allow_zero=True)
    _check_domain(domain)
    if steps > 0 and noise_multiplier == 0:
        return math.inf
    if steps == 0:
        if domain is None:
            return 0.0
        event = _release_event(domain)
    else:
        event = _event(noise_multiplier, sample_rate, steps, domain)
    with _quiet_absl():
        return float(_accountant(accountant).compose(event).get_epsilon(delta))


def group_epsilon(noise_multiplier, delta, steps, group_size, *, accountant="rdp", domain=None):
    """An upper bound on ε for a group of ``group_size`` samples of one site (a subject's
    recording), without amplification by sampling.

    Examples
    --------
    >>> from skfedspd.privacy import group_epsilon
    >>> group_epsilon(1.0, 1e-5, steps=10, group_size=4) > group_epsilon(1.0, 1e-5, steps=10, group_size=1)
    True
    """
    check_positive(noise_multiplier, "noise_multiplier")
    check_count(group_size, "group_size", 1)
    _check_accounting_args(delta, 1.0, steps)
    _check_domain(domain)
    dpa = _dp_accounting()
    events = [dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(noise_multiplier / group_size), int(steps))]
    if domain is not None:
        events.append(_release_event({"noise_multiplier": domain["noise_multiplier"] / group_size,
                                      "layers": domain["layers"]}))
    with _quiet_absl():
        return float(_accountant(accountant).compose(dpa.ComposedDpEvent(events)).get_epsilon(delta))


def calibrate_release_noise(target_epsilon, delta, *, layers, accountant="rdp", tol=1e-4):
    """Smallest noise multiplier ``σ_s`` whose release of the domain means spends at most ``ε``.

    Examples
    --------
    >>> from skfedspd.privacy import calibrate_release_noise
    >>> round(calibrate_release_noise(2.0, 1e-5, layers=1), 2)
    2.15
    """
    if not (isinstance(target_epsilon, numbers.Real) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be positive (inf for no noise), got {target_epsilon!r}")
    if math.isinf(target_epsilon):
        return 0.0
    _check_domain({"layers": layers, "noise_multiplier": 1.0})
    _accountant(accountant)
    mc = _dp_accounting().mechanism_calibration
    with _quiet_absl():
        sigma = mc.calibrate_dp_mechanism(
            lambda: _accountant(accountant),
            lambda s: _release_event({"noise_multiplier": s, "layers": layers}),
            float(target_epsilon), float(delta),
            bracket_interval=mc.LowerEndpointAndGuess(1e-3, 1.0), tol=tol,
        )
    return float(sigma)


def calibrate_noise(target_epsilon, delta, *, sample_rate, steps, accountant="rdp", tol=1e-4, domain=None):
    """Smallest noise multiplier ``σ`` (within ``tol``) whose ``steps`` steps (and ``domain``
    release, as in :func:`epsilon_spent`) spend at most ``target_epsilon`` (``inf``: 0).

    Examples
    --------
    >>> from skfedspd.privacy import calibrate_noise, epsilon_spent
    >>> sigma = calibrate_noise(2.0, 1e-5, sample_rate=0.05, steps=200)
    >>> round(sigma, 2), epsilon_spent(sigma, 1e-5, sample_rate=0.05, steps=200) <= 2.0
    (1.79, True)
    """
    _check_accounting_args(delta, sample_rate, steps)
    if not (isinstance(target_epsilon, numbers.Real) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be positive (inf for no noise), got {target_epsilon!r}")
    _check_domain(domain)
    if math.isinf(target_epsilon) or steps == 0:
        return 0.0
    _accountant(accountant)  # validate the name before the search
    if domain is not None and epsilon_spent(0.0, delta, sample_rate, 0, accountant=accountant,
                                            domain=domain) >= target_epsilon:
        raise ValueError(f"the release of the domain means alone spends the whole ε = {target_epsilon}: "
                         "give it a smaller share")
    mc = _dp_accounting().mechanism_calibration
    with _quiet_absl():
        sigma = mc.calibrate_dp_mechanism(
            lambda: _accountant(accountant),
            lambda s: _event(s, sample_rate, steps, domain),
            float(target_epsilon), float(delta),
            bracket_interval=mc.LowerEndpointAndGuess(1e-3, 1.0), tol=tol,
        )
    return float(sigma)


def default_delta(n_train_per_site):
    """``min(1e-5, 1 / (10 · n_min))``.

    Examples
    --------
    >>> from skfedspd.privacy import default_delta
    >>> default_delta([120, 90, 200]), default_delta([20000, 50000])
    (1e-05, 5e-06)
    """
    return min(1e-5, 0.1 / min(int(n) for n in n_train_per_site))


def _rounds_per_site(participation, n_rounds, n_sites):
    """Rounds each site trains in, and how the count was obtained."""
    if isinstance(participation, numbers.Real):
        if not 0 < participation <= 1:
            raise ValueError(f"participation must be in (0, 1] or a per-site sequence of round counts, got {participation!r}")
        # Sites are drawn afresh every round: any one may be drawn in all of them.
        bound = "all rounds" if participation == 1 else "worst case: a site may be drawn in every round"
        return [n_rounds] * n_sites, bound
    counts = [int(c) for c in participation]
    if len(counts) != n_sites or any(c < 0 or c > n_rounds or c != r for c, r in zip(counts, participation)):
        raise ValueError(f"participation as a sequence needs one integer in [0, n_rounds={n_rounds}] per "
                         f"site ({n_sites} sites), got {list(participation)!r}")
    return counts, "exact: per-site counts of the seeded (data-independent) schedule"


def plan_dp(n_train_per_site, batch_size, local_epochs, n_rounds, participation, target_epsilon,
            delta=None, *, per_site_noise=True, accountant="rdp", domain_release=None):
    """Noise multipliers so that every site's whole federated run meets ``(ε, δ)`` on its
    training samples (site ``i`` samples at ``q_i = min(1, batch_size / n_i)``).

    Parameters
    ----------
    n_train_per_site : sequence of int
    batch_size : int
    local_epochs, n_rounds : int
    participation : float or sequence of int
        Fraction of sites drawn per round, or each site's exact number of rounds.
    target_epsilon : float
    delta : float or None
        None: :func:`default_delta`.
    per_site_noise : bool, default=True
        Each site its own ``σ_i``, or the largest for every site.
    accountant : {"rdp", "pld"}, default="rdp"
    domain_release : dict or None, default=None
        ``{"layers": L, "share": f, "clip": R}``: a release of domain means spending ``f · ε``.

    Returns
    -------
    dict
        JSON-able report, one entry per site in ``sites``.

    Examples
    --------
    >>> from skfedspd.privacy import plan_dp
    >>> plan = plan_dp([200, 300], batch_size=20, local_epochs=1, n_rounds=5, participation=1.0,
    ...                target_epsilon=1.0)
    >>> [round(site["noise_multiplier"], 2) for site in plan["sites"]]
    [3.18, 2.64]
    """
    if not len(n_train_per_site) or not all(is_count(n, 1) for n in n_train_per_site):
        raise ValueError(f"n_train_per_site must be positive integers, got {list(n_train_per_site)!r}")
    sizes = [int(n) for n in n_train_per_site]
    for name, value in (("batch_size", batch_size), ("local_epochs", local_epochs), ("n_rounds", n_rounds)):
        check_count(value, name, 1)
    if delta is None:
        delta = default_delta(sizes)
    if not delta < 1 / min(sizes):
        raise ValueError(f"delta={delta} must be below 1 / (smallest site's training size {min(sizes)})")
    rounds, bound = _rounds_per_site(participation, n_rounds, len(sizes))
    release = None
    if domain_release is not None:
        share = domain_release["share"]
        if not (isinstance(share, numbers.Real) and 0 < share < 1):
            raise ValueError(f"domain_release['share'] must be in (0, 1), got {share!r}")
        layers = domain_release["layers"]
        sigma = calibrate_release_noise(share * target_epsilon, delta, layers=layers, accountant=accountant)
        release = dict(layers=int(layers), share=float(share), clip=float(domain_release["clip"]),
                       count_weight=DOMAIN_COUNT_WEIGHT, sensitivity=domain_mean_sensitivity(domain_release["clip"]),
                       noise_multiplier=sigma,
                       epsilon=epsilon_spent(0.0, delta, 1.0, 0, accountant=accountant,
                                             domain={"noise_multiplier": sigma, "layers": layers})
                       if sigma > 0 else math.inf)
    domain = None if release is None or release["noise_multiplier"] == 0 else release
    sites = []
    for n, r in zip(sizes, rounds):
        q = min(1.0, batch_size / n)
        per_epoch = steps_per_epoch(q)
        steps = r * local_epochs * per_epoch
        sites.append(dict(n_train=n, sample_rate=q, steps_per_epoch=per_epoch, rounds=r, steps=steps))
    calibrated = {}
    for site in sites:
        key = (site["sample_rate"], site["steps"])
        if key not in calibrated:
            calibrated[key] = calibrate_noise(target_epsilon, delta, sample_rate=key[0], steps=key[1],
                                              accountant=accountant, domain=domain)
        site["noise_multiplier"] = calibrated[key]
    if not per_site_noise:
        sigma = max(site["noise_multiplier"] for site in sites)
        for site in sites:
            site["noise_multiplier"] = sigma
    for site in sites:
        site["training_epsilon"] = epsilon_spent(site["noise_multiplier"], delta, site["sample_rate"], site["steps"],
                                                 accountant=accountant)
        site["epsilon"] = epsilon_spent(site["noise_multiplier"], delta, site["sample_rate"], site["steps"],
                                        accountant=accountant, domain=domain)
    from importlib.metadata import version

    return dict(
        mechanism="DP-SGD: Poisson-subsampled Gaussian mechanism, per-sample joint clipping "
                  "(Riemannian gradients of the Stiefel weights, Euclidean of the others)",
        adjacency="add/remove one training sample of a site (sample-level DP, per site)",
        accountant=dict(name=accountant, cls=ACCOUNTANTS[accountant], version=version("dp-accounting")),
        target_epsilon=float(target_epsilon), delta=float(delta), rounds_bound=bound,
        batch_size=int(batch_size), local_epochs=int(local_epochs), n_rounds=int(n_rounds),
        participation=float(participation) if isinstance(participation, numbers.Real) else list(rounds),
        per_site_noise=bool(per_site_noise), domain_release=release, sites=sites,
    )


#: The largest ε a :class:`DPSGD` takes: 1e4 is already no protection, and from about 1e6 on
#: dp-accounting finds no noise multiplier to calibrate (its bracketing search fails).
MAX_EPSILON = 1e4


class DPSGD(Settings):
    """Sample-level differential privacy of a federated fit: DP-SGD at every site, calibrated by
    :func:`plan_dp` (``docs/guide/privacy.md``).

    Parameters
    ----------
    epsilon : float
        ε of the guarantee, in ``(0, MAX_EPSILON]``.
    delta : float or None, default=None
        δ of the guarantee; None: :func:`default_delta`.
    clip_norm : float, default=1.0
        Bound ``C`` on each sample's joint gradient norm.
    domain_share : float, default=0.25
        With ``batchnorm="domain"``: the share of ``epsilon`` spent releasing the domains' means.
    domain_clip : float, default=2.0
        ``R``: the clip of each trial's log-matrix deviation before that release.

    Examples
    --------
    >>> from sklearn.base import clone
    >>> from skfedspd.privacy import DPSGD
    >>> clone(DPSGD(epsilon=8.0)).set_params(clip_norm=0.5)
    DPSGD(clip_norm=0.5, epsilon=8.0)
    """

    _parameter_constraints = {
        "epsilon": [Interval(Real, 0, MAX_EPSILON, closed="right")],
        "delta": [None, Interval(Real, 0, 1, closed="neither")],
        "clip_norm": [Interval(Real, 0, None, closed="neither")],
        "domain_share": [Interval(Real, 0, 1, closed="neither")],
        "domain_clip": [Interval(Real, 0, None, closed="neither")],
    }

    def __init__(self, epsilon, delta=None, clip_norm=1.0, domain_share=0.25, domain_clip=2.0):
        self.epsilon = epsilon
        self.delta = delta
        self.clip_norm = clip_norm
        self.domain_share = domain_share
        self.domain_clip = domain_clip
