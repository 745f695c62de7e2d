"""Tests of the pure-torch EEGNet-8,2 baseline (skfedspd.eegnet)."""

import copy

import pytest
import torch
import torch.nn.functional as F

from skfedspd.eegnet import EEGNet, _lagged_gram, _same_correlate_fft, _same_padding

# (n_channels, n_times, n_classes, fs)
PHYSIONET = (64, 480, 4, 160)
WEIBO = (60, 800, 7, 200)
SMALL = (8, 128, 3, 128)            # fast configuration for the behavioural tests
ODD = (8, 150, 3, 128)              # n_times not divisible by p1 * p2 = 32
CONFIGS = [SMALL, ODD, PHYSIONET]


def n_trainable(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("config, expected", [
    (PHYSIONET, 3284),
    (WEIBO, 5303),
    ((60, 831, 7, 200), 5303),      # floor: 831 // 4 // 8 = 25, as 800
    ((60, 832, 7, 200), 5415),      # one more pooled time step: + 16 * 7
])
def test_parameter_count_matches_paper(config, expected):
    assert n_trainable(EEGNet(*config)) == expected


def test_physionet_parameter_breakdown():
    model = EEGNet(*PHYSIONET)
    assert (model.kernel_length, model.separable_kernel_length) == (80, 20)
    counts = [p.numel() for p in model.parameters()]
    assert counts == [640, 8, 8, 1024, 16, 16, 320, 256, 16, 16, 960, 4]


@pytest.mark.parametrize("config", CONFIGS + [WEIBO])
@pytest.mark.parametrize("batch", [1, 5])
def test_output_shape(config, batch):
    n_channels, n_times, n_classes, fs = config
    model = EEGNet(*config).eval()
    out = model(torch.randn(batch, n_channels, n_times))
    assert out.shape == (batch, n_classes)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("n_times, n_out", [(128, 4), (150, 4), (159, 4), (160, 5), (32, 1)])
def test_n_times_not_multiple_of_32_floors(n_times, n_out):
    model = EEGNet(8, n_times, 3, 128)
    assert model.n_features == 16 * n_out
    assert model.classifier.in_features == 16 * n_out
    model.train()(torch.randn(4, 8, n_times)).sum().backward()


def test_too_short_input_rejected():
    with pytest.raises(ValueError):
        EEGNet(8, 31, 3, 128)


def test_wrong_input_shape_rejected():
    model = EEGNet(*SMALL)
    with pytest.raises(ValueError):
        model(torch.randn(2, 7, 128))


@pytest.mark.parametrize("config", CONFIGS)
def test_eval_forward_is_deterministic(config):
    torch.manual_seed(0)
    model = EEGNet(*config, dropout=0.5).eval()
    x = torch.randn(3, config[0], config[1])
    with torch.no_grad():
        a, b = model(x), model(x)
    assert torch.equal(a, b)
    # each sample is independent of the others in eval mode (BN uses running stats)
    assert torch.allclose(model(x[:1]), a[:1], atol=1e-6)


@pytest.mark.parametrize("config", CONFIGS)
def test_gradients_reach_every_parameter(config):
    torch.manual_seed(1)
    model = EEGNet(*config).train()
    x = torch.randn(6, config[0], config[1])
    y = torch.randint(config[2], (6,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_parameter_kinds():
    model = EEGNet(*SMALL)
    kinds = model.parameter_kinds()
    assert list(kinds) == list(model.state_dict())
    assert set(kinds.values()) == {"euclidean", "local"}
    params = {name for name, _ in model.named_parameters()}
    for key, kind in kinds.items():
        stat = key.rsplit(".", 1)[-1] in {"running_mean", "running_var", "num_batches_tracked"}
        assert kind == ("local" if stat else "euclidean"), key
        assert (key in params) == (kind == "euclidean"), key
    for bn in ("bn1", "bn2", "bn3"):
        assert kinds[f"{bn}.weight"] == kinds[f"{bn}.bias"] == "euclidean"
        for stat in ("running_mean", "running_var", "num_batches_tracked"):
            assert kinds[f"{bn}.{stat}"] == "local"
    assert sum(kind == "local" for kind in kinds.values()) == 9


@pytest.mark.parametrize("pooled, expected", [(6.9999999, 7), (7.0000001, 7), (6.5000001, 7), (12.25, 12)])
def test_a_pooled_count_loads_rounded(pooled, expected):
    """A pooled num_batches_tracked (a weighted mean, or a quantized secure sum that lands a
    hair below an integer) loads as the nearest count, not truncated."""
    model = EEGNet(*SMALL)
    model.set_parameters({"bn1.num_batches_tracked": torch.tensor(pooled, dtype=torch.float64).numpy()})
    assert int(model.bn1.num_batches_tracked) == expected


def _row_norms(weight):
    return weight.detach().flatten(1).norm(dim=1)


def test_max_norm_constraint():
    model = EEGNet(*SMALL)
    # holds at construction
    assert (_row_norms(model.depthwise_conv.weight) <= 1.0 + 1e-6).all()
    assert (_row_norms(model.classifier.weight) <= 0.25 + 1e-6).all()
    with torch.no_grad():
        model.depthwise_conv.weight.mul_(50.0)
        model.depthwise_conv.weight[0].zero_()              # zero filter stays zero
        model.classifier.weight.mul_(50.0)
        model.classifier.weight[1].mul_(1e-4)               # small row left alone
        model.temporal_conv.weight.mul_(50.0)
    small_row = model.classifier.weight[1].clone()
    temporal = model.temporal_conv.weight.clone()
    assert _row_norms(model.depthwise_conv.weight).max() > 1.0
    assert model.apply_max_norm_() is model
    dw, fc = _row_norms(model.depthwise_conv.weight), _row_norms(model.classifier.weight)
    assert (dw <= 1.0 + 1e-6).all() and (fc <= 0.25 + 1e-6).all()
    assert torch.allclose(dw[1:], torch.ones_like(dw[1:]), atol=1e-5)   # projected to sphere
    assert dw[0] == 0
    assert torch.equal(model.classifier.weight[1], small_row)
    assert torch.equal(model.temporal_conv.weight, temporal)          # unconstrained


def test_max_norm_in_training_loop():
    torch.manual_seed(2)
    model = EEGNet(*SMALL)
    opt = torch.optim.SGD(model.parameters(), lr=10.0)      # large steps break the constraint
    x, y = torch.randn(8, 8, 128), torch.randint(3, (8,))
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        model.apply_max_norm_()
        assert (_row_norms(model.depthwise_conv.weight) <= 1.0 + 1e-6).all()
        assert (_row_norms(model.classifier.weight) <= 0.25 + 1e-6).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtypes(dtype):
    torch.manual_seed(3)
    model = EEGNet(*ODD).to(dtype)
    x = torch.randn(4, 8, 150, dtype=dtype)
    out = model.train()(x)
    assert out.dtype == dtype
    out.sum().backward()
    assert all(p.grad.dtype == dtype for p in model.parameters())
    model.apply_max_norm_()
    assert model.depthwise_conv.weight.dtype == dtype
    assert model.eval()(x).dtype == dtype


def test_float32_float64_agree():
    torch.manual_seed(4)
    m32 = EEGNet(*SMALL).eval()
    m64 = EEGNet(*SMALL).double().eval()
    m64.load_state_dict(m32.state_dict())
    x = torch.randn(3, 8, 128)
    with torch.no_grad():
        assert torch.allclose(m32(x).double(), m64(x.double()), atol=1e-4)


def test_dropout_parameter():
    assert EEGNet(*SMALL).drop1.p == 0.25
    model = EEGNet(*SMALL, dropout=0.5)
    assert model.drop1.p == model.drop2.p == 0.5
    with pytest.raises(ValueError):
        EEGNet(*SMALL, dropout=1.0)


@pytest.mark.parametrize("fs", [128, 125, 160])   # (Kt, Ks) = (64, 16), (62, 16), (80, 20)
def test_same_padding_matches_torch_same(fs):
    """The explicit F.pad equals torch's padding='same' (also for even kernels) and keeps T."""
    import warnings

    model = EEGNet(8, 150, 3, fs)
    for conv, x in ((model.temporal_conv, torch.randn(2, 1, 8, 150)),
                    (model.separable_depthwise, torch.randn(2, 16, 1, 37))):
        k = conv.kernel_size[-1]
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = torch.nn.functional.conv2d(x, conv.weight, padding="same",
                                                  groups=conv.groups)
            got = conv(torch.nn.functional.pad(x, _same_padding(k)))
        assert got.shape == expected.shape and got.shape[-1] == x.shape[-1]
        assert torch.allclose(got, expected, atol=1e-6)


def test_state_dict_roundtrip_keeps_kinds():
    a, b = EEGNet(*SMALL), EEGNet(*SMALL)
    b.load_state_dict(a.state_dict())
    assert a.parameter_kinds() == b.parameter_kinds()
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key])


# --- fast block 1 (spatial filtering first, BN1 statistics from the lagged Gram matrix) ----

TOL = {torch.float64: 1e-10, torch.float32: 1e-4}


@pytest.mark.parametrize("n_times, kernel", [(50, 20), (50, 21), (480, 80), (30, 64),
                                             (20, 33), (40, 7), (32, 32), (5, 1)])
def test_lagged_gram_is_exact(n_times, kernel):
    """Against the explicit sum over all zero-padded windows (also for K > T)."""
    torch.manual_seed(5)
    x = torch.randn(3, 4, n_times, dtype=torch.float64)
    left, right = _same_padding(kernel)
    windows = F.pad(x, (left, right)).unfold(-1, kernel, 1)          # (B, C, T, K)
    expected = torch.einsum("bcti,bctj->ij", windows, windows)
    got = _lagged_gram(x, kernel, left)
    assert got.shape == (kernel, kernel)
    assert torch.allclose(got, expected, rtol=0, atol=1e-12 * expected.abs().max())


@pytest.mark.parametrize("n_times, kernel", [(480, 80), (37, 20), (20, 33), (16, 5)])
def test_same_correlate_fft_matches_grouped_conv(n_times, kernel):
    torch.manual_seed(6)
    s = torch.randn(3, 5, n_times, dtype=torch.float64)
    k = torch.randn(5, kernel, dtype=torch.float64)
    left, right = _same_padding(kernel)
    expected = F.conv1d(F.pad(s, (left, right)), k.unsqueeze(1), groups=5)
    got = _same_correlate_fft(s, k, left)
    assert got.shape == expected.shape == s.shape
    assert torch.allclose(got, expected, rtol=0, atol=1e-12 * expected.abs().max())


def _pair(config, dtype, seed=7, **kwargs):
    torch.manual_seed(seed)
    fast = EEGNet(*config, **kwargs).to(dtype)
    return fast, copy.deepcopy(fast)


def _assert_close(got, expected, rtol, scale=None, msg=None):
    """Elementwise, with an absolute floor of ``rtol × scale`` (default: ``max |expected|``)."""
    scale = expected.abs().max().item() if scale is None else scale
    torch.testing.assert_close(got, expected, rtol=rtol, atol=rtol * max(scale, 1e-30), msg=msg)


def _same_dropout_forward(model, method, x, seed):
    torch.manual_seed(seed)                 # same dropout masks for both implementations
    return getattr(model, method)(x)


@pytest.mark.parametrize("norm", ["batch", "group"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("config", [PHYSIONET, SMALL, ODD, (8, 32, 3, 128)])
def test_fast_forward_matches_reference(config, dtype, norm):
    """Training and eval forward, and the gradient of every parameter (and of the input)."""
    rtol = TOL[dtype]
    fast, ref = _pair(config, dtype, norm=norm)
    x = (1.5 * torch.randn(6, config[0], config[1], dtype=dtype) + 0.2)
    y = torch.randint(config[2], (6,))
    xf, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_f = _same_dropout_forward(fast.train(), "forward", xf, 0)
    out_r = _same_dropout_forward(ref.train(), "_reference_forward", xr, 0)
    _assert_close(out_f, out_r, rtol)
    F.cross_entropy(out_f, y).backward()
    F.cross_entropy(out_r, y).backward()
    grad_scale = max(p.grad.abs().max().item() for p in ref.parameters())
    for (name, p), (_, q) in zip(fast.named_parameters(), ref.named_parameters()):
        _assert_close(p.grad, q.grad, rtol, scale=grad_scale, msg=name)
    _assert_close(xf.grad, xr.grad, rtol)
    # bn1.bias adds a constant to each depthwise map, which BN2 (batch statistics) removes:
    # its exact gradient is 0 in training mode, in both implementations.
    if norm == "batch":
        assert fast.bn1.bias.grad.abs().max() <= 10 * rtol * grad_scale
    for key, value in fast.state_dict().items():
        _assert_close(value.double(), ref.state_dict()[key].double(), rtol)
    fast.eval(), ref.eval()
    with torch.no_grad():
        _assert_close(fast(x), ref._reference_forward(x), rtol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("momentum", [0.01, 0.3, None])
def test_fast_training_matches_reference_over_steps(dtype, momentum):
    """Several SGD steps + max-norm: same parameters, running statistics, eval logits."""
    rtol = TOL[dtype]
    fast, ref = _pair(SMALL, dtype)
    for model in (fast, ref):
        model.bn1.momentum = momentum
    opt_f = torch.optim.SGD(fast.parameters(), lr=0.2)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.2)
    for step in range(5):
        x = torch.randn(7, SMALL[0], SMALL[1], dtype=dtype) * (1 + step)
        y = torch.randint(SMALL[2], (7,))
        for model, opt, method in ((fast, opt_f, "forward"), (ref, opt_r, "_reference_forward")):
            opt.zero_grad()
            F.cross_entropy(_same_dropout_forward(model, method, x, step), y).backward()
            opt.step()
            model.apply_max_norm_()
    assert int(fast.bn1.num_batches_tracked) == int(ref.bn1.num_batches_tracked) == 5
    for key, value in fast.state_dict().items():
        # absolute floor 1: bn1.bias only moves by rounding noise (zero exact gradient)
        _assert_close(value.double(), ref.state_dict()[key].double(), rtol,
                      scale=max(1.0, ref.state_dict()[key].double().abs().max().item()))
    x = torch.randn(4, SMALL[0], SMALL[1], dtype=dtype)
    fast.eval(), ref.eval()
    with torch.no_grad():
        _assert_close(fast(x), ref._reference_forward(x), rtol)
    # BN1 alone in eval mode while the rest trains (running statistics in the fast path)
    fast.train(), ref.train()
    fast.bn1.eval(), ref.bn1.eval()
    _assert_close(_same_dropout_forward(fast, "forward", x, 9),
                  _same_dropout_forward(ref, "_reference_forward", x, 9), rtol)
    assert int(fast.bn1.num_batches_tracked) == 5


@pytest.mark.parametrize("config, expected", [(PHYSIONET, 3284), (WEIBO, 5303)])
def test_group_norm_shapes_counts_and_kinds(config, expected):
    """norm="group": the same parameters (GroupNorm's affine weights per map), no buffers,
    so nothing client-local; the same function in training and evaluation."""
    n_channels, _, n_classes, _ = config
    model = EEGNet(*config, norm="group", dropout=0.0)
    assert n_trainable(model) == expected
    assert [type(m).__name__ for m in (model.bn1, model.bn2, model.bn3)] == ["GroupNorm"] * 3
    assert dict(model.named_buffers()) == {}
    assert set(model.parameter_kinds().values()) == {"euclidean"}
    x = torch.randn(3, n_channels, model.n_times)
    out = model.train()(x)
    assert out.shape == (3, n_classes)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), out.detach())
    with pytest.raises(ValueError, match="norm must be 'batch' or 'group'"):
        EEGNet(*SMALL, norm="layer")


@pytest.mark.parametrize("norm, independent", [("group", True), ("batch", False)])
def test_group_norm_samples_do_not_interact(norm, independent):
    """Per-sample DP needs a sample's output not to depend on the other samples of its
    batch: true of GroupNorm in training mode, not of BatchNorm (batch statistics)."""
    torch.manual_seed(0)
    model = EEGNet(*SMALL, norm=norm, dropout=0.0).double().train()
    x = torch.randn(5, SMALL[0], SMALL[1], dtype=torch.float64)
    changed = torch.cat([x[:1], 3 * torch.randn(4, SMALL[0], SMALL[1], dtype=torch.float64)])
    same = torch.allclose(model(x)[0], model(changed)[0], rtol=0, atol=1e-12)
    assert same == independent


def test_fast_forward_rejects_wrong_shape_like_reference():
    model = EEGNet(*SMALL)
    for method in ("forward", "_reference_forward"):
        with pytest.raises(ValueError):
            getattr(model, method)(torch.randn(2, 7, 128))


@pytest.mark.parametrize("kwargs", [dict(F1=3, D=3, F2=4, p1=2, p2=2), dict(F1=2, D=1, F2=2)])
def test_fast_forward_matches_reference_other_sizes(kwargs):
    fast, ref = _pair((5, 64, 3, 100), torch.float64, **kwargs)
    x = torch.randn(4, 5, 64, dtype=torch.float64)
    y = torch.randint(3, (4,))
    out_f = _same_dropout_forward(fast, "forward", x, 1)
    out_r = _same_dropout_forward(ref, "_reference_forward", x, 1)
    _assert_close(out_f, out_r, 1e-10)
    F.cross_entropy(out_f, y).backward()
    F.cross_entropy(out_r, y).backward()
    grad_scale = max(p.grad.abs().max().item() for p in ref.parameters())
    for (name, p), (_, q) in zip(fast.named_parameters(), ref.named_parameters()):
        _assert_close(p.grad, q.grad, 1e-10, scale=grad_scale, msg=name)
    fast.eval(), ref.eval()
    with torch.no_grad():
        _assert_close(fast(x), ref._reference_forward(x), 1e-10)


# ---------------------------------------------------------------------------------------------
# EEGNetClassifier (the scikit-learn estimator)
# ---------------------------------------------------------------------------------------------

import pickle  # noqa: E402

import numpy as np  # noqa: E402
from sklearn.base import clone  # noqa: E402
from sklearn.exceptions import NotFittedError  # noqa: E402

from skfedspd import EEGNetClassifier  # noqa: E402


def small_classifier(**kwargs):
    params = dict(fs=128.0, max_epochs=40, lr=1e-2, batch_size=32, random_state=0)
    return EEGNetClassifier(**{**params, **kwargs})


@pytest.mark.parametrize("standardize, norm", [("trial", "batch"), ("channel", "batch"), ("trial", "group")])
def test_classifier_learns_source_power(eeg_timeseries, standardize, norm):
    """Class = which hidden source is stronger: learnable well above chance (1/3)."""
    X, y = eeg_timeseries(n_trials=150, n_classes=3, seed=1)
    clf = small_classifier(standardize=standardize, norm=norm).fit(X[:120], y[:120])
    assert clf.score(X[120:], y[120:]) >= 0.6
    assert clf.predict_proba(X[120:]).shape == (30, 3)
    np.testing.assert_allclose(clf.predict_proba(X[120:]).sum(1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("standardize, keeps_channel_power", [("trial", True), ("channel", False)])
def test_standardize_keeps_or_erases_channel_power(eeg_timeseries, standardize, keeps_channel_power):
    """Both z-scorings ignore the trial's overall scale; only "trial" sees one channel's
    power relative to the others."""
    X, _ = eeg_timeseries(n_trials=4)
    clf = EEGNetClassifier(standardize=standardize, dtype="float64")
    z = clf.to_tensor(X).numpy()
    np.testing.assert_allclose(clf.to_tensor(1e3 * X).numpy(), z, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(z.mean(-1), 0.0, atol=1e-12)
    louder = X.copy()
    louder[:, 0] *= 10.0
    z_louder = clf.to_tensor(louder).numpy()
    ratio = z_louder[:, 0].std(-1) / z_louder[:, 1].std(-1)
    expected = 10.0 * X[:, 0].std(-1) / X[:, 1].std(-1) if keeps_channel_power else np.ones(len(X))
    np.testing.assert_allclose(ratio, expected, rtol=1e-10)


def test_standardize_trial_unit_variance(eeg_timeseries):
    X, _ = eeg_timeseries(n_trials=3)
    clf = EEGNetClassifier(dtype="float64")
    np.testing.assert_allclose(clf.to_tensor(X).numpy().std(axis=(1, 2)), 1.0, rtol=1e-12)


def test_bad_standardize_is_named(eeg_timeseries):
    X, y = eeg_timeseries(n_trials=12)
    with pytest.raises(ValueError, match=r"The .standardize. parameter of EEGNetClassifier must be a str among"):
        small_classifier(standardize="global").fit(X, y)


@pytest.mark.parametrize("bad, match", [
    (lambda X: X[:, :, 0], "3-D"),
    (lambda X: np.where(np.arange(X.size).reshape(X.shape) == 5, np.nan, X), "NaN"),
    (lambda X: X[:0], "0 trials"),
])
def test_bad_input_is_named(eeg_timeseries, bad, match):
    X, y = eeg_timeseries(n_trials=12)
    with pytest.raises(ValueError, match=match):
        small_classifier(max_epochs=1).fit(bad(X), y[: len(bad(X))])


def test_predict_checks_shape_and_fitted(eeg_timeseries):
    X, y = eeg_timeseries(n_trials=24)
    clf = small_classifier(max_epochs=1)
    with pytest.raises(NotFittedError):
        clf.predict(X)
    clf.fit(X, y)
    with pytest.raises(ValueError, match="fitted on"):
        clf.predict(X[:, :4])


def test_clone_pickle_and_params(eeg_timeseries):
    X, y = eeg_timeseries(n_trials=30)
    clf = small_classifier(max_epochs=2, standardize="channel")
    assert clone(clf).get_params() == clf.get_params()
    clf.fit(X, y)
    assert clf.__sklearn_is_fitted__()
    again = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(again.predict_proba(X), clf.predict_proba(X))


def test_paper_parameter_count_through_classifier():
    X = np.random.default_rng(0).standard_normal((8, 64, 480))
    y = np.arange(8) % 4
    clf = EEGNetClassifier(max_epochs=1, random_state=0).fit(X, y)
    assert sum(p.numel() for p in clf.module_.parameters()) == 3284
    assert (clf.n_features_in_, clf.n_times_) == (64, 480)


# ---------------------------------------------------------------------------------------------
# Parameter validation, atomic fits, grad mode, one training loop (EEGNetClassifier)
# ---------------------------------------------------------------------------------------------

TINY = dict(F1=2, D=1, F2=2, p1=2, p2=2, fs=32.0, batch_size=8, lr=1e-2, random_state=0)


def tiny_classifier(**kwargs):
    return EEGNetClassifier(**{**TINY, "max_epochs": 2, **kwargs})


@pytest.fixture(scope="module")
def tiny_data():
    from conftest import make_eeg_timeseries

    return make_eeg_timeseries(n_trials=24, n_channels=4, n_times=32, n_classes=2, seed=0)


EEG_BAD_PARAMS = [
    (dict(fs=0.0), r"The 'fs' parameter of EEGNetClassifier must be a float in the range \(0.0, inf\)"),
    (dict(fs=np.nan), "'fs' parameter"),
    (dict(F1=0), r"'F1' parameter .* range \[1, inf\)"),
    (dict(D=1.5), "'D' parameter"),
    (dict(F2=-2), "'F2' parameter"),
    (dict(p1=0), "'p1' parameter"),
    (dict(p2=None), "'p2' parameter"),
    (dict(dropout=1.0), r"'dropout' parameter .* range \[0.0, 1.0\)"),
    (dict(dropout=-0.1), "'dropout' parameter"),
    (dict(standardize="global"), "'standardize' parameter"),
    (dict(norm="layer"), r"'norm' parameter .* \{'batch', 'group'\}|'norm' parameter .* \{'group', 'batch'\}"),
    (dict(lr=0.0), "'lr' parameter"),
    (dict(patience=-1), "'patience' parameter"),
    (dict(lr_patience=-3), "'lr_patience' parameter"),
    (dict(lr_factor=1.5), "'lr_factor' parameter"),
    (dict(dtype="half"), "'dtype' parameter"),
    (dict(p1=64, p2=64), "too short for pooling"),
]


def _state(clf):
    def plain(value):
        if isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
            value = value.state_dict()
        if isinstance(value, torch.Tensor):
            return value.detach().numpy().copy()
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(plain(v) for v in value)
        return copy.deepcopy(value)

    return {k: plain(v) for k, v in vars(clf).items()}


@pytest.mark.parametrize("params, match", EEG_BAD_PARAMS, ids=[str(p[0]) for p in EEG_BAD_PARAMS])
@pytest.mark.parametrize("fitted", [False, True])
def test_bad_parameters_named_and_atomic(tiny_data, params, match, fitted):
    X, y = tiny_data
    clf = tiny_classifier()
    if fitted:
        clf.fit(X, y)
    clf.set_params(**params)
    before = _state(clf)
    with pytest.raises(ValueError, match=match):
        clf.fit(X, y)
    after = _state(clf)
    assert sorted(after) == sorted(before)
    np.testing.assert_equal(after, before)


EEG_BAD_INPUTS = [
    ("nan", lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 40, np.nan, X), y), r"NaN or infinity \(first at trial 0\)"),
    ("inf", lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 300, np.inf, X), y), "NaN or infinity"),
    ("2d", lambda X, y: (X[:, :, 0], y), r"3-D array \(n_trials, n_channels, n_times\), got shape \(24, 4\)"),
    ("strings", lambda X, y: (X.astype(str), y), "real numeric array"),
    ("y_short", lambda X, y: (X, y[:-2]), "X has 24 samples but y has 22 labels"),
    ("one_class", lambda X, y: (X, np.zeros_like(y)), "greater than one"),
    ("other_shape", lambda X, y: (X[:, :3], y), r"trials of shape \(3, 32\), but the estimator was fitted on \(4, 32\)"),
]


@pytest.mark.parametrize("what, corrupt, match", EEG_BAD_INPUTS, ids=[c[0] for c in EEG_BAD_INPUTS])
@pytest.mark.parametrize("method", ["fit", "partial_fit"])
def test_bad_inputs_named_and_atomic(tiny_data, what, corrupt, match, method):
    X, y = tiny_data
    clf = tiny_classifier().fit(X, y)
    reference = clf.decision_function(X)
    before = _state(clf)
    Xb, yb = corrupt(X, y)
    if what == "other_shape" and method == "fit":
        clf.set_params(warm_start=True)
        before = _state(clf)
    if what == "one_class" and method == "partial_fit":
        pytest.skip("a partial_fit batch may hold one class")
    with pytest.raises(ValueError, match=match):
        getattr(clf, method)(Xb, yb)
    np.testing.assert_equal(_state(clf), before)
    np.testing.assert_array_equal(clf.decision_function(X), reference)


def test_fit_equals_partial_fits_with_dropout(tiny_data):
    """Dropout's random stream carries over between partial_fit calls exactly as between
    the epochs of fit."""
    X, y = tiny_data
    fitted = tiny_classifier(validation_fraction=0.0, max_epochs=3).fit(X, y)
    partial = tiny_classifier(validation_fraction=0.0)
    for _ in range(3):
        partial.partial_fit(X, y, classes=np.unique(y))
    np.testing.assert_array_equal(partial.decision_function(X), fitted.decision_function(X))
    assert partial.n_iter_ == fitted.n_iter_ == 3


def test_fit_independent_of_global_grad_mode(tiny_data):
    X, y = tiny_data
    reference = tiny_classifier().fit(X, y).decision_function(X)
    previous = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        got = tiny_classifier().fit(X, y).decision_function(X)
    finally:
        torch.set_grad_enabled(previous)
    np.testing.assert_array_equal(got, reference)
