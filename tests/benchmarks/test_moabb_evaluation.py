"""Tests of the MOABB evaluation's report (``python -m benchmarks.experiments moabb``) on
hand-made score tables: the target lines, the table and ``--combine`` (no fitting, no data)."""

import sys

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
    assert "SPDnet ≥ TS+LR: 70.0 vs 67.0, difference **+3.0** ± 3.6 (SE over 3 subjects; higher on 2): not resolved" in spdnet
    assert "FedSPDnet ≥ SPDnet -3: 66.3 vs 70.0, difference **-3.7**" in fed and "not resolved" in fed


def test_a_subject_missing_from_one_pipeline_is_left_out_of_the_pair():
    table = pd.concat([scores({"SPDnet + domain BN": [0.9, 0.8]}, subjects=(1, 2), evaluation="CrossSubject"),
                       scores({"Recenter+TS+LR": [0.7, 0.7, 0.1]}, evaluation="CrossSubject")])
    line = next(line for line in me.target_lines(table) if "≥ Recenter+TS+LR +2" in line)
    assert "85.0 vs 70.0, difference **+15.0**" in line and "over 2 subjects" in line
    assert line.endswith("reached beyond two standard errors")


def test_target_lines_read_the_named_metric():
    table = scores({"SPDnet": [0.60, 0.60, 0.60], "TS+LR": [0.55, 0.65, 0.65]})
    balanced, auc = me.target_lines(table)[0], me.target_lines(table, "roc_auc")[0]
    assert "60.0 vs 61.7" in balanced and "not resolved" in balanced
    assert "70.0 vs 71.7" in auc


@pytest.mark.parametrize("mean, se, verdict", [(3.0, 1.0, "reached beyond"), (-3.0, 1.0, "NOT reached"),
                                               (1.0, 1.0, "not resolved"), (5.0, float("nan"), "one subject")])
def test_a_target_is_reached_or_not_only_beyond_two_standard_errors(mean, se, verdict):
    assert verdict in me.target_verdict(mean, se, 0.0)


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
    assert consumes == {"TS+LR": False, "MDM": False, "FgMDM": False, "Recenter+TS+LR": True, "SPDnet": True, "SPDnet, 5 seeds": True, "FedSPDnet": True,
                        "SPDnet + domain BN": True, "FedSPDnet + domain BN": True}


@pytest.mark.parametrize("argv, message", [(["--cross-folds", "1"], "--cross-folds: must be at least 2"),
                                           (["--evaluations", "CrossSession"], "invalid choice: 'CrossSession'"),
                                           (["--pipelines", "CSP+LDA"], "invalid choice: 'CSP+LDA'")])
def test_bad_evaluation_options_are_refused(argv, message, capsys, tmp_path):
    from benchmarks.experiments.__main__ import main

    with pytest.raises(SystemExit):
        main(["moabb", *argv, "--out", str(tmp_path)])
    assert message in capsys.readouterr().err


def run_folder(path, table, cross_folds=None, command="python -m benchmarks.experiments moabb --quick",
               subjects=None, channels="all"):
    """A results folder as a run leaves it: MOABB's scores and ``run.json``."""
    path.mkdir()
    table.to_csv(path / "scores.csv", index=False)
    subjects = {"left/right": sorted(table["subject"].unique()) if subjects is None else subjects}
    me.write_run(path, command, wall_seconds=60.0, cpu_seconds=30.0, cross_folds=cross_folds, subjects=subjects,
                 measured_on={"cpu": "test CPU", "cores": 2, "python": "3", "torch": "2", "load_average": 0.5},
                 channels=channels)
    return path


@pytest.fixture
def records(tmp_path, monkeypatch):
    """Records go to a temporary folder; returns it."""
    from benchmarks.experiments import report
    from benchmarks.records import store

    folder = tmp_path / "records"
    monkeypatch.setattr(report, "write_record", lambda name, **kw: store.write_record(name, folder=folder, **kw))
    return folder


def test_record_names_follow_the_evaluation_and_the_split():
    assert me.record_name("moabb", "left/right", "WithinSession", None, [4, 4, 4, 4]) == "moabb-withinsession-16"
    assert me.record_name("moabb", "left/right", "CrossSubject", None, [16]) == "moabb-crosssubject-loso16"
    assert me.record_name("moabb", "left/right", "CrossSubject", None, [4] * 4) == "moabb-crosssubject-loso4x4"
    assert me.record_name("moabb", "left/right", "CrossSubject", 4, [16]) == "moabb-crosssubject-groupkfold4-16"
    assert me.record_name("x", "4 classes", "WithinSession", None, [4]) == "x-withinsession-4-4class"


def test_a_run_writes_one_record_per_evaluation_paired_with_ts_lr(tmp_path, records):
    from benchmarks.records import render, store

    table = pd.concat([scores({"TS+LR": [0.6, 0.7, 0.8], "SPDnet": [0.7, 0.7, 0.9]}),
                       scores({"TS+LR": [0.5, 0.6, 0.7], "SPDnet": [0.6, 0.5, 0.7]}, evaluation="CrossSubject")])
    paths = me.write_records([run_folder(tmp_path / "run", table, command="python -m benchmarks.experiments moabb")],
                             figures=tmp_path / "figures")
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == [f"{p.stem}.png" for p in sorted(paths)]
    assert sorted(p.stem for p in paths) == ["moabb-crosssubject-loso3", "moabb-withinsession-3"]
    within = store.read_record("moabb-withinsession-3", records)
    assert within["reference"] == "ts-lr" and within["paired_by"] == "subject"
    assert within["command"] == "python -m benchmarks.experiments moabb" and within["wall_seconds"] == 60.0
    assert within["machine"]["cpu"] == "test CPU" and within["facts"]["subjects"] == [1, 2, 3]
    assert list(within["metrics"]) == ["balanced_accuracy", "roc_auc"]
    assert render.mean_sd(within, "spdnet") == "76.7 ± 11.5"
    assert render.difference(within, "spdnet", "roc_auc") == "+6.7 ± 3.3"
    assert within["facts"]["one_training_seed"] == ["spdnet"]  # the network's readings say so
    assert render.worded(within, "higher", "spdnet") == "higher, one training seed"
    assert render.worded(within, "higher", "ts-lr") == "higher"
    cross = store.read_record("moabb-crosssubject-loso3", records)
    assert render.difference(cross, "spdnet") == "+0.0 ± 5.8" and cross["facts"]["split"] == "leave one subject out"


def test_the_sensorimotor_channels_reach_the_paradigms_and_the_record(tmp_path, records):
    from benchmarks.records import store
    from skfedspd.datasets import SENSORIMOTOR_CHANNELS

    assert all(paradigm.channels == list(SENSORIMOTOR_CHANNELS)
               for _, _, paradigm in me.datasets(False, [1, 2], SENSORIMOTOR_CHANNELS))
    assert all(paradigm.channels is None for _, _, paradigm in me.datasets(True, [1, 2]))
    table = scores({"TS+LR": [0.6, 0.7], "SPDnet": [0.7, 0.8]}, subjects=(1, 2))
    me.write_records([run_folder(tmp_path / "run", table, channels="sensorimotor")], prefix="moabb-16ch")
    record = store.read_record("moabb-16ch-withinsession-2", records)
    assert record["title"].endswith(", 16 sensorimotor channels")
    assert record["facts"]["channels"] == list(SENSORIMOTOR_CHANNELS)
    everything = run_folder(tmp_path / "all", scores({"TS+LR": [0.6, 0.7]}, subjects=(3, 4)))
    with pytest.raises(SystemExit, match="different channels"):
        me.write_records([tmp_path / "run", everything])


def test_sessions_of_a_subject_are_averaged_into_one_unit(tmp_path, records):
    from benchmarks.records import render, store

    table = pd.concat([scores({"TS+LR": [0.6, 0.8]}, subjects=(1, 2)),
                       scores({"TS+LR": [0.8, 0.8]}, subjects=(1, 2)).assign(session="1")])
    me.write_records([run_folder(tmp_path / "run", table)])
    record = store.read_record("moabb-withinsession-2", records)
    assert render.units(record, "ts-lr") == "2" and render.mean(record, "ts-lr") == "75.0"


def test_combine_writes_the_record_of_every_run_together(tmp_path, records, capsys, monkeypatch):
    from benchmarks.experiments.__main__ import main
    from benchmarks.records import render, store

    a = run_folder(tmp_path / "a", pd.concat([scores({"TS+LR": [0.6, 0.7], "MDM": [0.5, 0.5]}, subjects=(1, 2)),
                                              scores({"TS+LR": [0.6, 0.6], "MDM": [0.5, 0.6]}, subjects=(1, 2),
                                                     evaluation="CrossSubject")]), command="part a")
    b = run_folder(tmp_path / "b", pd.concat([scores({"TS+LR": [0.8, 0.9], "MDM": [0.6, 0.6]}, subjects=(3, 4)),
                                              scores({"TS+LR": [0.7, 0.7], "MDM": [0.6, 0.7]}, subjects=(3, 4),
                                                     evaluation="CrossSubject")]), command="part b")
    argv = ["moabb", "--combine", str(a), str(b), "--out", str(tmp_path / "ab")]
    monkeypatch.setattr(sys, "argv", ["__main__.py", *argv])
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    within = store.read_record("moabb-withinsession-4", records)
    assert within["facts"]["run_commands"] == ["part a", "part b"] and within["wall_seconds"] is None
    assert within["facts"]["run_wall_seconds"] == [60.0, 60.0]  # each run's own; no one run wrote it
    assert within["command"].startswith("python -m benchmarks.experiments moabb --combine")
    assert render.units(within, "mdm") == "4" and render.difference(within, "mdm") == "−20.0 ± 4.1"
    cross = store.read_record("moabb-crosssubject-loso2x2", records)
    assert cross["facts"]["split"] == "leave one subject out within each of 2 runs' subjects"
    assert "record: " in capsys.readouterr().out
    # one folder again: its record is the run's own, under its own command
    me.write_records([a])
    assert store.read_record("moabb-withinsession-2", records)["command"] == "part a"


def test_group_k_fold_records_are_paired_by_fold(tmp_path, records):
    from benchmarks.records import render, store

    table = scores({"TS+LR": [0.6, 0.7], "SPDnet": [0.7, 0.7]}, subjects=(1, 5), evaluation="CrossSubject")
    me.write_records([run_folder(tmp_path / "run", table, cross_folds=2, subjects=[1, 2, 3, 4, 5, 6, 7, 8])])
    record = store.read_record("moabb-crosssubject-groupkfold2-8", records)  # named by the run's subjects
    assert record["paired_by"] == "fold" and "scored as one" in record["facts"]["unit"]
    assert record["facts"]["subjects"] == [1, 2, 3, 4, 5, 6, 7, 8] and render.units(record, "spdnet") == "2"


def test_a_folder_without_its_run_file_writes_no_record(tmp_path, records):
    (tmp_path / "old").mkdir()
    scores({"TS+LR": [0.5, 0.6, 0.7]}).to_csv(tmp_path / "old" / "scores.csv", index=False)
    with pytest.raises(SystemExit, match="run.json is missing"):
        me.write_records([tmp_path / "old"])
    assert not records.exists()
