"""Every figure a page quotes is computed from a tracked record (``benchmarks/records``).

A page's figures are either marked blocks rendered from a record, which must match what the
record gives today (``python -m benchmarks.records.render`` re-renders them), or figures of
its prose that a record named on the page gives. Every page is checked.
"""

import re

import pytest

from benchmarks.records.quotes import mismatched_commands, unbacked_figures
from benchmarks.records.render import ROOT, page_paths, stale_pages

PAGES = [p.relative_to(ROOT).as_posix() for p in page_paths()]


def test_every_block_is_what_its_record_gives():
    stale = [p.relative_to(ROOT).as_posix() for p in stale_pages()]
    assert stale == [], f"stale blocks in {stale}: run `python -m benchmarks.records.render`"


@pytest.mark.parametrize("page", PAGES)
def test_a_page_quotes_only_figures_of_its_records(page):
    assert unbacked_figures((ROOT / page).read_text()) == []


@pytest.mark.parametrize("page", PAGES)
def test_no_page_calls_a_target_met(page):
    """A target is reached or not by a figure with its standard error; "met" hides which."""
    assert re.findall(r"\bmet\b", (ROOT / page).read_text(), re.IGNORECASE) == []


@pytest.mark.parametrize("page", PAGES)
def test_a_command_beside_a_figure_is_the_command_of_its_record(page):
    """A command printed beside a record's block, of the same experiment or speed script, is
    the command stored in that record: the one that produced the figures beside it."""
    assert mismatched_commands((ROOT / page).read_text()) == []
