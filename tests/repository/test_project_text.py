"""The project's text speaks of the package and its features, not of how its work was tracked.

A reference to a work session or to an issue by its number (in code, comments, docstrings,
tests, benchmarks, examples, documentation, README, CHANGELOG, Makefile, pyproject) means
nothing to a reader of the released package: say what the thing is or does instead.

The patterns are assembled from pieces so that this file's source does not match them.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("skfedspd", "tests", "benchmarks", "examples", "docs", "README.md", "CHANGELOG.md", "Makefile",
           "pyproject.toml")
SKIPPED = ("docs/_build/",)  # Sphinx's output, rebuilt from docs/

SESSION, ISSUE, HASH = "sess" + "ion", "iss" + "ue", "#"
WORK_REFERENCES = [
    (f"a work {SESSION}", re.compile(rf"\b{SESSION}s?\s+\d+(?:\s*(?:,|and|to|-)\s*\d+)*\b", re.IGNORECASE)),
    (f"an {ISSUE} number", re.compile(rf"\b{ISSUE}s?\s+#?\d+\b", re.IGNORECASE)),
    # "#12" as a reference: after a space, an opening bracket or the start of a line, and not
    # a colour ("#1f77b4" has letters, "#123456" six digits) nor an index ("X[#0]").
    (f"an {ISSUE} reference", re.compile(r"(?:^|(?<=[\s(]))#\d{1,5}(?![\w-])")),
]


def _tracked_files():
    """The scanned text files that git tracks (every file under the scanned paths when
    this is not a git checkout)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", *SCANNED], cwd=ROOT, capture_output=True,
                                check=True).stdout.decode().split("\0")
        paths = [ROOT / name for name in listed if name]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for name in SCANNED for p in ([ROOT / name] if (ROOT / name).is_file()
                                                 else (ROOT / name).rglob("*")) if p.is_file()]
    return sorted(p for p in paths
                  if p.is_file() and not p.relative_to(ROOT).as_posix().startswith(SKIPPED))


def _text(path):
    """The file's text, None for a binary file."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def work_references(text):
    """``[(line number, what, matched text)]`` of the work-tracking references in ``text``."""
    return [(number, what, match.group(0))
            for number, line in enumerate(text.splitlines(), start=1)
            for what, pattern in WORK_REFERENCES
            for match in pattern.finditer(line)]


@pytest.mark.parametrize("text", [
    f"measured in {SESSION} 7", f"{SESSION.title()}s 5 and 6 measured", f"({ISSUE} 10, deliverable 1)",
    f"{ISSUE.title()} 10's targets", f"see {ISSUE} {HASH}12", f"fixed in {HASH}12", f"({HASH}3)",
])
def test_finds_work_references(text):
    assert work_references(text)


@pytest.mark.parametrize("text", [
    "X[#0]", 'color="#1f77b4"', 'color="#123456"', "device='cuda:1'", "# 1. comment", "a training session of 7 runs",
    f"the {SESSION}s of a subject", f"{ISSUE}s with the data", "## 2 Heading", "rows 1-3 #",
])
def test_spares_other_text(text):
    assert not work_references(text)


def test_scans_the_project():
    names = {p.relative_to(ROOT).as_posix() for p in _tracked_files()}
    assert {"README.md", "pyproject.toml", "skfedspd/federated.py", "tests/repository/test_project_text.py"} <= names
    assert not [n for n in names if n.startswith(SKIPPED)]


def test_no_work_tracking_references():
    found = [f"{path.relative_to(ROOT)}:{number}: {what}: {matched!r}"
             for path in _tracked_files() if (text := _text(path)) is not None
             for number, what, matched in work_references(text)]
    assert not found, "work-tracking references (say what the thing is instead):\n" + "\n".join(found)
