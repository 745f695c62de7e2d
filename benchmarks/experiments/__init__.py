"""Accuracy experiments on the offline PhysioNet EEG: one harness, named experiments.

``python -m benchmarks.experiments NAME [options]`` runs the experiment ``NAME`` (``--help``
lists them). The pieces every experiment shares live here, once:

* :mod:`.data`: the left/right imagery of the 40 offline subjects as covariance matrices
  (cached under ``results/cache``), trials in recording order;
* :mod:`.pipelines`: the named pipelines (TS+LR, Recenter+TS+LR, SPDnet and FedSPDnet with
  and without domain batch norm) built from the package's public API;
* :mod:`.report`: per-subject balanced accuracy (the decision a user gets) with ROC-AUC beside
  it, paired differences (:mod:`benchmarks.records.paired`: ± standard error, the number of
  subjects won, the Wilcoxon signed-rank p-value), the report header (command, package
  version, machine).

The experiments: ``table-one`` (the paper's Table I protocol and the package's recommended
configuration, :mod:`benchmarks.tableone`; it writes its record), ``unseen-subjects`` (whole-subject adaptation, with the client-domains
ablation), ``online`` (trial by trial), ``drift`` (why the first trials adapt worse than
recent ones), ``defaults`` (the rules behind ``SPDnetClassifier``'s defaults),
``client-optimizer-state`` (kept or fresh client Adam), ``table-one-ablation`` (what
moves the Table I figures, on the 4-class protocol of :mod:`benchmarks.tableone`) and
``robust-aggregation`` (faulty and hostile sites per aggregation rule, the honest sites'
subjects against the fault-free federation, and the diagnosis; it writes its record).
"""
