"""The checks of what enters the package: parameters, inputs, labels, groups and weights.

The estimators, :class:`~skfedspd.Recenter`, the federation and the sites import them from
here, so that a value is refused with the same message wherever it enters. A count is an
int and never a bool (:func:`is_count`, :class:`Count`), unlike scikit-learn's
``Interval(Integral, ...)``.
"""

import math
import warnings
from collections.abc import Mapping
from numbers import Integral, Real

import numpy as np
import torch
from scipy.linalg.lapack import dpocon
from sklearn.model_selection import train_test_split
from sklearn.utils._param_validation import HasMethods, Interval
from sklearn.utils.class_weight import compute_sample_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import column_or_1d

__all__ = ["is_count", "check_count", "is_positive", "check_positive", "Count", "Sequence", "check_device",
           "uses_validation", "check_sample_weight", "check_class_weight", "training_weights", "check_label_values",
           "check_groups", "check_domain_sizes", "resolve_groups", "check_nested_params", "MIN_VALIDATION_SAMPLES",
           "check_spd_batch", "spectral_summary", "input_range", "check_input_range", "check_training_spread",
           "TRAINING_SCALE_SPREAD", "INPUT_RANGE_MARGIN"]


def is_count(value, minimum=0):
    """Whether ``value`` is an int (Python or numpy, never a bool) ``>= minimum`` (None: any int).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.validation import is_count
    >>> is_count(np.int64(2), 1), is_count(True), is_count(1.0), is_count(-1, minimum=None)
    (True, False, False, True)
    """
    return (isinstance(value, Integral) and not isinstance(value, (bool, np.bool_))
            and (minimum is None or bool(value >= minimum)))


def check_count(value, name, minimum=0):
    """``value`` as an int, or a ValueError naming ``name`` if it is no count ``>= minimum``.

    Examples
    --------
    >>> from skfedspd.validation import check_count
    >>> check_count(3, "n_sites", 1)
    3
    """
    if not is_count(value, minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{name} must be an int{bound} (not a bool), got {value!r}")
    return int(value)


def is_positive(value, allow_zero=False):
    """Whether ``value`` is a finite real number > 0 (>= 0 with ``allow_zero``), never a bool.

    Examples
    --------
    >>> from skfedspd.validation import is_positive
    >>> is_positive(0.5), is_positive(True), is_positive(float("nan")), is_positive(0, allow_zero=True)
    (True, False, False, True)
    """
    return (isinstance(value, Real) and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)
            and bool(value >= 0 if allow_zero else value > 0))


def check_positive(value, name, allow_zero=False):
    """``value`` as a float, or a ValueError naming ``name`` if it is not :func:`is_positive`.

    Examples
    --------
    >>> from skfedspd.validation import check_positive
    >>> check_positive(2, "round_timeout")
    2.0
    """
    if not is_positive(value, allow_zero):
        raise ValueError(f"{name} must be a finite {'non-negative' if allow_zero else 'positive'} number (not a bool), "
                         f"got {value!r}")
    return float(value)


class Count(Interval):
    """A ``_parameter_constraints`` entry: an int in ``[left, right]``, never a bool.

    Examples
    --------
    >>> from skfedspd.validation import Count
    >>> Count(1).is_satisfied_by(True), str(Count(1))
    (False, 'an int (not a bool) in the range [1, inf)')
    """

    def __init__(self, left=1, right=None):
        closed = {(True, True): "both", (True, False): "left", (False, True): "right", (False, False): "neither"}
        super().__init__(Integral, left, right, closed=closed[left is not None, right is not None])

    def is_satisfied_by(self, val):
        return is_count(val, None) and super().is_satisfied_by(val)

    def __str__(self):
        return super().__str__().replace("an int", "an int (not a bool)", 1)


class Sequence(HasMethods):
    """A ``_parameter_constraints`` entry for a tuple: a list, tuple or array, never a mapping,
    a set or a string.

    Examples
    --------
    >>> from skfedspd.validation import Sequence
    >>> [Sequence().is_satisfied_by(v) for v in ((4, 2), [4], {4: "x"}, {4}, "42")]
    [True, True, False, False, False]
    """

    def __init__(self):
        super().__init__(["__len__", "__getitem__"])

    def is_satisfied_by(self, val):
        return (not isinstance(val, (Mapping, str, bytes)) and getattr(val, "ndim", 1) != 0
                and super().is_satisfied_by(val))

    def __str__(self):
        return "a sequence (a list, tuple or array; not a dict, set or string)"


def check_device(device, name="device"):
    """Refuse (ValueError) a torch ``device`` that cannot hold a model on this machine.

    Examples
    --------
    >>> from skfedspd.validation import check_device
    >>> check_device("cpu")
    """
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as error:
        raise ValueError(f"{name}={device!r} is not a torch device ({error})") from None
    if parsed.type == "cpu":
        return
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (parsed.index or 0) >= count:
            raise ValueError(f"{name}={device!r} is not available: this machine has {count} CUDA device(s); "
                             "use 'cpu' or an available device")
        return
    if parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"{name}={device!r} is not available on this machine; use 'cpu'")
        return
    raise ValueError(f"{name}={device!r} cannot hold a model: use 'cpu', 'cuda[:index]' (when this machine has one) "
                     "or 'mps'")


#: Smallest validation part that ``fit`` holds out (see :func:`uses_validation`).
MIN_VALIDATION_SAMPLES = 50


def uses_validation(n_samples, n_classes, fraction, early_stopping="auto"):
    """Whether ``fit`` holds out a validation part: ``round(fraction · n) ≥ max(50, 2 · n_classes)``
    under ``early_stopping="auto"``; with ``True`` / ``False``, whenever ``fraction > 0`` / never.
    Why: ``docs/design-decisions.md``.

    Examples
    --------
    >>> from skfedspd.validation import uses_validation
    >>> uses_validation(144, 4, 0.1), uses_validation(500, 4, 0.1), uses_validation(144, 4, 0.1, early_stopping=True)
    (False, True, True)
    """
    if early_stopping != "auto":
        return fraction > 0 and bool(early_stopping)
    n_val = int(round(fraction * n_samples))
    return fraction > 0 and n_val >= max(MIN_VALIDATION_SAMPLES, 2 * n_classes)


def check_sample_weight(sample_weight, n_samples, *, scalar=True, name="sample_weight"):
    """``sample_weight`` as a float64 array of ``n_samples`` non-negative finite weights with a
    finite positive sum (a scalar: the same weight for every sample, unless ``scalar=False``),
    or None.

    Examples
    --------
    >>> from skfedspd.validation import check_sample_weight
    >>> check_sample_weight(2, 3)
    array([2., 2., 2.])
    """
    if sample_weight is None:
        return None
    try:
        w = np.asarray(sample_weight, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be numbers: {error}") from None
    if w.ndim == 0 and scalar:
        w = np.full(n_samples, float(w))
    if w.shape != (n_samples,):
        raise ValueError(f"{name} must be a 1-D array of {n_samples} weights (one per sample), "
                         f"got shape {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError(f"{name} contains NaN or infinity (first at sample {int(np.argmin(np.isfinite(w)))})")
    if (w < 0).any():
        raise ValueError(f"{name} contains negative weights (first at sample {int(np.argmax(w < 0))})")
    with np.errstate(over="ignore"):
        total = w.sum()
    if not total > 0:
        raise ValueError(f"{name} sums to 0: there is nothing to learn from")
    if not np.isfinite(total) or total < np.finfo(np.float64).tiny:
        raise ValueError(f"{name} sums to {total:.3g}, {'beyond' if total > 1 else 'below'} the normal float64 "
                         f"range: the weighted loss would be NaN and nothing would train; only the weights' ratios "
                         "matter, rescale them (e.g. divide by their mean)")
    return w


def check_class_weight(class_weight):
    """Validate a dict ``class_weight`` (finite non-negative weights); ``"balanced"`` and None pass.

    Examples
    --------
    >>> from skfedspd.validation import check_class_weight
    >>> check_class_weight({0: -1.0, 1: 1.0})
    Traceback (most recent call last):
    ...
    ValueError: class_weight of class 0 must be a finite number >= 0, got -1.0
    """
    if not isinstance(class_weight, dict):
        return class_weight
    for label, weight in class_weight.items():
        if (isinstance(weight, (bool, np.bool_)) or not isinstance(weight, (Real, np.number))
                or not np.isfinite(weight) or weight < 0):
            raise ValueError(f"class_weight of class {label!r} must be a finite number >= 0, got {weight!r}")
    return class_weight


def training_weights(class_weight, y, sample_weight, *, all_data=True):
    """Per-sample training weights: ``sample_weight`` times the weight of each sample's class
    under ``class_weight``; None when both are None.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.validation import training_weights
    >>> training_weights({"a": 1.0, "b": 3.0}, np.array(["a", "a", "a", "b"]), [1, 1, 0, 1])
    array([1., 1., 0., 3.])
    """
    w = check_sample_weight(sample_weight, len(y))
    name = "sample_weight"
    if class_weight is not None:
        per_class = compute_sample_weight(check_class_weight(class_weight), y)
        name = "class_weight" if w is None else "class_weight × sample_weight"
        with np.errstate(over="ignore"):
            w = check_sample_weight(per_class if w is None else per_class * w, len(y), name=name)
    if all_data and w is not None:
        kept = np.unique(np.asarray(y)[w > 0])
        if len(kept) < 2:
            raise ValueError(f"{name} leaves a positive weight to one class only ({kept.tolist()}): "
                             "at least two classes are needed")
    return w


def _kind(value):
    """``"str"``, ``"number"`` or the type name of one label."""
    if isinstance(value, (str, np.str_, bytes)):
        return "str"
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, float, np.number)):
        return "number"
    return type(value).__name__


def check_label_values(values, name):
    """Refuse label arrays (``y``, ``groups``) holding NaN, None or a mix of types.

    Parameters
    ----------
    values : array-like
    name : str
        What the values are, for the error message.

    Examples
    --------
    >>> from skfedspd.validation import check_label_values
    >>> check_label_values(["s1", 2], "y")
    Traceback (most recent call last):
    ...
    ValueError: y mixes label types: str (first 's1' at sample 0) and number (first 2 at sample 1); use one type
    """
    array = np.asarray(values) if hasattr(values, "dtype") else np.asarray(values, dtype=object)
    flat = array.reshape(-1)
    if flat.dtype.kind == "f":
        missing = np.flatnonzero(np.isnan(flat))
        what = "NaN"
    elif flat.dtype.kind == "O":
        items = flat.tolist()
        is_none = np.array([v is None for v in items], dtype=bool)
        is_nan = np.array([isinstance(v, (float, np.floating)) and v != v for v in items], dtype=bool)
        what = "None" if is_none.any() else "NaN"
        missing = np.flatnonzero(is_none if is_none.any() else is_nan)
        if not len(missing):
            first = {}
            for i, v in enumerate(items):
                first.setdefault(_kind(v), i)
            if len(first) > 1:
                kinds = " and ".join(f"{kind} (first {items[i]!r} at sample {i})" for kind, i in first.items())
                raise ValueError(f"{name} mixes label types: {kinds}; use one type")
    else:
        return
    if len(missing):
        raise ValueError(f"{name} contains {what} at samples {missing[:10].tolist()}"
                         f"{' (and more)' if len(missing) > 10 else ''}: every sample needs a label")


def check_groups(groups, n_samples):
    """``groups`` as a 1-D array of ``n_samples`` labels of one type (:func:`check_label_values`);
    None passes.

    Examples
    --------
    >>> from skfedspd.validation import check_groups
    >>> check_groups(["s1", "s2"], 2)
    array(['s1', 's2'], dtype='<U2')
    """
    if groups is None:
        return None
    check_label_values(groups, "groups")
    array = np.asarray(groups)
    if array.ndim != 1:
        raise ValueError(f"groups must be a 1-D array with one label per sample, got shape {array.shape}")
    if len(array) != n_samples:
        raise ValueError(f"groups has {len(array)} entries but X has {n_samples} samples")
    return array


def check_domain_sizes(groups, what):
    """Refuse domains that all hold a single trial (re-centred, each would be the identity),
    warn when some do.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.validation import check_domain_sizes
    >>> check_domain_sizes(np.array([0, 0, 1, 1]), "Recenter")
    """
    labels, counts = np.unique(groups, return_counts=True)
    single = labels[counts == 1]
    if len(single) == len(labels):
        raise ValueError(f"groups gives each of the {len(labels)} domains a single trial: {what} re-centres a domain "
                         "by its own mean, which maps a single trial to the identity, so nothing of the data would "
                         "remain; group the trials by subject or session (or pass groups=None: one domain)")
    if len(single):
        shown = ", ".join(repr(label) for label in single[:5].tolist()) + (" ..." if len(single) > 5 else "")
        warnings.warn(f"{len(single)} of the {len(labels)} domains of groups hold a single trial ({shown}): {what} "
                      "re-centres a domain by its own mean, which maps such a trial to the identity, so they "
                      "contribute nothing", UserWarning, stacklevel=3)


def resolve_groups(groups, subjects):
    """``groups``, or its alias ``subjects``; both given, they must be equal.

    Examples
    --------
    >>> from skfedspd.validation import resolve_groups
    >>> resolve_groups(None, [1, 1, 2])
    [1, 1, 2]
    """
    if groups is None:
        return subjects
    if subjects is not None and not np.array_equal(np.asarray(groups), np.asarray(subjects)):
        raise ValueError("groups and subjects (its alias) differ: pass one of them")
    return groups


def check_nested_params(est, params, resolve=None):
    """Refuse ``set_params`` names ``name__field`` that reach a value with no parameters.

    Examples
    --------
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.validation import check_nested_params
    >>> check_nested_params(SPDnetClassifier(), {"schedule__patience": 5})
    Traceback (most recent call last):
    ...
    ValueError: schedule__patience: schedule is None, which has no parameters; pass schedule=EpochSchedule(patience=5)
    """
    for key, value in params.items():
        name, nested, field = key.partition("__")
        target = params.get(name, getattr(est, name, None))
        if not nested or hasattr(target, "set_params") or name not in est.get_params(deep=False):
            continue  # sklearn's set_params reports unknown names itself
        stands_for = (resolve or {}).get(name, lambda v: None)(target)
        classes = ([type(stands_for)] if hasattr(stands_for, "set_params") else
                   [c for c in est._parameter_constraints.get(name, []) if isinstance(c, type)])
        instead = (f"pass {name}={classes[0].__name__}({field}={value!r})" if classes else
                   f"pass as {name} an object that has the parameter {field!r}")
        raise ValueError(f"{key}: {name} is {target!r}, which has no parameters; {instead}")
    return params


def stratified_split(y, fraction, seed):
    """Indices ``(train, validation)`` with ``round(fraction * n)`` validation samples, stratified
    when every class allows it.
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


def check_labels(y, n_samples):
    """``y`` as a 1-D array of classification targets, of length ``n_samples`` if given."""
    check_label_values(y, "y")
    y = column_or_1d(np.asarray(y), warn=True)
    if n_samples is not None and len(y) != n_samples:
        raise ValueError(f"X has {n_samples} samples but y has {len(y)} labels")
    check_classification_targets(y)
    return y


def check_spd_batch(X, n_channels=None, sym_rtol=1e-6, *, return_summary=False):
    """Validate a batch of SPD matrices (square, of ``n_channels``, finite, symmetric to
    ``sym_rtol``, positive definite at float64 precision); return it as float64, with
    ``return_summary`` also its :func:`spectral_summary`. A ValueError names the first bad
    matrix.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.validation import check_spd_batch
    >>> check_spd_batch([np.eye(2), np.diag([1.0, -1.0])])
    Traceback (most recent call last):
    ...
    ValueError: X matrix 1 is not positive definite
    """
    X = np.asarray(X)
    if X.dtype == object or not np.issubdtype(X.dtype, np.number) or np.iscomplexobj(X):
        raise ValueError(f"X must be a real numeric array, got dtype {X.dtype}")
    X = X.astype(np.float64, copy=False)
    if X.ndim != 3:
        raise ValueError(
            f"X must be a 3-D array of SPD matrices (n_matrices, n_channels, n_channels), got shape {X.shape}"
        )
    if X.shape[1] != X.shape[2]:
        raise ValueError(f"X must hold square matrices, got matrices of shape {X.shape[1:]}")
    if X.shape[0] == 0:
        raise ValueError("X holds 0 matrices; at least one is required")
    if X.shape[1] == 0:
        raise ValueError("X holds matrices of size 0x0")
    if n_channels is not None and X.shape[1] != n_channels:
        raise ValueError(
            f"X has matrices of size {X.shape[1]}x{X.shape[2]}, but the estimator was fitted on "
            f"{n_channels}x{n_channels}"
        )
    finite = np.isfinite(X).all(axis=(1, 2))
    if not finite.all():
        raise ValueError(f"X contains NaN or infinity (first at matrix {int(np.argmin(finite))})")
    scale = np.abs(X).max(axis=(1, 2))
    asym = np.abs(X - X.transpose(0, 2, 1)).max(axis=(1, 2))
    bad = asym > sym_rtol * scale
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"X matrix {i} is not symmetric (max |X - X^T| = {asym[i]:.3g})")
    scale = np.where(scale > 0, scale, 1.0)  # an all-zero matrix stays zero, and fails below
    normalized = X / scale[:, None, None]  # entries in [-1, 1]: no overflow
    try:
        L = np.linalg.cholesky(normalized)  # batched LAPACK
    except np.linalg.LinAlgError:
        i = next(k for k, M in enumerate(normalized) if not _cholesky_succeeds(M))
        raise ValueError(f"X matrix {i} is not positive definite") from None
    n = X.shape[1]
    norms = np.abs(normalized).sum(axis=1).max(axis=1)  # 1-norms
    rcond = np.array([dpocon(factor, norm, uplo="L")[0] for factor, norm in zip(L, norms)])
    singular = ~(rcond > n * np.finfo(np.float64).eps)
    if singular.any():
        i = int(np.argmax(singular))
        raise ValueError(f"X matrix {i} is not numerically positive definite: its condition number is about "
                         f"{1 / max(rcond[i], np.finfo(np.float64).tiny):.2g}, beyond 1 / ({n} · eps(float64)) = "
                         f"{1 / (n * np.finfo(np.float64).eps):.2g} (a rank-deficient or singular matrix)")
    if not return_summary:
        return X
    log_det = 2 * np.log10(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1)
    summary = np.stack([log_det / n + np.log10(scale), np.log10(1 / rcond)], axis=1)
    return X, summary


def _cholesky_succeeds(M):
    try:
        np.linalg.cholesky(M)
    except np.linalg.LinAlgError:
        return False
    return True


def spectral_summary(X):
    """``log10`` scale (``log10 det(X) / n``) and ``log10`` condition number of each SPD matrix:
    what ``input_range_`` records and :func:`check_input_range` checks.

    Parameters
    ----------
    X : array-like of shape (n_matrices, n, n)

    Returns
    -------
    ndarray of shape (n_matrices, 2)
        Columns ``log_scale`` and ``log_condition``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.validation import spectral_summary
    >>> spectral_summary([np.diag([1.0, 100.0]), np.diag([1e-12, 1e-12])])
    array([[  1.,   2.],
           [-12.,   0.]])
    """
    return check_spd_batch(X, return_summary=True)[1]


#: How far beyond its training range (in decades, ``log10`` units) a matrix's
#: :func:`spectral_summary` may lie before :func:`check_input_range` refuses it: a scale
#: (geometric mean of the eigenvalues, i.e. the power) 1000 times above the largest or
#: below the smallest seen in training, and a condition number 1e5 times the largest seen.
#: An electrode that pops (one channel 100 times its amplitude: its power ×1e4) moves the
#: scale of an ``n``-channel matrix by ``4 / n`` decades and its condition number by at
#: most 4 decades, so it passes; a trial in other units (µV² for V²: 12 decades), or
#: overflowing, or nearly singular, does not.
INPUT_RANGE_MARGIN = {"log_scale": 3.0, "log_condition": 5.0}


_SUMMARY_NAMES = {"log_scale": "scale (log10 of the geometric mean of its eigenvalues)",
                  "log_condition": "condition number (log10 of largest / smallest eigenvalue)"}


def input_range(summary, previous=None):
    """The ``input_range_`` of training matrices' :func:`spectral_summary`, united with ``previous``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.validation import input_range, spectral_summary
    >>> input_range(spectral_summary([np.eye(2), np.diag([10.0, 1000.0])]))
    {'log_scale': [0.0, 2.0], 'log_condition': [0.0, 2.0]}
    """
    summary = np.asarray(summary, dtype=np.float64)
    result = {name: [float(summary[:, j].min()), float(summary[:, j].max())] for j, name in enumerate(_SUMMARY_NAMES)}
    if previous is not None:
        result = {name: [min(low, previous[name][0]), max(high, previous[name][1])]
                  for name, (low, high) in result.items()}
    return result


#: The widest spread of scales (:func:`spectral_summary`'s ``log_scale``, in decades) that
#: the training matrices of one ``fit`` or ``partial_fit`` call may have, unless
#: ``scaling="trace"`` (:func:`check_training_spread`): twice the prediction margin
#: (:data:`INPUT_RANGE_MARGIN`). PhysioNet motor imagery spans 1.5 decades over 6 subjects
#: (within a subject, 0.2-0.4); data in two units (V² and µV²: 12 decades) do not pass.
TRAINING_SCALE_SPREAD = 2 * INPUT_RANGE_MARGIN["log_scale"]


def check_training_spread(summary, *, scale_invariant=False, what="X"):
    """Refuse training matrices whose scales spread over more than :data:`TRAINING_SCALE_SPREAD`
    decades (one ``scale_`` cannot serve them); nothing is checked when ``scale_invariant``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.validation import check_training_spread, spectral_summary
    >>> check_training_spread(spectral_summary(np.stack([np.eye(2), 1e5 * np.eye(2)])))
    """
    if scale_invariant:
        return
    scales = np.asarray(summary)[:, 0]
    low, high = int(np.argmin(scales)), int(np.argmax(scales))
    if scales[high] - scales[low] > TRAINING_SCALE_SPREAD:
        raise ValueError(f"{what} matrices {min(low, high)} and {max(low, high)} differ in scale (log10 of the "
                         f"geometric mean of their eigenvalues) by {scales[high] - scales[low]:.3g} decades, more "
                         f"than the {TRAINING_SCALE_SPREAD:g} accepted in one fit (TRAINING_SCALE_SPREAD): the data "
                         "mix units (e.g. V² and µV²) or hold faulty trials, and one scale cannot serve them all; "
                         "rescale them, or use scaling='trace'")


def check_input_range(summary, fitted_range, *, scale_invariant=False, what="X"):
    """Refuse matrices whose :func:`spectral_summary` lies beyond ``fitted_range`` by more than
    :data:`INPUT_RANGE_MARGIN` (None: nothing is checked).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.validation import check_input_range, input_range, spectral_summary
    >>> fitted = input_range(spectral_summary(np.stack([np.eye(3), 2 * np.eye(3)])))
    >>> check_input_range(spectral_summary(100 * np.eye(3)[None]), fitted)
    """
    if fitted_range is None:
        return
    summary = np.asarray(summary)
    for j, name in enumerate(_SUMMARY_NAMES):
        if name == "log_scale" and scale_invariant:
            continue
        low, high = fitted_range[name]
        margin = INPUT_RANGE_MARGIN[name]
        accepted_low = low - margin if name == "log_scale" else -np.inf
        bad = (summary[:, j] < accepted_low) | (summary[:, j] > high + margin)
        if bad.any():
            i = int(np.argmax(bad))
            accepted = (f"[{accepted_low:.3g}, {high + margin:.3g}]" if name == "log_scale"
                        else f"up to {high + margin:.3g}")
            raise ValueError(
                f"{what} matrix {i} is far outside the matrices the model was fitted on: its {_SUMMARY_NAMES[name]} "
                f"is {summary[i, j]:.3g}, the training matrices span [{low:.3g}, {high:.3g}] and up to {margin:g} "
                f"decades beyond are accepted ({accepted}). A matrix in other units (e.g. µV² for V²), an amplifier "
                "fault or a wrong scaling would corrupt the statistics of its domain: rescale it, or refit on such "
                "data.")
