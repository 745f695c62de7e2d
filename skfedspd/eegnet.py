"""EEGNet-8,2 (Lawhern et al., 2018) as a pure torch module, the deep baseline of FedSPDnet.

Reference: V. J. Lawhern, A. J. Solon, N. R. Waytowich, S. M. Gordon, C. P. Hung and
B. J. Lance, "EEGNet: a compact convolutional neural network for EEG-based brain–computer
interfaces", J. Neural Eng. 15 (2018) 056013, and its Keras code (``arl-eegmodels``).

Architecture (input ``(batch, n_channels, n_times)``; 'same' padding as in Keras)::

    block 1  Conv2d(1 → F1, (1, Kt), 'same', bias=False)            F1·Kt
             BatchNorm2d(F1)                                         2·F1
             depthwise Conv2d(F1 → F1·D, (C, 1), max-norm 1)         F1·D·C
             BatchNorm2d(F1·D), ELU, AvgPool(1, p1), Dropout         2·F1·D
    block 2  depthwise Conv2d(F1·D → F1·D, (1, Ks), 'same')          F1·D·Ks
             pointwise Conv2d(F1·D → F2, (1, 1))                     F1·D·F2
             BatchNorm2d(F2), ELU, AvgPool(1, p2), Dropout           2·F2
    head     Flatten, Linear(F2·T' → n_classes, max-norm 0.25)       (F2·T' + 1)·n_classes

with ``Kt = max(round(fs / 2), 32)``, ``Ks = max(round(fs / (2·p1)), 8)`` and
``T' = floor(floor(n_times / p1) / p2)``. The module returns logits. The paper's parameter
counts: 3 284 for PhysionetMI (64 channels, 160 Hz, 4 classes, ``n_times=480``), 5 303 for
Weibo2014 (60 channels, 200 Hz, 7 classes, ``n_times=800``). Initialisation follows Keras.
In federation, trainable tensors are ``"euclidean"`` (FedAvg) and BatchNorm buffers
``"local"``. ``norm="group"`` uses ``GroupNorm(1, channels)``: no buffers, per-sample
statistics (for differential privacy). Design notes: ``docs/guide/model.md``.
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
    """(left, right) zero padding of a stride-1 'same' conv (the extra sample on the right)."""
    left = (kernel_length - 1) // 2
    return left, kernel_length - 1 - left


def _lagged_gram(x, kernel_length, left):
    """Lagged Gram matrix ``G[i, j] = Σ x_pad[..., t + i] x_pad[..., t + j]`` of the windows of a
    'same' conv, exact at the zero-padded edges (FFT autocorrelation minus edge products).
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
    """The window sums ``m`` and lagged Gram matrix ``G`` of a 'same' conv over ``x``."""
    n_times = x.shape[-1]
    total = F.pad(x.sum(dim=tuple(range(x.dim() - 1))), (left, kernel_length - 1 - left))   # (T + K − 1,)
    return total.unfold(0, n_times, 1).sum(-1), _lagged_gram(x, kernel_length, left)


def _normalized_block1(scale, shift, w, y, D):
    """Block 1's output from its normalisation's affine map, the filtered signals and the spatial filters."""
    out = (scale.repeat_interleave(D, dim=-1)[..., None] * y
           + (shift.repeat_interleave(D, dim=-1) * w.sum(-1))[..., None])
    return out.unsqueeze(2)


def _same_correlate_fft(s, kernels, left):
    """'same' cross-correlation of each row ``s[..., o, :]`` with ``kernels[o]``, by FFT (no wrap)."""
    n_times, K = s.shape[-1], kernels.shape[-1]
    n = n_times + K
    padded = F.pad(s, (left, K - 1 - left))
    spectrum = torch.fft.rfft(padded, n=n) * torch.fft.rfft(kernels, n=n).conj()
    return torch.fft.irfft(spectrum, n=n)[..., :n_times]


class EEGNet(FederatedModule):
    """EEGNet-F1,D (default EEGNet-8,2) for ``(batch, n_channels, n_times)`` EEG: ``n_channels``
    EEG channels, ``n_times ≥ p1·p2`` samples at ``fs`` Hz (which sets the kernel lengths),
    ``n_classes`` logits; ``F1`` temporal filters, depth ``D``, ``F2`` pointwise filters,
    pooling ``p1``, ``p2``, ``dropout``; ``norm``: ``BatchNorm2d`` or one-group ``GroupNorm``
    (see the module docstring).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.eegnet import EEGNet
    >>> net = EEGNet(n_channels=64, n_times=480, n_classes=4, fs=160)
    >>> sum(p.numel() for p in net.parameters()), net.eval()(torch.randn(2, 64, 480)).shape
    (3284, torch.Size([2, 4]))
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
        """Project the spatial filters to norm ≤ 1 and the dense rows to norm ≤ 0.25, in place;
        call after each ``optimizer.step()``. Returns ``self``.
        """
        for weight, max_norm in ((self.depthwise_conv.weight, self.depthwise_max_norm),
                                 (self.classifier.weight, self.dense_max_norm)):
            weight.copy_(torch.renorm(weight, p=2, dim=0, maxnorm=max_norm))
        return self

    def parameter_kinds(self):
        """Ordered ``{state_dict key: "euclidean" | "local"}``: trainable tensors and BatchNorm buffers."""
        trainable = {name for name, _ in self.named_parameters()}
        return OrderedDict((key, "euclidean" if key in trainable else "local")
                           for key in self.state_dict())

    def _check_input(self, x):
        if x.dim() != 3 or x.shape[1:] != (self.n_channels, self.n_times):
            raise ValueError(f"expected input (batch, {self.n_channels}, {self.n_times}), "
                             f"got {tuple(x.shape)}")

    def forward(self, x):
        """Logits ``(batch, n_classes)`` of ``x`` of shape ``(batch, n_channels, n_times)``."""
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

        With BN1 the per-filter affine map ``y ↦ a_f (y − μ_f) + β_f`` and ``s_o = w_o · x`` the
        spatially filtered signals, ``out_o = a_f · k_f ⋆ s_o + (β_f − a_f μ_f) Σ_c w_o[c]``; the
        batch statistics are ``μ_f = k_fᵀ m / N`` and ``E[y_f²] = k_fᵀ G k_f / N``
        (:func:`_window_moments`). Running statistics are updated as ``BatchNorm2d`` does; forward
        hooks on ``temporal_conv``, ``bn1`` or ``depthwise_conv`` are not called.
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
        """:meth:`_block1_fast`'s end with ``norm="group"``: the statistics of each sample (``vmap``)."""
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

    Input: raw EEG trials ``(n_trials, n_channels, n_times)``, z-scored trial by trial. Trained
    like :class:`~skfedspd.SPDnetClassifier`, so it is also a local model of a federation.

    Parameters
    ----------
    fs : float, default=160.0
        Sampling frequency (sets the kernel lengths).
    F1, D, F2, p1, p2, dropout
        See :class:`EEGNet`.
    norm : {"batch", "group"}, default="batch"
        BatchNorm (running statistics, client-local in federation) or GroupNorm with one
        group (per trial; what trains under differential privacy).
    standardize : {"trial", "channel"}, default="trial"
        Each channel is centred; ``"trial"`` divides the trial by one standard deviation,
        ``"channel"`` each channel by its own.
    lr, batch_size, max_epochs, validation_fraction, early_stopping, validation_metric, schedule, dtype, device,
    random_state, verbose, warm_start, class_weight
        As in :class:`~skfedspd.SPDnetClassifier` (``dtype`` defaults to float32, ``lr`` to 1e-3).

    Attributes
    ----------
    classes_, n_features_in_ (channels), n_times_, module_, history_, best_epoch_, n_iter_,
    validation_used_, fitted_params_
        As in :class:`~skfedspd.SPDnetClassifier`.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd import EEGNetClassifier
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((24, 4, 128))  # trials, channels, times
    >>> y = np.array(["left", "right"] * 12)
    >>> clf = EEGNetClassifier(fs=128, max_epochs=2, random_state=0).fit(X, y)
    >>> clf.predict(X[:3]).shape, clf.n_times_
    ((3,), 128)
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
        """Trials z-scored (``standardize``) as a tensor of ``dtype`` on ``device``."""
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
