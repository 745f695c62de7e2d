"""Sphinx configuration of the skfedspd documentation.

Build: ``make docs`` (examples executed) or ``make docs-noexec`` (gallery pages without
running the examples). Both build with warnings as errors.
"""

import importlib
import inspect
import os
import pkgutil
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Document (and run the examples against) this checkout, also in the processes the examples
# start (the Flower SuperLink, SuperNodes and ClientApps import skfedspd).
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

import skfedspd  # noqa: E402
from skfedspd.datasets import find_physionet_root  # noqa: E402

project = "skfedspd"
author = "skfedspd developers"
copyright = "2026, skfedspd developers"
release = skfedspd.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py", "auto_examples/*.zip",
                    "**.codeobj.json"]
templates_path = ["_templates"]

# -- API reference: one page per module, its public names = its ``__all__`` ---------------
autosummary_generate = True
autosummary_ignore_module_all = False  # members of a module page = the module's __all__
autosummary_imported_members = False  # a name is documented once, in the module defining it
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"
add_module_names = False
autosummary_context = {}  # filled below: "reexports"
numpydoc_show_class_members = False  # the class template lists the methods
numpydoc_class_members_toctree = False

# -- Markdown pages (guide/, benchmarks/, design-decisions.md) ---------------------------
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

# -- gallery ------------------------------------------------------------------------------
# The examples on the offline PhysioNet EEG run only where the data are (they exit with a
# message when run by hand elsewhere): the build lists them without executing them.
_REAL_EEG_EXAMPLES = ["plot_01_quickstart.py", "plot_07_physionet_federated.py", "plot_11_robust_aggregation.py"]
_filename_pattern = r"/plot_"
if find_physionet_root() is None:
    print("skfedspd docs: PhysioNet EEG data not found (SKFEDSPD_DATA, <ancestor>/shared/data): "
          f"not executing {', '.join(_REAL_EEG_EXAMPLES)}")
    _filename_pattern = r"/plot_(?!" + "|".join(n[len("plot_"):-3] for n in _REAL_EEG_EXAMPLES) + r")"

sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": _filename_pattern,
    "within_subsection_order": "FileNameSortKey",
    "doc_module": ("skfedspd",),
    "backreferences_dir": "generated/backreferences",
    "reference_url": {"skfedspd": None},
    "remove_config_comments": True,
    "show_memory": False,
    "matplotlib_animations": False,
    "run_stale_examples": False,
    "abort_on_example_error": False,
    "only_warn_on_example_error": False,
}

# Library noise that says nothing about the examples (the examples set their own filters too).
warnings.filterwarnings("ignore", category=FutureWarning, module="mne")
warnings.filterwarnings("ignore", message="Matplotlib is currently using agg")

# -- HTML ---------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"skfedspd {release}"
html_static_path = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 6,
}
html_show_sourcelink = False

intersphinx_mapping = {}  # offline machines: no inventories are fetched


# -- which public names a module re-exports (documented on the page of the module that defines
# them, linked from the re-exporting package's page) ----------------------------------------
def _public_modules(package):
    yield package
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            yield importlib.import_module(info.name)


def _reexports(package):
    names = set()
    for module in _public_modules(package):
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if (inspect.isclass(obj) or inspect.isroutine(obj)) and obj.__module__ != module.__name__:
                names.add(f"{module.__name__}.{name}")
    return sorted(names)


autosummary_context["reexports"] = _reexports(skfedspd)


def _skip_member(app, what, name, obj, skip, options):
    # scikit-learn's metadata-routing and output helpers: inherited, documented by
    # scikit-learn (their docstrings point into its user guide)
    if name in ("get_metadata_routing", "set_output") or (name.startswith("set_") and name.endswith("_request")):
        return True
    return None


# -- names re-exported by a package (``skfedspd.SPDnetClassifier``) link to the page of the
# module that defines them (``skfedspd.classifier.SPDnetClassifier``) ------------------------
def _resolve_reexport(app, env, node, contnode):
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith("skfedspd."):
        return None
    module_name, _, attr = target.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError):
        return None
    defining = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not defining or not qualname or f"{defining}.{qualname}" == target:
        return None
    node["reftarget"] = f"{defining}.{qualname}"
    return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                          node["reftarget"], node, contnode)


# -- figures computed from the tracked records (benchmarks/records): every marked block of a
# page is rendered again from its record when the site is built -----------------------------
def _render_records(app, docname, source):
    from benchmarks.records.render import render_text

    source[0] = render_text(source[0], keep_markers=False)


def setup(app):
    app.connect("source-read", _render_records)
    app.connect("missing-reference", _resolve_reexport)
    app.connect("autodoc-skip-member", _skip_member)
