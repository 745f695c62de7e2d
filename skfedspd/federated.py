"""``FederatedSPDnetClassifier``: FedSPDnet (Algorithm 1 of the paper) as a meta-estimator.

``fit`` validates the parameters and the data, splits the samples into clients
(:class:`~skfedspd.run.ClientData`), builds the run (:class:`~skfedspd.run.FederatedRun`: set-up,
engine, end) and hands both to a transport by name (:func:`get_backend`): ``"local"``
(:func:`skfedspd.local.fit_local`, the clients' sites in this process, optionally in parallel
with joblib) or ``"flower"`` (an in-process Flower simulation). The estimator's attributes
are assigned only when the transport succeeds: a fit that raises leaves it as it was.
"""

import copy
import warnings
from importlib.metadata import entry_points
from numbers import Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context, clone
from sklearn.utils._param_validation import HasMethods, Interval, RealNotInt, StrOptions
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted

from .aggregation import AGGREGATIONS, get_aggregation
from .backends import (BACKEND_GROUP, FlowerBackend, LocalBackend, backend_names, resolve_backend,
                       uses_secure_aggregation)
from .classifier import HEAD_ON_RANDOM_WARNING, SPDnetClassifier
from .client import DP_SAMPLE_WEIGHT_ERROR
from .clients import ClientPartition
from .engine import client_trust, n_selected
from .local import fit_local
from .online import drop_domain_requests
from .persistence import check_fields
from .privacy import DPSGD
from .renamed import accepts_renamed, fold_renamed, merge_into
from .run import (ClientData, FederatedResult, FederatedRun, build_engine, given_estimator, held_out_fraction,
                  init_model, local_estimator, run_seed)
from .server_optimizer import ServerMomentum
from .spec import estimator_from_spec, estimator_to_spec
from .training import RoundSchedule
from .validation import (Count, Sequence, check_groups, check_label_values, check_nested_params, is_count,
                         resolve_groups, training_weights)

__all__ = ["FederatedSPDnetClassifier", "get_backend", "set_result"]


# The local estimator's protocol (skfedspd.base.TorchClassifierBase), all that fit calls.
PROTOCOL = ["check_params", "check_inputs", "set_classes", "encode_labels", "input_statistic",
            "set_input_statistic", "to_tensor", "init_module", "get_parameters", "set_parameters",
            "parameter_kinds", "local_update", "fitted_state", "restore_fitted_state"]


def get_backend(name):
    """The transport ``name`` (:func:`~skfedspd.backends.backend_names`), imported when asked for.

    Raises
    ------
    ValueError
        When no installed package registers ``name``.
    ImportError
        When the transport needs a package that is not installed (for skfedspd's own, the
        extra of the same name: ``pip install 'skfedspd[flower]'``).

    Examples
    --------
    >>> from skfedspd.federated import get_backend
    >>> get_backend("local").__name__
    'fit_local'
    """
    if name == "local":
        return fit_local
    found = entry_points(group=BACKEND_GROUP, name=name)
    if not found:
        raise ValueError(f"unknown backend {name!r}: installed are {sorted(backend_names())}")
    point = next(iter(found))
    try:
        return point.load()
    except ModuleNotFoundError as error:
        if point.module.partition(".")[0] == "skfedspd" and (error.name or "").partition(".")[0] != "skfedspd":
            raise ImportError(f"backend={name!r} needs the {name} extra: pip install 'skfedspd[{name}]' "
                              f"({error})") from error
        raise


#: ``fit``'s warning for server momentum with clients that keep their Adam state.
KEEP_WITH_SERVER_MOMENTUM_WARNING = (
    "server_momentum > 0 with client_optimizer_state='keep' trains badly (measured in "
    "docs/design-decisions.md, 'Server momentum'); use client_optimizer_state='reset' with server momentum")


#: ``fit``'s (and :func:`skfedspd.flower.fit_federated`'s) warning for ``n_jobs`` on Flower.
N_JOBS_ON_FLOWER_WARNING = (
    "n_jobs={} is ignored on Flower (each site trains in its own ClientApp; the in-process simulation "
    "runs them one after another): n_jobs applies to backend='local' only")


#: The flat parameters grouped into objects: old name → (parameter, its field). Accepted
#: (``__init__``, ``set_params``, saved specs) with a ``FutureWarning`` until 0.4.
RENAMED = {
    "patience": ("schedule", "patience"),
    "lr_patience": ("schedule", "lr_patience"),
    "lr_factor": ("schedule", "lr_factor"),
    "server_lr": ("server_optimizer", "lr"),
    "server_momentum": ("server_optimizer", "momentum"),
    "dp_epsilon": ("privacy", "epsilon"),
    "dp_delta": ("privacy", "delta"),
    "dp_clip_norm": ("privacy", "clip_norm"),
    **{name: ("clients", name) for name in ("groups_per_client", "n_clients", "partition", "alpha")},
    **{name: ("backend", name) for name in ("n_jobs", "checkpoint_path", "secure_aggregation")},
}


def _merge_privacy(current, fields):
    """``dp_epsilon=None`` turns privacy off; other DP fields need privacy on."""
    if fields.get("epsilon", ...) is None:
        return None
    if current is None and "epsilon" not in fields:
        raise ValueError(f"{sorted(fields)} without privacy: set privacy=DPSGD(epsilon=...) first")
    return DPSGD(**fields) if current is None else clone(current).set_params(**fields)


def _merge_backend(current, fields):
    """``secure_aggregation=True`` makes the backend a :class:`FlowerBackend`; ``n_jobs`` and
    ``checkpoint_path`` set the :class:`LocalBackend`'s, and on Flower, as before, ``n_jobs``
    is ignored with a warning and a ``checkpoint_path`` refused."""
    backend = resolve_backend("local" if current is None else current)
    if "secure_aggregation" in fields:
        if isinstance(backend, FlowerBackend):
            backend = clone(backend).set_params(secure_aggregation=fields["secure_aggregation"])
        elif fields["secure_aggregation"]:
            backend = FlowerBackend(secure_aggregation=True)
    local = {name: value for name, value in fields.items() if name != "secure_aggregation"}
    if isinstance(backend, LocalBackend):
        return clone(backend).set_params(**local)
    if local.get("checkpoint_path") is not None:
        raise ValueError("checkpoint_path is not supported by the Flower backend (the local backend only)")
    if local.get("n_jobs") not in (None, 1):
        warnings.warn(N_JOBS_ON_FLOWER_WARNING.format(local["n_jobs"]), UserWarning, stacklevel=4)
    return backend


# the defaults of the flat parameters: no schedule change, no momentum, no DP
_MERGES = {"schedule": merge_into(RoundSchedule()), "server_optimizer": merge_into(ServerMomentum(momentum=0.0)),
           "privacy": _merge_privacy, "clients": merge_into(ClientPartition()), "backend": _merge_backend}


def _local_estimator_has(name):
    """``available_if`` check: the domain API (``adapt``, ``reset_domain``, ...) is the local
    estimator's, delegated where it has it (``SPDnetClassifier``), absent otherwise (``EEGNetClassifier``)."""
    return lambda fed: hasattr(type(fed._local_estimator()), name)


def _is_counts(value):
    return isinstance(value, list) and len(value) > 0 and all(is_count(v) for v in value)


#: How the fields of a saved federated state are checked (:func:`~skfedspd.persistence.check_fields`).
STATE_CHECKS = {
    "estimator": (lambda v: isinstance(v, dict), "an object (the global model's fitted state)", True),
    "engine": (lambda v: isinstance(v, dict), "an object (the engine's state)", True),
    "client_source": (lambda v: isinstance(v, str), "a string", True),
    "client_groups": (lambda v: isinstance(v, list) and all(g is None or isinstance(g, list) for g in v),
                      "a list of lists of groups (or nulls)", True),
    "local_estimator": (lambda v: isinstance(v, dict), "an estimator spec (an object)", False),
}

#: How the fields of a saved engine state are checked (the engine checks its arrays, version and kinds).
ENGINE_STATE_CHECKS = {
    "version": (lambda v: True, "", True),
    "kinds": (lambda v: isinstance(v, dict), "an object", True),
    "n_train": (_is_counts, "a non-empty list of ints >= 0", True),
    "n_val": (_is_counts, "a non-empty list of ints >= 0", True),
    "seed": (is_count, "an int >= 0", True),
    "input_statistic": (lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                                and bool(np.isfinite(v))), "a finite number or null", True),
    "schedule": (lambda v: isinstance(v, dict), "an object", True),
    "history": (lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v),
                "a list of records (objects)", True),
    "has_best": (lambda v: isinstance(v, bool), "true or false", True),
    "privacy": (lambda v: v is None or isinstance(v, dict), "an object or null", False),
}


def set_result(fed, result):
    """Make ``fed`` (a :class:`FederatedSPDnetClassifier`) the fitted model of a run's
    :class:`~skfedspd.run.FederatedResult` and return it: only assignments, what ``fit``
    does once its transport has succeeded and what a deployment's server does with its
    run's result (:func:`skfedspd.flower.serve`).

    Examples
    --------
    >>> from skfedspd import FederatedSPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.federated import set_result
    >>> from skfedspd.run import FederatedResult
    >>> X, y = make_spd_classification(n_matrices=40, n_channels=4, seed=0)
    >>> from skfedspd.clients import ClientPartition
    >>> fed = FederatedSPDnetClassifier(n_rounds=2, clients=ClientPartition(n_clients=2, partition="stratified"),
    ...                                 random_state=0).fit(X, y)
    >>> result = FederatedResult(fed.global_estimator_, fed.engine_, fed.client_source_, fed.client_groups_)
    >>> bool((set_result(FederatedSPDnetClassifier(), result).predict(X) == fed.predict(X)).all())
    True
    """
    est, engine = result.estimator, result.engine
    fed.global_estimator_ = est
    fed.engine_ = engine
    fed.history_ = engine.history
    fed.classes_ = est.classes_
    fed.n_features_in_ = est.n_features_in_
    fed.n_clients_ = engine.n_clients
    fed.client_source_ = result.client_source
    fed.client_groups_ = list(result.client_groups)
    fed.best_round_ = engine.best_round
    fed.privacy_ = engine.privacy_report()
    fed.client_trust_, fed.trust_summary_ = client_trust(engine.history, engine.n_clients, engine.weighting)
    return fed



class FederatedSPDnetClassifier(ClassifierMixin, BaseEstimator):
    """Federated SPDnet (FedSPDnet) with ProjAvg / RLAvg aggregation.

    Parameters
    ----------
    estimator : TorchClassifierBase, default=None
        The local model and its training parameters (``SPDnetClassifier()`` when None),
        reachable as ``estimator__lr`` etc. Used through its public protocol
        (``docs/guide/protocol.md``): the architecture, ``lr`` (initial learning rate of the
        clients), ``batch_size``, ``dtype``, ``device``, the input scaling. Not used: its
        epoch-level ``max_epochs``, ``schedule``, ``validation_fraction``, ``warm_start``,
        ``verbose``, ``random_state`` (this estimator's round-level parameters take their place).
    aggregation : {"projavg", "rlavg", "karcher", "geomedian", "trimmedmean", "krum"} or callable, default="projavg"
        Server rule; a callable has the signature of :mod:`skfedspd.aggregation`
        (``rule(client_params, weights, previous, kinds) -> dict``); its output is checked
        (names, shapes, finite, orthonormal Stiefel arrays) and a bad one raises naming it.
        The robust rules (against a faulty or hostile site) by name have their default
        parameters; set them with an instance, e.g.
        ``aggregation=TrimmedMean(trim=0.25)`` (reachable as ``aggregation__trim``; saved
        and sent to Flower with the estimator): :class:`~skfedspd.aggregation.GeometricMedian`,
        :class:`~skfedspd.aggregation.TrimmedMean`, :class:`~skfedspd.aggregation.Krum`
        (``docs/guide/robust-aggregation.md``). Not with secure aggregation.
    n_rounds : int, default=150
    local_epochs : int, default=2
    clients_per_round : int, float or None, default=None
        None: every client every round. int: exactly that many. float in (0, 1]:
        ``max(1, floor(fraction * N))`` (the paper's half participation is 0.5).
    schedule : RoundSchedule or None, default=None
        The plateau schedule, counted in rounds (:class:`~skfedspd.training.RoundSchedule`:
        ``patience``, ``lr_patience``, ``lr_factor``); None: ``RoundSchedule()`` (every round
        runs, as in the paper; the learning rate halves after 20 rounds without
        improvement). Reachable as ``schedule__lr_patience`` once set.
    clients : ClientPartition or None, default=None
        How the samples become clients (:class:`~skfedspd.clients.ClientPartition`: with
        groups, ``groups_per_client`` sorted groups per client; without, ``n_clients`` of a
        stratified, contiguous or Dirichlet ``partition``); None: ``ClientPartition()``.
        Reachable as ``clients__n_clients`` once set.
    domains : {"client", "group"}, default="client"
        What a training domain is for a local estimator that uses domains
        (``SPDnetClassifier(batchnorm="domain")``): ``"client"``, each client's data form one
        domain; ``"group"``, each group (subject) of a client is a domain of its own
        (:meth:`~skfedspd.SPDnetClassifier.fit_domains`). The same with one group per client.
        The default is measured on unseen subjects in ``docs/design-decisions.md``. A
        deployed site's domains are the ``groups`` of its data file (none: the site is one
        domain). Ignored by local estimators without domains.
    weighting : {"n_samples", "uniform"}, default="n_samples"
        Client weights in the aggregation (training samples of each accepted reply; with
        ``sample_weight``, the sum of its training samples' weights).
    validation_fraction : float, default=0.1
        Stratified share of each client's data kept on that client for validation, when
        the local estimator's ``early_stopping`` rule holds one out for the federation as a
        whole (:func:`skfedspd.run.held_out_fraction`: with the default ``"auto"``, only when the pooled
        part reaches ``max(50, 2 · n_classes)`` samples; otherwise every sample trains and
        the last global model is kept). A deployment's sites hold it out as given.
    max_update_norm : float or None, default=1000.0
        A client reply whose array ``θ_i`` moved from the broadcast ``θ`` by more than
        ``max_update_norm · (1 + ‖θ‖_F)`` (Frobenius norm, per array) is rejected as a
        failed client. The default only stops absurd replies: an honest round moves a
        Stiefel array by at most ``2√k`` and the other arrays by a few learning-rate steps.
        None: no bound.
    server_optimizer : ServerMomentum or None, default=None
        The server optimizer (:class:`~skfedspd.server_optimizer.ServerMomentum`: FedAvgM on
        the Stiefel manifold, server learning rate ``lr`` and momentum ``momentum``); None:
        the aggregate is the new global model (the paper). It uses only the aggregate and the
        server's own state, so it also runs under secure aggregation, and its buffer is part
        of the checkpoint. With the paper's clients (``client_optimizer_state="reset"``),
        ``ServerMomentum()`` (``lr=1.0``, ``momentum=0.9``) is recommended
        (``docs/benchmarks/tableone.md``). Not with clients that keep their Adam state (the
        default): that pair trains badly (``docs/design-decisions.md``); ``fit`` and
        :func:`skfedspd.flower.fit_federated` warn (:meth:`warn_about_settings`).
    client_optimizer_state : {"keep", "reset"}, default="keep"
        Whether each client's Adam optimizer keeps its moments and step count from one of
        its rounds to the next (``"keep"``; the learning rate is the round's) or starts
        afresh every round (``"reset"``: the paper's protocol; why keep is the default:
        ``docs/design-decisions.md``). The state never leaves its client: not aggregated,
        not in the global model, the fitted estimator or any secure sum. It lasts one fit
        (a local checkpoint holds it, so a resumed fit continues bit for bit; a Flower site
        keeps it in its SuperNode's context; a ``warm_start`` fit starts fresh optimizers).
    random_state : int, RandomState instance or None, default=None
    verbose : bool, default=False
        A progress bar over rounds with the global validation macro-F1 (both backends).
    on_client_error : {"raise", "skip"}, default="raise"
        What a failed client does to its round: a client whose local training raises, or
        whose reply fails the checks of :mod:`skfedspd.engine` (names, shapes, dtypes,
        finite values, orthonormality, update norm, sample counts, metrics in range).
        "raise": the fit raises. "skip": the client is left out of that round (recorded in
        ``history_``, with the reason, and a ``RuntimeWarning``); the round fails only if
        every client does.
    warm_start : bool, default=False
        A second ``fit`` continues for ``n_rounds`` more rounds from the last global model.
    backend : str, LocalBackend or FlowerBackend, default="local"
        Where the fit runs and the transport's options (:mod:`skfedspd.backends`):
        :class:`~skfedspd.backends.LocalBackend` (``n_jobs``, ``checkpoint_path``), the
        clients simulated in this process; :class:`~skfedspd.backends.FlowerBackend`
        (``secure_aggregation``), an in-process Flower simulation (the ``flower`` extra),
        bit-identical to the local backend for the same ``random_state``; or the name of
        any installed transport (``"local"``, ``"flower"``: their defaults). Real
        multi-site deployments use :func:`skfedspd.flower.fit_federated`
        (``docs/guide/deployment.md``).
    init : fitted estimator or None, default=None
        Where the global model starts: a fitted local model of the same class (e.g. an
        ``SPDnetClassifier`` pre-trained on public data) or a fitted
        ``FederatedSPDnetClassifier`` (its global model). Its weights (every exported array)
        replace the seeded initialisation, and the local estimator adopts its input scaling
        (``scaling="trace"`` if it used it, else its fitted ``scale_`` as a constant): the
        weights expect that input, and it is not a statistic of the sites' data, so in DP
        mode nothing is spent on it. Its classes and number of features must be the fit's
        (a ValueError otherwise: agree ``classes`` when sites may miss one), and its
        architecture the local estimator's. Allowed with ``privacy``: a public model
        costs nothing (pre-train publicly, fine-tune privately; with the local estimator's
        ``trainable="head"`` only its head is trained and privatized). It is read, never
        modified; ``clone`` keeps it as is (cloning would unfit it); the JSON spec
        (:mod:`skfedspd.spec`, ``save_estimator``) stores it as None: the fitted federated
        model holds everything it contributed. A ``warm_start`` continuation ignores it.
    privacy : DPSGD or None, default=None
        Sample-level differential privacy (:class:`~skfedspd.privacy.DPSGD`: ``epsilon``,
        ``delta``, ``clip_norm``; ``docs/guide/privacy.md``): every site's local training runs
        DP-SGD with a noise multiplier per site calibrated so that the whole run — ``n_rounds``,
        ``local_epochs``, the exact rounds the seeded schedule draws each site in — spends at
        most ``(epsilon, delta)`` on each site's training samples. None: no DP.
        DP mode is private by construction (:func:`skfedspd.run.resolved_settings`, recorded in
        ``privacy_["resolved"]``): no site holds out validation data (scores would steer
        the schedule and the released model outside the budget: a fixed number of rounds
        runs and the last global model is kept), and ``scaling="auto"`` becomes
        ``"trace"`` (per matrix; ``init``'s scaling when given), which shares no statistic
        of the sites. With a local ``batchnorm="domain"`` each site first releases its
        domains' means under the budget (``DPSGD(domain_share=..., domain_clip=...)``,
        :func:`skfedspd.dp_sgd.release_domain_means`) and DP-SGD trains on trials
        re-centred by them. Refused: an explicit validation split (``validation_fraction >
        0`` with the local estimator's ``early_stopping=True``), ``batchnorm="spd"``
        (minibatch means) and ``warm_start`` (the budget covers one fit). Sites do not
        release their training loss or input statistic.
    classes : array-like of shape (n_classes,) or None, default=None
        The label set the consortium agreed out of band (as ``partial_fit``'s ``classes``
        in scikit-learn). None: the union of the sites' labels, each site sending the set
        of labels it holds at set-up, in clear on the Flower backend. Given: ``classes_``
        is this set and no site sends any label: each checks that its own labels are
        among them (a ValueError naming the unknown labels otherwise; on Flower that site
        fails the set-up). A class that no site holds remains a class of the model (its
        head is never trained): the server cannot tell, by design. Needed for the label set
        to stay private (``docs/guide/privacy.md``); with ``warm_start`` it must equal the fitted
        ``classes_``.

    Attributes
    ----------
    global_estimator_ : TorchClassifierBase
        The best global model (highest weighted validation macro-F1 over rounds), fitted.
    engine_ : FederatedEngine
        The run's server state (global and client-local arrays, schedule, history); what
        ``warm_start`` continues.
    classes_ : ndarray
    n_features_in_ : int
    n_clients_ : int
    client_groups_ : list of tuple
        Groups of each client (None entries when clients came from a partition of the samples).
    client_source_ : str
        ``"groups"``, ``"partition:<name>"`` or ``"flower:client-id"``.
    history_ : list of dict
        One JSON-able record per round: ``round``, ``clients`` (accepted replies),
        ``n_samples`` (their training samples, or sums of sample weights), ``failed_clients`` (``{"client", "stage": "train" | "evaluate",
        "reason"}``), ``train_loss`` (weighted mean), ``val_f1``, ``val_loss`` (global model
        after aggregation, on every client's validation part, weighted by its size),
        ``orthonormality`` (``‖WᵀW − I‖`` per Stiefel weight), ``lr``,
        ``skipped_batches``, ``wall_time``; to spot a faulty site, ``client_distance`` (each
        accepted client's distance to the rule's aggregate,
        :func:`~skfedspd.aggregation.client_distances`, in ``clients`` order), and for a
        robust rule ``effective_weights`` (each client's share of the aggregate) and
        ``downweighted_clients`` (those whose share is below half their weight), None
        otherwise; and for :class:`~skfedspd.aggregation.FLTrust` ``client_agreement``
        (each client's cosine with the server's reference update), None otherwise; all
        None under secure aggregation.
    client_trust_ : ndarray of shape (n_clients,)
        Each site's trust over the fit: the inverse of its mean distance to the rule's
        aggregate relative to the round's median site (1: as close to the consensus as the
        typical site; 0.5: twice as far, round after round; NaN: never aggregated, or
        secure aggregation). ``np.argsort(client_trust_)`` names the suspect sites first;
        below ``1 / skfedspd.engine.SUSPECT_DISTANCE`` a site is flagged
        (:func:`skfedspd.engine.client_trust`).
    trust_summary_ : list of dict
        One per site: ``client``, ``rounds``, ``trust``, ``distance_ratio`` (its mean
        distance to the aggregate over the round's median), ``flagged``, ``weight`` (the
        rule's mean effective weight over the site's weight: 1 under a plain rule, near 0
        when a robust rule kept leaving it out), ``downweighted`` (rounds the rule
        down-weighted it in), ``failed`` (train replies refused), ``agreement`` (mean
        agreement with the server's reference update, FLTrust) and ``reason`` (why it is
        flagged, or why the rule left it out in most rounds; None otherwise). Both are
        recomputed from ``history_``, so a saved and loaded model has them.
    best_round_ : int
    privacy_ : dict or None
        DP mode: the JSON-able report of :func:`skfedspd.privacy.plan_dp` (mechanism,
        adjacency, accountant name/class/version, ``target_epsilon``, ``delta``,
        ``clip_norm``, ``rounds_bound``; per site ``n_train``, ``sample_rate``,
        ``noise_multiplier``, planned ``rounds``/``steps``, and ``rounds_run``,
        ``steps_run``, ``epsilon``: ε spent, recomputed by the accountant for the rounds
        actually run), ``privatized_parameters`` (the trainable coordinates that DP-SGD
        clips and noises: fewer with ``trainable="head"``) and ``resolved`` (the private
        settings DP mode chose, :func:`skfedspd.run.resolved_settings`). None without DP.

    Notes
    -----
    Parameters grouped by concern: ``schedule``, ``server_optimizer`` and ``privacy`` took the
    place of ``patience``, ``lr_patience``, ``lr_factor`` (in rounds; the local estimator's
    parameters of those names count epochs), ``server_lr``, ``server_momentum``,
    ``dp_epsilon``, ``dp_delta`` and ``dp_clip_norm`` (:data:`RENAMED`). The old names still
    work, with a ``FutureWarning``, until 0.4.

    Examples
    --------
    One client per subject (``groups``), three rounds of ProjAvg:

    >>> import numpy as np
    >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=60, n_channels=6, n_classes=2, seed=0)
    >>> subjects = np.repeat([1, 2, 3, 4], 15)
    >>> fed = FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=4), n_rounds=3, local_epochs=1,
    ...                                 random_state=0)
    >>> fed = fed.fit(X, y, groups=subjects)
    >>> fed.n_clients_, fed.client_groups_, len(fed.history_)
    (4, [(1,), (2,), (3,), (4,)], 3)
    >>> fed.predict(X[:5]).shape, fed.predict_proba(X[:5]).shape
    ((5,), (5, 2))
    >>> sorted(fed.history_[-1])  # one record per round
    ['client_agreement', 'client_distance', 'clients', 'downweighted_clients', 'effective_weights',
     'failed_clients', 'lr', 'n_samples', 'orthonormality', 'round', 'skipped_batches', 'train_loss', 'val_f1',
     'val_loss', 'wall_time']

    Without groups, a seeded partition of the samples (3 clients; 0.5 of them, floored: one per
    round) and RLAvg; the local model's parameters are reachable as ``estimator__*``:

    >>> from skfedspd.clients import ClientPartition
    >>> fed = FederatedSPDnetClassifier(SPDnetClassifier(), aggregation="rlavg", n_rounds=2, clients_per_round=0.5,
    ...                                 clients=ClientPartition(n_clients=3, partition="stratified"), random_state=0)
    >>> fed = fed.set_params(estimator__lr=0.05).fit(X, y)
    >>> fed.client_source_, [record["clients"] for record in fed.history_]
    ('partition:stratified', [[0], [2]])

    Labels agreed in advance (``classes``), so that no site reveals which ones it holds; a
    class no site holds still gets an output:

    >>> fed = FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=4), n_rounds=2, local_epochs=1,
    ...                                 classes=[0, 1, 2], random_state=0)
    >>> fed.fit(X, y, groups=subjects).classes_, fed.predict_proba(X[:2]).shape
    (array([0, 1, 2]), (2, 3))
    """

    __metadata_request__fit = {"groups": True, "subjects": True}
    # The domain of the trials being predicted (a local estimator with batchnorm="domain"
    # only: see _get_metadata_request).
    __metadata_request__predict = {"domain": True}
    __metadata_request__predict_proba = {"domain": True}
    __metadata_request__decision_function = {"domain": True}
    _params_not_in_spec = ("init",)  # a fitted model: see init, and skfedspd.spec
    _local_paths = ("backend__checkpoint_path",)  # written as null by save_estimator, refused from a file

    _parameter_constraints = {
        "estimator": [HasMethods(PROTOCOL), None],
        "aggregation": [StrOptions(set(AGGREGATIONS)), callable],
        "n_rounds": [Count(1)],
        "local_epochs": [Count(1)],
        "clients_per_round": [None, Count(1),
                              Interval(RealNotInt, 0, 1, closed="right")],
        "schedule": [None, RoundSchedule],
        "clients": [None, ClientPartition],
        "weighting": [StrOptions({"n_samples", "uniform"})],
        "validation_fraction": [Interval(Real, 0, 1, closed="left")],
        "max_update_norm": [None, Interval(Real, 0, None, closed="neither")],
        "server_optimizer": [None, ServerMomentum],
        "client_optimizer_state": [StrOptions({"keep", "reset"})],
        "domains": [StrOptions({"client", "group"})],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        "on_client_error": [StrOptions({"raise", "skip"})],
        "warm_start": ["boolean"],
        "backend": [StrOptions(backend_names()), LocalBackend, FlowerBackend],
        "privacy": [None, DPSGD],
        "classes": [None, Sequence()],
        "init": [None, HasMethods(["get_params", "predict"])],
    }

    @accepts_renamed(RENAMED, _MERGES)  # the flat names of before, until 0.4
    def __init__(
        self,
        estimator=None,
        *,
        aggregation="projavg",
        n_rounds=150,
        local_epochs=2,
        clients_per_round=None,
        schedule=None,
        clients=None,
        weighting="n_samples",
        validation_fraction=0.1,
        max_update_norm=1e3,
        server_optimizer=None,
        client_optimizer_state="keep",
        domains="client",
        random_state=None,
        verbose=False,
        on_client_error="raise",
        warm_start=False,
        backend="local",
        privacy=None,
        classes=None,
        init=None,
    ):
        self.estimator = estimator
        self.aggregation = aggregation
        self.n_rounds = n_rounds
        self.local_epochs = local_epochs
        self.clients_per_round = clients_per_round
        self.schedule = schedule
        self.clients = clients
        self.weighting = weighting
        self.validation_fraction = validation_fraction
        self.max_update_norm = max_update_norm
        self.server_optimizer = server_optimizer
        self.client_optimizer_state = client_optimizer_state
        self.domains = domains
        self.random_state = random_state
        self.verbose = verbose
        self.on_client_error = on_client_error
        self.warm_start = warm_start
        self.backend = backend
        self.privacy = privacy
        self.classes = classes
        self.init = init

    def set_params(self, **params):
        """Set the parameters (scikit-learn's), the old flat names of :data:`RENAMED`
        included, with a ``FutureWarning``.

        Returns
        -------
        self
        """
        params = fold_renamed(self, params, RENAMED, _MERGES)
        return super().set_params(**check_nested_params(self, params, {
            "aggregation": lambda rule: AGGREGATIONS.get(rule) if isinstance(rule, str) else None,
            "estimator": lambda est: SPDnetClassifier() if est is None else None}))

    # ------------------------------------------------------------------ fit
    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y, groups=None, subjects=None, sample_weight=None):
        """Run federated training.

        Parameters
        ----------
        X : array-like
            Inputs of the local estimator (SPD matrices for SPDnet).
        y : array-like of shape (n_samples,)
        groups : array-like of shape (n_samples,), default=None
            Client key of each sample (e.g. subject). Requested by default under sklearn
            metadata routing, so ``GridSearchCV(..., cv=GroupKFold()).fit(X, y,
            groups=subjects)`` reaches it with no ``set_fit_request`` call.
        subjects : array-like, default=None
            Alias of ``groups``: MOABB's ``CrossSubjectEvaluation`` routes the training
            subjects under this key.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights, multiplied by the local estimator's ``class_weight``
            (computed on all of ``y``). Each client trains on its samples' weights (the
            weighted mean loss of :meth:`~skfedspd.base.TorchClassifierBase.local_update`),
            its aggregation weight is their sum, and the pooled input statistic is weighted
            alike; so integer weights equal repeated samples. Under metadata routing,
            request it with ``set_fit_request(sample_weight=True)``. Both backends: with
            ``backend="flower"`` the weights travel with each site's data and the model is
            the local backend's, bit for bit (under secure aggregation the weighted sums
            are masked). A real deployment reads each site's weights from its data file
            (``docs/guide/deployment.md``). Not with ``privacy``.

        Returns
        -------
        self
            Fitted; if ``fit`` raises, the estimator is left exactly as it was.
        """
        self._check_settings()
        run, data = self._prepare(X, y, groups, subjects, sample_weight)
        self.warn_about_settings()
        # Training needs autograd whatever the caller's mode: inference tensors made here
        # could not be trained on (local_update enables gradients itself).
        with torch.inference_mode(False):
            result = get_backend(getattr(run.backend, "name", run.backend))(run, data)
        return set_result(self, result)

    def check_params(self):
        """Validate the parameters (``_parameter_constraints``) and the local estimator's.

        ``fit`` does it; a Flower ServerApp (:func:`skfedspd.flower.serve`), which gets the
        estimator as a JSON spec, calls this before contacting any site.

        Raises
        ------
        ValueError
            Naming the parameter, its value and what is allowed.
        """
        self._validate_params()
        self._check_settings()
        init_model(self)
        est = local_estimator(self)
        est.check_params()
        if self.privacy is not None:
            self._check_dp_mode(est)

    def _check_settings(self):
        """The settings objects check their own parameters (the aggregation rule, under
        secure aggregation a rule of the weighted sum)."""
        get_aggregation(self.aggregation, secure=uses_secure_aggregation(self.backend))
        for settings in (self.schedule, self.server_optimizer, self.privacy, self.clients,
                         resolve_backend(self.backend)):
            if hasattr(settings, "check_params"):  # None and a transport's name have no settings
                settings.check_params()

    def warn_about_settings(self, *, on_flower=None):
        """Warn about parameter pairs measured to train badly, or ignored; ``fit`` and
        :func:`skfedspd.flower.fit_federated` call it before training.

        Server momentum with clients that keep their Adam state
        (:data:`KEEP_WITH_SERVER_MOMENTUM_WARNING`, ``docs/design-decisions.md``); a local
        estimator with ``trainable="head"`` on a new model without ``init``
        (:data:`~skfedspd.classifier.HEAD_ON_RANDOM_WARNING`); on a Flower deployment
        (``on_flower``) a local backend's ``n_jobs``, which is ignored there
        (:data:`N_JOBS_ON_FLOWER_WARNING`): warned, not refused, since the model is the same.
        """
        n_jobs = getattr(resolve_backend(self.backend), "n_jobs", None)
        if on_flower and n_jobs not in (None, 1):
            warnings.warn(N_JOBS_ON_FLOWER_WARNING.format(n_jobs), UserWarning, stacklevel=3)
        momentum = 0.0 if self.server_optimizer is None else self.server_optimizer.momentum
        if momentum > 0 and self.client_optimizer_state == "keep":
            warnings.warn(KEEP_WITH_SERVER_MOMENTUM_WARNING, UserWarning, stacklevel=3)
        est = given_estimator(self)
        if est.federation_traits().head_only and self.init is None and not (
                self.warm_start and self.__sklearn_is_fitted__()):
            warnings.warn(HEAD_ON_RANDOM_WARNING, UserWarning, stacklevel=3)

    def _check_dp_mode(self, est):
        """DP mode shares nothing outside the budget: refuse an explicit choice that would
        (the defaults resolve to private ones, :func:`skfedspd.run.resolved_settings`; docs/guide/privacy.md)."""
        traits = est.federation_traits()
        if self.validation_fraction > 0 and traits.early_stopping is True:
            raise ValueError(f"privacy with an explicit validation split (validation_fraction="
                             f"{self.validation_fraction} and the local estimator's early_stopping=True): per-site "
                             "validation scores would steer the schedule and the released model outside the privacy "
                             "budget; leave early_stopping='auto' (DP mode then holds nothing out, runs n_rounds "
                             "rounds and keeps the last model) and evaluate on a test set outside the federation")
        if traits.batch_statistics:
            raise ValueError("privacy with a local estimator that normalizes each minibatch by its own statistics "
                             "(SPDnetClassifier(batchnorm='spd'): SPD batch normalization re-centres each minibatch by "
                             "its own mean), which mixes the samples, so one sample's gradient is not bounded by the "
                             "clip norm; use batchnorm='domain' (each site releases its domains' means under the "
                             "budget, docs/guide/privacy.md) or None")
        if self.warm_start:
            raise ValueError("privacy with warm_start=True is not supported: the budget is planned for one fit "
                             "of n_rounds rounds")

    def _prepare(self, X, y, groups, subjects, sample_weight=None):
        """The run and its data split into clients (``self`` untouched)."""
        groups = resolve_groups(groups, subjects)
        resume = self.warm_start and self.__sklearn_is_fitted__()
        # inputs and labels are validated by the fit's local estimator, read only when it continues
        est = self.global_estimator_ if resume else local_estimator(self)
        if self.privacy is not None:
            self._check_dp_mode(est)
        X = est.check_inputs(X, reset=not resume)
        groups = check_groups(groups, len(X))
        check_label_values(y, "y")
        y = np.asarray(y)
        if not resume:
            est.set_classes(self.classes if self.classes is not None else y)
        codes = est.encode_labels(y, len(X))  # names the labels outside the agreed classes
        weights = training_weights(est.federation_traits().class_weight, y, sample_weight)
        if self.privacy is not None and weights is not None:
            raise ValueError(DP_SAMPLE_WEIGHT_ERROR + (" (here from the local estimator's class_weight)"
                                                       if sample_weight is None else ""))
        seed = run_seed(self)
        indices, source, client_groups = self._clients(codes, groups, seed)
        n_selected(self.clients_per_round, len(indices))
        run = FederatedRun(self, seed=seed, validation_fraction=held_out_fraction(self, est, len(codes),
                                                                                   len(est.classes_)))
        data = ClientData(X, y, indices, sample_weight=weights,
                          # the domains of batchnorm="domain": None makes each client one
                          groups=None if groups is None or self.domains == "client" else np.asarray(groups),
                          client_source=source, client_groups=client_groups)
        return run, data

    def __sklearn_clone__(self):
        """scikit-learn's ``clone``, except that ``init`` (a fitted model, only read by
        ``fit``) is kept as is: cloning it would unfit it."""
        params = self.get_params(deep=False)
        init = params.pop("init")
        cloned = type(self)(**{k: clone(v, safe=False) for k, v in params.items()}, init=init)
        if hasattr(self, "_metadata_request"):  # set_fit_request(...), as clone keeps it
            cloned._metadata_request = copy.deepcopy(self._metadata_request)
        return cloned

    def _clients(self, codes, groups, seed):
        """``(indices, client_source, client_groups)``: :meth:`ClientPartition.split`."""
        clients = self.clients if self.clients is not None else ClientPartition()
        return clients.split(codes, groups, seed, owner=type(self).__name__)

    # ------------------------------------------------------------------ persistence
    def fitted_state(self):
        """``(arrays, meta)`` of the fitted model (:mod:`skfedspd.persistence`): the local
        estimator's fitted state, the engine's state and the client metadata."""
        check_is_fitted(self)
        est_arrays, est_meta = self.global_estimator_.fitted_state()
        engine_arrays, engine_meta = self.engine_.state_dict()
        arrays = {**{f"estimator/{k}": v for k, v in est_arrays.items()},
                  **{f"engine/{k}": v for k, v in engine_arrays.items()}}
        meta = {"estimator": est_meta, "engine": engine_meta, "client_source": self.client_source_,
                "client_groups": [None if g is None else list(g) for g in self.client_groups_],
                # the local estimator as trained (settings resolved from init, which is not saved)
                "local_estimator": estimator_to_spec(self.global_estimator_)}
        return arrays, meta

    def restore_fitted_state(self, arrays, meta):
        """Inverse of :meth:`fitted_state`, on an unfitted estimator of the same parameters.
        Every field is checked (:data:`STATE_CHECKS`, :data:`ENGINE_STATE_CHECKS`) before
        anything is built; a ValueError names the first wrong one."""
        def part(prefix):
            return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}

        check_fields(meta, STATE_CHECKS, "federated state field")
        check_fields(meta["engine"], ENGINE_STATE_CHECKS, "engine state field")
        if len(meta["engine"]["n_train"]) != len(meta["engine"]["n_val"]):
            raise ValueError("the engine state fields n_train and n_val must have one entry per client each, got "
                             f"{len(meta['engine']['n_train'])} and {len(meta['engine']['n_val'])}")

        est = (estimator_from_spec(meta["local_estimator"]) if "local_estimator" in meta
               else local_estimator(self))
        est.restore_fitted_state(part("estimator/"), meta["estimator"])
        engine_meta = meta["engine"]
        engine = build_engine(self, est, n_train=engine_meta["n_train"], n_val=engine_meta["n_val"],
                              seed=engine_meta["seed"], input_statistic=engine_meta["input_statistic"])
        engine.load_state_dict(part("engine/"), engine_meta)
        groups = [None if g is None else tuple(g) for g in meta["client_groups"]]
        set_result(self, FederatedResult(est, engine, meta["client_source"], groups))

    # ------------------------------------------------------------------ predict
    def __sklearn_is_fitted__(self):
        return hasattr(self, "global_estimator_")

    def _get_metadata_request(self):
        requests = super()._get_metadata_request()
        est = given_estimator(self)
        if est.federation_traits().domains:
            return requests
        return drop_domain_requests(self, requests)

    def _domain_kwargs(self, domain):
        """``{"domain": domain}`` for the global model, ``{}`` without a domain (a local
        estimator without domain statistics takes none)."""
        check_is_fitted(self)
        return {} if domain is None else {"domain": domain}

    def predict(self, X, domain=None):
        """Class labels from the global model; ``domain`` (``batchnorm="domain"``): the
        trials' domain, updated with them first (see
        :meth:`SPDnetClassifier.decision_function <skfedspd.SPDnetClassifier.decision_function>`)."""
        kwargs = self._domain_kwargs(domain)  # first: an unfitted model raises NotFittedError
        return self.global_estimator_.predict(X, **kwargs)

    def predict_proba(self, X, domain=None):
        """Class probabilities from the global model (columns ordered as ``classes_``);
        ``domain`` as in :meth:`predict`."""
        kwargs = self._domain_kwargs(domain)  # first: an unfitted model raises NotFittedError
        return self.global_estimator_.predict_proba(X, **kwargs)

    def decision_function(self, X, domain=None):
        """Class scores of the global model (see the local estimator); ``domain`` as in
        :meth:`predict`."""
        kwargs = self._domain_kwargs(domain)  # first: an unfitted model raises NotFittedError
        return self.global_estimator_.decision_function(X, **kwargs)

    @available_if(_local_estimator_has("adapt"))
    def adapt(self, X, domain):
        """Unlabeled calibration of the global model's ``domain`` statistics (see
        :meth:`SPDnetClassifier.adapt <skfedspd.SPDnetClassifier.adapt>`).

        Returns
        -------
        self
        """
        check_is_fitted(self)
        self.global_estimator_.adapt(X, domain)
        return self

    @available_if(_local_estimator_has("reset_domain"))
    def reset_domain(self, domain=None):
        """Forget the global model's statistics of ``domain`` (see
        :meth:`SPDnetClassifier.reset_domain <skfedspd.SPDnetClassifier.reset_domain>`).

        Returns
        -------
        self
        """
        check_is_fitted(self)
        self.global_estimator_.reset_domain(domain)
        return self

    @available_if(_local_estimator_has("fit_domain_prior"))
    def fit_domain_prior(self, X, groups=None):
        """(Re)compute the global model's domain prior from training data (see
        :meth:`SPDnetClassifier.fit_domain_prior <skfedspd.SPDnetClassifier.fit_domain_prior>`).

        Returns
        -------
        self
        """
        check_is_fitted(self)
        self.global_estimator_.fit_domain_prior(X, groups)
        return self

    @property
    def domains_(self):
        """The global model's domains: label → trials seen."""
        return self._global_attribute("domains_")

    @property
    def domain_prior_(self):
        """The global model's domain prior (list of ndarray, one per batch-norm layer), or None."""
        return self._global_attribute("domain_prior_")

    def _global_attribute(self, name):
        if not _local_estimator_has(name)(self):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}: its local estimator "
                                 f"{type(self._local_estimator()).__name__} keeps no domain statistics")
        check_is_fitted(self)
        return getattr(self.global_estimator_, name)

    def _local_estimator(self):
        """The fitted global model, or before ``fit`` the local estimator it will be."""
        if self.__sklearn_is_fitted__():
            return self.global_estimator_
        return given_estimator(self)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        return tags

