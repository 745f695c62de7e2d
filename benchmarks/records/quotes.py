"""Figures a page quotes, and whether its records give them.

A figure is a number that states a result in a page's prose: a decimal number (``66.2``,
``+2.7``, ``−0.2``), a percentage (``93 %``), a signed whole number (``+7``, ``−3``), or a
whole number or number word in a unit of results (``3 points``, ``five points higher``,
``25 s``, ``550 MiB``, ``2×``, ``three times faster``). Whole numbers that count or name
things (subjects, seeds, channels, clients, rounds, epochs, Hz, years, versions, sections)
are not figures: they carry no sign and none of these units (a × between sizes, ``8×8`` or
``8 × St(64, 18)``, is no multiple), and a short allow-list of settings and specifications
(:data:`NOT_PROSE`) is left out. Figures inside marked blocks are
rendered from records; figures in code (fenced blocks, inline code, reStructuredText literals
and code blocks), link targets and version numbers (``2.13.0``) are not quotes. Every other
figure must be one that a record named on the page gives (:func:`given_figures`; a whole
number is given by a value that rounds to it), or the page quotes a number nobody can
reproduce.
"""

import re

from .render import BLOCK, VIEWS, read_record

#: Number words a page may state a result in, and their values.
WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                    "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())}
#: Units that make a whole number a result: points, times, durations, memory.
UNITS = r"(?:\s?×(?!\s?(?-i:[\dA-Z]))|\s(?:more\s|fewer\s)?(?:percentage\s)?points?\b|\s(?:pp|ms|s|seconds?|min|minutes?|h|hours?|MiB|GiB|MB|GB)\b)"
FIGURE = re.compile(r"(?<![\w.])[+−-]?\d+(?:\.\d+(?![.\d])|\s?%)"  # decimals, percentages
                    r"|(?<![\w.,/:–-])[+−]\d+(?![\d.,:/–-])"  # signed whole numbers
                    rf"|(?<![\w.,/:–-])[+−-]?\d+(?![\d.,:/–-])(?={UNITS})"  # whole numbers in a unit of results
                    rf"|\b(?:{'|'.join(WORDS)})\b(?=\s(?:more\s|fewer\s)?(?:percentage\s)?points?\b|\stimes\s(?:faster|slower|more|less|higher|lower|as)\b)",
                    re.IGNORECASE)
NOT_PROSE = (
    re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE),  # fenced code
    re.compile(r"^([ \t]*)\.\. (?:code-block|code|literalinclude)::.*?(?=^\1\S|\Z)", re.DOTALL | re.MULTILINE),
    re.compile(r"::\n\n(?:(?:[ \t]+.*)?\n)+"),  # reStructuredText literal blocks
    re.compile(r"``.*?``|`[^`\n]*`", re.DOTALL),  # inline code
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"<!--.*?-->", re.DOTALL),  # comments
    # settings and specifications, not results: a machine's memory, the Flower transport's
    # polling intervals, the size a refused file would have allocated
    re.compile(r"\bVM, \d+ GiB|\bback-off from \d+ ms|\bafter\s+\d+ ms\s+rather\s+than\s+\d+ s\b|\(\d+ s between polls"
               r"|\ballocating \d+ MB\b"),
)


def normalize(figure):
    figure = figure.replace("−", "-").replace(" ", "").lstrip("+")
    return str(WORDS.get(figure.lower(), figure))


def value(figure):
    """The number of a normalized figure (None for a percentage or a multiple)."""
    try:
        return float(figure)
    except ValueError:
        return None


def backed(figure, given):
    """Whether ``figure`` (normalized) is among ``given``, or a whole number that a given value
    rounds to (``3 points`` for ``+3.1 ± 1.5``)."""
    if figure in given:
        return True
    if not re.fullmatch(r"-?\d+", figure):
        return False
    whole = int(figure)
    return any(v is not None and round(v) == whole and v * whole >= 0 for v in map(value, given))


def prose(text):
    """``text`` without its blocks, code, link targets and comments."""
    text = BLOCK.sub(" ", text)
    for pattern in NOT_PROSE:
        text = pattern.sub(" ", text)
    return text


def quoted_figures(text):
    return [m.group(0) for m in FIGURE.finditer(prose(text))]


def record_names(text):
    return sorted({m["name"] for m in BLOCK.finditer(text)})


def given_figures(record):
    """Every figure some view of ``record`` gives (normalized), over its rows and metrics."""
    texts = [VIEWS[v](record) for v in ("wall", "machine", "provenance")]
    texts += [VIEWS["fact"](record, f) for f in record["facts"]]
    for metric in record["metrics"]:
        texts.append(VIEWS["paired-table"](record, metric))
        for row in record["rows"]:
            texts += [VIEWS[v](record, row, metric) for v in ("mean", "mean-sd", "comparison", "median")]
            texts += [VIEWS["ratio"](record, row, other, metric) for other in record["rows"]]
        texts.append(VIEWS["median-table"](record, metric))
    return {normalize(f) for text in texts for f in FIGURE.findall(text)}


def unbacked_figures(text):
    """Figures ``text`` quotes that none of the records it names gives."""
    given = set()
    for name in record_names(text):
        given |= given_figures(read_record(name))
    return [f for f in quoted_figures(text) if not backed(normalize(f), given)]


#: A command that writes a record: an experiment of the harness or a speed script, in inline
#: code or on a line of a code block (``nice`` and a trailing comment are not part of it).
COMMAND = re.compile(r"python (?:-m benchmarks\.experiments [\w-]+|benchmarks/bench_\w+\.py|-m benchmarks\.bench_\w+)"
                     r"(?:[ \t]+[^`\n#]*)?")
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.DOTALL | re.MULTILINE)
TOKEN = "\x00record:{}\x00"


def normalize_command(command):
    """``python benchmarks/bench_x.py --reps 7``: one space between words, ``-m benchmarks.bench_x``
    written as the script path, line continuations joined."""
    command = re.sub(r"\\\n", " ", command)
    command = re.sub(r"-m benchmarks\.(bench_\w+)", r"benchmarks/\1.py", command)
    return " ".join(command.split())


def program(command):
    """``python -m benchmarks.experiments moabb`` or ``python benchmarks/bench_x.py``: what runs."""
    words = normalize_command(command).split()
    return " ".join(words[:2] if words[1].startswith("benchmarks/") else words[:4])


#: Where a paragraph splits besides blank lines: before each row of a Markdown table and each
#: row of a reStructuredText list table (a row is read on its own).
ROW = re.compile(r"\n(?=[ \t]*\||[ \t]*\* - )")


def paragraphs(text):
    """The page in paragraphs (split at blank lines and table rows; a code block is one
    paragraph), each marked block replaced by a token naming its record (a block of several
    lines is then a paragraph of its own)."""
    fences = []
    text = FENCE.sub(lambda m: fences.append(m.group(0)) or f"\x01{len(fences) - 1}\x01", text)
    text = BLOCK.sub(lambda m: TOKEN.format(m["name"]), text)
    return [re.sub(r"\x01(\d+)\x01", lambda m: fences[int(m.group(1))], part)
            for paragraph in re.split(r"\n[ \t]*\n", text) for part in ROW.split(paragraph)]


def commands_of(paragraph):
    """The commands a paragraph prints (inline code, or the lines of a code block)."""
    spans = re.findall(r"``(.+?)``|`([^`\n]+)`", paragraph, re.DOTALL) if not paragraph.lstrip().startswith("```") \
        else [(paragraph.replace("\\\n", " "), "")]
    return [normalize_command(m.group(0)) for a, b in spans for line in (a or b).splitlines()
            for m in COMMAND.finditer(line.replace("\n", " "))]


def beside(paragraphs_, i):
    """The records beside paragraph ``i``: those it names, and those of a block that stands alone
    just before or after it."""
    names = set(re.findall(TOKEN.format(r"(\S+?)"), paragraphs_[i]))
    for j in (i - 1, i + 1):
        if 0 <= j < len(paragraphs_) and re.fullmatch(r"\s*(?:" + TOKEN.format(r"\S+?") + r"\s*)+", paragraphs_[j]):
            names |= set(re.findall(TOKEN.format(r"(\S+?)"), paragraphs_[j]))
    return names


def mismatched_commands(text):
    """``[(command, {record: its command})]``: each command a page prints beside the blocks of
    records of the same experiment (or speed script) that is none of their commands: the page
    shows a command that did not produce the figures beside it."""
    parts, wrong = paragraphs(text), []
    for i, paragraph in enumerate(parts):
        names = beside(parts, i)
        if not names:
            continue
        stored = {name: normalize_command(read_record(name)["command"]) for name in sorted(names)}
        for command in commands_of(paragraph):
            same = {name: c for name, c in stored.items() if program(c) == program(command)}
            if same and command not in same.values():
                wrong.append((command, same))
    return wrong
