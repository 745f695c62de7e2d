"""Typed readings of a page against the readings its records give.

A page may word a difference in its prose ("FedSPDnet is higher than TS+LR: <block>"). The
words must agree with the record: a sentence whose every paired difference (a marked block of a
``difference``, ``reading``, ``versus``, ``comparison`` or ``pair`` view) is "level" under
:func:`~.paired.t_critical` may not call it higher, lower, better, worse, ahead, behind,
resolved or significant. Unit counts ("higher on 3 of 4 folds") and negated words ("not
resolved", "no row is ahead") are not readings.
"""

import re

from .paired import paired_difference
from .render import BLOCK, ONE_CLASS, metric_of, predicts_one_class, read_record, scores, versus_reference

#: Views whose block stands for a paired difference.
DIFFERENCE_VIEWS = ("difference", "reading", "versus", "comparison", "pair")
TYPED = re.compile(r"\b(higher|lower|better|worse|beats?|wins?|ahead|behind|outperforms?|resolved|"
                   r"significant(?:ly)?)\b(?!\s+on\s+(?:\d|every|all|each|none))", re.IGNORECASE)
NEGATION = re.compile(r"\b(?:not|no|nor|neither|cannot|never|without)\b(?:\W+\w+){0,6}\W*$", re.IGNORECASE)
#: Where a sentence ends: after . ; ? ! before a capital, a blank line, a list item or a table row.
SENTENCE_END = re.compile(r"(?<=[.;!?])\s+(?=[A-Z*(`-])|\n\s*\n|\n\s*(?:[-*|]|\d+\.)\s")


def block_reading(match, records):
    """``higher``, ``lower``, ``level``, ``one unit`` or :data:`~.render.ONE_CLASS` for a block of a
    difference view, else None."""
    if match["view"] not in DIFFERENCE_VIEWS:
        return None
    name = match["name"]
    if name not in records:
        records[name] = read_record(name)
    record, args = records[name], match["args"].split()
    rows = args[:2] if match["view"] == "pair" else [args[0], record["reference"]]
    if predicts_one_class(record, *rows):
        return ONE_CLASS
    if match["view"] != "pair":
        return versus_reference(record, *args).reading
    metric = metric_of(record, args[2] if len(args) > 2 else None)
    return paired_difference(scores(record, args[0], metric), scores(record, args[1], metric)).reading


def typed_words(sentence):
    """The reading words of ``sentence`` that no negation precedes."""
    return [m.group(0) for m in TYPED.finditer(sentence) if not NEGATION.search(sentence[:m.start()])]


def unsupported_readings(text, records=None):
    """``[(word, sentence)]``: reading words typed in a sentence whose every paired difference is
    level by its record, or a model's that predicts one class (a sentence with a higher or lower
    block may word that one)."""
    records = {} if records is None else records
    readings = []

    def placeholder(match):
        readings.append(block_reading(match, records))
        return f"\x00{len(readings) - 1}\x00"

    found = []
    for sentence in SENTENCE_END.split(BLOCK.sub(placeholder, text)):
        differences = [readings[int(i)] for i in re.findall(r"\x00(\d+)\x00", sentence)]
        differences = [r for r in differences if r is not None]
        if not differences or {"higher", "lower"} & set(differences):
            continue
        prose = re.sub(r"\x00\d+\x00", " ", sentence)
        found += [(word, " ".join(prose.split())) for word in typed_words(prose)]
    return found
