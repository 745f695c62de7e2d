"""Benchmark of ONE SPDnet training step, side by side with a naive version and spd-learn.

One step = ``zero_grad`` + forward + cross-entropy + backward + ``Adam.step()`` + the module's
after-step hook, on a batch of ``B`` SPD matrices 64×64 → BiMap to 18 → ReEig + LogEig → vech →
Linear to 4 classes. Implementations:

* ``ours``      — ``skfedspd.nn.SPDNet(64, (18,), 4, eps=1e-2)``: BiMap by tangent-space local
  trivialization (``W = uf(W_ref + P_{W_ref}(V))``, custom polar backward, re-centred by
  ``after_step_()``), last ReEig fused with LogEig in one ``eigh`` with the Daleckii–Krein
  backward.
* ``naive``     — written here: ``W`` a plain ``nn.Parameter`` updated by Euclidean Adam and
  re-orthonormalised by QR (signs fixed) after each step; ReEig and LogEig each do their own
  ``torch.linalg.eigh`` with plain autograd (two ``eigh`` per matrix).
* ``spd-learn`` — ``spd_learn.models.SPDNet(input_type="cov", subspacedim=18, threshold=1e-2,
  n_chans=64, n_outputs=4)`` converted to the dtype. Its BiMap is constrained by
  ``torch.nn.utils.parametrizations.orthogonal`` (Cayley map, the library default), so it is
  trained with a plain ``torch.optim.Adam`` — spd-learn has no Riemannian optimizer and does
  not depend on geoopt; nothing to run after the step.

Timing: ``torch.set_num_threads(1)``, warm-up, then ``--reps`` repetitions; inside each
repetition every (implementation, dtype) pair runs one step, in an order rotated from one
repetition to the next, so machine noise hits all of them alike. Wall clock
(``time.perf_counter``, with ``torch.cuda.synchronize`` around each step on CUDA). Reported:
median and IQR in ms.

Gradient exactness (float64): the Euclidean gradient of the loss with respect to the BiMap
weight ``W`` (treated as a free matrix, same ``W``, same head, same batch for all) through each
implementation's own spectral layers, compared with ours and with a fourth-order central finite
difference of the loss along a random direction; then each implementation's *trainable parameter*
gradient (ours: ``V``; naive: ``W``; spd-learn: the Cayley parametrization's ``original``)
against a finite difference along a random direction in that parameter. Repeated with a batch
that has repeated eigenvalues (identity matrices → ``WᵀIW = I``; rank-4 matrices → 14
eigenvalues clamped to ``eps``), reporting NaN/Inf.

Usage::

    .venv/bin/python benchmarks/bench_spdnet_step.py [--reps 40] [--batch 64] [--device cpu]

Writes the record ``speed-spdnet-step`` (``--record``): ms per step of every (implementation,
dtype) per repetition, the gradient checks' errors as facts.
"""

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from _machine import cpu_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package, for its records
from benchmarks.records.speed import add_record_option, write_speed_record  # noqa: E402
from skfedspd.functional import reeig_logeig, vech
from skfedspd.nn import SPDNet
from skfedspd.stiefel import random_stiefel, tangent_project

N_CHANS, N_SUB, N_CLASSES, EPS = 64, 18, 4, 1e-2
DTYPES = {"float32": torch.float32, "float64": torch.float64}
IMPLS = ("ours", "naive", "spd-learn")


# ---------------------------------------------------------------------------------------------
# The naive implementation
# ---------------------------------------------------------------------------------------------


def naive_reeig(X, eps):
    lam, U = torch.linalg.eigh(X)
    return (U * lam.clamp_min(eps).unsqueeze(-2)) @ U.transpose(-1, -2)


def naive_logeig(X):
    lam, U = torch.linalg.eigh(X)
    return (U * torch.log(lam).unsqueeze(-2)) @ U.transpose(-1, -2)


def naive_vech(X):
    n = X.shape[-1]
    rows, cols = torch.triu_indices(n, n, device=X.device)
    one = torch.ones(rows.shape, dtype=X.dtype, device=X.device)  # √2 in the input's dtype
    w = torch.where(rows == cols, one, one * 2.0**0.5)
    return X[..., rows, cols] * w


class NaiveSPDNet(nn.Module):
    """Plain-parameter BiMap (QR re-orthonormalisation after the step), two eigh per matrix."""

    def __init__(self, n_in, n_out, n_classes, eps, seed=0, dtype=torch.float64):
        super().__init__()
        self.eps = eps
        self.W = nn.Parameter(torch.as_tensor(random_stiefel(n_in, n_out, seed), dtype=dtype))
        self.head = nn.Linear(n_out * (n_out + 1) // 2, n_classes, dtype=dtype)

    def features_from(self, W, X):
        return naive_vech(naive_logeig(naive_reeig(W.transpose(-1, -2) @ X @ W, self.eps)))

    def forward(self, X):
        return self.head(self.features_from(self.W, X))

    @torch.no_grad()
    def after_step_(self):
        Q, R = torch.linalg.qr(self.W)
        self.W.copy_(Q * torch.sign(torch.diagonal(R)).unsqueeze(-2))


# ---------------------------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------------------------


def make_batch(B, dtype, device, seed=0):
    """EEG-like covariances: a shared mixing with decaying source powers, 256 samples each."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(N_CHANS, N_CHANS, generator=g, dtype=torch.float64)
    mix = mix * torch.logspace(0, -2, N_CHANS, dtype=torch.float64)
    S = torch.randn(B, N_CHANS, 256, generator=g, dtype=torch.float64)
    A = mix @ S
    X = A @ A.transpose(-1, -2) / 256 + 1e-4 * torch.eye(N_CHANS, dtype=torch.float64)
    X = 0.5 * (X + X.transpose(-1, -2))
    y = torch.arange(B) % N_CLASSES
    return X.to(dtype=dtype, device=device), y.to(device)


def make_degenerate_batch(B, dtype, device, seed=1):
    """Half identity matrices (all eigenvalues tied after BiMap), half rank-4 matrices (14
    eigenvalues ~0 after BiMap, clamped to eps by ReEig → ties at eps)."""
    g = torch.Generator().manual_seed(seed)
    eye = torch.eye(N_CHANS, dtype=torch.float64).expand(B // 2, -1, -1)
    A = torch.randn(B - B // 2, N_CHANS, 4, generator=g, dtype=torch.float64)
    low = A @ A.transpose(-1, -2)
    X = torch.cat([eye, 0.5 * (low + low.transpose(-1, -2))])
    y = torch.arange(B) % N_CLASSES
    return X.to(dtype=dtype, device=device), y.to(device)


def make_spdlearn(dtype, device, seed=0):
    from spd_learn.models import SPDNet as SLSPDNet

    torch.manual_seed(seed)
    model = SLSPDNet(
        input_type="cov", subspacedim=N_SUB, threshold=EPS, n_chans=N_CHANS, n_outputs=N_CLASSES
    ).to(dtype=dtype, device=device)
    # spd-learn stores the threshold as a float32 tensor (0.0099999998); converting the module
    # to float64 keeps that rounding. Put back the exact value so that all three compute the
    # same function (it matters for the float64 gradient comparison only).
    with torch.no_grad():
        model.reeig.threshold_.fill_(EPS)
    return model


def make_model(impl, dtype, device, seed=0):
    torch.manual_seed(seed)
    if impl == "ours":
        model = SPDNet(N_CHANS, (N_SUB,), N_CLASSES, eps=EPS, seed=seed, dtype=dtype)
    elif impl == "naive":
        model = NaiveSPDNet(N_CHANS, N_SUB, N_CLASSES, EPS, seed=seed, dtype=dtype)
    else:
        model = make_spdlearn(dtype, device, seed)
    model = model.to(device)
    after = getattr(model, "after_step_", None)
    return model, after


def make_step(impl, dtype, device, X, y, lr=1e-3):
    model, after = make_model(impl, dtype, device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(X), y)
        loss.backward()
        opt.step()
        if after is not None:
            after()
        return loss

    return step


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def machine_info(device):
    cpu = cpu_name()
    lines = [
        f"CPU          : {cpu}",
        f"cores        : {os.cpu_count()} logical (affinity: {len(os.sched_getaffinity(0))})",
        f"python       : {platform.python_version()}  ({platform.platform()})",
        f"torch        : {torch.__version__}  (intra-op threads: {torch.get_num_threads()}, "
        f"inter-op threads: {torch.get_num_interop_threads()})",
    ]
    try:
        import spd_learn

        lines.append(f"spd-learn    : {spd_learn.__version__}")
    except Exception as exc:  # pragma: no cover - informative only
        lines.append(f"spd-learn    : unavailable ({exc})")
    if device.type == "cuda":
        lines.append(f"GPU          : {torch.cuda.get_device_name(device)}")
    return "\n".join(lines)


def time_steps(steps, reps, warmup, device):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    keys = list(steps)
    for _ in range(warmup):
        for k in keys:
            steps[k]()
    sync()
    times = {k: [] for k in keys}
    for r in range(reps):
        shift = r % len(keys)
        for k in keys[shift:] + keys[:shift]:
            sync()
            t0 = time.perf_counter()
            steps[k]()
            sync()
            times[k].append(1e3 * (time.perf_counter() - t0))
    return {k: np.asarray(v) for k, v in times.items()}


# ---------------------------------------------------------------------------------------------
# Gradient checks (float64)
# ---------------------------------------------------------------------------------------------


def _rel(a, b):
    return float(torch.linalg.norm(a - b) / torch.linalg.norm(b).clamp_min(1e-300))


def _loss_of_W(impl, model, W, X, y):
    """The loss as a function of a free BiMap weight ``W`` through ``impl``'s own layers."""
    if impl == "ours":
        feats = vech(reeig_logeig(W.transpose(-1, -2) @ X @ W, EPS))
        return F.cross_entropy(model.head(feats), y)
    if impl == "naive":
        return F.cross_entropy(model.head(model.features_from(W, X)), y)
    out = model.classifier(model.logeig(model.reeig(W.transpose(-1, -2) @ X @ W)))
    return F.cross_entropy(out, y)


def _fd(loss_fn, P, D, h):
    """Fourth-order central difference of the loss along ``D`` (truncation O(h⁴))."""
    with torch.no_grad():
        f = [float(loss_fn(P + c * h * D)) for c in (-2, -1, 1, 2)]
    return (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12 * h)


def gradient_report(X, y, device, h=1e-4, label=""):
    dtype = torch.float64
    W0 = torch.as_tensor(random_stiefel(N_CHANS, N_SUB, 123), dtype=dtype, device=device)
    models = {impl: make_model(impl, dtype, device)[0] for impl in IMPLS}
    # Same point for everyone: same W, same linear head.
    ref_head = models["ours"].head
    with torch.no_grad():
        models["naive"].head.load_state_dict(ref_head.state_dict())
        models["spd-learn"].classifier.load_state_dict(ref_head.state_dict())
        models["ours"].bimaps[0].set_weight(W0)
        models["naive"].W.copy_(W0)
        models["spd-learn"].bimap.weight = W0.unsqueeze(0)  # right_inverse: base ← [W0, ⊥]
    g = torch.Generator().manual_seed(7)
    D = torch.randn(N_CHANS, N_SUB, generator=g, dtype=dtype).to(device)
    D /= torch.linalg.norm(D)

    print(f"\n-- gradient check, float64, {label}; FD: 4th-order central, h={h:g} --")
    print("(a) Euclidean gradient dL/dW at the same W, through each implementation's layers")
    print(f"    {'impl':<10} {'loss':>22} {'finite':>6} {'rel.err vs ours':>16} "
          f"{'Riem. vs ours':>14} {'rel.err vs FD':>14}")
    grads, errors = {}, {}
    for impl in IMPLS:
        W = W0.clone().requires_grad_(True)
        loss = _loss_of_W(impl, models[impl], W, X, y)
        (G,) = torch.autograd.grad(loss, W)
        grads[impl] = (float(loss.detach()), G)
    G_ours = grads["ours"][1]
    for impl in IMPLS:
        loss, G = grads[impl]
        finite = bool(torch.isfinite(G).all())
        fd = _fd(lambda P: _loss_of_W(impl, models[impl], P, X, y), W0, D, h)
        dd = float((G * D).sum())
        rel_fd = abs(dd - fd) / max(abs(fd), 1e-300)
        rel_ours = _rel(G, G_ours)
        rel_riem = _rel(tangent_project(W0, G), tangent_project(W0, G_ours))
        errors[impl] = f"{rel_fd:.1e}" if finite and np.isfinite(rel_fd) else "not finite"
        print(f"    {impl:<10} {loss:>22.16f} {str(finite):>6} {rel_ours:>16.2e} "
              f"{rel_riem:>14.2e} {rel_fd:>14.2e}")

    print("(b) gradient of each implementation's trainable BiMap parameter vs FD along a random"
          " direction")
    # ours: V (at V = 0, dL/dV must be the Riemannian gradient P_W(dL/dW))
    m = models["ours"]
    m.zero_grad(set_to_none=True)
    loss = F.cross_entropy(m(X), y)
    loss.backward()
    gV = m.bimaps[0].V.grad.detach().clone()
    V0 = m.bimaps[0].V.detach().clone()

    def loss_V(V):
        with torch.no_grad():
            m.bimaps[0].V.copy_(V)
            out = F.cross_entropy(m(X), y)
            m.bimaps[0].V.copy_(V0)
        return out

    rows = [("ours", "V", gV, _fd(loss_V, V0, D, h), _rel(gV, tangent_project(W0, G_ours)))]
    # naive: W itself
    m = models["naive"]
    m.zero_grad(set_to_none=True)
    F.cross_entropy(m(X), y).backward()
    gW = m.W.grad.detach().clone()
    rows.append(("naive", "W", gW, _fd(lambda P: _loss_of_W("naive", m, P, X, y), W0, D, h), None))
    # spd-learn: the Cayley parametrization's unconstrained tensor
    m = models["spd-learn"]
    orig = m.bimap.parametrizations.weight.original
    m.zero_grad(set_to_none=True)
    F.cross_entropy(m(X), y).backward()
    gO = orig.grad.detach().clone()
    O0 = orig.detach().clone()
    DO = torch.randn(O0.shape, generator=g, dtype=dtype).to(device)
    DO /= torch.linalg.norm(DO)

    def loss_O(P):
        with torch.no_grad():
            orig.copy_(P)
            out = F.cross_entropy(m(X), y)
            orig.copy_(O0)
        return out

    print(f"    {'impl':<10} {'param':<9} {'finite':>6} {'rel.err vs FD':>14}  note")
    for impl, name, grad, fd, extra in rows:
        dd = float((grad * D).sum())
        note = f"|dL/dV - P_W(dL/dW)|/|.| = {extra:.2e}" if extra is not None else ""
        print(f"    {impl:<10} {name:<9} {str(bool(torch.isfinite(grad).all())):>6} "
              f"{abs(dd - fd) / max(abs(fd), 1e-300):>14.2e}  {note}")
    fd = _fd(loss_O, O0, DO, h)
    dd = float((gO * DO).sum())
    print(f"    {'spd-learn':<10} {'original':<9} {str(bool(torch.isfinite(gO).all())):>6} "
          f"{abs(dd - fd) / max(abs(fd), 1e-300):>14.2e}  (Cayley, base ← [W, W⊥])")
    return errors


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=40, help="timed repetitions (>= 30)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--skip-grad-check", action="store_true")
    add_record_option(parser, "speed-spdnet-step")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.reps < 30:
        parser.error("--reps must be >= 30")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("CUDA requested but not available")
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)

    print("command      :", " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv))
    print(machine_info(device))
    print(f"setup        : B={args.batch}, {N_CHANS}x{N_CHANS} -> BiMap {N_SUB} -> ReEig(eps={EPS})"
          f"+LogEig -> vech ({N_SUB * (N_SUB + 1) // 2}) -> Linear {N_CLASSES}; Adam lr=1e-3; "
          f"reps={args.reps}, warmup={args.warmup}")
    print("naive BiMap  : plain nn.Parameter W, Euclidean Adam, QR re-orthonormalisation "
          "(sign-fixed) after the step; ReEig and LogEig each with torch.linalg.eigh autograd")
    print("spd-learn    : BiMap via torch.nn.utils.parametrizations.orthogonal (Cayley, default),"
          " plain torch.optim.Adam, no after-step hook")

    steps = {}
    for dname, dtype in DTYPES.items():
        X, y = make_batch(args.batch, dtype, device)
        for impl in IMPLS:
            steps[(impl, dname)] = make_step(impl, dtype, device, X, y)
    times = time_steps(steps, args.reps, args.warmup, device)

    print(f"\nms per training step (median over {args.reps} interleaved reps; IQR = q75 - q25)")
    print(f"{'implementation':<14} {'dtype':<8} {'median ms':>10} {'IQR ms':>8} {'q25':>8} {'q75':>8}")
    med = {}
    for dname in DTYPES:
        for impl in IMPLS:
            q25, q50, q75 = np.percentile(times[(impl, dname)], [25, 50, 75])
            med[(impl, dname)] = q50
            print(f"{impl:<14} {dname:<8} {q50:>10.3f} {q75 - q25:>8.3f} {q25:>8.3f} {q75:>8.3f}")
    print("\nratios of medians (> 1: ours faster)")
    for dname in DTYPES:
        r_sl = med[("spd-learn", dname)] / med[("ours", dname)]
        r_nv = med[("naive", dname)] / med[("ours", dname)]
        verdict = "target reached" if r_sl >= 2 else "target not reached"
        print(f"  {dname}: spd-learn/ours = {r_sl:.2f}x ({verdict}: >= 2x)   naive/ours = {r_nv:.2f}x")

    facts = {"batch": args.batch, "threads": args.threads, "device": args.device}
    if not args.skip_grad_check:
        X, y = make_batch(args.batch, torch.float64, device)
        generic = gradient_report(X, y, device, label="generic batch (distinct eigenvalues)")
        Xd, yd = make_degenerate_batch(args.batch, torch.float64, device)
        degenerate = gradient_report(Xd, yd, device,
                                     label="degenerate batch (identity -> tied eigenvalues; rank 4 -> 14 ties at eps)")
        facts.update({f"gradient_error_{impl}": generic[impl] for impl in IMPLS})
        facts.update({f"degenerate_gradient_error_{impl}": degenerate[impl] for impl in IMPLS})
    labels = {"ours": "skfedspd `SPDNet`", "naive": "naive (`eigh` autograd, QR)", "spd-learn": "spd-learn `SPDNet`"}
    write_speed_record(args.record, title="One SPDnet training step: skfedspd, a naive implementation, spd-learn",
                       times={f"{impl}/{d}": times[(impl, d)] for d in DTYPES for impl in IMPLS},
                       labels={f"{impl}/{d}": f"{labels[impl]}, {d}" for d in DTYPES for impl in IMPLS},
                       reference="ours/float32", started=started, facts=facts)


if __name__ == "__main__":
    main()
