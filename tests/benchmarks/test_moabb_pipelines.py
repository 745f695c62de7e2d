"""The MOABB pipeline files of ``benchmarks/experiments/moabb_pipelines`` (FedSPDnet-ProjAvg in
YAML, FedSPDnet-RLAvg in Python): they parse with the settings of the harness's Table I
protocol (``table_one_protocols``), and ``moabb.benchmark`` runs both end to end, offline, on a ``FakeDataset`` with a tiny budget (copies of the files with
``n_rounds`` 150 -> 2).

Measured (moabb 1.7.2, 2 busy cores): the benchmark test takes about 2-3 s (12 s for a
cold first run), the parsing test well under 1 s, besides importing moabb (~3-5 s). On
the fake data (white noise) both pipelines score ROC-AUC 0.46 and 0.665 on the two subjects: after 2 rounds at lr 1e-3
ProjAvg and RLAvg global models differ by ~1e-7, too little to change a ranking.
"""

import importlib.util
import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("moabb") is None, reason="moabb is not installed"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),  # moabb's matplotlib use
    pytest.mark.filterwarnings("ignore:Creating a dataset without passing data"),  # h5py, MOABB
    pytest.mark.usefixtures("torch_single_thread"),
]

PIPELINE_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "experiments" / "moabb_pipelines"
NAMES = {"FedSPDnet-ProjAvg", "FedSPDnet-RLAvg"}
PARADIGMS = {"LeftRightImagery", "MotorImagery"}
# SPDnet's first BiMap maps to 18 dimensions: the fake recordings need at least 18 channels
# (names of the standard_1005 montage that FakeDataset applies).
FAKE_CHANNELS = ("C3", "Cz", "C4", "FC3", "FCz", "FC4", "CP3", "CPz", "CP4", "C1", "C2",
                 "C5", "C6", "FC1", "FC2", "CP1", "CP2", "F3", "Fz", "F4")
N_ROUNDS_RE = re.compile(r"\bn_rounds(\s*[:=]\s*)150\b")


def _by_name(configs):
    return {c["name"]: c for c in configs}


def test_pipelines_parse_with_benchmark_settings():
    """``parse_pipelines_from_directory`` reads both files, with the original budgets."""
    from moabb.pipelines.utils import parse_pipelines_from_directory
    from pyriemann.estimation import Covariances

    from benchmarks.experiments.table_one_protocols import LOCAL_EPOCHS, PROTOCOLS
    from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
    from skfedspd.classifier import auto_hidden_dim

    configs = _by_name(parse_pipelines_from_directory(str(PIPELINE_DIR)))
    assert set(configs) == NAMES
    for name, aggregation in (("FedSPDnet-ProjAvg", "projavg"), ("FedSPDnet-RLAvg", "rlavg")):
        config = configs[name]
        assert set(config["paradigms"]) == PARADIGMS
        steps = [step for _, step in config["pipeline"].steps]
        assert len(steps) == 2
        assert isinstance(steps[0], Covariances) and steps[0].estimator == "scm"
        fed = steps[1]
        assert isinstance(fed, FederatedSPDnetClassifier)
        assert fed.n_rounds == 150 and fed.clients.groups_per_client == 2
        assert fed.aggregation == aggregation
        assert fed.local_epochs == 2 and fed.random_state == 0
        # The YAML leaves the local model to the default, SPDnetClassifier(): hidden_dims="auto",
        # the paper's 18 at PhysionetMI's 64 channels.
        local = fed.estimator if fed.estimator is not None else SPDnetClassifier()
        dims = (auto_hidden_dim(64),) if isinstance(local.hidden_dims, str) else tuple(local.hidden_dims)
        assert dims == (18,) and local.eps == 1e-2
        # The harness's Table I protocol on PhysionetMI: the same settings.
        physionet = PROTOCOLS["PhysionetMI"]
        assert (physionet.hidden_dim, physionet.eps, fed.local_epochs) == (dims[0], local.eps, LOCAL_EPOCHS)


@pytest.fixture
def small_pipeline_dir(tmp_path):
    """Copies of the pipeline files with ``n_rounds`` 150 -> 2."""
    target = tmp_path / "pipelines"
    target.mkdir()
    for source in sorted(PIPELINE_DIR.iterdir()):
        if source.suffix not in (".yml", ".py"):
            continue
        text = source.read_text()
        small, n = N_ROUNDS_RE.subn(r"n_rounds\g<1>2", text)
        assert n == 1, f"{source.name}: expected one 'n_rounds' of 150, found {n}"
        (target / source.name).write_text(small)
    assert {p.suffix for p in target.iterdir()} == {".yml", ".py"}
    return target


@pytest.fixture
def fake_dataset(fake_moabb):
    """A 2-subject, 1-session left/right FakeDataset with 20 channels."""
    return fake_moabb(event_list=["left_hand", "right_hand"], n_sessions=1, n_runs=1, n_subjects=2,
                      channels=FAKE_CHANNELS, n_events=40, duration=100)


def test_benchmark_runs_both_pipelines_on_fake_data(small_pipeline_dir, fake_dataset, tmp_path):
    """``moabb.benchmark`` (WithinSession, 2 folds) on the fake dataset: both pipelines, for
    both paradigms they declare, get a finite score for each subject."""
    import moabb
    from moabb.pipelines.utils import parse_pipelines_from_directory

    small = _by_name(parse_pipelines_from_directory(str(small_pipeline_dir)))
    assert set(small) == NAMES
    assert all(c["pipeline"].steps[-1][1].n_rounds == 2 for c in small.values())

    mne_logger = logging.getLogger("mne")
    old_level = mne_logger.level  # benchmark() calls mne.set_log_level(False)
    try:
        results = moabb.benchmark(
            pipelines=str(small_pipeline_dir),
            evaluations=["WithinSession"],
            include_datasets=[fake_dataset],
            results=str(tmp_path / "results"),
            output=str(tmp_path / "output"),
            overwrite=True,
            n_jobs=1,
            n_splits=2,
            plot=False,
        )
    finally:
        mne_logger.setLevel(old_level)

    assert set(results["pipeline"]) == NAMES
    assert set(results["paradigm"]) == PARADIGMS
    assert set(results["dataset"]) == {fake_dataset.code}
    for (paradigm, name), rows in results.groupby(["paradigm", "pipeline"]):
        assert sorted(rows["subject"].astype(int)) == [1, 2], (paradigm, name)
        scores = rows["score"].to_numpy(dtype=float)
        assert np.all(np.isfinite(scores)) and np.all((scores >= 0) & (scores <= 1)), (paradigm, name, scores)
        assert all(math.isclose(n, 40) for n in rows["samples"]), rows["samples"]  # the session
    for paradigm in PARADIGMS:
        assert (tmp_path / "output" / paradigm / "analysis" / "data.csv").is_file()
