"""``FederatedSPDnetClassifier``: FedSPDnet (Algorithm 1 of the paper) as a meta-estimator.

``fit`` splits the samples into clients, builds the run (:class:`~skfedspd.run.FederatedRun`)
and hands it to a transport (:func:`get_backend`). The attributes are assigned only when
the transport succeeds.
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
from .classifier import HEAD_ON_RANDOM_WARNING, TARGET_IGNORED_WARNING, SPDnetClassifier
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
from .transfer import adapt_target, drop_target_requests, target_trials
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
        When the transport needs a package that is not installed.

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
    """Fold ``secure_aggregation``, ``n_jobs`` and ``checkpoint_path`` into the backend object."""
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
    """``available_if`` check: the domain API exists where the local estimator has it."""
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
    """Make ``fed`` the fitted model of a run's :class:`~skfedspd.run.FederatedResult` and return it.

    Examples
    --------
    >>> from skfedspd import FederatedSPDnetClassifier
    >>> from skfedspd.clients import ClientPartition
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.federated import set_result
    >>> from skfedspd.run import FederatedResult
    >>> X, y = make_spd_classification(n_matrices=40, n_channels=4, seed=0)
    >>> fed = FederatedSPDnetClassifier(n_rounds=1, clients=ClientPartition(n_clients=2, partition="stratified"),
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
    """Federated SPDnet (FedSPDnet) with ProjAvg / RLAvg aggregation (``docs/guide/federation.md``).

    Parameters
    ----------
    estimator : TorchClassifierBase, default=None
        The local model (``SPDnetClassifier()`` when None), reachable as ``estimator__lr``.
    aggregation : {"projavg", "rlavg", "karcher", "geomedian", "trimmedmean", "krum"} or callable, default="projavg"
        Server rule (:mod:`skfedspd.aggregation`), or a rule instance with its parameters.
    n_rounds : int, default=150
    local_epochs : int, default=2
    clients_per_round : int, float or None, default=None
        None: every client; int: that many; float in (0, 1]: that fraction (at least one).
    schedule : RoundSchedule or None, default=None
        The plateau schedule in rounds (:class:`~skfedspd.training.RoundSchedule`).
    clients : ClientPartition or None, default=None
        How the samples become clients (:class:`~skfedspd.clients.ClientPartition`).
    domains : {"client", "group"}, default="client"
        A training domain (``batchnorm="domain"``) is a client's data, or each of its groups.
    weighting : {"n_samples", "uniform"}, default="n_samples"
        Client weights in the aggregation.
    validation_fraction : float, default=0.1
        Share of each client's data held out when the local ``early_stopping`` rule asks.
    max_update_norm : float or None, default=1000.0
        Replies that moved by more than ``max_update_norm · (1 + ‖θ‖_F)`` are rejected.
    server_optimizer : ServerMomentum or None, default=None
        The server optimizer (:class:`~skfedspd.server_optimizer.ServerMomentum`).
    client_optimizer_state : {"keep", "reset"}, default="keep"
        Whether each client's Adam state carries over between its rounds.
    random_state : int, RandomState instance or None, default=None
    verbose : bool, default=False
    on_client_error : {"raise", "skip"}, default="raise"
        A failed client makes the fit raise, or is left out of its round.
    warm_start : bool, default=False
        A second ``fit`` continues for ``n_rounds`` more rounds.
    backend : str, LocalBackend or FlowerBackend, default="local"
        Where the fit runs (:mod:`skfedspd.backends`).
    init : fitted estimator or None, default=None
        A fitted model whose weights and input scaling start the global model.
    privacy : DPSGD or None, default=None
        Sample-level differential privacy (:class:`~skfedspd.privacy.DPSGD`).
    classes : array-like of shape (n_classes,) or None, default=None
        The label set agreed out of band; None: the union of the sites' labels.

    Attributes
    ----------
    global_estimator_ : TorchClassifierBase
        The best global model (highest validation macro-F1 over rounds).
    engine_ : FederatedEngine
        The run's server state.
    classes_ : ndarray
    n_features_in_ : int
    n_clients_ : int
    client_groups_ : list of tuple
    client_source_ : str
    history_ : list of dict
        One JSON-able record per round.
    client_trust_ : ndarray of shape (n_clients,)
        Each site's trust (:func:`skfedspd.engine.client_trust`).
    trust_summary_ : list of dict
    best_round_ : int
    privacy_ : dict or None
        DP mode: the report of :func:`skfedspd.privacy.plan_dp` with the ε spent.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=60, n_channels=6, n_classes=2, seed=0)
    >>> fed = FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=4), n_rounds=2, local_epochs=1, random_state=0)
    >>> fed = fed.fit(X, y, groups=np.repeat([1, 2, 3, 4], 15))
    >>> fed.n_clients_, len(fed.history_), fed.predict_proba(X[:5]).shape
    (4, 2, (5, 2))
    """

    __metadata_request__fit = {"groups": True, "subjects": True, "X_target_unlabeled": True,
                               "X_target_labeled": True}
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
        """Set the parameters, the old flat names of :data:`RENAMED` included (``FutureWarning``).

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
    def fit(self, X, y, groups=None, subjects=None, sample_weight=None, X_target_unlabeled=None,
            X_target_labeled=None):
        """Run federated training.

        Parameters
        ----------
        X : array-like
            Inputs of the local estimator (SPD matrices for SPDnet).
        y : array-like of shape (n_samples,)
        groups : array-like of shape (n_samples,), default=None
            Client key of each sample (e.g. subject); requested by default under metadata routing.
        subjects : array-like, default=None
            Alias of ``groups`` (MOABB's ``CrossSubjectEvaluation``).
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights, multiplied by the local estimator's ``class_weight``; a
            client's aggregation weight is their sum. Not with ``privacy``.
        X_target_unlabeled, X_target_labeled : array-like, default=None
            A new subject's calibration matrices (MOABB's ``cs_mode``), kept where ``fit`` runs:
            with a local estimator with domain statistics, the global model's domain
            ``"target"`` (:mod:`skfedspd.transfer`).

        Returns
        -------
        self
            Fitted; if ``fit`` raises, the estimator is left as it was.
        """
        self._check_settings()
        run, data = self._prepare(X, y, groups, subjects, sample_weight)
        calibration = target_trials(X_target_unlabeled, X_target_labeled, n_channels=data.X.shape[-1])
        self.warn_about_settings()
        # Training needs autograd whatever the caller's mode: inference tensors made here
        # could not be trained on (local_update enables gradients itself).
        with torch.inference_mode(False):
            result = get_backend(getattr(run.backend, "name", run.backend))(run, data)
        if calibration is not None:  # before set_result: a refused slice leaves self as it was
            if result.estimator.federation_traits().domains:
                adapt_target(result.estimator, calibration)
            else:
                warnings.warn(TARGET_IGNORED_WARNING.format(f"local estimator {result.estimator!r}"), UserWarning,
                              stacklevel=2)
        return set_result(self, result)

    def check_params(self):
        """Validate the parameters and the local estimator's.

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
        """The settings objects check their own parameters."""
        get_aggregation(self.aggregation, secure=uses_secure_aggregation(self.backend))
        for settings in (self.schedule, self.server_optimizer, self.privacy, self.clients,
                         resolve_backend(self.backend)):
            if hasattr(settings, "check_params"):  # None and a transport's name have no settings
                settings.check_params()

    def warn_about_settings(self, *, on_flower=None):
        """Warn about parameter pairs that train badly or are ignored (see
        ``docs/design-decisions.md``); ``fit`` and :func:`skfedspd.flower.fit_federated` call it.
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
        """DP mode: refuse an explicit setting that would share data outside the budget."""
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
        """scikit-learn's ``clone``, except that ``init`` is kept as is."""
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
        """``(arrays, meta)`` of the fitted model (:mod:`skfedspd.persistence`)."""
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
        """Inverse of :meth:`fitted_state`; every field is checked before anything is built."""
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
        return drop_target_requests(self, drop_domain_requests(self, requests))

    def _domain_kwargs(self, domain):
        """``{"domain": domain}``, or ``{}`` without a domain."""
        check_is_fitted(self)
        return {} if domain is None else {"domain": domain}

    def predict(self, X, domain=None):
        """Class labels from the global model (``domain`` as in
        :meth:`SPDnetClassifier.decision_function <skfedspd.SPDnetClassifier.decision_function>`).
        """
        kwargs = self._domain_kwargs(domain)  # first: an unfitted model raises NotFittedError
        return self.global_estimator_.predict(X, **kwargs)

    def predict_proba(self, X, domain=None):
        """Class probabilities from the global model; ``domain`` as in :meth:`predict`."""
        kwargs = self._domain_kwargs(domain)  # first: an unfitted model raises NotFittedError
        return self.global_estimator_.predict_proba(X, **kwargs)

    def decision_function(self, X, domain=None):
        """Class scores of the global model; ``domain`` as in :meth:`predict`."""
        kwargs = self._domain_kwargs(domain)  # first: an unfitted model raises NotFittedError
        return self.global_estimator_.decision_function(X, **kwargs)

    @available_if(_local_estimator_has("adapt"))
    def adapt(self, X, domain):
        """Unlabeled calibration of the global model's ``domain`` statistics.

        Returns
        -------
        self
        """
        check_is_fitted(self)
        self.global_estimator_.adapt(X, domain)
        return self

    @available_if(_local_estimator_has("reset_domain"))
    def reset_domain(self, domain=None):
        """Forget the global model's statistics of ``domain``.

        Returns
        -------
        self
        """
        check_is_fitted(self)
        self.global_estimator_.reset_domain(domain)
        return self

    @available_if(_local_estimator_has("fit_domain_prior"))
    def fit_domain_prior(self, X, groups=None):
        """(Re)compute the global model's domain prior from training data.

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

