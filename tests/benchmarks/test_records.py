"""Records (``benchmarks/records``): storage, paired statistics, rendered views and blocks."""

import json

import numpy as np
import pytest
from scipy.stats import wilcoxon

from benchmarks.records import paired, render, store
from benchmarks.records.quotes import mismatched_commands, quoted_figures, unbacked_figures


def write(folder, rows=None, name="demo"):
    rows = rows or {"ref": {"label": "TS+LR", "scores": {"f1": {0: 60.0, 1: 62.0, 2: 64.0, 3: 58.0}}},
                    "net": {"label": "SPDnet", "scores": {"f1": {0: 61.0, 1: 64.0, 2: 63.0, 3: 60.0}}}}
    return store.write_record(name, title="demo", command="python -m demo", rows=rows, metrics={"f1": "F1 (%)"},
                              reference="ref", paired_by="seed", wall_seconds=90, folder=folder,
                              measured_on={"cpu": "CPU", "cores": 2, "python": "3.11", "torch": "2.13",
                                           "load_average": 0.5})


def test_a_record_is_replaced_by_its_rerun_and_read_back(tmp_path):
    write(tmp_path)
    path = write(tmp_path, {"ref": {"label": "TS+LR", "scores": {"f1": {0: 50.0}}}})
    record = store.read_record("demo", tmp_path)
    assert store.record_names(tmp_path) == ["demo"]
    assert record["rows"] == {"ref": {"label": "TS+LR", "scores": {"f1": {"0": 50.0}}}}
    assert record["command"] == "python -m demo" and record["wall_seconds"] == 90.0
    assert json.loads(path.read_text())["package"]


def test_a_record_needs_its_reference_row_and_a_missing_record_says_so(tmp_path):
    with pytest.raises(ValueError, match="reference row"):
        store.write_record("x", title="", command="", rows={}, metrics={}, reference="ref", paired_by="seed",
                           wall_seconds=1, folder=tmp_path)
    with pytest.raises(FileNotFoundError, match="no record 'x'"):
        store.read_record("x", tmp_path)


def test_paired_difference_mean_se_wins_and_wilcoxon():
    a = {0: 61.0, 1: 64.0, 2: 63.0, 3: 60.0, 4: 70.0}
    b = {0: 60.0, 1: 62.0, 2: 64.0, 3: 58.0, 5: 10.0}  # unit 4 and 5 unpaired: left out
    d = paired.paired_difference(a, b)
    diffs = np.array([1.0, 2.0, -1.0, 2.0])
    assert d.mean == pytest.approx(diffs.mean()) and d.n == 4 and d.higher == 3
    assert d.se == pytest.approx(diffs.std(ddof=1) / 2)
    assert d.p == pytest.approx(wilcoxon(diffs).pvalue)
    assert d.reading == "level"  # 1.0 ± 0.71: within two standard errors


@pytest.mark.parametrize("diffs, reading", [((3.0, 3.5, 2.5, 3.0), "higher"), ((-3.0, -3.5, -2.5, -3.0), "lower"),
                                            ((3.0,), "one unit")])
def test_a_difference_is_a_win_only_beyond_two_standard_errors(diffs, reading):
    d = paired.paired_difference(dict(enumerate(diffs)), dict.fromkeys(range(len(diffs)), 0.0))
    assert d.reading == reading


def test_views_compute_every_figure_from_the_record(tmp_path):
    write(tmp_path)
    record = store.read_record("demo", tmp_path)
    assert render.mean(record, "ref") == "61.0"
    assert render.mean_sd(record, "net") == "62.0 ± 1.8"
    assert render.difference(record, "net") == "+1.0 ± 0.7"
    assert render.reading(record, "net") == "level"
    assert "higher on 3 of 4 seeds" in render.comparison(record, "net")
    assert render.pair(record, "ref", "net").startswith("−1.0 ± 0.7, higher on 1 of 4 seeds")
    table = render.paired_table(record)
    assert "| SPDnet | 62.0 ± 1.8 | 4 | +1.0 ± 0.7 | 3 of 4 |" in table and "| level |" in table
    assert render.wall(record) == "1.5 min"


def test_a_row_that_predicts_one_class_reads_as_chance_not_as_a_score(tmp_path):
    rows = {"ref": {"label": "TS+LR", "scores": {"f1": {0: 60.0, 1: 62.0, 2: 64.0}}},
            "dp": {"label": "DP model", "scores": {"f1": {0: 12.8, 1: 12.8, 2: 12.8}}},
            "net": {"label": "SPDnet", "scores": {"f1": {0: 20.0, 1: 22.0, 2: 21.0}}}}
    store.write_record("demo", title="demo", command="c", rows=rows, metrics={"f1": "F1 (%)"}, reference="ref",
                       paired_by="seed", wall_seconds=1, folder=tmp_path, facts={"predicts_one_class": ["dp"]})
    record = store.read_record("demo", tmp_path)
    assert render.reading(record, "dp") == render.versus(record, "dp") == render.ONE_CLASS
    assert render.comparison(record, "dp").endswith(": predicts one class (chance)")
    assert render.pair(record, "net", "dp").endswith(": predicts one class (chance)")
    assert render.reading(record, "net") == "lower" and render.pair(record, "net", "ref").endswith(": lower")
    assert "| 0 of 3 | 0.250 | predicts one class (chance) |" in render.paired_table(record)


def test_a_reading_from_one_training_seed_says_so_when_the_units_are_subjects(tmp_path):
    subjects = range(12)
    rows = {"ref": {"label": "Recenter+TS+LR", "scores": {"f1": {s: 60.0 + s for s in subjects}}},
            "net": {"label": "SPDnet", "scores": {"f1": {s: 64.0 + s + 0.5 * (s % 2) for s in subjects}}},
            "ts": {"label": "TS+LR", "scores": {"f1": {s: 55.0 + s + 0.5 * (s % 2) for s in subjects}}}}
    store.write_record("demo", title="demo", command="c", rows=rows, metrics={"f1": "F1 (%)"}, reference="ref",
                       paired_by="subject", wall_seconds=1, folder=tmp_path, facts={"one_training_seed": ["net"]})
    record = store.read_record("demo", tmp_path)
    assert render.reading(record, "net") == "higher, one training seed"
    assert render.versus(record, "net") == "higher than Recenter+TS+LR, one training seed"
    assert render.pair(record, "ts", "net").endswith(": lower, one training seed")
    assert render.reading(record, "ts") == "lower"  # no network in the pair: no training seed
    assert render.comparison(record, "net").endswith(": higher, one training seed")


def test_blocks_are_rendered_from_their_record_and_stale_ones_found(tmp_path, monkeypatch):
    write(tmp_path)
    monkeypatch.setattr(render, "read_record", lambda name: store.read_record(name, tmp_path))
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("SPDnet: <!-- record:demo difference net -->+9.9 ± 9.9<!-- /record --> points.\n")
    assert render.stale_pages(tmp_path) == [page]
    page.write_text(render.render_text(page.read_text()))
    assert page.read_text() == "SPDnet: <!-- record:demo difference net -->+1.0 ± 0.7<!-- /record --> points.\n"
    assert render.stale_pages(tmp_path) == []
    assert render.render_text(page.read_text(), keep_markers=False) == "SPDnet: +1.0 ± 0.7 points.\n"


def read_records_from(folder, monkeypatch):
    """Pages read their records from ``folder``."""
    monkeypatch.setattr(render, "read_record", lambda name: store.read_record(name, folder))
    monkeypatch.setattr("benchmarks.records.quotes.read_record", lambda name: store.read_record(name, folder))


def test_a_figure_no_record_gives_is_caught(tmp_path, monkeypatch):
    write(tmp_path)
    read_records_from(tmp_path, monkeypatch)
    block = "<!-- record:demo mean-sd net -->62.0 ± 1.8<!-- /record -->"
    assert unbacked_figures(f"SPDnet {block}, TS+LR 61.0; `lr=1e-3, 0.85`, torch 2.13.0.") == []
    assert unbacked_figures(f"SPDnet {block}, 93 % of TS+LR, +2.2 points.") == ["93 %", "+2.2"]


def test_figures_in_code_links_and_versions_are_not_quotes():
    text = ("Run `make experiment` (0.5 s) ``x=0.9``, [page](a/1.5.md), torch 2.13.0.\n\n"
            "```python\nclf(lr=0.01)\n```\n\n.. code-block:: bash\n\n   pip 1.5\n\nthen −3.5 ± 1.2 and 12 %.\n")
    assert quoted_figures(text) == ["0.5", "−3.5", "1.2", "12 %"]


def test_a_table_one_run_records_every_cell_per_seed(tmp_path, monkeypatch):
    from benchmarks.experiments import table_one, table_one_report
    from benchmarks.experiments.table_one_cells import CELLS
    from benchmarks.experiments.table_one_protocols import PROFILES, PROTOCOLS

    written = {}

    def write_record(name, **kw):
        written[name] = kw
        return tmp_path

    monkeypatch.setattr(table_one_report, "write_record", write_record)
    results = {cell: [{"seed": s, "f1": 0.5 + 0.01 * s, "accuracy": 0.6, "n_params": None, "fit_seconds": 6.0}
                      for s in range(2)] for cell in CELLS}
    args = table_one.parse(["--jobs", "2"], table_one.DATASETS)[1]
    lines = table_one.record_lines(args, False, "quick", PROTOCOLS, {"PhysionetMI": ("", results, None)},
                                   PROFILES["quick"], "python -m benchmarks.experiments table-one --jobs 2", 600.0, 0)
    kw = written["tableone-quick-physionetmi"]
    assert lines == [f"Record: {tmp_path} (10.0 min wall, 0 runs cached at the start)"]
    assert kw["reference"] == "centralized/ts-lr" and set(kw["rows"]) == {c.key for c in CELLS}
    assert kw["rows"]["centralized/ts-lr"]["scores"]["macro_f1"] == {0: 50.0, 1: 51.0}
    assert kw["command"] == "python -m benchmarks.experiments table-one --jobs 2" and kw["facts"]["runs"] == 2 * len(CELLS)


@pytest.mark.parametrize("option", [["--only", "centralized"], ["--seeds", "2"], ["--report-only"], ["--no-record"]])
def test_a_partial_table_one_run_writes_no_record(option):
    from benchmarks.experiments import table_one

    args = table_one.parse(["--jobs", "2", *option], table_one.DATASETS)[1]
    assert not table_one.whole_profile(args, custom=False)
    assert table_one.record_lines(args, False, "quick", {}, {}, None, "", 1.0, 0)[0].startswith("Record: none written")


def test_per_subject_scores_are_recorded_against_a_reference_pipeline(tmp_path, monkeypatch):
    import pandas as pd

    from benchmarks.experiments import report

    monkeypatch.setattr(report, "write_record", lambda name, **kw: store.write_record(name, folder=tmp_path, **kw))
    scores = pd.DataFrame([{"pipeline": p, "subject": s, "balanced_accuracy": v, "roc_auc": v + 1}
                           for p, values in {"Recenter+TS+LR": {1: 60.0, 2: 70.0},
                                             "FedSPDnet+dBN, subject domains": {1: 65.0, 2: 72.0}}.items()
                           for s, v in values.items()])
    report.write_subject_record("unseen", "Unseen", scores, "Recenter+TS+LR", 60.0, {"subjects": 2})
    record = store.read_record("unseen", tmp_path)
    assert record["reference"] == "recenter-ts-lr" and record["paired_by"] == "subject"
    assert record["rows"]["fedspdnet-dbn-subject-domains"]["label"] == "FedSPDnet+dBN, subject domains"
    assert render.difference(record, "fedspdnet-dbn-subject-domains") == "+3.5 ± 1.5"
    assert render.mean(record, "recenter-ts-lr", "roc_auc") == "66.0"


def write_speed(folder, name="speed-demo"):
    from benchmarks.records import speed

    return speed.write_speed_record(
        name, title="demo step", times={"ours": [4.0, 4.2, 3.9, 4.1], "theirs": [8.0, 8.3, 8.1, 7.9]},
        reference="theirs", labels={"ours": "skfedspd"}, started=0.0, facts={"target": "≥ 1.6×", "peak": "0.456"},
        command="python benchmarks/bench_demo.py --reps 4", folder=folder)


def test_a_speed_script_writes_its_repetitions_as_a_record(tmp_path):
    from benchmarks.records import speed

    assert speed.write_speed_record("none", title="", times={}, reference="", started=0.0, folder=tmp_path) is None
    write_speed(tmp_path)
    record = store.read_record("speed-demo", tmp_path)
    assert record["paired_by"] == "repetition" and record["reference"] == "theirs"
    assert record["metrics"] == {"ms": "milliseconds per step"}
    assert record["rows"]["ours"] == {"label": "skfedspd", "scores": {"ms": {"0": 4.0, "1": 4.2, "2": 3.9, "3": 4.1}}}
    assert record["command"] == "python benchmarks/bench_demo.py --reps 4"
    assert speed.script_command([str(speed.ROOT / "benchmarks" / "bench_x.py"), "--reps", "7"]) == \
        "python benchmarks/bench_x.py --reps 7"


def test_speed_views_give_medians_ratios_and_targets(tmp_path):
    write_speed(tmp_path)
    record = store.read_record("speed-demo", tmp_path)
    assert render.median(record, "ours") == "4.05" and render.median(record, "theirs") == "8.05"
    assert render.ratio(record, "theirs", "ours") == "1.99×"
    table = render.median_table(record)
    assert "| skfedspd | 4.05 | 3.98–4.12 | 4 | 0.503× |" in table
    assert render.reached(record, "target", "ratio", "theirs", "ours") == "reached"
    assert render.reached(record, "target", "ratio", "ours", "theirs") == "not reached"
    assert [render.significant(v) for v in (0.29345, 152.8, 12.64, 1.0, 99.96, 11593)] == \
        ["0.293", "153", "12.6", "1.00", "100", "11593"]


def test_speed_figures_are_given_and_others_caught(tmp_path, monkeypatch):
    write_speed(tmp_path)
    read_records_from(tmp_path, monkeypatch)
    block = "<!-- record:speed-demo median ours -->4.05<!-- /record -->"
    assert unbacked_figures(f"{block} ms; 1.99× faster, 0.503 of it; peak 0.456 GiB; 3.98 to 4.12.") == []
    assert unbacked_figures(f"{block} ms; 2.04× faster.") == ["2.04"]


def test_a_median_table_shows_part_of_the_rows_against_the_first_one(tmp_path):
    write_speed(tmp_path)
    record = store.read_record("speed-demo", tmp_path)
    table = render.median_table(record, "ms", "ours")
    assert "/ skfedspd |" in table and "| skfedspd | 4.05 | 3.98–4.12 | 4 | 1.00× |" in table and "theirs" not in table


def test_a_record_carries_the_commit_and_the_library_versions(tmp_path):
    from benchmarks._machine import LIBRARIES, git_commit

    record = store.read_record("demo", write(tmp_path).parent)
    assert list(record["versions"]) == list(LIBRARIES.values())
    assert record["versions"]["numpy"] == np.__version__ and record["versions"]["scikit-learn"]
    assert record["commit"] == git_commit()
    assert record["commit"] is None or (len(record["commit"]["sha"]) == 40 and isinstance(record["commit"]["dirty"], bool))


def test_a_run_names_the_commit_it_started_from(monkeypatch):
    from benchmarks import _machine

    monkeypatch.setattr(_machine, "_CODE_COMMIT", [])
    commits = iter([{"sha": "a" * 40, "dirty": False}, {"sha": "b" * 40, "dirty": False}])
    monkeypatch.setattr(_machine, "git_commit", lambda: next(commits))
    assert _machine.code_commit()["sha"] == "a" * 40
    assert _machine.code_commit()["sha"] == "a" * 40  # a commit made during the run is not its


def test_the_commit_is_the_checkouts_and_says_whether_its_tracked_files_changed(tmp_path):
    import subprocess

    from benchmarks._machine import git_commit

    assert git_commit(tmp_path) is None  # not a git checkout

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "code.py").write_text("a = 1\n")
    (tmp_path / "benchmarks" / "records" / "data").mkdir(parents=True)
    (tmp_path / "benchmarks" / "records" / "data" / "r.json").write_text("{}\n")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    sha = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert git_commit(tmp_path) == {"sha": sha, "dirty": False}
    (tmp_path / "benchmarks" / "records" / "data" / "r.json").write_text("{\"new\": 1}\n")
    (tmp_path / "untracked.txt").write_text("x\n")
    assert git_commit(tmp_path) == {"sha": sha, "dirty": False}  # a rewritten record, an untracked file
    (tmp_path / "code.py").write_text("a = 2\n")
    assert git_commit(tmp_path) == {"sha": sha, "dirty": True}
    assert git_commit(tmp_path / "benchmarks") is None  # inside a checkout, not one


def test_provenance_shows_commit_and_versions_or_says_they_were_not_recorded(tmp_path):
    record = store.read_record("demo", write(tmp_path).parent)
    record["commit"] = {"sha": "0123456789abcdef" * 2 + "01234567", "dirty": True}
    record["versions"] = {"numpy": "2.4.6", "Flower": None}
    line = render.provenance(record)
    assert "commit 0123456789ab, with uncommitted changes; numpy 2.4.6, Flower not installed" in line
    assert "1.5 min wall" in line
    old = {key: value for key, value in record.items() if key not in ("commit", "versions")}
    old["wall_seconds"] = None  # a record that kept a sum of fit times, not a wall time
    line = render.provenance(old)
    assert "(commit not recorded; library versions not recorded)" in line and "wall time not recorded, " in line
    assert render.wall(old) == "wall time not recorded" and render.commit(dict(record, commit=None)) == "not a git checkout"


def test_a_command_beside_a_block_must_be_its_records(tmp_path, monkeypatch):
    write(tmp_path)  # command: python -m demo
    write_speed(tmp_path)  # command: python benchmarks/bench_demo.py --reps 4
    read_records_from(tmp_path, monkeypatch)
    block = "<!-- record:speed-demo median ours -->4.05<!-- /record -->"
    table = "<!-- record:speed-demo median-table -->\n\n| a |\n\n<!-- /record -->"
    assert mismatched_commands(f"Run `python benchmarks/bench_demo.py --reps 4`: {block} ms.") == []
    assert mismatched_commands(f"Run `python -m benchmarks.bench_demo  --reps 4`: {block} ms.") == []
    assert mismatched_commands(f"Run ``python benchmarks/bench_demo.py``: {block} ms.") == [
        ("python benchmarks/bench_demo.py", {"speed-demo": "python benchmarks/bench_demo.py --reps 4"})]
    # a code block just before or after a block that stands alone, and a row of a table
    fenced = "```sh\nnice python benchmarks/bench_demo.py \\\n  --reps 5  # five\n```"
    assert [c for c, _ in mismatched_commands(f"{table}\n\n{fenced}\n")] == ["python benchmarks/bench_demo.py --reps 5"]
    assert [c for c, _ in mismatched_commands(f"| x | {block} |\n| y | `python benchmarks/bench_demo.py` |")] == []
    assert [c for c, _ in mismatched_commands(f"| x | {block} `python benchmarks/bench_demo.py` |")] == [
        "python benchmarks/bench_demo.py"]
    # another script, or a paragraph away from the block: not a command of its figures
    assert mismatched_commands(f"`python benchmarks/bench_other.py` {block}\n\nThen `python benchmarks/bench_demo.py`.") == []


def test_whole_numbers_and_number_words_that_state_results_are_figures():
    text = ("SPDnet is five points higher (+7 points; 3 points), three times faster, 2× the memory; a round in "
            "25 s and 550 MiB. Not results: 16 subjects, 8-32 Hz, 64 channels, 2026, 8×8 and 18 × 18 matrices, "
            "8 × St(64, 18), section 3, eight times the fits, Python 3.11.7, a 2-core VM, 24 GiB of it.")
    assert quoted_figures(text) == ["five", "+7", "3", "three", "2", "25", "550"]


def test_a_whole_number_is_backed_by_a_value_that_rounds_to_it(tmp_path, monkeypatch):
    write(tmp_path)  # SPDnet − TS+LR: +1.0 ± 0.7; means 61.0 and 62.0
    read_records_from(tmp_path, monkeypatch)
    block = "<!-- record:demo difference net -->+1.0 ± 0.7<!-- /record -->"
    assert unbacked_figures(f"SPDnet {block}: one point higher, +1 point, 62 points of F1.") == []
    assert unbacked_figures(f"SPDnet {block}: five points higher, +7 points, −1 point.") == ["five", "+7", "−1"]
