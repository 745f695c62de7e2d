"""Latency of online prediction: one trial per call, its domain's statistics updated first.

One 64-channel trial (a 64×64 SPD matrix) per call, float64, one thread, the default
network (``hidden_dims="auto"``: one BiMap 64 → 18, then ReEig + LogEig → Linear):

* ``plain predict``          — ``SPDnetClassifier()``: ``predict(x)`` (no batch norm);
* ``domain predict+update``  — ``SPDnetClassifier(batchnorm="domain")``:
  ``predict(x, domain="s17")`` (adds ``x`` to subject s17's running mean, then predicts it
  with the statistics without it: those just before the update, kept, so no extra cost);
* ``domain, no domain=``     — the same model, ``predict(x)`` (a temporary domain from the prior);
* ``Recenter+TS+LR``         — ``make_pipeline(Recenter(), TangentSpace(), LogisticRegression())``
  under metadata routing, ``predict(x, domain="s17")``;
* ``Recenter+TS+LR, steps``  — the same fitted steps called one after the other
  (``Recenter.transform(x, domain=...)``, then the others): the same work without
  scikit-learn's routing of ``domain`` through the Pipeline.

Every call goes through the public scikit-learn API (input validation included). Timing:
``torch.set_num_threads(1)``, warm-up, then ``--reps`` repetitions, each running every
variant once in an order rotated from one repetition to the next so that machine noise hits
all alike. Median and 90th percentile in ms, and the median's ratio to ``plain predict``.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_online.py [--reps 300]

Writes the record ``speed-online`` (``--record``): ms per call of every variant per repetition.
"""

import argparse
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import sklearn
import torch
from pyriemann.tangentspace import TangentSpace
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

import skfedspd
from _machine import cpu_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package, for its records
from benchmarks.records.speed import add_record_option, write_speed_record  # noqa: E402
from skfedspd import Recenter, SPDnetClassifier
from skfedspd.datasets import make_spd_classification

N_CHANS, N_TRAIN, N_CLASSES = 64, 200, 2


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=300)
    add_record_option(parser, "speed-online")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(1)
    X, y = make_spd_classification(N_TRAIN + args.reps, N_CHANS, N_CLASSES, seed=0)
    groups = np.arange(N_TRAIN) % 4
    train, stream = slice(0, N_TRAIN), X[N_TRAIN:]
    # The weights do not change the cost of a prediction: one epoch is enough.
    fit = dict(max_epochs=1, random_state=0)
    plain = SPDnetClassifier(**fit).fit(X[train], y[train])
    domain = SPDnetClassifier(batchnorm="domain", **fit).fit(X[train], y[train], groups=groups)
    sklearn.set_config(enable_metadata_routing=True)
    pipe = make_pipeline(Recenter(), TangentSpace(), LogisticRegression()).fit(X[train], y[train], groups=groups)
    variants = {
        "plain predict": lambda x: plain.predict(x),
        "domain predict+update": lambda x: domain.predict(x, domain="s17"),
        "domain, no domain=": lambda x: domain.predict(x),
        "Recenter+TS+LR": lambda x: pipe.predict(x, domain="s17"),
        "Recenter+TS+LR, steps": lambda x: pipe[2].predict(pipe[1].transform(pipe[0].transform(x, domain="s18"))),
    }

    print("command      :", " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv))
    print(f"machine      : {cpu_name()}, torch {torch.__version__}, 1 thread, python {platform.python_version()}")
    print(f"package      : skfedspd {skfedspd.__version__}, scikit-learn {sklearn.__version__}")
    print(f"setup        : one {N_CHANS}x{N_CHANS} trial per call, float64, SPDnet BiMap {N_CHANS}->"
          f"{plain.module_.bimaps[0].weight.shape[1]} -> ReEig+LogEig -> Linear {N_CLASSES}")
    for call in variants.values():  # warm-up
        for x in stream[:10]:
            call(x[None])
    names = list(variants)
    times = {name: [] for name in names}
    for rep, x in enumerate(stream):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            start = time.perf_counter()
            variants[name](x[None])
            times[name].append(1e3 * (time.perf_counter() - start))
    base = np.median(times["plain predict"])
    print(f"\nms per one-trial call ({args.reps} interleaved reps; the domain has seen up to "
          f"{domain.domains_['s17']} trials)")
    print(f"{'variant':<26} {'median ms':>10} {'p90 ms':>8} {'/ plain':>8}")
    for name in names:
        q50, q90 = np.percentile(times[name], [50, 90])
        print(f"{name:<26} {q50:>10.3f} {q90:>8.3f} {q50 / base:>8.2f}")
    keys = {"plain predict": "plain", "domain predict+update": "domain-update", "domain, no domain=": "domain-none",
            "Recenter+TS+LR": "recenter-tslr", "Recenter+TS+LR, steps": "recenter-tslr-steps"}
    write_speed_record(args.record, title="Online prediction: one trial per call, its domain updated first",
                       times={keys[name]: times[name] for name in names}, labels={keys[n]: n for n in names},
                       reference="plain", started=started, description="milliseconds per one-trial call",
                       facts={"target": "≤ 1 ms", "channels": N_CHANS})


if __name__ == "__main__":
    main()
