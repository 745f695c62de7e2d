"""The one way the harness reads EEG: the offline PhysioNet copy (and MOABB's datasets).

Every experiment that loads trials goes through this module (``tests/benchmarks/test_benchmarks_structure.py``
checks it):

* :func:`offline_root`: finds the offline PhysioNet copy (``../shared/data`` or
  ``$SKFEDSPD_DATA``) and points MNE and MOABB at it (they then never download it);
* :func:`prepare_data_folders`: the same, and downloads of other datasets (Weibo2014) to
  ``~/mne_data`` when ``MNE_DATA`` is read-only;
* :func:`load_left_right`: the left/right imagery of the 40 offline subjects as covariance
  matrices, cached per subject under ``results/cache``, trials in recording order;
* :func:`load_left_right_channels`: the same imagery on a set of channels (the 16
  sensorimotor ones), cached in one file;
* :func:`physionet_trials`: band-passed PhysionetMI trials from the offline copy;
* :func:`physionet_moabb`: MOABB's PhysionetMI dataset and paradigm (left/right or 4 classes),
  for MOABB's evaluations and for subjects beyond the offline copy;
* :func:`weibo_moabb`: MOABB's Weibo2014 dataset and paradigm (7 classes), and whether its
  files are on disk (:func:`weibo_offline`);
* :func:`moabb_trials`: band-passed trials of any MOABB dataset through its paradigm.
"""

import os
from pathlib import Path

import numpy as np

from skfedspd.datasets import PHYSIONET_LEFT_RIGHT_SUBJECTS as LEFT_RIGHT_SUBJECTS
from skfedspd.datasets import PHYSIONET_SFREQ, sample_covariance

CACHE = Path(os.environ.get("SKFEDSPD_CACHE", "results/cache"))
#: The 8-32 Hz band of every covariance, and the four sub-bands of the band models.
BROAD = [(8, 32)]
SUB_BANDS = [(8, 12), (12, 16), (16, 24), (24, 32)]
#: The events of PhysionetMI's 4-class imagery (MOABB's names).
FOUR_CLASS_EVENTS = ("left_hand", "right_hand", "feet", "hands")
NOT_FOUND = "PhysioNet EEG files not found (../shared/data or $SKFEDSPD_DATA): nothing to run."


def offline_root(say=None):
    """The offline PhysioNet copy's root, MNE and MOABB pointed at it; None where the EEG
    files are absent (``say``, if given, is told so in one line)."""
    from skfedspd.datasets import configure_offline, find_physionet_root

    root = find_physionet_root()
    if root is None:
        if say is not None:
            say(NOT_FOUND)
        return None
    configure_offline(root)
    return root


def prepare_data_folders():
    """Offline PhysioNet copy for MNE/MOABB; downloads (Weibo2014) never go to a read-only
    ``MNE_DATA`` but to ``~/mne_data``, MNE's default."""
    os.environ.setdefault("MOABB_DOWNLOAD_PROVIDER", "upstream")
    offline_root()
    mne_data = os.environ.get("MNE_DATA")
    if mne_data and not os.access(mne_data, os.W_OK):
        os.environ.setdefault("MNE_DATASETS_WEIBO_PATH", str(Path.home() / "mne_data"))


def is_offline(subjects):
    """Whether every one of ``subjects`` is in the offline copy, and the copy is there."""
    from skfedspd.datasets import PHYSIONET_OFFLINE_SUBJECTS, find_physionet_root

    return set(subjects) <= set(PHYSIONET_OFFLINE_SUBJECTS) and find_physionet_root() is not None


def physionet_trials(subjects, n_classes=4, n_times=480, channels=None):
    """``(X, y, subjects)``: band-passed trials (8-32 Hz, volts) of ``subjects`` from the offline
    copy, ``n_times`` samples each (never downloads; runs picked from what is present)."""
    from skfedspd.datasets import load_physionet_mi

    return load_physionet_mi(subjects, n_classes=n_classes, return_raw=True, n_times=n_times,
                             channels=channels)[:3]


def channel_names(subject):
    """The EEG channel names of ``subject``'s offline recordings, in the loader's order."""
    from skfedspd.datasets import load_physionet_mi

    return load_physionet_mi([subject], n_classes=2)[3].attrs["ch_names"]


def physionet_moabb(subjects, n_classes=2, feet_runs=None, **paradigm):
    """MOABB's ``(dataset, paradigm)`` for PhysionetMI imagery of ``subjects``.

    ``n_classes`` 2: ``LeftRightImagery`` on the left/right runs only (every offline subject
    has them); 4: ``MotorImagery`` of :data:`FOUR_CLASS_EVENTS`, reading the hands/feet runs
    ``feet_runs`` (None: MOABB's). ``paradigm``: the paradigm's parameters (8-32 Hz unless
    given).
    """
    from moabb.datasets import PhysionetMI
    from moabb.paradigms import LeftRightImagery, MotorImagery

    dataset = PhysionetMI(imagined=True)
    dataset.subject_list = list(subjects)
    paradigm = {"fmin": 8, "fmax": 32, **paradigm}
    if n_classes == 2:
        dataset.feet_runs = []
        return dataset, LeftRightImagery(**paradigm)
    if feet_runs is not None:
        dataset.feet_runs = list(feet_runs)
    return dataset, MotorImagery(n_classes=4, events=list(FOUR_CLASS_EVENTS), **paradigm)


def weibo_moabb():
    """MOABB's ``(dataset, paradigm)`` of Weibo2014: its 7 imagery classes, 8-32 Hz."""
    from moabb.datasets import Weibo2014
    from moabb.paradigms import MotorImagery

    from skfedspd.datasets import WEIBO2014_EVENTS

    return Weibo2014(), MotorImagery(n_classes=7, events=list(WEIBO2014_EVENTS), fmin=8, fmax=32)


def weibo_folder():
    """Where MOABB keeps Weibo2014 (``MNE_DATASETS_WEIBO_PATH``, else ``MNE_DATA``, else
    ``~/mne_data``), read without MOABB's side effects (it creates folders)."""
    import mne

    root = mne.get_config("MNE_DATASETS_WEIBO_PATH") or mne.get_config("MNE_DATA") or Path.home() / "mne_data"
    return Path(root) / "MNE-weibo-2014"


def weibo_offline():
    """Whether the 10 subjects' files of Weibo2014 are on disk."""
    return all((weibo_folder() / f"subject_{s}.mat").is_file() for s in range(1, 11))


def moabb_trials(dataset, paradigm, n_times):
    """``(X, y, subjects)``: band-passed trials (volts) of a MOABB dataset through ``paradigm``,
    ``n_times`` samples each (MOABB downloads what is not on disk)."""
    from skfedspd.datasets import load_moabb

    return load_moabb(dataset, paradigm, n_times=n_times)[:3]


def load_left_right(subjects=LEFT_RIGHT_SUBJECTS, cache=CACHE):
    """``(X, y, subject)`` of ``subjects``: sample covariances (volts², 64 channels, 8-32 Hz,
    0-3 s), labels ``left_hand`` / ``right_hand``, each trial's subject; each subject's trials
    in recording order (runs 4, 8, 12, cue by cue), subjects in the order given.

    One file per subject under ``cache`` (``physionet-lr-S.npz``), written on first use.
    """
    from skfedspd.datasets import load_physionet_mi

    def covariances(subject):
        X, y, _, meta = load_physionet_mi([subject], n_classes=2)
        if not np.all(np.diff(meta["physionet_run"].to_numpy()) >= 0):
            raise RuntimeError(f"subject {subject}: trials are not in recording order")
        return {"X": X, "y": y}

    return concatenated(cached_per_subject(subjects, Path(cache), "physionet-lr", covariances))


def cached_per_subject(subjects, cache, stem, arrays):
    """``[(arrays of subject, subject)]``: each subject's ``arrays(subject)`` (a dict with ``X``
    and ``y``), kept in ``cache/STEM-S.npz`` and written there on first use."""
    cache.mkdir(parents=True, exist_ok=True)
    parts = []
    for subject in subjects:
        path = cache / f"{stem}-{subject}.npz"
        if not path.exists():
            np.savez(path, **arrays(subject))
        with np.load(path) as f:
            parts.append(({name: f[name] for name in f.files}, subject))
    return parts


def concatenated(parts):
    """``(X, y, subject)`` of :func:`cached_per_subject`'s parts, in their order."""
    X, y, groups = (np.concatenate(a) for a in zip(*[(p["X"], p["y"], np.full(len(p["y"]), s)) for p, s in parts]))
    return X, y, groups


def load_left_right_channels(subjects, cache, channels="sensorimotor"):
    """``(X, y, subject)`` of the left/right imagery of ``subjects`` on ``channels``
    (``"sensorimotor"``: :data:`skfedspd.datasets.SENSORIMOTOR_CHANNELS`; ``"all"``: the 64),
    loaded once and cached in the ``.npz`` file ``cache``."""
    from skfedspd.datasets import SENSORIMOTOR_CHANNELS, load_physionet_mi

    cache = Path(cache)
    if cache.exists():
        with np.load(cache) as f:
            return f["X"], f["y"], f["subjects"]
    X, y, subject, _ = load_physionet_mi(subjects=list(subjects), n_classes=2,
                                         channels=SENSORIMOTOR_CHANNELS if channels == "sensorimotor" else None)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, X=X, y=y, subjects=subject)
    return X, y, subject


def band_covariances(X_raw, bands, fs, estimator="scm"):
    """``(n, len(bands), C, C)`` covariances of the trials filtered to each band (the 8-32 Hz
    trials as they are for that band): sample covariances, or ``"oas"`` (pyRiemann's
    ``Covariances("oas")``, shrunk: a narrow band's sample covariance of 64 channels over
    3 s is near singular)."""
    from pyriemann.estimation import Covariances
    from scipy.signal import butter, sosfiltfilt

    def band(lo, hi):
        if (lo, hi) == (8, 32):
            return X_raw
        return sosfiltfilt(butter(4, [lo, hi], btype="band", fs=fs, output="sos"), X_raw, axis=-1)

    covariance = sample_covariance if estimator == "scm" else Covariances(estimator).transform
    return np.stack([covariance(band(lo, hi)) for lo, hi in bands], 1)


def load_left_right_bands(subjects=LEFT_RIGHT_SUBJECTS, bands=SUB_BANDS, estimator="oas", cache=CACHE, channels=None):
    """``(X, y, subject)`` as :func:`load_left_right`, ``X`` of shape ``(n, len(bands), C, C)``:
    the ``estimator`` covariances (:func:`band_covariances`) of the 8-32 Hz trials filtered again
    to each band (4th-order Butterworth, zero phase), on ``channels`` (names; None: all 64).
    One file per subject under ``cache``, written on first use."""
    def covariances(subject):
        X_raw, y, _ = physionet_trials([subject], n_classes=2, n_times=480, channels=channels)
        return {"X": band_covariances(X_raw, bands, PHYSIONET_SFREQ, estimator), "y": y, "bands": np.array(bands)}

    # the sub-bands keep their files' first name; another band set names its bands, a channel set its size
    stem = (f"physionet-lr-bands-{estimator}"
            + ("" if list(bands) == list(SUB_BANDS) else "-" + "_".join(f"{low}-{high}" for low, high in bands))
            + ("" if channels is None else f"-{len(channels)}ch"))
    parts = cached_per_subject(subjects, Path(cache), stem, covariances)
    for arrays, subject in parts:
        if arrays["bands"].tolist() != [list(b) for b in bands]:
            raise ValueError(f"the cached bands of subject {subject} are {arrays['bands'].tolist()}, not {bands}: "
                             f"remove {Path(cache) / f'{stem}-{subject}.npz'} to refit")
    return concatenated(parts)
