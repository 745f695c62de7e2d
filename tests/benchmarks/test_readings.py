"""A page's typed readings agree with its records: no "higher" or "lower" beside a difference
that its record's paired statistics call level (``benchmarks.records.readings``)."""

import pytest

from benchmarks.records.readings import unsupported_readings
from benchmarks.records.render import ROOT, page_paths

PAGES = [p.relative_to(ROOT).as_posix() for p in page_paths()]
LEVEL = ("<!-- record:learner-leads comparison spdnetclassifier-given-the-subjects -->"
         "−0.2 ± 2.1, higher on 2 of 8 seeds, Wilcoxon p = 0.461: level<!-- /record -->")
LOWER = ("<!-- record:learner-leads comparison study-model-4-sub-bands-one-bimap-each -->"
         "−5.9 ± 1.3, higher on 0 of 8 seeds, Wilcoxon p = 0.008: lower<!-- /record -->")


@pytest.mark.parametrize("page", PAGES)
def test_no_page_words_a_level_difference_higher_or_lower(page):
    assert unsupported_readings((ROOT / page).read_text()) == []


@pytest.mark.parametrize("text", [f"The network is lower than TS+LR: {LEVEL}.",
                                  f"SPDnet is better, {LEVEL}, on eight seeds.",
                                  f"Domain BN is resolved ahead ({LEVEL})."])
def test_a_level_difference_worded_as_a_win_or_a_loss_is_found(text):
    assert unsupported_readings(text) != []


@pytest.mark.parametrize("text", [f"The network is level with TS+LR: {LEVEL}.",
                                  f"Four sub-bands are lower: {LOWER}.",
                                  f"Not resolved from TS+LR: {LEVEL}.",
                                  f"SPDnet, {LEVEL}; TS+LR is higher on every seed of another record.",
                                  f"Paired: {LEVEL}. The next model is lower."])
def test_level_words_unit_counts_and_other_sentences_pass(text):
    assert unsupported_readings(text) == []
