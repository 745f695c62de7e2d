"""Flower records of FedSPDnet messages, read and written alike by the sites and the server.

Arrays travel as Flower array records with their dtype and bits preserved
(:func:`to_array_record`, :func:`from_array_record`). Under secure aggregation a site keeps
its client-local arrays in its Flower context state, under :data:`LOCAL_STATE_KEY`.
"""

import numpy as np
from flwr.app import Array, ArrayRecord

__all__ = ["to_array_record", "from_array_record", "LOCAL_STATE_KEY"]

LOCAL_STATE_KEY = "skfedspd.local-arrays"  # a site's client-local arrays, in its Flower context state


def to_array_record(params):
    """``{name: ndarray}`` → ArrayRecord (dtype and bits preserved).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.flower.records import to_array_record
    >>> record = to_array_record({"bimaps.0.weight": np.eye(3)[:, :2], "head.bias": np.zeros(2, np.float32)})
    >>> type(record).__name__, list(record)
    ('ArrayRecord', ['bimaps.0.weight', 'head.bias'])
    """
    return ArrayRecord({name: Array(np.asarray(value, order="C")) for name, value in params.items()})


def from_array_record(record):
    """ArrayRecord → ``{name: ndarray}`` (inverse of :func:`to_array_record`).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.flower.records import from_array_record, to_array_record
    >>> params = {"W": np.random.default_rng(0).standard_normal((3, 2)), "b": np.ones(2, np.float32)}
    >>> back = from_array_record(to_array_record(params))
    >>> all(np.array_equal(back[k], params[k]) and back[k].dtype == params[k].dtype for k in params)
    True
    """
    return {name: array.numpy() for name, array in record.items()}
