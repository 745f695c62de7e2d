"""Temporary aliases for ``privacy_utility.py``, ``privacy_pretrain.py`` and
``robust_aggregation.py``, the scripts not yet in the harness: the helpers live in
:mod:`benchmarks.experiments.report` and :mod:`benchmarks._machine`. This module goes with
those scripts (``tests/test_benchmarks_structure.py`` lists it among their dependencies)."""

from ._machine import load_average
from .experiments.report import resolve_profile, write_report

__all__ = ["load_average", "resolve_profile", "write_report"]
