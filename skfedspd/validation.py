"""The validators shared by every place a count or a sequence enters the package.

A bool is an :class:`numbers.Integral` in Python, so scikit-learn's
``Interval(Integral, 1, None)`` takes ``batch_size=True`` as 1, and its ``"array-like"``
takes a dict (it has a length). :func:`is_count` is the one test of a count (an int,
Python or numpy, never a bool); :class:`Count` is that test as a ``_parameter_constraints``
entry and :func:`check_count` as a check of a plain function's argument or of a value read
from a command line, a node config or a message. :class:`Sequence` is a parameter that
takes a tuple: a list, tuple or array, never a mapping, a set or a string.

Examples
--------
>>> from skfedspd.validation import Count, is_count
>>> is_count(3), is_count(True), is_count(-1, minimum=None)
(True, False, True)
>>> Count(1).is_satisfied_by(True), str(Count(1))
(False, 'an int (not a bool) in the range [1, inf)')
"""

from collections.abc import Mapping
import math
from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import HasMethods, Interval

__all__ = ["is_count", "check_count", "is_positive", "check_positive", "Count", "Sequence"]


def is_count(value, minimum=0):
    """Whether ``value`` is an int (Python or numpy, never a bool) ``>= minimum``
    (None: any int).

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
    """``value`` as an int, or a ValueError naming ``name`` if it is no count ``>= minimum``
    (see :func:`is_count`).

    Examples
    --------
    >>> from skfedspd.validation import check_count
    >>> check_count(3, "n_sites", 1)
    3
    >>> check_count(True, "n_sites", 1)
    Traceback (most recent call last):
    ...
    ValueError: n_sites must be an int >= 1 (not a bool), got True
    """
    if not is_count(value, minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{name} must be an int{bound} (not a bool), got {value!r}")
    return int(value)


def is_positive(value, allow_zero=False):
    """Whether ``value`` is a real number (never a bool), finite and > 0 (>= 0 with
    ``allow_zero``).

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
    >>> check_positive(float("inf"), "round_timeout")
    Traceback (most recent call last):
    ...
    ValueError: round_timeout must be a finite positive number (not a bool), got inf
    """
    if not is_positive(value, allow_zero):
        raise ValueError(f"{name} must be a finite {'non-negative' if allow_zero else 'positive'} number (not a bool), "
                         f"got {value!r}")
    return float(value)


class Count(Interval):
    """A ``_parameter_constraints`` entry: an int in ``[left, right]`` (None: unbounded),
    never a bool (:func:`is_count`).

    Examples
    --------
    >>> from sklearn.utils._param_validation import validate_parameter_constraints
    >>> from skfedspd.validation import Count
    >>> validate_parameter_constraints({"n_rounds": [Count(1)]}, {"n_rounds": True}, caller_name="fit")
    Traceback (most recent call last):
    ...
    sklearn.utils._param_validation.InvalidParameterError: The 'n_rounds' parameter of fit must be an int (not a bool) in the range [1, inf). Got True instead.
    """

    def __init__(self, left=1, right=None):
        closed = {(True, True): "both", (True, False): "left", (False, True): "right", (False, False): "neither"}
        super().__init__(Integral, left, right, closed=closed[left is not None, right is not None])

    def is_satisfied_by(self, val):
        return is_count(val, None) and super().is_satisfied_by(val)

    def __str__(self):
        return super().__str__().replace("an int", "an int (not a bool)", 1)


class Sequence(HasMethods):
    """A ``_parameter_constraints`` entry for a parameter that takes a tuple: a list, tuple
    or array (a length and items by position), never a mapping, a set or a string.

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
