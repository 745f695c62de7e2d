"""``FederatedSPDnetClassifier``: FedSPDnet (Algorithm 1 of the paper) as a meta-estimator.

Clients are simulated in-process (optionally in parallel with joblib). Each round the server
samples clients with a seeded generator, broadcasts the global parameters, every selected
client runs :func:`skfedspd.training.train_epochs` (the same routine as centralized
training) with a fresh optimizer, and the server aggregates with a pure function of
:mod:`skfedspd.aggregation`.
"""

import numbers
import os
import pickle
import time
from dataclasses import dataclass

import numpy as np
import torch
from joblib import Parallel, delayed, effective_n_jobs
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.utils.validation import check_is_fitted

from .aggregation import client_weights, get_aggregation
from .base import _progress, stratified_split
from .classifier import SPDnetClassifier
from .stiefel import orthonormality_error
from .training import PlateauSchedule, derive_seed, evaluate

__all__ = ["FederatedSPDnetClassifier", "local_update", "make_clients"]


@dataclass
class Client:
    """One simulated site: its training and validation parts (already tensors)."""

    cid: int
    groups: tuple
    X_train: torch.Tensor
    y_train: torch.Tensor
    X_val: torch.Tensor
    y_val: torch.Tensor


def local_update(est, global_params, local_state, X, y, **kwargs):
    """One client's work in a round: the local estimator's protocol method
    :meth:`~skfedspd.base.TorchClassifierBase.local_update`."""
    return est.local_update(global_params, local_state, X, y, **kwargs)


def make_clients(groups, groups_per_client=1):
    """Client index arrays from a group (subject) array: sorted groups, merged in chunks.

    Returns ``(client_indices, client_groups)``.
    """
    groups = np.asarray(groups)
    if groups.ndim != 1:
        raise ValueError(f"groups must be 1-D, got shape {groups.shape}")
    unique = np.unique(groups)
    chunks = [unique[i : i + groups_per_client] for i in range(0, len(unique), groups_per_client)]
    indices = [np.flatnonzero(np.isin(groups, chunk)) for chunk in chunks]
    return indices, [tuple(chunk.tolist()) for chunk in chunks]


def _partition(y, n_clients, partition, alpha, seed):
    """Fallback client split when no groups are given."""
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
    raise ValueError(f"partition must be 'stratified', 'contiguous' or 'dirichlet', got {partition!r}")


class FederatedSPDnetClassifier(ClassifierMixin, BaseEstimator):
    """Federated SPDnet (FedSPDnet) with ProjAvg / RLAvg aggregation.

    Parameters
    ----------
    estimator : TorchClassifierBase, default=None
        The local model and its training parameters (``SPDnetClassifier()`` when None),
        reachable as ``estimator__lr`` etc. Used: the architecture, ``lr``, ``batch_size``,
        ``dtype``, ``device``, the input scaling, and ``patience`` / ``lr_patience`` /
        ``lr_factor`` **counted in rounds**. Not used: ``max_epochs``,
        ``validation_fraction``, ``warm_start``, ``verbose``, ``random_state`` (this
        estimator's own take their place).
    aggregation : {"projavg", "rlavg", "karcher"} or callable, default="projavg"
        Server rule; a callable has the signature of :mod:`skfedspd.aggregation`
        (``rule(client_params, weights, previous, kinds) -> dict``).
    n_rounds : int, default=150
    local_epochs : int, default=2
    clients_per_round : int, float or None, default=None
        None: every client every round. int: exactly that many. float in (0, 1]:
        ``max(1, floor(fraction * N))`` (the paper's half participation is 0.5).
    groups_per_client : int, default=1
        Sorted groups (subjects) are merged this many at a time into one client.
    n_clients : int, default=5
        Number of clients when ``fit`` gets no groups.
    partition : {"stratified", "contiguous", "dirichlet"}, default="stratified"
        How samples are split into ``n_clients`` when ``fit`` gets no groups
        (``"dirichlet"``: label skew with concentration ``alpha``).
    alpha : float, default=0.5
    weighting : {"n_samples", "uniform"}, default="n_samples"
        Client weights in the aggregation (training samples of each replying client).
    validation_fraction : float, default=0.1
        Stratified share of each client's data kept on that client for validation.
    n_jobs : int or None, default=None
        joblib workers for the clients' local training (each worker runs one torch thread).
    random_state : int, RandomState instance or None, default=None
    verbose : bool, default=False
        A progress bar over rounds with the global validation macro-F1.
    on_client_error : {"raise", "skip"}, default="raise"
        "skip": a client whose local training raises is left out of that round's
        aggregation and recorded in ``history_``; the round fails only if all do.
    warm_start : bool, default=False
        A second ``fit`` continues for ``n_rounds`` more rounds from the last global model.
    checkpoint_path : str or None, default=None
        The full federated state is written there after every round; a ``fit`` that finds
        a checkpoint of the same configuration and data resumes from it and ends
        bit-identical to an uninterrupted fit.
    backend : {"local", "flower"}, default="local"
        "local": clients simulated in this process (joblib). "flower": ``fit`` runs an
        in-process Flower simulation (one virtual SuperNode per client, the ``flower``
        extra); the same ``random_state`` gives a bit-identical model on both backends
        (``n_jobs`` and ``checkpoint_path`` are local-only). Real multi-site deployments
        use :func:`skfedspd.flower.fit_federated` (``docs/deployment.md``).

    Attributes
    ----------
    global_estimator_ : TorchClassifierBase
        The best global model (highest weighted validation macro-F1 over rounds), fitted.
    classes_, n_features_in_
    n_clients_ : int
    client_groups_ : list of tuple
        Groups of each client (None entries when clients came from ``partition``).
    client_source_ : str
        ``"groups"`` or ``"partition:<name>"``.
    history_ : list of dict
        One record per round: ``round``, ``clients``, ``n_samples``, ``failed_clients``,
        ``train_loss`` (weighted mean), ``val_f1``, ``val_loss`` (global model after
        aggregation, on every client's validation part, weighted by its size),
        ``orthonormality`` (``‖WᵀW − I‖`` per Stiefel weight), ``lr``, ``wall_time``.
    best_round_ : int

    Notes
    -----
    Schedule semantics: after each round the new global model is evaluated on every
    client's validation part; the global validation macro-F1 is the mean of the clients'
    macro-F1 weighted by their validation sizes (loss likewise). This score drives, in
    rounds, ReduceLROnPlateau (the learning rate of the clients' fresh optimizers) and
    early stopping, and the best global model is kept. With partial participation the score
    is noisier (each round trains a subset, all clients validate) and a round holds fewer
    client updates, so a patience meant for full participation cuts the learning rate too
    early: scale ``estimator__lr_patience`` (and ``estimator__patience``) by ``N / M``.
    On PhysionetMI at M = N/2 this took the learning rate from 2-4 halvings in 150 rounds to
    0-1 (seeds 0-2, ``benchmarks/physionet_ablation.py``; ``docs/results.md``).
    """

    __metadata_request__fit = {"groups": True, "subjects": True}

    def __init__(
        self,
        estimator=None,
        aggregation="projavg",
        n_rounds=150,
        local_epochs=2,
        clients_per_round=None,
        groups_per_client=1,
        n_clients=5,
        partition="stratified",
        alpha=0.5,
        weighting="n_samples",
        validation_fraction=0.1,
        n_jobs=None,
        random_state=None,
        verbose=False,
        on_client_error="raise",
        warm_start=False,
        checkpoint_path=None,
        backend="local",
    ):
        self.estimator = estimator
        self.aggregation = aggregation
        self.n_rounds = n_rounds
        self.local_epochs = local_epochs
        self.clients_per_round = clients_per_round
        self.groups_per_client = groups_per_client
        self.n_clients = n_clients
        self.partition = partition
        self.alpha = alpha
        self.weighting = weighting
        self.validation_fraction = validation_fraction
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.verbose = verbose
        self.on_client_error = on_client_error
        self.warm_start = warm_start
        self.checkpoint_path = checkpoint_path
        self.backend = backend

    # ------------------------------------------------------------------ set-up
    def _check_params(self):
        for name in ("n_rounds", "local_epochs", "groups_per_client", "n_clients"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.on_client_error not in ("raise", "skip"):
            raise ValueError(f"on_client_error must be 'raise' or 'skip', got {self.on_client_error!r}")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction!r}")
        if self.backend not in ("local", "flower"):
            raise ValueError(f"backend must be 'local' or 'flower', got {self.backend!r}")
        get_aggregation(self.aggregation)
        client_weights([1.0], self.weighting)

    def _n_selected(self, n_clients):
        m = self.clients_per_round
        if m is None:
            return n_clients
        if isinstance(m, numbers.Integral) and not isinstance(m, bool):
            if not 1 <= m <= n_clients:
                raise ValueError(f"clients_per_round={m} must be between 1 and the {n_clients} clients")
            return int(m)
        if isinstance(m, numbers.Real) and not isinstance(m, bool) and 0 < m <= 1:
            return max(1, int(np.floor(m * n_clients)))
        raise ValueError(f"clients_per_round must be None, an int or a float in (0, 1], got {m!r}")

    def _client_indices(self, y_codes, groups, seed):
        if groups is not None:
            groups = np.asarray(groups)
            if len(groups) != len(y_codes):
                raise ValueError(f"groups has {len(groups)} entries but X has {len(y_codes)} samples")
            self.client_source_ = "groups"
            indices, self.client_groups_ = make_clients(groups, self.groups_per_client)
        else:
            if self.n_clients > len(y_codes):
                raise ValueError(f"n_clients={self.n_clients} exceeds the {len(y_codes)} samples")
            self.client_source_ = f"partition:{self.partition}"
            indices = _partition(y_codes, self.n_clients, self.partition, self.alpha, derive_seed(seed, 7))
            self.client_groups_ = [None] * len(indices)
        empty = [i for i, idx in enumerate(indices) if len(idx) == 0]
        if empty:
            raise ValueError(f"clients {empty} received no samples (partition={self.partition!r})")
        return indices

    # ------------------------------------------------------------------ fit
    def fit(self, X, y, groups=None, subjects=None):
        """Run federated training.

        Parameters
        ----------
        X : array-like
            Inputs of the local estimator (SPD matrices for SPDnet).
        y : array-like of shape (n_samples,)
        groups : array-like of shape (n_samples,), default=None
            Client key of each sample (e.g. subject). Requested by default under sklearn
            metadata routing, so ``GridSearchCV(..., cv=GroupKFold()).fit(X, y,
            groups=subjects)`` reaches it with no ``set_fit_request`` call.
        subjects : array-like, default=None
            Alias of ``groups``: MOABB's ``CrossSubjectEvaluation`` routes the training
            subjects under this key.

        Returns
        -------
        self
        """
        self._check_params()
        if groups is not None and subjects is not None and not np.array_equal(np.asarray(groups), np.asarray(subjects)):
            raise ValueError("groups and subjects were both given and differ; pass one of them")
        groups = groups if groups is not None else subjects
        if self.backend == "flower":
            from .flower.simulation_fit import fit_simulation

            return fit_simulation(self, X, y, groups)
        resume = self.warm_start and self.__sklearn_is_fitted__()
        est = self.global_estimator_ if resume else clone(self.estimator if self.estimator is not None else SPDnetClassifier())
        X = est.check_inputs(X, reset=not resume)
        if not resume:
            est.set_classes(y)
        codes = est.encode_labels(y, len(X))
        seed = self._seed_ if resume else self._draw_seed()
        indices = self._client_indices(codes, groups, seed)
        splits = [stratified_split(codes[idx], self.validation_fraction, derive_seed(seed, 8, i))
                  for i, idx in enumerate(indices)]

        if not resume:
            stats = [est.input_statistic(X[idx[tr]]) for idx, (tr, _) in zip(indices, splits)]
            self._init_state(est, seed, stats, [len(tr) for tr, _ in splits])
        self.classes_ = est.classes_
        self.n_features_in_ = est.n_features_in_
        self.n_clients_ = len(indices)
        clients = [
            Client(i, self.client_groups_[i], est.to_tensor(X[idx[tr]]), torch.as_tensor(codes[idx[tr]]),
                   est.to_tensor(X[idx[va]]), torch.as_tensor(codes[idx[va]]))
            for i, (idx, (tr, va)) in enumerate(zip(indices, splits))
        ]
        self.global_estimator_ = est
        self._run_rounds(est, clients, first_round=len(self.history_))
        est.set_parameters(self._schedule.best_state)
        self.best_round_ = self._schedule.best_step
        return self

    def _draw_seed(self):
        rs = self.random_state
        return int(rs.randint(0, 2**31 - 1) if isinstance(rs, np.random.RandomState)
                   else np.random.RandomState(rs).randint(0, 2**31 - 1))

    def _init_state(self, est, seed, stats, n_train):
        """Fresh federated state: pooled input statistic (clients' statistics weighted by
        their training sizes), initial module, schedule, history. Shared by the backends."""
        if stats[0] is not None:
            est.set_input_statistic(float(np.average(stats, weights=n_train)))
        else:
            est.set_input_statistic(None)
        est.init_module(seed)
        self._seed_ = seed
        self.history_ = []
        self._local_states = {}
        self._schedule = PlateauSchedule(est.lr, patience=est.patience, lr_patience=est.lr_patience,
                                         lr_factor=est.lr_factor)
        self._global = est.get_parameters()
        self._schedule.best_state = self._global

    def _select_clients(self, t, n_clients, n_select):
        """Round ``t``'s participants (sorted client ids) and their local-training seeds."""
        rng = np.random.default_rng(derive_seed(self._seed_, 9, t))
        selected = np.sort(rng.choice(n_clients, size=n_select, replace=False))
        return selected, [derive_seed(self._seed_, 10, t, int(i)) for i in selected]

    def _fingerprint(self, clients, first_round):
        params = {k: v for k, v in self.get_params(deep=True).items() if k not in ("verbose", "n_jobs", "checkpoint_path")}
        data = [(c.cid, float(c.X_train.sum()), len(c.y_train), len(c.y_val)) for c in clients]
        return repr((params, data, first_round))

    def _load_checkpoint(self, fingerprint):
        if not self.checkpoint_path or not os.path.exists(self.checkpoint_path):
            return
        with open(self.checkpoint_path, "rb") as f:
            saved = pickle.load(f)
        if saved["fingerprint"] != fingerprint:
            return
        self.history_, self._local_states, self._schedule, self._global = (
            saved["history"], saved["local_states"], saved["schedule"], saved["global"])

    def _save_checkpoint(self, fingerprint):
        tmp = f"{self.checkpoint_path}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump({"fingerprint": fingerprint, "history": self.history_, "local_states": self._local_states,
                         "schedule": self._schedule, "global": self._global}, f)
        os.replace(tmp, self.checkpoint_path)

    def _run_rounds(self, est, clients, first_round):
        fingerprint = self._fingerprint(clients, first_round) if self.checkpoint_path else None
        if fingerprint:
            self._load_checkpoint(fingerprint)
        aggregate = get_aggregation(self.aggregation)
        kinds = est.parameter_kinds()
        n_select = self._n_selected(len(clients))
        parallel = self.n_jobs not in (None, 1)
        # What each client's job receives. In parallel, CPU tensors go as numpy arrays made
        # once per fit: joblib memory-maps arrays over 1 MB, and writes each array object to
        # its memmap folder only once per ``Parallel`` context, so the client data are not
        # pickled again every round (torch tensors would be). Default Parallel settings on
        # purpose: other settings (e.g. mmap_mode) make joblib restart the reusable workers
        # whenever a call with different settings (sklearn's, the user's) comes in between.
        data = [(c.X_train.numpy(), c.y_train.numpy()) if parallel and c.X_train.device.type == "cpu"
                else (c.X_train, c.y_train) for c in clients]
        last_round = first_round + self.n_rounds
        rounds = _progress(range(len(self.history_), last_round), self.verbose, "federated rounds")
        with Parallel(n_jobs=self.n_jobs if parallel else 1) as pool:
            for t in rounds:
                if self._schedule.should_stop:
                    break
                start = time.perf_counter()
                selected, seeds = self._select_clients(t, len(clients), n_select)
                tasks = [(self._local_states.get(int(i)), *data[i], seed) for i, seed in zip(selected, seeds)]
                common = dict(lr=self._schedule.lr, n_epochs=self.local_epochs, n_threads=1 if parallel else None)
                if parallel:  # one job per worker, each running its share of the clients in turn
                    chunks = np.array_split(np.arange(len(tasks)), min(len(tasks), effective_n_jobs(self.n_jobs)))
                    replies = pool(delayed(_client_batch)(est, self._global, [tasks[k] for k in chunk],
                                                          **common) for chunk in chunks)
                    results = [reply for batch in replies for reply in batch]
                else:
                    results = _client_batch(est, self._global, tasks, **common)
                record = self._aggregate_round(t, selected, results, clients, kinds, aggregate)
                record["wall_time"] = time.perf_counter() - start
                self.history_.append(record)
                if self.verbose:
                    rounds.set_postfix(val_f1=f"{record['val_f1']:.3f}", loss=f"{record['train_loss']:.3f}")
                if fingerprint:
                    self._save_checkpoint(fingerprint)

    def _aggregate_round(self, t, selected, results, clients, kinds, aggregate):
        record = self._aggregate_train(t, selected, results, [len(c.y_train) for c in clients], kinds, aggregate)
        val_loss, val_f1 = self._evaluate_global(clients, kinds)
        return self._finish_round(record, val_loss, val_f1)

    def _aggregate_train(self, t, selected, results, n_train, kinds, aggregate):
        """Server step after local training (every backend): the failure policy, the
        aggregation rule on the replies (in ``selected`` order: sorted client ids), the
        clients' "local" arrays. ``results[k]`` is ``(params, loss, n_skipped)`` or the
        exception of client ``selected[k]``; ``n_train`` holds every client's training size.
        Returns the round's record without its validation entries."""
        ok = [(int(i), r) for i, r in zip(selected, results) if not isinstance(r, BaseException)]
        failed = [(int(i), r) for i, r in zip(selected, results) if isinstance(r, BaseException)]
        if failed and (self.on_client_error == "raise" or not ok):
            cid, error = failed[0]
            raise RuntimeError(f"client {cid} failed in round {t}: {error!r}") from error
        n_samples = [int(n_train[i]) for i, _ in ok]
        weights = client_weights(n_samples, self.weighting)
        params = [r[0] for _, r in ok]
        for (i, _), p in zip(ok, params):
            local = {name: p[name] for name, kind in kinds.items() if kind == "local"}
            if local:
                self._local_states[i] = local
        new_global = aggregate(params, weights, self._global, kinds)
        for name, kind in kinds.items():
            if kind == "local":
                new_global[name] = _pooled_local(self._local_states, name, n_train)
        self._global = new_global
        losses = np.array([r[1] for _, r in ok])
        return {
            "round": t,
            "clients": [i for i, _ in ok],
            "n_samples": n_samples,
            "failed_clients": [i for i, _ in failed],
            "train_loss": float(np.average(losses, weights=weights)) if np.isfinite(losses).all() else float("nan"),
            "val_loss": None,
            "val_f1": None,
            "orthonormality": {n: orthonormality_error(self._global[n]) for n, k in kinds.items() if k == "stiefel"},
            "lr": self._schedule.lr,
            "skipped_batches": int(sum(r[2] for _, r in ok)),
        }

    def _finish_round(self, record, val_loss, val_f1):
        """Server step after the global validation (every backend): schedule step, record."""
        record["val_loss"], record["val_f1"] = val_loss, val_f1
        self._schedule.step(val_f1, val_loss, self._global)
        return record

    def _evaluate_global(self, clients, kinds):
        est = self.global_estimator_
        est.set_parameters(self._global)
        # A client without local arrays yet (never selected) is validated with the pooled
        # ones of the global model, not with those of the client evaluated before it.
        pooled = {name: self._global[name] for name, kind in kinds.items() if kind == "local"}
        scores = []
        for c in clients:
            if len(c.y_val) == 0:
                continue
            if c.cid in self._local_states:
                est.set_parameters(self._local_states[c.cid])
            elif pooled:
                est.set_parameters(pooled)
            loss, f1 = evaluate(est.module_, c.X_val, c.y_val)
            scores.append((len(c.y_val), loss, f1))
        if any(kind == "local" for kind in kinds.values()):
            est.set_parameters(self._global)
        return _pool_scores(scores)

    # ------------------------------------------------------------------ predict
    def __sklearn_is_fitted__(self):
        return hasattr(self, "global_estimator_")

    def _seed(self):
        return self._seed_

    def predict(self, X):
        """Class labels from the global model."""
        check_is_fitted(self)
        return self.global_estimator_.predict(X)

    def predict_proba(self, X):
        """Class probabilities from the global model (columns ordered as ``classes_``)."""
        check_is_fitted(self)
        return self.global_estimator_.predict_proba(X)

    def decision_function(self, X):
        check_is_fitted(self)
        return self.global_estimator_.decision_function(X)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        return tags


def _client_batch(est, global_params, tasks, **kwargs):
    """:func:`_safe_local_update` for several clients ``(local_state, X, y, seed)`` in turn.

    Every client starts from the broadcast and its own seed, so running them in one job, on
    one module, gives the same replies as one job each, with fewer, larger parallel tasks.
    """
    return [_safe_local_update(est, global_params, local_state, X, y, seed=seed, **kwargs)
            for local_state, X, y, seed in tasks]


def _safe_local_update(est, global_params, local_state, X, y, **kwargs):
    """:func:`local_update`, returning the exception instead of raising (joblib-safe).

    ``X`` and ``y`` may come as numpy arrays (the parallel path).
    """
    try:
        return local_update(est, global_params, local_state, X, y, **kwargs)
    except Exception as error:  # noqa: BLE001 - reported per client, policy applied by the server
        return error


def _pool_scores(scores):
    """Global validation ``(loss, macro-F1)``: the clients' ``(n_val, loss, f1)`` (in client
    order, clients without a validation part left out) averaged with weights ``n_val``."""
    if not scores:
        return float("nan"), float("nan")
    n, loss, f1 = map(np.asarray, zip(*scores))
    return float(np.average(loss, weights=n)), float(np.average(f1, weights=n))


def _pooled_local(local_states, name, n_train):
    """Training-size-weighted mean of a client-local array, for the released global model."""
    owners = sorted(local_states)
    weights = np.array([n_train[i] for i in owners], dtype=np.float64)
    return sum(w * local_states[i][name] for w, i in zip(weights / weights.sum(), owners))
