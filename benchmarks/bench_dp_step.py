"""Cost of one DP-SGD step (skfedspd.privacy) against one plain training step, side by side.

One plain step: :func:`skfedspd.training.train_epochs` for one epoch of one batch of ``B``
samples with a fresh Adam (forward + backward + ``Adam.step()`` + ``after_step_()``).
One DP step: :func:`skfedspd.dp_sgd.dp_train_epochs` with ``sample_rate=1`` on the same ``B``
samples (all drawn: one step), fresh Adam: per-sample gradients (Riemannian for the BiMap),
joint clipping, Gaussian noise projected to the tangent space, ``Adam.step()``,
``after_step_()`` and re-centring.

Models (PhysionetMI sizes): SPDNet 64×64 → BiMap 18 → ReEig+LogEig → vech → Linear 4 (per-sample
gradients by the batched backward — the default for SPDnet: its autograd Functions cannot run
under ``torch.func`` — and by the loop), and EEGNet-8,2 on 64 channels × 480 samples at 160 Hz,
BatchNorm frozen (per-sample gradients by ``torch.func.vmap`` — the default —, the batched
backward and the loop). ``torch.set_num_threads(1)``, one warm-up, then ``--reps`` repetitions rotating the
order of the variants; median and IQR in ms.

Usage::

    .venv/bin/python benchmarks/bench_dp_step.py [--reps 7] [--batch 64]

Writes the record ``speed-dp-step`` (``--record``): ms per step of every model and variant per
repetition.
"""

import argparse
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _machine import cpu_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package, for its records
from benchmarks.records.speed import add_record_option, write_speed_record  # noqa: E402
from skfedspd.datasets import make_spd_classification
from skfedspd.eegnet import EEGNet
from skfedspd.nn import SPDNet
from skfedspd.dp_sgd import dp_train_epochs
from skfedspd.training import train_epochs


def plain_step(module, X, y):
    train_epochs(module, torch.optim.Adam(module.parameters(), lr=1e-3), X, y, n_epochs=1,
                 batch_size=len(y), generator=torch.Generator().manual_seed(0))


def dp_step(method):
    def step(module, X, y):
        dp_train_epochs(module, X, y, n_epochs=1, sample_rate=1.0, clip_norm=1.0, noise_multiplier=1.0,
                        lr=1e-3, generator=torch.Generator().manual_seed(0), optimizer="adam", method=method)
    return step


def frozen_bn_plain_step(module, X, y):
    """Plain step with BatchNorm frozen, as DP runs it (same model function)."""
    bns = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for m in bns:
        m.eval()
    try:
        opt = torch.optim.Adam(module.parameters(), lr=1e-3)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(module(X), y).backward()
        opt.step()
        module.after_step_()
    finally:
        for m in bns:
            m.train()


def time_variants(variants, X, y, reps):
    times = {name: [] for name in variants}
    names = list(variants)
    for name in names:  # warm-up
        module, step = variants[name]
        step(module, X, y)
    for r in range(reps):
        for name in names[r % len(names):] + names[: r % len(names)]:
            module, step = variants[name]
            start = time.perf_counter()
            step(module, X, y)
            times[name].append(1e3 * (time.perf_counter() - start))
    return times


def report(title, times, reference):
    ref = np.median(times[reference])
    print(f"\n{title}")
    print(f"{'variant':<28}{'median ms':>12}{'IQR ms':>10}{'× plain':>10}")
    for name, t in times.items():
        q1, med, q3 = np.percentile(t, [25, 50, 75])
        print(f"{name:<28}{med:>12.1f}{q3 - q1:>10.1f}{med / ref:>10.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--batch", type=int, default=64)
    add_record_option(parser, "speed-dp-step")
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(1)
    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(f"machine: {cpu_name()}, python {platform.python_version()}, torch {torch.__version__}, 1 thread")

    X, y = make_spd_classification(args.batch, 64, 4, seed=0)
    X, y = torch.as_tensor(X / np.trace(X, axis1=1, axis2=2)[:, None, None] * 64), torch.as_tensor(y)
    spd = {name: (SPDNet(64, (18,), 4, eps=1e-2, seed=0), step)
           for name, step in (("plain (Adam)", plain_step), ("DP, batched backward", dp_step("batched")),
                              ("DP, per-sample loop", dp_step("loop")))}
    spd_times = time_variants(spd, X, y, args.reps)
    report(f"SPDNet 64→18, 4 classes, float64, batch {args.batch}", spd_times, "plain (Adam)")

    rng = np.random.default_rng(0)
    Xe = torch.as_tensor(rng.standard_normal((args.batch, 64, 480)), dtype=torch.float32)
    ye = torch.as_tensor(np.arange(args.batch) % 4)
    eeg = {name: (EEGNet(64, 480, 4, fs=160.0), step)
           for name, step in (("plain (Adam)", plain_step), ("plain, BatchNorm frozen", frozen_bn_plain_step),
                              ("DP, per-sample vmap", dp_step("vmap")), ("DP, batched backward", dp_step("batched")),
                              ("DP, per-sample loop", dp_step("loop")))}
    eeg_times = time_variants(eeg, Xe, ye, args.reps)
    report(f"EEGNet-8,2 64×480 @160 Hz, 4 classes, float32, batch {args.batch}", eeg_times, "plain (Adam)")
    keys = {"plain (Adam)": "plain", "plain, BatchNorm frozen": "plain-frozen-bn", "DP, per-sample vmap": "dp-vmap",
            "DP, batched backward": "dp-batched", "DP, per-sample loop": "dp-loop"}
    times = {f"spdnet/{keys[n]}": t for n, t in spd_times.items()} | {f"eegnet/{keys[n]}": t for n, t in eeg_times.items()}
    labels = {f"spdnet/{keys[n]}": f"SPDNet, {n}" for n in spd_times} | {f"eegnet/{keys[n]}": f"EEGNet, {n}" for n in eeg_times}
    write_speed_record(args.record, title="One DP-SGD step against one plain step", times=times, labels=labels,
                       reference="spdnet/plain", started=started, facts={"batch": args.batch})


if __name__ == "__main__":
    main()
