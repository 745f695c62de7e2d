"""Robust aggregation: can a few faulty sites damage the model for everyone else, and can the federation name them?

Two federations (``--setting``), each of clients of 2 subjects (sorted subject ids, two by
two) with each client's own stratified 85/15 train/test split (seeded):

* ``left-right``: left/right imagery of the 40 offline PhysioNet subjects (:mod:`.data`), 20
  clients, scored in balanced accuracy; 4 faulty by default (``--faulty 4 5``);
* ``table-one``: Table I's PhysionetMI protocol, the 16 offline subjects with 4 classes, 8
  clients, scored in macro-F1; 2 faulty by default.

``FederatedSPDnetClassifier`` with the package defaults (:func:`.pipelines.fedspdnet`) and the
rule under test; ``--rounds`` rounds, the best-validation round's model. The first
``--faulty`` clients are faulty, in training only; the test trials are every client's true ones.

Scores. The score that matters is the setting's score on the **honest sites' subjects**
(their held-out trials, pooled), compared with the fault-free ProjAvg federation on the same
subjects, paired over seeds (same splits and initial models); the **faulty sites' subjects**
are scored apart (they lose their only training data when their site is set aside: no rule
can keep their score).

Faults (training only):

* ``labels``: the site's labels swapped; ``channels``: its channels permuted (``P X Pᵀ``, one
  random permutation per site); ``noise``: it trains on random SPD matrices (white-noise
  sample covariances) of its data's mean trace;
* ``reversed``: the site's update reversed, ``R_W(−L_W(W_i))`` on Stiefel arrays,
  ``θ − (θ_i − θ)`` otherwise (``W``, ``θ``: the broadcast); ``scaled``: its update scaled to
  0.99 of the ``max_update_norm`` bound (1e3, the default), the largest reply the engine accepts;
* ``dropped`` (a reference, not a fault): the federation without the faulty sites, ProjAvg.

Rules: ``projavg`` (no defence), ``trimmedmean`` (``TrimmedMean(trim=0.25)``), ``geomedian``,
``krum`` (multi-Krum, ``n_faulty`` the number of faulty clients), ``fltrust``
(``FLTrust(X, y)``: agreement of the whole tangent vector, trust proportional to it, each
update stretched to the reference's length), ``fltrust-layer`` (``FLTrust(X, y,
agreement_scope="layer", magnitude="bounded")``: the mean of the per-layer cosines, each
update cut to the reference's length) and ``fltrust-gate`` (the same with
``trust="accept"``: an agreeing client keeps its weight); and ``ts-lr``, the centralized reference
on the same splits (pyRiemann's TS+LR on the clients' training trials pooled, without fault). The root set: ``--root-size``
trials drawn (stratified, per seed) from the clients' clean training trials, as in the
FLTrust paper's evaluation (the server holds a small clean sample of the federation's
population); with every offline subject of the task in the federation no public subject is
left for a root set of its own.

Diagnosis, from each fit's trust (the fitted ``client_trust_``: the inverse of a client's mean
distance to the aggregate over the round's median, :func:`skfedspd.engine.client_trust`,
recomputed from the rounds' distances the fit keeps): a faulty fit
*names* its faulty clients when they are the ``n_faulty`` least trusted; a client is
*flagged* when its trust is below ``1 / SUSPECT_DISTANCE`` (``trust_summary_``); a *false
alarm* is a flagged honest client, counted over the clients of the fault-free fits.

Each fit is one JSON file under ``--out`` (``--out/table-one`` for Table I's setting; a run
resumes), with each round's per-client distances and agreements; the record
``robust-aggregation-f{n}`` (``robust-aggregation-tableone-f{n}``), one per number of faulty
clients, holds per-seed scores, the diagnosis and the distance curves of the figure, which is
drawn from the left/right record (``docs/benchmarks/figures/robust_aggregation_trust.png``).

    python -m benchmarks.experiments robust-aggregation --seeds 0 1 2 --rounds 80 --faulty 4 \\
        --rules projavg fltrust-gate --faults labels channels noise reversed scaled dropped --record
    python -m benchmarks.experiments robust-aggregation --setting table-one --seeds 0 1 2 --rounds 150 \\
        --root-size 128 --rules projavg fltrust-gate --faults labels channels noise reversed scaled dropped --record

(the page ``docs/benchmarks/robust-aggregation.md`` lists the runs of its record).
"""

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
from sklearn.metrics import balanced_accuracy_score, f1_score
from sklearn.model_selection import train_test_split

from benchmarks.records.store import RECORDS, read_record, write_record
from skfedspd.aggregation import FLTrust, GeometricMedian, Krum, TrimmedMean, client_weights
from skfedspd.engine import DOWNWEIGHT_RATIO, SUSPECT_DISTANCE, FederatedEngine, client_trust, distance_ratios
from skfedspd.clients import make_clients
from skfedspd.messages import TrainReply
from skfedspd.stiefel import lift, retract
from skfedspd.training import torch_threads

from .data import load_left_right
from .pipelines import fedspdnet, ts_lr
from .table_one_runner import client_split

SUBJECTS_PER_CLIENT, ROOT_SIZE = 2, 256
DATA_FAULTS = ("labels", "channels", "noise")
UPDATE_FAULTS = ("reversed", "scaled")
DROPPED = "dropped"
FAULTS = DATA_FAULTS + UPDATE_FAULTS + (DROPPED,)
RULES = ("projavg", "trimmedmean", "geomedian", "krum", "fltrust", "fltrust-layer", "fltrust-gate", "ts-lr")
LABELS = {"projavg": "ProjAvg", "trimmedmean": "trimmed mean", "geomedian": "geometric median",
          "krum": "multi-Krum", "fltrust": "FLTrust", "fltrust-layer": "FLTrust per layer",
          "fltrust-gate": "FLTrust gate", "ts-lr": "TS+LR (training trials pooled)"}
FAULT_LABELS = {"none": "no fault", "labels": "labels swapped", "channels": "channels permuted",
                "noise": "noise data", "reversed": "reversed update", "scaled": "scaled update",
                DROPPED: "faulty sites dropped"}
#: The engine's default bound on a reply's move (``max_update_norm``), which the scaled update fills
#: to ``SCALED_SHARE``.
MAX_UPDATE_NORM, SCALED_SHARE = 1e3, 0.99
#: What the study is asked to show (the record keeps them beside the measurements).
TARGETS = {"target_kept": "97 %", "target_fault_free": "1 point", "target_named": "95 %",
           "target_false_alarms": "5 %"}
FIGURE = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "figures" / "robust_aggregation_trust.png"


def load_table_one():
    """``(X, y, subjects)`` of Table I's PhysionetMI protocol (16 offline subjects, 4 classes):
    sample covariances, cached in one file under ``results/cache``."""
    from .data import CACHE
    from .table_one_protocols import load_offline_physionet

    path = CACHE / "physionet-4class-covariances.npz"
    if not path.exists():
        loaded = load_offline_physionet()
        if loaded is None:
            raise SystemExit("PhysioNet EEG files not found: nothing to run")
        _, _, X, y, subjects = loaded
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, X=X, y=y, subjects=subjects)
    with np.load(path) as f:
        return f["X"], f["y"], f["subjects"]


@dataclass(frozen=True)
class Setting:
    """A federation the study runs: its data, its score and its default number of faulty clients."""

    title: str
    load: Callable
    metric: str
    score: Callable
    faulty: int
    record: str

    def record_name(self, n_faulty):
        return f"{self.record}-f{n_faulty}"


SETTINGS = {
    "left-right": Setting("left/right, 20 clients of 2 subjects", load_left_right, "balanced accuracy (%)",
                          balanced_accuracy_score, 4, "robust-aggregation"),
    "table-one": Setting("Table I: PhysionetMI 4 classes, 8 clients of 2 subjects", load_table_one, "macro-F1 (%)",
                         partial(f1_score, average="macro"), 2, "robust-aggregation-tableone"),
}


def add_arguments(parser):
    parser.add_argument("--setting", choices=tuple(SETTINGS), default="left-right",
                        help="left-right: 40 subjects, 20 clients; table-one: Table I's 16 subjects, 4 classes, 8 clients")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--faulty", type=int, nargs="+", default=None,
                        help="faulty clients (default: 4 of 20 on left-right, 2 of 8 on table-one)")
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(DATA_FAULTS))
    parser.add_argument("--rules", nargs="+", choices=RULES, default=["projavg", "fltrust-gate"])
    parser.add_argument("--root-size", type=int, default=ROOT_SIZE)
    parser.add_argument("--out", type=Path, default=Path("results/robust-aggregation"))
    parser.add_argument("--report-only", action="store_true", help="fit nothing: record what --out holds")
    parser.add_argument("--record", action="store_true", help="write the records (and the figure) at the end")


def corrupt_update(params, previous, kinds, fault):
    """A client's parameters with its update corrupted (``"reversed"`` or ``"scaled"``, see the
    module docstring), from the broadcast ``previous``; its ``"local"`` arrays untouched."""
    out = dict(params)
    for name, kind in kinds.items():
        if kind == "local":
            continue
        base = np.asarray(previous[name], dtype=np.float64)
        value = np.asarray(params[name], dtype=np.float64)
        step = lift(base, value) if kind == "stiefel" else value - base
        if fault == "reversed":
            step = -step
        else:  # scaled: the longest step the bound admits (a Stiefel array cannot go that far)
            bound = SCALED_SHARE * MAX_UPDATE_NORM * (1 + np.linalg.norm(base))
            step = step * (bound / max(np.linalg.norm(step), 1e-12))
        new = retract(base, step) if kind == "stiefel" else base + step
        out[name] = new.astype(np.asarray(params[name]).dtype)
    return out


@contextmanager
def hostile_clients(fault, clients):
    """Within the block, the train replies of ``clients`` reach the server with their update
    corrupted (:func:`corrupt_update`): as a site that sends them would, so the engine checks,
    aggregates and diagnoses the corrupted update (the same on every backend: the engine is shared)."""
    original, clients = FederatedEngine.aggregate, set(clients)

    def aggregate(engine, t, selected, replies):
        previous = {n: v for n, v in engine.global_params.items() if engine.kinds[n] != "local"}
        replies = [replace(reply, params=corrupt_update(reply.params, previous, engine.kinds, fault))
                   if cid in clients and isinstance(reply, TrainReply) else reply
                   for cid, reply in zip(selected, replies)]
        return original(engine, t, selected, replies)

    FederatedEngine.aggregate = aggregate
    try:
        yield
    finally:
        FederatedEngine.aggregate = original


def inject_data_fault(fault, X, y, rows, rng):
    """Copies of ``(X, y)`` with the data fault applied to the samples ``rows`` of one site."""
    X, y = X.copy(), y.copy()
    if fault == "labels":
        classes = np.unique(y)
        y[rows] = classes[(np.searchsorted(classes, y[rows]) + 1) % len(classes)]
    elif fault == "channels":
        perm = rng.permutation(X.shape[1])
        X[rows] = X[rows][:, perm][:, :, perm]
    elif fault == "noise":
        n_channels = X.shape[1]
        scale = np.mean(np.trace(X[rows], axis1=1, axis2=2)) / n_channels
        noise = rng.standard_normal((len(rows), n_channels, 4 * n_channels))
        X[rows] = scale * noise @ noise.transpose(0, 2, 1) / noise.shape[2]
    return X, y


def draw_root_set(X, y, seed, size=ROOT_SIZE):
    """``size`` trials of ``(X, y)``, stratified, drawn by ``seed``."""
    rows, _ = train_test_split(np.arange(len(y)), train_size=size, stratify=y, random_state=seed)
    return X[rows], y[rows]


def make_rule(rule, n_faulty, root):
    if rule == "projavg":
        return "projavg"
    if rule == "trimmedmean":
        return TrimmedMean(trim=0.25)
    if rule == "geomedian":
        return GeometricMedian()
    if rule == "krum":
        return Krum(n_faulty=max(n_faulty, 1))
    if rule == "fltrust":
        return FLTrust(*root)
    # per layer, updates bounded by the reference's length; the gate accepts or rejects
    return FLTrust(*root, agreement_scope="layer", trust="accept" if rule == "fltrust-gate" else "cosine",
                   magnitude="bounded")


def fit_one(data, rule, fault, n_faulty, seed, rounds, root_size=ROOT_SIZE, setting="left-right"):
    """One fit of ``setting``: its test predictions with each trial's client, the clients' trust
    (over the fit and per round), their per-round diagnosis, its best round and validation curve."""
    X, y, subjects = data
    train, test = client_split(y, subjects, seed, SUBJECTS_PER_CLIENT)  # Table I's: each client's own 85/15
    client_rows, client_subjects = make_clients(subjects[train], groups_per_client=SUBJECTS_PER_CLIENT)
    client_of = {subject: c for c, group in enumerate(client_subjects) for subject in group}
    scored = {"setting": setting, "n_clients": len(client_rows), "rule": rule, "fault": fault, "n_faulty": n_faulty,
              "seed": seed, "y_test": y[test].tolist(), "client": [int(client_of[s]) for s in subjects[test]]}
    X_train, y_train = X[train], y[train]
    if rule == "ts-lr":  # the centralized reference on the same splits: the clients' training trials pooled
        start = time.process_time()
        pred = ts_lr(seed).fit(X_train, y_train).predict(X[test])
        return {**scored, "pred": pred.tolist(), "cpu_seconds": time.process_time() - start}
    root = draw_root_set(X_train, y_train, seed, root_size) if rule.startswith("fltrust") else None
    aggregation = make_rule(rule, n_faulty, root)
    if fault in DATA_FAULTS:
        rng = np.random.default_rng(seed)
        for site in range(n_faulty):
            X_train, y_train = inject_data_fault(fault, X_train, y_train, client_rows[site], rng)
    keep = np.ones(len(train), dtype=bool)
    if fault == DROPPED:
        keep[np.concatenate([client_rows[site] for site in range(n_faulty)])] = False
    clf = fedspdnet(seed, groups_per_client=SUBJECTS_PER_CLIENT).set_params(
        aggregation=aggregation, n_rounds=rounds, max_update_norm=MAX_UPDATE_NORM)
    start = time.process_time()
    with torch_threads(1), hostile_clients(fault, range(n_faulty) if fault in UPDATE_FAULTS else ()):
        clf.fit(X_train[keep], y_train[keep], groups=subjects[train][keep])
        pred = clf.predict(X[test])
    history = clf.history_
    round_trust = None  # each round's effective weight over weight (a robust rule's)
    if fault != DROPPED and history[0].get("effective_weights") is not None:
        round_trust = [[round(e / w, 3) for e, w in zip(r["effective_weights"], client_weights(r["n_samples"]))]
                       for r in history]
    per_client = {}  # the rounds' per-client diagnosis, 4 decimals (all clients every round)
    for key in ("client_agreement", "client_distance"):
        if fault != DROPPED and history[0].get(key) is not None:
            per_client[key] = [[round(v, 4) for v in r[key]] for r in history]
    return {**scored, "rounds": rounds, **per_client, "root_size": root_size if root is not None else None,
            "pred": pred.tolist(), "round_trust": round_trust, "best_round": int(clf.best_round_),
            "val_f1": [round(float(r["val_f1"]), 4) for r in history],
            "cpu_seconds": time.process_time() - start}


def fit_path(out, rule, fault, n_faulty, seed, rounds, root_size, setting="left-right"):
    root = f"__root{root_size}" if rule.startswith("fltrust") else ""
    folder = Path(out) if setting == "left-right" else Path(out) / setting
    return folder / f"{rule}__{fault}__{n_faulty}__{seed}__T{rounds}{root}.json"


def score(fit, clients):
    """The setting's score (%) of a fit on the pooled test trials of the subjects of ``clients``."""
    at = np.isin(fit["client"], list(clients))
    return 100 * SETTINGS[fit["setting"]].score(np.asarray(fit["y_test"])[at], np.asarray(fit["pred"])[at])


def fit_trust(fit):
    """Each client's trust over the fit, :func:`skfedspd.engine.client_trust` of the rounds'
    distances the fit keeps (every client in every round); None without them."""
    if fit.get("client_distance") is None:
        return None
    n = fit["n_clients"]
    history = [{"clients": list(range(n)), "n_samples": [1] * n, "client_distance": distance}
               for distance in fit["client_distance"]]
    return client_trust(history, n)[0]


def weight_trust(fit):
    """The diagnosis this study replaced, for comparison: each client's mean effective weight over
    its weight (a robust rule's fits only; None otherwise)."""
    return None if fit.get("round_trust") is None else np.mean(fit["round_trust"], axis=0)


def named(fit, n_faulty, trust=None):
    """Whether the ``n_faulty`` faulty clients are the least trusted of the fit (by ``trust``,
    default :func:`fit_trust`)."""
    trust = fit_trust(fit) if trust is None else trust
    return bool(np.max(trust[:n_faulty]) < np.min(trust[n_faulty:]))


def flagged(fit, clients, trust=None, below=1 / SUSPECT_DISTANCE):
    """How many of ``clients`` are flagged over the fit: their trust (default :func:`fit_trust`)
    below ``below``."""
    trust = fit_trust(fit) if trust is None else trust
    return int(sum(trust[c] < below for c in clients))


def run(args):
    start = time.perf_counter()
    data, setting = None, SETTINGS[args.setting]
    args.faulty = args.faulty or [setting.faulty]
    for n_faulty in args.faulty:
        runs = plan(args.rules, args.faults, n_faulty, args.seeds)
        paths = {r: fit_path(args.out, *r, args.rounds, args.root_size, args.setting) for r in runs}
        todo = [r for r in runs if not paths[r].exists()]
        print(f"{setting.title}, {n_faulty} faulty: {len(todo)} of {len(runs)} fits to run", flush=True)
        for rule, fault, n, seed in [] if args.report_only else todo:
            if data is None:
                data = setting.load()
            fit = fit_one(data, rule, fault, n, seed, args.rounds, args.root_size, args.setting)
            paths[rule, fault, n, seed].parent.mkdir(parents=True, exist_ok=True)
            paths[rule, fault, n, seed].write_text(json.dumps(fit))
            every = range(fit["n_clients"])
            diag = "" if fit_trust(fit) is None else (
                f", named {named(fit, n)}" if n else f", flagged {flagged(fit, every)}")
            rounds = f", best round {fit['best_round']}/{args.rounds}" if "best_round" in fit else ""
            print(f"{rule} {fault} x{n} seed {seed}: honest {score(fit, every[n_faulty:]):.1f}{rounds}, "
                  f"{fit['cpu_seconds']:.0f} s CPU{diag}", flush=True)
    if args.record:
        for n_faulty in args.faulty:
            path = record(args, n_faulty, time.perf_counter() - start)
            print(f"record: {path}")
        if args.setting == "left-right":
            figure(read_record(setting.record_name(args.faulty[0])), FIGURE)
            print(f"figure: {FIGURE}")


def plan(rules, faults, n_faulty, seeds):
    """``(rule, fault, n_faulty, seed)`` of every fit: each rule without fault and under each
    fault; ``dropped`` with ProjAvg only; ``ts-lr`` (the centralized reference) without fault only."""
    return [(rule, fault, 0 if fault == "none" else n_faulty, seed) for seed in seeds
            for fault in ["none", *faults] for rule in rules
            if (fault != DROPPED or rule == "projavg") and (fault == "none" or rule != "ts-lr")]


def record(args, n_faulty, elapsed):
    """Write the setting's record (``robust-aggregation-f{n_faulty}`` on left/right) from the fits
    in ``args.out``; ``elapsed``: the run's wall time (the fits' summed CPU time is the fact
    ``fits_cpu_minutes``)."""
    fits, setting = {}, SETTINGS[args.setting]
    for rule, fault, n, seed in plan(args.rules, args.faults, n_faulty, args.seeds):
        path = fit_path(args.out, rule, fault, n, seed, args.rounds, args.root_size, args.setting)
        if path.exists():
            fits.setdefault((rule, fault), {})[seed] = json.loads(path.read_text())
    n_clients = next(f["n_clients"] for by_seed in fits.values() for f in by_seed.values())
    every = range(n_clients)
    honest, faulty = every[n_faulty:], every[:n_faulty]
    rows, facts = {}, {"clients": n_clients, "subjects_per_client": SUBJECTS_PER_CLIENT, "n_faulty": n_faulty,
                       "rounds": args.rounds, "root_size": args.root_size, "seeds": list(args.seeds),
                       "scaled_share": f"{SCALED_SHARE}", "flag_distance": f"{SUSPECT_DISTANCE}", "flag_below_by_weight": f"{DOWNWEIGHT_RATIO}", **TARGETS}
    for (rule, fault), by_seed in fits.items():
        key = f"{rule}/{fault}"
        rows[key] = {"label": f"{LABELS[rule]}, {FAULT_LABELS[fault]}" + (f" ×{n_faulty}" if fault != "none" else ""),
                     "scores": {"honest": {s: score(f, honest) for s, f in by_seed.items()},
                                "faulty": {s: score(f, faulty) for s, f in by_seed.items()},
                                "all": {s: score(f, every) for s, f in by_seed.items()}}}
        if rule != "ts-lr":  # a centralized pipeline has no rounds
            facts[f"best_round/{key}"] = float(np.median([f["best_round"] for f in by_seed.values()]))
        trusts = [f for f in by_seed.values() if f.get("client_distance") is not None]
        if trusts and fault == "none":
            facts[f"false_alarms/{key}"] = f"{sum(flagged(f, every) for f in trusts)} of {n_clients * len(trusts)}"
        elif trusts and fault != DROPPED:
            facts[f"named/{key}"] = f"{sum(named(f, n_faulty) for f in trusts)} of {len(trusts)}"
            facts[f"honest_flagged/{key}"] = f"{sum(flagged(f, honest) for f in trusts)} of {len(honest) * len(trusts)}"
            facts[f"faulty_flagged/{key}"] = f"{sum(flagged(f, faulty) for f in trusts)} of {n_faulty * len(trusts)}"
    for rule in dict.fromkeys(rule for rule, _ in fits):  # over every faulty fit of a rule, data and update faults
        faulty_fits = [f for (r, fault), by_seed in fits.items() if r == rule and fault not in ("none", DROPPED)
                       for f in by_seed.values() if f.get("client_distance") is not None]
        clean = [f for f in fits.get((rule, "none"), {}).values() if f.get("client_distance") is not None]
        if faulty_fits:
            k = sum(named(f, n_faulty) for f in faulty_fits)
            facts[f"named_all/{rule}"] = f"{k} of {len(faulty_fits)} ({100 * k / len(faulty_fits):.0f} %)"
        if clean:
            k, total = sum(flagged(f, every) for f in clean), n_clients * len(clean)
            facts[f"false_alarm_rate/{rule}"] = f"{k} of {total} ({100 * k / total:.0f} %)"
        # the replaced diagnosis (mean effective weight, flagged below DOWNWEIGHT_RATIO) on the same fits
        by_weight = [f for f in faulty_fits if weight_trust(f) is not None]
        clean = [f for f in clean if weight_trust(f) is not None]
        if by_weight and clean:
            k = sum(named(f, n_faulty, weight_trust(f)) for f in by_weight)
            facts[f"named_all_by_weight/{rule}"] = f"{k} of {len(by_weight)} ({100 * k / len(by_weight):.0f} %)"
            k = sum(flagged(f, every, weight_trust(f), DOWNWEIGHT_RATIO) for f in clean)
            total = n_clients * len(clean)
            facts[f"false_alarm_rate_by_weight/{rule}"] = f"{k} of {total} ({100 * k / total:.0f} %)"
    reference = rows["projavg/none"]["scores"]["honest"]
    for key, row in rows.items():
        seeds = [s for s in row["scores"]["honest"] if s in reference]
        kept = np.mean([row["scores"]["honest"][s] for s in seeds]) / np.mean([reference[s] for s in seeds])
        facts[f"kept/{key}"] = f"{100 * kept:.1f} %"
    for rule in dict.fromkeys(rule for rule, _ in fits):
        seconds = [f["cpu_seconds"] for (r, _), by_seed in fits.items() if r == rule for f in by_seed.values()]
        facts[f"fit_cpu_seconds/{rule}"] = round(float(np.median(seconds)))
    all_fits = [f for by_seed in fits.values() for f in by_seed.values()]
    facts["fits"] = len(all_fits)
    facts["fits_cpu_minutes"] = f"{sum(f['cpu_seconds'] for f in all_fits) / 60:.0f}"
    facts.update(costs(args.root_size))
    first = min(args.seeds)
    facts["distance_curves"] = {f"{rule}/{fault}": block_means(fit_distance_ratios(fits[(rule, fault)][first]))
                                for rule in FIGURE_RULES for fault in ("none", *DATA_FAULTS)
                                if (rule, fault) in fits and first in fits[(rule, fault)]}
    facts["distance_curves_seed"], facts["distance_curves_block"] = first, BLOCK
    setting_option = "" if args.setting == "left-right" else f" --setting {args.setting}"
    command = (f"python -m benchmarks.experiments robust-aggregation{setting_option} --seeds "
               + " ".join(map(str, args.seeds))
               + f" --rounds {args.rounds} --faulty {' '.join(map(str, args.faulty))} --faults {' '.join(args.faults)}"
               + f" --rules {' '.join(args.rules)} --root-size {args.root_size}"
               + (" --report-only" if args.report_only else "") + " --record")
    metric = setting.metric
    return write_record(
        setting.record_name(n_faulty),
        title=f"Robust aggregation, {setting.title}, {n_faulty} faulty",
        command=command, rows=rows, reference="projavg/none", paired_by="seed", wall_seconds=elapsed,
        metrics={"honest": f"{metric} on the honest sites' subjects",
                 "faulty": f"{metric} on the faulty sites' subjects",
                 "all": f"{metric} on every subject"},
        facts=facts, folder=RECORDS)


def costs(root_size, reps=50):
    """The server's cost per round of FLTrust (``benchmarks.bench_aggregation``'s timings, one
    core): the rule (and the record's agreement) for 8 clients of ``St(64, 18)`` + head, in ms,
    the default and the gate options, ProjAvg beside them; and the reference step (the server's
    training on ``root_size`` root trials, 2 local epochs)."""
    from threadpoolctl import threadpool_limits

    from benchmarks.bench_aggregation import KINDS, cpu_times_ms, fltrust_round, reference_step_ms, round_of_clients
    from skfedspd.aggregation import projavg

    reference = round_of_clients(9, 64, 18, 0, seed=1)[1][0]
    root = (np.zeros((1, 64, 64)), [0])
    rules = {"projavg": projavg, "fltrust": fltrust_round(FLTrust(*root), reference),
             "fltrust-gate": fltrust_round(make_rule("fltrust-gate", 0, root), reference)}
    out = {}
    with threadpool_limits(1), torch_threads(1):
        previous, clients, weights = round_of_clients(8, 64, 18, 0)
        for name, rule in rules.items():
            ms = np.median(cpu_times_ms(lambda rule=rule: rule(clients, weights, previous, KINDS), reps))
            out[f"aggregation_ms/{name}"] = f"{ms:.2f}"
        out["reference_step_ms"] = f"{np.median(reference_step_ms(root_size, 2, 5)):.0f}"
    return out


#: Rounds per point of the record's trust curves (their means).
BLOCK = 5


#: The rules of the figure (those of the record's main runs).
FIGURE_RULES = ("projavg", "fltrust-gate")


def fit_distance_ratios(fit):
    """Each client's distance ratio per round (:func:`skfedspd.engine.distance_ratios`), ``(rounds, n_clients)``."""
    return np.array([distance_ratios(distance) for distance in fit["client_distance"]])


def block_means(values, block=BLOCK):
    """Each client's per-round values averaged over consecutive blocks of ``block`` rounds (the
    last may be shorter), rounded to 0.01: ``(n_blocks, n_clients)`` lists."""
    values = np.asarray(values, dtype=float)
    return [np.round(values[i:i + block].mean(axis=0), 2).tolist() for i in range(0, len(values), block)]


def figure(rec, path):
    """Each client's distance to the aggregate over the round's median (the diagnosis's
    evidence: its trust over the fit is the inverse of this ratio's mean) under each rule of
    the record's curves, no fault and each data fault, from the record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    facts = rec["facts"]
    curves, n_faulty, block = facts["distance_curves"], facts["n_faulty"], facts["distance_curves_block"]
    rules = [r for r in FIGURE_RULES if any(k.startswith(r + "/") for k in curves)]
    faults = [f for f in ("none", *DATA_FAULTS) if any(k.endswith("/" + f) for k in curves)]
    fig, axes = plt.subplots(len(rules), len(faults), figsize=(2.8 * len(faults), 2.3 * len(rules)),
                             sharex=True, sharey=True, squeeze=False)
    for i, rule in enumerate(rules):
        for j, fault in enumerate(faults):
            ax = axes[i, j]
            if f"{rule}/{fault}" not in curves:
                ax.text(0.5, 0.5, f"{LABELS[rule]}: {FAULT_LABELS[fault]}\nnot run", ha="center", va="center",
                        transform=ax.transAxes, fontsize="small", color="0.4")
                ax.set_axis_off()
                continue
            ratio = np.asarray(curves[f"{rule}/{fault}"], dtype=float)
            rounds = block * np.arange(len(ratio)) + (block + 1) / 2
            for c in range(ratio.shape[1]):
                broken = fault != "none" and c < n_faulty
                ax.plot(rounds, ratio[:, c], lw=1.2 if broken else 0.7,
                        color="tab:red" if broken else "0.6", zorder=3 if broken else 2)
            ax.axhline(SUSPECT_DISTANCE, color="k", lw=0.6, ls="--")
            ax.set_title(f"{LABELS[rule]}: {FAULT_LABELS[fault]}", fontsize="small")
            if i == len(rules) - 1:
                ax.set_xlabel("round")
            if j == 0:
                ax.set_ylabel(f"distance ratio ({block}-round mean)", fontsize="small")
    fig.suptitle(f"Each client's distance to the aggregate over the round's median, seed "
                 f"{facts['distance_curves_seed']}: faulty clients red ({n_faulty} of {facts['clients']}), honest "
                 f"grey; dashed: the suspect level over a fit", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
