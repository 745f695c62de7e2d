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
from .online import (NO_PRIOR_WARNING, THIS_CALL, DomainAdaptation, DomainStatistics, adaptation_of, DomainStatisticsMixin, check_prior_statistics,
                     domain_labels, drop_domain_requests, log_euclidean_sum)
from .stiefel import orthonormality_problem
from .training import predict_logits
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


def resolve_batchnorm(batchnorm, groups):
    """The batch norm ``fit`` builds: ``"auto"`` is ``"domain"`` when the trials come with
    their domains (``groups``), None otherwise; any other value is itself.

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

    0.28 is the FedSPDnet paper's 18/64 (64 channels → 18, the paper's network); the floor
    of 8 keeps at least the ~6 spatial directions CSP uses for two classes, so montages of
    8 channels or fewer are not compressed (at C3, Cz, C4 the pure ratio's d = 1 lost 15
    ROC-AUC points against d = 3); a BiMap cannot widen, hence the cap at ``n_channels``.
    3 → 3, 8 → 8, 16 → 8, 22 → 8, 32 → 9, 60 → 17, 64 → 18, 128 → 36
    (``docs/design-decisions.md``).

    Examples
    --------
    >>> from skfedspd.classifier import auto_hidden_dim
    >>> [auto_hidden_dim(n) for n in (3, 8, 22, 64, 128)]
    [3, 8, 8, 18, 36]
    """
    return int(min(n_channels, max(8, round(0.28 * n_channels))))


class SPDnetClassifier(DomainStatisticsMixin, TorchClassifierBase):
    """SPDnet classifier for SPD matrices (e.g. EEG covariance matrices).

    BiRe blocks (BiMap with a Stiefel weight trained by tangent-space local trivialization,
    then ReEig), LogEig, vech and a linear softmax head, trained with Adam on the
    cross-entropy loss. Defaults follow the FedSPDnet paper (PhysionetMI setting).

    Parameters
    ----------
    hidden_dims : "auto", int or tuple of int, default="auto"
        Output size of each BiMap (one BiRe block per entry); positive and not increasing
        from the number of channels. ``"auto"``: one BiRe block of size
        ``min(n_channels, max(8, round(0.28 · n_channels)))`` (:func:`auto_hidden_dim`):
        18 at 64 channels (the paper's network), every channel up to 8, 36 at 128.
    eps : float, default=1e-2
        ReEig threshold (applied after input scaling); finite and > 0.
    scaling : {"auto", "trace"}, float or None, default="auto"
        Input scaling. ``"auto"`` multiplies every matrix by one scalar fitted on the
        training data, the inverse geometric mean of ``trace(X)/n``, so that raw MOABB
        covariances (volts², eigenvalues ~1e-10) have eigenvalues of order 1 while the
        power differences between trials are kept. ``"trace"`` divides each matrix by its
        own ``trace/n``; a float multiplies by that constant; None leaves the input as is.
    lr : float, default=1e-2
        Initial Adam learning rate (> 0); the learning rate of every ``partial_fit`` epoch
        and of the clients of :class:`~skfedspd.FederatedSPDnetClassifier`. 1e-2 learns on
        one subject's 36 trials and on 144 pooled ones (``docs/design-decisions.md``:
        82.2 / 80.0 ROC-AUC against 81.0 / 78.3 at 1e-3, both with the validation rule
        below); the paper's 1e-3 is what the Table I experiment
        (``benchmarks/experiments/table_one_protocols.py``) pins.
    batch_size : int, default=64
    max_epochs : int, default=300
    validation_fraction : float, default=0.1
        Stratified hold-out for early stopping, the LR schedule and restore-best, used only
        when ``round(validation_fraction · n)`` is at least ``max(50, 2 · n_classes)``
        (with 0.1: from about 500 training samples). A smaller part judges on noise: on one
        subject (36 trials, a 4-trial split) or four (144 trials, 14) the split made the
        default model stop early and restore a near-untrained epoch (chance level), while
        training every sample for ``max_epochs`` at the constant ``lr`` and keeping the last
        weights beat tangent space + logistic regression (``docs/design-decisions.md``).
        ``validation_used_`` records which regime ran; 0 never splits.
    early_stopping : "auto" or bool, default="auto"
        Whether ``fit`` holds out ``validation_fraction`` for early stopping, the LR schedule
        and restore-best. "auto": only when that part has at least ``max(50, 2 · n_classes)``
        samples (:func:`skfedspd.validation.uses_validation`); True: whenever
        ``validation_fraction > 0`` (the FedSPDnet paper's protocol); False: never.
    validation_metric : {"loss", "f1"}, default="loss"
        What the validation part judges: the loss (smoother on small parts), or the
        macro-F1 with ties broken by the loss (the paper's protocol).
    checkpoint : {"auto", "best", "average"}, default="auto"
        What ``fit`` keeps when it held out a validation part. "best": the weights of the
        epoch with the lowest validation loss. "average": the average of every epoch whose
        validation loss lies within one standard error of the lowest (``history_``'s
        ``val_loss_se``), the epochs the validation part cannot tell apart from the best;
        BiMap weights are averaged and projected back onto the Stiefel manifold, as
        ProjAvg does. "auto": "average" for ``batchnorm="domain"`` fitted on several
        domains, a model meant for new subjects, where a flat average generalizes across
        domains better than one sharp epoch (Cha et al. 2021; measured on unseen subjects
        in ``docs/benchmarks/unseen-subjects.md``); "best" otherwise.
        ``averaged_epochs_`` records the epochs kept. A federation keeps its best round
        (its own schedule; averaging the clients is its regularizer).
    schedule : EpochSchedule or None, default=None
        The plateau schedule of ``fit`` with a validation part, counted in **epochs**
        (:class:`~skfedspd.training.EpochSchedule`: ``patience``, early stopping after that
        many epochs without a lower validation loss, the best epoch's weights restored;
        ``lr_patience`` and ``lr_factor``, ReduceLROnPlateau); None: ``EpochSchedule()``
        (75, 20, 0.5). The old flat ``patience``, ``lr_patience``, ``lr_factor`` still work,
        with a ``FutureWarning``, until 0.4. (A federation's schedule counts rounds: set on
        :class:`~skfedspd.FederatedSPDnetClassifier`.)
    recenter_every : int, default=1
        Re-centre the Stiefel charts every this many optimizer steps.
    dtype : {"float64", "float32"}, default="float64"
    device : str, default="cpu"
        torch device ("cpu", "cuda", "cuda:1"...).
    random_state : int, RandomState instance or None, default=None
        Seeds initialisation, the validation split and the shuffling. torch's global RNG
        is left untouched.
    verbose : bool, default=False
        Show a progress bar per epoch with the training loss and validation macro-F1.
    warm_start : bool, default=False
        When True, ``fit`` continues from the current weights (with a fresh optimizer).
    class_weight : None, "balanced" or dict, default=None
        Weights of the classes in the loss, multiplied into ``sample_weight``: a dict
        ``{label: weight}``, or ``"balanced"`` (``n / (n_classes · count(label))``, as
        :func:`sklearn.utils.class_weight.compute_sample_weight`).
    batchnorm : {"auto", None, "spd", "domain"}, default="auto"
        SPD batch normalization after each BiMap (see :class:`skfedspd.nn.SPDNet`).
        ``"auto"``: ``"domain"`` when :meth:`fit` is given the trials' domains (``groups``
        or ``subjects``, e.g. routed by a Pipeline or MOABB's ``CrossSubjectEvaluation``),
        None otherwise (``batchnorm_`` records which; a federated site's network and a
        first :meth:`partial_fit` have no groups: None). Given the subjects, domain batch
        norm is the better model on the main job (``docs/design-decisions.md``, from its
        record). Only an explicit ``"domain"`` requests
        ``domain`` at prediction from metadata routing.
        ``"spd"``: Riemannian batch norm (Brooks et al., 2019), batch means in training, the
        running mean at prediction. ``"domain"``: domain-specific statistics (SPDDSMBN,
        Kobler et al., 2022): in training, the matrices of each domain of a minibatch
        (``groups`` of :meth:`fit`; one domain without them) are normalized by their own
        mean. At prediction each domain keeps **persistent statistics** that adapt from its
        unlabeled trials (:mod:`skfedspd.online`): ``predict(X, domain="s17")`` first adds
        the trials of ``X``, in order, to the running Riemannian mean of domain ``"s17"``
        at each batch-norm layer (a new domain starts from the prior, ``domain_prior_``,
        weighing ``domain_adaptation.prior_weight`` trials), then predicts every trial of ``X`` with
        the updated statistics **without the trial itself** (``domain_adaptation.include_self``). So
        a whole subject in one call is whole-subject adaptation, and one trial per call is
        online adaptation (a BCI): each trial scored with the statistics of the trials
        before it, a new domain's first trial with the prior. :meth:`adapt` updates a
        domain without predicting (calibration), :meth:`reset_domain` forgets one;
        ``domain`` may also give one label per row. Without ``domain``, the data of the
        call form a temporary domain that starts from the prior and is not kept: all of
        ``X`` re-centred by (nearly) its own mean, and a single trial by the prior. Same in
        ``decision_function`` and ``predict_proba``;
        ``domain`` is requested from metadata routing by default, so a Pipeline passes
        it on. Under MOABB's ``CrossSubjectEvaluation`` each test fold is one unseen
        subject (MOABB routes the training subjects to ``fit(subjects=...)``, each a
        domain). In federation every client's data form one domain (its minibatches), and
        only the batch-norm biases are aggregated; ``"spd"`` running means stay on each
        client.
    domain_adaptation : DomainAdaptation or None, default=None
        How each domain's statistics adapt at prediction (``batchnorm="domain"``):
        :class:`~skfedspd.online.DomainAdaptation` (``prior_weight``, the prior's weight in
        trials; ``memory``, how many recent trials the statistics remember; ``include_self``,
        whether a trial is re-centred with itself; ``max_domains``, the most domains
        stored); None: its defaults. Reachable as ``domain_adaptation__memory`` once set.
    trainable : {"all", "head"}, default="all"
        Which weights training updates. ``"head"``: only the linear softmax head; the
        BiMaps (and batch-norm biases) keep the weights the module starts from, e.g. a
        public model's (``warm_start``: it applies from the next ``fit``; or
        ``FederatedSPDnetClassifier(init=...)``). Frozen
        weights get no gradient: under DP-SGD they are neither clipped nor noised, so the
        privatized dimension shrinks to the head's and the noise per coordinate falls for
        the same clip norm and budget (:mod:`skfedspd.privacy`). On a new model (``fit``
        without a warm start, the first ``partial_fit``) it warns
        (:data:`HEAD_ON_RANDOM_WARNING`) rather than refusing: a head on frozen random
        BiMaps is a legitimate random-features baseline, but rarely what was meant.

    Every parameter is validated at ``fit``, and those that prediction reads again at
    every prediction; the parameters the network was built with (``fitted_params_``) are
    checked before every use of a fitted model (``docs/guide/model.md``, "Checks").

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    n_features_in_ : int
        Number of channels (matrix size).
    input_range_ : dict
        The training matrices' range of :func:`~skfedspd.validation.spectral_summary` statistics:
        ``{"log_scale": [low, high], "log_condition": [low, high]}`` (decades), set by
        ``fit`` and ``partial_fit`` (it grows with warm-started fits and later batches) and
        by :meth:`fit_domain_prior` (which a federated fit with ``batchnorm="domain"``
        calls on its training data). Matrices beyond it by more than
        :data:`~skfedspd.validation.INPUT_RANGE_MARGIN` are refused at prediction. Absent from a model without
        it (saved before it existed, or federated without domain batch norm or from a
        deployment whose data stay on the sites): only positive definiteness is then
        checked.
    batchnorm_ : {None, "spd", "domain"}
        The batch normalization the network has (``batchnorm``, with ``"auto"`` resolved
        by :meth:`fit`).
    scale_ : float or None
        Input scaling factor fitted with ``scaling="auto"`` (1.0 for a float/None scaling).
    fitted_params_ : dict
        The parameters the network and input transform were built with (name → value),
        checked before the model is used (see above).
    module_ : SPDNet
        The trained torch module.
    history_ : list of dict
        One record per epoch: ``train_loss``, ``val_loss``, ``val_loss_se`` (its standard
        error), ``val_f1`` (macro), ``lr``, ``skipped_batches``.
    best_epoch_ : int
        Index in ``history_`` of the epoch with the best validation score (the last epoch
        without a validation part).
    averaged_epochs_ : list of int
        Indices in ``history_`` of the epochs whose weights were kept: ``[best_epoch_]``,
        or the epochs averaged (``checkpoint``).
    validation_used_ : bool
        Whether the last ``fit`` held out a validation part (see ``validation_fraction``);
        False: the last weights of ``max_epochs`` epochs were kept.
    n_iter_ : int
        Epochs run on this model (``fit``, ``partial_fit`` and warm starts), as in
        :class:`~sklearn.neural_network.MLPClassifier` (``n_epochs_``: a deprecated alias).
    domain_statistics_ : skfedspd.online.DomainStatistics or None
        ``batchnorm="domain"``: the prior and the stored domains' running means (None:
        neither yet). Read them through ``domains_`` (label → trials seen) and
        ``domain_prior_`` (the prior at each batch-norm layer, or None).

    Examples
    --------
    On SPD matrices (here synthetic ones; from EEG, ``pyriemann.estimation.Covariances``):

    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=60, n_channels=6, n_classes=3, seed=0)
    >>> clf = SPDnetClassifier(max_epochs=5, random_state=0).fit(X[:45], y[:45])
    >>> clf.predict(X[45:]).shape, clf.predict_proba(X[45:]).shape
    ((15,), (15, 3))
    >>> clf.n_iter_, clf.module_.bimaps[0].weight.shape  # "auto" keeps every channel up to 8
    (5, torch.Size([6, 6]))

    On EEG epochs, covariance estimation first:

    >>> import numpy as np
    >>> from pyriemann.estimation import Covariances
    >>> from sklearn.pipeline import make_pipeline
    >>> epochs = np.random.default_rng(0).standard_normal((40, 4, 128))  # trials, channels, times
    >>> labels = np.arange(40) % 2
    >>> pipe = make_pipeline(Covariances("oas"), SPDnetClassifier(max_epochs=3, random_state=0))
    >>> pipe.fit(epochs, labels).predict(epochs[:5]).shape
    (5,)
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
    __metadata_request__fit = {"groups": True, "subjects": True}
    # The domain of the trials being predicted, passed on by a Pipeline (batchnorm="domain"
    # only: see _get_metadata_request).
    __metadata_request__predict = {"domain": True}
    __metadata_request__predict_proba = {"domain": True}
    __metadata_request__decision_function = {"domain": True}

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, groups=None, sample_weight=None, subjects=None):
        """Train on ``(X, y)``; validation split and early stopping only on enough data.

        See :meth:`TorchClassifierBase.fit` and ``validation_fraction``.

        Parameters
        ----------
        X : array-like of shape (n_matrices, n_channels, n_channels)
            SPD matrices.
        y : array-like of shape (n_matrices,)
            Labels of any type (str, int...).
        groups : array-like of shape (n_matrices,), default=None
            Domain (subject, session) of each matrix, used by ``batchnorm="domain"`` (None:
            one domain) and ignored otherwise. Requested from metadata routing by default.
        sample_weight : array-like of shape (n_matrices,), default=None
            Non-negative weights: each minibatch's loss is ``Σ w_i l_i / Σ w_i`` and the
            ``scaling="auto"`` statistic is their weighted mean (integer weights = repeated
            matrices); multiplied by ``class_weight``. Under metadata routing, request it
            with ``set_fit_request(sample_weight=True)``.
        subjects : array-like of shape (n_matrices,), default=None
            Alias of ``groups``: MOABB's ``CrossSubjectEvaluation`` routes the training
            subjects under this key, so each training subject is a domain there with no
            ``set_fit_request`` call. Requested by default.

        Returns
        -------
        self
            With ``batchnorm="domain"``: stored domains forgotten, the prior computed
            (:meth:`fit_domain_prior` on ``X`` and ``groups``).
        """
        groups = resolve_groups(groups, subjects)
        groups = None if groups is None else check_groups(groups, _num_samples(X))
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
        return self

    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One epoch over ``(X, y)``; see :meth:`TorchClassifierBase.partial_fit`.

        The weights change, so stored domain statistics and the prior are dropped
        (``batchnorm="domain"``): call :meth:`fit_domain_prior` on the training data before
        predicting single trials.

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
        """Validate the hyper-parameters (see :meth:`TorchClassifierBase.check_params`);
        ``hidden_dims`` must be "auto", a positive int or a non-empty sequence of positive ints."""
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
        """``X`` validated for prediction or adaptation: SPD at float64 precision, of the
        fitted size, and within the training range (``input_range_``, :func:`~skfedspd.validation.check_input_range`);
        the parameters used at prediction validated as :meth:`fit` does (they may have been
        changed by ``set_params`` since). Runs before any domain statistic is touched."""
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
        """Mean over matrices of ``log(trace(X)/n)`` (weighted by ``sample_weight`` if given):
        additive, so federated clients combine it by a weighted mean into exactly the pooled
        value.

        Parameters
        ----------
        X : ndarray of shape (n_matrices, n_channels, n_channels)
            SPD matrices validated by :meth:`check_inputs`.
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
        """Set ``scale_``: ``exp(-log_mean_trace)`` for ``scaling="auto"``, the constant for a
        float ``scaling``, 1.0 otherwise.

        Parameters
        ----------
        log_mean_trace : float or None
            The (pooled) :meth:`input_statistic`; only used by ``scaling="auto"``.
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
        """The batch norm the network has: ``batchnorm_`` once ``fit`` resolved it, else the
        parameter (``"auto"``: None, as a federated site's network or a first ``partial_fit``)."""
        resolved = self.__dict__.get("batchnorm_", _UNRESOLVED)
        if resolved is not _UNRESOLVED:
            return resolved
        return None if self.batchnorm == "auto" else self.batchnorm

    _fitted_params = TorchClassifierBase._fitted_params + ("hidden_dims", "eps", "scaling", "batchnorm",
                                                           "recenter_every")

    def federation_traits(self):
        """:meth:`TorchClassifierBase.federation_traits`: domains with ``batchnorm="domain"``,
        batch statistics with ``"spd"`` (``"auto"`` is None on a site: it has no groups),
        head-only training with ``trainable="head"``."""
        mode = self._batchnorm_mode()
        return dataclasses.replace(super().federation_traits(), domains=mode == "domain",
                                   batch_statistics=mode == "spd", head_only=self.trainable == "head")

    def federated_params(self, *, init=None, private=False):
        """The input scaling of a federated fit: ``init``'s when it has one (``"trace"`` if it
        used it, else its fitted ``scale_``, a public constant); in DP mode ``"auto"``
        becomes ``"trace"`` (per matrix: no statistic of the sites); else this model's own.

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
        """The size of the matrices at each domain batch-norm layer (empty without domains):
        the shapes of the domain statistics a federation sums or releases."""
        if self._batchnorm_mode() != "domain":
            return ()
        return tuple(int(n) for n in self._hidden_dims(self.n_features_in_))

    def clear_domain_statistics(self):
        """Forget every domain's statistics and the prior: they belong to earlier weights
        (a federated fit clears its released model's before it sets the new prior)."""
        self.domain_statistics_ = None
        return self

    def release_domain_means(self, X, *, references, clip, noise_multiplier, generator):
        """DP mode: the privatized means of the domains of ``X`` (a
        :class:`~skfedspd.batchnorm.DomainBatch`) at every batch-norm layer, by
        :func:`skfedspd.dp_sgd.release_domain_means`."""
        from .dp_sgd import release_domain_means

        return release_domain_means(self.module_, X, references=references, clip=clip,
                                    noise_multiplier=noise_multiplier, generator=generator)

    def _check_module_values(self, arrays):
        """:meth:`TorchClassifierBase._check_module_values`, and the SPDnet's own: every
        BiMap's ``W_ref`` orthonormal (within the tolerance of the federated server's checks,
        :func:`~skfedspd.stiefel.orthonormality_problem`; refused, never replaced by another
        orthonormal matrix), every batch-norm bias ``exp(sym(log_bias))`` with eigenvalues
        within ``e^±LOG_BIAS_BOUND`` and every running mean SPD."""
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
        """:meth:`TorchClassifierBase.fitted_state`, plus the domain statistics (the prior
        and every stored domain: arrays ``"domain_statistics.<name>"``, their labels, weights
        and counts in the JSON ``"domain_statistics"``)."""
        arrays, meta = super().fitted_state()
        stats = getattr(self, "domain_statistics_", None)
        if stats is not None:
            stats_arrays, meta["domain_statistics"] = stats.state()
            arrays.update({f"domain_statistics.{k}": v for k, v in stats_arrays.items()})
        return arrays, meta

    def restore_fitted_state(self, arrays, meta):
        """:meth:`TorchClassifierBase.restore_fitted_state`, with the domain statistics
        (validated first, like everything else, before the network is built)."""
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
        """Scaled SPD matrices as a tensor of ``dtype`` on ``device``.

        Parameters
        ----------
        X : ndarray of shape (n_matrices, n_channels, n_channels)
            Validated by :meth:`check_inputs`.

        Returns
        -------
        torch.Tensor
        """
        self._check_working_range(X)
        if self.scaling == "trace":
            X = X * (X.shape[-1] / np.trace(X, axis1=1, axis2=2))[:, None, None]
        else:
            X = X * self.scale_
        return torch.as_tensor(X, dtype=self.torch_dtype_, device=self.device)

    def _check_working_range(self, X):
        """Refuse matrices whose largest entry, once scaled, leaves the range in which
        ``dtype`` computes eigenvalues without overflow or underflow (the square roots of its
        largest and smallest normal numbers, as LAPACK's safe range): e.g. a 1e308 trial
        with ``scaling=10``, which would overflow to infinity. Matrices too small for float64
        itself (largest entry subnormal, below its smallest normal number) are refused as such
        first: no scale could be derived from them."""
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
        """Domain codes of ``groups`` with ``batchnorm="domain"``; None otherwise or
        without groups (one domain). See :meth:`TorchClassifierBase.fit_domains`."""
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
        return requests if self.batchnorm == "domain" else drop_domain_requests(self, requests)

    def _check_domain_support(self, what):
        self.check_fitted_params()  # first: batchnorm may have been changed since fit
        if self._batchnorm_mode() != "domain":
            raise ValueError(f"{what} needs a model fitted with batchnorm='domain' (this one has "
                             f"batchnorm={self._batchnorm_mode()!r}): domain statistics live in its domain batch norms")

    def _domain_statistics(self):
        """The stored statistics; an empty store without a prior for a model fitted before
        they existed (built fresh, stored only by a call that updates it)."""
        stats = getattr(self, "domain_statistics_", None)
        if stats is None:
            stats = DomainStatistics([int(n) for n in self._hidden_dims(self.n_features_in_)], self.torch_dtype_,
                                     self.device)
        return stats

    def _adapted_logits(self, X, domain, *, keep, predict=True):
        """Update the domains of the trials of ``X`` (validated by
        :meth:`_check_prediction_input`; ``domain`` None: one temporary domain), then the
        logits of ``X`` (or None when not ``predict``). Everything is validated before any
        statistic changes; ``keep`` stores the updated domains."""
        labels = [THIS_CALL] * len(X) if domain is None else domain_labels(domain, len(X))
        stats = self._domain_statistics()
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
        """Class scores: logits of shape ``(n_samples, n_classes)``; for two classes, the
        1-D score of ``classes_[1]`` (logit difference).

        Parameters
        ----------
        X : array-like of shape (n_matrices, n_channels, n_channels)
        domain : str, int or array-like of shape (n_matrices,), default=None
            ``batchnorm="domain"``: the domain of the trials (one label, or one per row);
            its statistics are updated with ``X`` (in order) first, then used for every
            trial, without the trial itself (``domain_adaptation.include_self``). None: ``X`` is a
            temporary domain started from the prior. Requested from metadata routing by
            default.

        Returns
        -------
        ndarray of shape (n_matrices,) or (n_matrices, n_classes)
        """
        return decision_from_logits(self._logits(X, domain))

    def predict_proba(self, X, domain=None):
        """Softmax class probabilities, columns ordered as ``classes_``; ``domain`` as in
        :meth:`decision_function`.

        Returns
        -------
        ndarray of shape (n_matrices, n_classes)
        """
        return proba_from_logits(self._logits(X, domain))

    def predict(self, X, domain=None):
        """Most probable class label of each matrix; ``domain`` as in :meth:`decision_function`.

        Examples
        --------
        Online prediction, one trial per call, the new subject's statistics adapting as
        its trials arrive:

        >>> from skfedspd import SPDnetClassifier
        >>> from skfedspd.datasets import make_spd_classification
        >>> X, y = make_spd_classification(n_matrices=40, n_channels=4, n_classes=2, seed=0)
        >>> clf = SPDnetClassifier(batchnorm="domain", max_epochs=3, random_state=0)
        >>> clf = clf.fit(X[:30], y[:30], groups=[1] * 15 + [2] * 15)
        >>> labels = [clf.predict(X[i : i + 1], domain="s17")[0] for i in range(30, 40)]
        >>> clf.domains_
        {'s17': 10}

        Returns
        -------
        ndarray of shape (n_matrices,)
        """
        logits = self._logits(X, domain)  # first: an unfitted model raises NotFittedError
        return self.classes_[np.argmax(logits, axis=1)]

    def adapt(self, X, domain):
        """Unlabeled calibration: add the trials of ``X``, in order, to ``domain``'s statistics.

        A new domain starts from the prior. The learned weights never change (this is not
        ``fit``). Adapting in several calls equals adapting at once (to rounding).

        Parameters
        ----------
        X : array-like of shape (n_matrices, n_channels, n_channels)
            SPD matrices of the domain (no labels).
        domain : str, int or array-like of shape (n_matrices,)
            The domain's label, or one label per row.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Without ``batchnorm="domain"``, for matrices that are not SPD or a ``domain``
            of the wrong length; TypeError for a label that is not a str or an int. The
            statistics are then unchanged.
        """
        check_is_fitted(self)
        self._check_domain_support("adapt")
        if domain is None:
            raise ValueError("adapt needs the domain the trials belong to (domain=...)")
        self._adapted_logits(self._check_prediction_input(X), domain, keep=True, predict=False)
        return self

    @property
    def domain_prior_(self):
        """The mean a new domain starts from at each batch-norm layer (list of ndarray), or
        None when the model has none (see :meth:`fit_domain_prior`)."""
        check_is_fitted(self)
        self._check_domain_support("domain_prior_")
        prior = self._domain_statistics().prior
        return None if prior is None else [M.cpu().numpy() for M in prior]

    def domain_prior_statistics(self, X, groups=None):
        """The additive statistics of the prior on ``X``: ``(log_sums, count)``.

        ``log_sums[i]`` is ``Σ log Z`` over the inputs ``Z`` of batch-norm layer ``i``, the
        matrices of each domain (``groups``; None: one domain) normalized by their own
        means as in training. Sums and counts of several sites add up to the pooled ones:
        a federated deployment sums the sites' statistics and calls
        :meth:`set_domain_prior`.

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
        """Set the prior to the log-Euclidean mean ``exp(log_sums[i] / count)`` at each
        batch-norm layer (the statistics of :meth:`domain_prior_statistics`, possibly
        summed over sites). Stored domains keep their statistics.

        Raises
        ------
        ValueError
            Naming ``log_sums[i]`` or ``count`` (:func:`~skfedspd.online.check_prior_statistics`):
            one finite symmetric matrix per batch-norm layer, a whole count >= 1, a
            log-mean within :data:`~skfedspd.online.PRIOR_LOG_BOUND`. The model is then
            unchanged.

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

        The log-Euclidean mean of each batch-norm layer's inputs over ``X``, each domain of
        ``groups`` normalized by its own means as in training (see :mod:`skfedspd.online`
        for the choice). :meth:`fit` calls it at its end; call it on a model that has no
        prior (saved before this feature, trained by :meth:`partial_fit`, deployed from a
        federation that could not compute it).

        Parameters
        ----------
        X : array-like of shape (n_matrices, n_channels, n_channels)
            The training matrices.
        groups : array-like of shape (n_matrices,), default=None
            Their domains (None: one domain).

        Returns
        -------
        self
            Its ``input_range_`` also covers ``X`` (a federated fit gets its training range
            here, where the training data are in the process).
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
