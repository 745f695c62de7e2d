"""Tests of the Table I experiment script (benchmarks/physionet_experiment.py), offline.

A MOABB FakeDataset shaped like Weibo2014 (7 classes, 200 Hz, 4 subjects → 2 clients) goes
through the same path as Weibo2014 (``load_moabb``): the smoke budget fits every cell of
the table, the unseen-subject table and the report; a second call is served from the
JSON cache. An unreachable dataset gives one line and the rest goes on.
"""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from skfedspd.datasets import WEIBO2014_EVENTS, load_moabb
from skfedspd.eegnet import EEGNet

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
CHANNELS = ("C3", "Cz", "C4", "FC3", "FC4", "CP3")
N_TIMES = 400  # FakeDataset trials span [0, 3] s: 601 samples at 200 Hz


@pytest.fixture(scope="module")
def experiment():
    pytest.importorskip("moabb")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("physionet_experiment", BENCHMARKS / "physionet_experiment.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


@pytest.fixture
def fake_weibo(experiment, fake_moabb):
    from moabb.paradigms import MotorImagery

    dataset = fake_moabb(event_list=WEIBO2014_EVENTS, n_subjects=4, n_sessions=1, n_runs=1, n_events=70,
                         duration=260, sfreq=200, channels=CHANNELS)
    paradigm = MotorImagery(n_classes=7, events=list(WEIBO2014_EVENTS), fmin=8, fmax=32)
    return experiment.Protocol("FakeWeibo", hidden_dim=4, eps=1e-1, fs=200.0, n_times=N_TIMES,
                               moabb=lambda: (dataset, paradigm),
                               load=lambda: load_moabb(dataset, paradigm, n_times=N_TIMES)[:3])


def test_paper_protocols(experiment):
    """Per-dataset hyper-parameters of the paper (section IV)."""
    physionet, weibo = experiment.PROTOCOLS["PhysionetMI"], experiment.PROTOCOLS["Weibo2014"]
    assert (physionet.hidden_dim, physionet.eps, physionet.fs, physionet.n_times) == (18, 1e-2, 160.0, 480)
    assert (weibo.hidden_dim, weibo.eps, weibo.fs, weibo.n_times) == (22, 1e-1, 200.0, 800)
    # EEGNet on these shapes has the paper's parameter counts.
    assert sum(p.numel() for p in EEGNet(64, 480, 4, physionet.fs).parameters()) == 3284
    assert sum(p.numel() for p in EEGNet(60, 800, 7, weibo.fs).parameters()) == 5303
    spd = experiment.spdnet(weibo, 0, 10)
    assert (spd.hidden_dims, spd.eps, spd.lr, spd.batch_size, spd.patience) == ((22,), 1e-1, 1e-3, 64, 75)
    fed = experiment.federated(experiment.spdnet(weibo, 0, 1), "rlavg", "half", 150, 0)
    assert (fed.n_rounds, fed.local_epochs, fed.clients_per_round, fed.patience) == (150, 2, 0.5, None)
    assert (fed.lr_patience, fed.lr_factor) == (40, 0.5)  # 20 rounds of full participation, in rounds
    full = experiment.federated(experiment.eegnet(weibo, 0, 1), "projavg", "full", 150, 0)
    assert (full.clients_per_round, full.lr_patience, full.patience) == (None, 20, None)


def test_smoke_run_on_weibo_shaped_data(experiment, fake_weibo, tmp_path, capsys):
    budget = experiment.PROFILES["smoke"]
    out = tmp_path / "FakeWeibo"
    label, results, figure, unseen = experiment.run_protocol(fake_weibo, budget, out)
    assert label == ("FakeWeibo", "FakeWeibo (4 subjects, 2 clients)")
    assert list(results) == experiment.experiment_keys()
    for key, records in results.items():
        (record,) = records
        assert 0.0 <= record["f1"] <= 1.0 and 0.0 <= record["accuracy"] <= 1.0
        model = key.split("/")[1]
        if key.startswith(("full", "half")):  # federated: every round, no early stopping
            assert len(record["curve"]) == (budget["eegnet_rounds"] if model == "eegnet" else budget["rounds"])
        if model == "eegnet":
            assert record["n_params"] == sum(p.numel() for p in EEGNet(len(CHANNELS), N_TIMES, 7, 200.0).parameters())
        elif model.startswith("spdnet"):
            assert record["n_params"] == len(CHANNELS) * 4 + 10 * 7 + 7  # BiMap 6x4, head on vech (10)
    assert figure.exists() and figure.stat().st_size > 0
    assert "FakeWeibo: pipeline (unseen subjects)" in unseen and "FedEEGNet (full)" in unseen
    assert "GroupKFold(2) over the 4 subjects" in unseen

    # Cached: a second call fits nothing and reads the same records.
    capsys.readouterr()
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*.json")}
    _, again, _, _ = experiment.run_protocol(fake_weibo, budget, out)
    assert again == results
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.json")} == stamps
    assert "runs to fit" not in capsys.readouterr().out

    text = experiment.table_one({label: results}, budget)
    assert "| FakeWeibo (4 subjects, 2 clients) | # params |" in text
    assert text.count("| FakeWeibo | ") == 4  # Centr., Full, Half + the references row
    assert "FedSPDnet Full / centralized SPDnet" in experiment.targets("FakeWeibo", results)


def test_only_runs_the_requested_keys(experiment, fake_weibo, tmp_path):
    _, results, _, unseen = experiment.run_protocol(fake_weibo, experiment.PROFILES["smoke"], tmp_path / "w",
                                                    only=["centralized/mdm"])
    assert list(results) == ["centralized/mdm"] and unseen is None
    assert [p.name for p in (tmp_path / "w").glob("*.json")] == ["centralized__mdm__seed0.json"]
    assert json.loads((tmp_path / "w" / "centralized__mdm__seed0.json").read_text())["key"] == "centralized/mdm"


def test_unreachable_dataset_gives_one_line(experiment, tmp_path, capsys):
    def unreachable():
        raise ConnectionError("no route to host")

    protocol = experiment.Protocol("Remote", hidden_dim=2, eps=1e-1, fs=200.0, n_times=8,
                                   moabb=unreachable, load=unreachable)
    assert experiment.run_protocol(protocol, experiment.PROFILES["smoke"], tmp_path / "r") is None
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == ["Remote: files not reachable (ConnectionError: no route to host); skipped, the rest goes on."]


def test_jobs_give_the_same_records(experiment, fake_weibo, tmp_path):
    """Parallel runs (one torch thread each) reproduce the serial records."""
    X, y, subjects = fake_weibo.load()
    from skfedspd.datasets import sample_covariance

    data = (sample_covariance(X), X, y, subjects)
    budget = experiment.PROFILES["smoke"]
    only = ["full/spdnet-projavg", "half/spdnet-rlavg"]
    serial = experiment.run_table(fake_weibo, data, budget, tmp_path / "serial", only)
    parallel = experiment.run_table(fake_weibo, data, budget, tmp_path / "parallel", only, jobs=2)
    for key in serial:
        for a, b in zip(serial[key], parallel[key]):
            assert (a["f1"], a["accuracy"]) == (b["f1"], b["accuracy"])
            np.testing.assert_array_equal(a["curve"], b["curve"])


def test_physionet_two_class_on_a_subject_list(experiment, physionet_root):
    protocol = experiment.physionet_protocol(n_classes=2, subjects=[2, 42])
    assert protocol.name == "PhysionetMI-2class" and (protocol.hidden_dim, protocol.eps) == (18, 1e-2)
    X, y, subjects = protocol.load()
    assert X.shape == (90, 64, 480) and set(y) == {"left_hand", "right_hand"}
    assert sorted(set(subjects)) == [2, 42]
    dataset, paradigm = protocol.moabb()
    assert dataset.subject_list == [2, 42] and dataset.feet_runs == [] and paradigm.resample is None


def test_physionet_subjects_beyond_the_offline_copy_go_to_moabb(experiment, monkeypatch):
    """Online: any subject list, through MOABB's download, resampled to 160 Hz; 88 excluded."""
    seen = {}

    def fake_load(dataset, paradigm, subjects=None, n_times=None, verbose=False):
        seen.update(subjects=dataset.subject_list, resample=paradigm.resample, n_times=n_times,
                    events=paradigm.events)
        return "X", "y", "subjects", "meta"

    monkeypatch.setattr(experiment, "load_moabb", fake_load)
    assert experiment.physionet_protocol(subjects=[1, 50, 109]).load() == ("X", "y", "subjects")
    assert seen == dict(subjects=[1, 50, 109], resample=160.0, n_times=480,
                        events=["left_hand", "right_hand", "feet", "hands"])
    with pytest.raises(ValueError, match=r"\[88\] are excluded"):
        experiment.physionet_protocol(subjects=[87, 88])
