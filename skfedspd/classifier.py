"""``SPDnetClassifier``: scikit-learn estimator around :class:`skfedspd.nn.SPDNet`."""

import dataclasses
import warnings
from numbers import Real

import numpy as np
import torch
from sklearn.base import _fit_context
from sklearn.utils._param_validation import Interval, StrOptions, validate_parameter_constraints
from sklearn.utils.validation import _num_samples, check_is_fitted

from .base import TorchClassifierBase, decision_from_logits, proba_from_logits
from .persistence import check_fitted_attributes
from .renamed import DOMAIN_MERGES, DOMAIN_RENAMED, EPOCH_MERGES, EPOCH_RENAMED, accepts_renamed
from .batchnorm import domain_codes
from .nn import SPDNet
from .online import (NO_PRIOR_WARNING, DomainAdaptation, DomainStatistics, adaptation_of, DomainStatisticsMixin, check_prior_statistics,
                     drop_domain_requests, log_euclidean_sum)
from .stiefel import orthonormality_problem
from .training import predict_logits
from .transfer import adapt_target, call_labels, drop_target_requests, target_trials
from .validation import (Count, Sequence, check_domain_sizes, check_groups, check_input_range, check_spd_batch,
                         check_training_spread, input_range, is_count, resolve_groups, spectral_summary)

__all__ = ["SPDnetClassifier", "auto_hidden_dim", "HEAD_ON_RANDOM_WARNING"]

#: The largest eigenvalue magnitude of a saved batch-norm ``sym(log_bias)``: the bias
#: ``exp(sym(log_bias))`` rescales the matrices by at most ``e^20`` (5e8), beyond any trained
#: model's and well inside float32's range.
LOG_BIAS_BOUND = 20.0


HEAD_ON_RANDOM_WARNING = (
    "trainable='head' on a new model trains only the linear head on the frozen random BiMaps it starts from (random "
    "spatial filters). That is meant for a model that starts from trained weights: warm_start=True on a fitted "
    "model, or FederatedSPDnetClassifier(init=...). Set trainable='all' to train the whole network"
)


_UNRESOLVED = object()

#: ``fit`` got a new subject's calibration trials but the model has no domain statistics.
TARGET_IGNORED_WARNING = (
    "X_target_unlabeled / X_target_labeled ignored: this model has no domain statistics ({}), which only "
    "SPDnetClassifier(batchnorm='domain') keeps ('auto' is 'domain' when fit is given the trials' groups or subjects)"
)


def resolve_batchnorm(batchnorm, groups):
    """The batch norm ``fit`` builds: ``"auto"`` is ``"domain"`` given ``groups``, else None.

    Examples
    --------
    >>> from skfedspd.classifier import resolve_batchnorm
    >>> resolve_batchnorm("auto", [1, 1, 2]), resolve_batchnorm("auto", None), resolve_batchnorm("spd", [1])
    ('domain', None, 'spd')
    """
    if batchnorm != "auto":
        return batchnorm
    return None if groups is None else "domain"


def auto_hidden_dim(n_channels):
    """``hidden_dims="auto"``: ``min(n_channels, max(8, round(0.28 · n_channels)))``.

    The ratio is the paper's 18/64; why the floor and the cap: ``docs/design-decisions.md``.

    Examples
    --------
    >>> from skfedspd.classifier import auto_hidden_dim
    >>> [auto_hidden_dim(n) for n in (3, 8, 22, 64, 128)]
    [3, 8, 8, 18, 36]
    """
    return int(min(n_channels, max(8, round(0.28 * n_channels))))


class SPDnetClassifier(DomainStatisticsMixin, TorchClassifierBase):
    """SPDnet classifier for SPD matrices (e.g. EEG covariance matrices).

    BiRe blocks (BiMap with a Stiefel weight, then ReEig), LogEig, vech and a softmax head,
    trained with Adam (``docs/guide/model.md``; the defaults: ``docs/design-decisions.md``).

    Parameters
    ----------
    hidden_dims : "auto", int or tuple of int, default="auto"
        Output size of each BiMap; ``"auto"``: one block of :func:`auto_hidden_dim`.
    eps : float, default=1e-2
        ReEig threshold (after input scaling).
    scaling : {"auto", "trace"}, float or None, default="auto"
        ``"auto"``: one scalar fitted on the training data; ``"trace"``: each matrix by its
        own ``trace/n``; a float: that constant; None: none.
    lr : float, default=1e-2
        Initial Adam learning rate.
    batch_size : int, default=64
    max_epochs : int, default=300
    validation_fraction : float, default=0.1
        Stratified hold-out for early stopping, the schedule and the checkpoint.
    early_stopping : "auto" or bool, default="auto"
        Whether ``fit`` holds it out ("auto": :func:`skfedspd.validation.uses_validation`).
    validation_metric : {"loss", "f1"}, default="loss"
    checkpoint : {"auto", "best", "average"}, default="auto"
        The best epoch, or the average of the epochs within one standard error of it
        ("auto": "average" for ``batchnorm="domain"`` on several domains).
    schedule : EpochSchedule or None, default=None
        The plateau schedule in epochs (:class:`~skfedspd.training.EpochSchedule`).
    recenter_every : int, default=1
        Re-centre the Stiefel charts every this many optimizer steps.
    dtype : {"float64", "float32"}, default="float64"
    device : str, default="cpu"
    random_state : int, RandomState instance or None, default=None
    verbose : bool, default=False
    warm_start : bool, default=False
    class_weight : None, "balanced" or dict, default=None
    batchnorm : {"auto", None, "spd", "domain"}, default="auto"
        SPD batch norm after each BiMap: ``"spd"`` (Brooks et al., 2019) or ``"domain"``
        (SPDDSMBN, Kobler et al., 2022; prediction adapts each ``domain``'s statistics,
        :mod:`skfedspd.online`). ``"auto"``: ``"domain"`` when ``fit`` gets ``groups``.
    domain_adaptation : DomainAdaptation or None, default=None
        How domain statistics adapt at prediction (:class:`~skfedspd.online.DomainAdaptation`).
    trainable : {"all", "head"}, default="all"
        Which weights training updates.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    n_features_in_ : int
    input_range_ : dict
        The training matrices' :func:`~skfedspd.validation.spectral_summary` range.
    batchnorm_ : {None, "spd", "domain"}
    scale_ : float or None
    fitted_params_ : dict
    module_ : SPDNet
    history_ : list of dict
        One record per epoch.
    best_epoch_ : int
    averaged_epochs_ : list of int
    validation_used_ : bool
    n_iter_ : int
    domain_statistics_ : skfedspd.online.DomainStatistics or None

    Examples
    --------
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=60, n_channels=6, n_classes=3, seed=0)
    >>> clf = SPDnetClassifier(max_epochs=5, random_state=0).fit(X[:45], y[:45])
    >>> clf.predict(X[45:]).shape, clf.predict_proba(X[45:]).shape
    ((15,), (15, 3))
    """

    @accepts_renamed({**EPOCH_RENAMED, **DOMAIN_RENAMED}, {**EPOCH_MERGES, **DOMAIN_MERGES})  # the flat names of before
    def __init__(
        self,
        hidden_dims="auto",
        eps=1e-2,
        scaling="auto",
        lr=1e-2,
        batch_size=64,
        max_epochs=300,
        validation_fraction=0.1,
        early_stopping="auto",
        validation_metric="loss",
        checkpoint="auto",
        schedule=None,
        recenter_every=1,
        dtype="float64",
        device="cpu",
        random_state=None,
        verbose=False,
        warm_start=False,
        class_weight=None,
        batchnorm="auto",
        domain_adaptation=None,
        trainable="all",
    ):
        self.hidden_dims = hidden_dims
        self.eps = eps
        self.scaling = scaling
        self.lr = lr
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.validation_fraction = validation_fraction
        self.early_stopping = early_stopping
        self.validation_metric = validation_metric
        self.checkpoint = checkpoint
        self.schedule = schedule
        self.recenter_every = recenter_every
        self.dtype = dtype
        self.device = device
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start = warm_start
        self.class_weight = class_weight
        self.batchnorm = batchnorm
        self.domain_adaptation = domain_adaptation
        self.trainable = trainable

    # Domains of batchnorm="domain": requested from metadata routing by default, under
    # both keys (MOABB's CrossSubject routes the training subjects as "subjects").
    __metadata_request__fit = {"groups": True, "subjects": True, "X_target_unlabeled": True,
                               "X_target_labeled": True}
    # The domain of the trials being predicted, passed on by a Pipeline (batchnorm="domain"
    # only: see _get_metadata_request).
    __metadata_request__predict = {"domain": True}
    __metadata_request__predict_proba = {"domain": True}
    __metadata_request__decision_function = {"domain": True}

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, groups=None, sample_weight=None, subjects=None, X_target_unlabeled=None,
            X_target_labeled=None):
        """Train on ``(X, y)``; a validation split only on enough data (``early_stopping``).

        Parameters
        ----------
        X : array-like of shape (n_matrices, n_channels, n_channels)
            SPD matrices.
        y : array-like of shape (n_matrices,)
        groups : array-like of shape (n_matrices,), default=None
            Domain (subject, session) of each matrix, for ``batchnorm="domain"``.
        sample_weight : array-like of shape (n_matrices,), default=None
            Non-negative weights of the loss, multiplied by ``class_weight``.
        subjects : array-like of shape (n_matrices,), default=None
            Alias of ``groups`` (MOABB's ``CrossSubjectEvaluation``).
        X_target_unlabeled, X_target_labeled : array-like of shape (n_calibration, n_channels, n_channels), default=None
            A new subject's calibration matrices (MOABB's ``cs_mode``; labels unused): with
            domain batch norm, the domain ``"target"`` that prediction without ``domain``
            starts from (:mod:`skfedspd.transfer`); otherwise ignored with a warning.

        Returns
        -------
        self
        """
        groups = resolve_groups(groups, subjects)
        groups = None if groups is None else check_groups(groups, _num_samples(X))
        calibration = target_trials(X_target_unlabeled, X_target_labeled, n_channels=np.shape(X)[-1])
        warm = self.warm_start and self.__sklearn_is_fitted__()
        if self.trainable == "head" and not warm:
            warnings.warn(HEAD_ON_RANDOM_WARNING, UserWarning, stacklevel=2)
        with self._atomic():
            if not warm:  # a warm start continues the network it has
                self.batchnorm_ = resolve_batchnorm(self.batchnorm, groups)
            domains = self.fit_domains(groups, len(X))
            previous = getattr(self, "input_range_", None) if warm else None
            summary = spectral_summary(X)
            check_training_spread(summary, scale_invariant=self.scaling == "trace")
            self._fit(X, y, domains, sample_weight=sample_weight)
            # the training range grows with every fit that continues this model
            self.input_range_ = input_range(summary, previous)
            # New weights: the statistics of the old ones (domains, prior) no longer apply.
            self.domain_statistics_ = None
            if self._batchnorm_mode() == "domain":
                self.fit_domain_prior(X, groups)
                if calibration is not None:
                    adapt_target(self, calibration)
            elif calibration is not None:
                warnings.warn(TARGET_IGNORED_WARNING.format(f"batchnorm_={self._batchnorm_mode()!r}"), UserWarning,
                              stacklevel=2)
        return self

    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One epoch over ``(X, y)``; drops stored domain statistics and the prior.

        Returns
        -------
        self
        """
        first = not self.__sklearn_is_fitted__()
        if first and self.trainable == "head":
            warnings.warn(HEAD_ON_RANDOM_WARNING, UserWarning, stacklevel=2)
        if first:  # no groups: "auto" is None
            self.__dict__.pop("batchnorm_", None)
        previous = None if first else getattr(self, "input_range_", None)
        summary = spectral_summary(X)
        check_training_spread(summary, scale_invariant=self.scaling == "trace")
        super().partial_fit(X, y, classes=classes, sample_weight=sample_weight)
        self.input_range_ = input_range(summary, previous)  # grows with every batch
        self.domain_statistics_ = None
        return self

    _renamed, _merges = {**EPOCH_RENAMED, **DOMAIN_RENAMED}, {**EPOCH_MERGES, **DOMAIN_MERGES}
    _parameter_constraints: dict = {
        **TorchClassifierBase._parameter_constraints,
        "hidden_dims": [StrOptions({"auto"}), Count(1), Sequence()],
        "eps": [Interval(Real, 0, np.inf, closed="neither")],
        "scaling": [StrOptions({"auto", "trace"}), Interval(Real, 0, np.inf, closed="neither"), None],
        "recenter_every": [Count(1)],
        "checkpoint": [StrOptions({"auto", "best", "average"})],
        "batchnorm": [StrOptions({"auto", "spd", "domain"}), None],
        "domain_adaptation": [None, DomainAdaptation],
        "trainable": [StrOptions({"all", "head"})],
    }

    def check_params(self):
        """Validate the hyper-parameters (see :meth:`TorchClassifierBase.check_params`)."""
        super().check_params()
        if not isinstance(self.hidden_dims, str):
            self._hidden_dims(None)

    def _hidden_dims(self, n_channels):
        """The BiMap sizes for ``n_channels`` input channels."""
        dims = self.hidden_dims
        if isinstance(dims, str):  # "auto" (the only string _parameter_constraints accepts)
            return (auto_hidden_dim(n_channels),)
        dims = (dims,) if is_count(dims, None) else tuple(dims) if Sequence().is_satisfied_by(dims) else ()
        if not dims or not all(is_count(d, 1) for d in dims):
            raise ValueError(f"hidden_dims must be positive integers (an int or a tuple of ints), "
                             f"got {self.hidden_dims!r}")
        return dims

    def _check_array(self, X, reset):
        X = check_spd_batch(X, None if reset else self.n_features_in_)
        if reset:
            dims = (X.shape[1],) + self._hidden_dims(X.shape[1])
            if any(b > a for a, b in zip(dims, dims[1:])):
                raise ValueError(f"hidden_dims {dims[1:]} must not increase from {X.shape[1]} channels")
            self.n_features_in_ = X.shape[1]
        return X

    def _check_prediction_input(self, X):
        """``X`` validated for prediction: SPD, of the fitted size, within ``input_range_``."""
        self._check_prediction_params()
        X, summary = check_spd_batch(X, self.n_features_in_, return_summary=True)
        check_input_range(summary, getattr(self, "input_range_", None), scale_invariant=self.scaling == "trace")
        return X

    def _check_prediction_params(self):
        names = ("scaling", "domain_adaptation")
        validate_parameter_constraints({name: self._parameter_constraints[name] for name in names},
                                       {name: getattr(self, name) for name in names}, caller_name=type(self).__name__)
        adaptation_of(self).check_params()

    def input_statistic(self, X, sample_weight=None):
        """Mean over matrices of ``log(trace(X)/n)`` (weighted by ``sample_weight``): additive
        across clients.

        Parameters
        ----------
        X : ndarray of shape (n_matrices, n_channels, n_channels)
        sample_weight : ndarray of shape (n_matrices,) or None

        Returns
        -------
        float
        """
        n = X.shape[-1]
        with np.errstate(over="ignore"):
            traces = np.trace(X, axis1=1, axis2=2)
        log_traces = np.log(traces / n)
        overflow = ~np.isfinite(log_traces)
        if overflow.any():  # entries near the float64 maximum: the trace of the matrix divided by its largest entry
            big = np.abs(X[overflow]).max(axis=(1, 2))
            log_traces[overflow] = (np.log(np.trace(X[overflow] / big[:, None, None], axis1=1, axis2=2) / n)
                                    + np.log(big))
        return float(np.average(log_traces, weights=sample_weight))

    def set_input_statistic(self, log_mean_trace):
        """Set ``scale_`` from the (pooled) :meth:`input_statistic`.

        Parameters
        ----------
        log_mean_trace : float or None
        """
        if self.scaling == "auto":
            with np.errstate(over="ignore"):  # an infinite scale (subnormal input) is refused by to_tensor
                self.scale_ = float(np.exp(-log_mean_trace))
        elif isinstance(self.scaling, Real):
            self.scale_ = float(self.scaling)
        else:  # "trace" (per matrix, in to_tensor) or None
            self.scale_ = 1.0

    @staticmethod
    def _fitted_attributes():
        return TorchClassifierBase._fitted_attributes() + ("scale_", "input_range_", "batchnorm_")

    def _batchnorm_mode(self):
        """The batch norm the network has: ``batchnorm_`` once fitted, else the parameter."""
        resolved = self.__dict__.get("batchnorm_", _UNRESOLVED)
        if resolved is not _UNRESOLVED:
            return resolved
        return None if self.batchnorm == "auto" else self.batchnorm

    _fitted_params = TorchClassifierBase._fitted_params + ("hidden_dims", "eps", "scaling", "batchnorm",
                                                           "recenter_every")

    def federation_traits(self):
        """:meth:`TorchClassifierBase.federation_traits` of this model's settings."""
        mode = self._batchnorm_mode()
        return dataclasses.replace(super().federation_traits(), domains=mode == "domain",
                                   batch_statistics=mode == "spd", head_only=self.trainable == "head")

    def federated_params(self, *, init=None, private=False):
        """The input scaling of a federated fit (``init``'s, or ``"trace"`` in DP mode).

        Examples
        --------
        >>> from skfedspd import SPDnetClassifier
        >>> SPDnetClassifier().federated_params(private=True)
        {'scaling': 'trace'}
        """
        if init is not None and "scaling" in init.get_params(deep=False):
            return {"scaling": "trace" if init.scaling == "trace" else float(init.scale_)}
        return {"scaling": "trace" if private and self.scaling == "auto" else self.scaling}

    def domain_layer_sizes(self):
        """The matrix size at each domain batch-norm layer (empty without domains)."""
        if self._batchnorm_mode() != "domain":
            return ()
        return tuple(int(n) for n in self._hidden_dims(self.n_features_in_))

    def clear_domain_statistics(self):
        """Forget every domain's statistics and the prior."""
        self.domain_statistics_ = None
        return self

    def release_domain_means(self, X, *, references, clip, noise_multiplier, generator):
        """DP mode: privatized domain means (:func:`skfedspd.dp_sgd.release_domain_means`)."""
        from .dp_sgd import release_domain_means

        return release_domain_means(self.module_, X, references=references, clip=clip,
                                    noise_multiplier=noise_multiplier, generator=generator)

    def _check_module_values(self, arrays):
        """The base checks, plus orthonormal BiMap weights and bounded SPD batch-norm values."""
        super()._check_module_values(arrays)
        for name, value in arrays.items():
            if name.endswith(".W_ref"):
                problem = orthonormality_problem(value)
                if problem is not None:
                    raise ValueError(f"module array {name!r} {problem}")
            elif name.endswith(".log_bias"):
                extent = float(np.abs(np.linalg.eigvalsh((value + value.T) / 2)).max())
                if extent > LOG_BIAS_BOUND:
                    raise ValueError(f"module array {name!r} makes a batch-norm bias with eigenvalues e^±{extent:.3g}, "
                                     f"beyond e^±{LOG_BIAS_BOUND:g}")
            elif name.endswith(".running_mean"):
                try:
                    check_spd_batch(value[None])
                except ValueError:
                    raise ValueError(f"module array {name!r} is not a symmetric positive definite matrix") from None

    def fitted_state(self):
        """:meth:`TorchClassifierBase.fitted_state`, plus the domain statistics."""
        arrays, meta = super().fitted_state()
        stats = getattr(self, "domain_statistics_", None)
        if stats is not None:
            stats_arrays, meta["domain_statistics"] = stats.state()
            arrays.update({f"domain_statistics.{k}": v for k, v in stats_arrays.items()})
        return arrays, meta

    def restore_fitted_state(self, arrays, meta):
        """:meth:`TorchClassifierBase.restore_fitted_state`, with the domain statistics."""
        prefix = "domain_statistics."
        stats_arrays = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
        stats_meta = meta.get("domain_statistics") if isinstance(meta, dict) else None
        if stats_arrays and stats_meta is None:
            raise ValueError("domain statistics arrays without their metadata")
        with self._atomic():
            attributes = meta.get("attributes") if isinstance(meta, dict) else None
            if isinstance(attributes, dict) and "batchnorm_" in attributes:
                check_fitted_attributes(attributes, self._fitted_attributes())
                saved = attributes["batchnorm_"]
                if saved != resolve_batchnorm(self.batchnorm, None if saved is None else ()):
                    raise ValueError(f"fitted attribute 'batchnorm_' is {saved!r}, which batchnorm={self.batchnorm!r} "
                                     "cannot have built")
                self.batchnorm_ = saved  # before the domain statistics, which need it
            stats = None
            if stats_meta is not None:
                self.check_params()
                self._check_domain_support("saved domain statistics")
                if not isinstance(stats_meta, dict):
                    raise ValueError(f"domain_statistics must be a JSON object, got {stats_meta!r}")
                check_fitted_attributes(meta.get("attributes"), self._fitted_attributes())
                n_features = meta["attributes"]["n_features_in_"]
                stats = DomainStatistics.from_state(stats_arrays, stats_meta, self.torch_dtype_, self.device,
                                                    sizes=[int(n) for n in self._hidden_dims(n_features)])
            super().restore_fitted_state({k: v for k, v in arrays.items() if not k.startswith(prefix)},
                                         {k: v for k, v in meta.items() if k != "domain_statistics"})
            self.domain_statistics_ = stats

    def to_tensor(self, X):
        """Scaled SPD matrices as a tensor of ``dtype`` on ``device``."""
        self._check_working_range(X)
        if self.scaling == "trace":
            X = X * (X.shape[-1] / np.trace(X, axis1=1, axis2=2))[:, None, None]
        else:
            X = X * self.scale_
        return torch.as_tensor(X, dtype=self.torch_dtype_, device=self.device)

    def _check_working_range(self, X):
        """Refuse matrices that, once scaled, leave the range where ``dtype`` eigenvalues are safe."""
        log_max = np.log10(np.abs(X).max(axis=(1, 2)))
        tiny = np.finfo(X.dtype).tiny
        if (log_max < np.log10(tiny)).any():
            i = int(np.argmax(log_max < np.log10(tiny)))
            raise ValueError(f"X matrix {i} is too small: its largest entry is 1e{log_max[i]:.0f} (its scale), "
                             f"subnormal in {X.dtype} (below its smallest normal number {tiny:.3g}), where "
                             "precision is lost and no scaling can be derived; rescale the input (e.g. to µV²)")
        info = np.finfo(np.dtype(self.dtype))
        low, high = np.log10(np.sqrt(info.tiny)), np.log10(np.sqrt(info.max))
        if self.scaling == "trace":  # entries within [1, n] of trace / n, unless the trace overflows
            with np.errstate(over="ignore"):
                finite = np.isfinite(np.trace(X, axis1=1, axis2=2))
            log_max = np.where(finite, 0.0, log_max + np.log10(X.shape[-1]))
        else:
            log_max = log_max + np.log10(self.scale_)
        bad = (log_max < low) | (log_max > high)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"X matrix {i} has entries of magnitude 1e{log_max[i]:.0f} after scaling (scaling="
                             f"{self.scaling!r}, scale_={self.scale_:.3g}): outside the range in which {self.dtype} "
                             f"computes eigenvalues reliably ([1e{low:.0f}, 1e{high:.0f}]); rescale the input")

    def _build_module(self, seed):
        module = SPDNet(
            self.n_features_in_, self._hidden_dims(self.n_features_in_), len(self.classes_), eps=self.eps,
            recenter_every=self.recenter_every, seed=seed, dtype=self.torch_dtype_, batchnorm=self._batchnorm_mode(),
        )
        self._apply_trainable(module)
        return module

    def _module_state_shapes(self):
        return SPDNet.state_shapes(self.n_features_in_, self._hidden_dims(self.n_features_in_), len(self.classes_),
                                   self._batchnorm_mode())

    def _apply_trainable(self, module):
        """Freeze what ``trainable`` leaves out (no gradient, hence no update nor DP noise)."""
        for name, parameter in module.named_parameters():
            parameter.requires_grad_(self.trainable == "all" or name.startswith("head."))

    def _start_session(self, seed):
        # a warm-started fit trains what trainable says now, not what the module was built with
        self._apply_trainable(self.module_)
        super()._start_session(seed)

    def _checkpoint_rule(self, domains):
        if self.checkpoint != "auto":
            return self.checkpoint
        several = domains is not None and int(domains.max()) > int(domains.min())
        return "average" if self._batchnorm_mode() == "domain" and several else "best"

    def fit_domains(self, groups, n_samples):
        """Domain codes of ``groups`` with ``batchnorm="domain"``; None otherwise."""
        if self._batchnorm_mode() != "domain" or groups is None:
            return None
        codes = domain_codes(groups, n_samples)
        check_domain_sizes(np.asarray(groups), "domain batch norm")
        return codes

    # ------------------------------------------------------------------ domains (batchnorm="domain")
    def _get_metadata_request(self):
        requests = super()._get_metadata_request()
        # "auto" too: a Pipeline's predict-time domain (meant for Recenter) reaches only an
        # explicit "domain" model, or one whose request is set (set_predict_request)
        if self.batchnorm != "domain":
            requests = drop_domain_requests(self, requests)
        # the calibration slice: to any model that may have domain statistics ("auto" with groups)
        return requests if self.batchnorm in ("auto", "domain") else drop_target_requests(self, requests)

    def _check_domain_support(self, what):
        self.check_fitted_params()  # first: batchnorm may have been changed since fit
        if self._batchnorm_mode() != "domain":
            raise ValueError(f"{what} needs a model fitted with batchnorm='domain' (this one has "
                             f"batchnorm={self._batchnorm_mode()!r}): domain statistics live in its domain batch norms")

    def _domain_statistics(self):
        """The stored statistics (an empty store for an older model)."""
        stats = getattr(self, "domain_statistics_", None)
        if stats is None:
            stats = DomainStatistics([int(n) for n in self._hidden_dims(self.n_features_in_)], self.torch_dtype_,
                                     self.device)
        return stats

    def _adapted_logits(self, X, domain, *, keep, predict=True):
        """Update the domains of the trials of ``X``, then their logits (None when not ``predict``)."""
        stats = self._domain_statistics()
        labels = call_labels(stats, domain, len(X))
        adaptation = adaptation_of(self)
        update = stats.update(labels, float(adaptation.prior_weight), adaptation.memory)
        Xt = self.to_tensor(X)
        with torch.no_grad():
            logits = self.module_.adapted_forward(Xt, update, predict=predict, include_self=adaptation.include_self)
        if predict and update.starts_without_prior:
            warnings.warn(NO_PRIOR_WARNING, UserWarning, stacklevel=4)
        if keep:
            update.commit(adaptation.max_domains)
            self.domain_statistics_ = stats
        return None if logits is None else logits.cpu().numpy()

    def _logits(self, X, domain=None):
        check_is_fitted(self)
        self.check_fitted_params()
        if domain is not None and self._batchnorm_mode() != "domain":
            self._check_domain_support("domain=")
        X = self._check_prediction_input(X)
        if self._batchnorm_mode() == "domain":
            return self._adapted_logits(X, domain, keep=domain is not None)
        return predict_logits(self.module_, self.to_tensor(X)).cpu().numpy()

    def decision_function(self, X, domain=None):
        """Class scores (for two classes, the 1-D score of ``classes_[1]``).

        Parameters
        ----------
        X : array-like of shape (n_matrices, n_channels, n_channels)
        domain : str, int or array-like of shape (n_matrices,), default=None
            ``batchnorm="domain"``: the trials' domain, updated with ``X`` first. None: a
            temporary domain started from the prior.

        Returns
        -------
        ndarray of shape (n_matrices,) or (n_matrices, n_classes)
        """
        return decision_from_logits(self._logits(X, domain))

    def predict_proba(self, X, domain=None):
        """Softmax class probabilities; ``domain`` as in :meth:`decision_function`.

        Returns
        -------
        ndarray of shape (n_matrices, n_classes)
        """
        return proba_from_logits(self._logits(X, domain))

    def predict(self, X, domain=None):
        """Most probable class label of each matrix; ``domain`` as in :meth:`decision_function`.

        Returns
        -------
        ndarray of shape (n_matrices,)

        Examples
        --------
        >>> from skfedspd import SPDnetClassifier
        >>> from skfedspd.datasets import make_spd_classification
        >>> X, y = make_spd_classification(n_matrices=40, n_channels=4, n_classes=2, seed=0)
        >>> clf = SPDnetClassifier(batchnorm="domain", max_epochs=3, random_state=0)
        >>> clf = clf.fit(X[:30], y[:30], groups=[1] * 15 + [2] * 15)
        >>> labels = [clf.predict(X[i : i + 1], domain="s17")[0] for i in range(30, 40)]
        >>> clf.domains_
        {'s17': 10}
        """
        logits = self._logits(X, domain)  # first: an unfitted model raises NotFittedError
        return self.classes_[np.argmax(logits, axis=1)]

    def adapt(self, X, domain):
        """Unlabeled calibration: add the trials of ``X``, in order, to ``domain``'s statistics.

        Parameters
        ----------
        X : array-like of shape (n_matrices, n_channels, n_channels)
        domain : str, int or array-like of shape (n_matrices,)

        Returns
        -------
        self
        """
        check_is_fitted(self)
        self._check_domain_support("adapt")
        if domain is None:
            raise ValueError("adapt needs the domain the trials belong to (domain=...)")
        self._adapted_logits(self._check_prediction_input(X), domain, keep=True, predict=False)
        return self

    @property
    def domain_prior_(self):
        """The mean a new domain starts from at each batch-norm layer, or None."""
        check_is_fitted(self)
        self._check_domain_support("domain_prior_")
        prior = self._domain_statistics().prior
        return None if prior is None else [M.cpu().numpy() for M in prior]

    def domain_prior_statistics(self, X, groups=None):
        """The additive statistics of the prior on ``X``: ``(log_sums, count)``; sums over sites
        give the pooled prior (:meth:`set_domain_prior`).

        Returns
        -------
        log_sums : list of ndarray of shape (d_i, d_i)
        count : int
        """
        check_is_fitted(self)
        self._check_domain_support("domain_prior_statistics")
        X = self.check_inputs(X, reset=False)
        groups = check_groups(groups, len(X))
        codes = np.zeros(len(X), dtype=np.intp) if groups is None else domain_codes(groups, len(X))
        sums = None
        with torch.no_grad():
            self.module_.eval()
            for code in np.unique(codes):
                part = [log_euclidean_sum(Z) for Z in self.module_.batchnorm_inputs(self.to_tensor(X[codes == code]))]
                sums = part if sums is None else [a + b for a, b in zip(sums, part)]
        return [S.cpu().numpy() for S in sums], len(X)

    def set_domain_prior(self, log_sums, count):
        """Set the prior to ``exp(log_sums[i] / count)`` at each batch-norm layer.

        Returns
        -------
        self
        """
        check_is_fitted(self)
        self._check_domain_support("set_domain_prior")
        stats = self._domain_statistics()
        log_sums, count = check_prior_statistics(log_sums, count, stats.sizes)
        stats.set_prior(log_sums, count)
        self.domain_statistics_ = stats
        return self

    def fit_domain_prior(self, X, groups=None):
        """(Re)compute the prior that new domains start from, from the training data.

        Parameters
        ----------
        X : array-like of shape (n_matrices, n_channels, n_channels)
        groups : array-like of shape (n_matrices,), default=None

        Returns
        -------
        self
        """
        statistics = self.domain_prior_statistics(X, groups)  # validates X and groups
        summary = spectral_summary(X)
        self.set_domain_prior(*statistics)
        self.input_range_ = input_range(summary, getattr(self, "input_range_", None))
        return self

    def _warn_about_input(self, Xt):
        fractions = self.module_.eigenvalue_clamp_fraction(Xt[:256])
        if fractions and fractions[0] > 0.5:
            warnings.warn(
                f"ReEig clamps {100 * fractions[0]:.0f}% of the first BiMap's eigenvalues to "
                f"eps={self.eps} on the training data: most spectral information is lost. "
                "Scale the input (scaling='auto') or lower eps.",
                UserWarning,
                stacklevel=3,
            )
