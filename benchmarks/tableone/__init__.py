"""Temporary aliases: the Table I experiment lives in :mod:`benchmarks.experiments`
(``python -m benchmarks.experiments table-one``).

Only ``privacy_utility.py``, ``privacy_pretrain.py`` and ``robust_aggregation.py``, the
scripts not yet in the harness, still import ``benchmarks.tableone.*``; this package goes
with them (``tests/test_benchmarks_structure.py`` lists it among their dependencies).
"""

import sys
import types

from .._machine import machine_line
from ..experiments import console, table_one_cells, table_one_protocols, table_one_runner


def _alias(name, module, **extra):
    alias = types.ModuleType(f"{__name__}.{name}", module.__doc__)
    alias.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")}, **extra)
    sys.modules[alias.__name__] = alias
    return alias


cells = _alias("cells", table_one_cells)
protocols = _alias("protocols", table_one_protocols, machine=machine_line)
runner = _alias("runner", table_one_runner)
console = _alias("console", console)
