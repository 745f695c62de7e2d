"""Records of the speed scripts (``benchmarks/bench_*.py``): one row per variant, one unit per
interleaved repetition.

A speed script times its variants in interleaved repetitions (every variant once per
repetition, in a rotated order), so repetition ``r`` of one variant and repetition ``r`` of
another ran side by side under the same machine load: the record pairs them by
``repetition``, and its reference is the baseline variant. The page quotes medians and
ratios of medians (:mod:`.render`: ``median``, ``ratio``, ``median-table``); scalars that are
not per repetition (peak memory, gradient errors, a derived speed-up) are facts.
"""

import shlex
import sys
import time
from pathlib import Path

from .store import RECORDS, write_record

ROOT = Path(__file__).resolve().parents[2]


def add_record_option(parser, default):
    """``--record NAME`` (default ``default``; ``none``: write no record)."""
    parser.add_argument("--record", default=default,
                        help="record written to benchmarks/records/data/NAME.json ('none': no record)")


def script_command(argv=None):
    """The command that ran this script, from the repository root: ``python benchmarks/bench_x.py --reps 7``."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join(["python", script.as_posix(), *argv[1:]])


def write_speed_record(name, *, title, times, reference, started, labels=None, metric="ms",
                       description="milliseconds per step", facts=None, command=None, folder=RECORDS):
    """Write the record ``name`` of a speed script (nothing when ``name`` is None or ``"none"``);
    returns its path.

    ``times``: ``{variant: [value of repetition 0, 1, ...]}`` (or ``{variant: {unit: value}}``);
    ``reference``: the baseline variant; ``labels``: ``{variant: label}`` (the key by default);
    ``started``: ``time.perf_counter()`` at the script's start (the record's wall time).
    Values are kept to 6 significant digits.
    """
    if name in (None, "none"):
        return None
    labels = labels or {}
    rows = {}
    for key, values in times.items():
        values = values if isinstance(values, dict) else dict(enumerate(values))
        rows[key] = {"label": labels.get(key, key),
                     "scores": {metric: {str(u): float(f"{float(v):.6g}") for u, v in values.items()}}}
    path = write_record(name, title=title, command=command or script_command(), rows=rows,
                        metrics={metric: description}, reference=reference, paired_by="repetition",
                        wall_seconds=time.perf_counter() - started, facts=facts, folder=folder)
    print(f"record       : {path}")
    return path
