"""Figures a page quotes, and whether its records give them.

A figure is a decimal number (``66.2``, ``+2.7``, ``−0.2``) or a percentage (``93 %``) in a
page's prose. Figures inside marked blocks are rendered from records; figures in code
(fenced blocks, inline code, reStructuredText literals and code blocks), link targets and
version numbers (``2.13.0``) are not quotes. Every other figure must be one that a record
named on the page gives (:func:`given_figures`), or the page quotes a number nobody can
reproduce.
"""

import re

from .render import BLOCK, VIEWS, read_record

FIGURE = re.compile(r"(?<![\w.])[+−-]?\d+(?:\.\d+(?![.\d])|\s?%)")
NOT_PROSE = (
    re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE),  # fenced code
    re.compile(r"^([ \t]*)\.\. (?:code-block|code|literalinclude)::.*?(?=^\1\S|\Z)", re.DOTALL | re.MULTILINE),
    re.compile(r"::\n\n(?:(?:[ \t]+.*)?\n)+"),  # reStructuredText literal blocks
    re.compile(r"``.*?``|`[^`\n]*`", re.DOTALL),  # inline code
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"<!--.*?-->", re.DOTALL),  # comments
)


def normalize(figure):
    return figure.replace("−", "-").replace(" ", "").lstrip("+")


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
    return [f for f in quoted_figures(text) if normalize(f) not in given]
