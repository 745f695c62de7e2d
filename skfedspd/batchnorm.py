"""SPD batch normalization: one running mean for all inputs, or one per domain.

A batch of matrices is re-centred at the identity by its (Riemannian) mean, then moved to a
learned bias. :class:`DomainSPDBatchNorm` keeps a statistic per domain (subject, session),
whose labels travel with the matrices in a :class:`DomainBatch`.
"""

import numpy as np
import torch
from torch import nn

from .functional import expm_sym, karcher_mean, spd_geodesic, sqrtm_invsqrtm
from .layers import tensor_version

__all__ = ["SPDBatchNorm", "DomainSPDBatchNorm", "DomainBatch"]


class _SPDNormalization(nn.Module):
    """Shared part of the SPD batch normalizations: ``X ↦ C X Cᵀ``, ``C = B^{1/2} M^{-1/2}``,
    ``M`` the batch mean and ``B = exp(sym(log_bias))`` the learned SPD bias.
    """

    def __init__(self, n, karcher_steps=1, dtype=torch.float64):
        super().__init__()
        if karcher_steps < 0:
            raise ValueError(f"karcher_steps must be >= 0, got {karcher_steps}")
        self.karcher_steps = int(karcher_steps)
        self.log_bias = nn.Parameter(torch.zeros(n, n, dtype=dtype))
        self._bias_half_cache = None

    def bias(self):
        """The SPD bias ``B = exp(sym(log_bias))``."""
        L = self.log_bias
        return expm_sym(0.5 * (L + L.transpose(-1, -2)))

    def batch_mean(self, X):
        return karcher_mean(X, self.karcher_steps)

    def normalize(self, X, M):
        """``C X Cᵀ``, ``C = B^{1/2} M^{-1/2}``: mean ``M`` to the identity, then to ``B``."""
        return self.whiten(X, sqrtm_invsqrtm(M)[1])

    def whiten(self, X, M_inv_half):
        """``C X Cᵀ`` from ``M^{-1/2}`` (one per matrix, or one for all)."""
        C = self._bias_half() @ M_inv_half
        return C @ X @ C.transpose(-1, -2)

    def _bias_half(self):
        """``B^{1/2}``, cached per value of ``log_bias`` without autograd."""
        L = self.log_bias
        if torch.is_grad_enabled():
            return expm_sym(0.25 * (L + L.transpose(-1, -2)))
        key = (L.data_ptr(), tensor_version(L))
        cached = getattr(self, "_bias_half_cache", None)  # modules pickled before the cache
        if cached is None or cached[0] != key:
            cached = self._bias_half_cache = (key, expm_sym(0.25 * (L + L.transpose(-1, -2))))
        return cached[1]

    def normalize_batch(self, X):
        """Normalize ``X`` by its own mean (no side effect)."""
        return self.normalize(X, self.batch_mean(X))


class SPDBatchNorm(_SPDNormalization):
    """Riemannian batch normalization of SPD matrices (Brooks et al., NeurIPS 2019).

    Training: each batch is normalized by its own affine-invariant mean to the learnable SPD
    bias ``B``, and the running mean moves along the geodesic towards it by ``momentum``.
    Evaluation: the running mean is used. Why the affine-invariant mean:
    ``docs/guide/model.md``.

    Parameters
    ----------
    n : int
        Matrix size.
    momentum : float in (0, 1], default=0.1
        Geodesic step of the running mean towards each batch mean.
    karcher_steps : int, default=1
        Karcher steps after the log-Euclidean start (0: log-Euclidean mean).
    dtype : torch.dtype

    Attributes
    ----------
    running_mean : buffer of shape (n, n)
        A ``"local"`` array in federation.
    log_bias : parameter of shape (n, n)
        ``B = exp(sym(log_bias))``; ``"euclidean"``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.batchnorm import SPDBatchNorm
    >>> X = torch.as_tensor(make_spd_classification(n_matrices=16, n_channels=3, seed=0)[0])
    >>> bn = SPDBatchNorm(3)
    >>> bn(X).shape, bool((bn.running_mean != torch.eye(3, dtype=X.dtype)).any())
    (torch.Size([16, 3, 3]), True)
    """

    def __init__(self, n, momentum=0.1, karcher_steps=1, dtype=torch.float64):
        super().__init__(n, karcher_steps=karcher_steps, dtype=dtype)
        if not 0 < momentum <= 1:
            raise ValueError(f"momentum must be in (0, 1], got {momentum}")
        self.momentum = float(momentum)
        self.register_buffer("running_mean", torch.eye(n, dtype=dtype))

    def forward(self, X):
        if not self.training:
            return self.normalize(X, self.running_mean)
        M = self.batch_mean(X)
        with torch.no_grad():
            self.running_mean.copy_(spd_geodesic(self.running_mean, M.detach(), self.momentum))
        return self.normalize(X, M)


def domain_codes(domains, n_matrices):
    """Integer codes ``0..n_domains-1`` of per-matrix domain labels (any hashable type)."""
    if isinstance(domains, torch.Tensor):
        domains = domains.detach().cpu().numpy()
    domains = np.asarray(domains)
    if domains.ndim != 1 or len(domains) != n_matrices:
        raise ValueError(
            f"domains must be a 1-D array with one label per matrix ({n_matrices}), got shape {domains.shape}"
        )
    return np.unique(domains, return_inverse=True)[1].reshape(-1)


class DomainBatch:
    """A batch of matrices with one domain label per matrix, indexable like a tensor.

    Parameters
    ----------
    X : torch.Tensor of shape (n_matrices, n, n)
    domains : array-like of shape (n_matrices,)
        Domain labels of any hashable type (stored as integer codes).
    statistics : list of torch.Tensor or None, default=None
        Fixed ``M^{-1/2}`` of every domain at each batch-norm layer (DP-SGD), used instead of
        the batch's own means.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.batchnorm import DomainBatch
    >>> batch = DomainBatch(torch.eye(2).expand(3, 2, 2), ["s2", "s1", "s2"])
    >>> len(batch), batch[torch.tensor([2, 0])].domains
    (3, tensor([1, 1]))
    """

    def __init__(self, X, domains, statistics=None):
        self.X = X
        self.domains = torch.as_tensor(domain_codes(domains, len(X)))
        self.statistics = statistics

    def __len__(self):
        return len(self.X)

    def __getitem__(self, index):
        return self.with_inputs(self.X[index], self.domains[index])

    def with_inputs(self, X, domains=None):
        """A batch of ``X`` with this batch's codes (or ``domains``) and statistics."""
        batch = DomainBatch.__new__(DomainBatch)
        batch.X, batch.domains, batch.statistics = X, self.domains if domains is None else domains, self.statistics
        return batch


class DomainSPDBatchNorm(_SPDNormalization):
    """SPD batch normalization with domain-specific statistics (SPDDSMBN, Kobler et al., 2022).

    Each domain present in a call is normalized by the mean of its own matrices in that call,
    to one shared learnable bias ``B``, in training and evaluation; ``domains=None`` makes the
    call one domain. Nothing domain-specific is stored.

    Parameters
    ----------
    n : int
        Matrix size.
    karcher_steps : int, default=1
    dtype : torch.dtype

    Examples
    --------
    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.functional import karcher_mean
    >>> from skfedspd.batchnorm import DomainSPDBatchNorm
    >>> X = torch.as_tensor(make_spd_classification(n_matrices=12, n_channels=3, seed=0)[0])
    >>> X = torch.cat([X[:6], 100 * X[6:]])
    >>> Y = DomainSPDBatchNorm(3)(X, domains=["a"] * 6 + ["b"] * 6).detach()
    >>> [torch.allclose(karcher_mean(part, 20), torch.eye(3, dtype=X.dtype), atol=1e-2) for part in (Y[:6], Y[6:])]
    [True, True]
    """

    def forward(self, X, domains=None):
        if domains is None:
            return self.normalize_batch(X)
        codes = domain_codes(domains, X.shape[0])
        if codes.max() == 0:
            return self.normalize_batch(X)
        order = np.argsort(codes, kind="stable")
        bounds = np.flatnonzero(np.diff(codes[order])) + 1
        parts = [self.normalize_batch(X[torch.as_tensor(idx, device=X.device)])
                 for idx in np.split(order, bounds)]
        inverse = torch.as_tensor(np.argsort(order, kind="stable"), device=X.device)
        return torch.cat(parts)[inverse]
