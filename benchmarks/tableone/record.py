"""The record of a Table I run (``benchmarks/records/data/tableone-<profile>-<dataset>.json``):
every cell's test scores per seed, for the docs to compute their figures from."""

from ..records.store import write_record
from .report import TS_LR


def record_name(profile, dataset):
    return f"tableone-{profile}-{dataset.lower()}"


def write_table_one_record(profile, protocol, results, budget, command, wall_seconds, cached_at_start):
    """Write the record of ``protocol``'s cells (``{cell: [run records]}``); returns its path."""
    rows = {cell.key: {"label": cell.label,
                       "scores": {"macro_f1": {r["seed"]: 100 * r["f1"] for r in runs},
                                  "accuracy": {r["seed"]: 100 * r["accuracy"] for r in runs}}}
            for cell, runs in results.items()}
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
                        metrics={"macro_f1": "test macro-F1 (%)", "accuracy": "test accuracy (%)"},
                        wall_seconds=wall_seconds, facts=facts)
