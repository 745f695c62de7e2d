"""Benchmark of ONE EEGNet-8,2 training step: the fast block 1 vs the layer-by-layer reference.

One step = ``zero_grad`` + forward + cross-entropy + backward + ``Adam.step()`` +
``apply_max_norm_()``, on a batch of ``B`` trials of ``C × T`` (default 64 × 64 × 480, 4
classes, fs = 160 Hz: PhysionetMI, 3 284 parameters). Implementations, on two copies of the
same module:

* ``reference`` — ``EEGNet._reference_forward``: temporal conv over ``(B, 1, C, T)``, BN1 over
  the ``(B, F1, C, T)`` maps, depthwise spatial conv (the straightforward computation);
* ``fast``      — ``EEGNet.forward``: spatial filtering first, temporal conv of the ``F1·D``
  filtered signals, BN1 batch statistics from the lagged Gram matrix of the input
  (``EEGNet._block1_fast``); same function up to rounding.

Timing: ``torch.set_num_threads(n)`` for each ``n`` of ``--threads``, warm-up, then ``--reps``
repetitions; in each repetition both implementations run one step, in alternating order, so
machine noise hits both alike. Wall clock (``time.perf_counter``). Reported: median and IQR in
ms per step, the ratio, and the time of one epoch of ``--epoch-trials`` trials (ceil(n/B)
steps of the median time, the last batch counted as a full one).

Usage::

    .venv/bin/python benchmarks/bench_eegnet.py [--reps 20] [--batch 64] [--threads 2 1]

Writes the record ``speed-eegnet`` (``--record``): ms per step of each implementation and
thread count per repetition.
"""

import argparse
import copy
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from _machine import cpu_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package, for its records
from benchmarks.records.speed import add_record_option, write_speed_record  # noqa: E402
from skfedspd.eegnet import EEGNet


def make_step(model, method):
    forward = getattr(model, method)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(forward(x), y)
        loss.backward()
        optimizer.step()
        model.apply_max_norm_()
        return loss

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--times", type=int, default=480)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--fs", type=float, default=160.0)
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--epoch-trials", type=int, default=918)
    add_record_option(parser, "speed-eegnet")
    args = parser.parse_args()
    started = time.perf_counter()

    print("command:", shlex.join([sys.executable] + sys.argv))
    print(f"machine: {platform.node()} | {cpu_name()} | {os.cpu_count()} logical CPUs | "
          f"{platform.platform()} | python {platform.python_version()} | torch {torch.__version__}")
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    base = EEGNet(args.channels, args.times, args.classes, args.fs).to(dtype).train()
    n_params = sum(p.numel() for p in base.parameters())
    print(f"EEGNet-8,2: C={args.channels}, T={args.times}, {args.classes} classes, "
          f"Kt={base.kernel_length}, {n_params} parameters; B={args.batch}, {args.dtype}")
    x = torch.randn(args.batch, args.channels, args.times, dtype=dtype)
    y = torch.randint(args.classes, (args.batch,))
    steps = {"reference": make_step(copy.deepcopy(base), "_reference_forward"),
             "fast": make_step(copy.deepcopy(base), "forward")}
    n_steps = math.ceil(args.epoch_trials / args.batch)
    recorded, labels = {}, {}

    for threads in args.threads:
        torch.set_num_threads(threads)
        for _ in range(args.warmup):
            for step in steps.values():
                step(x, y)
        times = {name: [] for name in steps}
        order = list(steps)
        for rep in range(args.reps):
            for name in (order if rep % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                steps[name](x, y)
                times[name].append(1e3 * (time.perf_counter() - t0))
        print(f"\ntorch.set_num_threads({threads}), {args.reps} interleaved repetitions")
        med = {}
        for name, ts in times.items():
            q1, med[name], q3 = np.percentile(ts, [25, 50, 75])
            print(f"  {name:9s} {med[name]:9.2f} ms/step (IQR {q1:.2f}-{q3:.2f})   "
                  f"epoch of {args.epoch_trials} trials ({n_steps} steps): "
                  f"{med[name] * n_steps / 1e3:6.2f} s")
        print(f"  ratio reference / fast: {med['reference'] / med['fast']:.1f}x")
        for name, ts in times.items():
            recorded[f"{name}/{threads}"] = ts
            labels[f"{name}/{threads}"] = (f"{'layer by layer' if name == 'reference' else 'fast block 1'}, "
                                           f"{threads} thread{'s' if threads > 1 else ''}")
    write_speed_record(args.record, title="One EEGNet-8,2 training step: the fast block 1 against layer by layer",
                       times=recorded, labels=labels, reference=f"fast/{args.threads[-1]}", started=started,
                       facts={"batch": args.batch, "channels": args.channels, "times": args.times,
                              "dtype": args.dtype, "parameters": n_params})


if __name__ == "__main__":
    main()
