"""Shared scikit-learn machinery for the torch classifiers (SPDnet, EEGNet).

Subclasses define how inputs are validated and turned into tensors and which module is
built; fitting, the validation split, the schedule, prediction, and persistence live here
once, on top of :mod:`skfedspd.training`.
"""

import copy
import functools
import warnings
from contextlib import contextmanager
from numbers import Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context, clone
from sklearn.model_selection import train_test_split
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.class_weight import compute_sample_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, column_or_1d

from .aggregation import projavg
from .nn import DomainBatch
from .training import (
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
from .validation import Count, is_count, is_positive

__all__ = ["TorchClassifierBase", "check_class_weight", "check_device", "check_domain_sizes", "check_fields",
           "check_groups", "check_label_values", "check_sample_weight", "resolve_groups", "training_weights",
           "uses_validation", "MAX_STATE_MAGNITUDE"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}

#: The largest magnitude a saved network value may have. Trained weights are of order 1 to 100
#: (Adam moves each by about ``lr`` per step); 1e6 leaves room for any of them while keeping the
#: logits of any input in the working range finite (a head of 1e308 predicts NaN).
MAX_STATE_MAGNITUDE = 1e6


def check_device(device, name="device"):
    """Refuse a torch ``device`` that cannot hold a model on this machine: not a device name,
    a CUDA (or MPS) device this machine does not have, or a device of another type
    (``"meta"`` holds no values).

    Raises
    ------
    ValueError
        Naming ``name``, the value and what this machine offers.

    Examples
    --------
    >>> from skfedspd.base import check_device
    >>> check_device("cpu")
    >>> check_device("meta")
    Traceback (most recent call last):
    ...
    ValueError: device='meta' cannot hold a model: use 'cpu', 'cuda[:index]' (when this machine has one) or 'mps'
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

#: Smallest validation part that ``fit`` holds out (see :func:`uses_validation`).
MIN_VALIDATION_SAMPLES = 50


def uses_validation(n_samples, n_classes, fraction, early_stopping="auto"):
    """Whether ``fit`` holds out a validation part: ``round(fraction · n) ≥ max(50, 2 · n_classes)``
    under ``early_stopping="auto"``; with ``True`` / ``False``, whenever ``fraction > 0`` / never.

    A smaller part judges early stopping, the learning-rate schedule and restore-best on
    noise: on 36 and 144 training trials (split of 4 and 14) the 10 % split restored a
    near-untrained epoch and scored at chance, while training the fixed budget with the last
    weights scored above tangent space + logistic regression (``docs/design-decisions.md``).
    50 samples bound the standard error of a validation accuracy by 0.07.

    Examples
    --------
    >>> from skfedspd.base import uses_validation
    >>> uses_validation(144, 4, 0.1), uses_validation(500, 4, 0.1), uses_validation(500, 4, 0.0)
    (False, True, False)
    >>> uses_validation(144, 4, 0.1, early_stopping=True), uses_validation(500, 4, 0.1, early_stopping=False)
    (True, False)
    """
    if early_stopping != "auto":
        return fraction > 0 and bool(early_stopping)
    n_val = int(round(fraction * n_samples))
    return fraction > 0 and n_val >= max(MIN_VALIDATION_SAMPLES, 2 * n_classes)


def check_sample_weight(sample_weight, n_samples, *, scalar=True, name="sample_weight"):
    """``sample_weight`` as a float64 array of ``n_samples`` non-negative finite weights with
    a positive sum (a scalar: the same weight for every sample, unless ``scalar=False``), or
    None. The sum must be a finite normal float64 number: a sum that overflows (weights of
    1e308) or is subnormal (weights of 1e-320) makes every minibatch's weighted loss
    ``Σ w_i l_i / Σ w_i`` NaN, so nothing would train. Only the weights' ratios matter:
    rescale them.

    Raises
    ------
    ValueError
        Naming ``name`` (``sample_weight``; ``class_weight`` or both for the weights they
        give) and what is wrong.

    Examples
    --------
    >>> from skfedspd.base import check_sample_weight
    >>> check_sample_weight(2, 3)
    array([2., 2., 2.])
    >>> check_sample_weight([1, -1, 0], 3)
    Traceback (most recent call last):
    ...
    ValueError: sample_weight contains negative weights (first at sample 1)
    >>> check_sample_weight(2, 3, scalar=False)  # e.g. a site's data file: one weight per sample
    Traceback (most recent call last):
    ...
    ValueError: sample_weight must be a 1-D array of 3 weights (one per sample), got shape ()
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
    """Validate a dict ``class_weight`` (label → weight): real, finite, non-negative
    weights (``"balanced"`` and None pass through). The one check of its values, where it
    enters a fit.

    Raises
    ------
    ValueError
        Naming ``class_weight`` and the class whose weight is wrong.

    Examples
    --------
    >>> from skfedspd.base import check_class_weight
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
    """Per-sample training weights: ``sample_weight`` (validated) times the weight of each
    sample's class under ``class_weight`` (None, ``"balanced"`` or a dict label → weight, as
    in scikit-learn); None when both are None (unweighted). ``all_data`` (a ``fit``, not a
    ``partial_fit`` batch): at least two classes must keep a positive weight.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.base import training_weights
    >>> y = np.array(["a", "a", "a", "b"])
    >>> training_weights("balanced", y, None)
    array([0.66666667, 0.66666667, 0.66666667, 2.        ])
    >>> training_weights({"a": 1.0, "b": 3.0}, y, [1, 1, 0, 1])
    array([1., 1., 0., 3.])
    >>> training_weights(None, y, None) is None
    True
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
    """Refuse label arrays (``y``, ``groups``) holding NaN, None or a mix of types
    (strings with numbers, say): sorting them fails or, worse, makes a NaN a label of its
    own (a federated client of NaN-labelled samples). A list is inspected as given, before
    numpy would turn ``["a", 1]`` into strings.

    Parameters
    ----------
    values : array-like
    name : str
        What the values are (``"y"``, ``"groups"``), for the error message.

    Raises
    ------
    ValueError
        Naming ``name``, what is wrong and where (the first positions and values).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.base import check_label_values
    >>> check_label_values([1, 2, 2], "groups")
    >>> check_label_values([1.0, np.nan, np.nan], "groups")
    Traceback (most recent call last):
    ...
    ValueError: groups contains NaN at samples [1, 2]: every sample needs a label
    >>> check_label_values(["s1", 2, None], "groups")
    Traceback (most recent call last):
    ...
    ValueError: groups contains None at samples [2]: every sample needs a label
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
    """``groups`` (a domain or client label per sample) as a 1-D array of ``n_samples``
    labels of one type, without NaN or None (:func:`check_label_values`); None passes.

    Raises
    ------
    ValueError
        Naming ``groups`` and what is wrong.

    Examples
    --------
    >>> from skfedspd.base import check_groups
    >>> check_groups(["s1", "s2"], 2)
    array(['s1', 's2'], dtype='<U2')
    >>> check_groups([1, 1, 2], 2)
    Traceback (most recent call last):
    ...
    ValueError: groups has 3 entries but X has 2 samples
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
    """Refuse (ValueError) domains that all hold a single trial, warn (UserWarning) when
    some do. ``groups``: the validated domain labels of a fit; ``what``: the step, for the
    message.

    A domain is re-centred by its own mean (domain batch norm, :class:`~skfedspd.Recenter`),
    and the mean of one trial is that trial: it maps to the identity (to the batch norm's
    bias), and everything it held is lost. When every domain is one trial nothing at all
    reaches the layers after it (a BiMap before a domain batch norm never gets a gradient,
    a re-centred set is all identities): the fit is refused, as it could only return its
    starting point. When only some are, the others still train and the call goes on, with a
    warning naming them.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.base import check_domain_sizes
    >>> check_domain_sizes(np.array([0, 0, 1, 1]), "Recenter")  # nothing to say
    >>> check_domain_sizes(np.arange(3), "Recenter")
    Traceback (most recent call last):
    ...
    ValueError: groups gives each of the 3 domains a single trial: Recenter re-centres a domain by its own mean, \
which maps a single trial to the identity, so nothing of the data would remain; group the trials by subject or \
session (or pass groups=None: one domain)
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
    """``groups``, or its alias ``subjects`` (MOABB's ``CrossSubjectEvaluation`` routes the
    training subjects to ``fit`` under that key). Both given: they must be equal.

    Examples
    --------
    >>> from skfedspd.base import resolve_groups
    >>> resolve_groups(None, [1, 1, 2])
    [1, 1, 2]
    >>> resolve_groups([1, 2], [2, 1])
    Traceback (most recent call last):
    ...
    ValueError: groups and subjects (its alias) differ: pass one of them
    """
    if groups is None:
        return subjects
    if subjects is not None and not np.array_equal(np.asarray(groups), np.asarray(subjects)):
        raise ValueError("groups and subjects (its alias) differ: pass one of them")
    return groups


def _progress(iterable, enabled, desc):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, leave=False)



def merge_into(default):
    """A merge for :func:`fold_renamed`: the old fields set on a copy of the estimator's
    object, or of ``default`` when it has none.

    Examples
    --------
    >>> from skfedspd.base import merge_into
    >>> from skfedspd.training import EpochSchedule
    >>> merge_into(EpochSchedule())(None, {"patience": 5})
    EpochSchedule(patience=5)
    """
    return lambda current, fields: clone(current if current is not None else default).set_params(**fields)


def accepts_renamed(renamed, merges):
    """Decorate an estimator's ``__init__`` so that the old flat names of ``renamed`` are
    accepted for one version, with a ``FutureWarning``, folded into their objects
    (:func:`fold_renamed`). The signature (what ``get_params``, scikit-learn's checks and the
    docs see) is the ``__init__``'s own; any other unexpected name is Python's TypeError.

    Examples
    --------
    >>> import warnings
    >>> from skfedspd import SPDnetClassifier
    >>> with warnings.catch_warnings(record=True):
    ...     warnings.simplefilter("always")
    ...     SPDnetClassifier(patience=5).schedule
    EpochSchedule(patience=5)
    >>> "patience" in SPDnetClassifier().get_params()
    False
    """
    def decorate(init):
        @functools.wraps(init)
        def accepting(self, *args, **kwargs):
            old = {name: kwargs.pop(name) for name in list(kwargs) if name in renamed}
            init(self, *args, **kwargs)
            for name, value in fold_renamed(self, old, renamed, merges).items():
                setattr(self, name, value)

        return accepting

    return decorate


def check_nested_params(est, params, resolve=None):
    """``params`` (of ``set_params``), refused with a ValueError before anything is set when a
    nested name ``name__field`` reaches a value with no parameters (None, a rule's name): the
    error names the parameter and the object to pass instead, e.g. ``schedule is None: pass
    schedule=EpochSchedule(patience=5)``. ``resolve[name](value)`` gives the object such a
    value stands for (a rule's name, a default estimator), whose class the error suggests.

    Examples
    --------
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.base import check_nested_params
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


def fold_renamed(est, params, renamed, merges):
    """``params`` with the old flat names of ``renamed`` (old name → (parameter, field))
    folded into the parameter objects they now belong to, with a ``FutureWarning`` that
    names them; ``merges[parameter](current object or None, {field: value})`` gives the new
    object. Any other name passes through.

    Examples
    --------
    >>> import warnings
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.base import fold_renamed, merge_into
    >>> from skfedspd.training import EpochSchedule
    >>> with warnings.catch_warnings(record=True):
    ...     warnings.simplefilter("always")
    ...     fold_renamed(SPDnetClassifier(), {"lr": 0.1, "patience": 5}, {"patience": ("schedule", "patience")},
    ...                  {"schedule": merge_into(EpochSchedule())})
    {'lr': 0.1, 'schedule': EpochSchedule(patience=5)}
    """
    old = {name: value for name, value in params.items() if name in renamed}
    if not old:
        return params
    params = {name: value for name, value in params.items() if name not in renamed}
    news = []
    for group in dict.fromkeys(renamed[name][0] for name in old):
        fields = {renamed[name][1]: value for name, value in old.items() if renamed[name][0] == group}
        params[group] = merges[group](params.get(group, getattr(est, group, None)), fields)
        news.append(f"{group}=None" if params[group] is None else
                    f"{group}={type(params[group]).__name__}({', '.join(f'{f}=...' for f in fields)})")
    warnings.warn(f"{sorted(old)} are deprecated and will be removed in 0.4: use {', '.join(news)}", FutureWarning,
                  stacklevel=3)
    return params
    news = ", ".join(f"{renamed[name][0]}=...({renamed[name][1]}=...)" for name in old)
    warnings.warn(f"{sorted(old)} are deprecated and will be removed in 0.4: use {news}", FutureWarning, stacklevel=4)
    params = {name: value for name, value in params.items() if name not in renamed}
    for group in dict.fromkeys(renamed[name][0] for name in old):
        fields = {renamed[name][1]: value for name, value in old.items() if renamed[name][0] == group}
        params[group] = merges[group](params.get(group, getattr(est, group, None)), fields)
    return params

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
    check_label_values(y, "y")
    y = column_or_1d(np.asarray(y), warn=True)
    if n_samples is not None and len(y) != n_samples:
        raise ValueError(f"X has {n_samples} samples but y has {len(y)} labels")
    check_classification_targets(y)
    return y


def _as_tensor(a):
    """A tensor sharing a writable numpy array's memory, or a copy of a read-only one (joblib
    memory-maps): torch has no read-only tensors. Tensors pass through; a DomainBatch gets
    its matrices converted."""
    if isinstance(a, DomainBatch):
        return a.with_inputs(_as_tensor(a.X))
    if not isinstance(a, np.ndarray):
        return a
    return torch.from_numpy(a) if a.flags.writeable else torch.tensor(a)


#: The epoch schedule's flat parameters of before: old name → (parameter, its field).
#: Accepted (``__init__``, ``set_params``, saved specs) with a ``FutureWarning`` until 0.4.
EPOCH_RENAMED = {name: ("schedule", name) for name in ("patience", "lr_patience", "lr_factor")}
EPOCH_MERGES = {"schedule": merge_into(EpochSchedule())}


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
        if getattr(self, "schedule", None) is not None:  # a settings object checks its own parameters
            self.schedule.check_params()

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
        y = _check_labels(y, n_samples)
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

    def local_update(self, global_params, local_state, X, y, *, lr, n_epochs, seed, n_threads=None, dp=None,
                     sample_weight=None, optimizer_state=None):
        """One client's work in a federated round: the one local-training routine.

        Loads the broadcast ``global_params`` (then the client's own ``local_state``),
        creates an Adam optimizer with learning rate ``lr`` (resuming the client's
        ``optimizer_state`` when one is given) and runs ``n_epochs``
        epochs of :func:`~skfedspd.training.train_epochs` (minibatches of ``batch_size``)
        under ``seed`` — or, with ``dp``, of :func:`~skfedspd.privacy.dp_train_epochs`
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
                from .privacy import dp_train_epochs

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
        meta = {"classes": _labels_to_json(self.classes_),
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
            self.classes_ = _labels_from_json(meta.get("classes"))
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
                _check_module_arrays(module_arrays, shapes, f"from n_features_in_={self.n_features_in_} and "
                                                            f"{len(self.classes_)} classes")
            self._check_module_values(module_arrays)
            self.init_module(0)
            for name, value in attributes.items():  # init_module reset the history
                setattr(self, name, value)
            _load_module_state(self.module_, module_arrays)
            if optimizer is not None:
                self._restore_session(arrays, optimizer)

    def _check_module_values(self, arrays):
        """Validate the values of a saved module state (names and shapes already checked):
        finite, of magnitude at most :data:`MAX_STATE_MAGNITUDE`, running variances >= 0.
        Subclasses add what their network's arrays must be (SPDnet: orthonormal BiMaps)."""
        _check_module_values(arrays)

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
        :data:`EPOCH_RENAMED` included, with a ``FutureWarning``.

        Returns
        -------
        self
        """
        params = fold_renamed(self, params, EPOCH_RENAMED, EPOCH_MERGES)
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
        (:func:`uses_validation`), that stratified part is held out and its loss drives the
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
            y = _check_labels(y, len(X))
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
        torch.Tensor or skfedspd.nn.DomainBatch
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


def _labels_to_json(classes):
    """``classes_`` as JSON: its dtype and values (numbers, booleans or strings)."""
    if classes.dtype.kind == "O" and not all(isinstance(c, (str, int, float, bool)) for c in classes.tolist()):
        raise TypeError(f"classes of types {sorted({type(c).__name__ for c in classes})} cannot be saved; "
                        "use numbers or strings as labels")
    dtype = "object" if classes.dtype.kind == "O" else classes.dtype.str
    return {"dtype": dtype, "values": classes.tolist()}


def _labels_from_json(saved):
    """``classes_`` from :func:`_labels_to_json`'s output, validated before anything is
    allocated: a supported dtype whose item size the values justify, a list of numbers or
    strings of one type, without NaN, unique and sorted (as ``np.unique`` gives them)."""
    if not isinstance(saved, dict) or set(saved) != {"dtype", "values"}:
        raise ValueError(f"classes must be an object with 'dtype' and 'values', got {saved!r}")
    values = saved["values"]
    if not isinstance(values, list) or not all(isinstance(v, (str, int, float, bool)) for v in values):
        raise ValueError("classes: the saved labels are not a list of numbers or strings")
    try:
        dtype = np.dtype(saved["dtype"])
    except TypeError:
        raise ValueError(f"classes: {saved['dtype']!r} is not a dtype") from None
    if dtype.kind not in "biufUO":
        raise ValueError(f"classes: labels of dtype {saved['dtype']!r} are not supported")
    longest = max((len(v) for v in values if isinstance(v, str)), default=0)
    if dtype.kind == "U" and dtype.itemsize // 4 > max(longest, _MAX_LABEL_WIDTH):
        raise ValueError(f"classes: dtype {saved['dtype']!r} holds {dtype.itemsize // 4} characters per label, but the "
                         f"longest label has {longest}")
    check_label_values(values, "classes")
    classes = np.empty(len(values), dtype=dtype) if dtype.kind == "O" else np.array(values, dtype=dtype)
    if dtype.kind == "O":
        classes[:] = values
    if len(classes) < 2 or len(np.unique(classes)) != len(classes) or not np.array_equal(np.unique(classes), classes):
        raise ValueError(f"classes must be at least two unique labels in sorted order, got {values!r}")
    return classes


#: Characters per label a saved ``classes_`` dtype may reserve beyond its longest label
#: (labels from a fixed-width string array keep its width).
_MAX_LABEL_WIDTH = 1024


def _check_history(value):
    return isinstance(value, list) and all(isinstance(record, dict) for record in value)


def _check_epochs(value):
    return isinstance(value, list) and all(is_count(epoch) for epoch in value)


def _check_input_range(value):
    return (isinstance(value, dict) and set(value) == {"log_scale", "log_condition"}
            and all(isinstance(pair, list) and len(pair) == 2
                    and all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in pair)
                    and pair[0] <= pair[1] for pair in value.values()))


#: How a saved fitted attribute is checked: ``(test, what it must be, required)``.
ATTRIBUTE_CHECKS = {
    "n_features_in_": (lambda v: is_count(v, 1), "an int >= 1", True),
    "history_": (_check_history, "a list of records (objects)", False),
    "best_epoch_": (lambda v: is_count(v, 0), "an int >= 0", False),
    "averaged_epochs_": (_check_epochs, "a list of ints >= 0", False),
    "n_iter_": (lambda v: is_count(v, 0), "an int >= 0", False),
    "validation_used_": (lambda v: isinstance(v, bool), "true or false", False),
    "scale_": (is_positive, "a finite number > 0", True),
    "input_range_": (_check_input_range, 'an object {"log_scale": [low, high], "log_condition": [low, high]} of '
                     "finite numbers, low <= high", False),
    "n_times_": (lambda v: is_count(v, 1), "an int >= 1", True),
    "batchnorm_": (lambda v: v in (None, "spd", "domain"), 'null, "spd" or "domain"', False),
}


def check_fields(values, checks, what, allowed=None):
    """Validate the JSON fields ``values`` of a saved state by a table ``checks`` (name →
    ``(test, what it must be, required)``) before anything is built from them.

    Parameters
    ----------
    values : dict
    checks : dict
    what : str
        What one field is, for the messages (``"fitted attribute"``).
    allowed : sequence of str or None
        The names allowed (None: those of ``checks``); an allowed name without a check is not
        tested.

    Raises
    ------
    ValueError
        Naming the field: unknown, missing (when required) or of the wrong type or range.

    Examples
    --------
    >>> from skfedspd.base import check_fields
    >>> checks = {"seed": (lambda v: isinstance(v, int), "an int", True)}
    >>> check_fields({"seed": 3}, checks, "engine field")
    >>> check_fields({"seed": "x"}, checks, "engine field")
    Traceback (most recent call last):
    ...
    ValueError: the engine field seed must be an int, got 'x'
    """
    allowed = list(checks) if allowed is None else list(allowed)
    if not isinstance(values, dict):
        raise ValueError(f"the {what}s must be a JSON object, got {type(values).__name__}")
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {what}s {unknown}")
    for name in allowed:
        if name not in checks:  # e.g. a third-party estimator's own attribute
            continue
        test, must, required = checks[name]
        if name not in values:
            if required:
                raise ValueError(f"the {what} {name} is missing")
            continue
        if not test(values[name]):
            raise ValueError(f"the {what} {name} must be {must}, got {values[name]!r}")


def check_fitted_attributes(attributes, allowed):
    """Validate saved fitted attributes (JSON) before anything is built from them
    (:func:`check_fields` with :data:`ATTRIBUTE_CHECKS`).

    Parameters
    ----------
    attributes : dict
        Name → value, as :meth:`TorchClassifierBase.fitted_state` writes them.
    allowed : sequence of str
        The estimator's ``_fitted_attributes()``.

    Raises
    ------
    ValueError
        Naming the attribute: unknown, missing (those a model cannot be built without) or
        of the wrong type or range (:data:`ATTRIBUTE_CHECKS`).
    """
    check_fields(attributes, ATTRIBUTE_CHECKS, "fitted attribute", allowed)


def _check_module_values(arrays):
    """Require module values (finite numbers: checked by the caller with every array) no larger
    than :data:`MAX_STATE_MAGNITUDE`, and batch-norm running variances >= 0 (torch's ``running_var``)."""
    for name, value in arrays.items():
        if value.dtype.kind == "f" and value.size and np.abs(value).max() > MAX_STATE_MAGNITUDE:
            raise ValueError(f"module array {name!r} has values of magnitude {np.abs(value).max():.3g} > "
                             f"{MAX_STATE_MAGNITUDE:g}: no trained network holds such values")
        if name.endswith("running_var") and (value < 0).any():
            raise ValueError(f"module array {name!r} has negative variances")


def _check_module_arrays(arrays, shapes, source):
    """Require the names and shapes ``shapes`` (name → shape, ``source`` says where they
    come from) of the numpy ``arrays`` of a module state."""
    if set(arrays) != set(shapes):
        missing, extra = sorted(set(shapes) - set(arrays)), sorted(set(arrays) - set(shapes))
        raise ValueError(f"the module state does not match the parameters: missing {missing}, unexpected {extra}")
    for name, value in arrays.items():
        if value.shape != tuple(shapes[name]):
            raise ValueError(f"module array {name!r} is {value.dtype} {value.shape}, expected shape "
                             f"{tuple(shapes[name])} ({source})")


def _load_module_state(module, arrays):
    """``module.load_state_dict`` from numpy arrays, requiring the same names, shapes and dtypes."""
    expected = module.state_dict()
    _check_module_arrays(arrays, {name: tuple(t.shape) for name, t in expected.items()}, "the module's")
    for name, value in arrays.items():
        target = expected[name]
        if torch.from_numpy(value).dtype != target.dtype:
            raise ValueError(f"module array {name!r} is {value.dtype} {value.shape}, expected "
                             f"{target.dtype} {tuple(target.shape)}")
    module.load_state_dict({name: torch.from_numpy(value) for name, value in arrays.items()}, strict=True)
