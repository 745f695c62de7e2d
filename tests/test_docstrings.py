"""The Examples sections of the public docstrings run and print what they show.

One doctest per public object of the modules below (``pytest --doctest-modules`` semantics,
collected here so that the optional dependencies and the offline data decide what is
skipped, each with its reason). Every example starts from a clean environment: examples
that point MNE/MOABB at a folder (``configure_offline``) do not leak into other tests.
"""

import ast
import doctest
import importlib
import importlib.util
import os
from pathlib import Path

import pytest

import skfedspd
from skfedspd.datasets import find_physionet_root

# Every module of the package, so that a new one is covered without editing this list.
PACKAGE_DIR = Path(skfedspd.__file__).parent
MODULES = sorted(".".join(p.relative_to(PACKAGE_DIR.parent).with_suffix("").parts).removesuffix(".__init__")
                 for p in PACKAGE_DIR.rglob("*.py") if p.name != "__main__.py")
NEEDS_FLOWER = {name for name in MODULES if name.startswith("skfedspd.flower")}
NEEDS_MOABB = {"skfedspd.datasets.load_moabb"}
NEEDS_DP_ACCOUNTING = {"skfedspd.privacy.epsilon_spent", "skfedspd.privacy.calibrate_noise",
                       "skfedspd.privacy.plan_dp"}
NEEDS_DATA = {"skfedspd.datasets.load_physionet_mi"}
NEEDS_NETWORK = {"skfedspd.datasets.load_weibo2014"}  # its example is all +SKIP


def _modules_with_all():
    """The package's modules (not ``__main__``) whose source assigns ``__all__``, read
    without importing them (the Flower ones need the extra)."""
    root = Path(skfedspd.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        if path.stem == "__main__":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
               for node in tree.body):
            parts = path.relative_to(root.parent).with_suffix("").parts
            found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def test_modules_list_every_public_module():
    """Every module says what is public (``__all__``): the API reference lists it, the doctests run it."""
    assert _modules_with_all() == set(MODULES)


def _doctests():
    finder = doctest.DocTestFinder(exclude_empty=True)
    params = []
    for name in MODULES:
        if name in NEEDS_FLOWER and importlib.util.find_spec("flwr") is None:
            params.append(pytest.param(name, None, marks=pytest.mark.skip(reason="flwr is not installed"), id=name))
            continue
        module = importlib.import_module(name)
        for test in finder.find(module):
            if test.examples:
                params.append(pytest.param(name, test.name, id=test.name))
    return params


def test_public_names_have_examples():
    """Every name in the ``__all__`` of these modules that is a class or a function has an
    Examples section with at least one example that runs (not all ``+SKIP``)."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    missing = []
    for name in MODULES:
        if name in NEEDS_FLOWER and importlib.util.find_spec("flwr") is None:
            continue
        module = importlib.import_module(name)
        tests = {t.name: t for t in finder.find(module)}
        for public in module.__all__:
            obj = getattr(module, public)
            if not callable(obj) or getattr(obj, "__module__", None) != name:
                continue
            full = f"{name}.{public}"
            test = tests.get(full)
            runnable = test is not None and any(not ex.options.get(doctest.SKIP) for ex in test.examples)
            documented = "Examples\n" in (obj.__doc__ or "")
            if not documented or not (runnable or full in NEEDS_NETWORK):
                missing.append(full)
    assert not missing, f"public names without a runnable Examples section: {missing}"


@pytest.mark.parametrize("module_name, test_name", _doctests())
def test_docstring_examples(module_name, test_name, tmp_path, monkeypatch):
    if test_name in NEEDS_MOABB and importlib.util.find_spec("moabb") is None:
        pytest.skip("moabb is not installed")
    if test_name in NEEDS_DP_ACCOUNTING and importlib.util.find_spec("dp_accounting") is None:
        pytest.skip("dp-accounting is not installed")
    if test_name in NEEDS_DATA and find_physionet_root() is None:
        pytest.skip("PhysioNet EEG data not found (SKFEDSPD_DATA, ../shared/data)")
    # examples write files in the working directory and set MNE/MOABB variables
    monkeypatch.chdir(tmp_path)
    for key in ("MNE_DATA", "MNE_DATASETS_EEGBCI_PATH", "MOABB_DOWNLOAD_PROVIDER", "MOABB_RESULTS"):
        monkeypatch.setenv(key, os.environ.get(key, str(tmp_path / "mne_data")))
    environ = dict(os.environ)
    module = importlib.import_module(module_name)
    (test,) = [t for t in doctest.DocTestFinder().find(module) if t.name == test_name]
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    try:
        runner.run(test, out=report.append)
    finally:
        os.environ.clear()
        os.environ.update(environ)
    assert runner.failures == 0, "".join(report)
