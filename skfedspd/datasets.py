"""EEG datasets through MOABB: PhysioNet MI offline, Weibo2014 and any MOABB dataset.

:func:`load_physionet_mi` reads the PhysioNet EEG Motor Movement/Imagery dataset offline
from a local copy of the EDF files laid out as MNE expects
(``<root>/MNE-eegbci-data/files/eegmmidb/1.0.0/SXXX/SXXXRYY.edf``), and never touches the
network: a missing file raises :class:`FileNotFoundError` naming the subject and path.
The offline copy holds the subjects of :data:`PHYSIONET_OFFLINE_SUBJECTS`.
:func:`load_weibo2014` and :func:`load_moabb` go through MOABB's own download.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from pathlib import Path

import numpy as np

__all__ = [
    "PHYSIONET_OFFLINE_SUBJECTS",
    "PHYSIONET_LEFT_RIGHT_SUBJECTS",
    "PHYSIONET_SFREQ",
    "SENSORIMOTOR_CHANNELS",
    "find_physionet_root",
    "configure_offline",
    "physionet_runs_present",
    "sample_covariance",
    "load_physionet_mi",
    "load_moabb",
    "load_weibo2014",
    "WEIBO2014_EVENTS",
    "make_spd_classification",
]

#: Subjects of the offline copy (``../shared/data``) with four-class imagery runs (the
#: four-class protocols use these 16).
PHYSIONET_OFFLINE_SUBJECTS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 42)

#: Every subject of the offline copy: all have the left/right imagery runs 4, 8 and 12.
PHYSIONET_LEFT_RIGHT_SUBJECTS = tuple(range(1, 40)) + (42,)

#: Sampling rate of the recordings (Hz); subject 88, not in the offline copy, is the
#: only one recorded at 128 Hz.
PHYSIONET_SFREQ = 160.0

#: 16 channels over the sensorimotor cortices (10-10 names as MOABB gives them), the
#: montage motor-imagery decoders commonly keep: fronto-central, central and
#: centro-parietal rows around C3, Cz and C4.
SENSORIMOTOR_CHANNELS = ("FC3", "FC1", "FCz", "FC2", "FC4", "C5", "C3", "C1", "Cz", "C2", "C4", "C6",
                         "CP3", "CP1", "CP2", "CP4")

_ENV_ROOT = "SKFEDSPD_DATA"
_MNE_FOLDER = "MNE-eegbci-data"
_EDF_SUBDIR = Path(_MNE_FOLDER, "files", "eegmmidb", "1.0.0")
_HAND_RUNS = (4, 8, 12)  # imagined left / right fist
_FEET_RUNS = (6, 10, 14)  # imagined both fists / both feet
_EVENTS_4 = ["left_hand", "right_hand", "feet", "hands"]


def _is_root(path):
    return path is not None and (Path(path) / _EDF_SUBDIR).is_dir()


def _normalise_root(path):
    """Accept ``<root>`` as well as ``<root>/MNE-eegbci-data``."""
    path = Path(path).expanduser()
    if path.name == _MNE_FOLDER and not _is_root(path) and _is_root(path.parent):
        path = path.parent
    return path


def find_physionet_root(root=None):
    """Locate the offline PhysioNet eegmmidb data root (the folder holding ``MNE-eegbci-data``):
    ``root`` if given, else ``SKFEDSPD_DATA``, else ``<ancestor>/shared/data``; None if absent.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from skfedspd.datasets import find_physionet_root
    >>> root = Path(tempfile.mkdtemp())
    >>> find_physionet_root(root) is None
    True
    """
    if root is not None:
        root = _normalise_root(root)
        return root.resolve() if _is_root(root) else None
    env = os.environ.get(_ENV_ROOT)
    if env:
        env = _normalise_root(env)
        return env.resolve() if _is_root(env) else None
    seen = set()
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            candidate = folder / "shared" / "data"
            if candidate in seen:
                continue
            seen.add(candidate)
            if _is_root(candidate):
                return candidate.resolve()
    return None


def configure_offline(root):
    """Point MNE and MOABB at the offline data root and forbid NEMAR downloads (sets
    ``MNE_DATA``, ``MNE_DATASETS_EEGBCI_PATH`` and ``MOABB_DOWNLOAD_PROVIDER``); returns the
    resolved root, or raises FileNotFoundError.

    Examples
    --------
    >>> import os
    >>> import tempfile
    >>> from pathlib import Path
    >>> from skfedspd.datasets import configure_offline
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "MNE-eegbci-data" / "files" / "eegmmidb" / "1.0.0").mkdir(parents=True)
    >>> configure_offline(root) == root.resolve(), os.environ["MOABB_DOWNLOAD_PROVIDER"]
    (True, 'upstream')
    """
    resolved = find_physionet_root(root)
    if resolved is None:
        raise FileNotFoundError(
            f"No PhysioNet eegmmidb data under {root!s}: expected "
            f"{Path(root) / _EDF_SUBDIR}"
        )
    os.environ["MNE_DATA"] = str(resolved)
    os.environ["MNE_DATASETS_EEGBCI_PATH"] = str(resolved)
    os.environ["MOABB_DOWNLOAD_PROVIDER"] = "upstream"
    return resolved


def _edf_path(root, subject, run):
    return Path(root) / _EDF_SUBDIR / f"S{subject:03d}" / f"S{subject:03d}R{run:02d}.edf"


def physionet_runs_present(subject, root):
    """Imagery runs of one subject present under ``root``: ``(hand_runs, feet_runs)``, among
    4, 8, 12 (left / right fist) and 6, 10, 14 (both fists / both feet).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from skfedspd.datasets import physionet_runs_present
    >>> folder = Path(tempfile.mkdtemp()) / "MNE-eegbci-data" / "files" / "eegmmidb" / "1.0.0" / "S002"
    >>> folder.mkdir(parents=True)
    >>> for run in (4, 6, 8):
    ...     (folder / f"S002R{run:02d}.edf").touch()
    >>> physionet_runs_present(2, folder.parents[4])
    ([4, 8], [6])
    """
    hand = [r for r in _HAND_RUNS if _edf_path(root, subject, r).is_file()]
    feet = [r for r in _FEET_RUNS if _edf_path(root, subject, r).is_file()]
    return hand, feet


def sample_covariance(X):
    r"""Unbiased sample covariance ``C = X̄ X̄ᵀ / (T − 1)`` of each centred trial (pyRiemann's
    ``Covariances("scm")`` divides by ``T``).

    Parameters
    ----------
    X : ndarray, shape (n_trials, n_channels, n_times)

    Returns
    -------
    C : ndarray, shape (n_trials, n_channels, n_channels)

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.datasets import sample_covariance
    >>> sample_covariance(np.random.default_rng(0).standard_normal((2, 3, 100))).shape
    (2, 3, 3)
    """
    X = np.asarray(X, dtype=np.float64)
    n_times = X.shape[-1]
    if n_times < 2:
        raise ValueError(f"Need at least 2 time samples, got {n_times}")
    Xc = X - X.mean(axis=-1, keepdims=True)
    C = Xc @ np.swapaxes(Xc, -1, -2) / (n_times - 1)
    return 0.5 * (C + np.swapaxes(C, -1, -2))


def _runs_for(subject, root, n_classes):
    """Runs to load for one subject, or raise naming what is missing."""
    subject_dir = Path(root) / _EDF_SUBDIR / f"S{subject:03d}"
    if not subject_dir.is_dir():
        raise FileNotFoundError(
            f"PhysioNet subject {subject} is not available offline: {subject_dir} "
            f"does not exist (subjects present in the shipped copy: "
            f"{list(PHYSIONET_OFFLINE_SUBJECTS)})"
        )
    hand, feet = physionet_runs_present(subject, root)
    if not hand:
        raise FileNotFoundError(
            f"PhysioNet subject {subject} has no left/right imagery run offline: none of "
            + ", ".join(str(_edf_path(root, subject, r)) for r in _HAND_RUNS)
            + " exists"
        )
    if n_classes == 4 and not feet:
        raise FileNotFoundError(
            f"PhysioNet subject {subject} has no hands/feet imagery run offline "
            f"(needed for 4 classes): none of "
            + ", ".join(str(_edf_path(root, subject, r)) for r in _FEET_RUNS)
            + " exists"
        )
    return tuple(hand), tuple(feet) if n_classes == 4 else ()


def _channel_picks(ch_names, channels):
    """Indices of ``channels`` in ``ch_names``; a ValueError names unknown or repeated ones."""
    channels = [str(c) for c in channels]
    unknown = [c for c in channels if c not in ch_names]
    if unknown:
        raise ValueError(f"channels {unknown} are not in the recordings (their channels: {ch_names})")
    if len(set(channels)) != len(channels) or not channels:
        raise ValueError(f"channels must be distinct names, at least one, got {channels}")
    return [ch_names.index(c) for c in channels]


def _channel_names(dataset, subject, run):
    """EEG channel names in the order MOABB returns them (header read only)."""
    import mne

    raw = dataset._load_one_run(subject, run, preload=False)
    picks = mne.pick_types(raw.info, eeg=True, stim=False)
    return [raw.ch_names[i] for i in picks]


def load_physionet_mi(
    subjects=None,
    n_classes=4,
    fmin=8.0,
    fmax=32.0,
    tmin=0.0,
    tmax=None,
    resample=None,
    root=None,
    return_raw=False,
    n_times=None,
    channels=None,
    verbose=False,
):
    """Load PhysioNet motor-imagery trials offline as covariance matrices or epochs (MOABB's
    ``PhysionetMI``; the runs present offline for each subject).

    Parameters
    ----------
    subjects : sequence of int | None
        None loads :data:`PHYSIONET_OFFLINE_SUBJECTS`.
    n_classes : {4, 2}
        4: ``left_hand``, ``right_hand``, ``feet``, ``hands``; 2: left and right hand.
    fmin, fmax : float
        Band-pass edges in Hz.
    tmin, tmax : float, float | None
        The trial window in seconds after the cue (None: 3 s).
    resample : float | None
    root : str | path-like | None
        See :func:`find_physionet_root`.
    return_raw : bool
        Return the band-passed epochs instead of covariance matrices.
    n_times : int | None
        Keep only the first ``n_times`` samples of each trial.
    channels : sequence of str | None
        EEG channels to keep, in this order; None keeps all 64.
    verbose : bool

    Returns
    -------
    X : ndarray
        Covariance matrices (:func:`sample_covariance`) or epochs, float64, in volts.
    y : ndarray of str, shape (n_trials,)
    subjects : ndarray of int, shape (n_trials,)
    meta : pandas.DataFrame
        MOABB metadata; ``meta.attrs`` holds ``ch_names``, ``sfreq``, ``units``, ``runs``...

    Examples
    --------
    >>> from skfedspd.datasets import load_physionet_mi
    >>> X, y, subjects, meta = load_physionet_mi(subjects=[1], n_classes=2)
    >>> X.shape, meta.attrs["units"]
    ((45, 64, 64), 'V^2')
    """
    if n_classes not in (2, 4):
        raise ValueError(f"n_classes must be 2 or 4, got {n_classes!r}")
    found = find_physionet_root(root)
    if found is None:
        where = (
            str(root)
            if root is not None
            else (
                f"${_ENV_ROOT}={os.environ[_ENV_ROOT]}"
                if os.environ.get(_ENV_ROOT)
                else "<ancestor>/shared/data of the working directory and of skfedspd"
            )
        )
        raise FileNotFoundError(
            f"PhysioNet eegmmidb data not found (looked in {where}); expected "
            f"<root>/{_EDF_SUBDIR.as_posix()}/SXXX/SXXXRYY.edf"
        )
    root = configure_offline(found)

    if subjects is None:
        subjects = PHYSIONET_OFFLINE_SUBJECTS
    subjects = [int(s) for s in np.atleast_1d(subjects)]
    if len(set(subjects)) != len(subjects):
        raise ValueError(f"Duplicated subjects in {subjects}")
    if not subjects:
        raise ValueError("No subject requested")
    _check_n_times(n_times)

    # Check every file before MOABB sees the request: it would download a missing one.
    runs = {s: _runs_for(s, root, n_classes) for s in subjects}
    groups = {}
    for s in subjects:
        groups.setdefault(runs[s], []).append(s)

    import pandas as pd
    from moabb.datasets import PhysionetMI
    from moabb.paradigms import LeftRightImagery, MotorImagery

    common = dict(fmin=fmin, fmax=fmax, tmin=tmin, tmax=tmax, resample=resample)
    if n_classes == 4:
        paradigm = MotorImagery(n_classes=4, events=list(_EVENTS_4), **common)
    else:
        paradigm = LeftRightImagery(**common)

    per_subject = {}
    ch_names = None
    with _quiet(verbose):
        for (hand, feet), group in groups.items():
            dataset = PhysionetMI(imagined=True)
            dataset.hand_runs = list(hand)
            dataset.feet_runs = list(feet)
            if ch_names is None:  # from one header: a bad channel name fails before any data loads
                ch_names = _channel_names(dataset, group[0], hand[0])
                picks = None if channels is None else _channel_picks(ch_names, channels)
            Xg, yg, sg, mg = _get_volts(dataset, paradigm, group)
            run_numbers = np.asarray(list(hand) + list(feet))
            mg["physionet_run"] = run_numbers[mg["run"].astype(int).to_numpy()]
            for s in group:
                keep = np.flatnonzero(sg == s)
                per_subject[s] = (Xg[keep], yg[keep], mg.iloc[keep])

    X = _first_samples(np.concatenate([per_subject[s][0] for s in subjects], axis=0), n_times)
    if picks is not None:
        X, ch_names = X[:, picks], [ch_names[i] for i in picks]
    y = np.concatenate([per_subject[s][1] for s in subjects])
    meta = pd.concat([per_subject[s][2] for s in subjects], ignore_index=True)
    subj = meta["subject"].to_numpy().astype(int)

    meta.attrs = {
        "ch_names": ch_names,
        "sfreq": float(resample) if resample is not None else PHYSIONET_SFREQ,
        "n_times": int(X.shape[-1]),
        "units": "V" if return_raw else "V^2",
        "runs": {s: list(runs[s][0]) + list(runs[s][1]) for s in subjects},
        "root": str(root),
        "n_classes": n_classes,
        "fmin": fmin,
        "fmax": fmax,
        "tmin": tmin,
        "tmax": tmax,
        "resample": resample,
    }
    if not return_raw:
        X = sample_covariance(X)
    return X, y, subj, meta


def _check_n_times(n_times):
    if n_times is not None and int(n_times) < 2:
        raise ValueError(f"n_times must be at least 2, got {n_times!r}")


def _first_samples(X, n_times):
    """The first ``n_times`` samples of each trial (all if None), contiguous float64."""
    if n_times is not None:
        n_times = int(n_times)
        if n_times > X.shape[-1]:
            raise ValueError(f"n_times={n_times} exceeds the {X.shape[-1]} samples per trial")
        X = X[..., :n_times]
    return np.ascontiguousarray(X, dtype=np.float64)


@contextlib.contextmanager
def _quiet(verbose):
    """MNE / MOABB logging and warnings silenced unless verbose."""
    if verbose:
        yield
        return
    import mne

    moabb_logger = logging.getLogger("moabb")
    old_level = moabb_logger.level
    moabb_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), mne.utils.use_log_level("ERROR"):
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        moabb_logger.setLevel(old_level)


def _get_volts(dataset, paradigm, subjects):
    """``paradigm.get_data`` in volts (MOABB multiplies by ``unit_factor``, 1e6, by default)."""
    dataset.unit_factor = 1.0
    X, y, meta = paradigm.get_data(dataset=dataset, subjects=list(subjects))
    meta = meta.reset_index(drop=True)
    return X, np.asarray(y).astype(str), meta["subject"].to_numpy().astype(int), meta


def load_moabb(dataset, paradigm, subjects=None, n_times=None, verbose=False):
    """Band-passed trials of any MOABB dataset through a MOABB paradigm, in volts:
    ``(X, y, subjects, meta)``; ``subjects`` None is ``dataset.subject_list``.

    Examples
    --------
    >>> from moabb.datasets.fake import FakeDataset
    >>> from moabb.paradigms import LeftRightImagery
    >>> from skfedspd.datasets import load_moabb
    >>> dataset = FakeDataset(event_list=["left_hand", "right_hand"], n_subjects=2, n_sessions=1,
    ...                       n_runs=1, n_events=20, duration=60, seed=0)
    >>> load_moabb(dataset, LeftRightImagery(), n_times=256)[0].shape
    (40, 3, 256)
    """
    _check_n_times(n_times)
    subjects = dataset.subject_list if subjects is None else [int(s) for s in np.atleast_1d(subjects)]
    with _quiet(verbose):
        X, y, subj, meta = _get_volts(dataset, paradigm, subjects)
    return _first_samples(X, n_times), y, subj, meta


#: Weibo2014's seven classes, in MOABB's event order.
WEIBO2014_EVENTS = ("left_hand", "right_hand", "hands", "feet", "left_hand_right_foot",
                    "right_hand_left_foot", "rest")


def load_weibo2014(subjects=None, fmin=8.0, fmax=32.0, n_times=800, verbose=False):
    """Weibo2014 (10 subjects, 60 channels, 200 Hz, 7 classes) through MOABB, in volts.

    Returns
    -------
    X, y, subjects, meta
        As :func:`load_moabb`.

    Examples
    --------
    >>> from skfedspd.datasets import load_weibo2014
    >>> X, y, subjects, meta = load_weibo2014(subjects=[1])  # doctest: +SKIP
    >>> X.shape[1:]  # doctest: +SKIP
    (60, 800)
    """
    from moabb.datasets import Weibo2014
    from moabb.paradigms import MotorImagery

    paradigm = MotorImagery(n_classes=len(WEIBO2014_EVENTS), events=list(WEIBO2014_EVENTS), fmin=fmin, fmax=fmax)
    return load_moabb(Weibo2014(), paradigm, subjects=subjects, n_times=n_times, verbose=verbose)


def make_spd_classification(n_matrices=60, n_channels=8, n_classes=3, seed=0, scale=1.0,
                            n_times=None, separation=3.0):
    """Seeded synthetic SPD matrices with class structure, and balanced labels ``0..n_classes-1``.

    Examples
    --------
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=6, n_channels=4, n_classes=3, seed=0)
    >>> X.shape, y
    ((6, 4, 4), array([0, 1, 2, 0, 1, 2]))
    """
    rng = np.random.default_rng(seed)
    n_times = 4 * n_channels if n_times is None else n_times
    Q, R = np.linalg.qr(rng.standard_normal((n_channels, n_channels)))
    Q = Q * np.sign(np.diag(R))
    y = np.arange(n_matrices) % n_classes
    groups = np.array_split(np.arange(n_channels), n_classes)
    X = np.empty((n_matrices, n_channels, n_channels))
    for i, k in enumerate(y):
        d = np.ones(n_channels)
        d[groups[k]] = separation
        A = (Q * np.sqrt(d)) @ rng.standard_normal((n_channels, n_times))
        C = A @ A.T / n_times
        X[i] = scale * 0.5 * (C + C.T)
    return X, y
