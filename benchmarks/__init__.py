"""Benchmarks and the real-EEG experiment of skfedspd (run from the repository root).

``python -m benchmarks.tableone`` runs the paper's Table I experiment; the ``bench_*.py``
scripts are standalone (``python benchmarks/bench_spdnet_step.py``).
"""
