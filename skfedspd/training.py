"""The one local-training routine, shared by the centralized and the federated estimators:
:func:`train_epochs`, :func:`evaluate` and the :class:`PlateauSchedule`, stepped per epoch
(centralized) or per round (federated).
"""

import copy
import warnings
from contextlib import contextmanager
from numbers import Real

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_random_state

from .validation import Count

__all__ = ["train_epochs", "minibatches", "evaluate", "macro_f1", "PlateauSchedule", "Settings", "EpochSchedule", "RoundSchedule",
           "seeded_torch", "derive_seed", "draw_seed", "torch_threads", "optimizer_arrays", "load_optimizer_arrays",
           "check_optimizer_settings", "check_optimizer_array"]


def derive_seed(*entropy):
    """A 63-bit seed from integers (random_state, round, client id...), stable across runs.

    Examples
    --------
    >>> from skfedspd.training import derive_seed
    >>> derive_seed(0, 10, 3) == derive_seed(0, 10, 3), derive_seed(0, 10, 3) != derive_seed(0, 10, 4)
    (True, True)
    """
    return int(np.random.SeedSequence([int(e) for e in entropy]).generate_state(2, np.uint32).view(np.uint64)[0] >> np.uint64(1))


def draw_seed(random_state):
    """The int seed of one fit, drawn from ``random_state`` as scikit-learn estimators draw.

    Examples
    --------
    >>> from skfedspd.training import draw_seed
    >>> draw_seed(0) == draw_seed(0)
    True
    """
    return int(check_random_state(random_state).randint(0, 2**31 - 1))


@contextmanager
def seeded_torch(seed):
    """Run a block with torch's CPU RNG seeded, restoring the caller's RNG state afterwards.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.training import seeded_torch
    >>> with seeded_torch(0):
    ...     a = torch.rand(2)
    >>> with seeded_torch(0):
    ...     b = torch.rand(2)
    >>> torch.equal(a, b)
    True
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextmanager
def torch_threads(n_threads):
    """Temporarily set torch's intra-op thread count (None: leave it).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.training import torch_threads
    >>> with torch_threads(1):
    ...     inside = torch.get_num_threads()
    >>> inside
    1
    """
    if n_threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def minibatches(n, batch_size, generator, domains=None):
    """One epoch's minibatches: index tensors covering ``range(n)`` once, in shuffled order;
    with several ``domains``, each minibatch holds one domain's trials
    (``docs/design-decisions.md``).

    Parameters
    ----------
    n, batch_size : int
    generator : torch.Generator
    domains : torch.Tensor of int or None
        Domain code of each sample.

    Returns
    -------
    list of torch.Tensor

    Examples
    --------
    >>> import torch
    >>> from skfedspd.training import minibatches
    >>> domains = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])
    >>> batches = minibatches(8, 3, torch.Generator().manual_seed(0), domains)
    >>> sorted(sorted(domains[b].tolist()) for b in batches)
    [[0, 0, 0], [1, 1], [1, 1, 1]]
    """
    if domains is None or int(domains.max()) == int(domains.min()):
        order = torch.randperm(n, generator=generator)
        return [order[start : start + batch_size] for start in range(0, n, batch_size)]
    batches = []
    for code in torch.unique(domains):
        members = torch.nonzero(domains == code).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        batches.extend(torch.tensor_split(members, -(-len(members) // batch_size)))
    return [batches[i] for i in torch.randperm(len(batches), generator=generator)]


def train_epochs(module, optimizer, X, y, *, n_epochs, batch_size, generator, sample_weight=None):
    """Train ``module`` for ``n_epochs`` epochs of shuffled :func:`minibatches` (``module(X)`` →
    logits, ``module.after_step_()`` after every step); a minibatch's loss is
    ``Σ w_i l_i / Σ w_i`` with ``sample_weight``. Returns ``(mean_loss, n_skipped)``: the
    weighted mean loss and the batches skipped for a non-finite loss or gradient.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.nn import SPDNet
    >>> from skfedspd.training import train_epochs
    >>> X, y = map(torch.as_tensor, make_spd_classification(n_matrices=40, n_channels=4, seed=0))
    >>> module = SPDNet(4, (3,), n_classes=3, seed=0)
    >>> optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    >>> train_epochs(module, optimizer, X, y, n_epochs=2, batch_size=16, generator=torch.Generator().manual_seed(0))[1]
    0
    """
    with torch.enable_grad():
        return _train_epochs(module, optimizer, X, y, n_epochs, batch_size, generator, sample_weight)


def _train_epochs(module, optimizer, X, y, n_epochs, batch_size, generator, sample_weight):
    module.train()
    n = len(y)
    domains = getattr(X, "domains", None)
    total, count, skipped = 0.0, 0.0, 0
    for _ in range(n_epochs):
        for idx in minibatches(n, batch_size, generator, domains):
            if sample_weight is None:
                size = len(idx)
            else:
                w = sample_weight[idx]
                size = float(w.sum())
                if size <= 0:
                    continue
            optimizer.zero_grad(set_to_none=True)
            loss = cross_entropy(module(X[idx]), y[idx], None if sample_weight is None else w)
            if not torch.isfinite(loss):
                skipped += 1
                continue
            loss.backward()
            if not all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None):
                skipped += 1
                continue
            optimizer.step()
            module.after_step_()
            total += float(loss.detach()) * size
            count += size
    return (total / count if count else float("nan")), skipped


def optimizer_arrays(optimizer):
    """A torch optimizer's per-parameter state as named numpy copies, ``"<index>.<name>"``.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.training import optimizer_arrays
    >>> w = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    >>> optimizer = torch.optim.Adam([w], lr=0.1)
    >>> w.sum().backward(); optimizer.step()
    >>> sorted(optimizer_arrays(optimizer))
    ['0.exp_avg', '0.exp_avg_sq', '0.step']
    """
    return {f"{index}.{name}": value.detach().cpu().numpy().copy()
            for index, tensors in optimizer.state_dict()["state"].items() for name, value in tensors.items()}


def check_optimizer_array(key, value):
    """Refuse an Adam state array that is not finite, or a negative step count or second moment.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.training import check_optimizer_array
    >>> check_optimizer_array("0.exp_avg_sq", np.ones(2))
    """
    value = np.asarray(value)
    if value.dtype.kind != "f" or not np.isfinite(value).all():
        raise ValueError(f"optimizer state {key!r} is not a finite floating array")
    if key.rsplit(".", 1)[-1] in ("step", "exp_avg_sq") and (value < 0).any():
        raise ValueError(f"optimizer state {key!r} has negative values; a step count and a mean of squared gradients "
                         "are >= 0")


def load_optimizer_arrays(optimizer, arrays, param_groups=None, prefix=""):
    """Load :func:`optimizer_arrays` into ``optimizer`` (its hyper-parameters stay its own
    unless ``param_groups`` are given); names, shapes and values are checked.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.training import load_optimizer_arrays, optimizer_arrays
    >>> w = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    >>> first = torch.optim.Adam([w], lr=0.1)
    >>> w.sum().backward(); first.step()
    >>> second = torch.optim.Adam([w], lr=0.05)
    >>> load_optimizer_arrays(second, optimizer_arrays(first))
    >>> float(second.state[w]["step"]), second.param_groups[0]["lr"]
    (1.0, 0.05)
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for key, value in arrays.items():
        if not key.startswith(prefix):
            continue
        index, _, name = key[len(prefix):].partition(".")
        if not index.isdigit() or int(index) >= len(params) or not name:
            raise ValueError(f"optimizer state {key!r} names no parameter")
        value = np.asarray(value)
        if name != "step" and value.shape != tuple(params[int(index)].shape):
            raise ValueError(f"optimizer state {key!r} has shape {value.shape}, expected "
                             f"{tuple(params[int(index)].shape)}")
        check_optimizer_array(key, value)
        state.setdefault(int(index), {})[name] = torch.from_numpy(np.array(value, copy=True))
    groups = optimizer.state_dict()["param_groups"] if param_groups is None else param_groups
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _is_finite_real(value):
    return isinstance(value, Real) and not isinstance(value, (bool, np.bool_)) and bool(np.isfinite(value))


#: The settings of a saved Adam parameter group (:func:`check_optimizer_settings`): name →
#: (test, what it must be). The estimators train with Adam's defaults at the learning rate they
#: set every epoch; the flags of the variants they never use must be off (``maximize`` would
#: turn training into gradient ascent).
ADAM_SETTINGS = {
    "lr": (lambda v: _is_finite_real(v) and v > 0, "a finite number > 0"),
    "betas": (lambda v: isinstance(v, (list, tuple)) and len(v) == 2
              and all(_is_finite_real(b) and 0 <= b < 1 for b in v), "two numbers in [0, 1)"),
    "eps": (lambda v: _is_finite_real(v) and v > 0, "a finite number > 0"),
    "weight_decay": (lambda v: _is_finite_real(v) and v >= 0, "a finite number >= 0"),
    **{flag: (lambda v: v is False, "false")
       for flag in ("amsgrad", "maximize", "capturable", "differentiable", "decoupled_weight_decay")},
    **{flag: (lambda v: v is None or v is False, "null or false") for flag in ("foreach", "fused")},
}


def check_optimizer_settings(param_groups, fresh_groups=None):
    """Validate saved Adam ``param_groups`` (against ``fresh_groups`` when given).

    Examples
    --------
    >>> import torch
    >>> from skfedspd.training import check_optimizer_settings
    >>> fresh = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))]).state_dict()["param_groups"]
    >>> check_optimizer_settings([dict(fresh[0], betas=[0.9, 0.99])], fresh)
    """
    if not isinstance(param_groups, list) or not all(isinstance(group, dict) for group in param_groups):
        raise ValueError(f"the optimizer state must be a list of parameter groups, got {param_groups!r}")
    names = set(torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))]).param_groups[0])
    for group in param_groups:
        if set(group) != names:
            raise ValueError(f"the optimizer state does not match Adam's settings: unexpected "
                             f"{sorted(set(group) - names)}, missing {sorted(names - set(group))}")
    if fresh_groups is not None and (
            len(param_groups) != len(fresh_groups)
            or any(set(g) != set(f) or g["params"] != f["params"] for g, f in zip(param_groups, fresh_groups))):
        raise ValueError("the optimizer state does not match the module's parameters")
    for i, group in enumerate(param_groups):
        for name, value in group.items():
            if name in ADAM_SETTINGS:
                test, what = ADAM_SETTINGS[name]
            elif fresh_groups is not None and name != "params":
                test, what = (lambda v, f=fresh_groups[i][name]: v == f), repr(fresh_groups[i][name])
            else:
                continue
            if not test(value):
                raise ValueError(f"optimizer setting {name!r} of parameter group {i} must be {what}, got {value!r}")


def cross_entropy(logits, y, sample_weight=None):
    """Mean cross-entropy, or its weighted mean ``Σ w_i l_i / Σ w_i`` when weights are given."""
    if sample_weight is None:
        return torch.nn.functional.cross_entropy(logits, y)
    losses = torch.nn.functional.cross_entropy(logits, y, reduction="none")
    w = sample_weight.to(losses.dtype)
    return (w * losses).sum() / w.sum()


@torch.no_grad()
def predict_logits(module, X, batch_size=1024):
    module.eval()
    return torch.cat([module(X[i : i + batch_size]) for i in range(0, len(X), batch_size)])


def macro_f1(y_true, y_pred):
    """``sklearn.metrics.f1_score(y_true, y_pred, average="macro")`` for integer codes, bit for
    bit, without its input validation.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.metrics import f1_score
    >>> from skfedspd.training import macro_f1
    >>> y_true, y_pred = np.array([0, 0, 1, 1, 2]), np.array([0, 1, 1, 1, 0])
    >>> macro_f1(y_true, y_pred) == f1_score(y_true, y_pred, average="macro")
    True
    """
    labels, codes = np.unique(np.concatenate([y_true, y_pred]), return_inverse=True)
    t, p = codes[: len(y_true)], codes[len(y_true) :]
    n = len(labels)
    tp = np.bincount(t[t == p], minlength=n).astype(np.float64)
    denom = np.bincount(t, minlength=n).astype(np.float64) + np.bincount(p, minlength=n).astype(np.float64)
    return float(np.mean(2.0 * tp / denom))


def evaluate(module, X, y, sample_weight=None, return_se=False):
    """Cross-entropy loss (weighted by ``sample_weight``) and macro-F1 of ``module`` on
    ``(X, y)``, and with ``return_se`` the loss's standard error; NaN when ``y`` is empty.

    Examples
    --------
    >>> import torch
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.nn import SPDNet
    >>> from skfedspd.training import evaluate
    >>> X, y = map(torch.as_tensor, make_spd_classification(n_matrices=30, n_channels=4, seed=1))
    >>> loss, f1 = evaluate(SPDNet(4, (3,), n_classes=3, seed=0), X, y)
    >>> loss > 0, 0 <= f1 <= 1
    (True, True)
    """
    if len(y) == 0:
        return (float("nan"),) * (3 if return_se else 2)
    logits = predict_logits(module, X)
    if sample_weight is not None and float(sample_weight.sum()) <= 0:
        sample_weight = None  # a validation part of zero weights: score it unweighted
    loss = float(cross_entropy(logits, y, sample_weight))
    f1 = macro_f1(y.cpu().numpy(), logits.argmax(1).cpu().numpy())
    if not return_se:
        return loss, f1
    losses = torch.nn.functional.cross_entropy(logits, y, reduction="none").double()
    p = torch.ones_like(losses) if sample_weight is None else sample_weight.to(losses.dtype)
    p = p / p.sum()
    return loss, f1, float(torch.sqrt((p**2 * (losses - loss) ** 2).sum()))


class PlateauSchedule:
    """ReduceLROnPlateau + early stopping + best checkpoint, driven by a validation score.

    Improvement is a higher F1 (ties: a lower loss) with ``monitor="f1"``, a lower loss with
    ``monitor="loss"``; a step without a score counts as one.

    Examples
    --------
    >>> from skfedspd.training import PlateauSchedule
    >>> schedule = PlateauSchedule(lr=0.01, patience=3, lr_patience=1, lr_factor=0.5)
    >>> for epoch, (f1, loss) in enumerate([(0.6, 0.9), (0.7, 0.8), (0.7, 0.85), (0.65, 0.9), (0.6, 1.0)]):
    ...     improved = schedule.step(f1, loss, state={"epoch": epoch})
    >>> schedule.best_state, schedule.lr, schedule.should_stop
    ({'epoch': 1}, 0.005, True)
    """

    def __init__(self, lr, patience=75, lr_patience=20, lr_factor=0.5, min_lr=0.0, monitor="f1"):
        if monitor not in ("f1", "loss"):
            raise ValueError(f"monitor must be 'f1' or 'loss', got {monitor!r}")
        self.monitor = monitor  # configuration, not state: not in state_dict
        self.lr = lr
        self.patience = patience
        self.lr_patience = lr_patience
        self.lr_factor = lr_factor
        self.min_lr = min_lr
        self.best_score = (-np.inf, np.inf)
        self.best_step = -1
        self.best_state = None
        self.n_steps = 0
        self._since_best = 0
        self._since_lr = 0

    def step(self, f1, loss, state):
        """Record one validation result; ``state`` is copied if it is the best so far."""
        score_f1 = -np.inf if np.isnan(f1) else f1
        score_loss = np.inf if np.isnan(loss) else loss
        unscored = np.isnan(f1) and np.isnan(loss)  # no validation data: keep the latest state
        if self.monitor == "loss":
            better = score_loss < self.best_score[1]
        else:
            better = (score_f1, -score_loss) > (self.best_score[0], -self.best_score[1])
        improved = unscored or better
        if improved:
            self.best_score = (score_f1, score_loss)
            self.best_step = self.n_steps
            self.best_state = copy.deepcopy(state)
            self._since_best = self._since_lr = 0
        else:
            self._since_best += 1
            self._since_lr += 1
            if self._since_lr > self.lr_patience:
                self.lr = max(self.lr * self.lr_factor, self.min_lr)
                self._since_lr = 0
        self.n_steps += 1
        return improved

    _FIELDS = ("lr", "patience", "lr_patience", "lr_factor", "min_lr", "best_step", "n_steps", "_since_best",
               "_since_lr")

    def state_dict(self):
        """The schedule's state: JSON data, plus ``"best_state"`` as given to :meth:`step`.

        Returns
        -------
        dict
        """
        state = {name.lstrip("_"): getattr(self, name) for name in self._FIELDS}
        state["best_score"] = [float(v) for v in self.best_score]
        state["best_state"] = self.best_state
        return state

    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned (ValueError on a missing or unknown key)."""
        expected = {name.lstrip("_") for name in self._FIELDS} | {"best_score", "best_state"}
        if set(state) != expected:
            raise ValueError(f"schedule state has keys {sorted(state)}, expected {sorted(expected)}")
        for name in self._FIELDS:
            setattr(self, name, state[name.lstrip("_")])
        self.best_score = tuple(float(v) for v in state["best_score"])
        self.best_state = state["best_state"]

    @property
    def should_stop(self):
        return self.patience is not None and self._since_best >= self.patience


def warn_skipped(n_skipped, where):
    if n_skipped:
        warnings.warn(
            f"{n_skipped} minibatch(es) had a non-finite loss or gradient in {where} and were "
            "skipped (weights left unchanged); check the input scaling or lower the learning rate",
            RuntimeWarning,
            stacklevel=3,
        )


class Settings(BaseEstimator):
    """A group of an estimator's settings as one cloneable parameter object.

    Examples
    --------
    >>> from skfedspd.training import EpochSchedule
    >>> EpochSchedule(patience=5) == EpochSchedule(patience=5), EpochSchedule() == EpochSchedule(patience=5)
    (True, False)
    """

    def check_params(self):
        """Raise ValueError (naming the parameter) if a parameter is invalid."""
        self._validate_params()

    def __eq__(self, other):
        return type(other) is type(self) and other.get_params(deep=False) == self.get_params(deep=False)

    def __hash__(self):
        return hash((type(self).__name__, repr(sorted(self.get_params(deep=False).items()))))


class _ScheduleSettings(Settings):
    """The settings of a :class:`PlateauSchedule`."""

    def plateau(self, lr, *, validating=True, monitor="loss"):
        """The :class:`PlateauSchedule` of a fit at learning rate ``lr``."""
        return PlateauSchedule(lr, patience=self.patience if validating else None, lr_patience=self.lr_patience,
                               lr_factor=self.lr_factor, monitor=monitor)


class EpochSchedule(_ScheduleSettings):
    """The plateau schedule of a centralized fit, counted in epochs (with a validation part).

    Parameters
    ----------
    patience : int >= 0 or None, default=75
        Epochs without improvement before the fit stops; None: ``max_epochs`` run.
    lr_patience : int >= 0, default=20
        Epochs without improvement before the learning rate is multiplied by ``lr_factor``.
    lr_factor : float in (0, 1), default=0.5

    Examples
    --------
    >>> from skfedspd.training import EpochSchedule
    >>> EpochSchedule(patience=10).plateau(0.01).lr
    0.01
    """

    _parameter_constraints = {
        "patience": [Count(0), None],
        "lr_patience": [Count(0)],
        "lr_factor": [Interval(Real, 0, 1, closed="neither")],
    }

    def __init__(self, patience=75, lr_patience=20, lr_factor=0.5):
        self.patience = patience
        self.lr_patience = lr_patience
        self.lr_factor = lr_factor


class RoundSchedule(_ScheduleSettings):
    """The plateau schedule of a federated fit, counted in rounds, on the global validation score.

    Parameters
    ----------
    patience : int or None, default=None
        Rounds without improvement before the fit stops. None: every round runs.
    lr_patience : int, default=20
        Rounds without improvement before the learning rate is multiplied by ``lr_factor``.
    lr_factor : float in (0, 1], default=0.5

    Examples
    --------
    >>> from skfedspd.training import RoundSchedule
    >>> RoundSchedule(lr_patience=40).get_params()
    {'lr_factor': 0.5, 'lr_patience': 40, 'patience': None}
    """

    _parameter_constraints = {
        "patience": [Count(1), None],
        "lr_patience": [Count(0)],
        "lr_factor": [Interval(Real, 0, 1, closed="right")],
    }

    def __init__(self, patience=None, lr_patience=20, lr_factor=0.5):
        self.patience = patience
        self.lr_patience = lr_patience
        self.lr_factor = lr_factor
