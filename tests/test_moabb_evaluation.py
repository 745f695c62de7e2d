"""Tests of the MOABB evaluation's report (``python -m benchmarks.experiments moabb``) on
hand-made score tables: the target lines, the table and ``--combine`` (no fitting, no data)."""

import pandas as pd
import pytest

from benchmarks.experiments import moabb_evaluation as me
from benchmarks.experiments.pipelines import moabb_pipelines


def scores(values, subjects=(1, 2, 3), evaluation="WithinSession"):
    """MOABB-like rows: ``values`` maps a pipeline to its per-subject scores."""
    return pd.DataFrame([
        {"score": v, "score_balanced_accuracy": v, "score_roc_auc": min(1.0, v + 0.1), "time": 1.0, "subject": s,
         "session": "0", "pipeline": name, "evaluation": evaluation, "task": "left/right"}
        for name, per_subject in values.items() for s, v in zip(subjects, per_subject)])


def test_target_lines_are_paired_over_subjects():
    table = scores({"SPDnet": [0.80, 0.70, 0.60], "TS+LR": [0.70, 0.72, 0.59], "FedSPDnet": [0.75, 0.66, 0.58]})
    lines = me.target_lines(table)
    assert len(lines) == 2  # no CrossSubject rows: no CrossSubject claim
    spdnet, fed = lines
    assert "SPDnet ≥ TS+LR: 70.0 vs 67.0, difference **+3.0** ± 3.6 (SE over 3 subjects; higher on 2): met" in spdnet
    assert "FedSPDnet ≥ SPDnet -3: 66.3 vs 70.0, difference **-3.7**" in fed and fed.endswith("MISSED")


def test_a_subject_missing_from_one_pipeline_is_left_out_of_the_pair():
    table = pd.concat([scores({"SPDnet + domain BN": [0.9, 0.8]}, subjects=(1, 2), evaluation="CrossSubject"),
                       scores({"Recenter+TS+LR": [0.7, 0.7, 0.1]}, evaluation="CrossSubject")])
    line = next(line for line in me.target_lines(table) if "≥ Recenter+TS+LR +2" in line)
    assert "85.0 vs 70.0, difference **+15.0**" in line and "over 2 subjects" in line and line.endswith("met")


def test_target_lines_read_the_named_metric():
    table = scores({"SPDnet": [0.60, 0.60, 0.60], "TS+LR": [0.55, 0.65, 0.65]})
    balanced, auc = me.target_lines(table)[0], me.target_lines(table, "roc_auc")[0]
    assert "60.0 vs 61.7" in balanced and balanced.endswith("MISSED")
    assert "70.0 vs 71.7" in auc


def test_table_shows_every_metric_per_evaluation():
    table = me.table(pd.concat([scores({"TS+LR": [0.5, 0.6, 0.7]}),
                                scores({"TS+LR": [0.6, 0.6, 0.6]}, evaluation="CrossSubject")]), "left/right")
    head, _, row = table.splitlines()
    assert head.startswith("| pipeline | WithinSession balanced accuracy (%) | WithinSession ROC-AUC (%) | "
                           "CrossSubject balanced accuracy (%) | CrossSubject ROC-AUC (%)")
    assert row.startswith("| TS+LR | 60.0 ± 10.0 | 70.0 ± 10.0 | 60.0 ± 0.0 | 70.0 ± 0.0 |")


def test_combine_refuses_overlapping_subject_sets(tmp_path):
    for name, subjects in (("a", (1, 2)), ("b", (3, 4)), ("c", (2, 5))):
        (tmp_path / name).mkdir()
        scores({"TS+LR": [0.5, 0.6]}, subjects=subjects).to_csv(tmp_path / name / "scores.csv", index=False)
    combined = me.combine([tmp_path / "a", tmp_path / "b"])
    assert sorted(combined["subject"]) == [1, 2, 3, 4]
    with pytest.raises(SystemExit, match="disjoint subject sets"):
        me.combine([tmp_path / "a", tmp_path / "c"])


def test_cross_subject_rows_that_use_domains_get_the_training_subjects():
    """MOABB's CrossSubject passes ``subjects`` to ``fit`` only to pipelines whose routing
    consumes it (its own check, under metadata routing): every row that re-centres or
    federates by subject must, the tangent-space and MDM rows need not."""
    from sklearn import config_context
    from sklearn.utils.metadata_routing import get_routing_for_object

    with config_context(enable_metadata_routing=True):
        consumes = {name: bool(get_routing_for_object(pipe).consumes("fit", {"subjects"}))
                    for name, pipe in moabb_pipelines(quick=True).items()}
    assert consumes == {"TS+LR": False, "MDM": False, "Recenter+TS+LR": True, "SPDnet": True, "FedSPDnet": True,
                        "SPDnet + domain BN": True, "FedSPDnet + domain BN": True}


@pytest.mark.parametrize("argv, message", [(["--cross-folds", "1"], "--cross-folds: must be at least 2"),
                                           (["--evaluations", "CrossSession"], "invalid choice: 'CrossSession'")])
def test_bad_evaluation_options_are_refused(argv, message, capsys, tmp_path):
    from benchmarks.experiments.__main__ import main

    with pytest.raises(SystemExit):
        main(["moabb", *argv, "--out", str(tmp_path)])
    assert message in capsys.readouterr().err
