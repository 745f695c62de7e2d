"""Ablation: does a client that keeps its Adam state from round to round close FedSPDnet's gap?

Why it might. Every round each client builds a fresh Adam optimizer (``local_update``). With
small sites a round is one or two minibatches (36-135 trials, batch 64, E = 2), and Adam's
bias-corrected first step is ``lr · sign(g)`` on every coordinate: local training becomes
sign-SGD at the full learning rate, round after round, where centralized Adam averages its
moments over hundreds of steps. The variant below keeps each client's Adam moments and step
count between its rounds (only the learning rate is the round's); nothing else changes, and
the state never leaves the client. It is an experiment, not a package option.

Protocols (PhysionetMI left/right, offline copy, ROC-AUC %):

* ``--protocol cross``: leave one subject out within each group of subjects given, the
  training subjects as FedSPDnet's clients (MOABB CrossSubject's split);
* ``--protocol within``: per subject, the folds of ``benchmarks/defaults_ablation.py``
  (StratifiedKFold(5, shuffle, random_state=42)), FedSPDnet's default stratified partition.

Covariances: ``load_physionet_mi`` (sample covariance), as in ``defaults_ablation.py``, whose
TS+LR this is; MOABB's pipelines in ``moabb_evaluation.py`` estimate their own (OAS), so their
TS+LR differs (e.g. 74.1 against 72.1 cross-subject on subjects 1–4).

Rows: ``SPDnetClassifier()``, ``FederatedSPDnetClassifier()`` (both with their defaults),
the same with persistent client Adam, TS+LR. ``random_state=0`` everywhere.

    python benchmarks/client_optimizer_state.py --protocol cross --subjects 1 2 3 4
    python benchmarks/client_optimizer_state.py --protocol within --subjects 1 2 3 4 5 6 7 8
"""

import argparse
import copy
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
from skfedspd.training import seeded_torch, torch_threads, train_epochs


class PersistentAdamSPDnet(SPDnetClassifier):
    """SPDnet whose ``local_update`` resumes the calling client's Adam state (keyed by the
    client's training tensor, which the local backend's serial loop keeps for the whole fit)."""

    def init_module(self, seed):
        self.client_adam_ = {}
        return super().init_module(seed)

    def local_update(self, global_params, local_state, X, y, *, lr, n_epochs, seed, n_threads=None, dp=None,
                     sample_weight=None):
        if local_state or dp is not None or sample_weight is not None:
            raise ValueError("this ablation covers plain SPDnet clients only")
        key = id(X)  # the serial loop passes each client's own tensors
        with torch_threads(n_threads), seeded_torch(seed):
            self.set_parameters(global_params)
            optimizer = torch.optim.Adam(self.module_.parameters(), lr=lr)
            if key in self.client_adam_:
                optimizer.load_state_dict(self.client_adam_[key])
                for group in optimizer.param_groups:
                    group["lr"] = lr
            loss, skipped = train_epochs(self.module_, optimizer, X, y, n_epochs=n_epochs,
                                         batch_size=self.batch_size, generator=torch.Generator().manual_seed(seed))
            self.client_adam_[key] = copy.deepcopy(optimizer.state_dict())
            return self.get_parameters(), loss, skipped


MODELS = {
    "SPDnet": lambda: SPDnetClassifier(random_state=0),
    "FedSPDnet": lambda: FederatedSPDnetClassifier(random_state=0, partition="stratified"),
    "FedSPDnet, persistent client Adam": lambda: FederatedSPDnetClassifier(PersistentAdamSPDnet(), random_state=0,
                                                                           partition="stratified"),
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
    base = np.mean(scores["FedSPDnet"])
    for name, values in scores.items():
        print(f"  {name:36s} {100 * np.mean(values):5.1f}   ({100 * (np.mean(values) - base):+.1f} vs FedSPDnet)")
    print(f"{(time.perf_counter() - start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
