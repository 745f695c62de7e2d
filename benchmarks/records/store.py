"""Records: one small JSON file per experiment, tracked in ``benchmarks/records/data``.

A record holds the per-seed (or per-subject) scores of every row of an experiment, with
the exact command, the package version, the commit of the checkout that ran it (and whether
its tracked files differed from it), the versions of the libraries the results depend on,
the machine, the date and the wall time: the time from the run's start to its end, never a
sum of fit times (a record that keeps one names it among its facts). The docs compute their
figures from it (:mod:`.render`); a re-run of the experiment replaces it. Records written
before a field existed lack it, and the pages say "not recorded" for it.

Layout::

    {"name": "tableone-quick", "title": ..., "command": ..., "package": "0.2.0",
     "commit": {"sha": "04717d3...", "dirty": false},
     "versions": {"numpy": "2.4.6", ..., "Flower": "1.42.0"},
     "date": "2026-12-02T06:30:00+00:00", "machine": {"cpu": ..., "cores": 2, ...},
     "wall_seconds": 812.3, "paired_by": "seed", "reference": "centralized/ts-lr",
     "metrics": {"macro_f1": "test macro-F1 (%)", ...},
     "rows": {"centralized/ts-lr": {"label": "TS+LR", "scores": {"macro_f1": {"0": 69.1, ...}}}},
     "facts": {"subjects": 8, ...}}
"""

import datetime
import json
from pathlib import Path

from .._machine import code_commit, library_versions, machine_facts

#: Where the tracked records live.
RECORDS = Path(__file__).parent / "data"


def record_path(name, folder=RECORDS):
    return Path(folder) / f"{name}.json"


def write_record(name, *, title, command, rows, metrics, reference, paired_by, wall_seconds, facts=None,
                 folder=RECORDS, measured_on=None):
    """Write (or replace) the record ``name``; returns its path.

    ``rows``: ``{row key: {"label": str, "scores": {metric: {unit: value}}}}``, a unit being
    a seed or a subject (the pairing of ``paired_by``); ``metrics``: ``{metric: description}``;
    ``reference``: the row every other row is compared with, unit by unit; ``wall_seconds``:
    the run's elapsed wall time (a sum of fit times belongs in ``facts``, under its own name;
    None where no one run made the record, such as a combination of separate runs).
    The commit (:func:`~benchmarks._machine.code_commit`, taken when the run started) and the library versions
    (:func:`~benchmarks._machine.library_versions`) are those of the running checkout.
    """
    import skfedspd

    if reference not in rows:
        raise ValueError(f"reference row {reference!r} is not among the rows {sorted(rows)}")
    record = {
        "name": name, "title": title, "command": command, "package": skfedspd.__version__,
        "commit": code_commit(), "versions": library_versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "machine": measured_on or machine_facts(),
        "wall_seconds": None if wall_seconds is None else round(float(wall_seconds), 1),
        "paired_by": paired_by, "reference": reference, "metrics": dict(metrics),
        "rows": {key: {"label": row["label"],
                       "scores": {m: {str(u): float(v) for u, v in row["scores"][m].items()}
                                  for m in metrics}}
                 for key, row in rows.items()},
        "facts": dict(facts or {}),
    }
    path = record_path(name, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(record))
    return path


def dumps(record):
    """The record as JSON text, one line per field and per row (small diffs when a re-run
    replaces it)."""
    def field(key, value, indent):
        return f"{indent}{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}"

    rows = ",\n".join(field(key, row, "  ") for key, row in record["rows"].items())
    fields = [field(key, value, " ") if key != "rows" else f' "rows": {{\n{rows}\n }}'
              for key, value in record.items()]
    return "{\n" + ",\n".join(fields) + "\n}\n"


def read_record(name, folder=RECORDS):
    """The record ``name`` as a dict; FileNotFoundError names the command that writes it."""
    path = record_path(name, folder)
    if not path.exists():
        raise FileNotFoundError(f"no record {name!r} in {folder}: run the experiment that writes it")
    return json.loads(path.read_text())


def record_names(folder=RECORDS):
    return sorted(p.stem for p in Path(folder).glob("*.json"))
