"""Results as data: one tracked record per experiment, paired statistics, and the blocks of
the docs computed from the records.

- :mod:`.store`: write and read records (``benchmarks/records/data/<name>.json``);
- :mod:`.paired`: paired differences (mean ± SE, units higher, Wilcoxon signed-rank p) and
  their wording ("level" within the t critical value times the standard error);
- :mod:`.render`: the figures and tables a page quotes, and the marked blocks of the pages.
"""
