"""In-process Flower simulation: Flower's Simulation Runtime with a thread backend.

Flower 1.42's Simulation Runtime (the "VCE": an in-memory LinkState, an ``InMemoryGrid``
for the ServerApp, per-node contexts, message queues and worker threads) hard-wires one
backend, Ray (``flwr[simulation]``: ``ray==2.55.1``, a wheel of several tens of MB that
starts a local Ray cluster of daemons and one actor process per concurrent client). For the
small consortia this package targets, that costs far more than the training itself, so
:func:`run_inprocess_simulation` runs the same runtime (``vce_api.run_api``) with
:class:`InProcessBackend`, an implementation of Flower's ``Backend`` interface that calls
the ClientApp in the runtime's worker thread. Everything else (messages, node ids, the
ServerApp thread, reply routing, errors turned into error replies) is Flower's own code.

The runtime, its ``Backend`` interface and the in-memory LinkState are not Flower's public
API (``flwr.simulation.run_simulation`` is, with Ray only): they come from
:mod:`skfedspd.flower._internals`, which checks the installed Flower.
"""

import copy
import logging
import os
import queue
import threading

from flwr.app import Context, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

from ._internals import Backend, VceMetrics, register_virtual_nodes, run_serverapp, run_vce, start_inmemory_run

__all__ = ["InProcessBackend", "run_inprocess_simulation", "quiet_flower_logs"]


class InProcessBackend(Backend):
    """A Flower Simulation Runtime backend that runs the ClientApp in the calling thread.

    ``num_workers`` runtime worker threads call :meth:`process_message` concurrently
    (default 1: one ClientApp at a time, as a single Ray actor would).

    Examples
    --------
    :func:`run_inprocess_simulation` creates it for Flower's Simulation Runtime, which then
    builds it from the ClientApp and hands it every message of every virtual SuperNode:

    >>> from flwr.clientapp import ClientApp
    >>> from skfedspd.flower import InProcessBackend
    >>> from skfedspd.flower._internals import Backend
    >>> backend = InProcessBackend({"init_args": {"num_workers": 2}})
    >>> isinstance(backend, Backend), backend.num_workers, backend.is_worker_idle()
    (True, 2, True)
    >>> backend.build(ClientApp)  # the runtime passes a factory of its ClientApp
    >>> backend.terminate()
    """

    def __init__(self, backend_config=None):
        super().__init__(backend_config or {})
        self._num_workers = int((backend_config or {}).get("init_args", {}).get("num_workers", 1))
        self._app = None

    def build(self, app_fn):
        self._app = app_fn()

    @property
    def num_workers(self):
        return self._num_workers

    def is_worker_idle(self):
        return True

    def process_message(self, message, context):
        if self._app is None:
            raise RuntimeError("InProcessBackend.build() was not called")
        # A node gets its own copy, as over a wire (or Ray): Flower's server workflows may
        # send one content object to several nodes, and SecAgg+'s client mod edits it.
        return self._app(message=copy.deepcopy(message), context=context), context

    def terminate(self):
        self._app = None


class quiet_flower_logs:  # noqa: N801 - used as a context manager
    """Raise the ``flwr`` logger's level while a block runs (Flower logs every round at INFO).

    Examples
    --------
    >>> import logging
    >>> from skfedspd.flower.simulation import quiet_flower_logs
    >>> with quiet_flower_logs():
    ...     inside = logging.getLogger("flwr").level
    >>> logging.getLevelName(inside)
    'WARNING'
    """

    def __init__(self, level=logging.WARNING):
        self.level = level

    def __enter__(self):
        self._logger = logging.getLogger("flwr")
        self._previous = self._logger.level
        self._logger.setLevel(self.level)
        return self

    def __exit__(self, *exc):
        self._logger.setLevel(self._previous)
        return False


def run_inprocess_simulation(server_app: ServerApp, client_app: ClientApp, num_supernodes: int, *,
                             num_workers: int = 1, run_config=None):
    """Run ``server_app`` against ``num_supernodes`` virtual SuperNodes in this process.

    Node ``i`` gets ``node_config = {"partition-id": i, "num-partitions": num_supernodes}``
    (as in any Flower simulation). The ServerApp runs in a thread; this call returns when
    it finishes, and re-raises what it raised.

    Returns
    -------
    Context
        The ServerApp's context after the run.

    Examples
    --------
    A ServerApp that asks each of three virtual SuperNodes for its partition:

    >>> from flwr.app import ConfigRecord, Message, RecordDict
    >>> from flwr.clientapp import ClientApp
    >>> from flwr.serverapp import ServerApp
    >>> from skfedspd.flower import run_inprocess_simulation
    >>> from skfedspd.flower.server import connect_sites
    >>> from skfedspd.flower.simulation import quiet_flower_logs
    >>> client_app, server_app, answers = ClientApp(), ServerApp(), []
    >>> @client_app.query()
    ... def partition(message, context):
    ...     info = ConfigRecord({"partition-id": context.node_config["partition-id"]})
    ...     return Message(RecordDict({"info": info}), reply_to=message)
    >>> @server_app.main()
    ... def ask(grid, context):
    ...     queries = [Message(RecordDict(), dst_node_id=node, message_type="query")
    ...                for node in connect_sites(grid, 3, timeout=30.0)]
    ...     answers.extend(reply.content["info"]["partition-id"] for reply in grid.send_and_receive(queries))
    >>> with quiet_flower_logs():
    ...     context = run_inprocess_simulation(server_app, client_app, num_supernodes=3)
    >>> sorted(answers)
    [0, 1, 2]
    """
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    state_factory, run, grid = start_inmemory_run()  # as flwr.simulation.run_simulation does
    context = Context(run_id=run.run_id, node_id=0, node_config={}, state=RecordDict(),
                      run_config=dict(run_config or {}))
    nodes_mapping, node_info_stores = register_virtual_nodes(num_supernodes, state_factory, run)

    f_stop = threading.Event()
    errors = queue.Queue()
    contexts = queue.Queue()

    def serve():
        try:
            contexts.put(run_serverapp(grid=grid, context=context, server_app_dir="",
                                       loaded_server_app=server_app))
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller
            errors.put(error)
        finally:
            f_stop.set()

    server_thread = threading.Thread(target=serve, name="flwr-serverapp", daemon=True)
    server_thread.start()
    try:
        run_vce(lambda: client_app, lambda: InProcessBackend({"init_args": {"num_workers": num_workers}}),
                nodes_mapping, state_factory, node_info_stores, f_stop, VceMetrics())
    finally:
        f_stop.set()
        server_thread.join()
    if not errors.empty():
        raise errors.get()
    return contexts.get() if not contexts.empty() else context
