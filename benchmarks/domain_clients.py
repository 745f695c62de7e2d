"""FedSPDnet + domain BN when a client holds several subjects: each subject a domain, or
the client one domain.

A site of a federation often holds several subjects (the FedSPDnet paper's larger runs put two
in each client). Domain batch normalization re-centres each *domain* by its own mean: each
group of a client (``fit(..., groups=subjects)`` with ``groups_per_client`` > 1, or a site
file's ``groups``) is a domain of its own, as each subject is in the centralized fit and in a
one-subject client; the alternative, a client's training data as one domain whatever subjects
it holds, is the baseline this benchmark compares against.

MOABB ``CrossSubjectEvaluation`` (leave one subject out; MOABB's scores, ROC-AUC), PhysionetMI
left/right on the offline subjects; the training subjects are merged ``--groups-per-client``
at a time into clients (sorted, as ``FederatedSPDnetClassifier`` merges them). Rows:

* TS+LR and Recenter+TS+LR (the classical peers, as in ``moabb_evaluation.py``);
* FedSPDnet: ``FederatedSPDnetClassifier(groups_per_client=K)``;
* FedSPDnet + domain BN, each subject a domain (the package's behaviour);
* FedSPDnet + domain BN, each client one domain (the ablation: the earlier behaviour, by a
  subclass that hands every sample its client's index as its group).

Run the rows in two processes and report them together:

    nice python benchmarks/domain_clients.py --rows 0 1 4 --out results/domain-clients-a
    nice python benchmarks/domain_clients.py --rows 2 3 --out results/domain-clients-b
    python benchmarks/domain_clients.py --combine results/domain-clients-a results/domain-clients-b \\
        --out results/domain-clients
"""

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_name  # noqa: E402
from moabb_evaluation import combine, datasets, quiet_libraries, table  # noqa: E402

from skfedspd import FederatedSPDnetClassifier, Recenter, SPDnetClassifier  # noqa: E402

#: The rows, in the order ``--rows`` numbers them (see :func:`pipelines`).
ROWS = ("TS+LR", "Recenter+TS+LR", "FedSPDnet", "FedSPDnet + domain BN, each subject a domain",
        "FedSPDnet + domain BN, each client one domain")

#: (row, reference): the paired differences reported.
COMPARISONS = [
    ("FedSPDnet + domain BN, each subject a domain", "FedSPDnet + domain BN, each client one domain"),
    ("FedSPDnet + domain BN, each subject a domain", "Recenter+TS+LR"),
    ("FedSPDnet + domain BN, each subject a domain", "FedSPDnet"),
    ("FedSPDnet + domain BN, each client one domain", "FedSPDnet"),
    ("Recenter+TS+LR", "TS+LR"),
]


class ClientDomainFederated(FederatedSPDnetClassifier):
    """The ablation: every sample's group is its client's index, so with ``batchnorm="domain"``
    a client is one domain whatever subjects it holds (the clients themselves are unchanged)."""

    def _prepare(self, *args, **kwargs):
        task = super()._prepare(*args, **kwargs)
        client_of = np.empty(len(task.codes), dtype=int)
        for i, rows in enumerate(task.indices):
            client_of[rows] = i
        return dataclasses.replace(task, groups=client_of)


def pipelines(k):
    """Row name -> MOABB pipeline, in the order of ``--rows``."""
    from pyriemann.estimation import Covariances
    from pyriemann.tangentspace import TangentSpace
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    def domain_bn():
        return SPDnetClassifier(batchnorm="domain")

    rows = {
        "TS+LR": make_pipeline(Covariances("oas"), TangentSpace(metric="riemann"), LogisticRegression(C=1.0)),
        "Recenter+TS+LR": make_pipeline(Covariances("oas"), Recenter(), TangentSpace(metric="riemann"),
                                        LogisticRegression(C=1.0)),
        "FedSPDnet": make_pipeline(Covariances("scm"), FederatedSPDnetClassifier(groups_per_client=k, random_state=0)),
        "FedSPDnet + domain BN, each subject a domain": make_pipeline(
            Covariances("scm"), FederatedSPDnetClassifier(domain_bn(), groups_per_client=k, random_state=0)),
        "FedSPDnet + domain BN, each client one domain": make_pipeline(
            Covariances("scm"), ClientDomainFederated(domain_bn(), groups_per_client=k, random_state=0)),
    }
    assert tuple(rows) == ROWS
    return rows


def paired_lines(scores):
    """Each comparison of :data:`COMPARISONS` present: means, paired difference ± SE, wins."""
    per_subject = 100 * scores.groupby(["pipeline", "subject"])["score"].mean()
    lines = []
    for name, reference in COMPARISONS:
        if name not in per_subject.index or reference not in per_subject.index:
            continue
        diff = (per_subject.loc[name] - per_subject.loc[reference]).dropna()
        lines.append(f"- {name} vs {reference}: {per_subject.loc[name].mean():.1f} vs "
                     f"{per_subject.loc[reference].mean():.1f}, difference **{diff.mean():+.1f}** ± "
                     f"{diff.std(ddof=1) / np.sqrt(len(diff)):.1f} (SE over {len(diff)} subjects; higher on "
                     f"{int((diff > 0).sum())})")
    return lines


def report(scores, out, command, header):
    text = "\n".join([f"# {header}\n", f"command: `{command}`  ", "", table(scores, "ROC-AUC"), "",
                      *paired_lines(scores)])
    print(text)
    (out / "report.md").write_text(text + "\n")
    scores.to_csv(out / "scores.csv", index=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subjects", type=int, nargs="+", default=None, help="default: the 16 offline subjects")
    parser.add_argument("--groups-per-client", type=int, default=2, metavar="K")
    parser.add_argument("--rows", type=int, nargs="+", choices=range(len(ROWS)), default=None,
                        help="indices of the rows to run (default: all): " + "; ".join(
                            f"{i} {name}" for i, name in enumerate(ROWS)))
    parser.add_argument("--combine", type=Path, nargs="+", default=None, metavar="DIR",
                        help="fit nothing: report the scores.csv of earlier runs (different rows) together")
    parser.add_argument("--out", type=Path, default=Path("results/domain-clients"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(["benchmarks/domain_clients.py"] + (argv if argv is not None else sys.argv[1:]))
    if args.combine:
        report(combine(args.combine), args.out, command, f"{len(args.combine)} runs combined")
        return 0
    if args.groups_per_client < 1:
        parser.error("--groups-per-client must be at least 1")

    from skfedspd.datasets import PHYSIONET_OFFLINE_SUBJECTS, configure_offline, find_physionet_root

    root = find_physionet_root()
    if root is None:
        print("PhysioNet EEG files not found (../shared/data or $SKFEDSPD_DATA): nothing to run.")
        return 0
    configure_offline(root)
    quiet_libraries(args.out / "moabb.log")
    torch.set_num_threads(1)
    from moabb.evaluations import CrossSubjectEvaluation

    rows = pipelines(args.groups_per_client)
    chosen = {ROWS[i]: rows[ROWS[i]] for i in (args.rows if args.rows is not None else range(len(ROWS)))}
    print(f"command: {command}\nmachine: {cpu_name()}, 1 process, torch {torch.__version__}", flush=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    (_, dataset, paradigm), *_ = datasets(quick=True, subjects=args.subjects or list(PHYSIONET_OFFLINE_SUBJECTS))
    evaluation = CrossSubjectEvaluation(paradigm=paradigm, datasets=[dataset], overwrite=True, random_state=42,
                                        hdf5_path=str(args.out / "hdf5"))
    scores = evaluation.process(chosen)
    scores["evaluation"], scores["task"] = "CrossSubject", "left/right"
    elapsed, cpu = (time.perf_counter() - start) / 60, (time.process_time() - cpu_start) / 60
    report(scores, args.out, command, f"Clients of {args.groups_per_client} subjects, MOABB CrossSubject on subjects "
                                      f"{dataset.subject_list} ({elapsed:.1f} min wall, {cpu:.1f} min CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
