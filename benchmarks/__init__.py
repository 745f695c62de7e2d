"""Benchmarks and the real-EEG experiments of skfedspd (run from the repository root).

Two families: the speed scripts, standalone (``python benchmarks/bench_spdnet_step.py``),
and the accuracy harness, ``python -m benchmarks.experiments NAME`` (``table-one`` is the
paper's Table I experiment, ``make experiment``), whose results records live in
``benchmarks/records``. ``_machine.py`` describes the machine for both.
"""
