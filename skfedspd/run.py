"""One federated run, whatever moves its messages: :class:`FederatedRun`.

The run owns every server-side step of a fit that is not a round: the seed, the local
estimator, the sites' set-up and its checks, the classes, the pooled input statistic, the
initial model, the :class:`~skfedspd.engine.FederatedEngine`, and at the end the best
global model (:class:`FederatedResult`). A transport only moves messages between the run
and its :class:`~skfedspd.client.Site` s::

    run = FederatedRun(fed)
    engine = run.start([each site's SetupReply to run.site_setup()])
    ... rounds: engine.select, engine.aggregate, engine.finish_round
    result = run.finish(prior)
"""

import copy
import numbers
from dataclasses import dataclass

import numpy as np
from sklearn.base import clone

from .backends import resolve_backend
from .classifier import SPDnetClassifier
from .client import Site
from .engine import FederatedEngine, declared_weights, is_positive_weight
from .training import draw_seed
from .validation import is_count, training_weights, uses_validation

__all__ = [
    "FederatedRun",
    "FederatedResult",
    "ClientData",
    "check_setup_replies",
    "pool_input_statistic",
    "resolved_settings",
    "given_estimator",
    "run_seed",
    "build_engine",
    "domain_prior_from_data",
    "public_domain_references",
    "held_out_fraction",
    "init_model",
    "local_estimator",
]


@dataclass
class ClientData:
    """A fit's data in this process, split into clients (inputs, labels, each client's
    ``indices``, training weights, groups and where the clients came from).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.run import ClientData
    >>> data = ClientData(np.zeros((4, 2, 2)), np.array([0, 1, 0, 1]), [np.arange(2), np.arange(2, 4)],
    ...                   client_source="partition:contiguous", client_groups=[None, None])
    >>> [data.site_arrays(i)[1].tolist() for i in range(2)]
    [[0, 1], [0, 1]]
    """

    X: np.ndarray
    y: np.ndarray
    indices: list
    sample_weight: object = None
    groups: object = None
    client_source: str = "partition:contiguous"
    client_groups: list = None

    def site_arrays(self, cid):
        """Client ``cid``'s ``(X, y, sample_weight, groups)``."""
        idx, w, g = self.indices[cid], self.sample_weight, self.groups
        return self.X[idx], self.y[idx], None if w is None else w[idx], None if g is None else g[idx]

    def domains(self):
        """Each sample's training domain: its group, or without groups its client."""
        if self.groups is not None:
            return self.groups
        domains = np.zeros(len(self.X), dtype=np.intp)
        for client, idx in enumerate(self.indices):
            domains[idx] = client
        return domains


@dataclass
class FederatedResult:
    """What a run hands back: the released estimator, the engine, ``client_source`` and
    ``client_groups``.

    Examples
    --------
    >>> import dataclasses
    >>> from skfedspd.run import FederatedResult
    >>> [field.name for field in dataclasses.fields(FederatedResult)]
    ['estimator', 'engine', 'client_source', 'client_groups']
    """

    estimator: object
    engine: FederatedEngine
    client_source: str
    client_groups: list


# ---------------------------------------------------------------------- settings
def init_model(fed):
    """The fitted local model ``fed.init`` names, or None.

    Examples
    --------
    >>> from skfedspd import FederatedSPDnetClassifier
    >>> from skfedspd.run import init_model
    >>> init_model(FederatedSPDnetClassifier()) is None
    True
    """
    if fed.init is None:
        return None
    if not hasattr(fed.init, "fitted_state"):  # the persistence protocol of the package's estimators
        raise ValueError(f"init must be a fitted local model of skfedspd (e.g. SPDnetClassifier) or a fitted "
                         f"FederatedSPDnetClassifier; a {type(fed.init).__name__} is not one (it has no weights "
                         "a federated fit can start from)")
    model = getattr(fed.init, "global_estimator_", fed.init)
    fitted = getattr(model, "__sklearn_is_fitted__", None)
    if fitted is None or not fitted():
        raise ValueError(f"init must be a fitted local model (e.g. SPDnetClassifier) or a fitted "
                         f"FederatedSPDnetClassifier, got an unfitted {type(fed.init).__name__}")
    return model


def resolved_settings(fed, est=None):
    """The ``scaling`` and ``validation_fraction`` a fresh fit resolves from ``init`` and
    ``privacy`` (DP mode: ``"trace"`` and 0).

    Examples
    --------
    >>> from skfedspd import FederatedSPDnetClassifier
    >>> from skfedspd.privacy import DPSGD
    >>> from skfedspd.run import resolved_settings
    >>> resolved_settings(FederatedSPDnetClassifier(privacy=DPSGD(epsilon=3.0)))
    {'validation_fraction': 0.0, 'scaling': 'trace'}
    """
    if est is None:
        est = given_estimator(fed)
    private = fed.privacy is not None
    return {"validation_fraction": 0.0 if private else float(fed.validation_fraction),
            **est.federated_params(init=init_model(fed), private=private)}


def given_estimator(fed):
    """``fed.estimator`` as given, unfitted and not cloned: ``SPDnetClassifier()`` when None.

    Examples
    --------
    >>> from skfedspd import FederatedSPDnetClassifier
    >>> from skfedspd.run import given_estimator
    >>> given_estimator(FederatedSPDnetClassifier())
    SPDnetClassifier()
    """
    return fed.estimator if fed.estimator is not None else SPDnetClassifier()


def local_estimator(fed):
    """The unfitted local estimator of a fresh fit, with its :func:`resolved_settings`.

    Examples
    --------
    >>> from skfedspd import FederatedSPDnetClassifier
    >>> from skfedspd.run import local_estimator
    >>> local_estimator(FederatedSPDnetClassifier()).scaling
    'auto'
    """
    est = clone(given_estimator(fed))
    return est.set_params(**est.federated_params(init=init_model(fed), private=fed.privacy is not None))


def run_seed(fed):
    """The run's seed: the fitted engine's when ``warm_start`` continues, else drawn.

    Examples
    --------
    >>> from skfedspd import FederatedSPDnetClassifier
    >>> from skfedspd.run import run_seed
    >>> run_seed(FederatedSPDnetClassifier(random_state=0)) == run_seed(FederatedSPDnetClassifier(random_state=0))
    True
    """
    return fed.engine_.seed if _continues(fed) else draw_seed(fed.random_state)


def _continues(fed):
    return bool(fed.warm_start and fed.__sklearn_is_fitted__())


def held_out_fraction(fed, est, n_samples, n_classes):
    """The share of each client's data held out for validation: the local estimator's
    ``early_stopping`` rule on the whole federation; 0 in DP mode.

    Examples
    --------
    >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
    >>> from skfedspd.run import held_out_fraction
    >>> fed, est = FederatedSPDnetClassifier(), SPDnetClassifier()
    >>> held_out_fraction(fed, est, 45, 2), held_out_fraction(fed, est, 1000, 2)
    (0.0, 0.1)
    """
    if fed.privacy is not None:
        return 0.0
    keep = uses_validation(n_samples, n_classes, fed.validation_fraction, est.federation_traits().early_stopping)
    return float(fed.validation_fraction) if keep else 0.0


# ---------------------------------------------------------------------- set-up
def _label_kind(label):
    """"str", "bool" or "number"; None for anything else."""
    if isinstance(label, (str, bool)):
        return type(label).__name__
    if isinstance(label, numbers.Real) and np.isfinite(label):
        return "number"
    return None


def check_setup_replies(replies, *, with_labels=True):
    """Check the sites' declarations (one per client id) and return their common sample shape;
    a ValueError names a bad client.

    Examples
    --------
    >>> from skfedspd.messages import SetupReply
    >>> from skfedspd.run import check_setup_replies
    >>> check_setup_replies([SetupReply(0, [4, 4], [0, 1], 20, 2), SetupReply(1, [4, 4], [1, 2], 10, 1)])
    (4, 4)
    """
    shapes, empty = set(), []
    for cid, reply in enumerate(replies):
        shape = tuple(reply.shape) if isinstance(reply.shape, (list, tuple)) else ()
        if not shape or not all(is_count(s, 1) for s in shape):
            raise ValueError(f"client {cid} declared an invalid sample shape {reply.shape!r}")
        labels = reply.labels
        kinds = {_label_kind(label) for label in labels} if isinstance(labels, list) else {None}
        if with_labels and (not labels or None in kinds or len(set(labels)) != len(labels)):
            raise ValueError(f"client {cid} declared invalid labels {labels!r} (a non-empty list of "
                             "distinct strings, booleans or finite numbers)")
        if not is_count(reply.n_train, 1) or not is_count(reply.n_val, 0):
            raise ValueError(f"client {cid} declared invalid sample counts (num-examples {reply.n_train!r}, "
                             f"n-val {reply.n_val!r})")
        if isinstance(reply.weight, numbers.Real) and not isinstance(reply.weight, bool) and reply.weight == 0:
            empty.append(cid)
        elif reply.weight is not None and not is_positive_weight(reply.weight):
            raise ValueError(f"client {cid} declared an invalid training weight {reply.weight!r} (the sum of its "
                             "training sample weights: a finite number > 0)")
        shapes.add(shape)
    if empty:
        raise ValueError(f"sample_weight: the training samples of clients {empty} all have weight 0")
    if len(shapes) != 1:
        raise ValueError(f"the sites' samples differ in shape: {sorted(shapes)}")
    kinds = {cid: {_label_kind(label) for label in r.labels} for cid, r in enumerate(replies) if r.labels is not None}
    if with_labels and len(set().union(*kinds.values())) != 1:
        raise ValueError(f"the sites declare labels of different types: {kinds} (a label must mean the same "
                         "class at every site)")
    return shapes.pop()


def pool_input_statistic(statistics, weights):
    """Weighted mean of the clients' input statistics (None if the model has none).

    Examples
    --------
    >>> from skfedspd.run import pool_input_statistic
    >>> pool_input_statistic([1.0, 4.0], [30, 10])
    1.75
    """
    if all(s is None for s in statistics):
        return None
    for cid, s in enumerate(statistics):
        if not isinstance(s, numbers.Real) or isinstance(s, bool) or not np.isfinite(s):
            raise ValueError(f"client {cid} declared an invalid input statistic {s!r} (a finite number is needed)")
    return float(np.average(np.asarray(statistics, dtype=np.float64), weights=weights))


def build_engine(fed, est, *, n_train, n_val, seed, input_statistic, train_weights=None):
    """The :class:`~skfedspd.engine.FederatedEngine` of ``fed``'s settings for the initialised
    local estimator ``est``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
    >>> from skfedspd.run import build_engine
    >>> est = SPDnetClassifier(hidden_dims=2)
    >>> _ = est.check_inputs(np.eye(4)[None], reset=True)
    >>> est.set_classes([0, 1]); est.set_input_statistic(0.0); est.init_module(0)
    >>> engine = build_engine(FederatedSPDnetClassifier(clients_per_round=1), est, n_train=[10, 12], n_val=[0, 0],
    ...                       seed=0, input_statistic=0.0)
    >>> engine.n_clients, engine.n_select
    (2, 1)
    """
    traits = est.federation_traits()
    engine = FederatedEngine(est.get_parameters(), est.parameter_kinds(), n_train=n_train, n_val=n_val,
                             train_weights=train_weights, seed=seed, lr=traits.lr,
                             clients_per_round=fed.clients_per_round, aggregation=fed.aggregation,
                             weighting=fed.weighting, schedule=fed.schedule, on_client_error=fed.on_client_error,
                             max_update_norm=fed.max_update_norm, input_statistic=input_statistic,
                             server_optimizer=fed.server_optimizer)
    if fed.privacy is not None:
        privacy = fed.privacy
        release = None
        if traits.domains:  # each site first releases its domains' means
            release = dict(layers=len(est.domain_layer_sizes()), share=privacy.domain_share, clip=privacy.domain_clip)
        engine.plan_privacy(privacy.epsilon, privacy.delta, clip_norm=privacy.clip_norm, batch_size=traits.batch_size,
                            local_epochs=fed.local_epochs, n_rounds=fed.n_rounds, domain_release=release)
        # the privatized dimension: frozen weights (SPDnetClassifier(trainable="head")) get no noise
        engine.privacy["privatized_parameters"] = est.n_trainable_parameters()
        engine.privacy["resolved"] = resolved_settings(fed)  # what DP mode chose, saved with the plan
    return engine


def _check_init(model, est):
    """``init`` must match ``est``: same class, number of features and classes."""
    if type(model) is not type(est):
        raise ValueError(f"init is a fitted {type(model).__name__}, but the local estimator is a "
                         f"{type(est).__name__}")
    if model.n_features_in_ != est.n_features_in_:
        raise ValueError(f"init was fitted on {model.n_features_in_} features (channels), but X has "
                         f"{est.n_features_in_}")
    if not np.array_equal(model.classes_, est.classes_):
        raise ValueError(f"init has the classes {model.classes_.tolist()}, but this fit has "
                         f"{est.classes_.tolist()}: agree the classes (classes=...) or pre-train on the same ones")


def _probe(shape):
    """A one-sample input of the sites' shape that the estimator's validation accepts."""
    if len(shape) < 2:
        return np.ones((1, *shape))
    return np.broadcast_to(np.eye(shape[-2], shape[-1]), (1, *shape)).copy()


class FederatedRun:
    """One federated fit of ``fed``'s configuration: its set-up and its end, for any transport.

    Parameters
    ----------
    fed : FederatedSPDnetClassifier
        Read, never changed.
    seed : int or None, default=None
        The run's seed (None: :func:`run_seed`).
    validation_fraction : float or None, default=None
        Share of each site's data held out for validation; None: the resolved parameter.

    Attributes
    ----------
    estimator : estimator
        The server's local estimator: the released model at the end.
    seed : int
    engine : FederatedEngine or None
        Built by :meth:`start`.

    Examples
    --------
    >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
    >>> from skfedspd.client import Site
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.run import FederatedRun
    >>> X, y = make_spd_classification(n_matrices=30, n_channels=4, n_classes=2, seed=1)
    >>> run = FederatedRun(FederatedSPDnetClassifier(n_rounds=1, random_state=0), validation_fraction=0.0)
    >>> sites = [Site(i, X[i::2], y[i::2], None, None, run.site_setup(), SPDnetClassifier()) for i in range(2)]
    >>> engine = run.start([site.reply for site in sites])
    >>> engine.n_clients, run.site_setup()["ready"]
    (2, True)
    """

    def __init__(self, fed, *, seed=None, validation_fraction=None):
        self.fed = fed
        self.backend = resolve_backend(fed.backend)  # the transport's settings
        self.resume = _continues(fed)
        if self.resume:
            local_estimator(fed).check_params()  # the fitted model continues; its parameters are still checked
            self.estimator = copy.deepcopy(fed.global_estimator_)
        else:
            self.estimator = local_estimator(fed)
        self.seed = run_seed(fed) if seed is None else int(seed)
        self.engine = None
        agreed = self._agreed_classes()
        self._setup = {"seed": self.seed, "classes": agreed, "input_statistic": None, "ready": False,
                       "private": fed.privacy is not None,
                       "validation_fraction": (resolved_settings(fed, self.estimator)["validation_fraction"]
                                               if validation_fraction is None else float(validation_fraction)),
                       "client_optimizer_state": fed.client_optimizer_state}

    def _agreed_classes(self):
        """``fed.classes`` set on a fresh fit or checked on a continued one; None without it."""
        classes, est = self.fed.classes, self.estimator
        if classes is None:
            return None
        if not self.resume:
            est.set_classes(classes)
        elif not np.array_equal(np.unique(np.asarray(classes)), est.classes_):
            raise ValueError(f"classes={list(classes)!r} differ from the classes {est.classes_.tolist()} of the "
                             "model that warm_start continues")
        return est.classes_.tolist()

    def site_setup(self):
        """The JSON-able set-up every site receives (``ready`` with the classes and input statistic
        once :meth:`start` has run).
        """
        return dict(self._setup)

    def start(self, replies):
        """Read the sites' declarations, set the classes, the input statistic and the initial model,
        and build the engine. Returns the engine.
        """
        fed, est = self.fed, self.estimator
        agreed = self._setup["classes"]
        shape = check_setup_replies(replies, with_labels=agreed is None)
        known = est.classes_ if self.resume else None
        for cid, reply in enumerate(replies if agreed is None and known is not None else []):
            unknown = sorted(set(reply.labels) - set(np.asarray(known).tolist()))
            if unknown:
                raise ValueError(f"client {cid} declared labels {unknown} that are not in classes {known.tolist()}")
        est.check_inputs(_probe(shape), reset=not self.resume)
        n_train, n_val = [r.n_train for r in replies], [r.n_val for r in replies]
        weights = [r.weight for r in replies]
        weights = None if weights == [None] * len(weights) else weights
        if self.resume:
            statistic = fed.engine_.input_statistic
        else:
            if agreed is None:
                est.set_classes(np.unique(np.concatenate([np.asarray(r.labels) for r in replies])))
            model = init_model(fed)
            if model is not None:
                _check_init(model, est)
            # DP mode: the sites' input statistics are neither sent nor used (docs/guide/privacy.md)
            statistic = None if self._setup["private"] else pool_input_statistic(
                [r.statistic for r in replies], declared_weights(n_train, weights))
            est.set_input_statistic(statistic)
            self._initialize(model)
            if self._setup["private"] and est.federation_traits().domains:
                self._setup["domain_references"] = public_domain_references(model, est)
        engine = build_engine(fed, est, n_train=n_train, n_val=n_val, seed=self.seed, input_statistic=statistic,
                              train_weights=weights)
        if self.resume:
            engine.load_state_dict(*fed.engine_.state_dict())
        self._setup.update(classes=est.classes_.tolist(), input_statistic=statistic, ready=True)
        if getattr(engine.rule, "needs_reference", False):
            engine.reference_update = self.reference_update(engine.rule, len(replies), shape)
        self.engine = engine
        return engine

    def reference_update(self, rule, client_id, shape):
        """``update(global_params, seed, lr) -> params``: the server's own training on ``rule``'s
        public root set, as a client's.
        """
        y = np.asarray(rule.y)
        # the root set is all the server's data: its class weights are computed on it, once
        weights = training_weights(self.estimator.federation_traits().class_weight, y, None)
        est = self.estimator.without_class_weight()
        setup = dict(self.site_setup(), validation_fraction=0.0, private=False)
        try:
            site = Site(client_id, rule.X, y, weights, None, setup, est)
            if tuple(site.reply.shape) != tuple(shape):
                raise ValueError(f"its matrices have shape {tuple(site.reply.shape)}, the sites' {tuple(shape)}")
        except ValueError as error:
            raise ValueError(f"aggregation={rule!r}: the root set does not fit this fit: {error}") from error
        n_epochs, keep = self.fed.local_epochs, self.fed.client_optimizer_state == "keep"
        kept = {}  # the server's Adam state between rounds, as a client's under client_optimizer_state="keep"

        def update(global_params, seed, lr):
            reply = site.train_update(global_params, None, seed=seed, lr=lr, n_epochs=n_epochs,
                                      optimizer_state=kept.get("state", {}) if keep else None)
            if keep and reply.optimizer_state is not None:
                kept["state"] = reply.optimizer_state
            return reply.params

        return update

    def _initialize(self, model):
        """The estimator's module, seeded by the run's seed, then with ``init``'s weights."""
        est = self.estimator
        est.init_module(self.seed)
        if model is None:
            return
        params, shapes = model.get_parameters(), {n: a.shape for n, a in est.get_parameters().items()}
        theirs = {n: a.shape for n, a in params.items()}
        if theirs != shapes:
            raise ValueError(f"init's architecture differs from the local estimator's: arrays {theirs} against "
                             f"{shapes}")
        est.set_parameters(params)

    def release_domain_means(self, sites):
        """DP mode with domain batch norm: every site of this process releases its domains' means."""
        dp = self.engine.dp_settings
        for cid, site in enumerate(sites):
            settings = dp(cid)
            if settings is not None and "domain_noise_multiplier" in settings:
                site.release_domain_means(self.engine.global_params, settings)

    @property
    def wants_domain_prior(self):
        """Whether the released model gets a domain prior (``batchnorm="domain"``, outside DP mode)."""
        return self.estimator.federation_traits().domains and self.fed.privacy is None

    def finish(self, client_source, client_groups, prior=None):
        """Load the best global model into the estimator (with the domain prior from ``prior``)
        and return the :class:`FederatedResult`.
        """
        est, engine = self.estimator, self.engine
        engine.client_optimizer_states.clear()  # the clients' own, for this fit only
        est.set_parameters(engine.best_params)
        if est.federation_traits().domains:
            est.clear_domain_statistics()
            if self.wants_domain_prior and prior is not None:
                prior(est)
            elif self.fed.privacy is not None:
                _public_prior(init_model(self.fed), est)
        return FederatedResult(est, engine, client_source, list(client_groups))


def public_domain_references(model, est):
    """The public log-matrix around which sites clip their trials before releasing domain
    means: the log of ``init``'s prior, zeros without one.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.run import public_domain_references
    >>> est = SPDnetClassifier(hidden_dims=2, batchnorm="domain")
    >>> _ = est.check_inputs(np.eye(4)[None], reset=True)
    >>> est.set_classes([0, 1]); est.set_input_statistic(0.0); est.init_module(0)
    >>> public_domain_references(None, est)
    [[[0.0, 0.0], [0.0, 0.0]]]
    """
    logs = _public_prior_logs(model)
    if logs is None:
        return [np.zeros((n, n)).tolist() for n in est.domain_layer_sizes()]
    return [L.tolist() for L in logs]


def _public_prior_logs(model):
    """The log of ``init``'s domain prior at each batch-norm layer, or None without one."""
    prior = None if model is None or not model.federation_traits().domains else model.domain_prior_
    if prior is None:
        return None
    from pyriemann.utils.base import logm  # here: importing pyriemann sets up plotting libraries

    return [logm(M) for M in prior]


def _public_prior(model, est):
    """A private fit's released model starts new domains from ``init``'s (public) prior."""
    logs = _public_prior_logs(model)
    if logs is not None:
        est.set_domain_prior(logs, 1)


def domain_prior_from_data(data):
    """The ``prior`` of :meth:`FederatedRun.finish` from the training data in this process.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.run import ClientData, domain_prior_from_data
    >>> X, y = make_spd_classification(n_matrices=20, n_channels=4, n_classes=2, seed=0)
    >>> est = SPDnetClassifier(batchnorm="domain", max_epochs=2, random_state=0).fit(X, y)
    >>> est = domain_prior_from_data(ClientData(X, y, np.array_split(np.arange(20), 2)))(est)
    >>> len(est.domain_prior_)
    1
    """
    return lambda est: est.fit_domain_prior(data.X, data.domains())
