"""Privacy-utility trade-off: DP-FedSPDnet (ProjAvg, RLAvg) vs DP-FedEEGNet on PhysionetMI.

The Table I protocol of ``benchmarks.tableone`` (clients of 2 subjects, each client's
stratified 85/15 train/test split per seed, E = 2 local epochs, Adam, batch 64, full
participation), in DP mode (``docs/privacy.md``): sample-level (ε, δ)-DP per site,
``dp_delta`` fixed, clip norm 1, no validation split (DP mode keeps the last global model
after a fixed number of rounds, so the 10 % validation part of Table I joins the training
part), SPDnet with per-matrix ``scaling="trace"`` (nothing pooled). ε = ∞ is the same
protocol without DP (no clipping, no noise; EEGNet with its BatchNorm trained as usual),
so every column differs from its neighbour only by the privacy budget. DP-FedEEGNet runs
with its BatchNorm frozen (affine weights trained privately: ``skfedspd.privacy``).

    python -m benchmarks.privacy_utility --quick     # 4 subjects, 1 seed, <= 10 min on 2 cores
    python -m benchmarks.privacy_utility --jobs 2    # full: offline subjects, 10 seeds, 150 rounds

Every (ε, model, seed) result is stored as JSON under ``--out``; a re-run skips what is done.
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from joblib import Parallel, delayed
from sklearn.metrics import f1_score

from benchmarks.tableone.protocols import LOCAL_EPOCHS, TRAINING, machine, physionet_protocol
from benchmarks.tableone.runner import client_split, load_or_skip
from skfedspd import EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.datasets import configure_offline, find_physionet_root, sample_covariance
from skfedspd.training import torch_threads

PROFILES = {
    "quick": dict(subjects=[1, 2, 3, 4], seeds=1, rounds=30),
    "full": dict(subjects=None, seeds=10, rounds=150),
}
EPSILONS = (1.0, 3.0, 8.0, math.inf)
DELTA = 1e-5
CLIP_NORM = 1.0
MODELS = ("spdnet-projavg", "spdnet-rlavg", "eegnet")
LABELS = {"spdnet-projavg": "DP-FedSPDnet (ProjAvg)", "spdnet-rlavg": "DP-FedSPDnet (RLAvg)",
          "eegnet": "DP-FedEEGNet (FedAvg)"}


def estimator(protocol, model, epsilon, rounds, seed):
    train = {k: TRAINING[k] for k in ("lr", "batch_size")}
    if model == "eegnet":
        local = EEGNetClassifier(fs=protocol.fs, **train)
    else:
        local = SPDnetClassifier(hidden_dims=(protocol.hidden_dim,), eps=protocol.eps, scaling="trace", **train)
    private = not math.isinf(epsilon)
    return FederatedSPDnetClassifier(
        local, aggregation="projavg" if model == "eegnet" else model.split("-")[1], n_rounds=rounds,
        local_epochs=LOCAL_EPOCHS, groups_per_client=2, validation_fraction=0.0, random_state=seed,
        dp_epsilon=epsilon if private else None, dp_delta=DELTA if private else None, dp_clip_norm=CLIP_NORM)


def run_one(protocol, data, model, epsilon, seed, rounds, n_threads=None):
    X_cov, X_raw, y, subjects = data
    train, test = client_split(y, subjects, seed)
    X = X_raw if model == "eegnet" else X_cov
    start = time.perf_counter()
    with torch_threads(n_threads):
        clf = estimator(protocol, model, epsilon, rounds, seed).fit(X[train], y[train], groups=subjects[train])
        pred = clf.predict(X[test])
    privacy = clf.privacy_
    return {"model": model, "epsilon": epsilon if not math.isinf(epsilon) else "inf", "seed": seed,
            "f1": float(f1_score(y[test], pred, average="macro")), "rounds": rounds,
            "fit_seconds": time.perf_counter() - start,
            "max_epsilon_spent": max(s["epsilon"] for s in privacy["sites"]) if privacy else None,
            "noise_multipliers": [s["noise_multiplier"] for s in privacy["sites"]] if privacy else None,
            "sample_rates": [s["sample_rate"] for s in privacy["sites"]] if privacy else None,
            "accountant": privacy["accountant"] if privacy else None}


def eps_key(epsilon):
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def table(results, n_seeds):
    lines = ["| model | " + " | ".join(f"ε = {eps_key(e).replace('inf', '∞')}" for e in EPSILONS) + " |",
             "| --- |" + " --- |" * len(EPSILONS)]
    for model in MODELS:
        cells = []
        for e in EPSILONS:
            f1 = [r["f1"] for r in results.get((model, eps_key(e)), [])]
            cells.append(f"{100 * np.mean(f1):.1f} ± {100 * np.std(f1):.1f}" if f1 else "–")
        lines.append(f"| {LABELS[model]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    positions = np.arange(len(EPSILONS))
    fig, ax = plt.subplots(figsize=(6, 4))
    for model in MODELS:
        f1 = [100 * np.array([r["f1"] for r in results.get((model, eps_key(e)), [])]) for e in EPSILONS]
        mean = [v.mean() if len(v) else np.nan for v in f1]
        std = [v.std() if len(v) else np.nan for v in f1]
        ax.errorbar(positions, mean, yerr=std, marker="o", capsize=3, label=LABELS[model])
    ax.set_xticks(positions, [eps_key(e).replace("inf", "∞ (no DP)") for e in EPSILONS])
    ax.set_xlabel(f"ε (δ = {DELTA:g})")
    ax.set_ylabel("test macro-F1 (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 subjects (2 clients), 1 seed, 30 rounds")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default results/privacy-<profile>)")
    parser.add_argument("--jobs", type=int, default=1, help="runs fitted in parallel processes")
    parser.add_argument("--report-only", action="store_true", help="train nothing: report the runs in --out")
    parser.add_argument("--docs", type=Path, default=None, help="also copy the figure to <DOCS>/")
    args = parser.parse_args(argv)
    profile = "quick" if args.quick else "full"
    budget = PROFILES[profile]
    out = args.out or Path("results") / f"privacy-{profile}"
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m benchmarks.privacy_utility", *(argv if argv is not None else sys.argv[1:])])
    print(f"command: {command}\nmachine: {machine()}\nprofile: {profile} {budget}", flush=True)
    root = find_physionet_root()
    if root is not None:
        configure_offline(root)
    protocol = physionet_protocol(4, budget["subjects"])
    loaded = load_or_skip(protocol)
    if loaded is None:
        return 1
    X_raw, y, subjects = loaded
    data = (sample_covariance(X_raw), X_raw, y, subjects)
    n_clients = len(np.unique(subjects)) // 2
    print(f"{protocol.name}: {len(y)} trials, {len(np.unique(subjects))} subjects, {n_clients} clients", flush=True)

    runs = [(m, e, s) for s in range(budget["seeds"]) for e in EPSILONS for m in MODELS]

    def path(model, epsilon, seed):
        return out / f"{model}__eps{eps_key(epsilon)}__seed{seed}.json"

    todo = [] if args.report_only else [r for r in runs if not path(*r).exists()]
    start = time.perf_counter()
    replies = Parallel(n_jobs=args.jobs, return_as="generator_unordered")(
        delayed(run_one)(protocol, data, m, e, s, budget["rounds"], n_threads=None if args.jobs == 1 else 1)
        for m, e, s in todo)
    for record in replies:
        epsilon = math.inf if record["epsilon"] == "inf" else record["epsilon"]
        path(record["model"], epsilon, record["seed"]).write_text(json.dumps(record))
        spent = "" if record["max_epsilon_spent"] is None else f", ε spent ≤ {record['max_epsilon_spent']:.3f}"
        print(f"  {record['model']:15s} ε={record['epsilon']!s:4s} seed {record['seed']}: macro-F1 "
              f"{100 * record['f1']:5.1f} ({record['fit_seconds']:.0f} s{spent})", flush=True)
    results = {}
    for m, e, s in runs:
        if path(m, e, s).exists():
            results.setdefault((m, eps_key(e)), []).append(json.loads(path(m, e, s).read_text()))
    n_train = len(client_split(y, subjects, 0)[0])
    title = f"PhysionetMI, {n_clients} clients, {budget['rounds']} rounds, {budget['seeds']} seed(s)"
    figure = out / f"privacy_utility_{profile}.png"
    plot(results, figure, title)
    sigmas = {f"{m} ε={k}": [round(v, 2) for v in rs[0]["noise_multipliers"]] for (m, k), rs in results.items()
              if rs[0]["noise_multipliers"] and m == "spdnet-projavg"}
    report = [f"### Privacy-utility, {profile} profile", "", table(results, budget["seeds"]), "",
              f"Test macro-F1 (%), mean ± std over {budget['seeds']} seed(s); {title}; {n_train} training trials in "
              f"all (seed 0), δ = {DELTA:g}, clip {CLIP_NORM}, RDP accountant (dp-accounting); every site's ε spent "
              f"≤ the target (largest: {max((r['max_epsilon_spent'] or 0) for rs in results.values() for r in rs):.3f}"
              f" at the largest target). Noise multipliers per site (ProjAvg): {sigmas}.", "",
              f"Command: `{command}` — {(time.perf_counter() - start) / 60:.1f} min; {machine()}."]
    text = "\n".join(report)
    print("\n" + text)
    (out / "report.md").write_text(text + "\n")
    if args.docs:
        args.docs.mkdir(parents=True, exist_ok=True)
        (args.docs / figure.name).write_bytes(figure.read_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
