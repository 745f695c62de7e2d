"""EEGNet-8,2 (Lawhern et al., 2018) as a pure torch module, the deep baseline of FedSPDnet.

Reference: V. J. Lawhern, A. J. Solon, N. R. Waytowich, S. M. Gordon, C. P. Hung and
B. J. Lance, "EEGNet: a compact convolutional neural network for EEG-based brain–computer
interfaces", J. Neural Eng. 15 (2018) 056013, and its Keras code (``arl-eegmodels``).
braindecode is not used (it does not import with the CPU torch build).

Architecture (input ``(batch, n_channels, n_times)``, z-scored raw EEG, viewed as an image
``(batch, 1, n_channels, n_times)``; 'same' = zero padding that keeps the time length, the
extra sample of an even kernel going on the right, as in Keras)::

    block 1  Conv2d(1 → F1, (1, Kt), 'same', bias=False)            F1·Kt
             BatchNorm2d(F1)                                         2·F1
             depthwise Conv2d(F1 → F1·D, (C, 1), groups=F1,          F1·D·C
                              bias=False, max-norm 1)
             BatchNorm2d(F1·D), ELU, AvgPool(1, p1), Dropout         2·F1·D
    block 2  depthwise Conv2d(F1·D → F1·D, (1, Ks), 'same',          F1·D·Ks
                              groups=F1·D, bias=False)
             pointwise Conv2d(F1·D → F2, (1, 1), bias=False)         F1·D·F2
             BatchNorm2d(F2), ELU, AvgPool(1, p2), Dropout           2·F2
    head     Flatten, Linear(F2·T' → n_classes, bias, max-norm 0.25) (F2·T' + 1)·n_classes

with ``Kt = max(round(fs / 2), 32)``, ``Ks = max(round(fs / (2·p1)), 8)`` and
``T' = floor(floor(n_times / p1) / p2)`` (pooling floors, as Keras' 'valid' pooling does, so
``n_times`` need not be a multiple of ``p1·p2``). The module returns **logits** (no softmax):
use it with ``nn.CrossEntropyLoss``.

Parameter counts (the values of the FedSPDnet paper, checked in ``tests/test_eegnet.py``):

* PhysionetMI, C = 64, fs = 160 Hz, 4 classes, n_times = 480 (3 s): Kt = 80, Ks = 20,
  T' = 15 → 640 + 16 + 1024 + 32 + 320 + 256 + 32 + 964 = **3 284**.
* Weibo2014, C = 60, fs = 200 Hz, 7 classes: Kt = 100, Ks = 25, the convolutional part has
  800 + 16 + 960 + 32 + 400 + 256 + 32 = 2 496 parameters, so 5 303 requires a dense layer of
  2 807 = 16·T'·7 + 7 parameters, i.e. T' = 25, i.e. **n_times = 800** (4 s at 200 Hz; any
  n_times in [800, 831] floors to the same T').

Max-norm constraints: the method :meth:`EEGNet.apply_max_norm_` projects, in place, each
spatial filter of the depthwise conv onto the ball of L2 norm 1 and each output row of the
dense layer onto the ball of norm 0.25 (Keras ``max_norm(axis=0)`` semantics: one norm per
output unit). The training loop must call it after every ``optimizer.step()``, exactly as Keras
applies constraints after each update. A ``torch.nn.utils.parametrize`` parametrization was not
used because (i) it is a reparametrization, not a projection: gradients flow through the
normalisation, which is a different optimisation from Lawhern's; (ii) it renames the
state_dict keys (``...parametrizations.weight.original``), which would leak into the
federated aggregation code and into saved checkpoints. The constraint is also applied once at
construction, so it holds from the start.

Implementation of block 1: :meth:`EEGNet.forward` does not build the ``(batch, F1, C, T)``
maps of the temporal conv. BN1 is affine per temporal filter and the depthwise spatial conv is
linear over channels, so the spatial filters are applied first and the temporal conv runs, by
FFT, on the ``F1·D`` spatially filtered signals; BN1's batch mean and variance come exactly
from the input's lagged Gram matrix (see :meth:`EEGNet._block1_fast`). Same function, same
gradients and running-statistics updates as the layer-by-layer
:meth:`EEGNet._reference_forward` (up to rounding; checked in ``tests/test_eegnet.py``), about
10× faster per CPU training step for PhysionetMI (``benchmarks/bench_eegnet.py``).

Initialisation follows Keras: Glorot-uniform weights for every conv and for the dense layer,
zero dense bias, BatchNorm weight 1 / bias 0, BatchNorm momentum 0.01 and eps 1e-3 (Keras'
defaults momentum 0.99, eps 1e-3; torch's momentum is Keras' complement; braindecode's
EEGNetv4 uses the same values).

Federated learning: :meth:`EEGNet.parameter_kinds` maps every key of ``state_dict()`` to

* ``"euclidean"`` for trainable tensors (conv/dense weights, dense bias, *and* BatchNorm
  affine ``weight``/``bias``): they live in a Euclidean space and are averaged by FedAvg;
* ``"local"`` for BatchNorm buffers ``running_mean``, ``running_var``,
  ``num_batches_tracked``: they stay on each client and are never averaged, since they
  encode each client's own feature statistics (in the spirit of FedBN, Li et al., 2021, which
  also keeps the affine weight/bias local; here those are shared).

GroupNorm variant (``norm="group"``): the three BatchNorm layers become
``GroupNorm(1, channels)`` (Wu & He, 2018, with one group): each sample is normalised by its
own mean and variance over all its feature maps, then scaled and shifted per map (the same
``2·channels`` affine parameters, so the same parameter counts). No statistic mixes the
samples of a batch and nothing is kept between batches (no buffers, no ``"local"``
arrays): what per-sample differential privacy needs (:mod:`skfedspd.privacy`), and the
same function in training and evaluation. One group, not one per map: per-map
normalisation would divide each spatially filtered signal by its own power in every trial,
erasing the band power that motor imagery is decoded from; one group keeps the maps'
relative power (the input is already z-scored per trial).
"""

from collections import OrderedDict
from numbers import Real

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.utils._param_validation import Interval, StrOptions
from torch import nn

from .base import TorchClassifierBase
from .renamed import EPOCH_MERGES, EPOCH_RENAMED, accepts_renamed
from .federated_module import FederatedModule
from .validation import Count

__all__ = ["EEGNet", "EEGNetClassifier"]


def _kernel_lengths(fs, p1):
    """Temporal kernel length of block 1 and of the separable conv of block 2."""
    kt = max(int(round(0.5 * fs)), 32)
    ks = max(int(round(fs / (2 * p1))), 8)
    return kt, ks


def _same_padding(kernel_length):
    """(left, right) zero padding of a stride-1 'same' conv: TF/Keras and torch put the extra
    sample of an even kernel on the right."""
    left = (kernel_length - 1) // 2
    return left, kernel_length - 1 - left


def _lagged_gram(x, kernel_length, left):
    """Lagged Gram matrix of the windows of a 'same' conv, exact at the zero-padded edges.

    ``G[i, j] = Σ_{b, c} Σ_{t < T} x_pad[b, c, t + i] · x_pad[b, c, t + j]`` for
    ``x`` of shape ``(..., T)`` and ``x_pad`` = ``x`` zero-padded by ``left`` on the left and
    ``K − 1 − left`` on the right (``K = kernel_length``, ``i, j < K``). With ``d = j − i ≥ 0``
    and ``a = i − left``, ``G[i, j] = Σ_{a ≤ s < a + T} p_d[s]`` where
    ``p_d[s] = Σ_{b,c} x[s] x[s + d]`` (``x`` zero outside ``[0, T)``): the full
    autocorrelation ``Σ_s p_d[s]`` (by FFT, zero-padded to ``T + K`` so it does not wrap) minus
    the sum over ``s < a`` (``a ≥ 0``, the first ``K − 1 − left`` samples) or over
    ``s ≥ a + T`` (``a < 0``, the last ``left`` samples), which come from two small exact
    Gram products of the edge samples. Cost: one FFT of the input plus ``O(K²·B·C)``.
    """
    x = x.reshape(-1, x.shape[-1])
    n_times, K = x.shape[-1], kernel_length
    right = K - 1 - left
    spec = torch.view_as_real(torch.fft.rfft(x, n=n_times + K)).reshape(x.shape[0], -1)
    power = spec.square().sum(0).view(-1, 2).sum(-1)       # Σ_{b,c} |X(ω)|²
    acf = torch.fft.irfft(power, n=n_times + K)[:K]        # acf[d] = Σ_s p_d[s]
    lags = torch.arange(K, device=x.device)

    def edge_lag_products(start, stop):
        """p_d[s] for start ≤ s < stop, as a (stop − start, K) matrix."""
        block = x[:, start:min(stop + K - 1, n_times)]
        block = F.pad(block, (0, stop + K - 1 - start - block.shape[-1]))  # x = 0 beyond T
        gram = block[:, :stop - start].T @ block
        rows = torch.arange(stop - start, device=x.device)[:, None]
        return gram[rows, rows + lags]

    n_head = min(right, n_times)                            # p_d[s], s < a, for a ≤ right
    head = F.pad(edge_lag_products(0, n_head).cumsum(0), (0, 0, 1, 0))   # Σ_{s < a}
    tail_start = max(n_times - left, 0)                     # p_d[s], s ≥ a + T, for a ≥ −left
    n_tail = n_times - tail_start
    tail = F.pad(edge_lag_products(tail_start, n_times).flip(0).cumsum(0).flip(0),
                 (0, 0, 0, 1))                              # Σ_{s ≥ tail_start + r}
    a = torch.arange(K, device=x.device) - left
    outside = torch.where((a >= 0)[:, None], head[a.clamp(0, n_head)],
                          tail[(a + n_times - tail_start).clamp(0, n_tail)])   # [i, d]
    i = torch.arange(K, device=x.device)
    low = torch.minimum(i[:, None], i[None, :])
    lag = (i[:, None] - i[None, :]).abs()
    return acf[lag] - outside[low, lag]


def _window_moments(x, kernel_length, left):
    """The two parameter-free summaries of the windows of a 'same' conv over ``x``
    (``(..., C, T)``): ``m[i] = Σ x_pad[..., t + i]`` (shape ``(K,)``) and the lagged Gram
    matrix ``G`` (:func:`_lagged_gram`, ``(K, K)``), sums over every sample, channel and
    time. BN1's batch statistics and GroupNorm's per-sample ones (under ``vmap``) are
    quadratic forms of the temporal kernels in them (:meth:`EEGNet._block1_fast`)."""
    n_times = x.shape[-1]
    total = F.pad(x.sum(dim=tuple(range(x.dim() - 1))), (left, kernel_length - 1 - left))   # (T + K − 1,)
    return total.unfold(0, n_times, 1).sum(-1), _lagged_gram(x, kernel_length, left)


def _normalized_block1(scale, shift, w, y, D):
    """Block 1's output from the per-filter affine map ``y ↦ scale · y + shift`` of its
    normalisation (``(F1,)`` or per sample ``(B, F1)``), the spatially filtered convolutions
    ``y`` (``(B, F1·D, T)``) and the spatial filters ``w``: ``(B, F1·D, 1, T)``."""
    out = (scale.repeat_interleave(D, dim=-1)[..., None] * y
           + (shift.repeat_interleave(D, dim=-1) * w.sum(-1))[..., None])
    return out.unsqueeze(2)


def _same_correlate_fft(s, kernels, left):
    """'same' cross-correlation of each row ``s[..., o, :]`` with ``kernels[o]``, by FFT.

    ``out[..., o, t] = Σ_i kernels[o, i] · s_pad[..., o, t + i]`` with ``s_pad`` zero-padded by
    ``left`` on the left and ``K − 1 − left`` on the right: what ``Conv1d(groups=O)`` computes
    after ``F.pad``. The FFT length ``T + K`` exceeds ``T + K − 1``, so the circular
    correlation does not wrap; it is several times faster than the grouped conv (and its
    backward) on CPU for kernels this long.
    """
    n_times, K = s.shape[-1], kernels.shape[-1]
    n = n_times + K
    padded = F.pad(s, (left, K - 1 - left))
    spectrum = torch.fft.rfft(padded, n=n) * torch.fft.rfft(kernels, n=n).conj()
    return torch.fft.irfft(spectrum, n=n)[..., :n_times]


class EEGNet(FederatedModule):
    """EEGNet-F1,D (default EEGNet-8,2) for ``(batch, n_channels, n_times)`` EEG.

    Parameters
    ----------
    n_channels : int
        Number of EEG channels C (height of the depthwise spatial filter).
    n_times : int
        Number of time samples per trial; must be at least ``p1 * p2``. Need not be a
        multiple of ``p1 * p2`` (pooling floors).
    n_classes : int
        Number of output logits.
    fs : float
        Sampling frequency in Hz; sets ``Kt = max(round(fs/2), 32)`` and
        ``Ks = max(round(fs/(2 p1)), 8)``.
    F1, D, F2 : int
        Temporal filters, depth multiplier, separable (pointwise) filters.
    p1, p2 : int
        Average-pooling factors along time after blocks 1 and 2.
    dropout : float
        Dropout rate (Lawhern: 0.5 within-subject, 0.25 cross-subject; default 0.25).
    norm : {"batch", "group"}
        Normalisation layers ``bn1``, ``bn2``, ``bn3``: ``BatchNorm2d`` (Lawhern) or
        ``GroupNorm`` with one group (per sample; see the module docstring).

    See the module docstring for the architecture, the parameter counts (3 284 for
    PhysionetMI with n_times = 480, 5 303 for Weibo2014 with n_times = 800), the max-norm
    constraints and the federated ``parameter_kinds``.

    Examples
    --------
    The PhysionetMI network (64 channels at 160 Hz, 3 s trials, 4 classes):

    >>> import torch
    >>> from skfedspd.eegnet import EEGNet
    >>> net = EEGNet(n_channels=64, n_times=480, n_classes=4, fs=160)
    >>> sum(p.numel() for p in net.parameters())
    3284
    >>> net.eval()(torch.randn(2, 64, 480)).shape  # logits
    torch.Size([2, 4])
    >>> net.parameter_kinds()["bn1.running_mean"]  # BatchNorm statistics stay on each client
    'local'
    """

    #: Keras ``max_norm`` values of Lawhern et al.
    depthwise_max_norm = 1.0
    dense_max_norm = 0.25

    def __init__(self, n_channels, n_times, n_classes, fs, F1=8, D=2, F2=16, p1=4, p2=8,
                 dropout=0.25, norm="batch"):
        super().__init__()
        n_channels, n_times, n_classes = int(n_channels), int(n_times), int(n_classes)
        if min(n_channels, n_classes, F1, D, F2, p1, p2) < 1:
            raise ValueError("n_channels, n_classes, F1, D, F2, p1 and p2 must be positive")
        if fs <= 0:
            raise ValueError(f"fs must be positive, got {fs}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        if norm not in ("batch", "group"):
            raise ValueError(f"norm must be 'batch' or 'group', got {norm!r}")
        n_out = (n_times // p1) // p2
        if n_out < 1:
            raise ValueError(f"n_times={n_times} is too short for pooling p1*p2={p1 * p2}")

        self.n_channels, self.n_times, self.n_classes, self.fs = n_channels, n_times, n_classes, fs
        self.F1, self.D, self.F2, self.p1, self.p2 = F1, D, F2, p1, p2
        self.dropout, self.norm = dropout, norm
        self.kernel_length, self.separable_kernel_length = _kernel_lengths(fs, p1)
        self.n_features = F2 * n_out

        def normalization(channels):  # Keras BatchNormalization defaults (momentum .99, eps 1e-3)
            if norm == "group":
                return nn.GroupNorm(1, channels, eps=1e-3)
            return nn.BatchNorm2d(channels, momentum=0.01, eps=1e-3)

        # Block 1: temporal conv, then depthwise spatial conv (one spatial filter bank per
        # temporal filter).
        # 'same' padding is applied explicitly in forward (F.pad): identical to
        # padding="same" but without torch's copy/warning for even kernel lengths.
        self.temporal_conv = nn.Conv2d(1, F1, (1, self.kernel_length), bias=False)
        self.bn1 = normalization(F1)
        self.depthwise_conv = nn.Conv2d(F1, F1 * D, (n_channels, 1), groups=F1, bias=False)
        self.bn2 = normalization(F1 * D)
        self.pool1 = nn.AvgPool2d((1, p1))
        self.drop1 = nn.Dropout(dropout)
        # Block 2: separable conv = depthwise temporal conv + pointwise 1x1 conv.
        self.separable_depthwise = nn.Conv2d(F1 * D, F1 * D, (1, self.separable_kernel_length),
                                             groups=F1 * D, bias=False)
        self.separable_pointwise = nn.Conv2d(F1 * D, F2, (1, 1), bias=False)
        self.bn3 = normalization(F2)
        self.pool2 = nn.AvgPool2d((1, p2))
        self.drop2 = nn.Dropout(dropout)
        # Classifier.
        self.classifier = nn.Linear(self.n_features, n_classes)
        self.activation = nn.ELU()

        self.reset_parameters()

    def reset_parameters(self):
        """Keras-style initialisation (Glorot uniform, zero bias), then the max-norm projection."""
        for module in (self.temporal_conv, self.depthwise_conv, self.separable_depthwise,
                       self.separable_pointwise, self.classifier):
            nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(self.classifier.bias)
        for bn in (self.bn1, self.bn2, self.bn3):
            bn.reset_parameters()
        self.apply_max_norm_()

    def after_step_(self):
        self.apply_max_norm_()

    @torch.no_grad()
    def apply_max_norm_(self):
        """Project the constrained weights back onto their max-norm balls, in place.

        Depthwise spatial filters (one per output map, norm over the C channel weights)
        to L2 norm ≤ 1; dense rows (one per class, norm over the inputs) to norm ≤ 0.25.
        Call after each ``optimizer.step()``. Returns ``self``.
        """
        for weight, max_norm in ((self.depthwise_conv.weight, self.depthwise_max_norm),
                                 (self.classifier.weight, self.dense_max_norm)):
            weight.copy_(torch.renorm(weight, p=2, dim=0, maxnorm=max_norm))
        return self

    def parameter_kinds(self):
        """Ordered ``{state_dict key: "euclidean" | "local"}``, in ``state_dict()`` order.

        Trainable parameters (including BatchNorm affine weight/bias) are ``"euclidean"`` and
        are averaged by FedAvg; buffers (BatchNorm running_mean, running_var,
        num_batches_tracked) are ``"local"`` and stay on each client (FedBN).
        """
        trainable = {name for name, _ in self.named_parameters()}
        return OrderedDict((key, "euclidean" if key in trainable else "local")
                           for key in self.state_dict())

    def _check_input(self, x):
        if x.dim() != 3 or x.shape[1:] != (self.n_channels, self.n_times):
            raise ValueError(f"expected input (batch, {self.n_channels}, {self.n_times}), "
                             f"got {tuple(x.shape)}")

    def forward(self, x):
        """Logits ``(batch, n_classes)`` of ``x`` of shape ``(batch, n_channels, n_times)``.

        Block 1 (temporal conv → BN1 → depthwise spatial conv) is evaluated by
        :meth:`_block1_fast`, on the ``F1·D`` spatially filtered signals instead of the
        ``(batch, F1, C, T)`` feature maps; :meth:`_reference_forward` is the literal layer
        by layer computation, equal up to rounding.
        """
        self._check_input(x)
        return self._head(self._block1_fast(x))

    def _reference_forward(self, x):
        """Straightforward forward pass, layer by layer (same maths as :meth:`forward`)."""
        self._check_input(x)
        x = x.unsqueeze(1)                                  # (B, 1, C, T)
        x = F.pad(x, _same_padding(self.kernel_length))
        x = self.bn1(self.temporal_conv(x))                 # (B, F1, C, T)
        return self._head(self.depthwise_conv(x))           # (B, F1·D, 1, T)

    def _head(self, x):
        """BN2 onwards: ``(B, F1·D, 1, T)`` output of the depthwise conv → logits."""
        x = self.activation(self.bn2(x))
        x = self.drop1(self.pool1(x))                       # (B, F1·D, 1, T // p1)
        x = F.pad(x, _same_padding(self.separable_kernel_length))
        x = self.separable_pointwise(self.separable_depthwise(x))
        x = self.activation(self.bn3(x))                    # (B, F2, 1, T // p1)
        x = self.drop2(self.pool2(x))                       # (B, F2, 1, T')
        return self.classifier(x.flatten(1))

    def _block1_fast(self, x):
        """``depthwise_conv(bn1(temporal_conv(pad(x))))`` without the ``(B, F1, C, T)`` maps.

        Why it is the same function. Write ``y_f[b, c] = k_f ⋆ x[b, c]`` for the 'same'
        temporal conv of channel ``c`` by filter ``f`` (kernel ``k_f``, length ``K``),
        ``w_o`` for the spatial filter of output map ``o`` (which reads the maps of filter
        ``f = o // D``) and ``μ_f, σ²_f`` for the statistics BN1 uses (batch statistics over
        ``(b, c, t)`` in training, running statistics in eval). BN1 is per filter an affine
        map ``y ↦ a_f (y − μ_f) + β_f`` with ``a_f = γ_f / sqrt(σ²_f + eps)``, the spatial conv
        is linear over channels, and spatial and temporal filtering commute, so::

            out_o[b] = Σ_c w_o[c] (a_f (y_f[b, c] − μ_f) + β_f)
                     = a_f · k_f ⋆ (Σ_c w_o[c] x[b, c]) + (β_f − a_f μ_f) · Σ_c w_o[c].

        The conv thus runs on the ``F1·D`` spatially filtered signals ``s_o = w_o · x``
        (``C`` times less work). The batch statistics only need the input through two
        parameter-free summaries (each window of the 'same' conv is the zero-padded
        ``x_pad[b, c, t : t + K]``, ``N = B·C·T`` windows in all)::

            μ_f      = k_fᵀ m / N,   m[i]    = Σ_{b,c,t} x_pad[b, c, t + i]
            E[y_f²]  = k_fᵀ G k_f / N, G[i, j] = Σ_{b,c,t} x_pad[b, c, t + i] x_pad[b, c, t + j]

        and ``σ²_f = E[y_f²] − μ_f²`` (biased, as BN normalises with); ``G`` is computed
        exactly, zero-padding edges included, by :func:`_lagged_gram`. Every step is
        differentiable, so autograd gives the exact gradients of the reference (through
        the batch statistics too). Running statistics are updated as ``BatchNorm2d`` does
        (momentum, unbiased ``σ² · N / (N − 1)``, ``num_batches_tracked``). The one
        numerical difference: ``E[y²] − μ²`` cancels when ``|μ_f| ≫ σ_f``, which the
        centred input of :class:`EEGNetClassifier` avoids (``μ_f ≈ 0``).
        Forward hooks registered on ``temporal_conv``, ``bn1`` or ``depthwise_conv`` are
        not called (those modules only hold the parameters and buffers).
        """
        batch, n_channels, n_times = x.shape
        kernel, F1, D = self.kernel_length, self.F1, self.D
        left, _ = _same_padding(kernel)
        k = self.temporal_conv.weight.reshape(F1, kernel)
        w = self.depthwise_conv.weight.reshape(F1 * D, n_channels)
        bn = self.bn1

        s = torch.matmul(w.expand(batch, -1, -1), x)        # (B, F1·D, T) spatial filtering
        y = _same_correlate_fft(s, k.repeat_interleave(D, dim=0), left)   # k_f ⋆ s_o
        if isinstance(bn, nn.GroupNorm):
            return self._group_norm_block1(x, k, w, y)

        use_batch_stats = bn.training or bn.running_mean is None
        if use_batch_stats:
            n = batch * n_channels * n_times
            m, G = _window_moments(x, kernel, left)              # (K,), (K, K)
            mean = (k @ m) / n
            var = (((k @ G) * k).sum(-1) / n - mean.square()).clamp_min(0)   # biased
            if bn.training and bn.track_running_stats:
                with torch.no_grad():               # as BatchNorm2d.forward + F.batch_norm
                    bn.num_batches_tracked.add_(1)
                    factor = (bn.momentum if bn.momentum is not None
                              else 1.0 / float(bn.num_batches_tracked))
                    bn.running_mean.lerp_(mean.detach(), factor)
                    bn.running_var.lerp_(var.detach() * (n / (n - 1)), factor)
        else:
            mean, var = bn.running_mean, bn.running_var
        scale = torch.rsqrt(var + bn.eps)
        if bn.affine:
            scale = bn.weight * scale
        shift = -scale * mean
        if bn.affine:
            shift = shift + bn.bias
        return _normalized_block1(scale, shift, w, y, D)

    def _group_norm_block1(self, x, k, w, y):
        """:meth:`_block1_fast`'s end with ``norm="group"``: the same algebra with the
        statistics of one sample instead of the batch's. ``bn1`` (one group) normalises
        sample ``b`` by ``μ_b, σ²_b`` over all its ``(f, c, t)``; with ``n = F1·C·T``::

            μ_b = Σ_f k_fᵀ m_b / n,   E_b[y²] = Σ_f k_fᵀ G_b k_f / n

        (``m_b``, ``G_b``: the window sums and lagged Gram matrix of sample ``b`` alone, by
        :func:`_window_moments` under ``vmap``), then ``a_{b,f} = γ_f / sqrt(σ²_b + eps)``."""
        batch, n_channels, n_times = x.shape
        kernel, F1, D, bn = self.kernel_length, self.F1, self.D, self.bn1
        left, _ = _same_padding(kernel)
        n = F1 * n_channels * n_times
        m, G = torch.vmap(lambda sample: _window_moments(sample, kernel, left))(x)   # (B, K), (B, K, K)
        mean = m @ k.sum(0) / n                                                     # (B,)
        var = (torch.einsum("fi,bij,fj->b", k, G, k) / n - mean.square()).clamp_min(0)   # biased
        scale = bn.weight * torch.rsqrt(var + bn.eps)[:, None]                      # (B, F1)
        shift = bn.bias - scale * mean[:, None]
        return _normalized_block1(scale, shift, w, y, D)

    def extra_repr(self):
        return (f"n_channels={self.n_channels}, n_times={self.n_times}, "
                f"n_classes={self.n_classes}, fs={self.fs}, F1={self.F1}, D={self.D}, "
                f"F2={self.F2}, Kt={self.kernel_length}, Ks={self.separable_kernel_length}, "
                f"dropout={self.dropout}, norm={self.norm!r}")


#: Axes of the standard deviation that divides each centred trial.
_STANDARDIZE_AXES = {"trial": (-2, -1), "channel": -1}


class EEGNetClassifier(TorchClassifierBase):
    """EEGNet-8,2 (Lawhern et al., 2018) as a scikit-learn classifier.

    Input: raw EEG trials ``(n_trials, n_channels, n_times)``, z-scored trial by trial
    before the network (``standardize``). Trained by the same routine, schedule and
    early stopping as :class:`~skfedspd.SPDnetClassifier`, so it is also the local model of
    federated EEGNet (``FederatedSPDnetClassifier(estimator=EEGNetClassifier(...))``: FedAvg
    of the trainable weights, BatchNorm running statistics kept on each client).

    Parameters
    ----------
    fs : float, default=160.0
        Sampling frequency (sets the kernel lengths).
    F1, D, F2, p1, p2, dropout
        See :class:`EEGNet`.
    norm : {"batch", "group"}, default="batch"
        The normalisation layers: ``"batch"``, BatchNorm as in Lawhern et al. (running
        statistics: client-local arrays in federation); ``"group"``, GroupNorm with one
        group, each trial normalised by its own statistics (no running statistics, nothing
        client-local, the same in training and prediction): the variant that trains under
        per-sample differential privacy (``FederatedSPDnetClassifier(privacy=DPSGD(...))``),
        where BatchNorm has to be frozen. See :class:`EEGNet`.
    standardize : {"trial", "channel"}, default="trial"
        How each trial is z-scored. Both centre every channel over time. ``"trial"``
        divides the whole trial by one standard deviation (over its channels and
        samples), which keeps the channels' relative power, the lateralised band power
        that motor imagery is decoded from. ``"channel"`` divides each channel by its
        own standard deviation, which erases it (PhysionetMI figures for both in
        ``docs/design-decisions.md``).
    lr, batch_size, max_epochs, validation_fraction, early_stopping, validation_metric, schedule, dtype, device,
    random_state, verbose, warm_start, class_weight
        As in :class:`~skfedspd.SPDnetClassifier` (``dtype`` defaults to float32 here, ``lr``
        to the EEGNet paper's 1e-3). The same validation rule: a split only when it holds
        at least ``max(50, 2 · n_classes)`` trials (``early_stopping="auto"``). ``fit(X, y, sample_weight=...)`` weights
        the loss as SPDnet does; the BatchNorm layers normalize with the unweighted
        statistics of each minibatch.

    Attributes
    ----------
    classes_, n_features_in_ (channels), n_times_, module_, history_, best_epoch_, n_iter_,
    validation_used_, fitted_params_
        As in :class:`~skfedspd.SPDnetClassifier`. As there, ``set_params`` stays permissive,
        and a fitted model whose network or input parameters (``fs``, ``F1``, ``D``, ``F2``,
        ``p1``, ``p2``, ``dropout``, ``standardize``, ``norm``, ``dtype``, ``device``) were
        changed since ``fit`` is refused, naming the parameter, at prediction, ``partial_fit``,
        a warm-started ``fit`` and saving: refit, or set it back.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd import EEGNetClassifier
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((24, 4, 128))  # trials, channels, times (1 s at 128 Hz)
    >>> y = np.array(["left", "right"] * 12)
    >>> clf = EEGNetClassifier(fs=128, max_epochs=2, random_state=0).fit(X, y)
    >>> clf.predict(X[:3]).shape, clf.classes_.tolist(), clf.n_times_
    ((3,), ['left', 'right'], 128)
    """

    @accepts_renamed(EPOCH_RENAMED, EPOCH_MERGES)  # the flat names of before, until 0.4
    def __init__(self, fs=160.0, F1=8, D=2, F2=16, p1=4, p2=8, dropout=0.25, standardize="trial", lr=1e-3,
                 batch_size=64, max_epochs=300, validation_fraction=0.1, early_stopping="auto",
                 validation_metric="loss", schedule=None, dtype="float32", device="cpu", random_state=None,
                 verbose=False, warm_start=False, class_weight=None, norm="batch"):
        self.fs = fs
        self.F1 = F1
        self.D = D
        self.F2 = F2
        self.p1 = p1
        self.p2 = p2
        self.dropout = dropout
        self.standardize = standardize
        self.lr = lr
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.validation_fraction = validation_fraction
        self.early_stopping = early_stopping
        self.validation_metric = validation_metric
        self.schedule = schedule
        self.dtype = dtype
        self.device = device
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start = warm_start
        self.class_weight = class_weight
        self.norm = norm

    _parameter_constraints: dict = {
        **TorchClassifierBase._parameter_constraints,
        "fs": [Interval(Real, 0, np.inf, closed="neither")],
        **{name: [Count(1)] for name in ("F1", "D", "F2", "p1", "p2")},
        "dropout": [Interval(Real, 0, 1, closed="left")],
        "standardize": [StrOptions(set(_STANDARDIZE_AXES))],
        "norm": [StrOptions({"batch", "group"})],
    }

    def _check_array(self, X, reset):
        X = np.asarray(X)
        if X.dtype == object or not np.issubdtype(X.dtype, np.number) or np.iscomplexobj(X):
            raise ValueError(f"X must be a real numeric array, got dtype {X.dtype}")
        if X.ndim != 3:
            raise ValueError(f"X must be a 3-D array (n_trials, n_channels, n_times), got shape {X.shape}")
        if X.shape[0] == 0:
            raise ValueError("X holds 0 trials; at least one is required")
        finite = np.isfinite(X).all(axis=(1, 2))
        if not finite.all():
            raise ValueError(f"X contains NaN or infinity (first at trial {int(np.argmin(finite))})")
        if reset:
            self.n_features_in_, self.n_times_ = X.shape[1], X.shape[2]
        elif X.shape[1:] != (self.n_features_in_, self.n_times_):
            raise ValueError(
                f"X has trials of shape {X.shape[1:]}, but the estimator was fitted on "
                f"{(self.n_features_in_, self.n_times_)}"
            )
        return X

    def to_tensor(self, X):
        """Trials z-scored (``standardize``) as a tensor of ``dtype`` on ``device``.

        Parameters
        ----------
        X : ndarray of shape (n_trials, n_channels, n_times)
            Validated by :meth:`check_inputs`.

        Returns
        -------
        torch.Tensor
        """
        centred = X - X.mean(axis=-1, keepdims=True)
        std = centred.std(axis=_STANDARDIZE_AXES[self.standardize], keepdims=True)
        z = centred / np.where(std > 0, std, 1.0)
        return torch.as_tensor(z, dtype=self.torch_dtype_, device=self.device)

    @staticmethod
    def _fitted_attributes():
        return TorchClassifierBase._fitted_attributes() + ("n_times_",)

    _fitted_params = TorchClassifierBase._fitted_params + ("fs", "F1", "D", "F2", "p1", "p2", "dropout", "standardize",
                                                           "norm")

    def _build_module(self, seed):
        return EEGNet(self.n_features_in_, self.n_times_, len(self.classes_), self.fs, F1=self.F1, D=self.D,
                      F2=self.F2, p1=self.p1, p2=self.p2, dropout=self.dropout,
                      norm=self.norm).to(self.torch_dtype_)
