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
    """A parameter's value in a form that ``==`` compares safely."""
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
    """A tensor sharing a writable numpy array's memory, or a copy of a read-only one."""
    if isinstance(a, DomainBatch):
        return a.with_inputs(_as_tensor(a.X))
    if not isinstance(a, np.ndarray):
        return a
    return torch.from_numpy(a) if a.flags.writeable else torch.tensor(a)


class TorchClassifierBase(ClassifierMixin, BaseEstimator):
    """Base for torch classifiers trained by :func:`skfedspd.training.train_epochs`.

    It implements the local-estimator protocol (``docs/guide/protocol.md``). Subclasses provide
    ``_check_array(X, reset)``, :meth:`input_statistic`, :meth:`set_input_statistic`,
    :meth:`to_tensor` and ``_build_module(seed)``.

    Examples
    --------
    What a federated client does: set up from its data, then one round's :meth:`local_update`.

    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=20, n_channels=4, n_classes=2, seed=0)
    >>> clf = SPDnetClassifier(random_state=0)
    >>> X = clf.check_inputs(X, reset=True)
    >>> clf.set_classes(y)
    >>> clf.set_input_statistic(clf.input_statistic(X))
    >>> clf.init_module(seed=0)
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
        reset : bool
            True at the start of a fit: the hyper-parameters are validated and
            ``n_features_in_`` is set. False: ``X`` must match the fitted shape.

        Returns
        -------
        X : ndarray of float64
        """
        if reset:
            self.check_params()
        else:
            self.check_fitted_params()
        return self._check_array(X, reset)

    def check_params(self):
        """Validate the hyper-parameters (scikit-learn's ``_parameter_constraints``)."""
        self._validate_params()
        check_device(self.device)
        for value in self.get_params(deep=False).values():
            if isinstance(value, Settings):  # a settings object checks its own parameters
                value.check_params()

    def set_classes(self, classes):
        """Set ``classes_`` to the sorted unique labels of ``classes`` (at least two).

        Parameters
        ----------
        classes : array-like of shape (n_labels,)
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
        """Integer codes of the labels ``y`` into ``classes_``.

        Parameters
        ----------
        y : array-like of shape (n_samples,)
        n_samples : int or None
            When given, ``y`` must have this many labels.

        Returns
        -------
        codes : ndarray of int64 of shape (n_samples,)
        """
        y = check_labels(y, n_samples)
        unseen = np.setdiff1d(np.unique(y), self.classes_)
        if len(unseen):
            raise ValueError(f"y contains labels not in classes: {unseen.tolist()}")
        return np.searchsorted(self.classes_, y).astype(np.int64)

    def input_statistic(self, X, sample_weight=None):
        """A scalar statistic of the training inputs, additive over samples, or None; the server
        pools the clients' by a weighted mean.

        Parameters
        ----------
        X : ndarray
        sample_weight : ndarray or None

        Returns
        -------
        float or None
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

        Returns
        -------
        torch.Tensor
        """
        raise NotImplementedError

    # ------------------------------------------------------------------ protocol: model
    def init_module(self, seed):
        """Build a fresh ``module_`` from ``n_features_in_`` and ``classes_``; the same ``seed``
        gives the same weights.

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
        """Refuse (ValueError) a fitted model whose ``fitted_params_`` were changed since ``fit``."""
        for name, fitted in getattr(self, "fitted_params_", {}).items():
            current = getattr(self, name, None)
            if _comparable(current) != _comparable(fitted):
                raise ValueError(f"{name}={current!r} is not the {name}={fitted!r} this model was fitted with (its "
                                 f"network and input transform are built for it): refit with fit(), or set it back "
                                 f"with set_params({name}={fitted!r})")

    def get_parameters(self):
        """The module's exported state as named numpy copies (keys of :meth:`parameter_kinds`).

        Returns
        -------
        dict of str to ndarray
        """
        return self.module_.get_parameters()

    def set_parameters(self, arrays):
        """Load named arrays (any subset of :meth:`parameter_kinds`) into the module.

        Parameters
        ----------
        arrays : dict of str to ndarray
        """
        self.module_.set_parameters(arrays)

    def parameter_kinds(self):
        """How the server treats each exported array.

        Returns
        -------
        dict of str to str
            ``"stiefel"``, ``"euclidean"`` or ``"local"`` (kept on each client).
        """
        return self.module_.parameter_kinds()

    def federation_traits(self):
        """What the federation needs to know of this model (:class:`~skfedspd.protocol.FederationTraits`)."""
        params = self.get_params(deep=False)
        return FederationTraits(class_weight=params.get("class_weight"),
                                early_stopping=params.get("early_stopping", True), lr=self.lr,
                                batch_size=self.batch_size)

    def federated_params(self, *, init=None, private=False):
        """The parameters a federated fit sets on its clone of this model (here: none)."""
        return {}

    def validation_scores(self, X, y, sample_weight=None):
        """``(loss, macro-F1)`` of the network on ``X`` and the label codes ``y``."""
        return evaluate(self.module_, X, y, sample_weight)

    def n_trainable_parameters(self):
        """The number of values that train (the dimension of DP-SGD's noise)."""
        return int(sum(p.numel() for p in self.module_.parameters() if p.requires_grad))

    def without_class_weight(self):
        """An unfitted clone with ``class_weight=None`` (for sites whose sample weights hold them)."""
        est = clone(self)
        if "class_weight" in est.get_params(deep=False):
            est.set_params(class_weight=None)
        return est

    def check_optimizer_state(self, arrays):
        """Raise a ValueError when ``arrays`` (an Adam state) does not fit the network."""
        load_optimizer_arrays(torch.optim.Adam(self.module_.parameters()), arrays)

    def local_update(self, global_params, local_state, X, y, *, lr, n_epochs, seed, n_threads=None, dp=None,
                     sample_weight=None, optimizer_state=None):
        """One client's work in a federated round: load ``global_params`` (then ``local_state``) and
        run ``n_epochs`` epochs of Adam at ``lr`` under ``seed`` (with ``dp``, DP-SGD:
        :func:`~skfedspd.dp_sgd.dp_train_epochs`), on the client's tensors ``X`` and label codes
        ``y``, weighted by ``sample_weight``. ``optimizer_state`` (a dict) is resumed and replaced
        in place; None: a fresh Adam.

        Returns
        -------
        params : dict of str to ndarray
        mean_loss : float
            Weighted mean training loss (NaN with ``dp`` or if every batch was skipped).
        n_skipped : int
            Batches skipped for a non-finite loss or gradient.
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
        meta : dict
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
        """Become the fitted estimator that :meth:`fitted_state` described (checked first).

        Parameters
        ----------
        arrays : dict of str to ndarray
        meta : dict
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
        """Validate the values of a saved module state (finite, bounded); subclasses add theirs."""
        check_module_values(arrays)

    def _module_state_shapes(self):
        """Name → shape of the module's state, without building it; None: not known."""
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
        """Set the parameters, the old flat names of ``_renamed`` included (``FutureWarning``).

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
        """A fresh Adam optimizer and the seeded random streams of the epochs to come."""
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
        """The session's random streams for one epoch (the caller's torch RNG untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._rng_state["torch"])
            generator = torch.Generator()
            generator.set_state(self._rng_state["shuffle"])
            yield generator
            self._rng_state = {"torch": torch.get_rng_state(), "shuffle": generator.get_state()}

    def _train(self, X_train, y_train, X_val, y_val, *, n_epochs, schedule, w_train=None, w_val=None,
               checkpoints=None):
        """The one training loop; raises RuntimeError when no minibatch of any epoch trained."""
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
        """``"best"`` or ``"average"``: what :meth:`fit` keeps of its validated epochs."""
        return "best"

    def _average_checkpoints(self, checkpoints, first_epoch):
        """Load the average of the epochs within one standard error of the lowest validation loss
        (Stiefel weights projected back); return their indices.
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
        """Train on ``(X, y)``; a validation split only on enough data
        (:func:`~skfedspd.validation.uses_validation`). If ``fit`` raises, the estimator is left
        as it was.

        Parameters
        ----------
        X : array-like
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the loss, multiplied by ``class_weight``.

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
        """One epoch over ``(X, y)`` at learning rate ``lr``; the Adam state carries over.

        Parameters
        ----------
        X : array-like
        y : array-like of shape (n_samples,)
        classes : array-like, default=None
            Every label that will be seen; required on the first call.
        sample_weight : array-like of shape (n_samples,), default=None

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
        """Class scores (for two classes, the 1-D score of ``classes_[1]``)."""
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
        """Subclass hook: per-sample domain codes from ``groups``, or None.

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
        """The module's input for the samples ``rows`` of ``X``, with their domain codes if given.

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
    """scikit-learn's ``decision_function`` from logits."""
    return logits[:, 1] - logits[:, 0] if logits.shape[1] == 2 else logits


def proba_from_logits(logits):
    """Softmax probabilities of a logits array (rows)."""
    scores = logits - logits.max(axis=1, keepdims=True)
    proba = np.exp(scores)
    return proba / proba.sum(axis=1, keepdims=True)


