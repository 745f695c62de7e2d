"""The torch side of the federated protocol: a module's state as named numpy arrays with
kinds, ``"stiefel"``, ``"euclidean"`` or ``"local"`` (never leaves a client).
"""

from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from .stiefel import orthonormality_problem

__all__ = ["FederatedModule"]


class FederatedModule(nn.Module):
    """A module whose state can be exported/imported as named numpy arrays with kinds.

    Examples
    --------
    >>> import numpy as np
    >>> import torch
    >>> from skfedspd.federated_module import FederatedModule
    >>> class Linear(FederatedModule):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = torch.nn.Linear(3, 2)
    ...     def parameter_kinds(self):
    ...         return {"fc.weight": "euclidean", "fc.bias": "euclidean"}
    ...     def forward(self, x):
    ...         return self.fc(x)
    >>> module = Linear()
    >>> module.set_parameters({"fc.bias": np.ones(2, dtype=np.float32)})
    >>> module.get_parameters()["fc.bias"]
    array([1., 1.], dtype=float32)
    """

    def parameter_kinds(self):
        """Ordered mapping ``name → "stiefel" | "euclidean" | "local"``."""
        raise NotImplementedError

    def after_step_(self):
        """Hook run by the training loop after every optimizer step (default: nothing)."""

    def get_parameters(self):
        """Named numpy copies of the exported state (the keys of :meth:`parameter_kinds`)."""
        state = self._exported_state()
        return OrderedDict(
            (name, state[name].detach().cpu().numpy().copy()) for name in self.parameter_kinds()
        )

    def set_parameters(self, arrays):
        """Load named arrays (a subset of :meth:`parameter_kinds`), all checked before any is loaded
        (name, shape, finite values, orthonormal ``"stiefel"`` arrays).
        """
        kinds = self.parameter_kinds()
        unknown = set(arrays) - set(kinds)
        if unknown:
            raise KeyError(f"unknown parameter names: {sorted(unknown)}")
        state = self._loadable_state()
        checked = {}
        for name, value in arrays.items():
            value = np.asarray(value)
            if value.shape != tuple(state[name].shape):
                raise ValueError(f"parameter {name!r} has shape {value.shape}, expected {tuple(state[name].shape)}")
            if value.dtype.kind not in "fiu" or not np.isfinite(value).all():
                raise ValueError(f"parameter {name!r} must be a finite real array, got dtype {value.dtype}"
                                 + (f" with {int((~np.isfinite(value)).sum())} non-finite values"
                                    if value.dtype.kind == "f" else ""))
            if kinds[name] == "stiefel":
                dtype = np.float32 if state[name].dtype == torch.float32 else np.float64
                problem = orthonormality_problem(value.astype(np.float64, copy=False), dtype)
                if problem:
                    raise ValueError(f"parameter {name!r} {problem}")
            checked[name] = value
        with torch.no_grad():
            for name, value in checked.items():
                self._load_array(name, torch.as_tensor(value), state)

    def _exported_state(self):
        return self.state_dict(keep_vars=True)

    def _loadable_state(self):
        """Tensors of the exported names and shapes that :meth:`_load_array` writes to."""
        return self._exported_state()

    def _load_array(self, name, value, state):
        if not state[name].dtype.is_floating_point:
            value = value.round()  # a pooled count (a weighted mean, or a quantized secure sum)
        state[name].copy_(value)
