"""The offline PhysioNet left/right imagery as covariance matrices, cached per subject."""

import os
from pathlib import Path

import numpy as np

from skfedspd.datasets import PHYSIONET_LEFT_RIGHT_SUBJECTS as LEFT_RIGHT_SUBJECTS
CACHE = Path(os.environ.get("SKFEDSPD_CACHE", "results/cache"))


def load_left_right(subjects=LEFT_RIGHT_SUBJECTS, cache=CACHE):
    """``(X, y, subject)`` of ``subjects``: sample covariances (volts², 64 channels, 8-32 Hz,
    0-3 s), labels ``left_hand`` / ``right_hand``, each trial's subject; each subject's trials
    in recording order (runs 4, 8, 12, cue by cue), subjects in the order given.

    One file per subject under ``cache`` (``physionet-lr-S.npz``), written on first use.
    """
    from skfedspd.datasets import load_physionet_mi

    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    parts = []
    for subject in subjects:
        path = cache / f"physionet-lr-{subject}.npz"
        if not path.exists():
            X, y, _, meta = load_physionet_mi([subject], n_classes=2)
            if not np.all(np.diff(meta["physionet_run"].to_numpy()) >= 0):
                raise RuntimeError(f"subject {subject}: trials are not in recording order")
            np.savez(path, X=X, y=y)
        with np.load(path) as f:
            parts.append((f["X"], f["y"], np.full(len(f["y"]), subject)))
    X, y, groups = (np.concatenate(a) for a in zip(*parts))
    return X, y, groups
