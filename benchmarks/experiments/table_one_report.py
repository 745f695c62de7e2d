"""The report of Table I (``table-one``): tables, targets, convergence, the headline, the figure,
and the record (``benchmarks/records/data/tableone-<profile>-<dataset>.json``: every cell's test
scores per seed, for the docs to compute their figures from)."""

import numpy as np

from ..records.paired import paired_difference
from ..records.store import write_record
from .table_one_cells import CELLS, SERVER_MOMENTUM, Cell
from .table_one_protocols import LOCAL_EPOCHS

TS_LR = Cell("centralized", "ts-lr")
FED_TS_LR = Cell("full", "fed-ts-lr")
MDM = Cell("centralized", "mdm")
SPDNET = Cell("centralized", "spdnet")
EEGNET = Cell("centralized", "eegnet")
FED = {(s, a): Cell(s, "spdnet", a) for s in ("full", "half") for a in ("projavg", "rlavg")}
FEDEEG = {s: Cell(s, "eegnet", "projavg") for s in ("full", "half")}
#: FedSPDnet ProjAvg with the recommended server optimizer (rows beside the paper's).
FEDSM = {s: Cell(f"{s}+sm", "spdnet", "projavg") for s in ("full", "half")}
#: The package's recommended configuration, on the same splits as the paper's rows.
RECOMMENDED = {"spdnet": Cell("centralized", "spdnet-default"), "domain": Cell("centralized", "spdnet-domain"),
               "federated": Cell("full+sm", "spdnet-domain", "projavg")}
#: Width of the window (in rounds) over which the convergence table measures the late gain.
LATE_WINDOW = 20


def fmt(records, field="f1"):
    """``"66.4 ± 3.3"``: mean ± sample standard deviation over seeds (the mean alone for one
    seed), as the docs compute it from the record."""
    values = 100 * np.array([r[field] for r in records])
    return f"{values.mean():.1f}" + (f" ± {values.std(ddof=1):.1f}" if len(values) > 1 else "")


def mean_f1(results, cell):
    return 100 * np.mean([r["f1"] for r in results[cell]]) if cell in results else float("nan")


def table_one(tables, budget):
    """Table I: dataset x {Centr., Full, Half}, EEGNet and SPDnet (ProjAvg; RLAvg beside),
    then the centralized references on the same splits."""
    lines = ["| Dataset | Setting | EEGNet (FedAvg) | SPDnet (FedSPDnet, ProjAvg) | SPDnet (FedSPDnet, RLAvg) |",
             "| --- | --- | --- | --- | --- |"]
    for (name, label), results in tables.items():
        def cell(c):
            return fmt(results[c]) if c in results else "–"

        def params(model):
            return next((r["n_params"] for c, rs in results.items() if c.model == model for r in rs if r["n_params"]),
                        "–")

        lines.append(f"| {label} | # params | {params('eegnet')} | {params('spdnet')} | {params('spdnet')} |")
        rows = (("Centr.", (EEGNET, SPDNET, SPDNET)),
                ("Full", (FEDEEG["full"], FED["full", "projavg"], FED["full", "rlavg"])),
                ("Half", (FEDEEG["half"], FED["half", "projavg"], FED["half", "rlavg"])))
        for row, cells in rows:
            scores = [mean_f1(results, c) for c in cells]
            best = np.nanmax(scores) if not np.isnan(scores).all() else None
            shown = [f"**{cell(c)}**" if v == best else cell(c) for c, v in zip(cells, scores)]
            lines.append(f"| {name} | {row} | " + " | ".join(shown) + " |")
        for setting, sm in FEDSM.items():
            if sm in results:
                lines.append(f"| {name} | {setting.capitalize()} + server momentum | – | {cell(sm)} | – |")
    lines += ["", f"Test macro-F1 (%), mean ± sample standard deviation over seeds. SPDnet budget {budget.rounds} rounds x {LOCAL_EPOCHS} "
                  f"epochs (centralized: <= {budget.rounds * LOCAL_EPOCHS} epochs, early stopping 75), EEGNet "
                  f"{budget.eegnet_rounds} rounds x {LOCAL_EPOCHS} epochs; best per row in bold. \"+ server "
                  f"momentum\": FedSPDnet ProjAvg with server_optimizer=ServerMomentum(lr={SERVER_MOMENTUM['lr']}, "
                  f"momentum={SERVER_MOMENTUM['momentum']}) (FedAvgM on the Stiefel manifold), the rest as the row "
                  f"above; the paper's rows keep the aggregate as the server step."]
    for (name, _), results in tables.items():
        lines += ["", f"{name} seeds per cell: " + ", ".join(f"{c.key} {len(v)}" for c, v in results.items())
                  + ". Accuracy (%): " + "; ".join(f"{c.key} {fmt(v, 'accuracy')}" for c, v in results.items()) + "."]
    lines += ["", "Centralized references on the same splits (test macro-F1 %):", "",
              "| Dataset | TS + LR (pyRiemann) | MDM (pyRiemann) | SPDnet | EEGNet |", "| --- | --- | --- | --- | --- |"]
    for (name, _), results in tables.items():
        lines.append(f"| {name} | " + " | ".join(fmt(results[c]) if c in results else "–"
                                                 for c in (TS_LR, MDM, SPDNET, EEGNET)) + " |")
    return "\n".join(lines)


def targets(name, results):
    def m(cell):
        return mean_f1(results, cell)

    full, half = FED["full", "projavg"], FED["half", "projavg"]
    return "\n".join([
        f"- {name}: FedSPDnet Full / centralized SPDnet: {m(full) / m(SPDNET):.1%} (target >= 92 %)",
        f"- {name}: FedSPDnet - FedEEGNet, Full: {m(full) - m(FEDEEG['full']):+.1f} points; "
        f"Half: {m(half) - m(FEDEEG['half']):+.1f} points (target > 0 at equal budget)",
        f"- {name}: Half - Full (ProjAvg): {m(half) - m(full):+.1f} points (target within 1.5)",
        f"- {name}: ProjAvg - RLAvg: Full {m(full) - m(FED['full', 'rlavg']):+.1f}, "
        f"Half {m(half) - m(FED['half', 'rlavg']):+.1f} points (target within 1)",
        f"- {name}: FedSPDnet Full + server momentum / centralized SPDnet: {m(FEDSM['full']) / m(SPDNET):.1%} "
        f"(target >= 95 %); Half - Full with server momentum: {m(FEDSM['half']) - m(FEDSM['full']):+.1f} points "
        f"(target within 2)",
    ])


def late_gain(curve, window=LATE_WINDOW):
    """Validation macro-F1 (points) of the last ``window`` rounds minus the ``window`` before:
    about 0 once a run has converged."""
    curve = 100 * np.asarray(curve, dtype=float)
    if len(curve) < 2 * window:
        return float("nan")
    return float(curve[-window:].mean() - curve[-2 * window:-window].mean())


def convergence(tables):
    """Per network cell: rounds (epochs) run, where the kept model was, how much the
    validation score still moved at the end, and learning-rate halvings."""
    lines = ["| Dataset | cell | rounds (epochs) run | best-validation round | late gain (points) | "
             "final val. macro-F1 | LR halvings |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for (name, _), results in tables.items():
        for cell, records in results.items():
            if not cell.network:
                continue
            ran = ", ".join(sorted({str(len(r["lr"])) for r in records}))
            curves = [r["curve"] for r in records if r["curve"]]
            if not curves:  # no validation part held out: the last model was kept
                lines.append(f"| {name} | {cell.label} | {ran} | last (no validation part) | – | – | – |")
                continue
            best = np.mean([int(np.argmax(c)) + 1 for c in curves])
            gains = [late_gain(c) for c in curves]
            final = np.mean([100 * np.mean(c[-LATE_WINDOW:]) for c in curves])
            halvings = ", ".join(str(int(np.sum(np.diff(r["lr"]) < 0))) for r in records)
            gain = "–" if np.isnan(gains).any() else f"{np.mean(gains):+.1f} ± {np.std(gains):.1f}"
            lines.append(f"| {name} | {cell.label} | {ran} | {best:.0f} | {gain} | {final:.1f} | {halvings} |")
    lines += ["", f"Late gain: mean validation macro-F1 of the last {LATE_WINDOW} rounds (epochs) minus the "
                  f"{LATE_WINDOW} before, mean ± std over seeds; near 0 when converged. Centralized networks stop "
                  f"after 75 epochs without a better validation score (the paper's rule): a positive late gain "
                  f"there means they stopped while still improving."]
    return "\n".join(lines)


def versus_ts_lr(results, cell):
    """``(mean, standard error, wins, n)`` of ``cell``'s test macro-F1 (points) minus TS+LR's,
    paired by seed: a seed is one split of every client's data, so both rows saw the same
    test trials. None when no seed has both."""
    reference = {r["seed"]: 100 * r["f1"] for r in results.get(TS_LR, ())}
    row = {r["seed"]: 100 * r["f1"] for r in results.get(cell, ())}
    if not set(row) & set(reference):
        return None
    d = paired_difference(row, reference)
    return d.mean, d.se, d.higher, d.n


def with_difference(results, cell):
    """``"60.3 (+2.7 ± 1.0)"``: the row's mean and its paired difference to TS+LR ± SE
    (no SE from one seed)."""
    difference = versus_ts_lr(results, cell)
    if difference is None:
        return f"{mean_f1(results, cell):.1f}"
    mean, se, _, n = difference
    return f"{mean_f1(results, cell):.1f} ({mean:+.1f}" + (f" ± {se:.1f})" if n > 1 else ", 1 seed)")


def paired_table(tables):
    """Every row against TS+LR on the same splits: the paper's protocol, then the package's
    recommended configuration."""
    lines = ["| Dataset | configuration | row | test macro-F1 (%) | seeds | − TS+LR, paired (points ± SE) | "
             "higher on |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for (name, _), results in tables.items():
        for cell, records in results.items():
            difference = versus_ts_lr(results, cell)
            if cell == TS_LR or difference is None:
                continue
            mean, se, wins, n = difference
            spread = f" ± {se:.1f}" if n > 1 else ""
            lines.append(f"| {name} | {'package' if cell.recommended else 'paper'} | {cell.label} | "
                         f"{fmt(records)} | {len(records)} | {mean:+.1f}{spread} | {wins} of {n} |")
    lines += ["", "Each seed is one split (every client's own stratified 85/15 split) and one initialization; "
                  "a row's difference to TS+LR is paired over the seeds both have, mean ± standard error. "
                  "Package rows: `SPDnetClassifier()` given the subjects (its `\"auto\"` batch "
                  "norm is then domain batch norm: each subject a domain, each test subject predicted in its own "
                  "call), beside it the same estimator fitted without them; federated, the domain-BN local "
                  "model on the paper's clients with server momentum "
                  f"(ServerMomentum(lr={SERVER_MOMENTUM['lr']}, momentum={SERVER_MOMENTUM['momentum']})) "
                  "and a fresh client Adam every round (`client_optimizer_state=\"reset\"`), the rest the "
                  "package's defaults."]
    return "\n".join(lines)


#: The recommended configurations and the best ensemble, measured on the quick profile's
#: PhysionetMI splits by the learner-leads experiment, which the main job does not re-run
#: (five federations a split would take it past its budget). label -> row.
RECORDED_FEDERATIONS = "fedspdnet-domain-bn-server-momentum-5-training-seeds-probabilities-averaged"
RECORDED_RECOMMENDED = {
    "TS+LR on OAS covariances (pooled subjects)": "ts-lr-on-oas-covariances",
    "five SPDnetClassifier() given the subjects with TS+LR on OAS covariances":
        "spdnetclassifier-over-5-training-seeds-and-ts-lr-on-oas-covariances-probabilities-averaged",
    "five recommended federations (federated sites)": RECORDED_FEDERATIONS,
}
#: The federated classical baseline's row in that record.
RECORDED_FEDERATED_BASELINE = "federatedtangentspacelr-the-federated-classical-baseline"


def recorded_recommended(record, wider=None):
    """The headline's sentence on the recommended configurations, read from the learner-leads
    ``record`` (the same splits), with its command; each row against the record's TS+LR; then
    the same rows of ``wider`` (a record over these splits and new ones), where given."""
    from ..records import render

    def scored(source):
        return ", ".join(f"{label} {render.mean(source, row)} ({render.difference(source, row)}: "
                         f"{render.reading(source, row)})" for label, row in RECORDED_RECOMMENDED.items()
                         if row in source["rows"])

    rows = scored(record)
    more = "" if wider is None else (
        f" Over {len(render.scores(wider, wider['reference'], 'macro_f1'))} splits, these and new ones (record "
        f"{wider['name']}): {scored(wider)}.")
    return (f" Recommended configurations and the best ensemble, ensembles' probabilities averaged (record "
            f"{record['name']} on these splits, {len(render.scores(record, record['reference'], 'macro_f1'))} "
            f"seeds, `{record['command']}`; not re-run by this job): {rows}; the five federations against the "
            f"federated classical baseline on the same clients "
            f"{render.pair(record, RECORDED_FEDERATIONS, RECORDED_FEDERATED_BASELINE)}.{more}")


def headline(name, results, seeds, recorded=""):
    """One line: the paper's protocol (FedSPDnet, centralized SPDnet, FedEEGNet) and the
    package's single models, each row with its paired difference to TS+LR, then
    ``recorded`` (:func:`recorded_recommended`, where the dataset has that record)."""
    def v(cell):
        return with_difference(results, cell)

    momentum = f", with server momentum {v(FEDSM['full'])}" if FEDSM["full"] in results else ""
    line = (f"{name} test macro-F1 (%), {seeds}; in brackets the difference to TS+LR paired over seeds ± SE. "
            f"Paper protocol: FedSPDnet (full, ProjAvg) {v(FED['full', 'projavg'])}{momentum}, centralized SPDnet "
            f"{v(SPDNET)}, FedEEGNet (full) {v(FEDEEG['full'])}.")
    if any(cell in results for cell in RECOMMENDED.values()):
        line += (f" Single models: SPDnetClassifier() given the subjects (domain BN) "
                 f"{v(RECOMMENDED['domain'])}, FedSPDnet + domain BN + server momentum "
                 f"{v(RECOMMENDED['federated'])}; SPDnetClassifier() without the subjects "
                 f"{v(RECOMMENDED['spdnet'])}.")
    if FED_TS_LR in results:
        line += f" Federated classical baseline: FedRecenter+TS+LR {v(FED_TS_LR)}."
    n = len(results.get(TS_LR, ()))
    return line + f" TS+LR {mean_f1(results, TS_LR):.1f} ({n} seed{'s' if n != 1 else ''})." + recorded


def plot_curves(name, results, path):
    """Validation macro-F1 against round, mean ± std over seeds (the paper's Figures 3-4)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, setting in zip(axes, ("full", "half")):
        for cell in (c for c in CELLS if c.federated and c.setting.split("+")[0] == setting):
            records = [r for r in results.get(cell, ()) if r["curve"]]
            if not records:
                continue
            length = min(len(r["curve"]) for r in records)
            curves = 100 * np.array([r["curve"][:length] for r in records])
            rounds = np.arange(1, length + 1)
            model = cell.label.split(" (")[0] + (" + server momentum" if cell.server_optimized else "")
            ax.plot(rounds, curves.mean(0), label=f"{model} ({len(records)} seeds)")
            ax.fill_between(rounds, curves.mean(0) - curves.std(0), curves.mean(0) + curves.std(0), alpha=0.25)
        ax.set_title(f"{name}, {'100' if setting == 'full' else '50'} % participation")
        ax.set_xlabel("communication round")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation macro-F1 (%)")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def record_name(profile, dataset):
    return f"tableone-{profile}-{dataset.lower()}"


#: The metrics of a record of Table I runs, per seed.
SEED_METRICS = {"macro_f1": "test macro-F1 (%)", "accuracy": "test accuracy (%)"}


def seed_scores(runs):
    """``{metric: {seed: score in %}}`` of a cell's run records: a record row's scores."""
    return {"macro_f1": {r["seed"]: 100 * r["f1"] for r in runs},
            "accuracy": {r["seed"]: 100 * r["accuracy"] for r in runs}}


def write_table_one_record(profile, protocol, results, budget, command, wall_seconds, cached_at_start):
    """Write the record of ``protocol``'s cells (``{cell: [run records]}``); returns its path."""
    rows = {cell.key: {"label": cell.label, "scores": seed_scores(runs)} for cell, runs in results.items()}
    runs = [r for rs in results.values() for r in rs]
    n_params = {cell.key: rs[0]["n_params"] for cell, rs in results.items() if rs[0]["n_params"]}
    facts = {"profile": profile, "dataset": protocol.name, "subjects": list(protocol.subjects or ()),
             "clients": len(protocol.subjects or ()) // 2, "rounds": budget.rounds,
             "recommended_rounds": budget.recommended_rounds, "runs": len(runs),
             "runs_cached_at_start": cached_at_start,
             "fit_minutes": round(sum(r["fit_seconds"] for r in runs) / 60, 1), "parameters": n_params}
    return write_record(record_name(profile, protocol.name),
                        title=f"Table I protocol and recommended configuration, {protocol.name}, {profile} profile",
                        command=command, rows=rows, reference=TS_LR.key, paired_by="seed",
                        metrics=SEED_METRICS, wall_seconds=wall_seconds, facts=facts)
