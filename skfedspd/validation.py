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
from numbers import Integral

import numpy as np
from sklearn.utils._param_validation import HasMethods, Interval

__all__ = ["is_count", "check_count", "Count", "Sequence"]


def is_count(value, minimum=0):
    """Whether ``value`` is an int (Python or numpy, never a bool) ``>= minimum``
    (None: any int)."""
    return (isinstance(value, Integral) and not isinstance(value, (bool, np.bool_))
            and (minimum is None or value >= minimum))


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


class Count(Interval):
    """A ``_parameter_constraints`` entry: an int in ``[left, right]`` (None: unbounded),
    never a bool (:func:`is_count`)."""

    def __init__(self, left=1, right=None):
        closed = {(True, True): "both", (True, False): "left", (False, True): "right", (False, False): "neither"}
        super().__init__(Integral, left, right, closed=closed[left is not None, right is not None])

    def is_satisfied_by(self, val):
        return is_count(val, None) and super().is_satisfied_by(val)

    def __str__(self):
        return super().__str__().replace("an int", "an int (not a bool)", 1)


class Sequence(HasMethods):
    """A ``_parameter_constraints`` entry for a parameter that takes a tuple: a list, tuple
    or array (a length and items by position), never a mapping, a set or a string."""

    def __init__(self):
        super().__init__(["__len__", "__getitem__"])

    def is_satisfied_by(self, val):
        return (not isinstance(val, (Mapping, str, bytes)) and getattr(val, "ndim", 1) != 0
                and super().is_satisfied_by(val))

    def __str__(self):
        return "a sequence (a list, tuple or array; not a dict, set or string)"
