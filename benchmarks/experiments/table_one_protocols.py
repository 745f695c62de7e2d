"""What Table I runs (``table-one``): per-dataset hyper-parameters, the training schedule, the
budgets and the estimators they build.

The schedule of the federated runs (patience and learning-rate patience, counted in rounds)
is set in one place, :func:`federated_schedule`.
"""

from dataclasses import dataclass
from typing import Callable

from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from skfedspd import EEGNetClassifier, FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.classifier import auto_hidden_dim
from skfedspd.clients import ClientPartition
from skfedspd.training import EpochSchedule, RoundSchedule
from skfedspd.datasets import PHYSIONET_OFFLINE_SUBJECTS, sample_covariance

from . import data
from .console import logged_command

LOCAL_EPOCHS = 2  # E of the paper; centralized models get rounds x E epochs
TEST_FRACTION = 0.15
VALIDATION_FRACTION = 0.10 / 0.85  # 75/10/15 of each client's data
# Paper: Adam 1e-3, batch 64, ReduceLROnPlateau(20, 0.5); centralized early stopping 75 epochs
# on the validation macro-F1, whatever the size of the validation part (the package's
# defaults differ: early_stopping="auto", validation_metric="loss").
TRAINING = dict(lr=1e-3, batch_size=64, early_stopping=True, validation_metric="f1")
SCHEDULE = dict(patience=75, lr_patience=20, lr_factor=0.5)  # in epochs centrally; rounds: federated_schedule


def federated_schedule(participation):
    """Round-level schedule of a federated run, as parameters of the federated estimator.

    All T rounds are run (no early stopping; the best-validation global model is kept), and
    ReduceLROnPlateau's patience (20) counts rounds of *full participation*: with a fraction
    ``participation`` of the clients per round it is 20 / participation rounds, the same
    number of client updates. Counted in plain rounds, Half participation halved its
    learning rate 2-4 times in 150 rounds (Full: 0-1; ``python -m benchmarks.experiments
    table-one-ablation``), on a validation score made noisier by training half the clients.
    """
    return {"schedule": RoundSchedule(patience=None, lr_patience=round(SCHEDULE["lr_patience"] / participation),
                                      lr_factor=SCHEDULE["lr_factor"])}


@dataclass(frozen=True)
class Budget:
    """How much of the protocol a profile runs.

    ``seeds`` / ``rounds`` are for the SPDnet and pyRiemann cells, ``eegnet_*`` for EEGNet;
    centralized networks get ``rounds x LOCAL_EPOCHS`` epochs. ``unseen_folds`` 0 skips
    the unseen-subject table. ``offline_only`` skips a dataset whose files are not on
    disk (one line) instead of letting MOABB download it. ``subjects``: the PhysionetMI
    subjects of the profile (None: the 16 of the offline copy; ``--subjects`` overrides).
    ``centralized_seeds``: seeds of the centralized cells but EEGNet's when they differ from
    ``seeds`` (cheap cells whose early stopping on a small validation part makes one seed
    unrepresentative). The recommended configuration (package defaults) trains centralized
    for ``recommended_epochs`` epochs at most (None: the package's ``max_epochs``) and
    federated for ``recommended_rounds`` rounds (the package's ``n_rounds`` unless a profile
    sizes it by convergence), with ``recommended_seeds`` seeds (None: ``seeds``).
    """

    seeds: int
    rounds: int
    eegnet_seeds: int
    eegnet_rounds: int
    unseen_folds: int
    unseen_rounds: int
    unseen_eegnet: bool
    offline_only: bool
    subjects: tuple = None
    centralized_seeds: int = None
    recommended_rounds: int = 150
    recommended_seeds: int = None
    recommended_epochs: int = None

    def seeds_for(self, cell):
        if cell.model == "eegnet":
            return self.eegnet_seeds
        if (not cell.federated or not cell.network) and self.centralized_seeds is not None:
            return self.centralized_seeds  # the cheap cells, the federated classical baseline among them
        if cell.federated and cell.recommended and self.recommended_seeds is not None:
            return self.recommended_seeds
        return self.seeds

    def rounds_for(self, cell):
        """Rounds of a federated cell, or of the paper's centralized network (x ``LOCAL_EPOCHS``
        epochs); None for the cells that set their own (pyRiemann, package defaults)."""
        if cell.recommended:
            return self.recommended_rounds if cell.federated else None
        if not cell.network:
            return None
        return self.eegnet_rounds if cell.model == "eegnet" else self.rounds


#: PhysionetMI subjects of the quick profile: 4 clients of 2 (sorted pairs 1-2, 3-4, 5-6,
#: 15-42), every client with all four classes.
QUICK_SUBJECTS = (1, 2, 3, 4, 5, 6, 15, 42)

PROFILES = {
    # Sized by convergence, not by rounds: every federated model of the paper's protocol runs
    # 450 rounds (the FedSPDnet validation curve of the 16-subject protocol still rises at
    # the paper's T = 150 and flattens near round 425; docs/benchmarks/tableone.md), on half the subjects
    # and one seed. The recommended federation (local lr 1e-2, server momentum) has its
    # learning rate halved 5 times by round 125 and its validation score flat after round
    # 30: the package's 150 rounds, 4 seeds. The cheap centralized rows get 8 seeds (splits),
    # so that their paired differences to TS+LR have a standard error. Offline datasets only.
    "quick": Budget(seeds=1, rounds=450, eegnet_seeds=1, eegnet_rounds=450, unseen_folds=0, unseen_rounds=450,
                    unseen_eegnet=False, offline_only=True, subjects=QUICK_SUBJECTS, centralized_seeds=8,
                    recommended_rounds=150, recommended_seeds=4),
    # The paper's budget: T = 150 rounds, 10 seeds, the 16 offline subjects.
    "full": Budget(seeds=10, rounds=150, eegnet_seeds=10, eegnet_rounds=150, unseen_folds=8, unseen_rounds=150,
                   unseen_eegnet=True, offline_only=False),
    # Checks the plumbing, not the science.
    "smoke": Budget(seeds=1, rounds=2, eegnet_seeds=1, eegnet_rounds=1, unseen_folds=2, unseen_rounds=1,
                    unseen_eegnet=True, offline_only=False, recommended_rounds=2, recommended_epochs=4),
}


@dataclass(frozen=True)
class Protocol:
    """One dataset of Table I with the paper's hyper-parameters for it.

    ``moabb()`` returns the MOABB ``(dataset, paradigm)`` (used by the unseen-subject
    evaluation); ``load()`` returns ``(X, y, subjects)``, band-passed trials in volts of
    ``n_times`` samples at ``fs`` Hz; ``offline()`` says whether ``load()`` can run without
    a download (None when it cannot tell).
    """

    name: str
    hidden_dim: int  # d of the single BiRe block
    eps: float  # ReEig threshold
    fs: float
    n_times: int
    moabb: Callable
    load: Callable
    offline: Callable = lambda: None
    subjects: tuple = None  # None: the dataset's own list


#: Left out of PhysionetMI: recorded at 128 Hz, with another run layout.
PHYSIONET_EXCLUDED = (88,)


def physionet_protocol(n_classes=4, subjects=None, channels=None):
    """PhysionetMI: 4 classes (left / right hand, hands, feet) or 2 (left / right hand).

    ``subjects`` None means the offline subset. When every subject is offline, trials come
    from :func:`.data.physionet_trials` (never downloads; runs picked from what is present),
    otherwise from MOABB's download, resampled to 160 Hz. ``channels`` (names) keeps those
    EEG channels in that order (None: all 64); the network's hidden size follows the
    package's ``hidden_dims="auto"`` rule (18 at 64 channels, the paper's).
    """
    subjects = list(PHYSIONET_OFFLINE_SUBJECTS if subjects is None else subjects)
    excluded = sorted(set(subjects) & set(PHYSIONET_EXCLUDED))
    if excluded:
        raise ValueError(f"PhysionetMI subject(s) {excluded} are excluded (128 Hz recordings)")

    def offline():
        return data.is_offline(subjects)

    def moabb():
        on_disk = offline()  # then run 6: the one hands/feet run every offline subject has
        return data.physionet_moabb(subjects, n_classes, feet_runs=[6] if on_disk else None,
                                    resample=None if on_disk else 160.0,
                                    channels=None if channels is None else list(channels))

    def load():
        if offline():
            return data.physionet_trials(subjects, n_classes, n_times=480, channels=channels)
        return data.moabb_trials(*moabb(), n_times=480)

    name = ("PhysionetMI" if n_classes == 4 else "PhysionetMI-2class") + ("" if channels is None else f"-{len(channels)}ch")
    hidden = 18 if channels is None else auto_hidden_dim(len(channels))
    return Protocol(name, hidden_dim=hidden, eps=1e-2, fs=160.0, n_times=480, moabb=moabb, load=load, offline=offline,
                    subjects=tuple(subjects))


def weibo_protocol():
    return Protocol("Weibo2014", hidden_dim=22, eps=1e-1, fs=200.0, n_times=800, moabb=data.weibo_moabb,
                    load=lambda: data.moabb_trials(*data.weibo_moabb(), n_times=800), offline=data.weibo_offline)


def protocols(n_classes=4, subjects=None):
    """The datasets of Table I by name (PhysionetMI with these classes and subjects)."""
    return {"PhysionetMI": physionet_protocol(n_classes, subjects), "Weibo2014": weibo_protocol()}


PROTOCOLS = protocols()


def load_offline_physionet(say=print):
    """``(protocol, X_raw, covariances, y, subjects)`` of Table I's PhysionetMI protocol from the
    offline copy (its MNE and MOABB settings made; ``covariances``: the trials' sample
    covariances); None where the EEG files are absent (``say`` tells why)."""
    if data.offline_root(say) is None:
        return None
    protocol = PROTOCOLS["PhysionetMI"]
    X_raw, y, subjects = protocol.load()
    return protocol, X_raw, sample_covariance(X_raw), y, subjects


def logged_offline_study(log, log_file):
    """``(command, loaded)``: this run's command line, logged first
    (:func:`.console.logged_command`), and :func:`load_offline_physionet`'s data (None where
    the EEG files are absent; ``log`` says why)."""
    return logged_command(log, log_file), load_offline_physionet(log.info)


def spdnet(protocol, seed, epochs, verbose=False):
    return SPDnetClassifier(hidden_dims=(protocol.hidden_dim,), eps=protocol.eps, **TRAINING, max_epochs=epochs,
                            schedule=EpochSchedule(**SCHEDULE), validation_fraction=VALIDATION_FRACTION,
                            random_state=seed, verbose=verbose)


def eegnet(protocol, seed, epochs, verbose=False):
    return EEGNetClassifier(fs=protocol.fs, **TRAINING, max_epochs=epochs, schedule=EpochSchedule(**SCHEDULE),
                            validation_fraction=VALIDATION_FRACTION, random_state=seed, verbose=verbose)


def federated(local, aggregation, participation, rounds, seed, verbose=False, server=None):
    """``local`` (a fresh local model) trained by T = ``rounds`` rounds of E = 2 local
    epochs on clients of 2 subjects, a fraction ``participation`` of them per round, each
    with a fresh Adam every round (the paper's clients).
    ``server``: server-optimizer parameters (None: the paper's, the aggregate as is)."""
    return FederatedSPDnetClassifier(
        local.set_params(verbose=False), aggregation=aggregation, n_rounds=rounds, local_epochs=LOCAL_EPOCHS,
        clients_per_round=None if participation == 1.0 else participation,
        clients=ClientPartition(groups_per_client=2), validation_fraction=VALIDATION_FRACTION, random_state=seed, verbose=verbose, client_optimizer_state="reset",
        **(server or {}),
    ).set_params(**federated_schedule(participation))


def recommended_spdnet(seed, domains=False, verbose=False):
    """The package's recommended SPDnet: ``SPDnetClassifier()`` as shipped, with per-subject
    domain batch norm when ``domains``."""
    return SPDnetClassifier(batchnorm="domain" if domains else None, random_state=seed, verbose=verbose)


def recommended_federated(participation, rounds, seed, server, verbose=False):
    """The package's recommended federation on the paper's clients of 2 subjects: local
    ``SPDnetClassifier(batchnorm="domain")`` (each subject a domain) with the package's
    defaults, and the server optimizer ``server`` with a fresh client Adam every round (the
    pairing the ``server_optimizer`` docstring recommends; kept client state and server
    momentum do not combine)."""
    return FederatedSPDnetClassifier(
        SPDnetClassifier(batchnorm="domain"), n_rounds=rounds, clients=ClientPartition(groups_per_client=2),
        clients_per_round=None if participation == 1.0 else participation, client_optimizer_state="reset",
        random_state=seed, verbose=verbose, **server)


def riemann_reference(name):
    """pyRiemann's references: ``"ts-lr"`` (tangent space + logistic regression) or ``"mdm"``;
    ``"fed-ts-lr"``, the federated classical baseline on the paper's clients of 2 subjects."""
    from pyriemann.classification import MDM
    from pyriemann.tangentspace import TangentSpace

    from skfedspd import FederatedTangentSpaceLR

    if name == "fed-ts-lr":
        return FederatedTangentSpaceLR(groups_per_client=2)

    if name == "ts-lr":
        return make_pipeline(TangentSpace(metric="riemann"), LogisticRegression(max_iter=2000))
    if name == "mdm":
        return MDM(metric="riemann")
    raise ValueError(f"unknown classical reference {name!r}; expected 'ts-lr', 'mdm' or 'fed-ts-lr'")

