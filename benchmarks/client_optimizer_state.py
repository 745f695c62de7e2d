"""Ablation behind ``FederatedSPDnetClassifier(client_optimizer_state="keep")``: a client that
keeps its Adam state from one of its rounds to the next, against a fresh Adam every round.

Why it matters. With ``"reset"`` (the paper's clients) every round builds a fresh Adam. With
small sites a round is one or two minibatches (36-135 trials, batch 64, E = 2), and Adam's
bias-corrected first step is ``lr · sign(g)`` on every coordinate: local training becomes
sign-SGD at the full learning rate, round after round, where centralized Adam averages its
moments over hundreds of steps. ``"keep"`` resumes each client's moments and step count
(only the learning rate is the round's); the state never leaves the client.

Protocols (PhysionetMI left/right, offline copy, ROC-AUC %):

* ``--protocol cross``: leave one subject out within each group of subjects given, the
  training subjects as FedSPDnet's clients (MOABB CrossSubject's split);
* ``--protocol within``: per subject, the folds of ``benchmarks/defaults_ablation.py``
  (StratifiedKFold(5, shuffle, random_state=42)), FedSPDnet's default stratified partition.

Covariances: ``load_physionet_mi`` (sample covariance), as in ``defaults_ablation.py``, whose
TS+LR this is; MOABB's pipelines in ``moabb_evaluation.py`` estimate their own (OAS), so their
TS+LR differs (e.g. 74.1 against 72.1 cross-subject on subjects 1–4).

Rows: ``SPDnetClassifier()``, ``FederatedSPDnetClassifier(client_optimizer_state="reset")``,
``FederatedSPDnetClassifier()`` (``"keep"``, the default), TS+LR. ``random_state=0`` everywhere.
(Sessions 5 and 6 measured ``"keep"`` with an equivalent subclass of ``SPDnetClassifier``,
before the option existed.)

    python benchmarks/client_optimizer_state.py --protocol cross --subjects 1 2 3 4
    python benchmarks/client_optimizer_state.py --protocol within --subjects 1 2 3 4 5 6 7 8
"""

import argparse
import os
import platform
import sys
import time
import warnings

import numpy as np
import torch
from pyriemann.tangentspace import TangentSpace
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline

from _machine import cpu_name
from defaults_ablation import folds
from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.datasets import configure_offline, find_physionet_root, load_physionet_mi

MODELS = {
    "SPDnet": lambda: SPDnetClassifier(random_state=0),
    "FedSPDnet, fresh client Adam (reset)": lambda: FederatedSPDnetClassifier(
        random_state=0, partition="stratified", client_optimizer_state="reset"),
    "FedSPDnet, kept client Adam (keep)": lambda: FederatedSPDnetClassifier(random_state=0, partition="stratified"),
    # as benchmarks/defaults_ablation.py, on the same covariances
    "TS+LR": lambda: make_pipeline(TangentSpace(metric="riemann"), LogisticRegression(C=1.0, max_iter=1000)),
}


def auc(make, name, X_train, y_train, groups, X_test, y_test):
    clf = make()
    if name.startswith("Fed") and groups is not None:
        clf.fit(X_train, y_train, groups=groups)
    else:
        clf.fit(X_train, y_train)
    return roc_auc_score(y_test == clf.classes_[1], clf.predict_proba(X_test)[:, 1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=("cross", "within"), required=True)
    parser.add_argument("--subjects", type=int, nargs="+", required=True)
    args = parser.parse_args(argv)
    print(f"command: python benchmarks/client_optimizer_state.py {' '.join(argv or sys.argv[1:])}")
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}")
    root = find_physionet_root()
    if root is None:
        print("PhysioNet MI data not found: nothing to run")
        return 0
    configure_offline(root)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    start = time.perf_counter()
    scores = {name: [] for name in MODELS}
    if args.protocol == "cross":
        X, y, subjects, _ = load_physionet_mi(args.subjects, n_classes=2)
        units = [(s, [(subjects != s, subjects == s)], X, y, subjects) for s in args.subjects]
    else:
        units = []
        for s in args.subjects:
            X, y, _, _ = load_physionet_mi([s], n_classes=2)
            units.append((s, folds(y), X, y, None))
    for subject, splits, X, y, groups in units:
        per = {name: np.mean([auc(make, name, X[tr], y[tr], None if groups is None else groups[tr], X[te], y[te])
                              for tr, te in splits]) for name, make in MODELS.items()}
        for name, value in per.items():
            scores[name].append(value)
        print(f"  subject {subject:3d}: " + ", ".join(f"{n} {100 * v:.1f}" for n, v in per.items()), flush=True)
    print(f"\n{args.protocol}, subjects {args.subjects}, ROC-AUC % (mean over subjects):")
    base = np.mean(scores["FedSPDnet, fresh client Adam (reset)"])
    for name, values in scores.items():
        print(f"  {name:36s} {100 * np.mean(values):5.1f}   ({100 * (np.mean(values) - base):+.1f} vs reset)")
    print(f"{(time.perf_counter() - start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
