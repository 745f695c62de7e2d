"""What the trust checks cost: the same calls with the checks and with them switched off.

* ``online``: ``SPDnetClassifier(batchnorm="domain")``, one 64-channel trial per call,
  ``predict(x, domain="s17")`` (the domain updated first); "checks off" replaces the fitted
  parameters' check (``check_fitted_params``, run by every prediction) by a no-op.
* ``round``: a ``FederatedSPDnetClassifier`` fit of 2 rounds on 4 clients (64 channels, 40
  trials each, one local epoch); "checks off" replaces the server's aggregate check
  (``skfedspd.engine.check_aggregate``) and the Stiefel check of ``set_parameters`` by no-ops:
  the ratio bounds what every check of the replies and aggregates costs a round.

Each repetition runs both variants of a pair, in an order alternated from one repetition to
the next, so that machine noise hits both alike; medians and their ratio (checks on / off).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_trust_checks.py [--reps 300] [--rounds-reps 10]

Writes the record ``speed-trust-checks`` (``--record``): ms per call of each variant per repetition.
"""

import argparse
import contextlib
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

import skfedspd
from _machine import cpu_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package, for its records
from benchmarks.records.speed import add_record_option, write_speed_record  # noqa: E402
from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier  # noqa: E402
from skfedspd import engine, nn  # noqa: E402
from skfedspd.base import TorchClassifierBase  # noqa: E402
from skfedspd.datasets import make_spd_classification  # noqa: E402

N_CHANS = 64


@contextlib.contextmanager
def replaced(owner, name, value):
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def unchecked_prediction():
    return replaced(TorchClassifierBase, "check_fitted_params", lambda self: None)


@contextlib.contextmanager
def unchecked_round():
    with replaced(engine, "check_aggregate", lambda *args, **kwargs: None), \
            replaced(nn, "orthonormality_problem", lambda *args, **kwargs: None):
        yield


def timed_pair(on, off, reps):
    """``{"on": [ms...], "off": [ms...]}`` over ``reps`` alternated repetitions."""
    times = {"on": [], "off": []}
    for rep in range(reps):
        for name in (("on", "off") if rep % 2 == 0 else ("off", "on")):
            start = time.perf_counter()
            (on if name == "on" else off)(rep)
            times[name].append(1e3 * (time.perf_counter() - start))
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--rounds-reps", type=int, default=10)
    add_record_option(parser, "speed-trust-checks")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(1)
    X, y = make_spd_classification(200 + args.reps, N_CHANS, 2, seed=0)
    domain = SPDnetClassifier(batchnorm="domain", max_epochs=1, random_state=0).fit(
        X[:200], y[:200], groups=np.arange(200) % 4)
    stream = X[200:]

    def predict_unchecked(rep):
        with unchecked_prediction():
            domain.predict(stream[rep][None], domain="s17")

    groups = np.repeat(np.arange(4), 40)
    fed = FederatedSPDnetClassifier(SPDnetClassifier(max_epochs=1), n_rounds=2, local_epochs=1, random_state=0)

    def fit_unchecked(rep):
        with unchecked_round():
            fed.fit(X[:160], y[:160], groups=groups)

    print("command      :", " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv))
    print(f"machine      : {cpu_name()}, torch {torch.__version__}, 1 thread, python {platform.python_version()}")
    print(f"package      : skfedspd {skfedspd.__version__}")
    for rep in range(10):  # warm-up
        domain.predict(stream[rep][None], domain="warm-up")
    fed.fit(X[:160], y[:160], groups=groups)
    online = timed_pair(lambda rep: domain.predict(stream[rep][None], domain="s17"), predict_unchecked, args.reps)
    rounds = timed_pair(lambda rep: fed.fit(X[:160], y[:160], groups=groups), fit_unchecked, args.rounds_reps)
    print(f"\n{'variant':<34} {'median ms':>10} {'on / off':>9}")
    for label, times in (("online predict+update", online), ("federated fit, 2 rounds", rounds)):
        on, off = np.median(times["on"]), np.median(times["off"])
        print(f"{label + ', checks on':<34} {on:>10.3f} {on / off:>9.3f}")
        print(f"{label + ', checks off':<34} {off:>10.3f}")
    write_speed_record(
        args.record, title="The trust checks: the same calls with them and without them",
        times={"online-on": online["on"], "online-off": online["off"],
               "round-on": dict(enumerate(rounds["on"])), "round-off": dict(enumerate(rounds["off"]))},
        labels={"online-on": "online predict+update, checks on", "online-off": "online predict+update, checks off",
                "round-on": "federated fit of 2 rounds, checks on", "round-off": "federated fit of 2 rounds, checks off"},
        reference="online-off", started=started, description="milliseconds per call",
        facts={"channels": N_CHANS, "target": "checks on within 5 % of checks off"})


if __name__ == "__main__":
    main()
