"""Shared pytest fixtures and helpers of every test tier.

- ``tests/test_<module>.py``: one module of the package each (``test_nn`` for
  ``skfedspd/nn.py``), and the cross-cutting ones (hostile inputs, pyRiemann's battery, the
  real EEG, the import layers, the docstrings);
- ``tests/benchmarks/``: the benchmark harness, its records and the documentation's figures;
- ``tests/repository/``: the repository's own text and install page.

``make test`` (``pytest``) runs every tier.
"""

import pytest

from skfedspd.datasets import configure_offline, find_physionet_root

# PhysioNet EEG (../shared/data): set MNE_DATA, MNE_DATASETS_EEGBCI_PATH and
# MOABB_DOWNLOAD_PROVIDER=upstream as early as possible, before any test imports mne
# or moabb, so that nothing ever tries to download.
_PHYSIONET_ROOT = find_physionet_root()
if _PHYSIONET_ROOT is not None:
    configure_offline(_PHYSIONET_ROOT)


def physionet_root_or_skip(root=None):
    """Return the PhysioNet data root (see ``find_physionet_root``) or skip the test."""
    found = find_physionet_root(root)
    if found is None:
        pytest.skip("PhysioNet EEG files not found in ../shared/data")
    return configure_offline(found)


@pytest.fixture
def accounting():
    """Skips the test where the ``privacy`` extra (dp_accounting) is not installed."""
    pytest.importorskip("dp_accounting")


@pytest.fixture(scope="session")
def physionet_root():
    """Offline PhysioNet eegmmidb data root; skips the test when the files are absent."""
    return physionet_root_or_skip()


# ---------------------------------------------------------------------------------------------
# Synthetic SPD / EEG-like data with class structure (tests of SPDNet and SPDnetClassifier)
# ---------------------------------------------------------------------------------------------

import numpy as np  # noqa: E402

from skfedspd.datasets import make_spd_classification as make_spd_dataset  # noqa: E402,F401



def make_eeg_timeseries(n_trials=90, n_channels=8, n_times=128, n_classes=3, seed=0,
                        gain=3.0, noise=0.5, amplitude=1e-5):
    """Seeded multichannel time series ``(n_trials, n_channels, n_times)`` whose class sets
    the variance of hidden sources, as pyRiemann users simulate motor imagery.

    ``n_channels`` sources of unit variance are mixed by one random matrix; in class ``k``
    source ``k`` has its standard deviation multiplied by ``gain``. Sensor noise of relative
    level ``noise`` is added, and everything is scaled by ``amplitude`` (volts).
    """
    rng = np.random.default_rng(seed)
    mixing = rng.standard_normal((n_channels, n_channels))
    y = np.arange(n_trials) % n_classes
    X = np.empty((n_trials, n_channels, n_times))
    for i, k in enumerate(y):
        sources = rng.standard_normal((n_channels, n_times))
        sources[k] *= gain
        X[i] = mixing @ sources + noise * rng.standard_normal((n_channels, n_times))
    return amplitude * X, y


@pytest.fixture(scope="session")
def spd_dataset():
    """Factory ``spd_dataset(n_matrices=60, n_channels=8, n_classes=3, seed=0, ...)`` →
    ``(X, y)``: seeded SPD matrices with class structure (see ``make_spd_dataset``)."""
    return make_spd_dataset


def make_spd_domains(n_groups=3, n_per_group=30, n_channels=6, seed=0, labels=None):
    """``(X, y, groups)``: one 2-class structure (centred at the identity) seen through a
    different SPD congruence ``X ↦ S_g X S_g`` in every group — the domain shift that
    re-centring removes (Zanini et al.'s model of a subject or session)."""
    from skfedspd.recenter import recenter_groups

    rng = np.random.default_rng(seed)
    X, y = make_spd_dataset(n_matrices=n_groups * n_per_group, n_channels=n_channels, n_classes=2,
                            seed=seed, separation=2.0)
    X = recenter_groups(X)
    groups = np.repeat(np.arange(n_groups), n_per_group)
    for g in range(n_groups):
        B = rng.standard_normal((n_channels, n_channels))
        lam, U = np.linalg.eigh(B @ B.T / n_channels + 0.2 * np.eye(n_channels))
        S = (U * np.sqrt(lam)) @ U.T
        X[groups == g] = S @ X[groups == g] @ S
    if labels is not None:
        groups = np.asarray(labels)[groups]
    return 0.5 * (X + X.transpose(0, 2, 1)), y, groups


@pytest.fixture(scope="session")
def spd_domains():
    """Factory ``spd_domains(n_groups=3, n_per_group=30, n_channels=6, seed=0, labels=None)``
    → ``(X, y, groups)``: 2-class SPD data, each group shifted by its own congruence."""
    return make_spd_domains


@pytest.fixture(scope="session")
def eeg_timeseries():
    """Factory ``eeg_timeseries(n_trials=90, n_channels=8, n_times=128, n_classes=3, ...)``
    → ``(X, y)``: seeded multichannel time series with class-dependent source variance."""
    return make_eeg_timeseries


@pytest.fixture(scope="session")
def spd_batch():
    """Factory ``spd_batch(n, n_channels, seed=0, dtype=torch.float64)`` → a torch batch of
    well-conditioned random SPD matrices (eigenvalues in [0.5, 2.5])."""
    import torch

    def _make(n, n_channels, seed=0, dtype=torch.float64):
        rng = np.random.default_rng(seed)
        Q, _ = np.linalg.qr(rng.standard_normal((n, n_channels, n_channels)))
        lam = rng.uniform(0.5, 2.5, size=(n, n_channels))
        X = (Q * lam[:, None, :]) @ Q.transpose(0, 2, 1)
        return torch.as_tensor(0.5 * (X + X.transpose(0, 2, 1)), dtype=dtype)

    return _make


@pytest.fixture(scope="module")
def torch_single_thread():
    """Run a module's tests with one torch intra-op thread (restored afterwards): tiny
    matrices are much faster that way, and a busy 2-core machine is not oversubscribed."""
    from skfedspd.training import torch_threads

    with torch_threads(1):
        yield


# ---------------------------------------------------------------------------------------------
# MOABB FakeDataset, offline, every path inside tmp_path
# ---------------------------------------------------------------------------------------------

import os  # noqa: E402


@pytest.fixture
def fake_moabb(tmp_path, monkeypatch):
    """Factory ``fake_moabb(**FakeDataset kwargs)`` → a MOABB ``FakeDataset`` whose data,
    results and MNE paths all lie in ``tmp_path`` (FakeDataset itself points its path
    variable to a fresh ``mkdtemp``; that variable is redirected and restored)."""
    pytest.importorskip("moabb")
    monkeypatch.setenv("MNE_DATA", str(tmp_path / "mne_data"))
    monkeypatch.setenv("MOABB_RESULTS", str(tmp_path / "results"))
    from moabb.datasets.fake import FakeDataset

    def make(**kwargs):
        before = set(os.environ)
        dataset = FakeDataset(**{"seed": 0, **kwargs})
        for key in set(os.environ) - before:
            created = os.environ.pop(key)
            if os.path.isdir(created) and not os.listdir(created):
                os.rmdir(created)
            monkeypatch.setenv(key, str(tmp_path / "fake"))
        return dataset

    return make


def run_experiment(module, argv):
    """Run a harness experiment (``benchmarks.experiments.<module>``) with the options
    ``argv``, as ``python -m benchmarks.experiments NAME ...`` does; its return status (0: done)."""
    import argparse

    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv), list(argv)) or 0


def gauss_np(shape, seed):
    """Standard normal numbers of ``shape`` from ``seed`` (the layer tests' perturbations)."""
    return np.random.default_rng(seed).standard_normal(shape)


def sym_weights(k, seed):
    """A random symmetric ``k × k`` float64 tensor: the weights of a smooth test loss."""
    import torch

    C = torch.as_tensor(gauss_np((k, k), seed), dtype=torch.float64)
    return C + C.T


def perturb_V(bimap, scale, seed):
    """Move a BiMap's tangent coordinates ``V`` away from the chart centre by ``scale``."""
    import torch

    with torch.no_grad():
        bimap.V.copy_(torch.as_tensor(scale * gauss_np(tuple(bimap.V.shape), seed)))


# ---------------------------------------------------------------------------------------------
# Small federations (tests of the federation, its local transport and its hostile inputs)
# ---------------------------------------------------------------------------------------------

SMALL_CHANNELS = 6
_PARTITION_FIELDS = ("groups_per_client", "n_clients", "partition", "alpha")
_LOCAL_BACKEND_FIELDS = ("n_jobs", "checkpoint_path")


def small_data(n=60, n_classes=3, seed=0):
    """``(X, y)``: ``n`` SPD matrices of 6 channels."""
    return make_spd_dataset(n, SMALL_CHANNELS, n_classes, seed=seed)


def small_estimator(**kwargs):
    """A small ``SPDnetClassifier`` that holds out validation even on small data."""
    from skfedspd import SPDnetClassifier

    return SPDnetClassifier(**{"hidden_dims": (3,), "batch_size": 8, "lr": 0.05, "early_stopping": True, **kwargs})


def small_federation(estimator=None, **kwargs):
    """A few rounds of one local epoch on 3 stratified clients. The client partition's fields
    (``n_clients``, ``partition``, ...) and the local backend's (``n_jobs``,
    ``checkpoint_path``) may be given flat: they go into ``clients`` and ``backend``."""
    from skfedspd import FederatedSPDnetClassifier
    from skfedspd.backends import LocalBackend
    from skfedspd.clients import ClientPartition

    partition = {"n_clients": 3, "partition": "stratified"}
    partition.update({k: kwargs.pop(k) for k in _PARTITION_FIELDS if k in kwargs})
    local = {k: kwargs.pop(k) for k in _LOCAL_BACKEND_FIELDS if k in kwargs}
    params = {"n_rounds": 3, "local_epochs": 1, "random_state": 0, "clients": ClientPartition(**partition),
              **({"backend": LocalBackend(**local)} if local else {}), **kwargs}
    return FederatedSPDnetClassifier(estimator if estimator is not None else small_estimator(), **params)


def without_time(history):
    """A fit's history without its wall times (what two identical runs share)."""
    return [{k: v for k, v in record.items() if k != "wall_time"} for record in history]


def count_local_updates(monkeypatch, fail=None):
    """Replace ``SPDnetClassifier.local_update`` (the one local-training routine) by a
    wrapper that counts calls and raises on the calls for which ``fail(call_index)`` is
    true; returns the list of recorded calls."""
    import torch

    from skfedspd import SPDnetClassifier

    original = SPDnetClassifier.local_update
    calls = []

    def wrapper(self, global_params, local_state, X, y, **kwargs):
        index = len(calls)
        calls.append({"y": torch.as_tensor(y).clone(), "seed": kwargs["seed"], "lr": kwargs["lr"]})
        if fail is not None and fail(index):
            raise OSError(f"simulated failure at call {index}")
        return original(self, global_params, local_state, X, y, **kwargs)

    monkeypatch.setattr(SPDnetClassifier, "local_update", wrapper)
    return calls
