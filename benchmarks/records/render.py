"""Figures and tables computed from a record, and the marked blocks of the pages.

A page quotes a record through a marked block, inline or on several lines::

    <!-- record:tableone-quick-physionetmi difference centralized/spdnet-domain -->+2.7 ± 0.7<!-- /record -->

``record:NAME`` names the record, then a view and its arguments (:data:`VIEWS`). The text
between the markers is what the view renders from the record: ``python -m
benchmarks.records.render`` rewrites every block of :data:`PAGES` (``--check`` only says
which are stale), and the documentation build renders them again from the records.
"""

import math
import re
import sys
from pathlib import Path

import numpy as np

from .paired import paired_difference
from .store import read_record

ROOT = Path(__file__).resolve().parents[2]
#: The pages whose blocks are rendered: Markdown and reStructuredText, relative to ``ROOT``.
PAGES = ("README.md", "CHANGELOG.md", "docs/**/*.md", "docs/**/*.rst")
BLOCK = re.compile(r"<!-- record:(?P<name>\S+) (?P<view>[\w-]+)(?P<args>(?: [^\s>]+)*) -->(?P<body>.*?)<!-- /record -->",
                   re.DOTALL)
MINUS = "−"


def signed(value, digits=1):
    text = f"{value:+.{digits}f}"
    return text.replace("-", MINUS)


def scores(record, row, metric):
    if row not in record["rows"]:
        raise KeyError(f"record {record['name']!r} has no row {row!r}; rows: {sorted(record['rows'])}")
    return record["rows"][row]["scores"][metric]


def metric_of(record, metric):
    return metric or next(iter(record["metrics"]))


def mean(record, row, metric=None):
    """``66.2``: the row's mean over its units."""
    return f"{np.mean(list(scores(record, row, metric_of(record, metric)).values())):.1f}"


def mean_sd(record, row, metric=None):
    """``66.2 ± 4.4``: mean ± standard deviation over the units (the mean alone for one unit)."""
    values = np.array(list(scores(record, row, metric_of(record, metric)).values()))
    return f"{values.mean():.1f}" + (f" ± {values.std(ddof=1):.1f}" if len(values) > 1 else "")


def units(record, row, metric=None):
    """``8``: how many seeds (subjects) the row has."""
    return str(len(scores(record, row, metric_of(record, metric))))


#: The reading of a row whose model predicted one class for every trial (the record's fact
#: ``predicts_one_class`` lists it): its score is chance, not a utility to compare.
ONE_CLASS = "predicts one class (chance)"


def predicts_one_class(record, *rows):
    """Whether the record's fact ``predicts_one_class`` lists any of ``rows``."""
    return any(row in record["facts"].get("predicts_one_class", ()) for row in rows)


def worded(record, word, *rows):
    """``word`` ("higher" or "lower") with ``", one training seed"`` when a row is a model
    trained from one seed (the record's fact ``one_training_seed``) and the units are not
    seeds: its standard error is over subjects or folds, not over trainings."""
    seeded = record["facts"].get("one_training_seed", ())
    one_seed = record["paired_by"] != "seed" and any(row in seeded for row in rows)
    return f"{word}, one training seed" if one_seed and word in ("higher", "lower") else word


def versus_reference(record, row, metric=None):
    metric = metric_of(record, metric)
    return paired_difference(scores(record, row, metric), scores(record, record["reference"], metric))


def difference(record, row, metric=None):
    """``−0.2 ± 2.1``: the row minus the reference, paired by unit, ± standard error."""
    d = versus_reference(record, row, metric)
    return signed(d.mean) + (f" ± {d.se:.1f}" if d.n > 1 else f" (1 {record['paired_by']})")


def p_value(p):
    """``0.101``, ``< 0.001`` or ``–`` (no test: one unit, or every difference 0)."""
    if math.isnan(p):
        return "–"
    return f"{p:.3f}" if p >= 0.001 else "< 0.001"


def wilcoxon_text(p):
    """``Wilcoxon p = 0.101``, ``Wilcoxon p < 0.001`` or ``no Wilcoxon test``."""
    if math.isnan(p):
        return "no Wilcoxon test"
    return f"Wilcoxon p = {p:.3f}" if p >= 0.001 else "Wilcoxon p < 0.001"


def reading(record, row, metric=None):
    """``level``, ``higher`` or ``lower`` than the reference (beyond the t critical value times the
    standard error, :func:`~.paired.t_critical`); :data:`ONE_CLASS` when either row's model
    predicted one class."""
    if predicts_one_class(record, row, record["reference"]):
        return ONE_CLASS
    d = versus_reference(record, row, metric)
    if d.reading == "one unit":
        return f"one {record['paired_by']}, not resolved"
    return worded(record, d.reading, row, record["reference"])


def versus(record, row, metric=None):
    """``level with TS+LR``, ``higher than TS+LR``, ``lower than TS+LR`` (the reference's label)."""
    word = reading(record, row, metric)
    label = record["rows"][record["reference"]]["label"]
    if word == "level":
        return f"level with {label}"
    head, comma, tail = word.partition(",")  # "higher, one training seed"
    return f"{head} than {label}{comma}{tail}" if head in ("higher", "lower") else word


def comparison(record, row, metric=None):
    """``−0.2 ± 2.1, higher on 2 of 8 seeds, Wilcoxon p = 0.641: level``."""
    d = versus_reference(record, row, metric)
    if d.n < 2:
        return f"{difference(record, row, metric)}: {reading(record, row, metric)}"
    return (f"{difference(record, row, metric)}, higher on {d.higher} of {d.n} {record['paired_by']}s, "
            f"{wilcoxon_text(d.p)}: {reading(record, row, metric)}")


def pair(record, row, other, metric=None):
    """``+1.3 ± 0.8, higher on 19 of 40 subjects, Wilcoxon p = 0.120: level``: ``row − other``,
    paired by unit (any two rows, not only against the reference)."""
    metric = metric_of(record, metric)
    d = paired_difference(scores(record, row, metric), scores(record, other, metric))
    if d.n < 2:
        return f"{signed(d.mean)} (1 {record['paired_by']}): one {record['paired_by']}, not resolved"
    word = ONE_CLASS if predicts_one_class(record, row, other) else worded(record, d.reading, row, other)
    return (f"{signed(d.mean)} ± {d.se:.1f}, higher on {d.higher} of {d.n} {record['paired_by']}s, "
            f"{wilcoxon_text(d.p)}: {word}")


def cell(text):
    """``text`` as one cell of a Markdown table (a label such as ``"SPDnet | online"`` keeps its bar)."""
    return text.replace("|", "\\|")


def paired_table(record, metric=None):
    """The reference row, then every other row with its mean ± sd, units, and its paired
    comparison with the reference."""
    metric = metric_of(record, metric)
    unit = record["paired_by"]
    reference = cell(record["rows"][record["reference"]]["label"])
    lines = [f"| row | {record['metrics'][metric]} | {unit}s | − {reference}, paired (points ± SE) | higher on "
             f"| Wilcoxon p | reading |", "| --- | --- | --- | --- | --- | --- | --- |"]
    reference_first = sorted(record["rows"].items(), key=lambda item: item[0] != record["reference"])
    for key, row in reference_first:
        if key == record["reference"]:
            lines.append(f"| {cell(row['label'])} | {mean_sd(record, key, metric)} | {units(record, key, metric)} "
                         f"| | | | reference |")
            continue
        d = versus_reference(record, key, metric)
        lines.append(f"| {cell(row['label'])} | {mean_sd(record, key, metric)} | {units(record, key, metric)} | "
                     f"{difference(record, key, metric)} | {d.higher} of {d.n} | {p_value(d.p)} | "
                     f"{reading(record, key, metric)} |")
    lines += ["", f"Paired by {unit} over the {unit}s both rows have; \"level\": the difference is within the "
                  f"two-sided 95 % t critical value times its standard error of zero."]
    return "\n".join(lines)


def wall(record):
    """``12.3 min``: the wall time of the run that wrote the record (``wall time not recorded``
    for a record that kept only a sum of fit times)."""
    if record.get("wall_seconds") is None:
        return "wall time not recorded"
    return f"{record['wall_seconds'] / 60:.1f} min"


def command(record):
    return f"`{record['command']}`"


def machine(record):
    m = record["machine"]
    return f"{m['cpu']}, {m['cores']} cores, Python {m['python']}, torch {m['torch']}"


def commit(record):
    """``commit 04717d397e08`` (``, with uncommitted changes`` when its tree was dirty), ``not a
    git checkout``, or ``commit not recorded`` for a record written before records kept it."""
    if "commit" not in record:
        return "commit not recorded"
    if record["commit"] is None:
        return "not a git checkout"
    return f"commit {record['commit']['sha'][:12]}" + (", with uncommitted changes" if record["commit"]["dirty"] else "")


def versions(record):
    """``numpy 2.4.6, ..., Flower not installed``, or ``library versions not recorded``."""
    if "versions" not in record:
        return "library versions not recorded"
    return ", ".join(f"{name} {version or 'not installed'}" for name, version in record["versions"].items())


def provenance(record):
    """One line: command, wall time, date, package version and commit, library versions, machine
    and its load."""
    time = wall(record) if record.get("wall_seconds") is None else f"{wall(record)} wall"
    return (f"Record `{record['name']}`: {command(record)}, {time}, {record['date'][:10]}, "
            f"skfedspd {record['package']} ({commit(record)}; {versions(record)}), {machine(record)} "
            f"(load average {record['machine']['load_average']} when it finished).")


def fact(record, name):
    """A fact of the record (``subjects``, ``runs``, ``fit_minutes``, ...), as stored."""
    value = record["facts"][name]
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def significant(value, digits=3):
    """``4.02``, ``0.293``, ``153``, ``11593``: ``value`` to ``digits`` significant digits, or to the
    unit when it has more (no exponent)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    rounded = float(f"{value:.{digits - 1}e}")  # 99.96 -> 100.0: the digits of the rounded value
    if abs(rounded) >= 10 ** (digits - 1):
        return f"{value:.0f}"  # whole numbers keep their digits: 11593, not 11600
    return f"{rounded:.{max(0, digits - 1 - math.floor(math.log10(abs(rounded))))}f}"


def values_of(record, row, metric=None):
    return np.array(list(scores(record, row, metric_of(record, metric)).values()), dtype=float)


def median(record, row, metric=None):
    """``4.02``: the row's median over its units (interleaved repetitions of a speed record), 3
    significant digits."""
    return significant(float(np.median(values_of(record, row, metric))))


def ratio(record, row, other, metric=None):
    """``2.04×``: the row's median over the other row's median."""
    return significant(float(np.median(values_of(record, row, metric)) / np.median(values_of(record, other, metric)))) + "×"


def median_table(record, metric=None, part=None):
    """Every row (those whose key contains ``part``, when given) with its median, interquartile
    range and units, and its ratio to the reference (to the first row shown when the reference
    is not among them)."""
    metric = metric_of(record, metric)
    keys = [key for key in record["rows"] if part is None or part in key]
    reference = record["reference"] if record["reference"] in keys else keys[0]
    lines = [f"| variant | median, {record['metrics'][metric]} | IQR | {record['paired_by']}s "
             f"| / {record['rows'][reference]['label']} |", "| --- | --- | --- | --- | --- |"]
    for key in keys:
        q25, q75 = np.percentile(values_of(record, key, metric), [25, 75])
        lines.append(f"| {record['rows'][key]['label']} | {median(record, key, metric)} | {significant(q25)}–"
                     f"{significant(q75)} | {units(record, key, metric)} | {ratio(record, key, reference, metric)} |")
    return "\n".join(lines)


def reached(record, target, view, *args):
    """``reached`` or ``not reached``: the first figure of ``view`` against the fact ``target``
    (``"≤ 1.15"``, ``"≥ 1.6×"``, ``"≤ 2 GiB"``)."""
    bound = record["facts"][target]
    limit = float(re.search(r"\d+(?:\.\d+)?", bound).group(0))
    value = float(re.search(r"[+−-]?\d+(?:\.\d+)?", VIEWS[view](record, *args)).group(0).replace("−", "-"))
    if bound.lstrip()[0] not in "≤≥":
        raise ValueError(f"target {target!r} of record {record['name']!r} is {bound!r}: it starts with ≤ or ≥")
    return "reached" if (value <= limit if bound.lstrip()[0] == "≤" else value >= limit) else "not reached"


#: view name -> function(record, *args) -> text.
VIEWS = {"mean": mean, "mean-sd": mean_sd, "units": units, "difference": difference, "reading": reading,
         "versus": versus, "pair": pair, "comparison": comparison, "paired-table": paired_table, "wall": wall,
         "command": command, "commit": commit, "versions": versions, "machine": machine, "provenance": provenance,
         "fact": fact, "median": median, "ratio": ratio, "median-table": median_table, "reached": reached}


def render_block(match, records=None):
    """The text a block's view gives from its record (multi-line views between blank lines)."""
    records = {} if records is None else records
    name = match["name"]
    if name not in records:
        records[name] = read_record(name)
    if match["view"] not in VIEWS:
        raise ValueError(f"unknown view {match['view']!r} in {match.group(0)[:80]!r}; views: {sorted(VIEWS)}")
    text = VIEWS[match["view"]](records[name], *match["args"].split())
    return f"\n\n{text}\n\n" if "\n" in text else text


def render_text(text, records=None, keep_markers=True):
    """``text`` with every block re-rendered (markers kept, or dropped for the built site)."""
    def replace(match):
        body = render_block(match, records)
        if not keep_markers:
            return body
        head = match.group(0)[:match.start("body") - match.start()]
        return f"{head}{body}<!-- /record -->"

    return BLOCK.sub(replace, text)


def page_paths(root=ROOT):
    """Every page of :data:`PAGES` (templates and build outputs left out)."""
    skip = ("_templates", "_build", "auto_examples", "generated", "sg_execution_times.rst")
    return sorted({p for pattern in PAGES for p in Path(root).glob(pattern)
                   if not set(p.relative_to(root).parts) & set(skip)})


def stale_pages(root=ROOT):
    """Pages whose blocks differ from what their records give."""
    records = {}
    return [p for p in page_paths(root) if render_text(p.read_text(), records) != p.read_text()]


def main(argv=None):
    """``python -m benchmarks.records.render [--check]``: re-render the blocks of every page."""
    argv = sys.argv[1:] if argv is None else argv
    stale = stale_pages()
    if "--check" in argv:
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)}")
        return 1 if stale else 0
    records = {}
    for path in stale:
        path.write_text(render_text(path.read_text(), records))
        print(f"rendered: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
