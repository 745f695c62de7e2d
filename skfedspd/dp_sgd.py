"""Sample-level differential privacy, the mechanism: DP-SGD on the Stiefel manifold.

DP-SGD (Abadi et al., 2016) with Riemannian steps (Han et al., 2024): Poisson sampling,
per-sample gradients (Riemannian for BiMap weights), joint clipping, Gaussian noise
projected to the tangent space, an optimizer step and the retraction
(:func:`dp_train_epochs`). BatchNorm runs frozen; domain means are released once by
:func:`release_domain_means`. The accounting is :mod:`skfedspd.privacy`'s; the mechanism
and its sensitivity analysis: ``docs/guide/privacy.md``.
"""

import contextlib
import math
import numbers

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from .batchnorm import DomainBatch, DomainSPDBatchNorm, SPDBatchNorm
from .functional import expm_sym, logeig, reeig
from .layers import BiMap
from .stiefel import tangent_project
from .training import seeded_torch
from .validation import check_count, check_positive

__all__ = [
    "stiefel_charts",
    "per_sample_gradients",
    "clip_and_sum",
    "add_gaussian_noise",
    "steps_per_epoch",
    "dp_train_epochs",
    "DOMAIN_COUNT_WEIGHT",
    "domain_mean_sensitivity",
    "clipped_domain_sums",
    "release_domain_means",
]


def stiefel_charts(module):
    """``{torch parameter name: W_ref}`` for the tangent coordinates ``V`` of every BiMap.

    Examples
    --------
    >>> from skfedspd.nn import SPDNet
    >>> from skfedspd.dp_sgd import stiefel_charts
    >>> charts = stiefel_charts(SPDNet(6, (4, 3), n_classes=2, seed=0))
    >>> {name: tuple(W.shape) for name, W in charts.items()}
    {'bimaps.0.V': (6, 4), 'bimaps.1.V': (4, 3)}
    """
    return {f"{name}.V" if name else "V": sub.W_ref
            for name, sub in module.named_modules() if isinstance(sub, BiMap)}


def _at_chart_centres(module):
    return all(not bool(sub.V.detach().any()) for sub in module.modules() if isinstance(sub, BiMap))


def _recentre(module):
    """Move every BiMap chart to the current weight (``V ← 0``) where ``V`` is not 0."""
    for sub in module.modules():
        if isinstance(sub, BiMap) and bool(sub.V.detach().any()):
            sub.recenter_()


# Samples per batched backward of method="batched": each of its c cotangents runs through
# the whole chunk's graph (c² work in the BiMap and spectral backward), against c× fewer calls;
# 8 was fastest for St(64, 18) at batch 64 (docs/benchmarks/speed.md).
_BACKWARD_CHUNK = 8


def _check_method(module, method):
    if method not in ("auto", "vmap", "batched", "loop"):
        raise ValueError(f"method must be 'auto', 'vmap', 'batched' or 'loop', got {method!r}")
    has_bimap = any(isinstance(sub, BiMap) for sub in module.modules())
    if method == "auto":
        return "batched" if has_bimap else "vmap"
    if method == "vmap" and has_bimap:
        raise ValueError("method='vmap' cannot differentiate the SPDnet layers (custom autograd "
                         "Functions without vmap rules and with data-dependent branches): use 'batched' or 'loop'")
    return method


def _matrices(X):
    """The tensor of an input batch (a :class:`~skfedspd.batchnorm.DomainBatch` carries one)."""
    return X.X if isinstance(X, DomainBatch) else X


def _batchnorms(module):
    return [sub for sub in module.modules() if isinstance(sub, (torch.nn.modules.batchnorm._BatchNorm, SPDBatchNorm))]


def _mixing_layers(module, X):
    """Names of the layers that would normalise ``X`` by statistics of several samples."""
    mixing = [type(sub).__name__ for sub in _batchnorms(module)
              if sub.training or not getattr(sub, "track_running_stats", True)]
    fixed = isinstance(X, DomainBatch) and X.statistics is not None
    if not fixed:
        mixing += [type(sub).__name__ for sub in module.modules() if isinstance(sub, DomainSPDBatchNorm)]
    return mixing


def _loop_gradients(module, names, params, X, y):
    """Per-sample gradients and losses, one forward/backward per sample (exact custom backward)."""
    grads = [torch.empty((len(y),) + p.shape, dtype=p.dtype, device=p.device) for p in params]
    losses = torch.empty(len(y), dtype=_matrices(X).dtype, device=y.device)
    with torch.enable_grad():
        for i in range(len(y)):
            loss = F.cross_entropy(module(X[i : i + 1]), y[i : i + 1])
            sample = torch.autograd.grad(loss, params, allow_unused=True)
            for g, gi in zip(grads, sample):
                if gi is None:
                    g[i].zero_()
                else:
                    g[i].copy_(gi)
            losses[i] = loss.detach()
    return dict(zip(names, grads)), losses


def _batched_backward_gradients(module, names, params, X, y):
    """Per-sample gradients and losses: one forward and one vmapped backward per chunk."""
    chunks, losses = [], []
    with torch.enable_grad():
        for start in range(0, len(y), _BACKWARD_CHUNK):
            loss = F.cross_entropy(module(X[start : start + _BACKWARD_CHUNK]), y[start : start + _BACKWARD_CHUNK],
                                   reduction="none")
            eye = torch.eye(len(loss), dtype=loss.dtype, device=loss.device)
            chunks.append(torch.autograd.grad(loss, params, grad_outputs=eye, is_grads_batched=True,
                                              allow_unused=True, materialize_grads=True))
            losses.append(loss.detach())
    return {name: torch.cat(g) for name, g in zip(names, zip(*chunks))}, torch.cat(losses)


def _vmap_gradients(module, names, params, X, y):
    """Per-sample gradients and losses by ``torch.func`` (``functional_call`` + ``vmap`` + ``grad``)."""
    buffers = dict(module.named_buffers())

    def sample_loss(weights, x, target):
        logits = functional_call(module, (weights, buffers), (x.unsqueeze(0),))
        loss = F.cross_entropy(logits, target.unsqueeze(0))
        return loss, loss.detach()

    weights = {name: p.detach() for name, p in zip(names, params)}
    with torch.enable_grad():
        grads, losses = vmap(grad(sample_loss, has_aux=True), in_dims=(None, 0, 0),
                             randomness="different")(weights, X, y)
    return grads, losses


def per_sample_gradients(module, X, y, *, method="auto"):
    """Gradients of each sample's cross-entropy loss, Riemannian for the Stiefel weights, as
    ``({parameter name: (batch, *shape) tensor}, losses)``.

    Parameters
    ----------
    module : FederatedModule
        BiMap charts centred and BatchNorm in eval mode (as :func:`dp_train_epochs` sets them).
    X : torch.Tensor of shape (batch, ...)
    y : torch.Tensor of shape (batch,)
    method : {"auto", "vmap", "batched", "loop"}, default="auto"
        ``torch.func`` vmap, a vmapped backward per chunk, or one pass per sample
        ("auto": "batched" with a BiMap, else "vmap").

    Examples
    --------
    >>> import torch
    >>> import torch.nn.functional as F
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.nn import SPDNet
    >>> from skfedspd.dp_sgd import per_sample_gradients
    >>> X, y = map(torch.as_tensor, make_spd_classification(n_matrices=8, n_channels=4, seed=0))
    >>> module = SPDNet(4, (3,), n_classes=3, seed=0)
    >>> grads, losses = per_sample_gradients(module, X, y)
    >>> F.cross_entropy(module(X), y).backward()
    >>> torch.allclose(grads["head.weight"].mean(0), module.head.weight.grad)
    True
    """
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} samples but y has {len(y)}")
    method = _check_method(module, method)
    mixing = _mixing_layers(module, X)
    if mixing:
        raise ValueError(f"{mixing} normalise with batch statistics, which mix the samples of a batch: put them "
                         "in eval mode with running statistics (dp_train_epochs freezes them), and give domain "
                         "batch norms fixed statistics (a DomainBatch with released means, release_domain_means)")
    if not _at_chart_centres(module):
        raise ValueError("BiMap charts are not centred (V != 0): call module.recenter_() first, "
                         "otherwise the gradient of V is not the Riemannian gradient at W")
    names, params = zip(*[(name, p) for name, p in module.named_parameters() if p.requires_grad])
    if len(y) == 0:
        grads = {name: torch.zeros((0,) + p.shape, dtype=p.dtype, device=p.device) for name, p in zip(names, params)}
        inputs = _matrices(X)
        return grads, torch.zeros(0, dtype=inputs.dtype, device=inputs.device)
    compute = {"vmap": _vmap_gradients, "batched": _batched_backward_gradients, "loop": _loop_gradients}[method]
    grads, losses = compute(module, list(names), list(params), X, y)
    for name, W in stiefel_charts(module).items():
        if name in grads:  # a frozen BiMap (requires_grad False) has no gradient
            grads[name] = tangent_project(W.detach(), grads[name])
    return grads, losses


def clip_and_sum(grads, clip_norm):
    """Clip each sample's gradients jointly to norm ``clip_norm`` and sum over the samples (a
    non-finite sample contributes zero); returns the sums and the norms before clipping.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.dp_sgd import clip_and_sum
    >>> grads = {"w": torch.tensor([[3.0, 0.0], [0.3, 0.0]]), "b": torch.tensor([[4.0], [0.4]])}
    >>> summed, norms = clip_and_sum(grads, clip_norm=1.0)
    >>> summed["w"], norms
    (tensor([0.9000, 0.0000]), tensor([5.0000, 0.5000]))
    """
    check_positive(clip_norm, "clip_norm")
    flat = [g.flatten(1) for g in grads.values()]
    norms = torch.cat(flat, dim=1).norm(dim=1) if flat else torch.zeros(0)
    finite = torch.isfinite(norms)
    # C / max(norm, C) = min(1, C / norm), and 1 at norm 0; non-finite samples get 0
    factor = torch.where(finite, clip_norm / torch.clamp(norms, min=clip_norm), 0.0)
    summed = {}
    for name, g in grads.items():
        scaled = torch.where(finite.view((-1,) + (1,) * (g.dim() - 1)), g, 0.0) * factor.view((-1,) + (1,) * (g.dim() - 1))
        summed[name] = scaled.sum(0)
    return summed, norms


def add_gaussian_noise(summed, *, std, charts, generator):
    """``summed + N(0, std² I)`` per parameter, drawn from the CPU ``generator``; the sums of
    the ``charts`` (:func:`stiefel_charts`) projected to the tangent space.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.dp_sgd import add_gaussian_noise
    >>> summed = {"b": torch.zeros(3, dtype=torch.float64)}
    >>> add_gaussian_noise(summed, std=0.5, charts={}, generator=torch.Generator().manual_seed(0))["b"].shape
    torch.Size([3])
    """
    noisy = {}
    for name, s in summed.items():
        noise = torch.randn(s.shape, generator=generator, dtype=s.dtype).to(s.device)
        value = s + std * noise
        if name in charts:
            value = tangent_project(charts[name].detach(), value)
        noisy[name] = value
    return noisy


def steps_per_epoch(sample_rate):
    """Poisson-sampled steps in one epoch: ``ceil(1 / q)``.

    Examples
    --------
    >>> from skfedspd.dp_sgd import steps_per_epoch
    >>> steps_per_epoch(16 / 120), steps_per_epoch(1.0)
    (8, 1)
    """
    if not (isinstance(sample_rate, numbers.Real) and 0 < sample_rate <= 1):
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    return max(1, math.ceil(round(1.0 / sample_rate, 9)))


@contextlib.contextmanager
def _frozen_batchnorm(module):
    """``module.train()`` with every BatchNorm layer in eval mode, restored on exit."""
    modes = {sub: sub.training for sub in module.modules()}
    norms = _batchnorms(module)
    unfrozen = [type(sub).__name__ for sub in norms if not getattr(sub, "track_running_stats", True)]
    if unfrozen:
        raise ValueError(f"{unfrozen} without running statistics normalise with batch statistics, which "
                         "mix the samples of a batch: per-sample differential privacy does not hold")
    module.train()
    for sub in norms:
        sub.eval()
    try:
        yield
    finally:
        for sub, mode in modes.items():
            sub.training = mode


def _make_optimizer(optimizer, module, lr):
    if isinstance(optimizer, torch.optim.Optimizer):
        if lr is not None:
            raise ValueError("pass lr=None with an optimizer instance (it has its own learning rate)")
        return optimizer
    check_positive(lr, "lr")
    if optimizer == "sgd":
        return torch.optim.SGD(module.parameters(), lr=lr)
    if optimizer == "adam":
        return torch.optim.Adam(module.parameters(), lr=lr)
    raise ValueError(f"optimizer must be 'sgd', 'adam' or a torch.optim.Optimizer, got {optimizer!r}")


def dp_train_epochs(module, X, y, *, n_epochs, sample_rate, clip_norm, noise_multiplier, lr, generator,
                    optimizer="sgd", method="auto"):
    """Train ``module`` by DP-SGD (Riemannian for the Stiefel weights) for ``n_epochs`` epochs
    of ``steps_per_epoch(sample_rate)`` steps, BatchNorm frozen.

    Parameters
    ----------
    module : FederatedModule
    X : torch.Tensor of shape (n, ...)
    y : torch.Tensor of shape (n,)
    n_epochs : int
    sample_rate : float
        Poisson sampling rate ``q`` in (0, 1].
    clip_norm : float
        ``C``: bound on each sample's joint gradient norm.
    noise_multiplier : float
        ``σ ≥ 0`` (noise standard deviation ``σ·C``).
    lr : float or None
        Learning rate of a fresh ``optimizer``.
    generator : torch.Generator
        A CPU generator: the sampling, the noise and dropout.
    optimizer : {"sgd", "adam"} or torch.optim.Optimizer, default="sgd"
    method : {"auto", "vmap", "batched", "loop"}, default="auto"

    Returns
    -------
    mean_loss : float
        Mean training loss (a local diagnostic, not private).
    n_dropped : int
        Samples whose gradient was not finite.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.nn import SPDNet
    >>> from skfedspd.dp_sgd import dp_train_epochs
    >>> X, y = map(torch.as_tensor, make_spd_classification(n_matrices=40, n_channels=4, seed=0))
    >>> loss, dropped = dp_train_epochs(SPDNet(4, (3,), n_classes=3, seed=0), X, y, n_epochs=1, sample_rate=0.25,
    ...                                 clip_norm=1.0, noise_multiplier=1.1, lr=0.05,
    ...                                 generator=torch.Generator().manual_seed(0))
    >>> dropped
    0
    """
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} samples but y has {len(y)}")
    check_count(n_epochs, "n_epochs", 0)
    n_steps = n_epochs * steps_per_epoch(sample_rate)
    check_positive(clip_norm, "clip_norm")
    check_positive(noise_multiplier, "noise_multiplier", allow_zero=True)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU generator (draws are moved to the module's device), "
                         f"got one on {generator.device}")
    method = _check_method(module, method)
    opt = _make_optimizer(optimizer, module, lr)
    charts = stiefel_charts(module)
    n = len(y)
    expected_batch = sample_rate * n
    total, count, dropped = 0.0, 0, 0
    dropout_seed = int(torch.randint(2**62, (1,), generator=generator))
    with _frozen_batchnorm(module), seeded_torch(dropout_seed):
        _recentre(module)
        for _ in range(n_steps):
            drawn = torch.rand(n, generator=generator) < sample_rate
            idx = drawn.nonzero().squeeze(1).to(_matrices(X).device)
            grads, losses = per_sample_gradients(module, X[idx], y[idx], method=method)
            summed, norms = clip_and_sum(grads, clip_norm)
            noisy = add_gaussian_noise(summed, std=noise_multiplier * clip_norm, charts=charts,
                                       generator=generator)
            opt.zero_grad(set_to_none=True)
            for name, p in module.named_parameters():
                if name in noisy:
                    p.grad = noisy[name] / expected_batch
            opt.step()
            module.after_step_()
            _recentre(module)
            finite = torch.isfinite(norms) & torch.isfinite(losses)
            dropped += int((~torch.isfinite(norms)).sum())
            total += float(losses[finite].sum())
            count += int(finite.sum())
    return (total / count if count else float("nan")), dropped


#: The weight ``c`` of a domain's trial count in its released vector ``(S, c·n)``, as a
#: share of the clip radius ``R`` (``c = R / 2``): the count costs little sensitivity
#: (``R·√(1 + 1/4)`` instead of ``R``) and is known to ``σ·√5`` trials.
DOMAIN_COUNT_WEIGHT = 0.5


def domain_mean_sensitivity(clip):
    """L2 sensitivity of one domain's released vector to one trial: ``√(R² + c²)``,
    ``c = DOMAIN_COUNT_WEIGHT · R``.

    Examples
    --------
    >>> from skfedspd.dp_sgd import domain_mean_sensitivity
    >>> round(domain_mean_sensitivity(2.0), 4)
    2.2361
    """
    check_positive(clip, "clip")
    return float(clip) * math.sqrt(1.0 + DOMAIN_COUNT_WEIGHT**2)


def _symmetric_gaussian(n_domains, n, std, generator, dtype):
    """Symmetric ``n × n`` noise, i.i.d. ``N(0, std²)`` in an orthonormal basis."""
    Z = torch.randn((n_domains, n, n), generator=generator, dtype=dtype)
    upper = torch.triu(Z, diagonal=1) / math.sqrt(2.0)
    return std * (upper + upper.transpose(-1, -2) + torch.diag_embed(Z.diagonal(dim1=-2, dim2=-1)))


def clipped_domain_sums(D, codes, n_domains, clip):
    """Each domain's clipped sum ``S_k = Σ_i clip_R(D_i)`` of the deviations ``D`` and its
    count: ``(sums, counts)``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.dp_sgd import clipped_domain_sums
    >>> D = torch.stack([3 * torch.eye(2), 0.5 * torch.eye(2)]).double()
    >>> clipped_domain_sums(D, torch.tensor([0, 0]), 1, clip=1.0)[1].tolist()
    [2.0]
    """
    check_positive(clip, "clip")
    D = D * torch.clamp(clip / torch.linalg.matrix_norm(D), max=1.0)[:, None, None]
    sums = torch.zeros((n_domains, *D.shape[1:]), dtype=D.dtype, device=D.device).index_add_(0, codes, D)
    return sums, torch.bincount(codes, minlength=n_domains).to(D.dtype)


def release_domain_means(module, X, *, references, clip, noise_multiplier, generator):
    """Each domain's mean at every batch-norm layer of ``module``, released by the Gaussian
    mechanism on a log-Euclidean mean clipped to ``clip`` around the public ``references``:
    ``M^{-1/2}`` per layer, of shape ``(n_domains, d_i, d_i)``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.nn import DomainBatch, SPDNet
    >>> from skfedspd.dp_sgd import release_domain_means
    >>> X = torch.as_tensor(make_spd_classification(n_matrices=40, n_channels=4, seed=0)[0])
    >>> net = SPDNet(4, (3,), n_classes=2, seed=0, batchnorm="domain")
    >>> released = release_domain_means(net, DomainBatch(X, [0] * 20 + [1] * 20), references=[torch.zeros(3, 3)],
    ...                                 clip=2.0, noise_multiplier=1.0, generator=torch.Generator().manual_seed(0))
    >>> [tuple(M.shape) for M in released]
    [(2, 3, 3)]
    """
    if getattr(module, "batchnorm", None) != "domain":
        raise ValueError("release_domain_means needs an SPDNet with batchnorm='domain'")
    if not isinstance(X, DomainBatch):
        raise TypeError(f"X must be a DomainBatch (the trials and their domain codes), got {type(X).__name__}")
    if len(references) != len(module.batchnorms):
        raise ValueError(f"one reference per batch-norm layer ({len(module.batchnorms)}) is needed, got {len(references)}")
    check_positive(clip, "clip")
    check_positive(noise_multiplier, "noise_multiplier", allow_zero=True)
    codes = X.domains.to(X.X.device)
    n_domains = int(codes.max()) + 1 if len(codes) else 0
    std = noise_multiplier * domain_mean_sensitivity(clip)
    released = []
    with torch.no_grad():
        Y = X.X
        for i, (bimap, bn) in enumerate(zip(module.bimaps, module.batchnorms)):
            Z = bimap(reeig(Y, module.eps) if i else Y)
            reference = torch.as_tensor(references[i], dtype=Z.dtype, device=Z.device)
            if reference.shape != Z.shape[1:]:
                raise ValueError(f"reference {i} has shape {tuple(reference.shape)}, the layer's means {tuple(Z.shape[1:])}")
            sums, counts = clipped_domain_sums(logeig(Z) - reference, codes, n_domains, clip)
            sums = sums + _symmetric_gaussian(n_domains, Z.shape[-1], std, generator, Z.dtype).to(Z.device)
            noisy_counts = counts + (std / (DOMAIN_COUNT_WEIGHT * clip)) * torch.randn(
                n_domains, generator=generator, dtype=Z.dtype).to(Z.device)
            log_means = reference + sums / torch.clamp(noisy_counts, min=1.0)[:, None, None]
            inv_half = expm_sym(-0.5 * log_means)
            released.append(inv_half)
            Y = bn.whiten(Z, inv_half[codes])
    return released
