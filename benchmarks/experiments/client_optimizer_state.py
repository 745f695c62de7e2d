"""Client optimizer state: a client that keeps its Adam state between its rounds, or a fresh Adam.

The ablation behind ``FederatedSPDnetClassifier(client_optimizer_state="keep")``. With
``"reset"`` (the paper's clients) every round builds a fresh Adam. With small sites a round is
one or two minibatches (36-135 trials, batch 64, E = 2), and Adam's bias-corrected first step
is ``lr · sign(g)`` on every coordinate: local training becomes sign-SGD at the full learning
rate, round after round, where centralized Adam averages its moments over hundreds of steps.
``"keep"`` resumes each client's moments and step count (only the learning rate is the
round's); the state never leaves the client.

Protocols (PhysionetMI left/right, offline copy, ROC-AUC %):

* ``--protocol cross``: leave one subject out within each group of subjects given, the
  training subjects as FedSPDnet's clients (MOABB CrossSubject's split);
* ``--protocol within``: per subject, the folds of the ``defaults`` experiment
  (StratifiedKFold(5, shuffle, random_state=42)), FedSPDnet's default stratified partition.

Covariances: the harness's sample covariances (:mod:`.data`), as in the ``defaults``
experiment, whose TS+LR this is; MOABB's pipelines of the ``moabb`` experiment estimate their
own (OAS), so their TS+LR differs (e.g. 74.1 against 72.1 cross-subject on subjects 1–4).

Rows (``--models plain``, the default): ``SPDnetClassifier()``,
``FederatedSPDnetClassifier(client_optimizer_state="reset")``, ``FederatedSPDnetClassifier()``
(``"keep"``, the default), TS+LR. ``random_state=0`` everywhere.

``--models domain-bn`` (the cross protocol, every training subject a domain): why FedSPDnet +
domain BN trails SPDnet + domain BN across subjects. A pooled minibatch of 64 from K training
subjects holds about 64 / K trials of each, so every step re-centres a subject by a noisy
estimate of its mean; a federated client (one subject, 45 trials) fits in one batch and
always uses its exact mean. Rows: SPDnet + domain BN (pooled minibatches of 64), the same with
whole-subject statistics (one batch of all the training data), FedSPDnet + domain BN with
``"keep"`` and ``"reset"``, and with ``"keep"`` and a local batch of the pooled batch's share
(``round(64 / K)``: the subjects hold equal numbers of trials here). TS+LR as the reference.

    python -m benchmarks.experiments client-optimizer-state --protocol cross --subjects 1 2 3 4
    python -m benchmarks.experiments client-optimizer-state --protocol within --subjects 1 2 3 4 5 6 7 8
    python -m benchmarks.experiments client-optimizer-state --protocol cross --models domain-bn --subjects 1 2 3 4
"""

import time

import numpy as np
from sklearn.metrics import roc_auc_score

from skfedspd.clients import ClientPartition

from . import report
from .data import load_left_right
from .defaults import stratified_folds
from .pipelines import federated, fit, spdnet, ts_lr


def _domain_bn(**params):
    return spdnet(0, batchnorm="domain", **params)


#: Row name -> factory of the number of training domains (subjects; 1 within a session).
MODELS = {
    "plain": {
        "SPDnet": lambda k: spdnet(0),
        "FedSPDnet, fresh client Adam (reset)": lambda k: federated(
            0, clients=ClientPartition(partition="stratified"), client_optimizer_state="reset"),
        "FedSPDnet, kept client Adam (keep)": lambda k: federated(0, clients=ClientPartition(partition="stratified")),
        "TS+LR": lambda k: ts_lr(0),
    },
    "domain-bn": {
        "SPDnet + domain BN": lambda k: _domain_bn(),
        "SPDnet + domain BN, whole-subject statistics": lambda k: _domain_bn(batch_size=10**6),
        "FedSPDnet + domain BN, reset": lambda k: federated(0, _domain_bn(), client_optimizer_state="reset"),
        "FedSPDnet + domain BN, keep": lambda k: federated(0, _domain_bn()),
        "FedSPDnet + domain BN, keep, local batch 64 / K": lambda k: federated(
            0, _domain_bn(batch_size=max(1, round(64 / k)))),
        "TS+LR": lambda k: ts_lr(0),
    },
}
BASELINE = {"plain": "FedSPDnet, fresh client Adam (reset)", "domain-bn": "FedSPDnet + domain BN, reset"}


def add_arguments(parser):
    parser.add_argument("--protocol", choices=("cross", "within"), required=True)
    parser.add_argument("--subjects", type=int, nargs="+", required=True)
    parser.add_argument("--models", choices=tuple(MODELS), default="plain")


def auc(make, X_train, y_train, groups, X_test, y_test):
    """ROC-AUC of a row; the training subjects (``groups``, None within a session) go to the
    models that consume them: clients, and domains."""
    model = make(1 if groups is None else len(np.unique(groups)))
    if groups is None:
        model.fit(X_train, y_train)
    else:
        fit(model, X_train, y_train, groups)
    return roc_auc_score(y_test == model.classes_[1], model.predict_proba(X_test)[:, 1])


def units(protocol, subjects):
    """``(subject, splits, X, y, groups)`` per subject: its test folds and the data they index."""
    X, y, groups = load_left_right(subjects)
    if protocol == "cross":
        return [(s, [(groups != s, groups == s)], X, y, groups) for s in subjects]
    return [(s, stratified_folds(y[groups == s]), X[groups == s], y[groups == s], None) for s in subjects]


def run(args):
    if args.models == "domain-bn" and args.protocol != "cross":
        raise SystemExit("--models domain-bn compares domains across subjects: use --protocol cross")
    models = MODELS[args.models]
    print("\n".join(report.header()), flush=True)
    start = time.perf_counter()
    scores = {name: [] for name in models}
    for subject, splits, X, y, groups in units(args.protocol, args.subjects):
        per = {name: np.mean([auc(make, X[tr], y[tr], None if groups is None else groups[tr], X[te], y[te])
                              for tr, te in splits]) for name, make in models.items()}
        for name, value in per.items():
            scores[name].append(100 * value)
        print(f"  subject {subject:3d}: " + ", ".join(f"{n} {100 * v:.1f}" for n, v in per.items()), flush=True)
    baseline = BASELINE[args.models]
    print(f"\n{args.protocol}, subjects {args.subjects}, ROC-AUC % (mean over subjects; paired difference "
          f"to {baseline} ± SE):")
    for name, values in scores.items():
        print(f"  {name:48s} {np.mean(values):5.1f}   {report.format_paired(values, scores[baseline])}")
    print(f"{(time.perf_counter() - start) / 60:.1f} min")
