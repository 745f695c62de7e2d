"""The ``"local"`` transport of :class:`~skfedspd.FederatedSPDnetClassifier`: :func:`fit_local`,
the sites in this process (serially or on joblib processes), with optional checkpoints.
"""

import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings

import numpy as np
import torch
from joblib import Parallel, delayed, effective_n_jobs

from .aggregation import rule_name
from .backends import LocalBackend
from .batchnorm import DomainBatch
from .client import Site, client_update
from .messages import EvalReply
from .persistence import load_bundle, save_bundle
from .run import domain_prior_from_data, given_estimator, init_model
from .training import torch_threads

__all__ = ["fit_local", "site_estimator", "CHECKPOINT_KIND"]

CHECKPOINT_KIND = "federated-checkpoint"


def site_estimator(run):
    """The shared unfitted estimator of the sites in this process (without ``class_weight``,
    which the training weights hold).

    Examples
    --------
    >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
    >>> from skfedspd.local import site_estimator
    >>> from skfedspd.run import FederatedRun
    >>> run = FederatedRun(FederatedSPDnetClassifier(SPDnetClassifier(class_weight="balanced")))
    >>> site_estimator(run).class_weight is None
    True
    """
    return run.estimator.without_class_weight()


def fit_local(run, data):
    """The ``"local"`` transport: the clients of ``data`` as sites in this process.

    Parameters
    ----------
    run : FederatedRun
    data : ClientData

    Returns
    -------
    FederatedResult

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd import FederatedSPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.local import fit_local
    >>> from skfedspd.run import ClientData, FederatedRun
    >>> X, y = make_spd_classification(n_matrices=30, n_channels=4, n_classes=2, seed=1)
    >>> run = FederatedRun(FederatedSPDnetClassifier(n_rounds=1, random_state=0), validation_fraction=0.0)
    >>> result = fit_local(run, ClientData(X, y, np.array_split(np.arange(30), 2), client_groups=[None, None]))
    >>> result.engine.n_clients, len(result.engine.history)
    (2, 1)
    """
    fed = run.fed
    est = site_estimator(run)
    sites = [Site(cid, *data.site_arrays(cid), run.site_setup(), est) for cid in range(len(data.indices))]
    engine = run.start([site.reply for site in sites])
    setup = run.site_setup()
    for site in sites:
        site.prepare(setup)
    run.release_domain_means(sites)
    clients = [(s.X_train, s.y_train, s.X_val, s.y_val, s.w_train, s.w_val) for s in sites]
    first_round = engine.next_round
    options = run.backend if isinstance(run.backend, LocalBackend) else LocalBackend()
    path = None if options.checkpoint_path is None else os.fspath(options.checkpoint_path)
    fingerprint = _fingerprint(fed, clients, run.seed, first_round) if path else None
    if fingerprint:
        _resume_from_checkpoint(path, fingerprint, engine)
        _check_client_optimizer_states(path, engine, est)
    checkpoint = (path, fingerprint) if fingerprint else None
    _run_rounds(fed, est, engine, clients, first_round + fed.n_rounds, checkpoint, options.n_jobs)
    return run.finish(data.client_source, data.client_groups, prior=domain_prior_from_data(data))


def _run_rounds(fed, est, engine, clients, last_round, checkpoint, n_jobs):
    """The rounds, serial or on ``n_jobs`` processes, checkpointed after each when asked."""
    rounds = range(engine.next_round, last_round)
    if fed.verbose:
        from tqdm.auto import tqdm

        rounds = tqdm(rounds, desc="federated rounds", leave=False)

    def close(record, start, evaluations):
        record = engine.finish_round(record, evaluations, wall_time=time.perf_counter() - start)
        if fed.verbose:
            rounds.set_postfix(val_f1=f"{record['val_f1']:.3f}", loss=f"{record['train_loss']:.3f}")
        if checkpoint:
            save_bundle(checkpoint[0], *engine.state_dict(), kind=CHECKPOINT_KIND, fingerprint=checkpoint[1])

    if n_jobs in (None, 1):
        for t in rounds:
            if engine.should_stop:
                break
            start = time.perf_counter()
            selected, seeds = engine.select(t)
            replies = _client_batch(est, engine.global_params, _train_tasks(fed, engine, clients, selected, seeds),
                                    lr=engine.lr, n_epochs=fed.local_epochs)
            record = engine.aggregate(t, selected, replies)
            close(record, start, _evaluate_clients(est, engine, clients))
    else:
        _run_parallel_rounds(fed, est, engine, clients, rounds, close, n_jobs)


def _run_parallel_rounds(fed, est, engine, clients, rounds, close, n_jobs):
    """The rounds on ``n_jobs`` processes, bit for bit the serial loop's: each round's training in
    equal shares, and round ``t``'s validation riding with round ``t + 1``'s training
    (retrained when the validation changes the learning rate).
    """
    n_processes = effective_n_jobs(n_jobs)

    def run(pool, shared, train, seeds, validate, lr):
        """Train replies of clients ``train`` and, if ``validate``, every client's validation."""
        shares = np.array_split(np.arange(len(train)), min(n_processes, max(len(train), 1)))
        kwargs = dict(lr=lr, n_epochs=fed.local_epochs, n_threads=1)
        remote = pool(delayed(_client_batch)(est, engine.global_params,
                                             _train_tasks(fed, engine, shared, [train[k] for k in share],
                                                          [seeds[k] for k in share]), **kwargs)
                      for share in shares[:-1])  # a generator: dispatched now
        own = _client_batch(est, engine.global_params, _train_tasks(fed, engine, clients,
                                                                    [train[k] for k in shares[-1]],
                                                                    [seeds[k] for k in shares[-1]]), **kwargs)
        evaluations = _evaluate_clients(est, engine, clients, n_threads=1) if validate else []
        return [r for batch in [*remote, own] for r in batch], evaluations

    with _SharedClients(clients) as shared, Parallel(n_jobs=n_jobs, return_as="generator") as pool:
        pending = None  # (record, start) of the round whose validation rides with the next dispatch
        for t in rounds:
            if pending is None and engine.should_stop:
                break
            start = time.perf_counter()
            (selected, seeds), lr = engine.select(t), engine.lr
            replies, evaluations = run(pool, shared, selected, seeds, pending is not None, lr)
            if pending:
                close(*pending, evaluations)
                pending = None
                if engine.should_stop:
                    break
                if engine.lr != lr:
                    replies, _ = run(pool, shared, selected, seeds, False, engine.lr)
            pending = engine.aggregate(t, selected, replies), start
        if pending:
            close(*pending, _evaluate_clients(est, engine, clients, n_threads=1))


def _train_tasks(fed, engine, clients, ids, seeds):
    """Clients ``ids``' training arguments."""
    keep = fed.client_optimizer_state == "keep"
    return [(engine.local_state(i) or None, clients[i][0], clients[i][1], clients[i][4], seed, engine.dp_settings(i),
             engine.client_optimizer_state(i) if keep else None)
            for i, seed in zip(ids, seeds)]


def _client_batch(est, global_params, tasks, **kwargs):
    """Several clients' :class:`~skfedspd.messages.TrainReply` (or exception) in turn."""
    replies = []
    for local_state, X, y, w, seed, dp, optimizer_state in tasks:
        try:
            replies.append(client_update(est, global_params, local_state, X, y, w, seed, dp, optimizer_state,
                                         **kwargs))
        except Exception as error:  # noqa: BLE001 - reported per client, policy applied by the server
            replies.append(error)
    return replies


def _evaluate_clients(est, engine, clients, n_threads=None):
    """Each evaluated client's :class:`EvalReply` (or exception) of the new global model."""
    replies, global_loaded = [], False
    with torch_threads(n_threads):
        for cid in engine.evaluated_clients():
            _, _, X_val, y_val, _, w_val = clients[cid]
            try:
                own = bool(engine.local_state(cid))
                if own or not global_loaded:
                    global_loaded = False
                    est.set_parameters(engine.evaluation_params(cid))
                    global_loaded = not own
                loss, f1 = est.validation_scores(X_val, y_val, w_val)
                replies.append(EvalReply(loss, f1, len(y_val)))
            except Exception as error:  # noqa: BLE001 - reported per client, policy applied by the server
                replies.append(error)
    return replies


def _tensors(arrays):
    """The tensors of one client's arrays."""
    for a in arrays:
        if isinstance(a, DomainBatch):
            yield from (a.X, a.domains)
        elif isinstance(a, torch.Tensor):
            yield a


class _SharedClients:
    """The clients' arrays as the workers get them: each large CPU tensor memory-mapped once per
    fit (copy-on-write), removed after it.
    """

    def __init__(self, clients):
        self.clients, self.shared = clients, {}

    def __enter__(self):
        size = sum(a.numel() * a.element_size() for arrays in self.clients for a in _tensors(arrays))
        shm = "/dev/shm"  # memory-backed, as joblib prefers it, when it has room
        use_shm = os.path.isdir(shm) and shutil.disk_usage(shm).free > 2 * size
        self.folder = tempfile.mkdtemp(prefix="skfedspd-", dir=shm if use_shm else None)
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.folder, ignore_errors=True)

    def __getitem__(self, i):
        if i not in self.shared:
            self.shared[i] = tuple(self._share(a, f"{i}-{j}") for j, a in enumerate(self.clients[i]))
        return self.shared[i]

    def _share(self, a, name):
        if isinstance(a, DomainBatch):  # its matrices as any tensor; its domain codes go with the job
            return a.with_inputs(self._share(a.X, name))
        if not isinstance(a, torch.Tensor) or a.device.type != "cpu":
            return a
        a = a.numpy()
        if a.nbytes <= 2**20:  # pickled with the job, as joblib does
            return a
        path = os.path.join(self.folder, f"{name}.npy")
        np.save(path, a)
        return np.load(path, mmap_mode="c")


# ---------------------------------------------------------------------- checkpoints
def _fingerprint(fed, clients, seed, first_round):
    """SHA-256 of what determines the run (parameters, seed, data, first round)."""
    params = {k: v for k, v in fed.get_params(deep=False).items()
              if k not in ("estimator", "verbose", "backend", "random_state", "warm_start", "init")}
    params["aggregation"] = rule_name(fed.aggregation)
    est = given_estimator(fed)
    params["estimator"] = {"class": f"{type(est).__module__}.{type(est).__qualname__}",
                           "params": est.get_params(deep=False)}
    data = hashlib.sha256()
    init = init_model(fed)
    for a in ([] if init is None else init.get_parameters().values()):  # the starting weights
        data.update(np.ascontiguousarray(a).tobytes())
    for arrays in clients:
        for a in _tensors(arrays):
            a = a.detach().cpu().numpy()
            data.update(f"{a.dtype}{a.shape}".encode())
            data.update(np.ascontiguousarray(a).tobytes())
    text = json.dumps({"params": params, "seed": int(seed), "first_round": int(first_round),
                       "data": data.hexdigest()}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_client_optimizer_states(path, engine, est):
    """The clients' Adam states a checkpoint brought must fit the model's parameters."""
    for cid, state in engine.client_optimizer_states.items():
        try:
            est.check_optimizer_state(state)
        except ValueError as error:
            raise ValueError(f"checkpoint {path} does not fit this run: client {cid}'s {error}") from None


def _resume_from_checkpoint(path, fingerprint, engine):
    """Load a checkpoint of this run into ``engine``; replace one of another configuration."""
    if not os.path.exists(path):
        return
    try:
        arrays, meta = load_bundle(path, kind=CHECKPOINT_KIND, fingerprint=fingerprint)
    except ValueError:
        # Not this run's. A valid checkpoint of another run is replaced; anything else
        # (truncated, corrupt, not a skfedspd file) raises, naming the path, from here.
        load_bundle(path, kind=CHECKPOINT_KIND)
        warnings.warn(f"checkpoint {path} is of another configuration or data: starting from round "
                      f"{engine.next_round} and overwriting it", UserWarning, stacklevel=4)
        return
    try:
        engine.load_state_dict(arrays, meta)
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"checkpoint {path} does not fit this run: {error}") from None
