"""Tests of skfedspd.datasets on the offline PhysioNet eegmmidb files (../shared/data).

Tests marked ``real_eeg`` need the EDF files and are skipped where they are absent.
Measured trial counts (moabb 1.7.2): 4 classes, 90 trials for subjects 1, 4, 15, 42
(about 22 per class) and 60 for subjects 2, 3, 5-14 (about 22 left, 22 right, 7-8 hands,
7-8 feet); 2 classes, 45 trials for every subject. Trials have 481 samples at 160 Hz.
"""

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from skfedspd.datasets import (
    PHYSIONET_OFFLINE_SUBJECTS,
    SENSORIMOTOR_CHANNELS,
    configure_offline,
    find_physionet_root,
    load_physionet_mi,
    physionet_runs_present,
    sample_covariance,
)

real_eeg = pytest.mark.real_eeg

CLASSES_4 = {"left_hand", "right_hand", "feet", "hands"}
CLASSES_2 = {"left_hand", "right_hand"}
FULL = (1, 4, 15, 42)  # all six imagery runs
PARTIAL = (2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)  # runs 4, 6, 8, 12 only
ENV_KEYS = ("MNE_DATA", "MNE_DATASETS_EEGBCI_PATH", "MOABB_DOWNLOAD_PROVIDER")


def _counts(y):
    labels, counts = np.unique(y, return_counts=True)
    return dict(zip(labels.tolist(), counts.tolist()))


@pytest.fixture(scope="module")
def raw4(physionet_root):
    """4-class band-passed epochs of one complete and two partial subjects."""
    return load_physionet_mi(subjects=[1, 2, 3], n_classes=4, root=physionet_root, return_raw=True)


@pytest.fixture(scope="module")
def cov4(physionet_root):
    return load_physionet_mi(subjects=[1, 2, 3], n_classes=4, root=physionet_root)


@pytest.fixture(scope="module")
def cov2(physionet_root):
    return load_physionet_mi(subjects=[4, 2], n_classes=2, root=physionet_root)


def _assert_spd_volts(C):
    assert C.dtype == np.float64
    np.testing.assert_array_equal(C, np.swapaxes(C, 1, 2))
    eig = np.linalg.eigvalsh(C)
    assert np.all(eig > 0), eig.min()
    trace = np.trace(C, axis1=1, axis2=2)
    # volts², 64 channels, 8-32 Hz: traces measured 1.6e-9 .. 1.5e-7 on all 16 subjects
    # (microvolts would give ~1e4, MOABB's default unit_factor).
    assert np.all((trace > 1e-11) & (trace < 1e-5)), (trace.min(), trace.max())
    assert 1e-10 < np.median(trace) < 1e-6
    assert eig.max() < 1e-5


# --------------------------------------------------------------------------- no data needed


def test_sample_covariance_is_unbiased_scm():
    from pyriemann.estimation import Covariances

    rng = np.random.default_rng(0)
    X = rng.standard_normal((5, 4, 50)) + 3.0
    C = sample_covariance(X)
    for i in range(len(X)):
        np.testing.assert_allclose(C[i], np.cov(X[i]), rtol=1e-12)  # np.cov: 1/(T-1)
    # pyriemann's "scm" divides by T.
    T = X.shape[-1]
    np.testing.assert_allclose(Covariances("scm").fit_transform(X) * T / (T - 1), C, rtol=1e-12)
    with pytest.raises(ValueError):
        sample_covariance(X[..., :1])


def test_bogus_root_is_absent_and_skips(tmp_path, monkeypatch):
    bogus = tmp_path / "no_such_data"
    assert find_physionet_root(bogus) is None
    assert find_physionet_root(tmp_path) is None  # exists, but holds no EDF tree
    monkeypatch.setenv("SKFEDSPD_DATA", str(bogus))
    assert find_physionet_root() is None  # an explicit env var is not overridden
    with pytest.raises(FileNotFoundError, match="no_such_data"):
        load_physionet_mi(subjects=[1])
    with pytest.raises(FileNotFoundError, match="no_such_data"):
        load_physionet_mi(subjects=[1], root=bogus)
    with pytest.raises(FileNotFoundError):
        configure_offline(bogus)

    # The conftest fixture's logic skips rather than fails when the data are absent.
    spec = importlib.util.spec_from_file_location(
        "_skfedspd_conftest_copy", Path(__file__).with_name("conftest.py")
    )
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    with pytest.raises(pytest.skip.Exception, match="PhysioNet EEG files not found"):
        conftest.physionet_root_or_skip(bogus)


def test_invalid_arguments(tmp_path):
    with pytest.raises(ValueError, match="n_classes"):
        load_physionet_mi(subjects=[1], n_classes=3, root=tmp_path)


# --------------------------------------------------------------------------- real EEG


@real_eeg
def test_root_and_offline_subjects(physionet_root):
    assert find_physionet_root(physionet_root) == physionet_root
    assert find_physionet_root(physionet_root / "MNE-eegbci-data") == physionet_root
    assert len(PHYSIONET_OFFLINE_SUBJECTS) == 16
    for s in FULL:
        assert physionet_runs_present(s, physionet_root) == ([4, 8, 12], [6, 10, 14])
    for s in PARTIAL:
        assert physionet_runs_present(s, physionet_root) == ([4, 8, 12], [6])


@real_eeg
def test_four_class_covariances(cov4):
    C, y, subjects, meta = cov4
    assert C.shape[1:] == (64, 64)
    assert len(C) == len(y) == len(subjects) == len(meta)
    assert set(y.tolist()) == CLASSES_4
    assert y.dtype.kind == "U"
    assert subjects.dtype.kind == "i"
    # subjects grouped in the requested order
    assert list(dict.fromkeys(subjects.tolist())) == [1, 2, 3]
    np.testing.assert_array_equal(meta["subject"].to_numpy().astype(int), subjects)
    _assert_spd_volts(C)

    n1 = np.sum(subjects == 1)
    assert 80 <= n1 <= 95  # measured 90: 3 left/right runs + 3 hands/feet runs
    c1 = _counts(y[subjects == 1])
    assert all(18 <= c1[k] <= 27 for k in CLASSES_4), c1
    for s in (2, 3):
        assert 50 <= np.sum(subjects == s) <= 65  # measured 60: only hands/feet run 6
        cs = _counts(y[subjects == s])
        assert all(18 <= cs[k] <= 27 for k in CLASSES_2), cs
        assert all(5 <= cs[k] <= 10 for k in ("hands", "feet")), cs
    assert sorted(set(meta.loc[subjects == 1, "physionet_run"])) == [4, 6, 8, 10, 12, 14]
    assert sorted(set(meta.loc[subjects == 2, "physionet_run"])) == [4, 6, 8, 12]
    assert meta.attrs["runs"] == {1: [4, 8, 12, 6, 10, 14], 2: [4, 8, 12, 6], 3: [4, 8, 12, 6]}
    assert len(meta.attrs["ch_names"]) == 64
    assert meta.attrs["n_times"] == 481
    assert meta.attrs["sfreq"] == 160.0


@real_eeg
def test_raw_epochs_match_covariances(raw4, cov4):
    X, y, subjects, meta = raw4
    assert X.shape == (len(cov4[0]), 64, 481)  # [0, 3] s at 160 Hz, both ends included
    assert X.dtype == np.float64
    np.testing.assert_array_equal(y, cov4[1])
    np.testing.assert_array_equal(subjects, cov4[2])
    np.testing.assert_allclose(sample_covariance(X), cov4[0], rtol=1e-10, atol=0)
    # band-passed volts: a few to tens of microvolts RMS
    rms = np.sqrt(np.mean(X**2))
    assert 1e-7 < rms < 1e-3, rms
    assert meta.attrs["units"] == "V"


@real_eeg
def test_n_times_480(physionet_root, raw4):
    X, y, subjects, meta = load_physionet_mi(
        subjects=[1], root=physionet_root, return_raw=True, n_times=480
    )
    assert X.shape[1:] == (64, 480)
    assert meta.attrs["n_times"] == 480
    np.testing.assert_array_equal(X, raw4[0][raw4[2] == 1][..., :480])
    with pytest.raises(ValueError, match="n_times"):
        load_physionet_mi(subjects=[1], root=physionet_root, n_times=10_000)


@real_eeg
def test_two_class(cov2):
    C, y, subjects, meta = cov2
    assert C.shape[1:] == (64, 64)
    assert set(y.tolist()) == CLASSES_2
    assert list(dict.fromkeys(subjects.tolist())) == [4, 2]
    for s in (4, 2):
        assert 40 <= np.sum(subjects == s) <= 50  # measured 45 for every subject
    # feet_runs=[] for every subject: only runs 4, 8, 12 are read
    assert set(meta["physionet_run"]) == {4, 8, 12}
    _assert_spd_volts(C)


@real_eeg
def test_channel_subset_is_the_sub_matrix(physionet_root, cov2):
    C, y, subjects, meta = cov2
    C16, y16, subjects16, meta16 = load_physionet_mi(
        subjects=[4, 2], n_classes=2, root=physionet_root, channels=SENSORIMOTOR_CHANNELS
    )
    picks = [meta.attrs["ch_names"].index(c) for c in SENSORIMOTOR_CHANNELS]
    assert meta16.attrs["ch_names"] == list(SENSORIMOTOR_CHANNELS)
    np.testing.assert_allclose(C16, C[:, picks][:, :, picks], rtol=1e-12)
    np.testing.assert_array_equal(y16, y)
    np.testing.assert_array_equal(subjects16, subjects)


@real_eeg
@pytest.mark.parametrize(
    "channels, match",
    [(["C3", "Cx9"], r"\['Cx9'\] are not in the recordings"), (["C3", "C3"], "distinct"), ([], "at least one")],
)
def test_bad_channels_raise(physionet_root, channels, match):
    with pytest.raises(ValueError, match=match):
        load_physionet_mi(subjects=[1], n_classes=2, root=physionet_root, channels=channels)


@real_eeg
def test_missing_subject_raises(physionet_root):
    with pytest.raises(FileNotFoundError, match=r"subject 16\b.*S016"):
        load_physionet_mi(subjects=[1, 16], root=physionet_root)
    with pytest.raises(ValueError, match="Duplicated"):
        load_physionet_mi(subjects=[1, 1], root=physionet_root)


@real_eeg
def test_partial_subject_never_downloads(physionet_root, tmp_path, monkeypatch):
    """A root holding only run 4 of subject 2: 4 classes must fail before MOABB, 2 classes
    must load run 4 alone, with mne/moabb already imported, the env vars unset and any
    download attempt turned into an error."""
    import mne  # noqa: F401  (imported before configure_offline runs)
    import moabb.datasets.download as dl

    src = physionet_root / "MNE-eegbci-data/files/eegmmidb/1.0.0/S002/S002R04.edf"
    dst = tmp_path / "MNE-eegbci-data/files/eegmmidb/1.0.0/S002/S002R04.edf"
    dst.parent.mkdir(parents=True)
    dst.symlink_to(src)

    class _NoNetwork:
        kwargs = {}

        def __call__(self, *args, **kwargs):
            raise AssertionError(f"download attempted: {args[:1]}")

    monkeypatch.setattr(dl, "choose_downloader", lambda *a, **k: _NoNetwork())
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)

    with pytest.raises(FileNotFoundError, match=r"subject 2 .*hands/feet.*S002R06"):
        load_physionet_mi(subjects=[2], n_classes=4, root=tmp_path)
    C, y, subjects, meta = load_physionet_mi(subjects=[2], n_classes=2, root=tmp_path)
    assert 12 <= len(y) <= 17  # one run of 15 cues
    assert set(y.tolist()) == CLASSES_2
    assert set(meta["physionet_run"]) == {4}
    assert os.environ["MNE_DATASETS_EEGBCI_PATH"] == str(tmp_path.resolve())
    assert os.environ["MOABB_DOWNLOAD_PROVIDER"] == "upstream"
    _assert_spd_volts(C)


# ---------------------------------------------------------------------------------------------
# load_moabb / load_weibo2014 (any MOABB dataset; offline here through FakeDataset)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def fake_lr(fake_moabb):
    from moabb.paradigms import LeftRightImagery

    dataset = fake_moabb(event_list=["left_hand", "right_hand"], n_subjects=3, n_sessions=1, n_runs=1,
                         n_events=20, duration=60, channels=("C3", "Cz", "C4"))
    return dataset, LeftRightImagery(fmin=8, fmax=32)


def test_load_moabb_is_in_volts(fake_lr):
    from skfedspd.datasets import load_moabb

    dataset, paradigm = fake_lr
    X, y, subjects, meta = load_moabb(dataset, paradigm, subjects=[1, 3])
    assert dataset.unit_factor == 1.0
    dataset.unit_factor = 1e6  # MOABB's default scaling to microvolts
    X_uv, y_uv, _ = paradigm.get_data(dataset=dataset, subjects=[1, 3])
    np.testing.assert_allclose(X * 1e6, X_uv, rtol=1e-12)
    assert X.dtype == np.float64 and X.flags.c_contiguous
    np.testing.assert_array_equal(y, np.asarray(y_uv).astype(str))
    assert set(subjects) == {1, 3} and np.array_equal(subjects, meta["subject"].to_numpy())


def test_load_moabb_n_times(fake_lr):
    from skfedspd.datasets import load_moabb

    dataset, paradigm = fake_lr
    X, *_ = load_moabb(dataset, paradigm, subjects=[2])
    X_cut, *_ = load_moabb(dataset, paradigm, subjects=[2], n_times=100)
    np.testing.assert_array_equal(X_cut, X[..., :100])
    with pytest.raises(ValueError, match="exceeds"):
        load_moabb(dataset, paradigm, subjects=[2], n_times=X.shape[-1] + 1)
    with pytest.raises(ValueError, match="at least 2"):
        load_moabb(dataset, paradigm, n_times=1)


def test_weibo2014_request(monkeypatch):
    """The Weibo2014 request: MOABB's dataset, 7 classes, 8-32 Hz, first 800 samples."""
    import skfedspd.datasets as datasets

    seen = {}

    def fake_load(dataset, paradigm, subjects=None, n_times=None, verbose=False):
        seen.update(code=dataset.code, events=paradigm.events, band=tuple(paradigm.filters[0]), n_times=n_times,
                    subjects=subjects)
        return "loaded"

    monkeypatch.setattr(datasets, "load_moabb", fake_load)
    assert datasets.load_weibo2014(subjects=[1, 2]) == "loaded"
    assert seen == dict(code="Weibo2014", events=list(datasets.WEIBO2014_EVENTS), band=(8.0, 32.0), n_times=800,
                        subjects=[1, 2])
