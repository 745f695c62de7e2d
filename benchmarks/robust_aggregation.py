"""Fault injection on real EEG: how far one or two faulty sites of eight move FedSPDnet,
per aggregation rule.

The Table I protocol (``benchmarks.tableone``): PhysionetMI, 4 classes, the 16 offline
subjects, 8 clients of 2 subjects, each client's own 85/15 train/test split, the paper's
clients (Adam 1e-3, E = 2, a fresh Adam every round) with the server optimizer Table I
recommends (``SERVER_MOMENTUM``: FedAvgM, eta = 1, beta = 0.9), full participation. Scores:
test macro-F1 of the best-validation global model on every client's true test part (the
faults touch training only), paired over seeds (same splits and initial models per seed).

Faults, on the first 1 or 2 clients (``--faulty``):

* ``labels``: the site's training labels permuted (each class renamed to the next);
* ``channels``: the site's channels permuted (``P X Pᵀ``, one random permutation per site);
* ``noise``: the site trains on random SPD matrices (white-noise sample covariances) scaled
  to its data's mean trace;
* ``reversed``: the site's update reversed: ``R_W(−L_W(W_i))`` on Stiefel arrays,
  ``θ − (θ_i − θ)`` otherwise (``W``, ``θ``: the broadcast);
* ``scaled``: the site's update scaled to 0.99 of the ``max_update_norm`` bound (the
  default, 1e3): the largest reply the engine accepts;
* ``dropped`` (a reference, not a fault): the same federation without those sites, what a
  rule that recognised them perfectly could reach on the same test trials; fitted with
  ProjAvg only (the mean of the honest sites, which a perfect rule would reduce to; Krum
  with ``n_faulty=2`` cannot even run on the 6 sites left).

Scores, restated: besides the macro-F1 on every client's test part, each fit keeps its test
predictions per site, so that the report scores the **honest sites' subjects** (sites
``n_faulty``…7) against the fault-free ProjAvg federation *on the same subjects* (paired over
seeds: mean difference ± standard error), and the **faulty sites' subjects** separately
(they lose their only training data when their site is set aside: no rule can keep their
score). The diagnosis: each fit's ``client_trust_``; a faulty fit *names* its faulty sites
when they are the ``n_faulty`` least trusted; a fault-free fit raises a *false alarm* when a
site's trust is below 0.5.

``fltrust``: :class:`~skfedspd.aggregation.FLTrust` with a public root set. On Table I's
protocol (``--protocol tableone``) no offline subject outside the 16 holds the 4 classes:
the root set is the left/right-hand imagery of subjects ``ROOT_SUBJECTS`` (16 and 17; the
same band-pass and window), 2 of the 4 classes, a reference biased towards them.
``--protocol leftright``: left vs right hand imagery (``load_physionet_mi(n_classes=2)``)
with the privacy protocol's split of the 40 offline subjects: the sites are subjects 16–39,
8 clients of 3 subjects, each client's own 85/15 split; the root set is ``ROOT_SIZE`` trials
drawn (seeded, stratified) from the public corpus, subjects 1–15 and 42; score: balanced
accuracy. Same model, local training and server as Table I's.

Data faults change the site's ``(X, y)`` before ``fit`` (the groups decide the clients);
update faults wrap the rule in a callable ``aggregation`` (:class:`CorruptedUpdates`) that
corrupts the chosen clients' arrays before the rule sees them. Rows: ProjAvg, RLAvg and the
robust rules (``geomedian``, ``trimmedmean``: trim 0.25, ``krum``: multi-Krum, f = 2).

    nice -n 10 python -m benchmarks.robust_aggregation --quick --jobs 2 --out results/robust-quick
    python -m benchmarks.robust_aggregation --seeds 5 --jobs 2 --out results/robust-full
"""

import argparse
import json
import logging
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from joblib import Parallel, delayed
from sklearn.metrics import balanced_accuracy_score, f1_score
from sklearn.model_selection import train_test_split

from benchmarks.tableone.cells import SERVER_MOMENTUM
from benchmarks.tableone.console import console_and_log, warnings_to_file
from benchmarks.tableone.protocols import federated, load_offline_physionet, machine, spdnet
from benchmarks.tableone.runner import client_split
from skfedspd.aggregation import FLTrust, GeometricMedian, Krum, TrimmedMean, get_aggregation
from skfedspd.datasets import load_physionet_mi, sample_covariance
from skfedspd.federated import make_clients
from skfedspd.server_optimizer import ServerMomentum
from skfedspd.stiefel import lift, retract
from skfedspd.training import torch_threads

log = logging.getLogger("benchmarks.tableone.robust")

RULES = {"projavg": "projavg", "rlavg": "rlavg", "geomedian": GeometricMedian(), "trimmedmean": TrimmedMean(trim=0.25),
         "krum": Krum(n_faulty=2), "fltrust": FLTrust}
#: The public root set of ``fltrust`` on Table I's protocol: left/right imagery of two subjects outside its 16.
ROOT_SUBJECTS = (16, 17)
#: The left/right protocol: the privacy protocol's public corpus and sites, clients of 3 sites' subjects.
PUBLIC_SUBJECTS, SITE_SUBJECTS, SUBJECTS_PER_CLIENT, ROOT_SIZE = (*range(1, 16), 42), tuple(range(16, 40)), 3, 64
DATA_FAULTS = ("labels", "channels", "noise")
UPDATE_FAULTS = ("reversed", "scaled")
#: Not a fault: the reference of the data faults, the same federation without the faulty sites
#: (what a rule that recognised them perfectly could reach; the test trials are the same).
DROPPED = "dropped"
FAULTS = DATA_FAULTS + UPDATE_FAULTS + (DROPPED,)
#: The engine's default bound on a reply's move (``max_update_norm``), which the scaled update fills.
MAX_UPDATE_NORM = 1e3
#: quick: 100 rounds (with server momentum the best-validation round of Table I's Full runs has
#: median 97; the report gives each rule's best rounds to check convergence); full: Table I's T.
PROFILES = {"quick": dict(seeds=1, rounds=100), "full": dict(seeds=5, rounds=150)}


class CorruptedUpdates:
    """An aggregation rule whose clients at ``positions`` (in the order the rule receives the
    accepted replies: client-id order) send a corrupted update: ``"reversed"`` or ``"scaled"``
    (see the module docstring). Deterministic; the wrapped ``rule`` sees the corrupted arrays."""

    def __init__(self, rule, fault, positions):
        self.rule, self.fault, self.positions = rule, fault, tuple(positions)
        #: A rule with the server's reference update (FLTrust) gets it through, on the corrupted
        #: arrays; the run trains the reference on the rule's root set.
        self.needs_reference = getattr(rule, "needs_reference", False)
        if self.needs_reference:
            self.X, self.y = rule.X, rule.y

    def __call__(self, client_params, weights, previous, kinds):
        return get_aggregation(self.rule)(self.corrupt_all(client_params, previous, kinds), weights, previous, kinds)

    def aggregate(self, client_params, weights, previous, kinds, reference=None):
        return self.rule.aggregate(self.corrupt_all(client_params, previous, kinds), weights, previous, kinds,
                                   reference=reference)

    def agreement(self, client_params, reference, previous, kinds):
        return self.rule.agreement(self.corrupt_all(client_params, previous, kinds), reference, previous, kinds)

    def corrupt_all(self, client_params, previous, kinds):
        return [self.corrupt(params, previous, kinds) if i in self.positions else params
                for i, params in enumerate(client_params)]

    def corrupt(self, params, previous, kinds):
        out = dict(params)
        for name, kind in kinds.items():
            if kind == "local":
                continue
            base = np.asarray(previous[name], dtype=np.float64)
            value = np.asarray(params[name], dtype=np.float64)
            step = lift(base, value) if kind == "stiefel" else value - base
            if self.fault == "reversed":
                step = -step
            else:  # scaled: the longest step the bound admits (a Stiefel array cannot go that far)
                step = step * (0.99 * MAX_UPDATE_NORM * (1 + np.linalg.norm(base)) / max(np.linalg.norm(step), 1e-12))
            new = retract(base, step) if kind == "stiefel" else base + step
            out[name] = new.astype(np.asarray(params[name]).dtype)
        return out


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


def load_root_set():
    """``(covariances, labels)`` of the public root set (``ROOT_SUBJECTS``), Table I's window."""
    X_raw, y = load_physionet_mi(list(ROOT_SUBJECTS), n_classes=2, return_raw=True, n_times=480)[:2]
    return sample_covariance(X_raw), y


def load_left_right(cache):
    """``(site data (X, y, subjects), public corpus (X, y))`` of the left/right protocol,
    covariances cached in ``cache`` (an ``.npz``)."""
    if not cache.exists():
        X, y, subjects, _ = load_physionet_mi(subjects=[*PUBLIC_SUBJECTS, *SITE_SUBJECTS], n_classes=2)
        np.savez(cache, X=X, y=y, subjects=subjects)
    with np.load(cache) as f:
        X, y, subjects = f["X"], f["y"], f["subjects"]
    sites = np.isin(subjects, SITE_SUBJECTS)
    return (X[sites], y[sites], subjects[sites]), (X[~sites], y[~sites])


def draw_root_set(public, seed, size=ROOT_SIZE):
    """``size`` trials of the public corpus, stratified, drawn by ``seed``."""
    X, y = public
    rows, _ = train_test_split(np.arange(len(y)), train_size=size, stratify=y, random_state=seed)
    return X[rows], y[rows]


def fit_scenario(protocol, data, rule, fault, n_faulty, seed, rounds, log_file=None, root=None, per_client=2,
                 root_size=ROOT_SIZE):
    """One fit: macro-F1 of the global model on the clients' true test parts, its test
    predictions with each trial's site, its sites' trust, and its history summary. ``root``:
    the root set, or the public corpus it draws ``root_size`` trials from by the seed
    (``per_client=3``, the left/right protocol)."""
    X, y, subjects = data
    train, test = client_split(y, subjects, seed, groups_per_client=per_client)
    client_rows, client_subjects = make_clients(subjects[train], groups_per_client=per_client)
    X_train, y_train = X[train], y[train]
    if rule == "fltrust" and per_client != 2:
        root = draw_root_set(root, seed, root_size)
    aggregation = RULES[rule] if rule != "fltrust" else FLTrust(*root)
    if fault in DATA_FAULTS:
        rng = np.random.default_rng(seed)
        for site in range(n_faulty):
            X_train, y_train = inject_data_fault(fault, X_train, y_train, client_rows[site], rng)
    elif fault in UPDATE_FAULTS:
        aggregation = CorruptedUpdates(aggregation, fault, range(n_faulty))
    honest = np.ones(len(train), dtype=bool)
    if fault == DROPPED:
        honest[np.concatenate([client_rows[site] for site in range(n_faulty)])] = False
    clf = federated(spdnet(protocol, seed, 1), aggregation, 1.0, rounds, seed,
                    server={"server_optimizer": ServerMomentum(**SERVER_MOMENTUM)})
    clf.set_params(max_update_norm=MAX_UPDATE_NORM, groups_per_client=per_client)
    start = time.process_time()
    with torch_threads(1), warnings_to_file(log_file):
        clf.fit(X_train[honest], y_train[honest], groups=subjects[train][honest])
        pred = clf.predict(X[test])
    site_of = {subject: site for site, group in enumerate(client_subjects) for subject in group}
    trust = clf.client_trust_.tolist() if fault != DROPPED else None
    return {"rule": rule, "fault": fault, "n_faulty": n_faulty, "seed": seed, "rounds": rounds,
            "f1": float(f1_score(y[test], pred, average="macro")), "best_round": int(clf.best_round_),
            "y_test": y[test].tolist(), "pred": pred.tolist(), "site": [int(site_of[s]) for s in subjects[test]],
            "trust": trust,
            "curve": [r["val_f1"] for r in clf.history_], "cpu_seconds": time.process_time() - start,
            **faulty_site_diagnostics(clf.history_, n_faulty if fault in DATA_FAULTS else 0)}


def faulty_site_diagnostics(history, n_faulty):
    """Median over rounds of the faulty sites' mean distance to the aggregate over the honest
    sites' (``history_["client_distance"]``), and of the faulty sites' total effective weight
    (robust rules); None without faulty sites whose replies the engine saw as sent."""
    if not n_faulty:
        return {"distance_ratio": None, "faulty_share": None}
    ratios = [np.mean(r["client_distance"][:n_faulty]) / np.mean(r["client_distance"][n_faulty:]) for r in history]
    shares = [sum(r["effective_weights"][:n_faulty]) for r in history if r["effective_weights"] is not None]
    return {"distance_ratio": float(np.median(ratios)), "faulty_share": float(np.median(shares)) if shares else None}


def scenarios(faults, faulty):
    return [("none", 0)] + [(fault, n) for n in sorted(faulty, reverse=True) for fault in faults]


def report(records, rules, faults, faulty):
    """Markdown table (mean macro-F1 % over seeds per rule and scenario) and the two target lines."""
    def score(rule, fault, n):
        values = [r["f1"] for r in records if (r["rule"], r["fault"], r["n_faulty"]) == (rule, fault, n)]
        return 100 * np.mean(values) if values else float("nan")

    columns = scenarios(faults, faulty)
    lines = ["| rule | " + " | ".join("no fault" if f == "none" else f"{f} ×{n}" for f, n in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for rule in rules:
        cells = [score(rule, f, n) for f, n in columns]
        lines.append(f"| {rule} | " + " | ".join("–" if np.isnan(c) else f"{c:.1f}" for c in cells) + " |")
    lines.append("")
    clean = {rule: score(rule, "none", 0) for rule in rules}
    robust = [rule for rule in rules if rule not in ("projavg", "rlavg")]
    if "projavg" in rules and robust:
        gaps = ", ".join(f"{rule} {clean[rule] - clean['projavg']:+.1f}" for rule in robust)
        met = all(abs(clean[rule] - clean["projavg"]) <= 1 for rule in robust)
        lines.append(f"- (a) no fault, robust rule − ProjAvg (points; target within 1): {gaps} — "
                     f"{'met' if met else 'not met'}")
    worst = max(faulty) if faulty else None
    if worst and robust and "projavg" in rules:
        real = [f for f in faults if f != DROPPED]

        def kept(rule):  # the worst fault's score as a share of the rule's fault-free score
            return min(score(rule, f, worst) for f in real) / clean[rule]
        best = max(robust, key=kept)
        lines.append(f"- (b) {worst} faulty of 8, worst fault: best robust rule {best} keeps {kept(best):.1%} of its "
                     f"fault-free score (target >= 95 %: {'met' if kept(best) >= 0.95 else 'not met'}); ProjAvg keeps "
                     f"{kept('projavg'):.1%} (loses {clean['projavg'] * (1 - kept('projavg')):.1f} points)")
        for fault in faults:
            changes = [(rule, score(rule, fault, worst) - clean[rule]) for rule in rules]
            lines.append(f"  - {fault} ×{worst}: " + ", ".join(
                f"{rule} {change:+.1f}" for rule, change in changes if not np.isnan(change)) + " (points vs no fault)")
    return "\n".join(lines)


def subject_score(record, sites):
    """Macro-F1 (4 classes) or balanced accuracy (2) of a fit on the test trials of the subjects of ``sites``."""
    at = np.isin(record["site"], list(sites))
    y, pred = np.asarray(record["y_test"])[at], np.asarray(record["pred"])[at]
    return balanced_accuracy_score(y, pred) if len(np.unique(record["y_test"])) == 2 else f1_score(y, pred,
                                                                                                   average="macro")


def restated_report(records, rules, faults, n_faulty, n_sites=8):
    """The restated protocol's table: the honest sites' subjects against fault-free ProjAvg on
    the same subjects (paired over seeds), the faulty sites' subjects apart, and the diagnosis."""
    honest, faulty = range(n_faulty, n_sites), range(n_faulty)

    def fits(rule, fault, n):
        return {r["seed"]: r for r in records if (r["rule"], r["fault"], r["n_faulty"]) == (rule, fault, n)
                and "pred" in r}

    base = fits("projavg", "none", 0)
    lines = [f"Honest sites' subjects (sites {n_faulty}–{n_sites - 1}): score (%) and paired change against the "
             "fault-free ProjAvg federation on the same subjects (mean ± SE over seeds; kept: ratio of means); "
             "faulty sites' subjects apart; named: fits whose faulty sites are the least trusted.", "",
             "| rule | fault | seeds | honest subjects | change | kept | faulty subjects | named |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for rule in rules:
        for fault in ["none", *faults]:
            runs = fits(rule, fault, 0 if fault == "none" else n_faulty)
            seeds = sorted(set(runs) & set(base))
            if not seeds:
                continue
            score = np.array([subject_score(runs[s], honest) for s in seeds])
            change = score - np.array([subject_score(base[s], honest) for s in seeds])
            se = change.std(ddof=1) / np.sqrt(len(seeds)) if len(seeds) > 1 else float("nan")
            kept = score.mean() / np.mean([subject_score(base[s], honest) for s in seeds])
            own = [subject_score(runs[s], faulty) for s in seeds]
            if fault == "none":
                named = "false alarms {}/{}".format(sum(min(runs[s]["trust"]) < 0.5 for s in seeds), len(seeds))
            elif fault == DROPPED:
                named = "–"
            else:
                named = "{}/{}".format(sum(max(runs[s]["trust"][:n_faulty]) < min(runs[s]["trust"][n_faulty:])
                                           for s in seeds), len(seeds))
            lines.append(f"| {rule} | {fault} | {len(seeds)} | {100 * score.mean():.1f} | {100 * change.mean():+.1f} ± "
                         f"{100 * se:.1f} | {kept:.1%} | {100 * np.mean(own):.1f} | {named} |")
    return "\n".join(lines)


def figure(records, rules, faults, faulty, path):
    """Grouped bars: mean test macro-F1 per scenario (x) and rule (bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = scenarios(faults, faulty)
    fig, ax = plt.subplots(figsize=(1.1 * len(columns) + 2, 3.6))
    width = 0.8 / len(rules)
    for i, rule in enumerate(rules):
        means = [100 * np.mean([r["f1"] for r in records if (r["rule"], r["fault"], r["n_faulty"]) == (rule, f, n)]
                               or [np.nan]) for f, n in columns]
        ax.bar(np.arange(len(columns)) + (i - (len(rules) - 1) / 2) * width, means, width, label=rule)
    ax.set_xticks(np.arange(len(columns)), ["no fault" if f == "none" else f"{f} ×{n}" for f, n in columns])
    ax.set_ylabel("test macro-F1 (%)")
    ax.legend(ncols=len(rules), fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def trust_figure(records, rule, faults, n_faulty, path, n_sites=8):
    """Each site's trust over the fit (``client_trust_``) under ``rule``, per fault: the
    faulty sites (red) against the honest ones (grey), every seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = ["none"] + [f for f in faults if f not in UPDATE_FAULTS and f != DROPPED]
    fig, ax = plt.subplots(figsize=(1.3 * len(columns) + 2, 3.2))
    for x, fault in enumerate(columns):
        for r in records:
            if (r["rule"], r["fault"]) != (rule, fault) or r.get("trust") is None:
                continue
            for site, trust in enumerate(r["trust"]):
                broken = fault != "none" and site < n_faulty
                jitter = 0.25 * (site / (n_sites - 1) - 0.5)
                ax.scatter(x + jitter, trust, s=18, color="tab:red" if broken else "0.5", zorder=3 if broken else 2)
    ax.axhline(0.5, color="k", lw=0.6, ls="--")
    ax.set_xticks(range(len(columns)), ["no fault" if f == "none" else f"{f} ×{n_faulty}" for f in columns])
    ax.set_ylabel("site trust over the fit")
    ax.set_title(f"{rule}: faulty sites (red), honest sites (grey); dashed: down-weighting threshold", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.robust_aggregation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"profile quick {PROFILES['quick']} (default: full "
                                                             f"{PROFILES['full']})")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    parser.add_argument("--faulty", type=int, nargs="+", choices=(1, 2, 3), default=[1, 2],
                        help="numbers of faulty clients of 8 (default: 1 2)")
    parser.add_argument("--rules", nargs="+", choices=list(RULES), default=list(RULES))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--report-only", action="store_true", help="fit nothing: report the cached records")
    parser.add_argument("--protocol", choices=("tableone", "leftright"), default="tableone")
    parser.add_argument("--root-size", type=int, default=ROOT_SIZE,
                        help="left/right protocol: root-set trials of fltrust (cached fits do not record it: use "
                             "another --out for another size)")
    parser.add_argument("--out", type=Path, default=Path("results/robust-aggregation"))
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    profile = dict(PROFILES["quick" if args.quick else "full"])
    profile.update({k: v for k, v in (("seeds", args.seeds), ("rounds", args.rounds)) if v is not None})
    args.out.mkdir(parents=True, exist_ok=True)
    log_file = args.out / "robust.log"
    with console_and_log(log_file):
        command = "python -m benchmarks.robust_aggregation " + shlex.join(argv)
        log.info(f"command: {command.strip()}\nmachine: {machine()}\nprofile: {profile}")
        loaded = load_offline_physionet(log.info)
        if loaded is None:
            return 1
        protocol, _, covariances, y, subjects = loaded
        per_client = 2
        if args.protocol == "leftright":
            (data, root), per_client = load_left_right(args.out / "leftright.npz"), SUBJECTS_PER_CLIENT
        else:
            data = (covariances, y, subjects)
            root = load_root_set() if "fltrust" in args.rules else None
        runs = [(rule, fault, n, seed) for seed in range(profile["seeds"])
                for fault, n in scenarios(args.faults, args.faulty) for rule in args.rules
                if fault != DROPPED or rule == "projavg"]
        path = {run: args.out / ("__".join(map(str, run)) + f"__T{profile['rounds']}.json") for run in runs}
        todo = [] if args.report_only else [run for run in runs if not path[run].exists()]
        log.info(f"{len(todo)} of {len(runs)} fits to run ({args.jobs} in parallel)")
        start = time.perf_counter()
        for record in Parallel(n_jobs=args.jobs, return_as="generator_unordered")(
                delayed(fit_scenario)(protocol, data, *run, profile["rounds"], log_file, root, per_client,
                                      args.root_size)
                for run in todo):
            run = (record["rule"], record["fault"], record["n_faulty"], record["seed"])
            path[run].write_text(json.dumps(record))
            log.info(f"{run}: macro-F1 {100 * record['f1']:.1f} (best round {record['best_round']}, "
                     f"{record['cpu_seconds']:.0f} s CPU)")
        records = [json.loads(path[run].read_text()) for run in runs if path[run].exists()]
        text = "\n".join([
            f"Test macro-F1 (%), mean over seeds 0–{profile['seeds'] - 1}, {profile['rounds']} rounds; PhysionetMI "
            + ("16 subjects, 8 clients of 2, 4 classes" if per_client == 2 else
               f"left/right, subjects 16–39, 8 clients of 3, root set of {args.root_size} public trials")
            + "; FedSPDnet with server momentum; ×n: n faulty clients of 8.", "",
            report(records, args.rules, args.faults, args.faulty), "",
            *[restated_report(records, args.rules, args.faults, n) + "\n" for n in sorted(args.faulty)],
            "Best-validation round (median over fits; convergence check): " + ", ".join(
                f"{rule} {np.median([r['best_round'] for r in records if r['rule'] == rule]):.0f}"
                for rule in args.rules) + f" of {profile['rounds']}.", "",
            f"Command: `{command.strip()}` — {(time.perf_counter() - start) / 60:.1f} min wall; {machine()}."])
        log.info("\n" + text)
        (args.out / "report.md").write_text(text + "\n")
        if records:
            figure(records, args.rules, args.faults, args.faulty, args.out / "robust_aggregation.png")
            if "fltrust" in args.rules:
                trust_figure(records, "fltrust", args.faults, max(args.faulty), args.out / "fltrust_trust.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
