"""Cost of SPD batch normalization in one SPDnet training step, side by side with no batch norm.

One step = ``zero_grad`` + forward + cross-entropy + backward + ``Adam.step()`` +
``after_step_()`` on a batch of ``B`` SPD matrices 64×64 → BiMap to 18 → [BN] → ReEig + LogEig
→ vech → Linear to 4 classes (the paper's PhysionetMI network). Variants:

* ``none``               — ``SPDNet(..., batchnorm=None)``: the fused fast path, unchanged;
* ``spd k=0``            — ``batchnorm="spd", karcher_steps=0`` (log-Euclidean batch mean);
* ``spd k=1``            — ``batchnorm="spd"`` (default: log-Euclidean start + 1 Karcher step);
* ``spd k=3``            — ``batchnorm="spd", karcher_steps=3``;
* ``domain k=1, D=4``    — ``batchnorm="domain"``, the batch split in 4 domains.

Timing: ``torch.set_num_threads(1)``, warm-up, then ``--reps`` repetitions; inside each
repetition every variant runs one step in an order rotated from one repetition to the next,
so machine noise hits all alike. Median and IQR in ms, and the ratio to ``none``.

Usage::

    .venv/bin/python benchmarks/bench_batchnorm.py [--reps 30] [--batch 64] [--dtype float64]

Writes the record ``speed-batchnorm`` (``--record``): ms per step of every variant per repetition.
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
from skfedspd.nn import SPDNet

N_CHANS, N_SUB, N_CLASSES, EPS = 64, 18, 4, 1e-2
VARIANTS = {
    "none": dict(batchnorm=None),
    "spd k=0": dict(batchnorm="spd", karcher_steps=0),
    "spd k=1": dict(batchnorm="spd", karcher_steps=1),
    "spd k=3": dict(batchnorm="spd", karcher_steps=3),
    "domain k=1, D=4": dict(batchnorm="domain", karcher_steps=1),
}


def make_step(kwargs, X, y, dtype):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = SPDNet(N_CHANS, (N_SUB,), N_CLASSES, eps=EPS, seed=0, dtype=dtype, **kwargs)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    domains = np.arange(len(y)) % 4 if kwargs["batchnorm"] == "domain" else None

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(X, domains), y)
        loss.backward()
        optimizer.step()
        net.after_step_()
        return float(loss.detach())

    return step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    add_record_option(parser, "speed-batchnorm")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    X, y = make_spd_classification(args.batch, N_CHANS, N_CLASSES, seed=0)
    X, y = torch.as_tensor(X / np.trace(X, axis1=1, axis2=2).mean() * N_CHANS, dtype=dtype), torch.as_tensor(y)

    print("command      :", " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv))
    print(f"machine      : {cpu_name()}, torch {torch.__version__}, 1 thread, python {platform.python_version()}")
    print(f"setup        : B={args.batch}, {N_CHANS}x{N_CHANS} -> BiMap {N_SUB} -> [BN] -> ReEig+LogEig"
          f" -> Linear {N_CLASSES}, {args.dtype}, Adam")
    steps = {name: make_step(kwargs, X, y, dtype) for name, kwargs in VARIANTS.items()}
    for step in steps.values():  # warm-up
        for _ in range(3):
            step()
    names = list(steps)
    times = {name: [] for name in names}
    for rep in range(args.reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            start = time.perf_counter()
            steps[name]()
            times[name].append(1e3 * (time.perf_counter() - start))
    base = np.median(times["none"])
    print(f"\nms per training step (median over {args.reps} interleaved reps)")
    print(f"{'variant':<18} {'median ms':>10} {'IQR ms':>8} {'/ none':>8}")
    for name in names:
        q25, q50, q75 = np.percentile(times[name], [25, 50, 75])
        print(f"{name:<18} {q50:>10.3f} {q75 - q25:>8.3f} {q50 / base:>8.2f}")
    keys = {"none": "none", "spd k=0": "spd-k0", "spd k=1": "spd-k1", "spd k=3": "spd-k3",
            "domain k=1, D=4": "domain-k1"}
    write_speed_record(args.record, title="SPDnet training step with SPD batch normalization against none",
                       times={keys[n]: times[n] for n in names}, labels={keys[n]: n for n in names}, reference="none",
                       started=started, facts={"batch": args.batch, "dtype": args.dtype})


if __name__ == "__main__":
    main()
