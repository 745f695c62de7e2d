"""Fitting the cells of Table I (``table-one``), the JSON cache of their records, and the MOABB
unseen-subject evaluation."""

import json
import logging
import time
from pathlib import Path

import numpy as np
from joblib import Parallel, delayed
from sklearn.metrics import accuracy_score, f1_score
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline

from skfedspd.datasets import sample_covariance
from skfedspd.clients import make_clients
from skfedspd.training import torch_threads

from .console import warnings_to_file
from .table_one_cells import CELLS, Cell
from .table_one_protocols import (
    LOCAL_EPOCHS,
    TEST_FRACTION,
    eegnet,
    federated,
    recommended_federated,
    recommended_spdnet,
    riemann_reference,
    spdnet,
)

log = logging.getLogger(__name__)


def client_split(y, subjects, seed, groups_per_client=2):
    """Clients of 2 subjects (``groups_per_client``); each client's own stratified 85/15
    split. Returns index arrays."""
    client_idx, _ = make_clients(subjects, groups_per_client=groups_per_client)
    train, test = [], []
    for i, idx in enumerate(client_idx):
        tr, te = train_test_split(idx, test_size=TEST_FRACTION, stratify=y[idx], random_state=seed * 1000 + i)
        train.append(tr)
        test.append(te)
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def build(protocol, cell, seed, budget, params=None, verbose=False):
    """The estimator of ``cell`` for ``seed``, unfitted. ``params`` overrides the protocol:
    ``{"local": {...}, "federated": {...}}`` estimator parameters (ablations)."""
    params = params or {}
    if not cell.network:
        return riemann_reference(cell.model)
    rounds = budget.rounds_for(cell)
    if cell.recommended and not cell.federated:
        clf = recommended_spdnet(seed, cell.domains, verbose=verbose)
        if budget.recommended_epochs is not None:
            clf.set_params(max_epochs=budget.recommended_epochs)
        return clf.set_params(**params.get("local", {}))
    if cell.recommended:
        clf = recommended_federated(cell.participation, rounds, seed, cell.server_params, verbose=verbose)
        clf.estimator.set_params(**params.get("local", {}))
        return clf.set_params(**params.get("federated", {}))
    local = eegnet if cell.model == "eegnet" else spdnet
    if not cell.federated:
        return local(protocol, seed, rounds * LOCAL_EPOCHS, verbose=verbose).set_params(**params.get("local", {}))
    clf = federated(local(protocol, seed, 1), cell.aggregation, cell.participation, rounds, seed, verbose=verbose,
                    server=cell.server_params)
    clf.estimator.set_params(**params.get("local", {}))
    return clf.set_params(**params.get("federated", {}))


def configuration(protocol, cell, seed, budget, params=None):
    """What a cached record must have been fitted with: the estimator's plain parameters,
    the split and the dataset. A record with another configuration is refitted."""
    plain = (bool, int, float, str, tuple, type(None))
    estimator = build(protocol, cell, seed, budget, params)
    config = {k: v for k, v in sorted(estimator.get_params(deep=True).items()) if isinstance(v, plain)}
    config.update(estimator=type(estimator).__name__, dataset=protocol.name, subjects=protocol.subjects,
                  test_fraction=TEST_FRACTION, n_times=protocol.n_times)
    return json.loads(json.dumps(config))  # tuples as lists, as read back from the cache


def predict_per_subject(clf, X, subjects):
    """``clf.predict`` called once per subject: domain batch norm re-centres the matrices of
    one call by their own mean, so each test subject is its own domain."""
    pred = np.empty(len(X), dtype=clf.classes_.dtype)
    for subject in np.unique(subjects):
        mine = subjects == subject
        pred[mine] = clf.predict(X[mine])
    return pred


def validation_curve(history):
    """Validation macro-F1 per epoch (round); empty when the fit held no validation part out
    (the package's ``early_stopping="auto"`` on small data: every record's score is NaN)."""
    curve = [h["val_f1"] for h in history]
    return [] if np.isnan(curve).all() else curve


def n_parameters(clf):
    module = getattr(clf, "module_", None) or clf.global_estimator_.module_
    return int(sum(p.numel() for p in module.parameters()))


def fit_cell(protocol, cell, data, seed, budget, n_threads=None, verbose=False, params=None, log_file=None):
    """Fit one cell for one seed on its client split; return its record (JSON-able)."""
    X_cov, X_raw, y, subjects = data
    train, test = client_split(y, subjects, seed)
    X = X_raw if cell.model == "eegnet" else X_cov
    clf = build(protocol, cell, seed, budget, params, verbose=verbose)
    start, cpu_start = time.perf_counter(), time.process_time()
    with torch_threads(n_threads), warnings_to_file(log_file):
        if cell.federated or cell.domains:
            clf.fit(X[train], y[train], groups=subjects[train])
        else:
            clf.fit(X[train], y[train])
        pred = predict_per_subject(clf, X[test], subjects[test]) if cell.domains else clf.predict(X[test])
    history = getattr(clf, "history_", [])
    return {
        "key": cell.key, "seed": seed, "f1": float(f1_score(y[test], pred, average="macro")),
        "accuracy": float(accuracy_score(y[test], pred)), "n_params": n_parameters(clf) if history else None,
        "curve": validation_curve(history), "lr": [h["lr"] for h in history],
        "fit_seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu_start,
        "budget_rounds": budget.rounds_for(cell),
        "config": configuration(protocol, cell, seed, budget, params),
    }


def cost(cell):
    """Rough rank of a cell's fit time (EEGNet rounds cost about 7 SPDnet rounds)."""
    return (7 if cell.model == "eegnet" else 1) * (cell.participation if cell.federated else 0.3 * cell.network)


def record_path(out, cell, seed):
    return out / f"{cell.key.replace('/', '__')}__seed{seed}.json"


def read_record(path, config):
    """The cached record at ``path`` if it was fitted with ``config``, else None."""
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record if record.get("config") == config else None


def run_table(protocol, data, budget, out, cells=CELLS, report_only=False, jobs=1, params=None, log_file=None):
    """Every (cell, seed) of the table, cached as JSON in ``out``: ``{cell: [records]}``.

    Seed-major order, so that an interrupted run has every cell for its first seeds. A
    cached record fitted with another configuration (budget, hyper-parameters, an older
    version of this script) is refitted, and a line says how many. ``jobs`` runs fits in
    parallel processes (one torch thread each); the records do not depend on it.
    """
    n_seeds = max((budget.seeds_for(c) for c in cells), default=0)
    runs = [(c, seed) for seed in range(n_seeds) for c in cells if seed < budget.seeds_for(c)]
    # Within a seed, the longest fits first (federated EEGNet, then federated SPDnet), so
    # that parallel workers finish together.
    order = sorted(runs, key=lambda run: (run[1], -cost(run[0])))
    configs = {(c, s): configuration(protocol, c, s, budget, params) for c, s in runs}
    cached = {run: read_record(record_path(out, *run), configs[run]) for run in runs}
    stale = [run for run in runs if cached[run] is None and record_path(out, *run).exists()]
    todo = [] if report_only else [run for run in order if cached[run] is None]
    if stale:
        log.info(f"{protocol.name}: {len(stale)} cached run(s) in {out} were fitted with another configuration"
                 + ("; left out of the report (--report-only)" if report_only else "; refitted"))
    if todo:
        out.mkdir(parents=True, exist_ok=True)
        log.info(f"{protocol.name}: {len(todo)} of {len(runs)} runs to fit ({jobs} in parallel)")
        single = jobs == 1
        replies = Parallel(n_jobs=jobs, return_as="generator_unordered")(
            delayed(fit_cell)(protocol, c, data, s, budget, n_threads=None if single else 1, verbose=False,
                              params=params, log_file=log_file)
            for c, s in todo)
        from tqdm.auto import tqdm

        by_key = {c.key: c for c in cells}
        for record in tqdm(replies, total=len(todo), desc=f"{protocol.name} runs", leave=False):
            cell = by_key[record["key"]]
            record_path(out, cell, record["seed"]).write_text(json.dumps(record))
            cached[cell, record["seed"]] = record
            log.debug(f"{protocol.name} {record['key']:24s} seed {record['seed']}: macro-F1 "
                      f"{100 * record['f1']:5.1f}  acc {100 * record['accuracy']:5.1f}  ({record['fit_seconds']:.0f} s)")
    results = {}
    for run in runs:
        if cached[run] is not None:
            results.setdefault(run[0], []).append(cached[run])
    return {c: results[c] for c in cells if c in results}


def unseen_subjects(protocol, n_subjects, budget, out, jobs=1):
    """MOABB CrossSubjectEvaluation, GroupKFold over subjects; MOABB's results store in ``out``."""
    from moabb.evaluations import CrossSubjectEvaluation
    from pyriemann.estimation import Covariances

    dataset, paradigm = protocol.moabb()
    rounds = budget.unseen_rounds
    n_splits = min(budget.unseen_folds, n_subjects // 2)
    full = Cell("full", "spdnet", "projavg")
    pipelines = {
        "TS+LR": make_pipeline(Covariances("scm"), riemann_reference("ts-lr")),
        "MDM": make_pipeline(Covariances("scm"), riemann_reference("mdm")),
        "SPDnet (centr.)": make_pipeline(Covariances("scm"), spdnet(protocol, 0, rounds * LOCAL_EPOCHS)),
        full.label: make_pipeline(Covariances("scm"),
                                  federated(spdnet(protocol, 0, 1), "projavg", full.participation, rounds, 0)),
    }
    if budget.unseen_eegnet:
        pipelines["FedEEGNet (full)"] = federated(eegnet(protocol, 0, 1), "projavg", 1.0, rounds, 0)
    evaluation = CrossSubjectEvaluation(paradigm=paradigm, datasets=[dataset], n_splits=n_splits, n_jobs=jobs,
                                        overwrite=True, hdf5_path=str(out / "moabb"))
    scores = evaluation.process(pipelines)
    table = scores.groupby("pipeline")["score"].agg(["mean", "std", "count"])
    lines = [f"| {protocol.name}: pipeline (unseen subjects) | accuracy (%) | folds |", "| --- | --- | --- |"]
    for name, row in table.sort_values("mean", ascending=False).iterrows():
        lines.append(f"| {name} | {100 * row['mean']:.1f} ± {100 * row['std']:.1f} | {int(row['count'])} |")
    return "\n".join(lines) + (f"\n\nMOABB CrossSubjectEvaluation, GroupKFold({n_splits}) over the {n_subjects} "
                               f"subjects, score = MOABB's accuracy; SPDnet {rounds} rounds x {LOCAL_EPOCHS} epochs.")


def load_or_skip(protocol, offline_only=False):
    """``protocol.load()``, or None and one clear line when its files are not reachable.

    ``offline_only``: a dataset that is not on disk is skipped before anything tries to
    download it. A failed MOABB download can leave an empty dataset folder behind; it is
    removed.
    """
    if offline_only and not protocol.offline():
        log.info(f"{protocol.name}: not available offline; skipped (this profile never downloads; "
                 f"the full profile gets it through MOABB).")
        return None
    import mne

    data_root = Path(mne.get_config("MNE_DATA") or Path.home() / "mne_data")
    before = set(data_root.iterdir()) if data_root.is_dir() else set()
    try:
        return protocol.load()
    except OSError as error:  # network and file errors (requests' errors are OSErrors); bugs propagate
        for folder in (set(data_root.iterdir()) if data_root.is_dir() else set()) - before:
            if folder.is_dir() and not any(folder.rglob("*")):
                folder.rmdir()
        log.info(f"{protocol.name}: files not reachable ({type(error).__name__}: {str(error)[:120]}); "
                 f"skipped, the rest goes on.")
        return None


def run_protocol(protocol, budget, out, cells=CELLS, report_only=False, skip_unseen=False, jobs=1,
                 log_file=None):
    """Table I runs and unseen-subject table of one dataset.

    Returns None when the dataset is not reachable, else ``(label, results, unseen)``:
    ``label`` names the dataset with its subjects and clients, ``results`` is
    ``{cell: [records]}``, ``unseen`` the unseen-subject table (Markdown) or None.
    """
    loaded = load_or_skip(protocol, budget.offline_only)
    if loaded is None:
        return None
    X_raw, y, subjects = loaded
    data = (sample_covariance(X_raw), X_raw, y, subjects)
    n_subjects = len(np.unique(subjects))
    label = f"{protocol.name} ({n_subjects} subjects, {len(make_clients(subjects, 2)[0])} clients)"
    classes = dict((str(c), int(n)) for c, n in zip(*np.unique(y, return_counts=True)))
    log.info(f"{label}: {len(y)} trials, classes {classes}, X {X_raw.shape}")
    results = run_table(protocol, data, budget, out, cells, report_only, jobs, log_file=log_file)
    unseen_path = out / "unseen.md"
    wanted = budget.unseen_folds > 0 and not (skip_unseen or report_only or tuple(cells) != CELLS)
    if wanted and not unseen_path.exists():
        log.info(f"{protocol.name}: unseen subjects (MOABB CrossSubjectEvaluation)...")
        out.mkdir(parents=True, exist_ok=True)
        unseen_path.write_text(unseen_subjects(protocol, n_subjects, budget, out, jobs))
    unseen = unseen_path.read_text() if unseen_path.exists() and (wanted or report_only) else None
    return label, results, unseen
