"""The ``SPDNet`` module: BiMap → (batch norm) → ReEig blocks, LogEig, vech and a linear
head, exporting its state as named arrays with kinds
(:class:`~skfedspd.federated_module.FederatedModule`).
"""

from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from .batchnorm import DomainBatch, DomainSPDBatchNorm, SPDBatchNorm
from .federated_module import FederatedModule
from .functional import reeig, reeig_logeig_vech
from .layers import BiMap

__all__ = ["SPDNet"]


class SPDNet(FederatedModule):
    """SPDnet (Huang & Van Gool, 2017): BiRe blocks → LogEig → vech → Linear.

    Parameters
    ----------
    n_channels : int
        Input matrix size ``d_0``.
    hidden_dims : sequence of int
        Output size of each BiMap; one BiRe block per entry.
    n_classes : int
        Number of outputs (logits).
    eps : float
        ReEig threshold.
    recenter_every : int
        Re-centre the BiMap charts every this many optimizer steps.
    seed : int or None
        Seed of the Stiefel initialisation.
    dtype : torch.dtype
    batchnorm : {None, "spd", "domain"}, default=None
        SPD batch normalization after each BiMap: :class:`SPDBatchNorm` or
        :class:`DomainSPDBatchNorm` (``forward(X, domains)``).
    bn_momentum : float, default=0.1
        Running-mean momentum of ``batchnorm="spd"``.
    karcher_steps : int, default=1
        Karcher steps of the batch means (0: log-Euclidean mean).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.nn import SPDNet
    >>> X = torch.as_tensor(make_spd_classification(n_matrices=5, n_channels=6, seed=0)[0])
    >>> net = SPDNet(n_channels=6, hidden_dims=(4, 3), n_classes=2, seed=0)
    >>> net(X).shape
    torch.Size([5, 2])
    >>> dict(net.parameter_kinds())
    {'bimaps.0.weight': 'stiefel', 'bimaps.1.weight': 'stiefel', 'head.weight': 'euclidean', 'head.bias': 'euclidean'}
    """

    def __init__(
        self, n_channels, hidden_dims, n_classes, eps=1e-4, recenter_every=1, seed=None, dtype=torch.float64,
        batchnorm=None, bn_momentum=0.1, karcher_steps=1,
    ):
        super().__init__()
        if batchnorm not in (None, "spd", "domain"):
            raise ValueError(f"batchnorm must be None, 'spd' or 'domain', got {batchnorm!r}")
        self.batchnorm = batchnorm
        if recenter_every < 1:
            raise ValueError(f"recenter_every must be >= 1, got {recenter_every}")
        self.recenter_every = int(recenter_every)
        self._steps_since_recenter = 0
        hidden_dims = tuple(int(d) for d in hidden_dims)
        if not hidden_dims:
            raise ValueError("hidden_dims needs at least one BiRe block")
        dims = (int(n_channels),) + hidden_dims
        seeds = np.random.SeedSequence(seed).spawn(len(hidden_dims))
        self.bimaps = nn.ModuleList(
            BiMap(
                dims[i], dims[i + 1], seed=np.random.default_rng(seeds[i]), dtype=dtype, symmetric=True
            )
            for i in range(len(hidden_dims))
        )
        self.eps = eps
        self.head = nn.Linear(hidden_dims[-1] * (hidden_dims[-1] + 1) // 2, n_classes, dtype=dtype)
        if batchnorm == "spd":
            self.batchnorms = nn.ModuleList(
                SPDBatchNorm(d, momentum=bn_momentum, karcher_steps=karcher_steps, dtype=dtype) for d in hidden_dims
            )
        elif batchnorm == "domain":
            self.batchnorms = nn.ModuleList(
                DomainSPDBatchNorm(d, karcher_steps=karcher_steps, dtype=dtype) for d in hidden_dims
            )

    @staticmethod
    def state_shapes(n_channels, hidden_dims, n_classes, batchnorm=None):
        """Name → shape of the ``state_dict`` of such an ``SPDNet``, without building it.

        Examples
        --------
        >>> from skfedspd.nn import SPDNet
        >>> SPDNet.state_shapes(6, (4,), 2, None)["bimaps.0.W_ref"]
        (6, 4)
        """
        dims = (int(n_channels),) + tuple(int(d) for d in hidden_dims)
        shapes = {}
        for i in range(len(dims) - 1):
            shapes[f"bimaps.{i}.V"] = shapes[f"bimaps.{i}.W_ref"] = (dims[i], dims[i + 1])
        shapes["head.weight"] = (int(n_classes), dims[-1] * (dims[-1] + 1) // 2)
        shapes["head.bias"] = (int(n_classes),)
        if batchnorm is not None:
            for i, d in enumerate(dims[1:]):
                shapes[f"batchnorms.{i}.log_bias"] = (d, d)
                if batchnorm == "spd":
                    shapes[f"batchnorms.{i}.running_mean"] = (d, d)
        return shapes

    def _reeig_inputs(self, X, normalize=None):
        """The input of each ReEig: the BiMap output, then ``normalize(i, bn, ·)`` with batch norm."""
        for i, bimap in enumerate(self.bimaps):
            if i:
                X = reeig(X, self.eps)
            X = bimap(X)
            if normalize is not None:
                X = normalize(i, self.batchnorms[i], X)
            yield X

    def features(self, X, domains=None):
        """Tangent-space features ``vech(log(ReEig(...)))``; ``domains`` for ``batchnorm="domain"``."""
        statistics = None
        if isinstance(X, DomainBatch):
            if domains is not None:
                raise ValueError("domains given twice: in the DomainBatch and as an argument")
            X, domains, statistics = X.X, X.domains, X.statistics
        if domains is not None and self.batchnorm != "domain":
            raise ValueError(f"domains are used by batchnorm='domain' only (this network has batchnorm={self.batchnorm!r})")
        if statistics is not None:
            # fixed domain statistics: each matrix whitened by its own domain's entry
            *_, X = self._reeig_inputs(X, lambda i, bn, Y: bn.whiten(Y, statistics[i][domains]))
            return reeig_logeig_vech(X, self.eps)
        if self.batchnorm is not None:
            *_, X = self._reeig_inputs(X, lambda i, bn, Y: bn(Y) if domains is None else bn(Y, domains))
            return reeig_logeig_vech(X, self.eps)
        for bimap in self.bimaps[:-1]:
            X = reeig(bimap(X), self.eps)
        return self.bimaps[-1].spectral_vech(X, self.eps)

    def forward(self, X, domains=None):
        return self.head(self.features(X, domains))

    def batchnorm_inputs(self, X):
        """The input of each batch-norm layer for ``X`` (one domain), normalized as in training."""
        inputs = []

        def record(i, bn, Z):
            inputs.append(Z)
            return bn.normalize_batch(Z)

        for _ in self._reeig_inputs(X, record):
            pass
        return inputs

    def adapted_forward(self, X, update, predict=True, include_self=False):
        """``batchnorm="domain"``: add the trials of ``X`` to their domains in ``update``, layer by
        layer and in order, then their logits without each trial itself (None when ``predict`` is
        False).
        """
        if self.batchnorm != "domain":
            raise ValueError(f"domain statistics need batchnorm='domain' (this network has batchnorm={self.batchnorm!r})")
        if self.training:
            self.eval()
        first, Y = None, X
        for i, (bimap, bn) in enumerate(zip(self.bimaps, self.batchnorms)):
            Z = bimap(reeig(Y, self.eps) if i else Y)
            first = Z if i == 0 else first
            at_update = update.add_in_order(Z, i)
            if i + 1 < len(self.bimaps):
                Y = bn.whiten(Z, at_update)
        if not predict:
            return None
        Y = X
        for i, (bimap, bn) in enumerate(zip(self.bimaps, self.batchnorms)):
            Z = first if i == 0 else bimap(reeig(Y, self.eps))
            Y = bn.whiten(Z, update.inv_halves(i, include_self))
        return self.head(reeig_logeig_vech(Y, self.eps))

    def recenter_(self):
        for bimap in self.bimaps:
            bimap.recenter_()
        self._steps_since_recenter = 0

    def after_step_(self):
        self._steps_since_recenter += 1
        if self._steps_since_recenter >= self.recenter_every:
            self.recenter_()

    def parameter_kinds(self):
        """BiMap weights ``"stiefel"``; head and batch-norm biases ``"euclidean"``; running means ``"local"``."""
        kinds = OrderedDict((f"bimaps.{i}.weight", "stiefel") for i in range(len(self.bimaps)))
        kinds["head.weight"] = "euclidean"
        kinds["head.bias"] = "euclidean"
        for name in self._batchnorm_state():
            kinds[name] = "local" if name.endswith("running_mean") else "euclidean"
        return kinds

    def _batchnorm_state(self):
        if self.batchnorm is None:
            return {}
        return {f"batchnorms.{name}": value for name, value in self.batchnorms.state_dict(keep_vars=True).items()}

    def _exported_state(self):
        return self._named_state(lambda bimap: bimap.weight)

    def _loadable_state(self):
        # The chart reference has W's shape; loading goes through set_weight, so computing
        # W itself (a polar factor) would be wasted.
        return self._named_state(lambda bimap: bimap.W_ref)

    def _named_state(self, stiefel):
        state = {f"bimaps.{i}.weight": stiefel(b) for i, b in enumerate(self.bimaps)}
        state["head.weight"] = self.head.weight
        state["head.bias"] = self.head.bias
        state.update(self._batchnorm_state())
        return state

    def _load_array(self, name, value, state):
        if name.startswith("bimaps."):
            self.bimaps[int(name.split(".")[1])].set_weight(value)
            # set_weight re-centres the chart: the step count towards the next re-centring
            # restarts, so a local update never depends on what the module trained before.
            self._steps_since_recenter = 0
        else:
            super()._load_array(name, value, state)

    def eigenvalue_clamp_fraction(self, X):
        """Fraction of eigenvalues clamped by each ReEig on input batch ``X`` (diagnostic)."""
        # With batch norm: each block normalized by its own batch mean (no running-mean update).
        normalize = None if self.batchnorm is None else (lambda i, bn, Y: bn.normalize_batch(Y))
        with torch.no_grad():
            return [
                float((torch.linalg.eigvalsh(Y) < self.eps).to(torch.float64).mean())
                for Y in self._reeig_inputs(X, normalize)
            ]
