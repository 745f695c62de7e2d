"""Tests of the Table I experiment (``python -m benchmarks.experiments table-one``), offline.

A MOABB FakeDataset shaped like Weibo2014 (7 classes, 200 Hz, 4 subjects → 2 clients) goes
through the same path as Weibo2014 (``load_moabb``): the smoke budget fits every cell of
the table, the unseen-subject table and the report; a second call is served from the
JSON cache, a changed configuration is refitted. The entry point prints its own lines and
the headline; library output goes to the log file.
"""

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.experiments import table_one
from benchmarks.experiments import table_one_protocols as protocols
from benchmarks.experiments import table_one_report as report
from benchmarks.experiments import table_one_runner as runner
from benchmarks.experiments.table_one_cells import CELLS, Cell
from benchmarks.experiments.table_one_protocols import PROFILES, PROTOCOLS, Protocol
from skfedspd.datasets import WEIBO2014_EVENTS, load_moabb, sample_covariance
from skfedspd.eegnet import EEGNet
from skfedspd.server_optimizer import ServerMomentum
from skfedspd.training import RoundSchedule

ROOT = Path(__file__).resolve().parents[2]
CHANNELS = ("C3", "Cz", "C4", "FC3", "FC4", "CP3")
N_TIMES = 400  # FakeDataset trials span [0, 3] s: 601 samples at 200 Hz
SMOKE = PROFILES["smoke"]
LEGACY_KEYS = ["centralized/ts-lr", "centralized/mdm", "centralized/spdnet", "centralized/eegnet",
               "full/spdnet-projavg", "full/spdnet-rlavg", "full/eegnet",
               "half/spdnet-projavg", "half/spdnet-rlavg", "half/eegnet"]
SERVER_MOMENTUM_KEYS = ["full+sm/spdnet-projavg", "half+sm/spdnet-projavg"]
RECOMMENDED_KEYS = ["centralized/spdnet-default", "centralized/spdnet-domain", "full+sm/spdnet-domain"]
FEDERATED_BASELINE_KEYS = ["full/fed-ts-lr"]


@pytest.fixture
def fake_weibo(fake_moabb):
    from moabb.paradigms import MotorImagery

    dataset = fake_moabb(event_list=WEIBO2014_EVENTS, n_subjects=4, n_sessions=1, n_runs=1, n_events=70,
                         duration=260, sfreq=200, channels=CHANNELS)
    paradigm = MotorImagery(n_classes=7, events=list(WEIBO2014_EVENTS), fmin=8, fmax=32)
    return Protocol("FakeWeibo", hidden_dim=4, eps=1e-1, fs=200.0, n_times=N_TIMES,
                    moabb=lambda: (dataset, paradigm),
                    load=lambda: load_moabb(dataset, paradigm, n_times=N_TIMES)[:3], offline=lambda: True)


def test_paper_protocols():
    """Per-dataset hyper-parameters of the paper (section IV)."""
    physionet, weibo = PROTOCOLS["PhysionetMI"], PROTOCOLS["Weibo2014"]
    assert (physionet.hidden_dim, physionet.eps, physionet.fs, physionet.n_times) == (18, 1e-2, 160.0, 480)
    assert (weibo.hidden_dim, weibo.eps, weibo.fs, weibo.n_times) == (22, 1e-1, 200.0, 800)
    # EEGNet on these shapes has the paper's parameter counts.
    assert sum(p.numel() for p in EEGNet(64, 480, 4, physionet.fs).parameters()) == 3284
    assert sum(p.numel() for p in EEGNet(60, 800, 7, weibo.fs).parameters()) == 5303
    spd = protocols.spdnet(weibo, 0, 10)
    assert (spd.hidden_dims, spd.eps, spd.lr, spd.batch_size, spd.schedule.patience) == ((22,), 1e-1, 1e-3, 64, 75)
    # The paper's centralized protocol, not the package's small-data defaults.
    assert (spd.early_stopping, spd.validation_metric) == (True, "f1")


@pytest.mark.parametrize("participation, lr_patience, clients_per_round", [(1.0, 20, None), (0.5, 40, 0.5)])
@pytest.mark.parametrize("local", [protocols.spdnet, protocols.eegnet])
def test_federated_schedule_is_set_in_one_place(local, participation, lr_patience, clients_per_round):
    """All T rounds; LR patience in rounds of full participation (20 / fraction)."""
    fed = protocols.federated(local(PROTOCOLS["Weibo2014"], 0, 1), "projavg", participation, 150, 0)
    assert (fed.n_rounds, fed.local_epochs, fed.clients_per_round, fed.clients.groups_per_client) == \
        (150, 2, clients_per_round, 2)
    schedule = protocols.federated_schedule(participation)
    assert {k: fed.get_params()[k] for k in schedule} == schedule
    assert fed.schedule == RoundSchedule(patience=None, lr_patience=lr_patience, lr_factor=0.5)  # in rounds
    assert fed.client_optimizer_state == "reset"  # the paper's clients: a fresh Adam every round


def test_cells_are_frozen_dataclasses():
    # cache names unchanged
    assert [c.key for c in CELLS] == LEGACY_KEYS + SERVER_MOMENTUM_KEYS + RECOMMENDED_KEYS + FEDERATED_BASELINE_KEYS
    assert all(dataclasses.is_dataclass(c) and type(c).__dataclass_params__.frozen for c in CELLS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        CELLS[0].model = "spdnet"
    half = Cell("half", "spdnet", "rlavg")
    assert (half.federated, half.participation, half.network, half.label) == \
        (True, 0.5, True, "FedSPDnet RLAvg (half)")
    assert Cell("full", "eegnet", "projavg").label == "FedEEGNet (full)"
    assert len(set(CELLS)) == len(CELLS) and Cell("half", "spdnet", "rlavg") in CELLS  # hashable, by value


@pytest.mark.parametrize("setting, participation", [("full+sm", 1.0), ("half+sm", 0.5)])
def test_server_momentum_rows_change_only_the_server(setting, participation):
    """The "+sm" rows: the paper's cell of the same participation plus the recommended
    server optimizer, nothing else."""
    from benchmarks.experiments.table_one_cells import SERVER_MOMENTUM

    sm, paper = Cell(setting, "spdnet", "projavg"), Cell(setting.split("+")[0], "spdnet", "projavg")
    assert sm in CELLS and (sm.participation, sm.server_optimized, paper.server_optimized) == (participation, True, False)
    assert sm.label == f"FedSPDnet ProjAvg ({setting.split('+')[0]} + server momentum)"
    built, reference = (runner.configuration(PROTOCOLS["Weibo2014"], c, 0, SMOKE) for c in (sm, paper))
    assert SERVER_MOMENTUM == {"lr": 1.0, "momentum": 0.9}
    assert {k for k in set(built) | set(reference) if built.get(k) != reference.get(k)} == {
        "server_optimizer__lr", "server_optimizer__momentum"}
    assert built["server_optimizer__momentum"] == 0.9 and "server_optimizer__momentum" not in reference


@pytest.mark.parametrize("args, match", [
    (("centralized", "spdnet", "projavg"), "only there"),
    (("full", "spdnet"), "only there"),
    (("full", "ts-lr", "projavg"), "centralized only"),
    (("quarter", "spdnet", "projavg"), "unknown setting"),
    (("full", "svm", "projavg"), "unknown model"),
    (("full", "spdnet", "fedavg"), "unknown aggregation"),
    (("half", "eegnet", "rlavg"), "FedAvg"),
    (("full+sm", "eegnet", "projavg"), "FedSPDnet ProjAvg only"),
    (("half+sm", "spdnet", "rlavg"), "FedSPDnet ProjAvg only"),
    (("full", "spdnet-default", "projavg"), "centralized only"),
    (("full", "spdnet-domain", "projavg"), "has server momentum"),
    (("full+sm", "spdnet-domain", "rlavg"), "FedSPDnet ProjAvg only"),
])
def test_invalid_cells_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        Cell(*args)


@pytest.mark.parametrize("model, batchnorm", [("spdnet-default", None), ("spdnet-domain", "domain")])
def test_recommended_centralized_rows_are_the_package_defaults(model, batchnorm):
    from skfedspd import SPDnetClassifier

    cell = Cell("centralized", model)
    assert cell.recommended and cell.network and cell.domains == (batchnorm == "domain")
    built = runner.build(PROTOCOLS["PhysionetMI"], cell, 3, PROFILES["quick"])
    assert built.get_params() == SPDnetClassifier(batchnorm=batchnorm, random_state=3).get_params()


def test_recommended_federation_pairs_server_momentum_with_fresh_client_adam():
    """Package defaults + per-subject domain BN + the server optimizer the ``server_momentum``
    docstring recommends (with ``client_optimizer_state="reset"``), on the paper's clients."""
    import warnings

    from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier

    quick = PROFILES["quick"]
    cell = Cell("full+sm", "spdnet-domain", "projavg")
    built = runner.build(PROTOCOLS["PhysionetMI"], cell, 3, quick)
    expected = FederatedSPDnetClassifier(SPDnetClassifier(batchnorm="domain"), n_rounds=quick.recommended_rounds,
                                         groups_per_client=2, client_optimizer_state="reset",
                                         server_optimizer=ServerMomentum(lr=1.0, momentum=0.9), random_state=3)
    plain = (int, float, str, bool, tuple, type(None))
    assert {k: v for k, v in built.get_params().items() if isinstance(v, plain)} == \
        {k: v for k, v in expected.get_params().items() if isinstance(v, plain)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        built.warn_about_settings()
    assert quick.seeds_for(cell) == quick.recommended_seeds and quick.rounds_for(cell) == quick.recommended_rounds


def test_difference_to_ts_lr_is_paired_by_seed():
    """Only the seeds (splits) both rows have are paired; no standard error from one seed."""
    default = Cell("centralized", "spdnet-default")
    results = {report.TS_LR: [{"seed": s, "f1": f} for s, f in enumerate([0.5, 0.6, 0.7])],
               default: [{"seed": s, "f1": f} for s, f in [(0, 0.6), (2, 0.75), (5, 0.9)]]}
    mean, se, wins, n = report.versus_ts_lr(results, default)
    assert (n, wins) == (2, 2) and mean == pytest.approx(7.5) and se == pytest.approx(2.5)
    assert report.with_difference(results, default) == "75.0 (+7.5 ± 2.5)"
    results[default] = [{"seed": 1, "f1": 0.5}]
    assert report.with_difference(results, default) == "50.0 (-10.0, 1 seed)"
    assert report.versus_ts_lr({default: results[default]}, default) is None
    assert report.with_difference({default: results[default]}, default) == "50.0"


def test_domain_rows_predict_each_test_subject_in_its_own_call():
    """Domain batch norm re-centres one call's matrices by their mean: one call per subject,
    the labels never truncated to the first call's string width."""
    class Recorder:
        classes_ = np.array(["feet", "left_hand"])

        def __init__(self):
            self.calls = []

        def predict(self, X):
            self.calls.append(X[:, 0].tolist())
            return self.classes_[(X[:, 0] > 0).astype(int)]

    X = np.array([[-1.0], [2.0], [3.0], [-4.0]])
    clf = Recorder()
    pred = runner.predict_per_subject(clf, X, np.array([7, 9, 7, 9]))
    assert clf.calls == [[-1.0, 3.0], [2.0, -4.0]]
    assert pred.tolist() == ["feet", "left_hand", "left_hand", "feet"]


def test_profiles():
    quick, full = PROFILES["quick"], PROFILES["full"]
    assert (full.seeds, full.rounds, full.eegnet_rounds, full.subjects) == (10, 150, 150, None)
    # Quick: sized by convergence (more rounds than the paper's T), fewer seeds and subjects.
    assert quick.rounds >= full.rounds and quick.eegnet_rounds >= full.eegnet_rounds
    assert quick.offline_only and quick.unseen_folds == 0
    # Cheap centralized cells get more seeds: one early stop on a small validation part is not representative.
    centralized = [Cell("centralized", m) for m in ("ts-lr", "mdm", "spdnet", "spdnet-default", "spdnet-domain")]
    assert {quick.seeds_for(c) for c in centralized} == {8}
    assert quick.seeds_for(Cell("full", "spdnet", "projavg")) == 1 and quick.seeds_for(Cell("centralized", "eegnet")) == 1
    # The recommended federation: the package's rounds (converged), enough seeds for a standard error.
    recommended = Cell("full+sm", "spdnet-domain", "projavg")
    assert (quick.seeds_for(recommended), quick.rounds_for(recommended)) == (4, 150)
    assert set(quick.subjects) <= set(protocols.PHYSIONET_OFFLINE_SUBJECTS) and len(quick.subjects) % 2 == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.rounds = 30


def test_configuration_names_the_subjects_and_the_schedule():
    cell = Cell("half", "spdnet", "projavg")
    config = runner.configuration(protocols.physionet_protocol(subjects=[1, 2]), cell, 0, SMOKE)
    assert config["subjects"] == [1, 2] and config["dataset"] == "PhysionetMI"
    assert config["schedule__lr_patience"] == 40 and config["n_rounds"] == SMOKE.rounds
    assert runner.configuration(protocols.physionet_protocol(), cell, 0, SMOKE) != config


def test_longest_fits_first_within_a_seed():
    ranked = sorted(CELLS, key=lambda c: -runner.cost(c))
    assert [c.key for c in ranked[:2]] == ["full/eegnet", "half/eegnet"]
    assert {c.key for c in ranked[-2:]} == {"centralized/ts-lr", "centralized/mdm"}


def test_select_cells_by_key():
    from benchmarks.experiments.table_one_cells import select

    assert select(None) == CELLS
    assert [c.key for c in select(["centralized", "eegnet"])] == \
        ["centralized/ts-lr", "centralized/mdm", "centralized/spdnet", "centralized/eegnet", "full/eegnet",
         "half/eegnet", "centralized/spdnet-default", "centralized/spdnet-domain"]
    assert [c.key for c in select(["spdnet-domain"])] == ["centralized/spdnet-domain", "full+sm/spdnet-domain"]
    with pytest.raises(ValueError, match="no cell matches"):
        select(["nothing"])


def test_smoke_run_on_weibo_shaped_data(fake_weibo, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="benchmarks")
    out = tmp_path / "FakeWeibo"
    label, results, unseen = runner.run_protocol(fake_weibo, SMOKE, out)
    assert label == "FakeWeibo (4 subjects, 2 clients)"
    assert list(results) == list(CELLS)
    for cell, records in results.items():
        (record,) = records
        assert record["key"] == cell.key and 0.0 <= record["f1"] <= 1.0 and 0.0 <= record["accuracy"] <= 1.0
        if cell.federated and cell.network:  # every round, no early stopping
            assert len(record["lr"]) == SMOKE.rounds_for(cell)
        if cell.recommended:  # package defaults: too few trials here to hold a validation part out
            assert record["curve"] == [] and "last (no validation part)" in report.convergence({("F", ""): results})
        if cell.model == "eegnet":
            assert record["n_params"] == sum(p.numel() for p in EEGNet(len(CHANNELS), N_TIMES, 7, 200.0).parameters())
        elif cell.model == "spdnet":
            assert record["n_params"] == len(CHANNELS) * 4 + 10 * 7 + 7  # BiMap 6x4, head on vech (10)
    assert "FakeWeibo: pipeline (unseen subjects)" in unseen and "FedEEGNet (full)" in unseen
    assert "GroupKFold(2) over the 4 subjects" in unseen
    assert list((out / "moabb").iterdir())  # MOABB's results store is under the output folder

    # Cached: a second call fits nothing and reads the same records.
    caplog.clear()
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*.json")}
    _, again, _ = runner.run_protocol(fake_weibo, SMOKE, out)
    assert again == results
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.json")} == stamps
    assert "runs to fit" not in caplog.text

    tables = {("FakeWeibo", label): results}
    text = report.table_one(tables, SMOKE)
    assert "| FakeWeibo (4 subjects, 2 clients) | # params |" in text
    assert text.count("| FakeWeibo | ") == 6  # Centr., Full, Half, Full / Half + server momentum, references
    assert "| FakeWeibo | Full + server momentum | – |" in text
    assert "FedSPDnet Full / centralized SPDnet" in report.targets("FakeWeibo", results)
    assert "Half - Full with server momentum" in report.targets("FakeWeibo", results)
    assert "| FakeWeibo | FedSPDnet ProjAvg (full) | 2 |" in report.convergence(tables)
    assert "| FakeWeibo | package | SPDnet + domain BN, package defaults |" in report.paired_table(tables)
    line = report.headline("FakeWeibo", results, "1 seed")
    f1 = {c.key: f"{100 * np.mean([r['f1'] for r in rs]):.1f}" for c, rs in results.items()}
    assert line.startswith("FakeWeibo test macro-F1 (%), 1 seed; in brackets the difference to TS+LR paired over "
                           f"seeds ± SE. Paper protocol: FedSPDnet (full, ProjAvg) {f1['full/spdnet-projavg']} (")
    for key, text in [("full+sm/spdnet-projavg", "with server momentum"), ("centralized/spdnet", "centralized SPDnet"),
                      ("full/eegnet", "FedEEGNet (full)"),
                      ("centralized/spdnet-default", "SPDnetClassifier() without the subjects"),
                      ("centralized/spdnet-domain", "SPDnetClassifier() given the subjects (domain BN)"),
                      ("full+sm/spdnet-domain", "FedSPDnet + domain BN + server momentum")]:
        assert f"{text} {f1[key]} (" in line, key
    assert line.endswith(f" TS+LR {f1['centralized/ts-lr']} (1 seed).") and ", 1 seed)" in line


def test_cache_of_another_configuration_is_refitted(fake_weibo, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="benchmarks")
    X, y, subjects = fake_weibo.load()
    data = (sample_covariance(X), X, y, subjects)
    cells = (Cell("full", "spdnet", "projavg"),)
    (first,) = runner.run_table(fake_weibo, data, SMOKE, tmp_path, cells)[cells[0]]
    assert first["config"]["n_rounds"] == 2 and first["config"]["estimator__schedule__lr_patience"] == 20
    longer = dataclasses.replace(SMOKE, rounds=3)
    caplog.clear()
    assert runner.run_table(fake_weibo, data, longer, tmp_path, cells, report_only=True) == {}
    assert "1 cached run(s)" in caplog.text and "left out of the report" in caplog.text
    (refitted,) = runner.run_table(fake_weibo, data, longer, tmp_path, cells)[cells[0]]
    assert len(refitted["curve"]) == 3 and "refitted" in caplog.text
    # A record without a configuration (an older script) is stale too.
    path = runner.record_path(tmp_path, cells[0], 0)
    path.write_text(json.dumps({k: v for k, v in refitted.items() if k != "config"}))
    assert runner.read_record(path, refitted["config"]) is None


def test_only_runs_the_requested_cells(fake_weibo, tmp_path):
    mdm = Cell("centralized", "mdm")
    _, results, unseen = runner.run_protocol(fake_weibo, SMOKE, tmp_path / "w", cells=(mdm,))
    assert list(results) == [mdm] and unseen is None
    assert [p.name for p in (tmp_path / "w").glob("*.json")] == ["centralized__mdm__seed0.json"]
    assert json.loads((tmp_path / "w" / "centralized__mdm__seed0.json").read_text())["key"] == "centralized/mdm"


def test_unreachable_dataset_gives_one_line(tmp_path, caplog):
    def unreachable():
        raise ConnectionError("no route to host")

    caplog.set_level(logging.INFO, logger="benchmarks")
    protocol = Protocol("Remote", hidden_dim=2, eps=1e-1, fs=200.0, n_times=8, moabb=unreachable, load=unreachable)
    assert runner.run_protocol(protocol, SMOKE, tmp_path / "r") is None
    assert caplog.messages == ["Remote: files not reachable (ConnectionError: no route to host); skipped, "
                               "the rest goes on."]
    assert not (tmp_path / "r").exists()


def test_offline_only_profile_skips_without_trying_to_download(tmp_path, caplog):
    def download():
        raise AssertionError("tried to download")

    caplog.set_level(logging.INFO, logger="benchmarks")
    protocol = Protocol("Remote", hidden_dim=2, eps=1e-1, fs=200.0, n_times=8, moabb=download, load=download,
                        offline=lambda: False)
    assert PROFILES["quick"].offline_only
    assert runner.run_protocol(protocol, PROFILES["quick"], tmp_path / "r") is None
    assert caplog.messages == ["Remote: not available offline; skipped (this profile never downloads; the full "
                               "profile gets it through MOABB)."]


def test_weibo_offline_check_reads_the_folder_without_creating_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MNE_DATASETS_WEIBO_PATH", str(tmp_path))
    from benchmarks.experiments import data

    assert data.weibo_folder() == tmp_path / "MNE-weibo-2014"
    assert not PROTOCOLS["Weibo2014"].offline() and not (tmp_path / "MNE-weibo-2014").exists()
    (tmp_path / "MNE-weibo-2014").mkdir()
    for s in range(1, 11):
        (tmp_path / "MNE-weibo-2014" / f"subject_{s}.mat").touch()
    assert PROTOCOLS["Weibo2014"].offline()


def test_jobs_give_the_same_records(fake_weibo, tmp_path):
    """Parallel runs (one torch thread each) reproduce the serial records."""
    X, y, subjects = fake_weibo.load()
    data = (sample_covariance(X), X, y, subjects)
    cells = (Cell("full", "spdnet", "projavg"), Cell("half", "spdnet", "rlavg"))
    serial = runner.run_table(fake_weibo, data, SMOKE, tmp_path / "serial", cells)
    parallel = runner.run_table(fake_weibo, data, SMOKE, tmp_path / "parallel", cells, jobs=2)
    for cell in cells:
        for a, b in zip(serial[cell], parallel[cell]):
            assert (a["f1"], a["accuracy"], a["config"]) == (b["f1"], b["accuracy"], b["config"])
            np.testing.assert_array_equal(a["curve"], b["curve"])


def test_entry_point_prints_the_headline_and_keeps_library_output_in_the_log(fake_weibo, tmp_path, capfd):
    out = tmp_path / "run"
    code = table_one.main(["--profile", "smoke", "--rounds", "3", "--out", str(out), "--docs", str(tmp_path / "docs")],
                          datasets={"FakeWeibo": fake_weibo})
    assert code == 0
    stdout, stderr = capfd.readouterr()
    lines = stdout.strip().splitlines()
    assert lines[0] == ("command: python -m benchmarks.experiments table-one --profile smoke --rounds 3 --out "
                        f"{out} --docs {tmp_path / 'docs'}")
    assert lines[-1].startswith("Headline: FakeWeibo test macro-F1 (%), 1 seed, 3 rounds; in brackets the difference "
                                "to TS+LR paired over seeds ± SE. Paper protocol: FedSPDnet (full, ProjAvg) ")
    assert len(json.loads((out / "FakeWeibo" / "half__eegnet__seed0.json").read_text())["curve"]) == 3
    for row in (", centralized SPDnet ", ", FedEEGNet (full) ", ". Single models: SPDnetClassifier() ",
                ". TS+LR "):
        assert row in lines[-1], row
    assert "## Paper protocol and the package's models against TS+LR" in (out / "report.md").read_text()
    assert "Recommended configurations" not in lines[-1]  # the recorded ensembles are PhysionetMI's
    figure = out / "FakeWeibo" / "FakeWeibo_val_f1.png"
    assert lines[-2] == f"Figure: {figure}" and figure.stat().st_size > 0
    for noise in ("Warning", "Used Annotations", "Setting up", "Filtering", "Not setting metadata",
                  "Reading", "moabb"):
        assert noise not in stdout, noise
    assert "Warning" not in stderr
    log_text = (out / "experiment.log").read_text()
    assert "mne:" in log_text or "moabb" in log_text  # library lines went to the log
    assert "FedSPDnet Full / centralized SPDnet" in (out / "report.md").read_text()
    assert (tmp_path / "docs" / "results-smoke.md").exists() and (tmp_path / "docs" / "FakeWeibo_val_f1_smoke.png").exists()
    # The entry point restored what it configured.
    import mne

    assert [type(h).__name__ for h in mne.utils.logger.handlers] == ["StreamHandler"]
    assert logging.getLogger("benchmarks").handlers == []


def test_import_has_no_side_effects(tmp_path):
    """No environment variable, logging or warning set-up, and no folder, from importing
    (compared with the state after importing the libraries it uses: scikit-learn sets
    KMP_* variables)."""
    probe = (
        "import os, logging, warnings, json, joblib, sklearn, skfedspd, skfedspd.datasets\n"
        "env, filters, show = dict(os.environ), list(warnings.filters), warnings.showwarning\n"
        "import benchmarks.experiments.table_one, benchmarks.experiments.table_one_ablation\n"
        "import benchmarks.experiments.flower_table_one, benchmarks.experiments.moabb_evaluation\n"
        "loggers = {n: len(l.handlers) for n, l in logging.root.manager.loggerDict.items()\n"
        "           if isinstance(l, logging.Logger) and n.startswith('benchmarks')}\n"
        "print(json.dumps([dict(os.environ) == env, warnings.showwarning is show, loggers,\n"
        "                  len(logging.root.handlers), os.listdir('.')]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    same_env, same_show, loggers, root_handlers, files = json.loads(done.stdout)
    assert same_env and same_show and root_handlers == 0 and files == []
    assert set(loggers.values()) <= {0}


def test_physionet_two_class_on_a_subject_list(physionet_root):
    protocol = protocols.physionet_protocol(n_classes=2, subjects=[2, 42])
    assert protocol.name == "PhysionetMI-2class" and (protocol.hidden_dim, protocol.eps) == (18, 1e-2)
    assert protocol.offline()
    X, y, subjects = protocol.load()
    assert X.shape == (90, 64, 480) and set(y) == {"left_hand", "right_hand"}
    assert sorted(set(subjects)) == [2, 42]
    dataset, paradigm = protocol.moabb()
    assert dataset.subject_list == [2, 42] and dataset.feet_runs == [] and paradigm.resample is None


def test_physionet_subjects_beyond_the_offline_copy_go_to_moabb(monkeypatch):
    """Online: any subject list, through MOABB's download, resampled to 160 Hz; 88 excluded."""
    seen = {}

    def fake_load(dataset, paradigm, subjects=None, n_times=None, verbose=False):
        seen.update(subjects=dataset.subject_list, resample=paradigm.resample, n_times=n_times,
                    events=paradigm.events)
        return "X", "y", "subjects", "meta"

    monkeypatch.setattr("skfedspd.datasets.load_moabb", fake_load)
    protocol = protocols.physionet_protocol(subjects=[1, 50, 109])
    assert not protocol.offline()
    assert protocol.load() == ("X", "y", "subjects")
    assert seen == dict(subjects=[1, 50, 109], resample=160.0, n_times=480,
                        events=["left_hand", "right_hand", "feet", "hands"])
    with pytest.raises(ValueError, match=r"\[88\] are excluded"):
        protocols.physionet_protocol(subjects=[87, 88])


def test_report_only_without_results_says_so(fake_weibo, tmp_path, capsys):
    out = tmp_path / "empty"
    assert table_one.main(["--profile", "smoke", "--report-only", "--out", str(out)], datasets={"FakeWeibo": fake_weibo}) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2:] == [f"FakeWeibo: no results in {out / 'FakeWeibo'}; nothing to report for it.", "Nothing to report."]
    assert not (out / "FakeWeibo").exists()


def test_the_headline_reads_the_recommended_configurations_from_their_record():
    from benchmarks.records import render
    from benchmarks.records.store import read_record

    record = read_record(table_one.RECOMMENDED_RECORD)
    sentence = report.recorded_recommended(record)
    assert f"`{record['command']}`" in sentence and "8 seeds" in sentence
    for label, row in report.RECORDED_RECOMMENDED.items():
        assert row in record["rows"], row
        assert f"{label} {render.mean(record, row)} ({render.difference(record, row)}: " in sentence
    baseline = render.pair(record, report.RECORDED_RECOMMENDED["five recommended federations (federated sites)"],
                           report.RECORDED_FEDERATED_BASELINE)
    assert f"federated classical baseline on the same clients {baseline}." in sentence
    assert report.headline("PhysionetMI", {}, "8 seeds", sentence).endswith(sentence)
    wider = read_record(table_one.WIDER_RECORD)
    both = report.recorded_recommended(record, wider)
    assert both.startswith(sentence) and f"Over 16 splits, these and new ones (record {wider['name']}" in both
    for label, row in report.RECORDED_RECOMMENDED.items():
        assert f"{label} {render.mean(wider, row)} ({render.difference(wider, row)}: " in both[len(sentence):]
