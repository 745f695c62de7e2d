"""The FedSPDnet paper's Table I experiment, with the package's recommended configuration
on the same splits, by role.

- :mod:`.protocols`: per-dataset hyper-parameters, the training schedule (the federated
  schedule in one function), budgets (profiles) and the estimators they build;
- :mod:`.cells`: the cells of the table as frozen dataclasses;
- :mod:`.runner`: fitting a cell, the JSON cache of records, MOABB's unseen-subject table;
- :mod:`.report`: tables, targets, convergence, headline, figure;
- :mod:`.console`: console vs log file (configured by the entry point only);
- :mod:`.cli`: the command line, ``python -m benchmarks.tableone``.

Importing it has no side effects (no environment variable, logging or warning set-up, no
folder created).
"""

from . import cells, cli, console, protocols, report, runner
from .cells import CELLS, Cell
from .protocols import PROFILES, PROTOCOLS, Budget, Protocol

__all__ = ["CELLS", "Cell", "PROFILES", "PROTOCOLS", "Budget", "Protocol", "cells", "cli", "console", "protocols",
           "report", "runner"]
