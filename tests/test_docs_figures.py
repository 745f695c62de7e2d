"""Every figure a page quotes is computed from a tracked record (``benchmarks/records``).

A page's figures are either marked blocks rendered from a record, which must match what the
record gives today (``python -m benchmarks.records.render`` re-renders them), or figures of
its prose that a record named on the page gives. The pages whose figures have no record yet
are listed by name below: the gap stays visible, and a page leaves the list once converted.
"""

import re

import pytest

from benchmarks.records.quotes import unbacked_figures
from benchmarks.records.render import ROOT, page_paths, stale_pages

#: Pages whose figures are still typed by hand, without a record to compute them from.
NOT_YET_GENERATED = (
    "docs/benchmarks/privacy.md",
    "docs/benchmarks/speed.md",
    "docs/benchmarks/unseen-subjects.md",
    "docs/design-decisions.md",
    "docs/guide/privacy.md",
    "docs/guide/robust-aggregation.md",
)
PAGES = [p.relative_to(ROOT).as_posix() for p in page_paths()]
CONVERTED = [p for p in PAGES if p not in NOT_YET_GENERATED]


def test_every_block_is_what_its_record_gives():
    stale = [p.relative_to(ROOT).as_posix() for p in stale_pages()]
    assert stale == [], f"stale blocks in {stale}: run `python -m benchmarks.records.render`"


@pytest.mark.parametrize("page", CONVERTED)
def test_a_converted_page_quotes_only_figures_of_its_records(page):
    assert unbacked_figures((ROOT / page).read_text()) == []


@pytest.mark.parametrize("page", NOT_YET_GENERATED)
def test_a_page_not_yet_generated_still_has_typed_figures(page):
    """A page converted (or deleted) leaves the list."""
    assert page in PAGES
    assert unbacked_figures((ROOT / page).read_text()) != []


@pytest.mark.parametrize("page", PAGES)
def test_no_page_calls_a_target_met(page):
    """A target is reached or not by a figure with its standard error; "met" hides which."""
    assert re.findall(r"\bmet\b", (ROOT / page).read_text(), re.IGNORECASE) == []
