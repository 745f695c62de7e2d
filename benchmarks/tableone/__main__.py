"""``python -m benchmarks.tableone``: the paper's Table I experiment (see ``cli``)."""

import sys

from .cli import main

sys.exit(main())
