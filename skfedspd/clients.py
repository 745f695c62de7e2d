"""How a federated fit's samples become clients: :class:`ClientPartition`."""

import warnings
from numbers import Real

import numpy as np
import sklearn
from sklearn.utils._param_validation import Interval, StrOptions

from .training import Settings, derive_seed
from .validation import Count, check_count, check_label_values

__all__ = ["ClientPartition", "make_clients", "partition_indices", "PARTITIONS"]

PARTITIONS = ("stratified", "contiguous", "dirichlet")


def make_clients(groups, groups_per_client=1):
    """Client index arrays from a group array: sorted groups, merged in chunks; returns
    ``(client_indices, client_groups)``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.clients import make_clients
    >>> indices, client_groups = make_clients(np.array([3, 1, 1, 2, 3, 2]), groups_per_client=2)
    >>> client_groups
    [(1, 2), (3,)]
    """
    check_count(groups_per_client, "groups_per_client", 1)
    check_label_values(groups, "groups")
    groups = np.asarray(groups)
    if groups.ndim != 1:
        raise ValueError(f"groups must be 1-D, got shape {groups.shape}")
    unique = np.unique(groups)
    chunks = [unique[i : i + groups_per_client] for i in range(0, len(unique), groups_per_client)]
    indices = [np.flatnonzero(np.isin(groups, chunk)) for chunk in chunks]
    return indices, [tuple(chunk.tolist()) for chunk in chunks]


def partition_indices(y, n_clients, partition, alpha, seed):
    """Client index arrays without groups: ``"stratified"``, ``"contiguous"`` or ``"dirichlet"``
    (label skew of concentration ``alpha``).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.clients import partition_indices
    >>> y = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    >>> [idx.tolist() for idx in partition_indices(y, 2, "contiguous", alpha=None, seed=0)]
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    """
    n = len(y)
    rng = np.random.default_rng(seed)
    if partition == "contiguous":
        return np.array_split(np.arange(n), n_clients)
    if partition == "stratified":
        order = np.concatenate([rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y)])
        return [np.sort(order[i::n_clients]) for i in range(n_clients)]
    if partition == "dirichlet":
        parts = [[] for _ in range(n_clients)]
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet(alpha * np.ones(n_clients))) * len(idx)).astype(int)[:-1]
            for part, chunk in zip(parts, np.split(idx, cuts)):
                part.extend(chunk.tolist())
        return [np.sort(np.asarray(p, dtype=int)) for p in parts]
    raise ValueError(f"partition must be one of {PARTITIONS}, got {partition!r}")


class ClientPartition(Settings):
    """How ``FederatedSPDnetClassifier.fit`` splits its samples into clients.

    Parameters
    ----------
    groups_per_client : int, default=1
        With groups: sorted groups merged this many at a time into one client.
    n_clients : int, default=5
        Without groups: the number of clients (a stratified partition makes at most as many
        as the smallest class has samples).
    partition : {"stratified", "contiguous", "dirichlet"} or None, default=None
        Without groups: how the samples are split. None: stratified, with a warning when
        groups were probably meant.
    alpha : float > 0, default=0.5
        The Dirichlet concentration.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.clients import ClientPartition
    >>> indices, source, groups = ClientPartition(groups_per_client=2).split(np.zeros(4), np.array([1, 1, 2, 3]), 0)
    >>> [idx.tolist() for idx in indices], source, groups
    ([[0, 1, 2], [3]], 'groups', [(1, 2), (3,)])
    """

    _parameter_constraints = {
        "groups_per_client": [Count(1)],
        "n_clients": [Count(1)],
        "partition": [None, StrOptions(set(PARTITIONS))],
        "alpha": [Interval(Real, 0, None, closed="neither")],
    }

    def __init__(self, groups_per_client=1, n_clients=5, partition=None, alpha=0.5):
        self.groups_per_client = groups_per_client
        self.n_clients = n_clients
        self.partition = partition
        self.alpha = alpha

    def split(self, codes, groups, seed, *, owner="FederatedSPDnetClassifier"):
        """``(indices, client_source, client_groups)``: by ``groups`` when given, else the seeded partition."""
        if groups is not None:
            groups = np.asarray(groups)
            if len(groups) != len(codes):
                raise ValueError(f"groups has {len(groups)} entries but X has {len(codes)} samples")
            indices, client_groups = make_clients(groups, self.groups_per_client)
            return indices, "groups", client_groups
        partition = self.partition or "stratified"
        n_clients = self.n_clients
        if partition != "stratified" and n_clients > len(codes):
            raise ValueError(f"n_clients={self.n_clients} exceeds the {len(codes)} samples")
        if partition == "stratified":
            n_clients = min(n_clients, int(np.unique(codes, return_counts=True)[1].min()))  # classes held
            if n_clients < self.n_clients:
                warnings.warn(f"n_clients={self.n_clients} reduced to {n_clients}, the size of the smallest class, so "
                              "that every client of the stratified partition holds every class", UserWarning,
                              stacklevel=6)
        if self.partition is None and not sklearn.get_config()["enable_metadata_routing"]:
            warnings.warn(
                f"{owner}.fit received no groups: its {n_clients} clients are a random "
                "stratified partition of the samples, not one client per subject. Pass groups=subjects to fit "
                "(through GridSearchCV / cross_validate / MOABB, enable sklearn.set_config("
                "enable_metadata_routing=True) so that they reach it), or set "
                "clients=ClientPartition(partition='stratified') to silence this warning.", UserWarning, stacklevel=6)
        indices = partition_indices(codes, n_clients, partition, self.alpha, derive_seed(seed, 7))
        empty = [i for i, idx in enumerate(indices) if len(idx) == 0]
        if empty:
            raise ValueError(f"clients {empty} received no samples (partition={partition!r})")
        return indices, f"partition:{partition}", [None] * len(indices)
