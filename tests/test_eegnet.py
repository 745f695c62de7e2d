"""Tests of the pure-torch EEGNet-8,2 baseline (skfedspd.eegnet)."""

import pytest
import torch

from skfedspd.eegnet import EEGNet

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

    from skfedspd.eegnet import _same_padding

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
