"""Secure aggregation for FedSPDnet on Flower: Flower's SecAgg+ carries the weighted sums.

``FederatedSPDnetClassifier(backend=FlowerBackend(secure_aggregation=True))`` (and
:func:`skfedspd.flower.fit_federated` with it) replace the clear train and validation
replies of every round by two runs of Flower's SecAgg+ protocol (Bell et al., CCS 2020):

- **train**: each selected site sends, masked, the vector ``r_i·θ_i / B`` for every
  aggregated array (``r_i = n_i / n_max``; with sample weights ``r_i = w_i / w_max``, ``w_i``
  the sum of the site's training sample weights and ``w_max`` the largest the round's sites
  declared at set-up; 1 under ``weighting="uniform"``), ``(n_i / n_max)·λ_i / LOCAL_RANGE``
  for every client-local array ``λ_i`` (FedBN statistics: the site keeps its own in its
  Flower context state, and only this sum, the training-size weighted pool the released
  model carries, leaves it), ``r_i``, ``n_i / n_max``, ``r_i·loss_i / L``, a NaN-loss flag,
  ``skipped_i / S`` and, with sample weights, ``w_i / w_max`` (the round's total weight);
- **validation**: each site with validation data sends ``[m_i, m_i·loss_i / L,
  m_i·F1_i]`` with ``m_i = n_val_i / n_val_max``.

The server obtains only the sums over the sites that completed the protocol; ProjAvg and
RLAvg are functions of the weighted sum alone (:func:`~skfedspd.aggregation.projavg_from_sum`,
:func:`~skfedspd.aggregation.rlavg_from_sum`), so they are computed exactly from it, and
the engine checks the totals (:meth:`skfedspd.engine.FederatedEngine.aggregate_from_sum`,
:meth:`~skfedspd.engine.FederatedEngine.finish_round_from_sum`).

The protocol is Flower's own: the server stages are :class:`flwr.server.workflow.SecAggPlusWorkflow`'s
(key advertisement, encrypted Shamir shares of the mask seed and of the pairwise-mask key,
masked-vector collection, unmasking with reconstruction of dropped sites' pairwise masks),
run on our Grid by :class:`SecureSum`; the sites run :func:`flwr.client.mod.secaggplus_mod`
unchanged (:func:`secure_mod` only routes the protocol's messages to it). Nothing here is
cryptography of our own.

Both are Flower's public API; the legacy reply they mask (``fitres_to_recorddict``) and the
workflow's state keys are not, and come from :mod:`skfedspd.flower._internals`.

Quantization. Every entry is scaled into ``[-1, 1]`` (``clipping_range = 1``) by a bound
``B``: a Stiefel array has orthonormal columns, so its entries lie in ``[-1, 1]`` (``B =
1``); Euclidean arrays (the head) have no such bound and must stay within
``±EUCLIDEAN_RANGE``, client-local arrays (BatchNorm statistics) within
``±LOCAL_RANGE``, and counts (BatchNorm's ``num_batches_tracked``, which only grows) within
what they can reach by the round (``SecureSPDnetStrategy.local_bounds``); losses within ``LOSS_RANGE``. A site whose values leave these ranges
fails (its reply is an error: the server sees a dropped site, never a clipped value).
Flower quantizes to ``2**QUANTIZATION_BITS`` levels (24 bits) with masks modulo ``2**32``:
one quantization step is ``2B / 2**24`` (1.2e-7 for Stiefel entries, 1.9e-6 for the head),
enough for one aggregation to 1e-5 but not for a multi-round run, where local Adam's first
step (``lr·sign(g)`` for every weight) turns any difference into an ``lr``-sized one
wherever a gradient is near 0 (measured: 7.7e-3 after 5 rounds with one 24-bit limb). So
each entry travels as two limbs (:func:`split_limbs`): its value on the quantization grid
(quantized exactly) and the residual in grid units: the sum is exact to ``2B·2**-46``
(1.4e-14 for Stiefel entries, 9e-10 for local arrays), float64-level. Sum of ``M`` sites: ``M (2**24 + 1) < 2**32``,
so at most 255 sites per round.

Dropouts: every selected site is every other's neighbour (``num_shares = M``), and a secret
is recovered from ``round(RECONSTRUCTION_THRESHOLD · M)`` shares (at least 2), so a round
survives ``M − threshold`` dropouts (1 of 3 or 4 sites, 2 of 5). See ``docs/guide/privacy.md``
for the threat model.
"""

import json
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    log,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import LegacyContext
from flwr.server.workflow import SecAggPlusWorkflow

from ..aggregation import check_secure_rule
from ..engine import within_declared_weight
from ._internals import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, RECORD_KEY_CONFIGS, WorkflowKey, fitres_to_recorddict
from .strategy import SPDnetStrategy

__all__ = ["SecureSum", "SecureSPDnetStrategy", "secure_mod", "train_vector", "eval_vector", "split_limbs",
           "join_limbs",
           "QUANTIZATION_BITS", "MODULUS", "EUCLIDEAN_RANGE", "LOCAL_RANGE", "LOSS_RANGE", "RECONSTRUCTION_THRESHOLD"]

QUANTIZATION_BITS = 24
MODULUS = 2**32
EUCLIDEAN_RANGE = 16.0
LOCAL_RANGE = 2.0**16  # BatchNorm running statistics: wide, still ~1e-9 with two limbs (counts: local_bounds)
LOSS_RANGE = 100.0
RECONSTRUCTION_THRESHOLD = 2 / 3
MAX_SITES = MODULUS // (2**QUANTIZATION_BITS + 1)
CONFIG_KEY = "secure"

_INFO, _WARNING = 20, 30


# ---------------------------------------------------------------------- site side
def secure_mod(message, context, call_next):
    """ClientApp mod: SecAgg+ messages (train messages with the protocol's record) go
    through Flower's ``secaggplus_mod``, every other message straight to the app.

    Examples
    --------
    :func:`~skfedspd.flower.make_client_app` installs it (``ClientApp(mods=[secure_mod])``);
    a message that is not part of SecAgg+ (here a stand-in set-up query) reaches the app:

    >>> from types import SimpleNamespace
    >>> from skfedspd.flower.secure import secure_mod
    >>> query = SimpleNamespace(metadata=SimpleNamespace(message_type="query.setup"))
    >>> secure_mod(query, None, lambda message, context: "answered by the app")
    'answered by the app'
    """
    if message.metadata.message_type == MessageType.TRAIN and RECORD_KEY_CONFIGS in message.content.config_records:
        return secaggplus_mod(message, context, call_next)
    return call_next(message, context)


def _scaled(value, bound, what):
    """``value / bound``; ValueError if a value is not finite or leaves ``±bound`` (the
    message names no value: a ClientApp error's text reaches the server in clear)."""
    value = np.asarray(value, dtype=np.float64)
    if not np.isfinite(value).all():
        raise ValueError(f"{what} is not finite: it cannot enter the secure sum")
    if value.size and np.max(np.abs(value)) > bound:
        raise ValueError(f"{what} leaves the secure-aggregation range ±{bound:g}")
    return value / bound


def train_vector(layout, params, loss, n_skipped, n_examples, weight=None):
    """What a site puts into the train secure sum (entries in [-1, 1]; see the module
    docstring). ``layout`` is the server's (``config["secure"]``, decoded); ``weight``: the
    sum of the site's training sample weights (None: it has none, it weighs ``n_examples``).

    Examples
    --------
    A site with 30 of the round's largest 40 training samples (``r = 0.75``):

    >>> import numpy as np
    >>> from skfedspd.flower.secure import train_vector
    >>> layout = {"arrays": [["W", 1.0], ["b", 16.0]], "weighting": "n_samples", "n-max": 40,
    ...           "skipped-range": 80.0}
    >>> params = {"W": np.eye(3)[:, :2], "b": np.array([8.0, -4.0])}
    >>> W, b, scalars = train_vector(layout, params, loss=0.5, n_skipped=0, n_examples=30)
    >>> b, scalars  # r·b / 16; [r, n / n_max, r·loss / 100, NaN-loss flag, skipped / 80]
    (array([ 0.375 , -0.1875]), array([0.75  , 0.75  , 0.00375, 0.     , 0.     ]))
    >>> train_vector(layout, {"W": 2 * params["W"], "b": params["b"]}, 0.5, 0, 30)
    Traceback (most recent call last):
    ...
    ValueError: array 'W' leaves the secure-aggregation range ±1

    With sample weights (the round's largest declared sum ``weight-max``), ``r = w / w_max``
    and ``w / w_max`` joins the scalars:

    >>> W, b, scalars = train_vector(dict(layout, **{"weight-max": 60.0}), params, 0.5, 0, 30, weight=15.0)
    >>> b, scalars
    (array([ 0.125 , -0.0625]), array([0.25  , 0.75  , 0.00125, 0.    , 0.    , 0.25  ]))
    """
    n_max = layout["n-max"]
    if not 1 <= n_examples <= n_max:
        raise ValueError(f"num-examples outside [1, {n_max}]")
    weight_max = layout.get("weight-max")  # a run with sample weights
    weight = n_examples if weight is None else weight
    if weight_max is not None and not (weight > 0 and within_declared_weight(weight, weight_max)):
        raise ValueError(f"client weight outside (0, {weight_max:g}]")
    share = n_examples / n_max if weight_max is None else min(weight / weight_max, 1.0)
    r = share if layout["weighting"] == "n_samples" else 1.0
    arrays = [r * _scaled(params[name], bound, f"array {name!r}") for name, bound in layout["arrays"]]
    # client-local arrays: pooled by training size whatever the weighting, as in plain mode
    arrays += [n_examples / n_max * _scaled(params[name], bound, f"local array {name!r}")
               for name, bound in layout.get("local", [])]
    arrays = [np.atleast_1d(a) for a in arrays]  # Flower's masking mishandles 0-d arrays (batch counts)
    nan_loss = not np.isfinite(loss)
    scalars = [r, n_examples / n_max, 0.0 if nan_loss else r * _scaled(loss, LOSS_RANGE, "train-loss"),
               float(nan_loss), _scaled(n_skipped, layout["skipped-range"], "skipped-batches")]
    scalars += [] if weight_max is None else [share]
    return arrays + [np.asarray(scalars, dtype=np.float64)]


def eval_vector(layout, loss, f1, n_examples):
    """What a site puts into the validation secure sum.

    Examples
    --------
    ``[m, m·loss / 100, m·F1]`` with ``m = n_val / n_max``:

    >>> from skfedspd.flower.secure import eval_vector
    >>> eval_vector({"n-max": 10}, loss=0.5, f1=0.8, n_examples=5)
    [array([0.5   , 0.0025, 0.4   ])]
    """
    n_max = layout["n-max"]
    if not 1 <= n_examples <= n_max:
        raise ValueError(f"num-examples outside [1, {n_max}]")
    m = n_examples / n_max
    return [np.asarray([m, m * _scaled(loss, LOSS_RANGE, "val-loss"), m * _scaled(f1, 1.0, "val-f1")])]


_LEVEL = 2.0 ** (QUANTIZATION_BITS - 1)  # Flower's quantization step on [-1, 1] is 1 / _LEVEL


def split_limbs(vector):
    """Each array ``x`` (entries in [-1, 1]) as two arrays in [-1, 1]: ``hi``, ``x`` rounded
    to Flower's quantization grid (quantized exactly), and ``lo``, the rounding residual in
    grid units (quantized with error ≤ 1 / _LEVEL). ``x = hi + lo / _LEVEL`` up to
    ``_LEVEL**-2`` (1.4e-14 with 24 bits): the secure sum keeps float64-level precision.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.flower.secure import join_limbs, split_limbs
    >>> x = np.random.default_rng(0).uniform(-1, 1, 5)
    >>> hi, lo = split_limbs([x])
    >>> bool(np.array_equal(hi * 2**23, np.round(hi * 2**23)))  # on the 24-bit grid
    True
    >>> float(np.abs(x - hi).max()) > 1e-8, float(np.abs(x - join_limbs([hi, lo])[0]).max()) < 1e-15
    (True, True)
    """
    out = []
    for x in vector:
        hi = np.round(np.asarray(x, dtype=np.float64) * _LEVEL) / _LEVEL
        out += [hi, (x - hi) * _LEVEL]
    return out


def join_limbs(arrays):
    """Inverse of :func:`split_limbs` (on sums of limbs too: the map is linear).

    Examples
    --------
    The sum of two sites' limbs gives back the sum of their values:

    >>> import numpy as np
    >>> from skfedspd.flower.secure import join_limbs, split_limbs
    >>> a, b = np.array([0.1, -0.7]), np.array([0.3, 0.2])
    >>> summed = [u + v for u, v in zip(split_limbs([a]), split_limbs([b]))]
    >>> bool(np.allclose(join_limbs(summed)[0], a + b, rtol=0, atol=1e-15))
    True
    """
    return [hi + lo / _LEVEL for hi, lo in zip(arrays[0::2], arrays[1::2])]


def site_reply(vector):
    """The reply that ``secaggplus_mod`` masks: the vector's limbs (:func:`split_limbs`) in
    a legacy FitRes whose weight is 1 (the weighting is inside the vector, so the clear
    weight reveals nothing)."""
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(split_limbs(vector)), num_examples=1, metrics={})
    return fitres_to_recorddict(fitres, keep_input=True)


# ---------------------------------------------------------------------- server side
@dataclass
class _Proxy:
    node_id: int


class _Capture:
    """The legacy strategy that SecAggPlusWorkflow calls: it selects the given nodes and
    keeps the unmasked aggregate with the nodes it covers."""

    def __init__(self, nodes):
        self.nodes = list(nodes)
        self.result = None

    def configure_fit(self, server_round, parameters, client_manager):
        return [(_Proxy(node), FitIns(Parameters(tensors=[], tensor_type="numpy.ndarray"), {})) for node in self.nodes]

    def aggregate_fit(self, server_round, results, failures):
        if results:
            self.result = ([proxy.node_id for proxy, _ in results], parameters_to_ndarrays(results[0][1].parameters))
        return None, {}


class _Workflow(SecAggPlusWorkflow):
    """SecAgg+ whose masked-vector stage sends our own message contents."""

    def __init__(self, contents, **kwargs):
        super().__init__(**kwargs)
        self.contents = contents

    def setup_stage(self, grid, context, state):
        ok = super().setup_stage(grid, context, state)
        # The workflow's state (internal): its public input, a legacy FitIns, cannot carry a RecordDict.
        state.nid_to_fitins = {node: self.contents[node] for node in state.nid_to_fitins}
        return ok


class _RecordingGrid:
    """The Grid, keeping the error of each node that answered with one."""

    def __init__(self, grid):
        self.grid = grid
        self.errors = {}

    def send_and_receive(self, messages, *, timeout=None):
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        for message in replies:
            if message.has_error():
                self.errors[message.metadata.src_node_id] = message.error.reason
        return replies


class SecureSum:
    """One secure sum over Flower nodes by Flower's SecAgg+ workflow.

    Parameters
    ----------
    reconstruction_threshold : float
        Fraction of the ``M`` shares needed to recover a site's secret (at least 2).
    timeout : float or None
        Seconds to wait for each stage's replies.

    Examples
    --------
    A secure sum of one vector per site over three virtual SuperNodes: each site's
    ClientApp runs :func:`secure_mod`, and its train handler returns the vector it adds
    (``site_reply``); the server learns only the sum.

    >>> import numpy as np
    >>> from flwr.app import ConfigRecord, Message, RecordDict
    >>> from flwr.clientapp import ClientApp
    >>> from flwr.serverapp import ServerApp
    >>> from skfedspd.flower import run_inprocess_simulation
    >>> from skfedspd.flower.secure import SecureSum, secure_mod, site_reply
    >>> from skfedspd.flower.server import connect_sites
    >>> from skfedspd.flower.simulation import quiet_flower_logs
    >>> site_app, server_app, sums = ClientApp(mods=[secure_mod]), ServerApp(), []
    >>> @site_app.train()
    ... def masked(message, context):
    ...     value = 0.1 * (context.node_config["partition-id"] + 1)  # 0.1, 0.2, 0.3
    ...     return Message(site_reply([np.full(2, value)]), reply_to=message)
    >>> @server_app.main()
    ... def secure_round(grid, context):
    ...     contents = {node: RecordDict({"config": ConfigRecord({})})
    ...                 for node in connect_sites(grid, 3, timeout=30.0)}
    ...     sums.append(SecureSum()(grid, contents, round_id=0))
    >>> with quiet_flower_logs():
    ...     _ = run_inprocess_simulation(server_app, site_app, num_supernodes=3)
    >>> nodes, errors, (total,) = sums[0]
    >>> len(nodes), errors, np.round(total, 12)
    (3, {}, array([0.6, 0.6]))
    >>> SecureSum().threshold(3), SecureSum().threshold(5)  # shares needed to unmask
    (2, 3)
    """

    def __init__(self, reconstruction_threshold=RECONSTRUCTION_THRESHOLD, timeout=None):
        self.reconstruction_threshold = reconstruction_threshold
        self.timeout = timeout

    def threshold(self, n_sites):
        """Shares needed to recover a secret when ``n_sites`` take part."""
        return max(2, round(self.reconstruction_threshold * n_sites))

    def __call__(self, grid, contents, round_id):
        """Send ``contents[node]`` (a RecordDict) to each node as the masked-vector
        stage's message; return ``(nodes summed, {node: error}, sum of their vectors)``.
        Raises RuntimeError when the protocol halts (fewer than the threshold left)."""
        nodes = sorted(contents)
        capture = _Capture(nodes)
        context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                                strategy=capture)
        context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: int(round_id)})
        context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
        workflow = _Workflow(contents, num_shares=1.0, reconstruction_threshold=float(self.reconstruction_threshold),
                             max_weight=1.0, clipping_range=1.0, quantization_range=2**QUANTIZATION_BITS,
                             modulus_range=MODULUS, timeout=self.timeout)
        recording = _RecordingGrid(grid)
        workflow(recording, context)
        if capture.result is None:
            raise RuntimeError(f"secure aggregation halted: fewer than {self.threshold(len(nodes))} of the "
                               f"{len(nodes)} sites completed SecAgg+ (errors: {recording.errors})")
        summed_nodes, mean = capture.result
        # The workflow divides by the sum of the (clear, unit) weights: undo it.
        summed = [np.asarray(a, dtype=np.float64) * len(summed_nodes) for a in mean]
        return sorted(summed_nodes), recording.errors, join_limbs(summed)


class SecureSPDnetStrategy(SPDnetStrategy):
    """:class:`~skfedspd.flower.strategy.SPDnetStrategy` whose train and validation replies
    arrive only as SecAgg+ sums (see the module docstring). Each stage runs its protocol
    inside ``configure_*`` (on the Grid it is given) and sends no other message;
    ``aggregate_*`` hand the sums to the engine.

    Parameters
    ----------
    secure_sum : SecureSum
    **kwargs
        As for :class:`SPDnetStrategy`.

    Examples
    --------
    ``FlowerBackend(secure_aggregation=True)`` runs the Flower rounds with this strategy; ProjAvg of the
    sums matches the clear aggregation to float64 rounding:

    >>> import numpy as np
    >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=36, n_channels=4, n_classes=2, seed=0)
    >>> subjects = np.repeat([1, 2, 3], 12)
    >>> from skfedspd.backends import FlowerBackend
    >>> secure = FederatedSPDnetClassifier(SPDnetClassifier(), n_rounds=1, backend=FlowerBackend(secure_aggregation=True),
    ...                                    random_state=0).fit(X, y, groups=subjects)
    >>> clear = FederatedSPDnetClassifier(SPDnetClassifier(), n_rounds=1, random_state=0).fit(X, y, groups=subjects)
    >>> bool(np.allclose(secure.predict_proba(X), clear.predict_proba(X), rtol=0, atol=1e-9))
    True
    >>> secure.history_[0]["n_samples"]  # the server saw totals only: 3 sites of 12 (too few to hold any out)
    [36]
    """

    def __init__(self, engine, *, secure_sum=None, **kwargs):
        check_secure_engine(engine)
        super().__init__(engine, **kwargs)
        self.secure_sum = secure_sum if secure_sum is not None else SecureSum()
        self.bounds = [(name, 1.0 if kind == "stiefel" else EUCLIDEAN_RANGE)
                       for name, kind in engine.kinds.items() if kind != "local"]
        self.local_names = [name for name, kind in engine.kinds.items() if kind == "local"]

    def local_bounds(self, t, batches_per_round):
        """Round ``t``'s bound of each client-local array: ``LOCAL_RANGE`` for statistics,
        and for a count (an integer array: BatchNorm's ``num_batches_tracked``, which grows
        by the batches of every round) the most it can reach after this round."""
        return [(name, max(LOCAL_RANGE, (t + 1) * batches_per_round)
                 if np.issubdtype(self.engine.template[name][1], np.integer) else LOCAL_RANGE)
                for name in self.local_names]

    def start(self, grid, initial_arrays, num_rounds=3, timeout=3600, **kwargs):
        self.secure_sum.timeout = timeout  # each protocol stage waits as long as a plain round
        return super().start(grid, initial_arrays, num_rounds=num_rounds, timeout=timeout, **kwargs)

    def summary(self):
        super().summary()
        log(_INFO, "\t├──> secure aggregation: SecAgg+, %d-bit quantization, threshold %.2f of the sites",
            QUANTIZATION_BITS, self.secure_sum.reconstruction_threshold)

    def _secure(self, grid, messages, layout, round_id):
        contents = {}
        for message in messages:
            content = message.content
            content["config"][CONFIG_KEY] = json.dumps(layout)
            contents[message.metadata.dst_node_id] = content
        nodes, errors, summed = self.secure_sum(grid, contents, round_id)
        clients = [self.client_of[node] for node in nodes]
        reasons = {self.client_of[node]: reason for node, reason in errors.items()}
        return clients, reasons, summed

    def configure_train(self, server_round, arrays, config, grid):
        messages = super().configure_train(server_round, arrays, config, grid)
        if not messages:
            return []
        engine = self.engine
        selected = self._round["selected"]
        batches = float(max(engine.n_train) * self.local_epochs)  # at most one batch per sample and epoch
        layout = {"stage": "train", "arrays": self.bounds, "local": self.local_bounds(self._round["t"], batches),
                  "weighting": engine.weighting, "n-max": max(engine.n_train[cid] for cid in selected),
                  "skipped-range": batches}
        if engine.train_weights is not None:  # sample weights: the sites weigh the sums of their training weights
            layout["weight-max"] = max(engine.declared_weight(cid) for cid in selected)
        clients, reasons, summed = self._secure(grid, messages, layout, 2 * self._round["t"])
        *params, scalars = summed
        names = [name for name, _ in self.bounds + layout["local"]]
        self._round["sum"] = (clients, reasons, dict(zip(names, params)), scalars, layout)
        return []

    def aggregate_train(self, server_round, replies):
        if self._round is None:
            return None, None
        clients, reasons, params, scalars, layout = self._round["sum"]
        n_max, weight, size = layout["n-max"], float(scalars[0]), float(scalars[1])
        bounds, local = dict(self.bounds), dict(layout["local"])
        params = {name: value.reshape(self.engine.template[name][0]) for name, value in params.items()}
        record = self.engine.aggregate_from_sum(
            self._round["t"], self._round["selected"], clients, reasons,
            summed={name: params[name] * bound for name, bound in bounds.items()}, weight=weight,
            pooled_local={name: np.asarray(params[name] * bound / size) for name, bound in local.items()}
            if size > 0 else None,
            n_examples=float(scalars[1]) * n_max, loss=float(scalars[2]) * LOSS_RANGE,
            n_nan_loss=float(scalars[3]), n_skipped=float(scalars[4]) * layout["skipped-range"],
            total_weight=float(scalars[5]) * layout["weight-max"] if "weight-max" in layout else None)
        return self._after_train(record)

    def configure_evaluate(self, server_round, arrays, config, grid):
        messages = super().configure_evaluate(server_round, arrays, config, grid)
        if not messages:
            return []
        clients = self.engine.evaluated_clients()
        layout = {"stage": "evaluate", "n-max": max(self.engine.n_val[cid] for cid in clients)}
        messages = [_as_train(message) for message in messages]
        summed_clients, reasons, (scalars,) = self._secure(grid, messages, layout, 2 * self._round["t"] + 1)
        self._round["eval-sum"] = (summed_clients, reasons, scalars, layout["n-max"])
        return []

    def aggregate_evaluate(self, server_round, replies):
        if self._round is None:
            return None
        if "eval-sum" not in self._round:  # no site holds validation data (e.g. DP mode): no sum to take
            return super().aggregate_evaluate(server_round, replies)
        clients, reasons, scalars, n_max = self._round.pop("eval-sum")
        weight = float(scalars[0])
        record = self.engine.finish_round_from_sum(
            self._round["record"], clients, reasons, n_examples=weight * n_max,
            loss=float(scalars[1]) * LOSS_RANGE / weight if weight > 0 else float("nan"),
            f1=float(scalars[2]) / weight if weight > 0 else float("nan"), wall_time=self._elapsed())
        return self._after_evaluate(record)


def _as_train(message):
    """An evaluate message re-sent as a train message (Flower's SecAgg+ mod handles
    train messages only); the site's ClientApp validates when the layout says so."""
    return Message(content=message.content, message_type=MessageType.TRAIN, dst_node_id=message.metadata.dst_node_id)


def check_secure_engine(engine):
    """Raise ValueError when a run cannot use secure aggregation."""
    check_secure_rule(engine.rule_name)
    if not 3 <= engine.n_select <= MAX_SITES:
        raise ValueError(f"secure aggregation needs between 3 and {MAX_SITES} sites per round (SecAgg+ with one "
                         f"dropout tolerated; {QUANTIZATION_BITS}-bit sums modulo 2**32), got {engine.n_select}")
    n_validating = len(engine.evaluated_clients())
    if n_validating and not 3 <= n_validating <= MAX_SITES:
        raise ValueError(f"secure aggregation needs 3 to {MAX_SITES} sites with validation data, got {n_validating}")
