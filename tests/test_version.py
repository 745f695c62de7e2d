"""``skfedspd.__version__`` is the one source of the package's version.

``pyproject.toml`` declares the version dynamic and setuptools reads it from
``skfedspd/__init__.py``; the installed distribution of this checkout reports the same.
"""

import importlib.metadata
import json
import re
from pathlib import Path

import pytest

import skfedspd

ROOT = Path(__file__).resolve().parent.parent


def test_version_is_a_release_number():
    assert re.fullmatch(r"\d+\.\d+\.\d+", skfedspd.__version__), skfedspd.__version__


def test_pyproject_reads_the_version_from_the_package():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"], "a second version literal in pyproject.toml"
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "skfedspd.__version__"}


def test_the_build_gets_the_package_version():
    pyprojecttoml = pytest.importorskip("setuptools.config.pyprojecttoml")
    config = pyprojecttoml.read_configuration(ROOT / "pyproject.toml", expand=True)
    assert config["project"]["version"] == skfedspd.__version__


def test_installed_distribution_has_the_package_version():
    try:
        distribution = importlib.metadata.distribution("skfedspd")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("skfedspd is not installed (imported from the source tree)")
    url = json.loads(distribution.read_text("direct_url.json") or "{}").get("url", "")
    installed_from = Path(url.removeprefix("file://")).resolve() if url.startswith("file://") else None
    if installed_from is not None and installed_from != ROOT and Path(skfedspd.__file__).is_relative_to(ROOT):
        pytest.skip(f"the installed distribution is of another checkout ({installed_from})")
    assert distribution.version == skfedspd.__version__, (
        f"installed metadata says {distribution.version}, the package {skfedspd.__version__}: reinstall "
        "(pip install -e . --no-deps)")


def test_citation_file_cites_the_package_version_and_the_paper():
    text = (ROOT / "CITATION.cff").read_text()
    assert re.search(r"^version: (\S+)$", text, re.M).group(1) == skfedspd.__version__
    assert "arXiv:2604.22494" in text and "license: BSD-3-Clause" in text
