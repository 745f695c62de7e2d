"""Shared scikit-learn machinery for the torch classifiers (SPDnet, EEGNet).

Subclasses define how inputs are validated and turned into tensors and which module is
built; fitting, the validation split, the schedule, prediction, and persistence live here
once, on top of :mod:`skfedspd.training`.
"""

import numbers

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.model_selection import train_test_split
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, check_random_state, column_or_1d

from .training import (
    PlateauSchedule,
    derive_seed,
    evaluate,
    predict_logits,
    seeded_torch,
    torch_threads,
    train_epochs,
    warn_skipped,
)

__all__ = ["TorchClassifierBase"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _progress(iterable, enabled, desc):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, leave=False)


def stratified_split(y, fraction, seed):
    """Indices ``(train, validation)``, stratified when every class allows it.

    The validation part gets ``round(fraction * n)`` samples (at least one per class when
    stratified). Too few samples for a validation part at all → it is empty.
    """
    n = len(y)
    idx = np.arange(n)
    n_val = int(round(fraction * n))
    if fraction <= 0 or n_val < 1 or n - n_val < 1:
        return idx, idx[:0]
    _, counts = np.unique(y, return_counts=True)
    stratify = y if counts.min() >= 2 and n_val >= len(counts) and n - n_val >= len(counts) else None
    train, val = train_test_split(idx, test_size=n_val, stratify=stratify, random_state=seed % (2**32))
    return np.sort(train), np.sort(val)


def _check_labels(y, n_samples):
    """``y`` as a 1-D array of classification targets, of length ``n_samples`` if given."""
    y = column_or_1d(np.asarray(y), warn=True)
    if n_samples is not None and len(y) != n_samples:
        raise ValueError(f"X has {n_samples} samples but y has {len(y)} labels")
    check_classification_targets(y)
    return y


def _as_tensor(a):
    """A tensor sharing a writable numpy array's memory, or a copy of a read-only one (joblib
    memory-maps): torch has no read-only tensors. Tensors pass through."""
    if not isinstance(a, np.ndarray):
        return a
    return torch.from_numpy(a) if a.flags.writeable else torch.tensor(a)


class TorchClassifierBase(ClassifierMixin, BaseEstimator):
    """Base for torch classifiers trained by :func:`skfedspd.training.train_epochs`.

    It implements the local-estimator protocol (``docs/protocol.md``): the public methods
    that the federated meta-estimator, the engine and the Flower apps call, and nothing
    else. Subclasses provide ``_check_array(X, reset)`` (a validated float64 array; with
    ``reset`` it records ``n_features_in_``), :meth:`input_statistic`,
    :meth:`set_input_statistic`, :meth:`to_tensor` and ``_build_module(seed)``.
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
        return self._check_array(X, reset)

    def check_params(self):
        """Validate the hyper-parameters.

        Raises
        ------
        ValueError
            Naming the parameter, its value and what is allowed.
        """
        self._check_common_params()

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
        y = _check_labels(y, n_samples)
        unseen = np.setdiff1d(np.unique(y), self.classes_)
        if len(unseen):
            raise ValueError(f"y contains labels not in classes: {unseen.tolist()}")
        return np.searchsorted(self.classes_, y).astype(np.int64)

    def input_statistic(self, X):
        """A scalar statistic of the training inputs, additive over samples, or None.

        Federated clients each compute it on their training part; the server pools them by
        a weighted mean (weights: training sizes), which is exactly the statistic of the
        pooled data, and calls :meth:`set_input_statistic` with it.

        Parameters
        ----------
        X : ndarray
            Inputs validated by :meth:`check_inputs`.

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
        self.history_ = []

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

    def local_update(self, global_params, local_state, X, y, *, lr, n_epochs, seed, n_threads=None):
        """One client's work in a federated round: the one local-training routine.

        Loads the broadcast ``global_params`` (then the client's own ``local_state``),
        creates a fresh Adam optimizer with learning rate ``lr`` and runs ``n_epochs``
        epochs of :func:`~skfedspd.training.train_epochs` (minibatches of ``batch_size``)
        under ``seed``. Torch's global RNG and grad mode do not matter and are left as they
        were.

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

        Returns
        -------
        params : dict of str to ndarray
            :meth:`get_parameters` after training (``"local"`` arrays included).
        mean_loss : float
            Sample-weighted mean training loss (NaN if every batch was skipped).
        n_skipped : int
            Batches skipped for a non-finite loss or gradient.
        """
        X, y = _as_tensor(X), _as_tensor(y)
        with torch_threads(n_threads), seeded_torch(seed):
            self.set_parameters(global_params)
            if local_state:
                self.set_parameters(local_state)
            generator = torch.Generator().manual_seed(seed)
            optimizer = torch.optim.Adam(self.module_.parameters(), lr=lr)
            loss, skipped = train_epochs(self.module_, optimizer, X, y, n_epochs=n_epochs,
                                         batch_size=self.batch_size, generator=generator)
            return self.get_parameters(), loss, skipped

    # ------------------------------------------------------------------ parameters
    # Parameter names shared by every subclass's __init__ (numpydoc in the subclasses).
    def _check_common_params(self):
        for name in ("lr", "validation_fraction"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or not np.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction!r}")
        for name in ("batch_size", "max_epochs"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    @property
    def torch_dtype_(self):
        return _DTYPES[self.dtype]

    # ------------------------------------------------------------------ fitting
    def _seed(self):
        return int(check_random_state(self.random_state).randint(0, 2**31 - 1))

    def _initialize(self, X, seed):
        """Fit the input transform and build a fresh module."""
        self.set_input_statistic(self.input_statistic(X))
        self.init_module(seed)

    def fit(self, X, y):
        """Train on ``(X, y)`` with a stratified validation split and early stopping.

        Parameters
        ----------
        X : array-like
            Training inputs (see the class docstring for the expected shape).
        y : array-like of shape (n_samples,)
            Labels of any type (str, int...).

        Returns
        -------
        self
        """
        return self._fit(X, y)

    def _fit(self, X, y, groups=None):
        """:meth:`fit`, with the training samples' ``groups`` for :meth:`_module_input`."""
        X = self.check_inputs(X, reset=True)
        y = _check_labels(y, len(X))
        self.set_classes(y)
        codes = self.encode_labels(y)
        seed = self._seed()
        if not (self.warm_start and self.__sklearn_is_fitted__()):
            self._initialize(X, seed)
        train, val = stratified_split(codes, self.validation_fraction, seed)
        Xt, yt = self.to_tensor(X[train]), torch.as_tensor(codes[train])
        Xv, yv = self.to_tensor(X[val]), torch.as_tensor(codes[val])
        self._warn_about_input(Xt)
        if groups is not None:
            Xt, Xv = self._module_input(Xt, groups, train), self._module_input(Xv, groups, val)

        schedule = PlateauSchedule(self.lr, patience=self.patience if len(val) else None,
                                   lr_patience=self.lr_patience, lr_factor=self.lr_factor)
        with seeded_torch(derive_seed(seed, 2)):
            generator = torch.Generator().manual_seed(derive_seed(seed, 3))
            optimizer = torch.optim.Adam(self.module_.parameters(), lr=self.lr)
            epochs = _progress(range(self.max_epochs), self.verbose, type(self).__name__)
            for epoch in epochs:
                for group in optimizer.param_groups:
                    group["lr"] = schedule.lr
                record = self._train_one_epoch(optimizer, Xt, yt, generator, Xv, yv, schedule.lr)
                if len(val):
                    schedule.step(record["val_f1"], record["val_loss"], self.module_.state_dict())
                if self.verbose:
                    epochs.set_postfix(loss=f"{record['train_loss']:.4f}", val_f1=f"{record['val_f1']:.3f}")
                if schedule.should_stop:
                    break
        if schedule.best_state is not None:
            self.module_.load_state_dict(schedule.best_state)
            self.best_epoch_ = schedule.best_step
        else:
            self.best_epoch_ = len(self.history_) - 1
        self.n_epochs_ = len(self.history_)
        return self

    def _train_one_epoch(self, optimizer, Xt, yt, generator, Xv, yv, lr):
        loss, skipped = train_epochs(self.module_, optimizer, Xt, yt, n_epochs=1,
                                     batch_size=self.batch_size, generator=generator)
        warn_skipped(skipped, f"epoch {len(self.history_)}")
        val_loss, val_f1 = evaluate(self.module_, Xv, yv)
        record = {"epoch": len(self.history_), "train_loss": loss, "val_loss": val_loss,
                  "val_f1": val_f1, "lr": lr, "skipped_batches": skipped}
        self.history_.append(record)
        return record

    def partial_fit(self, X, y, classes=None):
        """One epoch over ``(X, y)`` (no validation split, no early stopping).

        ``classes`` (all labels that will ever be seen) is required on the first call.
        The Adam state persists across calls.
        """
        first = not self.__sklearn_is_fitted__()
        if first and classes is None:
            raise ValueError("classes must be passed on the first call to partial_fit")
        if not first:
            self.check_params()
        X = self.check_inputs(X, reset=first)
        if first:
            self.set_classes(classes)
            codes = self.encode_labels(y, len(X))
            self._partial_seed = self._seed()
            self._initialize(X, self._partial_seed)
        else:
            codes = self.encode_labels(y, len(X))
        if not hasattr(self, "_partial_seed"):  # fitted by fit(): first partial_fit call
            self._partial_seed = self._seed()
        optimizer = getattr(self, "_partial_optimizer", None)
        if optimizer is None or any(  # none yet, or one of a module replaced by fit()
            a is not b for a, b in zip(optimizer.param_groups[0]["params"], self.module_.parameters())
        ):
            self._partial_optimizer = torch.optim.Adam(self.module_.parameters(), lr=self.lr)
        call = len(self.history_)
        with seeded_torch(derive_seed(self._partial_seed, 4, call)):
            generator = torch.Generator().manual_seed(derive_seed(self._partial_seed, 5, call))
            Xt, yt = self.to_tensor(X), torch.as_tensor(codes)
            if first:
                self._warn_about_input(Xt)
            self._train_one_epoch(self._partial_optimizer, Xt, yt, generator, Xt[:0], yt[:0], self.lr)
        return self

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
        logits = self._logits(X)
        return logits[:, 1] - logits[:, 0] if logits.shape[1] == 2 else logits

    def predict_proba(self, X):
        """Softmax class probabilities, columns ordered as ``classes_``."""
        scores = self._logits(X)
        scores = scores - scores.max(axis=1, keepdims=True)
        proba = np.exp(scores)
        return proba / proba.sum(axis=1, keepdims=True)

    def predict(self, X):
        """Most probable class label for each sample."""
        logits = self._logits(X)  # first: an unfitted model raises NotFittedError
        return self.classes_[np.argmax(logits, axis=1)]

    # ------------------------------------------------------------------ helpers
    def _warn_about_input(self, Xt):
        """Subclass hook: warn about inputs that will train badly."""

    def _module_input(self, Xt, groups, rows):
        """Subclass hook: the module's input for the tensor ``Xt`` of samples ``rows`` of a
        fit whose samples have ``groups`` (default: ``Xt``, groups unused)."""
        return Xt

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        tags.non_deterministic = False
        return tags
