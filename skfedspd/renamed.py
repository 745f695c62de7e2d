"""The deprecated flat parameter names (``patience=5`` for ``schedule=EpochSchedule(...)``),
accepted with a ``FutureWarning`` until the version :func:`fold_renamed`'s warning names.
"""

import functools
import warnings

from sklearn.base import clone

from .online import DomainAdaptation
from .training import EpochSchedule

__all__ = ["accepts_renamed", "fold_renamed", "merge_into", "EPOCH_RENAMED", "EPOCH_MERGES", "DOMAIN_RENAMED",
           "DOMAIN_MERGES"]


def merge_into(default):
    """A merge for :func:`fold_renamed`: the old fields set on a copy of the object (or ``default``).

    Examples
    --------
    >>> from skfedspd.renamed import merge_into
    >>> from skfedspd.training import EpochSchedule
    >>> merge_into(EpochSchedule())(None, {"patience": 5})
    EpochSchedule(patience=5)
    """
    return lambda current, fields: clone(current if current is not None else default).set_params(**fields)


def accepts_renamed(renamed, merges):
    """Decorate an ``__init__`` to accept the old flat names of ``renamed`` (``FutureWarning``);
    the signature stays the ``__init__``'s own.

    Examples
    --------
    >>> import warnings
    >>> from skfedspd import SPDnetClassifier
    >>> with warnings.catch_warnings(record=True):
    ...     warnings.simplefilter("always")
    ...     SPDnetClassifier(patience=5).schedule
    EpochSchedule(patience=5)
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


def fold_renamed(est, params, renamed, merges):
    """``params`` with the old flat names of ``renamed`` folded into their parameter objects
    (``merges[parameter]``), with a ``FutureWarning``.

    Examples
    --------
    >>> import warnings
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.renamed import fold_renamed, merge_into
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


#: The epoch schedule's flat parameters of before: old name → (parameter, its field).
#: Accepted (``__init__``, ``set_params``, saved specs) with a ``FutureWarning`` until 0.4.
EPOCH_RENAMED = {name: ("schedule", name) for name in ("patience", "lr_patience", "lr_factor")}


EPOCH_MERGES = {"schedule": merge_into(EpochSchedule())}


#: The domain adaptation's flat parameters of before (``SPDnetClassifier``, ``Recenter``): old
#: name → (``domain_adaptation``, its field). Accepted with a ``FutureWarning`` until 0.4.
DOMAIN_RENAMED = {"domain_prior_weight": ("domain_adaptation", "prior_weight"),
                  "domain_memory": ("domain_adaptation", "memory"),
                  "domain_include_self": ("domain_adaptation", "include_self"),
                  "max_domains": ("domain_adaptation", "max_domains")}


DOMAIN_MERGES = {"domain_adaptation": merge_into(DomainAdaptation())}
