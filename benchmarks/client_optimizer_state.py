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

Rows (``--models plain``, the default): ``SPDnetClassifier()``,
``FederatedSPDnetClassifier(client_optimizer_state="reset")``, ``FederatedSPDnetClassifier()``
(``"keep"``, the default), TS+LR. ``random_state=0`` everywhere. (The first measurements of
``"keep"`` used an equivalent subclass of ``SPDnetClassifier``, before the option existed.)

``--models domain-bn`` (the cross protocol, every training subject a domain): why
FedSPDnet + domain BN trails SPDnet + domain BN across subjects. A pooled minibatch of 64 from K
training subjects holds about 64 / K trials of each, so every step re-centres a subject by a
noisy estimate of its mean; a federated client (one subject, 45 trials) fits in one batch and
always uses its exact mean. Rows: SPDnet + domain BN (pooled minibatches of 64), the same with
whole-subject statistics (one batch of all the training data), FedSPDnet + domain BN with
``"keep"`` and ``"reset"``, and with ``"keep"`` and a local batch of the pooled batch's share
(``round(64 / K)``: the subjects hold equal numbers of trials here). TS+LR as the reference.

    python benchmarks/client_optimizer_state.py --protocol cross --subjects 1 2 3 4
    python benchmarks/client_optimizer_state.py --protocol within --subjects 1 2 3 4 5 6 7 8
    python benchmarks/client_optimizer_state.py --protocol cross --models domain-bn --subjects 1 2 3 4
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

def _ts_lr(n_domains):
    # as benchmarks/defaults_ablation.py, on the same covariances
    return make_pipeline(TangentSpace(metric="riemann"), LogisticRegression(C=1.0, max_iter=1000))


def _domain_bn(**params):
    return SPDnetClassifier(batchnorm="domain", random_state=0, **params)


#: Row name -> factory of the number of training domains (subjects; 1 within a session).
MODELS = {
    "plain": {
        "SPDnet": lambda k: SPDnetClassifier(random_state=0),
        "FedSPDnet, fresh client Adam (reset)": lambda k: FederatedSPDnetClassifier(
            random_state=0, partition="stratified", client_optimizer_state="reset"),
        "FedSPDnet, kept client Adam (keep)": lambda k: FederatedSPDnetClassifier(random_state=0,
                                                                                  partition="stratified"),
        "TS+LR": _ts_lr,
    },
    "domain-bn": {
        "SPDnet + domain BN": lambda k: _domain_bn(),
        "SPDnet + domain BN, whole-subject statistics": lambda k: _domain_bn(batch_size=10**6),
        "FedSPDnet + domain BN, reset": lambda k: FederatedSPDnetClassifier(_domain_bn(), random_state=0,
                                                                           client_optimizer_state="reset"),
        "FedSPDnet + domain BN, keep": lambda k: FederatedSPDnetClassifier(_domain_bn(), random_state=0),
        "FedSPDnet + domain BN, keep, local batch 64 / K": lambda k: FederatedSPDnetClassifier(
            _domain_bn(batch_size=max(1, round(64 / k))), random_state=0),
        "TS+LR": _ts_lr,
    },
}
BASELINE = {"plain": "FedSPDnet, fresh client Adam (reset)", "domain-bn": "FedSPDnet + domain BN, reset"}


def auc(make, name, X_train, y_train, groups, X_test, y_test):
    clf = make(1 if groups is None else len(np.unique(groups)))
    if name != "TS+LR" and groups is not None:  # the training subjects: clients, and domains
        clf.fit(X_train, y_train, groups=groups)
    else:
        clf.fit(X_train, y_train)
    return roc_auc_score(y_test == clf.classes_[1], clf.predict_proba(X_test)[:, 1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=("cross", "within"), required=True)
    parser.add_argument("--subjects", type=int, nargs="+", required=True)
    parser.add_argument("--models", choices=tuple(MODELS), default="plain")
    args = parser.parse_args(argv)
    if args.models == "domain-bn" and args.protocol != "cross":
        parser.error("--models domain-bn compares domains across subjects: use --protocol cross")
    models = MODELS[args.models]
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
    scores = {name: [] for name in models}
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
                              for tr, te in splits]) for name, make in models.items()}
        for name, value in per.items():
            scores[name].append(value)
        print(f"  subject {subject:3d}: " + ", ".join(f"{n} {100 * v:.1f}" for n, v in per.items()), flush=True)
    print(f"\n{args.protocol}, subjects {args.subjects}, ROC-AUC % (mean over subjects):")
    base = np.mean(scores[BASELINE[args.models]])
    for name, values in scores.items():
        print(f"  {name:48s} {100 * np.mean(values):5.1f}   ({100 * (np.mean(values) - base):+.1f} vs "
              f"{BASELINE[args.models]})")
    print(f"{(time.perf_counter() - start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
