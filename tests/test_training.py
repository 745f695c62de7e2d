"""Tests of :mod:`skfedspd.training`: the one evaluator, the seed helpers, the schedule."""

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score

from skfedspd.training import (
    PlateauSchedule,
    draw_seed,
    evaluate,
    load_optimizer_arrays,
    macro_f1,
    minibatches,
    optimizer_arrays,
)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("n_classes, n", [(2, 1), (2, 7), (3, 30), (5, 11), (7, 200)])
def test_macro_f1_equals_sklearn_to_the_bit(seed, n_classes, n):
    rng = np.random.default_rng(seed)
    y_true = rng.integers(0, n_classes, n)
    y_pred = rng.integers(0, n_classes, n)
    assert macro_f1(y_true, y_pred) == f1_score(y_true, y_pred, average="macro")


@pytest.mark.parametrize("y_true, y_pred", [([0, 0, 1], [0, 0, 1]), ([0, 0, 0], [1, 1, 1]),
                                             ([2, 2], [0, 1]), ([0, 3, 3, 1], [3, 3, 3, 3])])
def test_macro_f1_equals_sklearn_edge_cases(y_true, y_pred):
    y_true, y_pred = np.array(y_true), np.array(y_pred)
    assert macro_f1(y_true, y_pred) == f1_score(y_true, y_pred, average="macro", zero_division=0.0)


class _Fixed(torch.nn.Module):
    """Logits given per sample index (X holds the indices)."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.as_tensor(logits, dtype=torch.float64)

    def forward(self, X):
        return self.logits[X]


def test_evaluate_loss_and_f1():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 0])
    loss, f1 = evaluate(_Fixed(logits), torch.arange(4), y)
    assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-15)
    assert f1 == f1_score(y.numpy(), logits.argmax(1).numpy(), average="macro")


def test_evaluate_empty_is_nan():
    loss, f1 = evaluate(_Fixed(np.zeros((0, 2))), torch.arange(0), torch.arange(0))
    assert np.isnan(loss) and np.isnan(f1)
    assert all(np.isnan(evaluate(_Fixed(np.zeros((0, 2))), torch.arange(0), torch.arange(0), return_se=True)))


@pytest.mark.parametrize("weighted", [False, True])
def test_evaluate_standard_error_of_the_loss(weighted):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(30, 3))
    y = rng.integers(0, 3, 30)
    w = rng.uniform(0.5, 2.0, 30) if weighted else np.ones(30)
    args = (_Fixed(logits), torch.arange(30), torch.as_tensor(y), torch.as_tensor(w) if weighted else None)
    loss, f1, se = evaluate(*args, return_se=True)
    assert (loss, f1) == evaluate(*args)
    # the per-sample losses from a numpy log-softmax, then the weighted mean's standard error
    losses = np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(30), y]
    p = w / w.sum()
    assert se == pytest.approx(np.sqrt(np.sum(p**2 * (losses - p @ losses) ** 2)), rel=1e-12)
    if not weighted:
        assert se == pytest.approx(np.std(losses) / np.sqrt(30), rel=1e-12)


def _drive(schedule, scores, start=0):
    out = []
    for step, (f1, loss) in enumerate(scores[start:], start):
        improved = schedule.step(f1, loss, {"w": np.full(2, float(step))})
        out.append((improved, schedule.lr, schedule.should_stop, schedule.best_step))
    return out


def test_plateau_schedule_state_round_trip_through_json():
    import json

    rng = np.random.default_rng(0)
    scores = [(float(f), float(l)) for f, l in zip(rng.choice([0.3, 0.5, 0.6], 30), rng.random(30))]
    scores[4] = (float("nan"), float("nan"))
    reference = PlateauSchedule(1e-2, patience=8, lr_patience=2, lr_factor=0.5, min_lr=1e-4)
    expected = _drive(reference, scores)
    first = PlateauSchedule(1e-2, patience=8, lr_patience=2, lr_factor=0.5, min_lr=1e-4)
    head = _drive(first, scores[:12])
    state = first.state_dict()
    best = state.pop("best_state")
    state = json.loads(json.dumps(state))  # JSON data (infinities allowed)
    resumed = PlateauSchedule(1.0)
    resumed.load_state_dict({**state, "best_state": best})
    assert head + _drive(resumed, scores, start=12) == expected
    np.testing.assert_array_equal(resumed.best_state["w"], reference.best_state["w"])
    assert resumed.best_score == reference.best_score


def test_plateau_schedule_rejects_other_keys():
    with pytest.raises(ValueError, match="schedule state has keys"):
        PlateauSchedule(1.0).load_state_dict({"lr": 1.0})


@pytest.mark.parametrize("random_state", [0, 7, 2**31])
def test_draw_seed_as_sklearn_draws(random_state):
    expected = int(np.random.RandomState(random_state).randint(0, 2**31 - 1))
    assert draw_seed(random_state) == draw_seed(random_state) == expected
    rs = np.random.RandomState(random_state)
    assert draw_seed(rs) == expected and draw_seed(rs) != expected  # a RandomState advances


def _stepped_adam(n_steps=2):
    w = torch.nn.Parameter(torch.linspace(-1, 1, 6, dtype=torch.float64).reshape(2, 3))
    b = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    optimizer = torch.optim.Adam([w, b], lr=0.1)
    for _ in range(n_steps):
        optimizer.zero_grad()
        ((w ** 3).sum() + b.sum()).backward()
        optimizer.step()
    return optimizer


def test_optimizer_arrays_round_trip_keeps_the_new_learning_rate():
    source = _stepped_adam()
    arrays = optimizer_arrays(source)
    assert sorted(arrays) == ["0.exp_avg", "0.exp_avg_sq", "0.step", "1.exp_avg", "1.exp_avg_sq", "1.step"]
    assert float(arrays["0.step"]) == 2.0
    target = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2, 3, dtype=torch.float64)),
                               torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))], lr=0.5)
    load_optimizer_arrays(target, arrays)
    assert target.param_groups[0]["lr"] == 0.5
    for name, value in optimizer_arrays(target).items():
        np.testing.assert_array_equal(value, arrays[name], strict=True)
    arrays["0.exp_avg"][:] = 7.0  # the loaded state is a copy
    assert not (optimizer_arrays(target)["0.exp_avg"] == 7.0).any()


@pytest.mark.parametrize("key, value, message", [
    ("2.exp_avg", np.zeros(3), "optimizer state 'opt.2.exp_avg' names no parameter"),
    ("x.exp_avg", np.zeros(3), "'opt.x.exp_avg' names no parameter"),
    ("0", np.zeros(3), "'opt.0' names no parameter"),
    ("0.exp_avg", np.zeros(3), r"'opt.0.exp_avg' has shape \(3,\), expected \(2, 3\)"),
    ("1.exp_avg_sq", np.full(2, np.inf), "'opt.1.exp_avg_sq' is not a finite floating array"),
    ("1.step", np.array(1), "'opt.1.step' is not a finite floating array"),
])
def test_load_optimizer_arrays_names_the_bad_array(key, value, message):
    arrays = {f"opt.{k}": v for k, v in optimizer_arrays(_stepped_adam()).items()}
    arrays[f"opt.{key}"] = value
    target = _stepped_adam(0)
    with pytest.raises(ValueError, match=message):
        load_optimizer_arrays(target, {**arrays, "other": np.zeros(1)}, prefix="opt.")


def test_minibatches_without_domains_are_one_permutation():
    batches = minibatches(10, 4, torch.Generator().manual_seed(3))
    assert [len(b) for b in batches] == [4, 4, 2]
    torch.testing.assert_close(torch.cat(batches), torch.randperm(10, generator=torch.Generator().manual_seed(3)))


@pytest.mark.parametrize("sizes, batch_size, expected", [((20, 5), 8, [5, 7, 7, 6]), ((3, 3, 3), 64, [3, 3, 3]),
                                                          ((9,), 4, [4, 4, 1])])
def test_minibatches_hold_one_domain_each(sizes, batch_size, expected):
    """Several domains: every batch one domain, each domain cut into near-equal batches of at
    most batch_size, every sample once; one domain: the plain permutation."""
    domains = torch.cat([torch.full((n,), d) for d, n in enumerate(sizes)])
    batches = minibatches(len(domains), batch_size, torch.Generator().manual_seed(0), domains)
    assert all(len(torch.unique(domains[b])) == 1 for b in batches)
    assert sorted(torch.cat(batches).tolist()) == list(range(len(domains)))
    assert sorted(len(b) for b in batches) == sorted(expected)
