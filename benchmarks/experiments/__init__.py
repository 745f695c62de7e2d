"""Accuracy experiments on the offline PhysioNet EEG: one harness, named experiments.

``python -m benchmarks.experiments NAME [options]`` runs the experiment ``NAME`` (``--help``
lists them). The pieces every experiment shares live here, once:

* :mod:`.data`: the one way to the EEG: the offline PhysioNet copy (the left/right imagery
  of the 40 offline subjects as covariance matrices cached under ``results/cache``, trials in
  recording order; band-passed trials) and MOABB's datasets;
* :mod:`.pipelines`: the named pipelines (TS+LR, Recenter+TS+LR, SPDnet and FedSPDnet with
  and without domain batch norm, and MOABB's) built from the package's public API;
* :mod:`.report`: per-subject balanced accuracy (the decision a user gets) with ROC-AUC beside
  it, paired differences (:mod:`benchmarks.records.paired`: ± standard error, the number of
  subjects won, the Wilcoxon signed-rank p-value), the report header (command, package
  version, machine), the report file;
* :mod:`.console`: the experiment's lines to the console, library output to a log file.

The experiments: ``table-one`` (the paper's Table I protocol and the package's recommended
configuration, the main job, ``make experiment``; it writes its record; its pieces are the
``table_one_*`` modules), ``unseen-subjects`` (whole-subject adaptation, with the
client-domains ablation), ``online`` (trial by trial), ``drift`` (why the first trials adapt
worse than recent ones), ``defaults`` (the rules behind ``SPDnetClassifier``'s defaults),
``client-optimizer-state`` (kept or fresh client Adam), ``table-one-ablation`` (what moves
the Table I figures, on its 4-class protocol), ``flower-table-one`` (a Table I cell through
a Flower deployment on this machine against the local backend), ``moabb`` (MOABB's
within-session and cross-subject evaluations against pyRiemann) and ``robust-aggregation``
(faulty and hostile sites per aggregation rule, the honest sites' subjects against the
fault-free federation, and the diagnosis; it writes its record).

Records of the results live in :mod:`benchmarks.records`; the machine is described by
:mod:`benchmarks._machine`, shared with the speed scripts (``bench_*.py``).
"""
