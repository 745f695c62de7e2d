"""
A MOABB evaluation: SPDnet and FedSPDnet against a Riemannian baseline
======================================================================

`MOABB <https://moabb.neurotechx.com>`_ evaluates scikit-learn pipelines on EEG datasets with
a fixed protocol. skfedspd's estimators are ordinary pipelines steps, so they go into any
MOABB evaluation. Here :class:`~moabb.evaluations.WithinSessionEvaluation` (5-fold
cross-validation within each subject's session) compares

- tangent space + logistic regression (pyRiemann), the usual baseline,
- :class:`~skfedspd.SPDnetClassifier`,
- :class:`~skfedspd.FederatedSPDnetClassifier`: within one session there are no subjects to
  split, so the trials are partitioned into ``n_clients`` clients (``client_source_`` is
  ``"partition:stratified"``). With :class:`~moabb.evaluations.CrossSubjectEvaluation` and
  metadata routing, the training subjects become the clients.

The data: the PhysioNet motor imagery dataset (left vs right hand imagery, 2 subjects) from
its offline copy when it is found (:func:`skfedspd.datasets.find_physionet_root`), otherwise
MOABB's :class:`~moabb.datasets.fake.FakeDataset` (white noise: the scores are then at chance
level, the example only shows the mechanics). MOABB's results store goes to a temporary
folder (``hdf5_path``), never into the data folder.
"""

# %%
# Dataset and paradigm
# --------------------
import logging
import os
import tempfile
import warnings

import matplotlib.pyplot as plt
import mne
from moabb.datasets import PhysionetMI
from moabb.datasets.fake import FakeDataset
from moabb.evaluations import WithinSessionEvaluation
from moabb.paradigms import LeftRightImagery
from pyriemann.estimation import Covariances
from pyriemann.tangentspace import TangentSpace
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.clients import ClientPartition
from skfedspd.datasets import configure_offline, find_physionet_root
from skfedspd.training import EpochSchedule

# MNE and MOABB report every recording they read; keep the output to the results.
mne.set_log_level("ERROR")
logging.getLogger("moabb").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", message="Creating a dataset without passing data")  # h5py, in MOABB
workdir = tempfile.mkdtemp(prefix="skfedspd-moabb-")

root = find_physionet_root()
if root is not None:
    configure_offline(root)  # MNE/MOABB read the offline copy; no download is attempted
    dataset = PhysionetMI(imagined=True)
    dataset.subject_list = [1, 2]
    dataset.feet_runs = []  # left/right hand runs only: all present offline
    # the 21 channels over the sensorimotor cortex (of 64): faster, and where the signal is
    channels = [f"{row}{col}" for row in ("FC", "C", "CP") for col in ("5", "3", "1", "z", "2", "4", "6")]
else:
    print("PhysioNet EEG not found (set SKFEDSPD_DATA): using MOABB's FakeDataset (noise)")
    os.environ["MNE_DATA"] = workdir
    dataset = FakeDataset(event_list=["left_hand", "right_hand"], n_sessions=1, n_runs=1,
                          n_subjects=2, channels=("C3", "Cz", "C4", "FC3", "FC4", "CP3", "CP4", "Pz"),
                          n_events=40, duration=100, seed=0)
    channels = None
paradigm = LeftRightImagery(fmin=8, fmax=32, channels=channels)
print(dataset.code, "subjects", dataset.subject_list)

# %%
# Pipelines
# ---------
# Covariances in the µV² of MOABB's default units are fine: ``scaling="auto"`` rescales them
# by one scalar fitted on the training folds.
spdnet = SPDnetClassifier(hidden_dims=(6,), lr=1e-2, max_epochs=30, schedule=EpochSchedule(patience=20),
                          random_state=0)
pipelines = {
    "TS + LR": make_pipeline(Covariances("oas"), TangentSpace(), LogisticRegression(max_iter=1000)),
    "SPDnet": make_pipeline(Covariances("oas"), spdnet),
    "FedSPDnet": make_pipeline(
        Covariances("oas"),
        FederatedSPDnetClassifier(spdnet, aggregation="projavg", n_rounds=10, clients=ClientPartition(n_clients=3),
                                  random_state=0),
    ),
}

# %%
# Evaluation
# ----------
evaluation = WithinSessionEvaluation(paradigm=paradigm, datasets=[dataset], overwrite=True,
                                     hdf5_path=workdir, random_state=0)
results = evaluation.process(pipelines)
print(results.groupby("pipeline")[["score", "time"]].mean().round(3))

# %%
# One score per subject and pipeline (ROC AUC for two classes, MOABB's default).
table = results.pivot_table(index="subject", columns="pipeline", values="score")
ax = table.plot.bar(figsize=(6, 3.5), ylim=(0, 1), rot=0)
ax.axhline(0.5, color="k", ls=":", lw=1)
ax.set(ylabel="ROC AUC (5-fold, within session)", title=f"{dataset.code}, left vs right hand")
ax.legend(loc="lower right")
plt.tight_layout()
