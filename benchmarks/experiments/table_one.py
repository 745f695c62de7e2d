"""Table I: the FedSPDnet paper's protocol, and the package's models beside it.

FedSPDnet vs centralized SPDnet, federated EEGNet and pyRiemann. The protocol of the FedSPDnet paper (section IV, Table I, Figures 3-4) on PhysionetMI (the
offline copy in ../shared/data, 4 classes, clients of 2 subjects) and Weibo2014 (through
MOABB's download in the full profile; the quick profile skips datasets that are not on
disk), plus an unseen-subject table from MOABB's CrossSubjectEvaluation (full profile).
On the same splits, the package's single models: SPDnetClassifier() given the subjects
(per-subject domain batch norm; beside it fitted without them), and federated with domain
batch norm and server momentum; every row is reported with its difference to TS+LR paired
over seeds (splits). The recommended configurations (TS+LR on OAS covariances for pooled
subjects, five federations for federated sites) and the best ensemble are read from the
learner-leads record of the same splits (the quick profile's PhysionetMI): five federations a
split would take the main job past its budget.

    python -m benchmarks.experiments table-one --jobs 2          # main job (make experiment):
                                  # quick profile, 8 subjects, 450 rounds (converged), 1 seed
                                  # (8 centralized, 4 recommended federated)
    python -m benchmarks.experiments table-one --full --jobs 2   # the paper's budget
                                  # (make experiment-full): 16 subjects, 10 seeds, 150 rounds
    python -m benchmarks.experiments table-one --classes 2 --subjects 1 2 3 4   # left / right hand

Every (dataset, cell, seed) result is stored as JSON under --out with the configuration it
was fitted with; a re-run skips what is done (and refits what another configuration left),
so a long run can be resumed or re-run per cell (--only). Library output goes to
<out>/experiment.log; the console gets the table, the figure's path and the headline. A
whole profile's run writes its record, benchmarks/records/data/tableone-<profile>-<dataset>.json.

The pieces, by role (in benchmarks/experiments/): table_one_protocols.py (per-dataset
hyper-parameters, the training schedule, budgets and the estimators they build),
table_one_cells.py (the cells of the table), table_one_runner.py (fitting a cell, the JSON
cache of records, MOABB's unseen-subject table), table_one_report.py (tables, targets,
convergence, headline, figure, record) and console.py (console vs log file); this module is
the command line.
"""

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path

from .._machine import machine_line
from ..records.store import read_record, record_path
from . import table_one_protocols
from .console import console_and_log
from .data import prepare_data_folders
from .table_one_cells import select
from .table_one_protocols import PROFILES
from .table_one_report import (
    convergence,
    headline,
    paired_table,
    plot_curves,
    recorded_recommended,
    table_one,
    targets,
    write_table_one_record,
)
from .table_one_runner import run_protocol

#: The record of the recommended configurations on the quick profile's PhysionetMI splits.
RECOMMENDED_RECORD = "learner-leads"
#: Its rows over those splits and eight new ones.
WIDER_RECORD = "learner-leads-16-seeds"

log = logging.getLogger(__name__)

PROG = "python -m benchmarks.experiments table-one"


#: The datasets of the paper's Table I.
DATASETS = ("PhysionetMI", "Weibo2014")


def add_arguments(parser, datasets=DATASETS):
    """The options of the experiment."""
    parser.add_argument("--full", action="store_true", help="the paper's budget (10 seeds, 150 rounds)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="budget profile (default quick; --full means full; smoke checks the plumbing)")
    parser.add_argument("--datasets", nargs="+", choices=sorted(datasets), default=sorted(datasets))
    parser.add_argument("--classes", type=int, choices=(4, 2), default=4,
                        help="PhysionetMI: 4 classes, or 2 (left / right hand)")
    parser.add_argument("--subjects", nargs="+", type=int, default=None,
                        help="PhysionetMI subjects (default: the profile's; quick: 8 of the offline copy, "
                             "full: its 16; others come from MOABB's download)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="override the profile's rounds (every model; centralized: rounds x 2 epochs)")
    parser.add_argument("--seeds", type=int, default=None, help="override the profile's seeds (every model)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default results/experiment-<profile>)")
    parser.add_argument("--only", nargs="*", help="run only cells whose key starts/ends with these "
                                                  "(e.g. centralized eegnet)")
    parser.add_argument("--jobs", type=int, default=1, help="runs fitted in parallel processes (default 1)")
    parser.add_argument("--skip-unseen", action="store_true", help="skip the MOABB unseen-subject tables")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: build the report from the results already in --out")
    parser.add_argument("--no-record", action="store_true",
                        help="write no record (a run of a whole profile otherwise replaces "
                             "benchmarks/records/data/tableone-<profile>-<dataset>.json)")
    parser.add_argument("--docs", type=Path, default=None,
                        help="also write the report as <DOCS>/results-<profile>.md with its figures")


def check(parser, args):
    """Refuse impossible options through ``parser.error``; ``args.cells``: the cells to run."""
    for option in ("jobs", "rounds", "seeds"):
        if getattr(args, option) is not None and getattr(args, option) < 1:
            parser.error(f"--{option} must be at least 1, got {getattr(args, option)}")
    try:
        args.cells = select(args.only)
    except ValueError as error:
        parser.error(str(error))
    return args


def parse(argv, datasets):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, datasets)
    return parser, check(parser, parser.parse_args(argv))


def main(argv=None, datasets=None):
    """Run the experiment; ``datasets`` (name -> Protocol) replaces the paper's (tests)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, args = parse(argv, DATASETS if datasets is None else datasets)
    return run_experiment(parser, args, " ".join([PROG, *argv]), datasets)


def run(args):
    """``python -m benchmarks.experiments table-one``: exits with the experiment's status."""
    parser = argparse.ArgumentParser(prog=PROG)
    sys.exit(run_experiment(parser, check(parser, args), " ".join([PROG, *sys.argv[2:]])))


def run_experiment(parser, args, command, datasets=None):
    """Run the experiment of ``args`` (checked by :func:`check`); ``command``: how it was called."""
    start = time.perf_counter()
    custom = datasets is not None
    profile = args.profile or ("full" if args.full else "quick")
    budget = PROFILES[profile]
    if args.rounds:
        budget = dataclasses.replace(budget, rounds=args.rounds, eegnet_rounds=args.rounds, unseen_rounds=args.rounds,
                                     recommended_rounds=args.rounds)
    if args.seeds:
        budget = dataclasses.replace(budget, seeds=args.seeds, eegnet_seeds=args.seeds, centralized_seeds=None,
                                     recommended_seeds=None)
    out = args.out or Path("results") / f"experiment-{profile}"
    log_file = out / "experiment.log"
    with console_and_log(log_file):
        log.info(f"command: {command.strip()}\nmachine: {machine_line()}\nprofile: {profile} {budget}\n"
                 f"library output: {log_file}")
        prepare_data_folders()
        if not custom:
            try:
                datasets = table_one_protocols.protocols(args.classes, args.subjects or budget.subjects)
            except ValueError as error:
                parser.error(str(error))
        cached_at_start = len(list(out.glob("*/*.json")))
        done = {}
        for name in args.datasets:
            protocol = datasets[name]
            parts = run_protocol(protocol, budget, out / protocol.name, args.cells, args.report_only,
                                 args.skip_unseen, args.jobs, log_file=log_file)
            if parts is not None and parts[1]:
                done[protocol.name] = parts
            elif parts is not None:
                log.info(f"{protocol.name}: no results in {out / protocol.name}; nothing to report for it.")
        if not done:
            log.info("Nothing to report.")
            return 1
        text, figures, lines = report(done, budget, profile, out, command, args, time.perf_counter() - start)
        (out / "report.md").write_text(text + "\n")
        if args.docs:
            write_docs(args.docs, profile, text, figures)
        records = record_lines(args, custom, profile, datasets, done, budget, command.strip(),
                               time.perf_counter() - start, cached_at_start)
        log.info("\n" + text + "\n\n" + "\n".join(records + lines))
    return 0


def whole_profile(args, custom):
    """Whether this run is its profile's experiment as is: the run a record stands for."""
    return not (custom or args.only or args.subjects or args.rounds or args.seeds or args.classes != 4
                or args.report_only or args.no_record)


def record_lines(args, custom, profile, datasets, done, budget, command, elapsed, cached_at_start):
    """Write each dataset's record (a whole-profile run only); the lines that say where, or why not."""
    if not whole_profile(args, custom):
        return ["Record: none written (a record stands for a whole profile's run: no --only, --subjects, "
                "--classes, --rounds, --seeds, --report-only or --no-record)."]
    lines = []
    for name, (_, results, _) in done.items():
        path = write_table_one_record(profile, datasets[name], results, budget, command, elapsed, cached_at_start)
        lines.append(f"Record: {path} ({elapsed / 60:.1f} min wall, {cached_at_start} runs cached at the start)")
    return lines


def report(done, budget, profile, out, command, args, elapsed):
    """The report (Markdown), the figures and the closing console lines (figure, headline)."""
    tables = {(name, label): results for name, (label, results, _) in done.items()}
    figures = {}
    for name, (_, results, _) in done.items():
        figures[name] = out / name / f"{name}_val_f1.png"
        plot_curves(name, results, figures[name])
    text = ["## Table I protocol", "", table_one(tables, budget), "", "Targets:",
            "\n".join(targets(name, results) for (name, _), results in tables.items()), "",
            "## Paper protocol and the package's models against TS+LR", "", paired_table(tables), "",
            "## Convergence", "", convergence(tables)]
    for name, (_, _, unseen) in done.items():
        if unseen:
            text += ["", f"## Unseen subjects: {name}", "", unseen]
    if budget.unseen_folds == 0:
        text += ["", f"Unseen-subject table (MOABB CrossSubjectEvaluation): not in the {profile} profile "
                     f"(`--full`)."]
    wider = read_record(WIDER_RECORD) if record_path(WIDER_RECORD).exists() else None
    recorded = {name: recorded_recommended(read_record(RECOMMENDED_RECORD), wider)
                if (profile, name, budget.centralized_seeds) == ("quick", "PhysionetMI", 8)
                and record_path(RECOMMENDED_RECORD).exists() else "" for (name, _) in tables}
    for name, sentence in recorded.items():
        if sentence:
            text += ["", f"## Recommended configurations: {name}", "", sentence.strip()]
    runs = [r for results in tables.values() for records in results.values() for r in records]
    fit_minutes = sum(r["fit_seconds"] for r in runs) / 60
    timing = "report rebuilt from the cached runs" if args.report_only else f"this invocation {elapsed / 60:.1f} min"
    text += ["", f"Command: `{command.strip()}` — {timing}; fit time summed over the {len(runs)} runs of Table I: "
                 f"{fit_minutes:.1f} min; {machine_line()}."]
    seeds = f"{budget.seeds} seed{'s' if budget.seeds > 1 else ''}" + (
        f" ({budget.eegnet_seeds} for EEGNet)" if budget.eegnet_seeds != budget.seeds else "") + (
        f" ({budget.centralized_seeds} for the centralized rows but EEGNet)"
        if budget.centralized_seeds not in (None, budget.seeds) else "") + (
        f" ({budget.recommended_seeds} for the recommended federation)"
        if budget.recommended_seeds not in (None, budget.seeds) else "")
    seeds += f", {budget.rounds} rounds" + (
        f" ({budget.recommended_rounds} for the recommended federation)"
        if budget.recommended_rounds != budget.rounds else "")
    lines = ["Figure" + ("s" if len(figures) > 1 else "") + ": " + ", ".join(str(f) for f in figures.values()),
             "Headline: " + " | ".join(headline(name, results, seeds, recorded[name])
                                       for (name, _), results in tables.items())]
    return "\n".join(text), figures, lines


def write_docs(docs, profile, text, figures):
    docs.mkdir(parents=True, exist_ok=True)
    links = []
    for name, figure in figures.items():
        target = docs / f"{name}_val_f1_{profile}.png"
        target.write_bytes(figure.read_bytes())
        links.append(f"![{name} validation F1]({target.name})")
    (docs / f"results-{profile}.md").write_text(text + "\n\n" + "\n\n".join(links) + "\n")
