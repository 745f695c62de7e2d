"""FedSPDnet vs centralized SPDnet, federated EEGNet and pyRiemann on PhysioNet MI.

The protocol of the FedSPDnet paper (section IV, Table I, Figures 3-4) on the offline
PhysioNet EEG Motor Imagery subset in ``../shared/data`` (16 subjects, 4 classes → 8
clients of 2 subjects), plus an unseen-subject table from MOABB's CrossSubjectEvaluation.

    python benchmarks/physionet_experiment.py            # main job, <= 10 min on 2 cores
    python benchmarks/physionet_experiment.py --full     # the paper's budget (hours)

Every (setting, model, seed) result is stored as JSON under ``--out``; a re-run skips what
is done, so a long run can be resumed or re-run per setting (``--only``).
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("MOABB_DOWNLOAD_PROVIDER", "upstream")

import numpy as np  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.metrics import accuracy_score, f1_score  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402

from _machine import cpu_name  # noqa: E402
from skfedspd import EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier  # noqa: E402
from skfedspd.datasets import (  # noqa: E402
    PHYSIONET_OFFLINE_SUBJECTS,
    configure_offline,
    find_physionet_root,
    load_physionet_mi,
    sample_covariance,
)
from skfedspd.federated import make_clients  # noqa: E402

# Budgets. "quick" keeps the paper's protocol and ratios of budgets (E = 2 local epochs,
# centralized epochs = rounds x E) at a fraction of the rounds and seeds.
PROFILES = {
    "quick": dict(seeds=2, rounds=30, eegnet_seeds=1, eegnet_rounds=30, unseen_folds=4, unseen_rounds=20,
                  unseen_eegnet=False),
    "full": dict(seeds=10, rounds=150, eegnet_seeds=10, eegnet_rounds=150, unseen_folds=8, unseen_rounds=150,
                 unseen_eegnet=True),
    "smoke": dict(seeds=1, rounds=2, eegnet_seeds=1, eegnet_rounds=1, unseen_folds=2, unseen_rounds=1,
                  unseen_eegnet=True),
}
LOCAL_EPOCHS = 2
TEST_FRACTION = 0.15
VALIDATION_FRACTION = 0.10 / 0.85  # 75/10/15 of each client's data
# Paper hyper-parameters for PhysionetMI: one BiRe block, d = 18, eps = 1e-2.
SPDNET = dict(hidden_dims=(18,), eps=1e-2, lr=1e-3, batch_size=64, patience=75, lr_patience=20, lr_factor=0.5)
EEGNET = dict(fs=160.0, lr=1e-3, batch_size=64, patience=75, lr_patience=20, lr_factor=0.5)


def machine():
    cpu = cpu_name()
    import torch

    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}"


def client_split(y, subjects, seed):
    """Clients of 2 subjects; each client's own stratified 85/15 split. Returns index arrays."""
    client_idx, _ = make_clients(subjects, groups_per_client=2)
    train, test = [], []
    for i, idx in enumerate(client_idx):
        tr, te = train_test_split(idx, test_size=TEST_FRACTION, stratify=y[idx], random_state=seed * 1000 + i)
        train.append(tr)
        test.append(te)
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def spdnet(seed, epochs):
    return SPDnetClassifier(**SPDNET, max_epochs=epochs, validation_fraction=VALIDATION_FRACTION, random_state=seed)


def eegnet(seed, epochs):
    return EEGNetClassifier(**EEGNET, max_epochs=epochs, validation_fraction=VALIDATION_FRACTION, random_state=seed)


def federated(local, aggregation, participation, rounds, seed):
    return FederatedSPDnetClassifier(
        local, aggregation=aggregation, n_rounds=rounds, local_epochs=LOCAL_EPOCHS,
        clients_per_round=None if participation == "full" else 0.5, groups_per_client=2,
        validation_fraction=VALIDATION_FRACTION, random_state=seed,
    )


def riemann_reference(name):
    from pyriemann.classification import MDM
    from pyriemann.tangentspace import TangentSpace

    if name == "ts-lr":
        return make_pipeline(TangentSpace(metric="riemann"), LogisticRegression(max_iter=2000))
    return MDM(metric="riemann")


def n_parameters(clf):
    module = getattr(clf, "module_", None) or clf.global_estimator_.module_
    return int(sum(p.numel() for p in module.parameters()))


def run_one(key, data, seed, budget):
    """Fit one (setting, model) for one seed; return its record."""
    setting, model = key.split("/")
    X_cov, X_raw, y, subjects = data
    train, test = client_split(y, subjects, seed)
    X = X_raw if model == "eegnet" else X_cov
    rounds = budget["eegnet_rounds"] if model == "eegnet" else budget["rounds"]
    start = time.perf_counter()
    if model in ("ts-lr", "mdm"):
        clf = riemann_reference(model).fit(X[train], y[train])
        curve, params = [], None
    elif setting == "centralized":
        clf = (eegnet if model == "eegnet" else spdnet)(seed, rounds * LOCAL_EPOCHS).fit(X[train], y[train])
        curve, params = [h["val_f1"] for h in clf.history_], n_parameters(clf)
    else:
        local = eegnet(seed, 1) if model == "eegnet" else spdnet(seed, 1)
        aggregation = "projavg" if model == "eegnet" else model.split("-")[1]  # FedAvg == ProjAvg on Euclidean weights
        clf = federated(local, aggregation, setting, rounds, seed).fit(X[train], y[train], groups=subjects[train])
        curve, params = [h["val_f1"] for h in clf.history_], n_parameters(clf)
    pred = clf.predict(X[test])
    return {
        "key": key, "seed": seed, "f1": float(f1_score(y[test], pred, average="macro")),
        "accuracy": float(accuracy_score(y[test], pred)), "n_params": params, "curve": curve,
        "fit_seconds": time.perf_counter() - start, "budget_rounds": rounds,
    }


def experiment_keys():
    keys = ["centralized/ts-lr", "centralized/mdm", "centralized/spdnet", "centralized/eegnet"]
    for setting in ("full", "half"):
        keys += [f"{setting}/spdnet-projavg", f"{setting}/spdnet-rlavg", f"{setting}/eegnet"]
    return keys


def run_table(data, budget, out, only, report_only=False):
    """Seed-major order, so that an interrupted run has every setting for its first seeds."""
    keys = [k for k in experiment_keys() if not only or any(k.startswith(o) or k.endswith(o) for o in only)]
    n_seeds = {k: budget["eegnet_seeds"] if k.endswith("eegnet") else budget["seeds"] for k in keys}
    results = {}
    for seed in range(max(n_seeds.values(), default=0)):
        for key in (k for k in keys if seed < n_seeds[k]):
            path = out / f"{key.replace('/', '__')}__seed{seed}.json"
            if path.exists():
                record = json.loads(path.read_text())
            elif report_only:
                continue
            else:
                record = run_one(key, data, seed, budget)
                path.write_text(json.dumps(record))
            print(f"  {key:28s} seed {seed}: macro-F1 {100 * record['f1']:5.1f}  acc {100 * record['accuracy']:5.1f}"
                  f"  ({record['fit_seconds']:.0f} s)", flush=True)
            results.setdefault(key, []).append(record)
    return {k: results[k] for k in keys if k in results}


def fmt(records, field="f1"):
    values = 100 * np.array([r[field] for r in records])
    return f"{values.mean():.1f} ± {values.std():.1f}"


def table_one(results, budget):
    def cell(key):
        return fmt(results[key]) if key in results else "–"

    def mean(key):
        return np.mean([r["f1"] for r in results[key]]) if key in results else -1

    n_params = {m: next((r["n_params"] for k, rs in results.items() if k.endswith(m) for r in rs if r["n_params"]), "–")
                for m in ("eegnet", "spdnet")}
    lines = [
        "| PhysionetMI (16 subjects, 8 clients) | EEGNet (FedAvg) | SPDnet (FedSPDnet, ProjAvg) | SPDnet (FedSPDnet, RLAvg) |",
        "| --- | --- | --- | --- |",
        f"| # params | {n_params['eegnet']} | {n_params['spdnet']} | {n_params['spdnet']} |",
    ]
    for setting, label in (("centralized", "Centr."), ("full", "Full"), ("half", "Half")):
        keys = [f"{setting}/eegnet"] + ([f"{setting}/spdnet"] * 2 if setting == "centralized"
                                        else [f"{setting}/spdnet-projavg", f"{setting}/spdnet-rlavg"])
        best = max(keys, key=mean)
        cells = [f"**{cell(k)}**" if k == best and k in results else cell(k) for k in keys]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for key, label in (("centralized/ts-lr", "TS + LR (pyRiemann, centr.)"), ("centralized/mdm", "MDM (pyRiemann, centr.)")):
        lines.append(f"| {label} | {cell(key)} | | |")
    seeds = {k: len(v) for k, v in results.items()}
    lines.append("")
    lines.append(f"Test macro-F1 (%) , mean ± std over seeds ({', '.join(f'{k}: {n}' for k, n in seeds.items())}); "
                 f"SPDnet budget {budget['rounds']} rounds x {LOCAL_EPOCHS} epochs (centralized: "
                 f"{budget['rounds'] * LOCAL_EPOCHS} epochs), EEGNet budget {budget['eegnet_rounds']} rounds x "
                 f"{LOCAL_EPOCHS} epochs. Accuracy (%): "
                 + "; ".join(f"{k} {fmt(v, 'accuracy')}" for k, v in results.items()) + ".")
    return "\n".join(lines)


def targets(results):
    def m(key):
        return 100 * np.mean([r["f1"] for r in results[key]]) if key in results else float("nan")

    lines = [
        f"- FedSPDnet Full / centralized SPDnet: {m('full/spdnet-projavg') / m('centralized/spdnet'):.1%} (target >= 92 %)",
        f"- FedSPDnet - FedEEGNet, Full: {m('full/spdnet-projavg') - m('full/eegnet'):+.1f} points; "
        f"Half: {m('half/spdnet-projavg') - m('half/eegnet'):+.1f} points (target > 0 at equal budget)",
        f"- Half - Full (ProjAvg): {m('half/spdnet-projavg') - m('full/spdnet-projavg'):+.1f} points (target within 1.5)",
        f"- ProjAvg - RLAvg: Full {m('full/spdnet-projavg') - m('full/spdnet-rlavg'):+.1f}, "
        f"Half {m('half/spdnet-projavg') - m('half/spdnet-rlavg'):+.1f} points (target within 1)",
    ]
    return "\n".join(lines)


def plot_curves(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, setting in zip(axes, ("full", "half")):
        for model, label in (("eegnet", "FedEEGNet"), ("spdnet-projavg", "FedSPDnet ProjAvg"),
                             ("spdnet-rlavg", "FedSPDnet RLAvg")):
            records = results.get(f"{setting}/{model}")
            if not records:
                continue
            length = min(len(r["curve"]) for r in records)
            curves = 100 * np.array([r["curve"][:length] for r in records])
            rounds = np.arange(1, length + 1)
            ax.plot(rounds, curves.mean(0), label=f"{label} ({len(records)} seeds)")
            ax.fill_between(rounds, curves.mean(0) - curves.std(0), curves.mean(0) + curves.std(0), alpha=0.25)
        ax.set_title(f"PhysionetMI, {'100' if setting == 'full' else '50'} % participation")
        ax.set_xlabel("communication round")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation macro-F1 (%)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def unseen_subjects(budget, out):
    """MOABB CrossSubjectEvaluation, subject groups held out (GroupKFold)."""
    from moabb.datasets import PhysionetMI
    from moabb.evaluations import CrossSubjectEvaluation
    from moabb.paradigms import MotorImagery
    from pyriemann.estimation import Covariances

    dataset = PhysionetMI(imagined=True)
    dataset.feet_runs = [6]  # the one hands/feet run every offline subject has
    dataset.subject_list = list(PHYSIONET_OFFLINE_SUBJECTS)
    paradigm = MotorImagery(n_classes=4, events=["left_hand", "right_hand", "feet", "hands"], fmin=8, fmax=32)
    rounds = budget["unseen_rounds"]
    pipelines = {
        "TS+LR": make_pipeline(Covariances("scm"), riemann_reference("ts-lr")),
        "MDM": make_pipeline(Covariances("scm"), riemann_reference("mdm")),
        "SPDnet (centr.)": make_pipeline(Covariances("scm"), spdnet(0, rounds * LOCAL_EPOCHS)),
        "FedSPDnet ProjAvg (full)": make_pipeline(Covariances("scm"), federated(spdnet(0, 1), "projavg", "full", rounds, 0)),
    }
    if budget["unseen_eegnet"]:
        pipelines["FedEEGNet (full)"] = federated(eegnet(0, 1), "projavg", "full", rounds, 0)
    evaluation = CrossSubjectEvaluation(paradigm=paradigm, datasets=[dataset], n_splits=budget["unseen_folds"],
                                        overwrite=True, hdf5_path=str(out / "moabb"))
    scores = evaluation.process(pipelines)
    table = scores.groupby("pipeline")["score"].agg(["mean", "std", "count"])
    lines = ["| pipeline (unseen subjects) | accuracy (%) | folds |", "| --- | --- | --- |"]
    for name, row in table.sort_values("mean", ascending=False).iterrows():
        lines.append(f"| {name} | {100 * row['mean']:.1f} ± {100 * row['std']:.1f} | {int(row['count'])} |")
    return "\n".join(lines) + (f"\n\nMOABB CrossSubjectEvaluation, GroupKFold({budget['unseen_folds']}) over the 16 "
                               f"subjects (4 classes, feet_runs=[6] for all), score = MOABB's accuracy; "
                               f"SPDnet {rounds} rounds x {LOCAL_EPOCHS} epochs.")


def weibo_line():
    """Try Weibo2014 (online only); one clear line either way. Leaves no empty folder behind."""
    import mne
    from moabb.datasets import Weibo2014

    folder = Path(mne.get_config("MNE_DATA") or Path.home() / "mne_data") / "MNE-weibo-2014"
    existed = folder.exists()
    try:
        Weibo2014().data_path(1, update_path=False, force_update=False)
    except Exception as error:  # noqa: BLE001 - any failure means the files are not reachable
        if not existed and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        return f"Weibo2014: files not reachable ({type(error).__name__}); skipped, the rest goes on."
    return "Weibo2014: files reachable, but this offline protocol covers PhysionetMI only; skipped."


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="the paper's budget (10 seeds, 150 rounds)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="budget profile (default quick; --full means full; smoke checks the plumbing)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default results/physionet-<profile>)")
    parser.add_argument("--only", nargs="*", help="run only keys starting/ending with these (e.g. centralized eegnet)")
    parser.add_argument("--skip-unseen", action="store_true", help="skip the MOABB unseen-subject table")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: build the report from the results already in --out")
    parser.add_argument("--docs", type=Path, default=None,
                        help="also write the report as <DOCS>/results-<profile>.md with its figure")
    args = parser.parse_args(argv)

    profile = args.profile or ("full" if args.full else "quick")
    budget = PROFILES[profile]
    out = args.out or Path("results") / f"physionet-{profile}"
    out.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:]))
    print(f"command: {command}\nmachine: {machine()}\nprofile: {profile} {budget}", flush=True)

    root = find_physionet_root()
    if root is None:
        print("PhysioNet EEG files not found (../shared/data or $SKFEDSPD_DATA): nothing to run.")
        return 1
    configure_offline(root)
    start = time.perf_counter()
    print(weibo_line(), flush=True)
    X_raw, y, subjects, _ = load_physionet_mi(n_classes=4, return_raw=True, n_times=480)
    data = (sample_covariance(X_raw), X_raw, y, subjects)
    print(f"PhysionetMI: {len(y)} trials, {len(np.unique(subjects))} subjects, classes "
          f"{dict(zip(*np.unique(y, return_counts=True)))}, X {X_raw.shape}", flush=True)

    results = run_table(data, budget, out, args.only, args.report_only)
    report = ["## Table I protocol (PhysionetMI, offline subset)", "", table_one(results, budget), "",
              "Targets:", targets(results)]
    figure = out / f"physionet_val_f1_{profile}.png"
    plot_curves(results, figure)
    unseen_path = out / "unseen.md"
    if unseen_path.exists():
        report += ["", "## Unseen subjects", "", unseen_path.read_text()]
    elif not args.skip_unseen and not args.only and not args.report_only:
        print("unseen subjects (MOABB CrossSubjectEvaluation)...", flush=True)
        unseen_path.write_text(unseen_subjects(budget, out))
        report += ["", "## Unseen subjects", "", unseen_path.read_text()]
    elapsed = time.perf_counter() - start
    fit_minutes = sum(r["fit_seconds"] for records in results.values() for r in records) / 60
    report += ["", f"Command: `{command}` — this invocation {elapsed / 60:.1f} min; training time summed over "
                   f"the {sum(map(len, results.values()))} runs in Table I: {fit_minutes:.1f} min; {machine()}."]
    text = "\n".join(report)
    print("\n" + text)
    (out / "report.md").write_text(text + "\n")
    if args.docs:
        args.docs.mkdir(parents=True, exist_ok=True)
        (args.docs / f"results-{profile}.md").write_text(text + f"\n\n![validation F1]({figure.name})\n")
        (args.docs / figure.name).write_bytes(figure.read_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
