"""Paired differences between two rows of a record, and the words they allow.

Two rows are compared unit by unit (seed or subject) on the units both have: the mean
difference, its standard error, how many units the first row is higher on, and the
two-sided Wilcoxon signed-rank p-value. A difference within the two-sided 95 % t critical value
(``n − 1`` degrees of freedom) times its standard error is "level", never a win: over 3 units
that is 4.30 standard errors, over 40 units 2.02.
"""

import functools
import math
from dataclasses import dataclass

import numpy as np


@functools.lru_cache(maxsize=256)
def t_critical(n):
    """The two-sided 95 % critical value of Student's t with ``n − 1`` degrees of freedom, the
    number of standard errors a paired mean over ``n`` units must clear (NaN below 2 units)."""
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1)) if n >= 2 else float("nan")


@dataclass(frozen=True)
class PairedDifference:
    """``a − b`` over ``n`` paired units: ``mean`` ± ``se``, ``higher`` units where a > b,
    Wilcoxon signed-rank ``p`` (NaN below two units or when every difference is 0)."""

    mean: float
    se: float
    higher: int
    n: int
    p: float

    @property
    def reading(self):
        """"higher", "lower" (beyond :func:`t_critical` standard errors), "level" (within), or
        "one unit" (no standard error)."""
        if self.n < 2:
            return "one unit"
        if abs(self.mean) <= t_critical(self.n) * self.se:
            return "level"
        return "higher" if self.mean > 0 else "lower"


def paired_difference(a, b):
    """:class:`PairedDifference` of ``a − b``; ``a``, ``b``: ``{unit: score}``, paired by unit.

    Raises ValueError when they share no unit.
    """
    units = [u for u in a if u in b]
    if not units:
        raise ValueError("the two rows share no unit (seed or subject)")
    # Rounded far below any score's resolution, so that equal differences tie exactly.
    return _of_differences(tuple(np.round([float(a[u]) - float(b[u]) for u in units], 9)))


@functools.lru_cache(maxsize=4096)
def _of_differences(differences):
    """:class:`PairedDifference` of the paired differences (a tuple: a page's views ask for the
    same pair many times, and an exact Wilcoxon test with ties is a permutation test)."""
    from scipy.stats import wilcoxon

    d = np.array(differences, dtype=float)
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
    p = float(wilcoxon(d).pvalue) if len(d) > 1 and np.any(d != 0) else float("nan")
    return PairedDifference(float(d.mean()), se, int((d > 0).sum()), len(d), p)
