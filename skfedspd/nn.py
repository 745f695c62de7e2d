"""SPDnet layers (BiMap, ReEig, LogEig, vech) and the ``SPDNet`` module.

Parameters of every module here can be exported and imported as named numpy arrays together
with their *kind* — ``"stiefel"`` (aggregated on the Stiefel manifold), ``"euclidean"``
(aggregated by weighted mean) or ``"local"`` (never leaves a client) — which is what the
federated layer needs.
"""

from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from .functional import logeig, reeig, reeig_logeig, reeig_logeig_vech, vech
from .stiefel import polar, random_stiefel, tangent_project

__all__ = ["BiMap", "ReEig", "LogEig", "ReEigLogEig", "Vech", "SPDNet", "FederatedModule"]


class _Congruence(torch.autograd.Function):
    """``Y = Wᵀ X W`` for one ``W`` (``n×k``) and a batch ``X`` (``..., n, n``).

    Same values and exact gradients as ``W.mT @ X @ W`` under autograd, without the
    layout copies that broadcasting a 2-D ``W`` against a batch costs (forward and backward):
    ``Z = X W`` is one ``(batch·n)×n`` by ``n×k`` product, and

        ∇W = Σ_b (X_bᵀ W G_b + X_b W G_bᵀ) = X_flatᵀ (W G)_flat + Σ_b Z_b G_bᵀ,
        ∇X_b = W G_b Wᵀ,

    valid for any (not necessarily symmetric) ``X`` and upstream gradient ``G``.
    """

    @staticmethod
    def forward(ctx, W, X):
        n, k = W.shape
        Z = (X.reshape(-1, n) @ W).view(X.shape[:-1] + (k,))  # X_b W
        ctx.save_for_backward(W, X, Z)
        Zb = Z.reshape(-1, n, k)
        return torch.bmm(W.transpose(0, 1).expand(Zb.shape[0], k, n), Zb).view(X.shape[:-2] + (k, k))

    @staticmethod
    def backward(ctx, G):
        W, X, Z = ctx.saved_tensors
        n, k = W.shape
        Gb = G.reshape(-1, k, k)
        M = torch.bmm(W.expand(Gb.shape[0], n, k), Gb)  # W G_b
        grad_W = grad_X = None
        if ctx.needs_input_grad[0]:
            ZGt = torch.bmm(Z.reshape(-1, n, k), Gb.transpose(-1, -2)).sum(0)  # Σ_b X_b W G_bᵀ
            grad_W = torch.addmm(ZGt, X.reshape(-1, n).transpose(0, 1), M.view(-1, k))
        if ctx.needs_input_grad[1]:
            grad_X = (M @ W.transpose(-1, -2)).view(X.shape)
        return grad_W, grad_X


def congruence(W, X):
    """``Wᵀ X W`` (batched over ``X``), with a copy-free backward for a 2-D ``W``."""
    if W.dim() != 2 or X.dim() < 2 or X.dtype != W.dtype or X.device != W.device:
        return W.transpose(-1, -2) @ X @ W
    return _Congruence.apply(W, X)


class _ChartCentre(torch.autograd.Function):
    """``W(V) = uf(W_ref + P_{W_ref}(V))`` at ``V = 0``: value ``W_ref``, adjoint ``P_{W_ref}``.

    The polar retraction's differential at 0 is the identity on the tangent space, so the
    composite's differential is ``P_{W_ref}`` (self-adjoint). Valid for ``W_ref`` on the
    manifold only; :class:`BiMap` checks that before using it.
    """

    @staticmethod
    def forward(ctx, V, W_ref):
        ctx.save_for_backward(W_ref)
        return W_ref.clone()

    @staticmethod
    def backward(ctx, G):
        (W_ref,) = ctx.saved_tensors
        A = W_ref.transpose(-1, -2) @ G
        return torch.addmm(G, W_ref, A + A.transpose(-1, -2), alpha=-0.5), None  # P_{W_ref}(G)


def _at_chart_centre(W_ref, V):
    """``V == 0`` and ``‖W_refᵀW_ref − I‖_F`` at rounding level, so ``uf(W_ref) = W_ref``.

    Both conditions are reduced on the device and read back with a single host sync.
    """
    W = W_ref.detach()
    gram = W.transpose(-1, -2) @ W
    gram.diagonal(dim1=-2, dim2=-1).sub_(1.0)
    on_stiefel = torch.linalg.matrix_norm(gram) <= 16 * W.shape[-1] * torch.finfo(W.dtype).eps
    return bool(on_stiefel.logical_and_(~V.detach().any()))


class BiMap(nn.Module):
    """Bilinear map ``Σ ↦ WᵀΣW`` with ``W ∈ St(in_dim, out_dim)``.

    ``W`` is trained by tangent-space local trivialization (Ablin et al., 2024):

        W = R_{W_ref}(P_{W_ref}(V)) = uf(W_ref + P_{W_ref}(V)),

    ``W_ref`` a buffer on the manifold and ``V`` a free Euclidean parameter starting at 0,
    so any torch optimizer (Adam, SGD, weight decay...) updates ``V`` while ``W`` stays
    exactly orthonormal. The polar factor has a custom SVD-free backward
    (:func:`skfedspd.stiefel.polar`), exact and finite at ``V = 0`` where autograd through
    the SVD is NaN. At the chart centre itself (``V = 0``, ``W_ref`` orthonormal to working
    precision — every forward pass when re-centring after each step) the SVD is skipped:
    ``uf(W_ref) = W_ref`` and the retraction's differential there is ``P_{W_ref}``, so the
    value and the gradient are the same.

    :meth:`recenter_` moves the chart: ``W_ref ← W``, ``V ← 0``. The training loop calls it
    every ``recenter_every`` optimizer steps; :meth:`set_weight` (the federated broadcast)
    does it as well. Optimizer state attached to ``V`` (Adam moments) is kept across a
    re-centring: it is expressed in ambient coordinates, and the projection ``P_{W_ref}``
    in the forward pass maps it to the new tangent space, whose difference from the old one
    is of the order of one step. A new optimizer (each federated round) starts from zero.
    """

    def __init__(self, in_dim, out_dim, seed=None, dtype=torch.float64):
        super().__init__()
        if out_dim > in_dim:
            raise ValueError(f"BiMap reduces dimension: out_dim={out_dim} > in_dim={in_dim}")
        W0 = torch.as_tensor(random_stiefel(in_dim, out_dim, seed), dtype=dtype)
        self.register_buffer("W_ref", W0)
        self.V = nn.Parameter(torch.zeros_like(W0))

    @property
    def weight(self):
        W_ref, V = self.W_ref, self.V
        if _at_chart_centre(W_ref, V):
            # Chart centre (every step when re-centring each step): uf(W_ref) = W_ref to
            # rounding and the differential is P_{W_ref}, so skip the SVD and its backward.
            return _ChartCentre.apply(V, W_ref)
        return polar(W_ref + tangent_project(W_ref, V))

    def forward(self, X):
        return congruence(self.weight, X)

    @torch.no_grad()
    def recenter_(self):
        # Always the polar factor (no chart-centre shortcut): at V = 0 it re-orthonormalises.
        self.W_ref.copy_(polar(self.W_ref + tangent_project(self.W_ref, self.V)))
        self.V.zero_()

    @torch.no_grad()
    def set_weight(self, W):
        self.W_ref.copy_(torch.as_tensor(W, dtype=self.W_ref.dtype))
        self.V.zero_()


class ReEig(nn.Module):
    """Eigenvalue rectification ``U max(eps, Λ) Uᵀ``."""

    def __init__(self, eps=1e-4):
        super().__init__()
        self.eps = eps

    def forward(self, X):
        return reeig(X, self.eps)


class LogEig(nn.Module):
    """Matrix logarithm ``U log(Λ) Uᵀ``."""

    def forward(self, X):
        return logeig(X)


class ReEigLogEig(nn.Module):
    """ReEig followed by LogEig with one eigendecomposition."""

    def __init__(self, eps=1e-4):
        super().__init__()
        self.eps = eps

    def forward(self, X):
        return reeig_logeig(X, self.eps)


class Vech(nn.Module):
    """Half-vectorisation with √2-scaled off-diagonal entries (an isometry)."""

    def forward(self, X):
        return vech(X)


class FederatedModule(nn.Module):
    """A module whose state can be exported/imported as named numpy arrays with kinds."""

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
        """Load named arrays (a subset of :meth:`parameter_kinds` is allowed)."""
        kinds = self.parameter_kinds()
        unknown = set(arrays) - set(kinds)
        if unknown:
            raise KeyError(f"unknown parameter names: {sorted(unknown)}")
        state = self._exported_state()
        with torch.no_grad():
            for name, value in arrays.items():
                value = np.asarray(value)
                if value.shape != tuple(state[name].shape):
                    raise ValueError(
                        f"parameter {name!r} has shape {value.shape}, expected {tuple(state[name].shape)}"
                    )
                self._load_array(name, torch.as_tensor(value))

    def _exported_state(self):
        return self.state_dict(keep_vars=True)

    def _load_array(self, name, value):
        self._exported_state()[name].copy_(value)


class SPDNet(FederatedModule):
    """SPDnet (Huang & Van Gool, 2017): BiRe blocks → LogEig → vech → Linear.

    Parameters
    ----------
    n_channels : int
        Input matrix size ``d_0``.
    hidden_dims : sequence of int
        Output size of each BiMap; one BiRe block (BiMap + ReEig) per entry. The last
        block's ReEig and the LogEig share one eigendecomposition.
    n_classes : int
        Number of outputs (logits).
    eps : float
        ReEig threshold.
    recenter_every : int
        Re-centre the BiMap charts every this many optimizer steps.
    seed : int or None
        Seed of the Stiefel initialisation (the linear head uses torch's default init,
        drawn from the caller's RNG state).
    dtype : torch.dtype
    """

    def __init__(
        self, n_channels, hidden_dims, n_classes, eps=1e-4, recenter_every=1, seed=None, dtype=torch.float64
    ):
        super().__init__()
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
            BiMap(dims[i], dims[i + 1], seed=np.random.default_rng(seeds[i]), dtype=dtype)
            for i in range(len(hidden_dims))
        )
        self.eps = eps
        self.head = nn.Linear(hidden_dims[-1] * (hidden_dims[-1] + 1) // 2, n_classes, dtype=dtype)

    def features(self, X):
        """Tangent-space features ``vech(log(ReEig(...)))``, shape ``(batch, d_L(d_L+1)/2)``."""
        for bimap in self.bimaps[:-1]:
            X = reeig(bimap(X), self.eps)
        return reeig_logeig_vech(self.bimaps[-1](X), self.eps)

    def forward(self, X):
        return self.head(self.features(X))

    def recenter_(self):
        for bimap in self.bimaps:
            bimap.recenter_()
        self._steps_since_recenter = 0

    def after_step_(self):
        self._steps_since_recenter += 1
        if self._steps_since_recenter >= self.recenter_every:
            self.recenter_()

    def parameter_kinds(self):
        kinds = OrderedDict((f"bimaps.{i}.weight", "stiefel") for i in range(len(self.bimaps)))
        kinds["head.weight"] = "euclidean"
        kinds["head.bias"] = "euclidean"
        return kinds

    def _exported_state(self):
        state = {f"bimaps.{i}.weight": b.weight for i, b in enumerate(self.bimaps)}
        state["head.weight"] = self.head.weight
        state["head.bias"] = self.head.bias
        return state

    def _load_array(self, name, value):
        if name.startswith("bimaps."):
            self.bimaps[int(name.split(".")[1])].set_weight(value)
        else:
            super()._load_array(name, value)

    def eigenvalue_clamp_fraction(self, X):
        """Fraction of eigenvalues clamped by each ReEig on input batch ``X`` (diagnostic)."""
        fractions = []
        with torch.no_grad():
            for bimap in self.bimaps:
                X = bimap(X)
                lam = torch.linalg.eigvalsh(X)
                fractions.append(float((lam < self.eps).to(torch.float64).mean()))
                X = reeig(X, self.eps)
        return fractions
