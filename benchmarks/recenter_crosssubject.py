"""Unseen subjects on the offline PhysionetMI data: does re-centring (Recenter, domain BN) help?

Leave-one-subject-out over ``--subjects`` (left/right imagery, 64 channels, 8-32 Hz, 3 s):
each fold trains on the other subjects (their subject ids routed as ``groups``) and scores
the held-out subject, predicted in one call (one new domain). Pipelines:

* ``TS+LR``            — pyRiemann ``TangentSpace`` + ``LogisticRegression``;
* ``Recenter+TS+LR``   — :class:`skfedspd.Recenter` first (each training subject by its own
  mean, the test subject by its own mean);
* ``SPDnet``           — ``SPDnetClassifier(batchnorm=None)``;
* ``SPDnet+domainBN``  — ``SPDnetClassifier(batchnorm="domain")`` (training domains = subjects).

SPDnet variants share ``--epochs``, ``--lr`` and no validation split (fixed budget, same for
both). Metric: balanced accuracy per held-out subject; mean ± sd over subjects.

``--online`` also scores the models that take a ``domain`` at prediction (Recenter, domain
BN) one trial per call, as an online BCI would: ``online`` passes ``domain=`` (the held-out
subject's statistics adapt as its trials arrive, each trial predicted after its own update),
``1 trial`` passes none (each trial re-centred by the mean of the training prior and itself).

Usage::

    .venv/bin/python benchmarks/recenter_crosssubject.py [--subjects 1 2 3 4 5 6 7 8] [--epochs 60]
"""

import argparse
import platform
import shlex
import sys
import time
import warnings

import numpy as np
import sklearn
import torch
from pyriemann.tangentspace import TangentSpace
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score
from sklearn.pipeline import make_pipeline
from sklearn.utils.metadata_routing import get_routing_for_object

from _machine import cpu_name
from skfedspd import Recenter, SPDnetClassifier
from skfedspd.datasets import load_physionet_mi


def pipelines(args):
    spdnet = dict(max_epochs=args.epochs, lr=args.lr, validation_fraction=0.0, random_state=0)
    return {
        "TS+LR": make_pipeline(TangentSpace(), LogisticRegression(max_iter=1000)),
        "Recenter+TS+LR": make_pipeline(Recenter(), TangentSpace(), LogisticRegression(max_iter=1000)),
        "SPDnet": SPDnetClassifier(**spdnet),
        "SPDnet+domainBN": SPDnetClassifier(batchnorm="domain", **spdnet),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subjects", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--only", nargs="+", default=None, help="pipeline names to run")
    parser.add_argument("--online", action="store_true", help="also score one trial per call (see above)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("command :", " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv))
    print(f"machine : {cpu_name()}, torch {torch.__version__}, 1 thread, python {platform.python_version()}")
    X, y, subjects, _ = load_physionet_mi(args.subjects, n_classes=2)
    print(f"data    : {len(X)} trials, {X.shape[1]} channels, subjects {args.subjects}")
    names = [n for n in pipelines(args) if args.only is None or n in args.only]
    with sklearn.config_context(enable_metadata_routing=True):
        online = [n for n in names if args.online
                  and get_routing_for_object(pipelines(args)[n]).consumes("predict", {"domain"})]
    scores = {key: [] for key in names + [f"{n} {mode}" for n in online for mode in ("online", "1 trial")]}
    start = time.perf_counter()
    with sklearn.config_context(enable_metadata_routing=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for held_out in args.subjects:
            train, test = subjects != held_out, subjects == held_out
            row = []
            for name in names:
                model = sklearn.clone(pipelines(args)[name])
                # as MOABB does: pass the metadata only to models that consume it
                wants = get_routing_for_object(model).consumes("fit", {"groups"})
                model.fit(X[train], y[train], **({"groups": subjects[train]} if wants else {}))
                scores[name].append(balanced_accuracy_score(y[test], model.predict(X[test])))
                row.append(f"{name} {scores[name][-1]:.3f}")
                if name in online:
                    single = [model.predict(x[None])[0] for x in X[test]]
                    adapted = [model.predict(x[None], domain=int(held_out))[0] for x in X[test]]
                    for mode, predicted in (("online", adapted), ("1 trial", single)):
                        scores[f"{name} {mode}"].append(balanced_accuracy_score(y[test], predicted))
                        row.append(f"{mode} {scores[f'{name} {mode}'][-1]:.3f}")
            print(f"subject {held_out:>3}: " + "  ".join(row), flush=True)
    print(f"\nbalanced accuracy on the held-out subject, mean ± sd over {len(args.subjects)} subjects "
          f"({time.perf_counter() - start:.0f} s)")
    for name, values in scores.items():
        print(f"  {name:<24} {np.mean(values):.3f} ± {np.std(values):.3f}")


if __name__ == "__main__":
    main()
