"""The install page lists every extra of ``pyproject.toml``, and no other."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def listed_extras(text):
    """The extras of the install page's table: first column of its rows, as ``name``."""
    return set(re.findall(r"^``([\w-]+)``\s{2,}\S", text, re.MULTILINE))


def test_the_install_page_lists_every_extra():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert listed_extras((ROOT / "docs" / "install.rst").read_text()) == extras


def test_an_extra_missing_from_the_table_is_seen():
    table = "``moabb``        EEG datasets\n``flower``       Flower\n"
    assert listed_extras(table) == {"moabb", "flower"}
