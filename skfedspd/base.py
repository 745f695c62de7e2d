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


class TorchClassifierBase(ClassifierMixin, BaseEstimator):
    """Base for torch classifiers trained by :func:`skfedspd.training.train_epochs`.

    Subclasses implement ``_validate_X(X, reset)`` (returns a float64 array),
    ``_input_statistic(X)`` / ``_set_input_statistic(value)`` (a scalar fitted on the
    training inputs, additive over samples so that federated clients can combine it by a
    weighted mean; None when there is none), ``_to_tensor(X)`` and ``_build_module(seed)``.
    """

    def _fit_input_transform(self, X):
        self._set_input_statistic(self._input_statistic(X))

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

    # ------------------------------------------------------------------ targets
    def _encode_targets(self, y, n_samples, classes=None):
        y = column_or_1d(np.asarray(y), warn=True)
        if len(y) != n_samples:
            raise ValueError(f"X has {n_samples} samples but y has {len(y)} labels")
        check_classification_targets(y)
        if classes is not None:
            self.classes_ = np.unique(np.asarray(classes))
            unseen = np.setdiff1d(np.unique(y), self.classes_)
            if len(unseen):
                raise ValueError(f"y contains labels not in classes: {unseen.tolist()}")
        else:
            self.classes_ = np.unique(y)
        return np.searchsorted(self.classes_, y)

    def _require_two_classes(self):
        if len(self.classes_) < 2:
            raise ValueError(
                f"The number of classes has to be greater than one; got {len(self.classes_)} class "
                f"({self.classes_.tolist()})"
            )

    # ------------------------------------------------------------------ fitting
    def _seed(self):
        return int(check_random_state(self.random_state).randint(0, 2**31 - 1))

    def _initialize(self, X, seed):
        """Fit the input transform and build a fresh module."""
        self._fit_input_transform(X)
        self._init_module(seed)

    def _init_module(self, seed):
        """Build a fresh module under a seeded RNG; reset the history."""
        with seeded_torch(derive_seed(seed, 0)):
            self.module_ = self._build_module(derive_seed(seed, 1)).to(self.device)
        self.history_ = []

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
        self._check_common_params()
        X = self._validate_X(X, reset=True)
        codes = self._encode_targets(y, len(X))
        self._require_two_classes()
        seed = self._seed()
        if not (self.warm_start and self.__sklearn_is_fitted__()):
            self._initialize(X, seed)
        train, val = stratified_split(codes, self.validation_fraction, seed)
        Xt, yt = self._to_tensor(X[train]), torch.as_tensor(codes[train])
        Xv, yv = self._to_tensor(X[val]), torch.as_tensor(codes[val])
        self._warn_about_input(Xt)

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
        self._check_common_params()
        first = not self.__sklearn_is_fitted__()
        if first and classes is None:
            raise ValueError("classes must be passed on the first call to partial_fit")
        X = self._validate_X(X, reset=first)
        if first:
            codes = self._encode_targets(y, len(X), classes=classes)
            self._require_two_classes()
            self._partial_seed = self._seed()
            self._initialize(X, self._partial_seed)
        else:
            known = self.classes_
            codes = self._encode_targets(y, len(X), classes=known)
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
            Xt, yt = self._to_tensor(X), torch.as_tensor(codes)
            if first:
                self._warn_about_input(Xt)
            self._train_one_epoch(self._partial_optimizer, Xt, yt, generator, Xt[:0], yt[:0], self.lr)
        return self

    # ------------------------------------------------------------------ prediction
    def __sklearn_is_fitted__(self):
        return hasattr(self, "module_")

    def _logits(self, X):
        check_is_fitted(self)
        X = self._validate_X(X, reset=False)
        return predict_logits(self.module_, self._to_tensor(X)).cpu().numpy()

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

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        tags.non_deterministic = False
        return tags
