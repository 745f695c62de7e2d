"""The FedSPDnet ClientApp: a site's :class:`~skfedspd.client.Site` behind Flower messages.

A site answers five messages; none of them carries its data out:

- ``query.setup``: with the run's seed, the site makes its stratified train/validation
  split (seeded by ``(seed, client id)``: :class:`~skfedspd.client.Site`) and replies its client
  id, the labels it holds (none when the set-up carries the agreed ``classes``: the site
  checks that its labels are among them, and fails otherwise), its sample shape, its
  training and validation sizes, the sum of its training sample weights (``weight``, when
  it has sample weights) and its input statistic (one scalar, e.g. the mean log-trace
  that ``scaling="auto"`` pools; weighted by the sample weights);
- ``train``: the local estimator's ``local_update`` (the one local-training routine,
  through :func:`skfedspd.client.client_update`) from the broadcast global parameters,
  with the learning rate and seed of the round, the site's sample weights (and, in DP
  mode, ``dp-noise-multiplier``, ``dp-clip-norm``, ``dp-sample-rate``: DP-SGD); replies the
  new parameters, its training size, the sum of its training sample weights (its
  aggregation weight, when it has sample weights), the mean training loss and the number
  of skipped batches;
- ``evaluate``: the global model's loss (weighted by the site's sample weights) and
  macro-F1 on the site's validation part (:func:`skfedspd.training.evaluate`) and the
  validation size;
- ``query.prior`` (a deployment's last message, ``batchnorm="domain"``): the additive
  statistics of the domain prior with the final weights it carries, on all the site's data
  (:meth:`~skfedspd.SPDnetClassifier.domain_prior_statistics`).

A site's sample weights (``sample_weight``, see :func:`load_site_from_node_config`) are its
training weights, times the local estimator's ``class_weight`` when that is a dict (label
→ weight; ``"balanced"`` needs every site's class counts and is refused). They never leave
the site; only their training sum does. The in-process simulation hands each site the
weights the local backend computes (its ``class_weight`` included).

The server checks every reply before it is used (:mod:`skfedspd.run`, :mod:`skfedspd.engine`).

Under secure aggregation (:mod:`skfedspd.flower.secure`) the train and validation replies
go out only as masked vectors of Flower's SecAgg+ (its ``secaggplus_mod`` handles the
protocol's train messages; a train message whose ``secure`` layout says ``"evaluate"``
carries the validation): the server sees only their sums. Client-local arrays then stay on
the site, in its Flower context state (kept by the SuperNode for the run); a site without
them yet (first round, restarted SuperNode) starts from the broadcast pooled ones.

When the set-up says ``"client_optimizer_state": "keep"``, a site keeps its Adam state
between its rounds in its Flower context state (tagged with the set-up's ``fit``, a token
new for every fit, so another fit on the same SuperNodes starts afresh); it is never sent.
A site without it (first round, restarted SuperNode) starts a fresh Adam.

Every message carries the run's set-up (a JSON string), so a site keeps no other state
between messages: the SuperNode may start a new ClientApp process for each one, and a
restarted SuperNode rejoins without losing anything but its optimizer state. Client-local
arrays (BatchNorm statistics of EEGNet) go back to the server with the parameters, which
returns them to that client only (under secure aggregation: see above).
"""

import importlib
import json
import threading
import zipfile

import numpy as np
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from .. import spec as _spec
from ..validation import check_sample_weight
from ..client import Site
from ..validation import check_count
from . import secure
from .records import LOCAL_STATE_KEY, from_array_record, to_array_record

__all__ = ["make_client_app", "load_site_from_node_config", "to_array_record", "from_array_record"]

# A site's Adam state and the fit it belongs to, in its Flower context state (one
# namespace: the two records need distinct keys).
OPTIMIZER_STATE_KEY, OPTIMIZER_FIT_KEY = "skfedspd.client-optimizer", "skfedspd.client-optimizer-fit"
# DP mode with domain batch norm: the site's released domain means, kept for the whole fit (released once)
DOMAIN_MEANS_KEY, DOMAIN_MEANS_FIT_KEY = "skfedspd.domain-means", "skfedspd.domain-means-fit"
DP_KEYS = ("noise_multiplier", "clip_norm", "sample_rate", "domain_noise_multiplier", "domain_clip")


def _site_file_arrays(path, n_samples, sample_weight, groups):
    """The optional ``sample_weight`` and ``groups`` arrays of a site's data file, checked
    (None where absent); a ValueError names the file and the problem."""
    try:
        sample_weight = check_sample_weight(sample_weight, n_samples, scalar=False)
        if groups is not None:
            groups = np.asarray(groups)
            if groups.shape != (n_samples,):
                raise ValueError(f"groups must be a 1-D array of {n_samples} labels (one per sample), got shape "
                                 f"{groups.shape}")
    except ValueError as error:
        raise ValueError(f"site data file {path}: {error}") from None
    return sample_weight, groups


def load_site_from_node_config(context):
    """A site's ``(client_id, X, y, sample_weight, groups)`` from its SuperNode's ``--node-config``.

    Keys: ``client-id`` (an int 0..N-1 written as an integer, unique in the federation: a
    string, a bool or ``1.7`` is refused), ``data-path`` (a ``.npz`` with arrays ``X`` and
    ``y`` and optionally ``sample_weight`` and ``groups``, read with ``allow_pickle=False``;
    any other file is a ValueError naming it, "not a valid .npz site file"), and optionally ``data-loader`` (``"module:function"``, called
    as ``function(data_path) -> (X, y)``, ``(X, y, sample_weight)`` or ``(X, y,
    sample_weight, groups)``, for any other format). ``sample_weight`` (None when absent)
    must be a 1-D array of one finite weight ≥ 0 per sample, not all 0; ``groups`` (None
    when absent: the site is one domain) labels each sample's subject or session, the
    domains of ``batchnorm="domain"`` (as ``fit(..., groups=...)`` with
    ``ClientPartition(groups_per_client=...)`` > 1 on the local backend), and must be a 1-D array of one label
    per sample. Otherwise a ValueError names the file and the problem (the error of a
    failed set-up reaches the server). The path is otherwise read by the site only; the
    server never sees it.

    Examples
    --------
    What a SuperNode started with ``--node-config 'client-id=0 data-path="site0.npz"'``
    reads:

    >>> import os
    >>> import tempfile
    >>> import numpy as np
    >>> from flwr.app import Context, RecordDict
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.flower.client import load_site_from_node_config
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = os.path.join(folder.name, "site0.npz")
    >>> X, y = make_spd_classification(n_matrices=10, n_channels=4, n_classes=2, seed=0)
    >>> np.savez(path, X=X, y=y)
    >>> context = Context(run_id=1, node_id=7, node_config={"client-id": 0, "data-path": path},
    ...                   state=RecordDict(), run_config={})
    >>> client_id, X_site, y_site, weights, groups = load_site_from_node_config(context)
    >>> client_id, X_site.shape, y_site.shape, weights, groups
    (0, (10, 4, 4), (10,), None, None)

    A file may carry the sites' sample weights:

    >>> np.savez(path, X=X, y=y, sample_weight=np.repeat([1.0, 2.0], 5))
    >>> load_site_from_node_config(context)[3]
    array([1., 1., 1., 1., 1., 2., 2., 2., 2., 2.])
    >>> np.savez(path, X=X, y=y, groups=np.repeat(["s1", "s2"], 5))  # two subjects: two domains
    >>> load_site_from_node_config(context)[4]
    array(['s1', 's1', 's1', 's1', 's1', 's2', 's2', 's2', 's2', 's2'], dtype='<U2')
    >>> np.savez(path, X=X, y=y, sample_weight=-np.ones(10))
    >>> load_site_from_node_config(context)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: site data file .../site0.npz: sample_weight contains negative weights (first at sample 0)
    >>> folder.cleanup()
    """
    config = context.node_config
    if "client-id" not in config or "data-path" not in config:
        raise ValueError("the SuperNode needs --node-config 'client-id=<int> data-path=\"<file>\"' "
                         f"(got keys {sorted(config)})")
    try:
        client_id = check_count(config["client-id"], "client-id", 0)
    except ValueError as error:  # a string or 1.7 is never read as a client
        raise ValueError(f"the SuperNode's --node-config: {error} (written as an integer: client-id=0)") from None
    path = str(config["data-path"])
    loader = config.get("data-loader")
    if loader:
        module, _, name = str(loader).partition(":")
        data = getattr(importlib.import_module(module), name)(path)
        if not isinstance(data, tuple) or len(data) not in (2, 3, 4):
            raise TypeError(f"data-loader {loader} must return (X, y), (X, y, sample_weight) or (X, y, sample_weight, "
                            f"groups), got {type(data).__name__} of length "
                            f"{len(data) if isinstance(data, tuple) else '?'}")
        X, y, sample_weight, groups = (*data, None, None)[:4]
    else:
        X, y, sample_weight, groups = _load_site_file(path)
    X = np.asarray(X)
    return (client_id, X, np.asarray(y), *_site_file_arrays(path, len(X), sample_weight, groups))


def _load_site_file(path):
    """``(X, y, sample_weight, groups)`` of a site's ``.npz`` file, read with
    ``allow_pickle=False`` (None for the optional arrays it lacks); anything that is no such
    file (another format, random bytes, object arrays, no ``X`` or ``y``) is a ValueError
    naming the file."""
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("it holds one array (a .npy file), not named arrays")
        with data:
            missing = [key for key in ("X", "y") if key not in data.files]
            if missing:
                raise ValueError(f"it has no {' and no '.join(missing)} array (it has {sorted(data.files)})")
            return (data["X"], data["y"], *(data[key] if key in data.files else None
                                            for key in ("sample_weight", "groups")))
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        # numpy's own message may advise allow_pickle=True: never the advice for a site file
        reason = ("it is no archive of plain arrays (numpy could only read it as a pickle, which a site file "
                  "never is)" if "pickle" in str(error) else str(error))
        raise ValueError(f"site data file {path} is not a valid .npz site file (arrays X and y, optionally "
                         f"sample_weight and groups, numeric or string, saved by numpy.savez): {reason}") from None


def make_client_app(load_site=load_site_from_node_config, estimator_factory=None):
    """The FedSPDnet ClientApp.

    Parameters
    ----------
    load_site : callable
        ``load_site(context) -> (client_id, X, y)``, ``(client_id, X, y, sample_weight)`` or
        ``(client_id, X, y, sample_weight, groups)``: the site's raw data (all of it; the
        train/validation split is made here), its sample weights (None: unweighted) and its
        samples' groups (None: the site is one domain of ``batchnorm="domain"``).
        Deployment: :func:`load_site_from_node_config`.
    estimator_factory : callable or None
        Returns the unfitted local estimator; None: rebuilt from the set-up's JSON spec
        (deployment). The in-process simulation passes a ``clone`` of the server's.

    Examples
    --------
    A ClientApp for sites whose data are in memory (here: virtual SuperNode ``i`` of a
    simulation holds site ``i``); :func:`skfedspd.flower.serve` shows a whole run.

    >>> from flwr.clientapp import ClientApp
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> from skfedspd.flower import make_client_app
    >>> X, y = make_spd_classification(n_matrices=30, n_channels=4, n_classes=2, seed=0)
    >>> sites = [(X[:15], y[:15]), (X[15:], y[15:])]
    >>> def load_site(context):
    ...     client_id = int(context.node_config["partition-id"])
    ...     return (client_id, *sites[client_id])
    >>> app = make_client_app(load_site, estimator_factory=SPDnetClassifier)
    >>> isinstance(app, ClientApp)
    True
    """
    app = ClientApp(mods=[secure.secure_mod])
    cache = {}
    site_data = {}
    lock = threading.Lock()

    def site(context, setup_json):
        key = (context.node_id, setup_json)
        with lock:
            if key not in cache:
                for old in [k for k in cache if k[0] == context.node_id]:
                    del cache[old]  # one prepared state per node: the current set-up
                # The set-up query and the rounds carry different set-ups (classes unknown, then
                # known): the site's data are read once per run, not once per set-up.
                data_key = (context.node_id, context.run_id)
                if data_key not in site_data:
                    for old in [k for k in site_data if k[0] == context.node_id]:
                        del site_data[old]
                    site_data[data_key] = load_site(context)
                data = site_data[data_key]
                if not isinstance(data, tuple) or len(data) not in (3, 4, 5):
                    raise TypeError("load_site must return (client_id, X, y), (client_id, X, y, sample_weight) or "
                                    "(client_id, X, y, sample_weight, groups)")
                cid, X, y, sample_weight, groups = (*data, None, None)[:5]
                setup = _spec.loads(setup_json)
                est = estimator_factory() if estimator_factory is not None else _spec.estimator_from_spec(
                    setup["estimator"])
                cache[key] = (cid, Site(cid, X, y, sample_weight, groups, setup, est))
            return cache[key]

    def check_client(message, cid):
        expected = message.content["config"]["client-id"]
        if expected != cid:
            raise RuntimeError(f"message for client {expected} reached the site of client {cid}")

    @app.query("setup")
    def setup(message, context):
        cid, prepared = site(context, message.content["config"]["setup"])
        reply = prepared.reply
        info = {"client-id": cid, "shape": reply.shape, "num-examples": reply.n_train, "n-val": reply.n_val}
        if reply.weight is not None:
            info["weight"] = reply.weight
        if reply.labels is not None:  # none with agreed classes: the site's own labels stay on it
            info["labels"] = _spec.dumps(reply.labels)
        if reply.statistic is not None:  # none in DP mode
            info["input-statistic"] = float(reply.statistic)
        return Message(RecordDict({"site": ConfigRecord(info)}), reply_to=message)

    def local_arrays(message, context, layout):
        """The site's client-local arrays: sent back by the server, or under secure
        aggregation kept in the site's context state (empty before its first round)."""
        if layout is None:
            return from_array_record(message.content["local"])
        record = context.state.array_records.get(LOCAL_STATE_KEY)
        return {} if record is None else from_array_record(record)

    def kept_optimizer_state(context, setup):
        """The site's Adam state from its previous round of this fit (``{}``: none yet),
        or None when the set-up resets the clients' optimizers every round."""
        if setup.get("client_optimizer_state", "reset") != "keep":
            return None
        tag = context.state.config_records.get(OPTIMIZER_FIT_KEY)
        if tag is None or tag["fit"] != setup["fit"]:
            return {}
        return from_array_record(context.state.array_records[OPTIMIZER_STATE_KEY])

    def keep_optimizer_state(context, setup, state):
        context.state.array_records[OPTIMIZER_STATE_KEY] = to_array_record(state)
        context.state.config_records[OPTIMIZER_FIT_KEY] = ConfigRecord({"fit": setup["fit"]})

    def released_domain_means(context, setup, prepared, global_params, dp):
        """The site's domain means of this fit: released at its first train message, then
        read back from the node's state (a restarted ClientApp spends nothing more)."""
        tag = context.state.config_records.get(DOMAIN_MEANS_FIT_KEY)
        kept = None
        if tag is not None and tag["fit"] == setup["fit"]:
            record = from_array_record(context.state.array_records[DOMAIN_MEANS_KEY])
            kept = [record[f"layer-{i}"] for i in range(len(record))]
        released = prepared.release_domain_means(global_params, dp, kept)
        if kept is None:
            context.state.array_records[DOMAIN_MEANS_KEY] = to_array_record(
                {f"layer-{i}": M for i, M in enumerate(released)})
            context.state.config_records[DOMAIN_MEANS_FIT_KEY] = ConfigRecord({"fit": setup["fit"]})

    @app.train()
    def train(message, context):
        config = message.content["config"]
        layout = json.loads(config["secure"]) if "secure" in config else None
        if layout is not None and layout["stage"] == "evaluate":  # SecAgg+ runs on train messages only
            _, loss, f1, n_val = validate(message, context, layout)
            return Message(secure.site_reply(secure.eval_vector(layout, loss, f1, n_val)), reply_to=message)
        cid, prepared = site(context, config["setup"])
        check_client(message, cid)
        local = local_arrays(message, context, layout) or None
        dp = {key: config[f"dp-{key.replace('_', '-')}"] for key in DP_KEYS if f"dp-{key.replace('_', '-')}" in config}
        setup = _spec.loads(config["setup"])
        global_params = from_array_record(message.content["arrays"])
        if "domain_noise_multiplier" in dp:
            released_domain_means(context, setup, prepared, global_params, dp)
        reply = prepared.train_update(global_params, local, seed=config["seed"],
                                      lr=config["lr"], n_epochs=config["local-epochs"], dp=dp or None,
                                      optimizer_state=kept_optimizer_state(context, setup))
        if reply.optimizer_state is not None:
            keep_optimizer_state(context, setup, reply.optimizer_state)
        if layout is not None:
            vector = secure.train_vector(layout, reply.params, reply.loss, reply.n_skipped, reply.n_examples,
                                         weight=reply.weight)
            context.state.array_records[LOCAL_STATE_KEY] = to_array_record(
                {name: reply.params[name] for name, _ in layout["local"]})
            return Message(secure.site_reply(vector), reply_to=message)
        metrics = MetricRecord({"client-id": cid, "num-examples": reply.n_examples, "train-loss": reply.loss,
                                "skipped-batches": reply.n_skipped,
                                **({} if reply.weight is None else {"weight": reply.weight})})
        return Message(RecordDict({"arrays": to_array_record(reply.params), "metrics": metrics}), reply_to=message)

    def validate(message, context, layout=None):
        """``(client id, loss, macro-F1, n_val)`` of the broadcast model on the site's validation part."""
        cid, prepared = site(context, message.content["config"]["setup"])
        check_client(message, cid)
        reply = prepared.validate(from_array_record(message.content["arrays"]), local_arrays(message, context, layout))
        return cid, reply.loss, reply.f1, reply.n_examples

    @app.query("prior")
    def prior(message, context):
        """The site's additive statistics of the final model's domain prior
        (:func:`skfedspd.flower.server.set_domain_prior_from_sites`)."""
        cid, prepared = site(context, message.content["config"]["setup"])
        check_client(message, cid)
        log_sums, count = prepared.prior_statistics(from_array_record(message.content["arrays"]))
        record = {f"log-sum.{i}": S for i, S in enumerate(log_sums)} | {"count": np.asarray(count)}
        return Message(RecordDict({"prior": to_array_record(record)}), reply_to=message)

    @app.evaluate()
    def evaluate(message, context):
        cid, loss, f1, n_val = validate(message, context)
        metrics = MetricRecord({"client-id": cid, "num-examples": n_val, "val-loss": loss, "val-f1": f1})
        return Message(RecordDict({"metrics": metrics}), reply_to=message)

    return app
