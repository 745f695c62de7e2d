"""FedSPDnet vs centralized SPDnet, federated EEGNet and pyRiemann: the paper's Table I.

The protocol of the FedSPDnet paper (section IV, Table I, Figures 3-4) on PhysionetMI (the
offline subset in ``../shared/data``: 16 subjects, 4 classes -> 8 clients of 2 subjects)
and Weibo2014 (through MOABB's download; when its files are not reachable the script says
so in one line and goes on), plus an unseen-subject table from MOABB's
CrossSubjectEvaluation.

    python benchmarks/physionet_experiment.py                # main job, <= 10 min on 2 cores
    python benchmarks/physionet_experiment.py --full --jobs 2   # the paper's budget
    python benchmarks/physionet_experiment.py --classes 2 --subjects 1 2 3 4   # left / right

Every (dataset, setting, model, seed) result is stored as JSON under ``--out``; a re-run
skips what is done, so a long run can be resumed or re-run per setting (``--only``).
"""

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

os.environ.setdefault("MOABB_DOWNLOAD_PROVIDER", "upstream")

import numpy as np  # noqa: E402
from joblib import Parallel, delayed  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.metrics import accuracy_score, f1_score  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402

from _machine import cpu_name  # noqa: E402
from skfedspd import EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier  # noqa: E402
from skfedspd.datasets import (  # noqa: E402
    PHYSIONET_OFFLINE_SUBJECTS,
    WEIBO2014_EVENTS,
    configure_offline,
    find_physionet_root,
    load_moabb,
    load_physionet_mi,
    sample_covariance,
)
from skfedspd.federated import make_clients  # noqa: E402
from skfedspd.training import torch_threads  # noqa: E402

# Budgets. "quick" keeps the paper's protocol and ratios of budgets (E = 2 local epochs,
# centralized epochs = rounds x E) at a fraction of the rounds and seeds.
PROFILES = {
    "quick": dict(seeds=2, rounds=30, eegnet_seeds=2, eegnet_rounds=30, unseen_folds=4, unseen_rounds=20,
                  unseen_eegnet=False),
    "full": dict(seeds=10, rounds=150, eegnet_seeds=10, eegnet_rounds=150, unseen_folds=8, unseen_rounds=150,
                 unseen_eegnet=True),
    "smoke": dict(seeds=1, rounds=2, eegnet_seeds=1, eegnet_rounds=1, unseen_folds=2, unseen_rounds=1,
                  unseen_eegnet=True),
}
LOCAL_EPOCHS = 2
TEST_FRACTION = 0.15
VALIDATION_FRACTION = 0.10 / 0.85  # 75/10/15 of each client's data
# Paper: Adam 1e-3, batch 64, ReduceLROnPlateau(20, 0.5); centralized early stopping 75.
# Federated runs do all T rounds (patience None) and keep the best-validation global model;
# the LR patience counts rounds of full participation (see ``federated``).
TRAINING = dict(lr=1e-3, batch_size=64, patience=75, lr_patience=20, lr_factor=0.5)


@dataclass(frozen=True)
class Protocol:
    """One dataset of Table I with the paper's hyper-parameters for it.

    ``moabb()`` returns the MOABB ``(dataset, paradigm)`` (used by the unseen-subject
    evaluation); ``load()`` returns ``(X, y, subjects)``, band-passed trials in volts of
    ``n_times`` samples at ``fs`` Hz.
    """

    name: str
    hidden_dim: int  # d of the single BiRe block
    eps: float  # ReEig threshold
    fs: float
    n_times: int
    moabb: Callable
    load: Callable


#: Left out of PhysionetMI: recorded at 128 Hz, with another run layout.
PHYSIONET_EXCLUDED = (88,)


def physionet_protocol(n_classes=4, subjects=None):
    """PhysionetMI: 4 classes (left / right hand, hands, feet) or 2 (left / right hand).

    ``subjects`` None means the offline subset. When every subject is offline, trials come
    from :func:`load_physionet_mi` (never downloads; runs picked from what is present),
    otherwise from MOABB's download, resampled to 160 Hz.
    """
    subjects = list(PHYSIONET_OFFLINE_SUBJECTS if subjects is None else subjects)
    excluded = sorted(set(subjects) & set(PHYSIONET_EXCLUDED))
    if excluded:
        raise ValueError(f"PhysionetMI subject(s) {excluded} are excluded (128 Hz recordings)")
    offline = set(subjects) <= set(PHYSIONET_OFFLINE_SUBJECTS) and find_physionet_root() is not None

    def moabb():
        from moabb.datasets import PhysionetMI
        from moabb.paradigms import LeftRightImagery, MotorImagery

        dataset = PhysionetMI(imagined=True)
        dataset.subject_list = subjects
        common = dict(fmin=8, fmax=32, resample=None if offline else 160.0)
        if n_classes == 2:
            dataset.feet_runs = []
            return dataset, LeftRightImagery(**common)
        if offline:
            dataset.feet_runs = [6]  # the one hands/feet run every offline subject has
        return dataset, MotorImagery(n_classes=4, events=["left_hand", "right_hand", "feet", "hands"], **common)

    def load():
        if offline:
            return load_physionet_mi(subjects, n_classes=n_classes, return_raw=True, n_times=480)[:3]
        return load_moabb(*moabb(), n_times=480)[:3]

    name = "PhysionetMI" if n_classes == 4 else "PhysionetMI-2class"
    return Protocol(name, hidden_dim=18, eps=1e-2, fs=160.0, n_times=480, moabb=moabb, load=load)


def weibo_moabb():
    from moabb.datasets import Weibo2014
    from moabb.paradigms import MotorImagery

    return Weibo2014(), MotorImagery(n_classes=7, events=list(WEIBO2014_EVENTS), fmin=8, fmax=32)


PROTOCOLS = {
    "PhysionetMI": physionet_protocol(),
    "Weibo2014": Protocol("Weibo2014", hidden_dim=22, eps=1e-1, fs=200.0, n_times=800, moabb=weibo_moabb,
                          load=lambda: load_moabb(*weibo_moabb(), n_times=800)[:3]),
}


def machine():
    import torch

    return f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}"


def client_split(y, subjects, seed):
    """Clients of 2 subjects; each client's own stratified 85/15 split. Returns index arrays."""
    client_idx, _ = make_clients(subjects, groups_per_client=2)
    train, test = [], []
    for i, idx in enumerate(client_idx):
        tr, te = train_test_split(idx, test_size=TEST_FRACTION, stratify=y[idx], random_state=seed * 1000 + i)
        train.append(tr)
        test.append(te)
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def spdnet(protocol, seed, epochs, verbose=False):
    return SPDnetClassifier(hidden_dims=(protocol.hidden_dim,), eps=protocol.eps, **TRAINING, max_epochs=epochs,
                            validation_fraction=VALIDATION_FRACTION, random_state=seed, verbose=verbose)


def eegnet(protocol, seed, epochs, verbose=False):
    return EEGNetClassifier(fs=protocol.fs, **TRAINING, max_epochs=epochs, validation_fraction=VALIDATION_FRACTION,
                            random_state=seed, verbose=verbose)


def federated(local, aggregation, participation, rounds, seed, verbose=False):
    """``local`` is a fresh local model; T rounds of E = 2 epochs, no early stopping.

    ReduceLROnPlateau's patience (20) counts rounds of full participation: with a fraction
    ``q`` of the clients per round it is 20 / q rounds, the same number of client updates.
    Counted in plain rounds, Half participation halved its learning rate 2-4 times in 150
    rounds (Full: 0-1; ``physionet_ablation.py``), on a validation score made noisier by
    training half the clients.
    """
    fraction = 1.0 if participation == "full" else 0.5
    return FederatedSPDnetClassifier(
        local.set_params(verbose=False), aggregation=aggregation, n_rounds=rounds, local_epochs=LOCAL_EPOCHS,
        clients_per_round=None if participation == "full" else fraction, patience=None,
        lr_patience=round(TRAINING["lr_patience"] / fraction), lr_factor=TRAINING["lr_factor"], groups_per_client=2,
        validation_fraction=VALIDATION_FRACTION, random_state=seed, verbose=verbose,
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


def run_one(protocol, key, data, seed, budget, n_threads=None, verbose=False, params=None):
    """Fit one (setting, model) for one seed; return its record. ``params`` overrides the
    protocol: ``{"local": {...}, "federated": {...}}`` estimator parameters (ablations)."""
    params = params or {}
    setting, model = key.split("/")
    X_cov, X_raw, y, subjects = data
    train, test = client_split(y, subjects, seed)
    X = X_raw if model == "eegnet" else X_cov
    rounds = budget["eegnet_rounds"] if model == "eegnet" else budget["rounds"]
    local = eegnet if model == "eegnet" else spdnet
    start = time.perf_counter()
    with torch_threads(n_threads):
        if model in ("ts-lr", "mdm"):
            clf = riemann_reference(model).fit(X[train], y[train])
        elif setting == "centralized":
            clf = local(protocol, seed, rounds * LOCAL_EPOCHS, verbose=verbose).set_params(**params.get("local", {}))
            clf.fit(X[train], y[train])
        else:
            aggregation = "projavg" if model == "eegnet" else model.split("-")[1]  # FedAvg == ProjAvg on Euclidean weights
            clf = federated(local(protocol, seed, 1), aggregation, setting, rounds, seed, verbose=verbose)
            clf.estimator.set_params(**params.get("local", {}))
            clf.set_params(**params.get("federated", {}))
            clf.fit(X[train], y[train], groups=subjects[train])
        pred = clf.predict(X[test])
    history = getattr(clf, "history_", [])
    return {
        "key": key, "seed": seed, "f1": float(f1_score(y[test], pred, average="macro")),
        "accuracy": float(accuracy_score(y[test], pred)), "n_params": n_parameters(clf) if history else None,
        "curve": [h["val_f1"] for h in history], "lr": [h["lr"] for h in history], "fit_seconds": time.perf_counter() - start, "budget_rounds": rounds,
    }


def experiment_keys():
    keys = ["centralized/ts-lr", "centralized/mdm", "centralized/spdnet", "centralized/eegnet"]
    for setting in ("full", "half"):
        keys += [f"{setting}/spdnet-projavg", f"{setting}/spdnet-rlavg", f"{setting}/eegnet"]
    return keys


def run_table(protocol, data, budget, out, only=None, report_only=False, jobs=1, params=None):
    """Every (key, seed) of the table, cached as JSON in ``out``; seed-major order, so that
    an interrupted run has every setting for its first seeds. ``jobs`` runs fit in
    parallel processes (one torch thread each); results do not depend on it."""
    keys = [k for k in experiment_keys() if not only or any(k.startswith(o) or k.endswith(o) for o in only)]
    n_seeds = {k: budget["eegnet_seeds"] if k.endswith("eegnet") else budget["seeds"] for k in keys}
    runs = [(k, seed) for seed in range(max(n_seeds.values(), default=0)) for k in keys if seed < n_seeds[k]]

    def path(key, seed):
        return out / f"{key.replace('/', '__')}__seed{seed}.json"

    def show(record):
        print(f"  {protocol.name} {record['key']:24s} seed {record['seed']}: macro-F1 {100 * record['f1']:5.1f}  "
              f"acc {100 * record['accuracy']:5.1f}  ({record['fit_seconds']:.0f} s)", flush=True)

    out.mkdir(parents=True, exist_ok=True)
    todo = [] if report_only else [(k, s) for k, s in runs if not path(k, s).exists()]
    if todo:
        print(f"{protocol.name}: {len(todo)} of {len(runs)} runs to fit ({jobs} in parallel)", flush=True)
        single = jobs == 1
        replies = Parallel(n_jobs=jobs, return_as="generator_unordered")(
            delayed(run_one)(protocol, k, data, s, budget, n_threads=None if single else 1, verbose=single,
                             params=params)
            for k, s in todo)
        if not single:  # runs finish in any order; one bar over them
            from tqdm.auto import tqdm

            replies = tqdm(replies, total=len(todo), desc=f"{protocol.name} runs", leave=False)
        for record in replies:
            path(record["key"], record["seed"]).write_text(json.dumps(record))
            show(record)
    results = {}
    for key, seed in runs:
        if path(key, seed).exists():
            results.setdefault(key, []).append(json.loads(path(key, seed).read_text()))
    return {k: results[k] for k in keys if k in results}


def fmt(records, field="f1"):
    values = 100 * np.array([r[field] for r in records])
    return f"{values.mean():.1f} ± {values.std():.1f}"


def mean_f1(results, key):
    return 100 * np.mean([r["f1"] for r in results[key]]) if key in results else float("nan")


def table_one(tables, budget):
    """Table I: dataset x {Centr., Full, Half}, EEGNet and SPDnet (ProjAvg; RLAvg beside)."""
    lines = ["| Dataset | Setting | EEGNet (FedAvg) | SPDnet (FedSPDnet, ProjAvg) | SPDnet (FedSPDnet, RLAvg) |",
             "| --- | --- | --- | --- | --- |"]
    for (name, label), results in tables.items():
        def cell(key):
            return fmt(results[key]) if key in results else "–"

        n_params = {m: next((r["n_params"] for k, rs in results.items() if k.endswith(m) for r in rs if r["n_params"]),
                            "–") for m in ("eegnet", "spdnet", "projavg")}
        lines.append(f"| {label} | # params | {n_params['eegnet']} | {n_params['spdnet']} | {n_params['spdnet']} |")
        for setting, row in (("centralized", "Centr."), ("full", "Full"), ("half", "Half")):
            keys = [f"{setting}/eegnet"] + ([f"{setting}/spdnet"] * 2 if setting == "centralized"
                                            else [f"{setting}/spdnet-projavg", f"{setting}/spdnet-rlavg"])
            scores = [mean_f1(results, k) for k in keys]
            best = np.nanmax(scores) if not np.isnan(scores).all() else None
            cells = [f"**{cell(k)}**" if v == best else cell(k) for k, v in zip(keys, scores)]
            lines.append(f"| {name} | {row} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Test macro-F1 (%), mean ± std over seeds. SPDnet budget {budget['rounds']} rounds x {LOCAL_EPOCHS} "
                 f"epochs (centralized: <= {budget['rounds'] * LOCAL_EPOCHS} epochs, early stopping 75), EEGNet "
                 f"{budget['eegnet_rounds']} rounds x {LOCAL_EPOCHS} epochs; best per row in bold.")
    for (name, _), results in tables.items():
        lines.append("")
        lines.append(f"{name} seeds per cell: " + ", ".join(f"{k} {len(v)}" for k, v in results.items())
                     + ". Accuracy (%): " + "; ".join(f"{k} {fmt(v, 'accuracy')}" for k, v in results.items()) + ".")
    lines += ["", "Centralized references on the same splits (test macro-F1 %):", "",
              "| Dataset | TS + LR (pyRiemann) | MDM (pyRiemann) | SPDnet | EEGNet |", "| --- | --- | --- | --- | --- |"]
    for (name, _), results in tables.items():
        cells = [fmt(results[k]) if k in results else "–" for k in
                 ("centralized/ts-lr", "centralized/mdm", "centralized/spdnet", "centralized/eegnet")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(name, results):
    def m(key):
        return mean_f1(results, key)

    return "\n".join([
        f"- {name}: FedSPDnet Full / centralized SPDnet: {m('full/spdnet-projavg') / m('centralized/spdnet'):.1%} "
        f"(target >= 92 %)",
        f"- {name}: FedSPDnet - FedEEGNet, Full: {m('full/spdnet-projavg') - m('full/eegnet'):+.1f} points; "
        f"Half: {m('half/spdnet-projavg') - m('half/eegnet'):+.1f} points (target > 0 at equal budget)",
        f"- {name}: Half - Full (ProjAvg): {m('half/spdnet-projavg') - m('full/spdnet-projavg'):+.1f} points "
        f"(target within 1.5)",
        f"- {name}: ProjAvg - RLAvg: Full {m('full/spdnet-projavg') - m('full/spdnet-rlavg'):+.1f}, "
        f"Half {m('half/spdnet-projavg') - m('half/spdnet-rlavg'):+.1f} points (target within 1)",
    ])


def plot_curves(name, results, path):
    """Validation macro-F1 against round, mean ± std over seeds (the paper's Figures 3-4)."""
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
        ax.set_title(f"{name}, {'100' if setting == 'full' else '50'} % participation")
        ax.set_xlabel("communication round")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation macro-F1 (%)")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def unseen_subjects(protocol, n_subjects, budget, out, jobs=1):
    """MOABB CrossSubjectEvaluation, GroupKFold over subjects (pairs held out at full budget)."""
    from moabb.evaluations import CrossSubjectEvaluation
    from pyriemann.estimation import Covariances

    dataset, paradigm = protocol.moabb()
    rounds = budget["unseen_rounds"]
    n_splits = min(budget["unseen_folds"], n_subjects // 2)
    pipelines = {
        "TS+LR": make_pipeline(Covariances("scm"), riemann_reference("ts-lr")),
        "MDM": make_pipeline(Covariances("scm"), riemann_reference("mdm")),
        "SPDnet (centr.)": make_pipeline(Covariances("scm"), spdnet(protocol, 0, rounds * LOCAL_EPOCHS)),
        "FedSPDnet ProjAvg (full)": make_pipeline(
            Covariances("scm"), federated(spdnet(protocol, 0, 1), "projavg", "full", rounds, 0)),
    }
    if budget["unseen_eegnet"]:
        pipelines["FedEEGNet (full)"] = federated(eegnet(protocol, 0, 1), "projavg", "full", rounds, 0)
    evaluation = CrossSubjectEvaluation(paradigm=paradigm, datasets=[dataset], n_splits=n_splits, n_jobs=jobs,
                                        overwrite=True, hdf5_path=str(out / "moabb"))
    scores = evaluation.process(pipelines)
    table = scores.groupby("pipeline")["score"].agg(["mean", "std", "count"])
    lines = [f"| {protocol.name}: pipeline (unseen subjects) | accuracy (%) | folds |", "| --- | --- | --- |"]
    for name, row in table.sort_values("mean", ascending=False).iterrows():
        lines.append(f"| {name} | {100 * row['mean']:.1f} ± {100 * row['std']:.1f} | {int(row['count'])} |")
    return "\n".join(lines) + (f"\n\nMOABB CrossSubjectEvaluation, GroupKFold({n_splits}) over the {n_subjects} "
                               f"subjects, score = MOABB's accuracy; SPDnet {rounds} rounds x {LOCAL_EPOCHS} epochs.")


def load_or_skip(protocol):
    """``protocol.load()``, or None and one clear line when its files are not reachable.

    A failed MOABB download can leave an empty dataset folder behind; it is removed.
    """
    import mne

    data_root = Path(mne.get_config("MNE_DATA") or Path.home() / "mne_data")
    before = set(data_root.iterdir()) if data_root.is_dir() else set()
    try:
        return protocol.load()
    except OSError as error:  # network and file errors (requests' errors are OSErrors); bugs propagate
        for folder in (set(data_root.iterdir()) if data_root.is_dir() else set()) - before:
            if folder.is_dir() and not any(folder.rglob("*")):
                folder.rmdir()
        print(f"{protocol.name}: files not reachable ({type(error).__name__}: {str(error)[:120]}); "
              f"skipped, the rest goes on.", flush=True)
        return None


def run_protocol(protocol, budget, out, only=None, report_only=False, skip_unseen=False, jobs=1):
    """Table I runs, figure and unseen-subject table of one dataset; returns the report parts."""
    loaded = load_or_skip(protocol)
    if loaded is None:
        return None
    X_raw, y, subjects = loaded
    data = (sample_covariance(X_raw), X_raw, y, subjects)
    n_subjects = len(np.unique(subjects))
    label = f"{protocol.name} ({n_subjects} subjects, {len(make_clients(subjects, 2)[0])} clients)"
    print(f"{label}: {len(y)} trials, classes {dict((str(c), int(n)) for c, n in zip(*np.unique(y, return_counts=True)))}, X {X_raw.shape}",
          flush=True)
    results = run_table(protocol, data, budget, out, only, report_only, jobs)
    figure = out / f"{protocol.name}_val_f1.png"
    plot_curves(protocol.name, results, figure)
    unseen_path = out / "unseen.md"
    if not unseen_path.exists() and not (skip_unseen or only or report_only):
        print(f"{protocol.name}: unseen subjects (MOABB CrossSubjectEvaluation)...", flush=True)
        unseen_path.write_text(unseen_subjects(protocol, n_subjects, budget, out, jobs))
    unseen = unseen_path.read_text() if unseen_path.exists() else None
    return (protocol.name, label), results, figure, unseen


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="the paper's budget (10 seeds, 150 rounds)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="budget profile (default quick; --full means full; smoke checks the plumbing)")
    parser.add_argument("--datasets", nargs="+", choices=sorted(PROTOCOLS), default=["PhysionetMI", "Weibo2014"])
    parser.add_argument("--classes", type=int, choices=(4, 2), default=4,
                        help="PhysionetMI: 4 classes, or 2 (left / right hand)")
    parser.add_argument("--subjects", nargs="+", type=int, default=None,
                        help="PhysionetMI subjects (default: the offline subset; others come from MOABB's download)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default results/experiment-<profile>)")
    parser.add_argument("--only", nargs="*", help="run only keys starting/ending with these (e.g. centralized eegnet)")
    parser.add_argument("--jobs", type=int, default=1, help="runs fitted in parallel processes (default 1)")
    parser.add_argument("--skip-unseen", action="store_true", help="skip the MOABB unseen-subject tables")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: build the report from the results already in --out")
    parser.add_argument("--docs", type=Path, default=None,
                        help="also write the report as <DOCS>/results-<profile>.md with its figures")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")

    profile = args.profile or ("full" if args.full else "quick")
    budget = PROFILES[profile]
    out = args.out or Path("results") / f"experiment-{profile}"
    command = "python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:]))
    print(f"command: {command}\nmachine: {machine()}\nprofile: {profile} {budget}", flush=True)
    root = find_physionet_root()
    if root is not None:
        configure_offline(root)
    try:
        protocols = dict(PROTOCOLS, PhysionetMI=physionet_protocol(args.classes, args.subjects))
    except ValueError as error:
        parser.error(str(error))

    start = time.perf_counter()
    done = [run_protocol(protocols[name], budget, out / protocols[name].name, args.only, args.report_only,
                         args.skip_unseen, args.jobs) for name in args.datasets]
    done = [d for d in done if d is not None]
    if not done:
        print("No dataset reachable: nothing to report.")
        return 1
    tables = {label: results for label, results, _, _ in done}
    report = ["## Table I protocol", "", table_one(tables, budget), "", "Targets:",
              "\n".join(targets(name, results) for (name, _), results in tables.items())]
    for (name, _), _, _, unseen in done:
        if unseen:
            report += ["", f"## Unseen subjects: {name}", "", unseen]
    elapsed = time.perf_counter() - start
    n_runs = sum(len(records) for results in tables.values() for records in results.values())
    fit_minutes = sum(r["fit_seconds"] for results in tables.values() for rs in results.values() for r in rs) / 60
    timing = ("report rebuilt from the cached runs" if args.report_only
              else f"this invocation {elapsed / 60:.1f} min")
    report += ["", f"Command: `{command}` — {timing}; fit time summed over the {n_runs} runs of Table I: "
                   f"{fit_minutes:.1f} min; {machine()}."]
    text = "\n".join(report)
    print("\n" + text)
    (out / "report.md").write_text(text + "\n")
    if args.docs:
        args.docs.mkdir(parents=True, exist_ok=True)
        figures = []
        for (name, _), _, figure, _ in done:
            target = args.docs / f"{name}_val_f1_{profile}.png"
            target.write_bytes(figure.read_bytes())
            figures.append(f"![{name} validation F1]({target.name})")
        (args.docs / f"results-{profile}.md").write_text(text + "\n\n" + "\n\n".join(figures) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
