"""Shared scikit-learn machinery for the torch classifiers (SPDnet, EEGNet).

Subclasses define how inputs are validated and turned into tensors and which module is
built; fitting, the validation split, the schedule, prediction, and persistence live here
once, on top of :mod:`skfedspd.training`.
"""

import copy
import warnings
from contextlib import contextmanager
from numbers import Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context, clone
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, column_or_1d

from .aggregation import projavg
from .batchnorm import DomainBatch
from .training import (
    Settings,
    EpochSchedule,
    check_optimizer_array,
    check_optimizer_settings,
    derive_seed,
    draw_seed,
    evaluate,
    load_optimizer_arrays,
    optimizer_arrays,
    predict_logits,
    seeded_torch,
    torch_threads,
    train_epochs,
    warn_skipped,
)
from .persistence import (check_fitted_attributes, check_module_arrays, check_module_values, labels_from_json,
                          labels_to_json, load_module_state)
from .protocol import FederationTraits
from .renamed import EPOCH_MERGES, EPOCH_RENAMED, fold_renamed
from .validation import (Count, check_device, check_label_values, check_labels, check_nested_params,
                         stratified_split, training_weights, uses_validation)

__all__ = ["TorchClassifierBase"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _comparable(value):
    """A parameter's value in a form that ``==`` compares safely (tuples for sequences,
    device names for devices)."""
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return tuple(_comparable(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def _progress(iterable, enabled, desc):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, leave=False)


def _as_tensor(a):
    """A tensor sharing a writable numpy array's memory, or a copy of a read-only one (joblib
    memory-maps): torch has no read-only tensors. Tensors pass through; a DomainBatch gets
    its matrices converted."""
    if isinstance(a, DomainBatch):
        return a.with_inputs(_as_tensor(a.X))
    if not isinstance(a, np.ndarray):
        return a
    return torch.from_numpy(a) if a.flags.writeable else torch.tensor(a)


class TorchClassifierBase(ClassifierMixin, BaseEstimator):
    """Base for torch classifiers trained by :func:`skfedspd.training.train_epochs`.

    It implements the local-estimator protocol (``docs/guide/protocol.md``): the public methods
    that the federated meta-estimator, the engine and the Flower apps call, and nothing
    else. Subclasses provide ``_check_array(X, reset)`` (a validated float64 array; with
    ``reset`` it records ``n_features_in_``), :meth:`input_statistic`,
    :meth:`set_input_statistic`, :meth:`to_tensor` and ``_build_module(seed)``.

    Examples
    --------
    What a federated client does with a local estimator (here an SPDnet): set it up from
    its data, then run one round's :meth:`local_update` from the broadcast parameters.

    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.base import TorchClassifierBase
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=20, n_channels=4, n_classes=2, seed=0)
    >>> clf = SPDnetClassifier(random_state=0)
    >>> isinstance(clf, TorchClassifierBase)
    True
    >>> X = clf.check_inputs(X, reset=True)
    >>> clf.set_classes(y)
    >>> clf.set_input_statistic(clf.input_statistic(X))
    >>> clf.init_module(seed=0)
    >>> dict(clf.parameter_kinds())
    {'bimaps.0.weight': 'stiefel', 'head.weight': 'euclidean', 'head.bias': 'euclidean'}
    >>> params, loss, n_skipped = clf.local_update(clf.get_parameters(), None, clf.to_tensor(X),
    ...                                            clf.encode_labels(y), lr=0.01, n_epochs=2, seed=0)
    >>> params["bimaps.0.weight"].shape, n_skipped
    ((4, 4), 0)
    """

    # ------------------------------------------------------------------ protocol: data
    def check_inputs(self, X, *, reset):
        """Validate the inputs ``X``; return them as a float64 array.

        Parameters
        ----------
        X : array-like
            Inputs in the estimator's format (see the subclass).
        reset : bool
            True at the start of a fit: the hyper-parameters are validated and
            ``n_features_in_`` (and any other input-shape attribute) is set from ``X``.
            False: ``X`` must match the shape seen at fit time.

        Returns
        -------
        X : ndarray of float64

        Raises
        ------
        ValueError
            Naming the problem (and the first bad sample where there is one).
        """
        if reset:
            self.check_params()
        else:
            self.check_fitted_params()
        return self._check_array(X, reset)

    def check_params(self):
        """Validate the hyper-parameters (scikit-learn's ``_parameter_constraints``).

        Raises
        ------
        sklearn.utils._param_validation.InvalidParameterError
            A ``ValueError`` naming the parameter, its value and what is allowed.
        """
        self._validate_params()
        check_device(self.device)
        for value in self.get_params(deep=False).values():
            if isinstance(value, Settings):  # a settings object checks its own parameters
                value.check_params()

    def set_classes(self, classes):
        """Set ``classes_`` to the sorted unique labels of ``classes``.

        Parameters
        ----------
        classes : array-like of shape (n_labels,)
            Every label the model will know (any label type: int, str...).

        Raises
        ------
        ValueError
            If the labels are not classification targets or fewer than two classes remain.
        """
        check_label_values(classes, "classes")
        classes = column_or_1d(np.asarray(classes), warn=False)
        check_classification_targets(classes)
        classes = np.unique(classes)
        if len(classes) < 2:
            raise ValueError(
                f"The number of classes has to be greater than one; got {len(classes)} class "
                f"({classes.tolist()})"
            )
        self.classes_ = classes

    def encode_labels(self, y, n_samples=None):
        """Integer codes of the labels ``y`` into ``classes_`` (set by :meth:`set_classes`).

        Parameters
        ----------
        y : array-like of shape (n_samples,)
        n_samples : int or None
            When given, ``y`` must have this many labels.

        Returns
        -------
        codes : ndarray of int64 of shape (n_samples,)
            ``classes_[codes] == y``.

        Raises
        ------
        ValueError
            On a length mismatch, non-classification targets or labels not in ``classes_``.
        """
        y = check_labels(y, n_samples)
        unseen = np.setdiff1d(np.unique(y), self.classes_)
        if len(unseen):
            raise ValueError(f"y contains labels not in classes: {unseen.tolist()}")
        return np.searchsorted(self.classes_, y).astype(np.int64)

    def input_statistic(self, X, sample_weight=None):
        """A scalar statistic of the training inputs, additive over samples, or None.

        Federated clients each compute it on their training part; the server pools them by
        a weighted mean (weights: training sizes, or sums of sample weights), which is
        exactly the statistic of the pooled data, and calls :meth:`set_input_statistic`
        with it.

        Parameters
        ----------
        X : ndarray
            Inputs validated by :meth:`check_inputs`.
        sample_weight : ndarray or None
            Weights of the samples (a weighted mean); only passed when not None, so a
            subclass whose statistic ignores weights may omit the argument.

        Returns
        -------
        float or None
            None when the estimator fits nothing on its inputs.
        """
        return None

    def set_input_statistic(self, value):
        """Fit the input transform from a (pooled) :meth:`input_statistic`.

        Parameters
        ----------
        value : float or None
        """

    def to_tensor(self, X):
        """Validated inputs → the tensor the module takes (transform, dtype, device).

        Parameters
        ----------
        X : ndarray
            Inputs validated by :meth:`check_inputs`.

        Returns
        -------
        torch.Tensor
        """
        raise NotImplementedError

    # ------------------------------------------------------------------ protocol: model
    def init_module(self, seed):
        """Build a fresh ``module_`` from ``n_features_in_`` and ``classes_`` only (no data).

        The same ``seed`` gives the same weights on every machine; torch's global RNG is left
        untouched. ``history_`` is reset.

        Parameters
        ----------
        seed : int
        """
        with seeded_torch(derive_seed(seed, 0)):
            self.module_ = self._build_module(derive_seed(seed, 1)).to(self.device)
        self.fitted_params_ = {name: copy.deepcopy(getattr(self, name)) for name in self._fitted_params}
        self.history_ = []
        self._optimizer = None  # a new module starts a new training session

    #: The parameters a fitted model's meaning depends on (its network, its input transform):
    #: recorded in ``fitted_params_`` when the network is built, and compared with the current
    #: ones by :meth:`check_fitted_params`.
    _fitted_params = ("dtype", "device")

    def check_fitted_params(self):
        """Refuse to use a fitted model whose meaning parameters (``fitted_params_``: those its
        network and input transform were built with) were changed by ``set_params`` since.

        ``set_params`` stays permissive, as scikit-learn requires (``clone`` and grid searches
        set parameters on unfitted estimators, and a changed value applies at the next
        ``fit``); prediction, adaptation, ``partial_fit``, a warm-started ``fit`` and saving
        call this first, so such a change is never silently applied or silently ignored.

        Raises
        ------
        ValueError
            Naming the parameter, its value and the fitted one: refit, or set it back.
        """
        for name, fitted in getattr(self, "fitted_params_", {}).items():
            current = getattr(self, name, None)
            if _comparable(current) != _comparable(fitted):
                raise ValueError(f"{name}={current!r} is not the {name}={fitted!r} this model was fitted with (its "
                                 f"network and input transform are built for it): refit with fit(), or set it back "
                                 f"with set_params({name}={fitted!r})")

    def get_parameters(self):
        """The module's exported state as named numpy copies.

        Returns
        -------
        dict of str to ndarray
            Keys and order of :meth:`parameter_kinds`.
        """
        return self.module_.get_parameters()

    def set_parameters(self, arrays):
        """Load named arrays (any subset of :meth:`parameter_kinds`) into the module.

        Parameters
        ----------
        arrays : dict of str to ndarray

        Raises
        ------
        KeyError
            For a name the module does not export.
        ValueError
            For an array of the wrong shape.
        """
        self.module_.set_parameters(arrays)

    def parameter_kinds(self):
        """How the server treats each exported array.

        Returns
        -------
        dict of str to str
            ``"stiefel"`` (orthonormal columns, aggregated on the manifold),
            ``"euclidean"`` (averaged) or ``"local"`` (kept on each client, FedBN-style).
        """
        return self.module_.parameter_kinds()

    def federation_traits(self):
        """What the federation needs to know of this model, declared rather than probed
        (:class:`~skfedspd.protocol.FederationTraits`). Here: no domains and no batch
        statistics; the learning rate and minibatch size; the class weights and the
        early-stopping rule of the parameters ``class_weight`` and ``early_stopping`` where
        the model has them (without ``early_stopping``, a validation part is held out
        whenever one is asked for)."""
        params = self.get_params(deep=False)
        return FederationTraits(class_weight=params.get("class_weight"),
                                early_stopping=params.get("early_stopping", True), lr=self.lr,
                                batch_size=self.batch_size)

    def federated_params(self, *, init=None, private=False):
        """The parameters a federated fit sets on its clone of this model before training:
        ``init`` is the fitted local model the run starts from (or None), ``private`` says
        DP mode. Here: none."""
        return {}

    def validation_scores(self, X, y, sample_weight=None):
        """``(loss, macro-F1)`` of the network on ``X`` (:meth:`to_tensor`'s) and the label
        codes ``y``: what a site reports of its validation part
        (:func:`skfedspd.training.evaluate`)."""
        return evaluate(self.module_, X, y, sample_weight)

    def n_trainable_parameters(self):
        """The number of values that train (``requires_grad``): the dimension DP-SGD's noise
        spreads over."""
        return int(sum(p.numel() for p in self.module_.parameters() if p.requires_grad))

    def without_class_weight(self):
        """An unfitted clone that leaves the class weights out (``class_weight=None`` where the
        model has that parameter): for sites whose sample weights already hold them,
        computed by the transport on all the labels, so that they are not applied twice."""
        est = clone(self)
        if "class_weight" in est.get_params(deep=False):
            est.set_params(class_weight=None)
        return est

    def check_optimizer_state(self, arrays):
        """Raise a ValueError naming the problem when ``arrays`` (an Adam state, as
        :func:`skfedspd.training.optimizer_arrays` writes it) does not fit the network."""
        load_optimizer_arrays(torch.optim.Adam(self.module_.parameters()), arrays)

    def local_update(self, global_params, local_state, X, y, *, lr, n_epochs, seed, n_threads=None, dp=None,
                     sample_weight=None, optimizer_state=None):
        """One client's work in a federated round: the one local-training routine.

        Loads the broadcast ``global_params`` (then the client's own ``local_state``),
        creates an Adam optimizer with learning rate ``lr`` (resuming the client's
        ``optimizer_state`` when one is given) and runs ``n_epochs``
        epochs of :func:`~skfedspd.training.train_epochs` (minibatches of ``batch_size``)
        under ``seed`` — or, with ``dp``, of :func:`~skfedspd.dp_sgd.dp_train_epochs`
        (DP-SGD: Poisson sampling, per-sample clipping, Gaussian noise, Adam on the
        privatized gradient). Torch's global RNG and grad mode do not matter and are left as
        they were.

        Parameters
        ----------
        global_params : dict of str to ndarray
        local_state : dict of str to ndarray or None
            The client's ``"local"`` arrays from its previous round (None: none yet).
        X, y : torch.Tensor or ndarray
            The client's training inputs (from :meth:`to_tensor`) and integer codes (from
            :meth:`encode_labels`).
        lr : float
        n_epochs : int
        seed : int
        n_threads : int or None
            torch intra-op threads during the update (None: unchanged).
        dp : dict or None, default=None
            Differentially private training: ``{"noise_multiplier": σ, "clip_norm": C,
            "sample_rate": q}`` (the site's entry of :func:`~skfedspd.privacy.plan_dp`).
            ``batch_size`` is then replaced by Poisson sampling at rate ``q``; an epoch is
            ``ceil(1 / q)`` steps. Not combined with ``sample_weight``.
        sample_weight : torch.Tensor, ndarray or None
            The client's training sample weights (the minibatch loss is their weighted mean);
            they never leave the client.
        optimizer_state : dict of str to ndarray or None, default=None
            The client's Adam state after its previous round
            (:func:`~skfedspd.training.optimizer_arrays`; ``{}`` before its first round):
            Adam resumes its moments and step count from it at the learning rate ``lr``, and
            the dict is replaced in place by the state after this round. None: a fresh Adam,
            nothing kept (the paper's clients). It is the client's own and is not returned
            with the parameters.

        Returns
        -------
        params : dict of str to ndarray
            :meth:`get_parameters` after training (``"local"`` arrays included).
        mean_loss : float
            Sample-weighted mean training loss (NaN if every batch was skipped). NaN with
            ``dp``: the loss is a statistic of the raw data, outside the privacy budget,
            so it is not released.
        n_skipped : int
            Batches skipped for a non-finite loss or gradient. 0 with ``dp`` (samples with
            a non-finite gradient contribute zero; their count is not released).
        """
        X, y, sample_weight = _as_tensor(X), _as_tensor(y), _as_tensor(sample_weight)
        with torch_threads(n_threads), seeded_torch(seed):
            self.set_parameters(global_params)
            if local_state:
                self.set_parameters(local_state)
            generator = torch.Generator().manual_seed(seed)
            optimizer = torch.optim.Adam(self.module_.parameters(), lr=lr)
            if optimizer_state:
                load_optimizer_arrays(optimizer, optimizer_state)
            if dp is not None:
                if sample_weight is not None:
                    raise ValueError("sample_weight is not supported with differential privacy (dp)")
                from .dp_sgd import dp_train_epochs

                dp_train_epochs(self.module_, X, y, n_epochs=n_epochs, sample_rate=dp["sample_rate"],
                                clip_norm=dp["clip_norm"], noise_multiplier=dp["noise_multiplier"], lr=None,
                                generator=generator, optimizer=optimizer)
                loss, skipped = float("nan"), 0
            else:
                loss, skipped = train_epochs(self.module_, optimizer, X, y, n_epochs=n_epochs,
                                             batch_size=self.batch_size, generator=generator,
                                             sample_weight=sample_weight)
            if optimizer_state is not None:
                optimizer_state.clear()
                optimizer_state.update(optimizer_arrays(optimizer))
            return self.get_parameters(), loss, skipped

    # ------------------------------------------------------------------ protocol: state
    def fitted_state(self):
        """Everything a fitted estimator learned, as arrays and JSON data (no pickle).

        Returns
        -------
        arrays : dict of str to ndarray
            The module's state (``"module.<name>"``: parameters and buffers), the Adam state
            kept for :meth:`partial_fit` (``"optimizer.<param>.<name>"``) and the training
            random streams (``"rng.torch"``, ``"rng.shuffle"``).
        meta : dict
            JSON data: ``classes`` (dtype and values, any label type), ``attributes`` (the
            fitted attributes: ``n_features_in_``, ``history_``, ``best_epoch_``,
            ``n_iter_``...) and the optimizer's hyper-parameters.

        See Also
        --------
        restore_fitted_state, skfedspd.save_estimator
        """
        check_is_fitted(self)
        self.check_fitted_params()
        arrays = {f"module.{k}": v.detach().cpu().numpy() for k, v in self.module_.state_dict().items()}
        meta = {"classes": labels_to_json(self.classes_),
                "attributes": {name: getattr(self, name) for name in self._fitted_attributes() if hasattr(self, name)},
                "optimizer": None}
        if getattr(self, "_optimizer", None) is not None:
            arrays.update({f"optimizer.{k}": v for k, v in optimizer_arrays(self._optimizer).items()})
            meta["optimizer"] = self._optimizer.state_dict()["param_groups"]
            arrays["rng.torch"] = self._rng_state["torch"].numpy()
            arrays["rng.shuffle"] = self._rng_state["shuffle"].numpy()
        return arrays, meta

    def restore_fitted_state(self, arrays, meta):
        """Become the fitted estimator that :meth:`fitted_state` described.

        Called on an unfitted estimator with the same parameters (e.g. rebuilt from its JSON
        spec). Predictions afterwards are bit-identical to the saved estimator's, and
        :meth:`partial_fit` continues with the saved Adam state and random streams.

        Parameters
        ----------
        arrays : dict of str to ndarray
        meta : dict

        Raises
        ------
        ValueError
            If the state does not match the parameters (names, shapes, dtypes) or holds
            unknown attributes; the estimator is then left unchanged.
        """
        with self._atomic():
            self.check_params()
            if not isinstance(meta, dict):
                raise ValueError(f"the fitted state must be a JSON object, got {type(meta).__name__}")
            attributes = meta.get("attributes")
            check_fitted_attributes(attributes, self._fitted_attributes())
            self.classes_ = labels_from_json(meta.get("classes"))
            prefixes = ("module.", "optimizer.", "rng.")
            stray = sorted(k for k in arrays if not k.startswith(prefixes))
            if stray:
                raise ValueError(f"unknown arrays {stray}")
            for name, value in arrays.items():
                if not name.startswith("rng.") and not (value.dtype.kind in "biuf" and np.isfinite(value).all()):
                    raise ValueError(f"array {name!r} is not finite numbers")
            optimizer = meta.get("optimizer")
            if optimizer is not None:
                check_optimizer_settings(optimizer)  # the values; the names against the network's, once built
            for name, value in arrays.items():
                if name.startswith("optimizer."):
                    check_optimizer_array(name, value)
            for name, value in attributes.items():
                setattr(self, name, value)
            module_arrays = {k[7:]: v for k, v in arrays.items() if k.startswith("module.")}
            shapes = self._module_state_shapes()
            if shapes is not None:  # checked before the module is allocated
                check_module_arrays(module_arrays, shapes, f"from n_features_in_={self.n_features_in_} and "
                                                            f"{len(self.classes_)} classes")
            self._check_module_values(module_arrays)
            self.init_module(0)
            for name, value in attributes.items():  # init_module reset the history
                setattr(self, name, value)
            load_module_state(self.module_, module_arrays)
            if optimizer is not None:
                self._restore_session(arrays, optimizer)

    def _check_module_values(self, arrays):
        """Validate the values of a saved module state (names and shapes already checked):
        finite, of magnitude at most :data:`~skfedspd.persistence.MAX_STATE_MAGNITUDE`, running variances >= 0.
        Subclasses add what their network's arrays must be (SPDnet: orthonormal BiMaps)."""
        check_module_values(arrays)

    def _module_state_shapes(self):
        """Name → shape of the module's state for the current parameters and fitted
        attributes, computed without building it; None (default): not known, the module is
        built and compared. :meth:`restore_fitted_state` compares a file's arrays with it
        before allocating anything, so a header cannot request a module larger than the
        file's arrays."""
        return None

    @staticmethod
    def _fitted_attributes():
        """Names of the JSON fitted attributes that :meth:`fitted_state` saves."""
        return ("n_features_in_", "history_", "best_epoch_", "averaged_epochs_", "n_iter_", "validation_used_")

    # ------------------------------------------------------------------ parameters
    _renamed, _merges = EPOCH_RENAMED, EPOCH_MERGES  # the flat names of before, folded by set_params
    _parameter_constraints: dict = {
        "lr": [Interval(Real, 0, np.inf, closed="neither")],
        "batch_size": [Count(1)],
        "max_epochs": [Count(1)],
        "validation_fraction": [Interval(Real, 0, 1, closed="left")],
        "early_stopping": [StrOptions({"auto"}), "boolean"],
        "validation_metric": [StrOptions({"loss", "f1"})],
        "schedule": [None, EpochSchedule],
        "dtype": [StrOptions(set(_DTYPES))],
        "device": [str, torch.device],
        "random_state": ["random_state"],
        "verbose": ["boolean"],
        "warm_start": ["boolean"],
        "class_weight": [StrOptions({"balanced"}), dict, None],
    }

    def set_params(self, **params):
        """Set the parameters (scikit-learn's), the old flat names of
        of the class (``_renamed``: :data:`~skfedspd.renamed.EPOCH_RENAMED` here) included, with a
        ``FutureWarning``.

        Returns
        -------
        self
        """
        params = fold_renamed(self, params, self._renamed, self._merges)
        return super().set_params(**check_nested_params(self, params))

    @property
    def torch_dtype_(self):
        return _DTYPES[self.dtype]

    # ------------------------------------------------------------------ fitting
    @contextmanager
    def _atomic(self):
        """Run a block that changes the estimator; if it raises, put every attribute back."""
        saved = copy.deepcopy(self.__dict__)
        try:
            yield
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise

    def _start_session(self, seed):
        """A fresh Adam optimizer and the random streams (torch's RNG for dropout, the
        shuffling generator) of the epochs to come, seeded by ``seed``."""
        self._optimizer = torch.optim.Adam(self.module_.parameters(), lr=self.lr)
        with seeded_torch(derive_seed(seed, 2)):
            torch_state = torch.get_rng_state()
        shuffle_state = torch.Generator().manual_seed(derive_seed(seed, 3)).get_state()
        self._rng_state = {"torch": torch_state, "shuffle": shuffle_state}

    def _restore_session(self, arrays, param_groups):
        self._start_session(0)
        check_optimizer_settings(param_groups, self._optimizer.state_dict()["param_groups"])
        load_optimizer_arrays(self._optimizer, arrays, param_groups=param_groups, prefix="optimizer.")
        rng = {}
        for name in ("torch", "shuffle"):
            value = arrays.get(f"rng.{name}")
            if value is None or value.dtype != np.uint8 or value.shape != tuple(self._rng_state[name].shape):
                raise ValueError(f"rng.{name} is missing or is not a torch random state")
            rng[name] = torch.from_numpy(value)
        self._rng_state = rng

    @contextmanager
    def _session_rng(self):
        """The session's random streams for one epoch: torch's RNG (dropout) set to the
        session's state, the shuffling generator; both states saved afterwards. The
        caller's torch RNG is left untouched."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._rng_state["torch"])
            generator = torch.Generator()
            generator.set_state(self._rng_state["shuffle"])
            yield generator
            self._rng_state = {"torch": torch.get_rng_state(), "shuffle": generator.get_state()}

    def _train(self, X_train, y_train, X_val, y_val, *, n_epochs, schedule, w_train=None, w_val=None,
               checkpoints=None):
        """The one training loop (``fit``: ``max_epochs`` with the schedule; ``partial_fit``:
        one epoch at ``lr``). Appends one record per epoch to ``history_``, and each epoch's
        parameters to ``checkpoints`` when it is a list.

        Raises RuntimeError when no minibatch of any epoch trained (every one had a
        non-finite loss or gradient): the call would return its starting model as if
        trained; ``fit`` and ``partial_fit`` then leave the estimator as it was."""
        epochs = _progress(range(n_epochs), self.verbose, type(self).__name__)
        n_skipped, trained = 0, False
        for _ in epochs:
            lr = self.lr if schedule is None else schedule.lr
            for group in self._optimizer.param_groups:
                group["lr"] = lr
            with self._session_rng() as generator:
                loss, skipped = train_epochs(self.module_, self._optimizer, X_train, y_train, n_epochs=1,
                                             batch_size=self.batch_size, generator=generator, sample_weight=w_train)
            warn_skipped(skipped, f"epoch {len(self.history_)}")
            n_skipped, trained = n_skipped + skipped, trained or not np.isnan(loss)
            val_loss, val_f1, val_loss_se = evaluate(self.module_, X_val, y_val, w_val, return_se=True)
            self.history_.append({"epoch": len(self.history_), "train_loss": loss, "val_loss": val_loss,
                                  "val_loss_se": val_loss_se, "val_f1": val_f1, "lr": lr, "skipped_batches": skipped})
            if self.verbose:
                epochs.set_postfix(loss=f"{loss:.4f}", val_f1=f"{val_f1:.3f}")
            if checkpoints is not None:
                checkpoints.append(self.module_.get_parameters())
            if schedule is not None and len(y_val):
                schedule.step(val_f1, val_loss, self.module_.state_dict())
                if schedule.should_stop:
                    break
        if not trained:
            raise RuntimeError(f"no minibatch trained: all {n_skipped} had a non-finite loss or gradient, so the "
                               "model would be returned untrained; the estimator is left as it was. Check the input "
                               "scaling and the weights (sample_weight, class_weight), or lower lr")
        self.n_iter_ = len(self.history_)

    def _checkpoint_rule(self, domains):
        """``"best"`` or ``"average"``: what :meth:`fit` keeps of its validated epochs. The
        best epoch here; :class:`~skfedspd.SPDnetClassifier` decides by its ``checkpoint``."""
        return "best"

    def _average_checkpoints(self, checkpoints, first_epoch):
        """Load the average of the epochs whose validation loss is within one standard error
        of the lowest, and return their indices in ``history_``.

        Those epochs cannot be told apart from the best on the validation part; averaging
        them rather than keeping whichever one its noise favoured gives a flatter solution,
        which generalizes better to new domains (Cha et al. 2021). Stiefel weights are
        averaged and projected back by their polar factor (ProjAvg); running statistics
        (``"local"`` arrays) stay the best epoch's. Epochs without a finite validation loss
        are never averaged.
        """
        records = self.history_[first_epoch:]
        finite = [i for i, record in enumerate(records) if np.isfinite(record["val_loss"])]
        if not finite:
            return [self.best_epoch_]
        lowest = min((records[i] for i in finite), key=lambda record: record["val_loss"])
        bound = lowest["val_loss"] + lowest["val_loss_se"]
        chosen = [i for i in finite if records[i]["val_loss"] <= bound]
        kinds = self.module_.parameter_kinds()
        self.module_.set_parameters(projavg([checkpoints[i] for i in chosen], [1 / len(chosen)] * len(chosen), None,
                                            kinds))
        return [first_epoch + i for i in chosen]

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Train on ``(X, y)``; validation split and early stopping only on enough data.

        A fresh Adam optimizer runs up to ``max_epochs`` epochs. When the validation part
        ``round(validation_fraction · n)`` holds at least ``max(50, 2 · n_classes)`` samples
        (:func:`~skfedspd.validation.uses_validation`), that stratified part is held out and its loss drives the
        learning-rate schedule and early stopping (``lr_patience``, ``patience``, in epochs)
        and the best epoch's weights are kept. Otherwise every sample trains for
        ``max_epochs`` at the constant ``lr`` and the last weights are kept
        (``validation_used_`` says which ran). If ``fit`` raises, the estimator is left
        exactly as it was.

        Parameters
        ----------
        X : array-like
            Training inputs (see the class docstring for the expected shape).
        y : array-like of shape (n_samples,)
            Labels of any type (str, int...).
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights: each minibatch's loss is ``Σ w_i l_i / Σ w_i``, and the
            input statistics are weighted alike (integer weights = repeated samples).
            Multiplied by ``class_weight``.

        Returns
        -------
        self
        """
        return self._fit(X, y, sample_weight=sample_weight)

    def _fit(self, X, y, domains=None, sample_weight=None):
        """:meth:`fit`, with the training samples' ``domains`` (:meth:`fit_domains`)."""
        with self._atomic():
            warm = self.warm_start and self.__sklearn_is_fitted__()
            if warm:  # check_inputs(reset=True) runs check_params otherwise
                self.check_params()  # an invalid value: its own error first, then a valid but changed one
                self.check_fitted_params()
            X = self.check_inputs(X, reset=not warm)
            y = check_labels(y, len(X))
            if not warm:
                self.set_classes(y)
            codes = self.encode_labels(y)
            w = training_weights(getattr(self, "class_weight", None), y, sample_weight)
            seed = draw_seed(self.random_state)
            if not warm:
                self.set_input_statistic(self._input_statistic(X, w))
                self.init_module(seed)
            self._start_session(seed)
            # Subclasses without these parameters (third-party protocol estimators) get the defaults.
            self.validation_used_ = uses_validation(len(codes), len(self.classes_), self.validation_fraction,
                                                    getattr(self, "early_stopping", "auto"))
            if self.validation_used_:
                train, val = stratified_split(codes, self.validation_fraction, seed)
            else:
                train, val = np.arange(len(codes)), np.arange(0)
            X_train, X_val = self.module_input(X, train, domains), self.module_input(X, val, domains)
            self._warn_about_input(X_train.X if isinstance(X_train, DomainBatch) else X_train)
            settings = getattr(self, "schedule", None) or EpochSchedule()  # third-party estimators: the defaults
            schedule = settings.plateau(self.lr, validating=len(val) > 0,
                                        monitor=getattr(self, "validation_metric", "loss"))
            first_epoch = len(self.history_)
            w_train, w_val = (None, None) if w is None else (torch.as_tensor(w[train]), torch.as_tensor(w[val]))
            averaging = len(val) > 0 and self._checkpoint_rule(domains) == "average"
            checkpoints = [] if averaging else None
            self._train(X_train, torch.as_tensor(codes[train]), X_val, torch.as_tensor(codes[val]),
                        n_epochs=self.max_epochs, schedule=schedule, w_train=w_train, w_val=w_val,
                        checkpoints=checkpoints)
            if schedule.best_state is not None:
                self.module_.load_state_dict(schedule.best_state)
                self.best_epoch_ = first_epoch + schedule.best_step
            else:
                self.best_epoch_ = len(self.history_) - 1
            self.averaged_epochs_ = ([self.best_epoch_] if not averaging
                                     else self._average_checkpoints(checkpoints, first_epoch))
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One epoch over ``(X, y)`` at learning rate ``lr`` (no validation, no schedule).

        The Adam state and the random streams carry over from the previous ``fit`` or
        ``partial_fit`` call, so training continues where it stopped. If ``partial_fit``
        raises, the estimator is left exactly as it was.

        Parameters
        ----------
        X : array-like
        y : array-like of shape (n_samples,)
        classes : array-like, default=None
            Every label that will ever be seen; required on the first call (when the
            estimator is not fitted yet), and if given later it must be the same.
        sample_weight : array-like of shape (n_samples,), default=None
            As in :meth:`fit` (multiplied by a dict ``class_weight``; ``"balanced"`` needs
            the class counts of all the data and is refused here, as by
            :class:`~sklearn.linear_model.SGDClassifier`).

        Returns
        -------
        self
        """
        with self._atomic():
            first = not self.__sklearn_is_fitted__()
            if first and classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit")
            if not first and classes is not None and not np.array_equal(np.unique(classes), self.classes_):
                raise ValueError(f"classes={np.unique(classes).tolist()} differs from the classes of the "
                                 f"previous calls, {self.classes_.tolist()}")
            if not first:
                self.check_params()
            X = self.check_inputs(X, reset=first)
            if first:
                self.set_classes(classes)
            codes = self.encode_labels(y, len(X))
            if getattr(self, "class_weight", None) == "balanced":
                raise ValueError("class_weight='balanced' is not supported by partial_fit (it needs the class "
                                 "counts of all the data): pass a dict of class weights, or sample_weight")
            w = training_weights(getattr(self, "class_weight", None), np.asarray(y), sample_weight, all_data=False)
            if first:
                seed = draw_seed(self.random_state)
                self.set_input_statistic(self._input_statistic(X, w))
                self.init_module(seed)
                self.validation_used_ = False
            if getattr(self, "_optimizer", None) is None:  # first call, or after init_module
                self._start_session(draw_seed(self.random_state))
            X_train = self.to_tensor(X)
            if first:
                self._warn_about_input(X_train)
            y_train = torch.as_tensor(codes)
            self._train(X_train, y_train, X_train[:0], y_train[:0], n_epochs=1, schedule=None,
                        w_train=None if w is None else torch.as_tensor(w))
            self.best_epoch_ = len(self.history_) - 1
            self.averaged_epochs_ = [self.best_epoch_]
        return self

    @property
    def n_epochs_(self):
        """Deprecated alias of ``n_iter_`` (epochs run), removed in 0.4."""
        warnings.warn("n_epochs_ is deprecated and will be removed in 0.4: use n_iter_", FutureWarning, stacklevel=2)
        return self.n_iter_

    # ------------------------------------------------------------------ prediction
    def __sklearn_is_fitted__(self):
        return hasattr(self, "module_")

    def _logits(self, X):
        check_is_fitted(self)
        X = self.check_inputs(X, reset=False)
        return predict_logits(self.module_, self.to_tensor(X)).cpu().numpy()

    def decision_function(self, X):
        """Class scores: logits of shape ``(n_samples, n_classes)``; for two classes, as
        scikit-learn expects, the 1-D score of ``classes_[1]`` (logit difference)."""
        return decision_from_logits(self._logits(X))

    def predict_proba(self, X):
        """Softmax class probabilities, columns ordered as ``classes_``."""
        return proba_from_logits(self._logits(X))

    def predict(self, X):
        """Most probable class label for each sample."""
        logits = self._logits(X)  # first: an unfitted model raises NotFittedError
        return self.classes_[np.argmax(logits, axis=1)]

    # ------------------------------------------------------------------ helpers
    def _input_statistic(self, X, sample_weight):
        if sample_weight is None:  # subclasses whose statistic ignores weights may omit the argument
            return self.input_statistic(X)
        return self.input_statistic(X, sample_weight=sample_weight)

    def _warn_about_input(self, Xt):
        """Subclass hook: warn about inputs that will train badly."""

    def fit_domains(self, groups, n_samples):
        """Subclass hook: the per-sample domain codes that the module trains with, from the
        ``groups`` of a fit (centralized, or one federated client's), or None (default: the
        module takes no domains).

        Parameters
        ----------
        groups : array-like of shape (n_samples,) or None
        n_samples : int

        Returns
        -------
        ndarray of int of shape (n_samples,) or None
        """
        return None

    def module_input(self, X, rows, domains=None):
        """The module's input for the samples ``rows`` of the validated ``X``: their tensor
        (:meth:`to_tensor`), carrying their domain codes when ``domains`` (from
        :meth:`fit_domains`) is given. The centralized fit and every federated client
        (local and Flower) build their training data here.

        Parameters
        ----------
        X : ndarray
        rows : array of int
        domains : ndarray of int of shape (len(X),) or None

        Returns
        -------
        torch.Tensor or skfedspd.batchnorm.DomainBatch
        """
        Xt = self.to_tensor(X[rows])
        return Xt if domains is None else DomainBatch(Xt, np.asarray(domains)[rows])

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        tags.non_deterministic = False
        return tags


def decision_from_logits(logits):
    """scikit-learn's ``decision_function`` from logits: the logit difference of
    ``classes_[1]`` and ``classes_[0]`` for two classes, the logits otherwise."""
    return logits[:, 1] - logits[:, 0] if logits.shape[1] == 2 else logits


def proba_from_logits(logits):
    """Softmax probabilities of a logits array (rows)."""
    scores = logits - logits.max(axis=1, keepdims=True)
    proba = np.exp(scores)
    return proba / proba.sum(axis=1, keepdims=True)


