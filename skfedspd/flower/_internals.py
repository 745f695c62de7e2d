"""What ``skfedspd.flower`` uses of Flower beyond its public API: the Simulation Runtime
(:mod:`.simulation`), the Runtime API's task protocol (:mod:`.runtime`) and SecAgg+'s legacy
reply (:mod:`.secure`); ``docs/guide/deployment.md`` says why, and what the public API would
cost. ``skfedspd.flower`` imports this module first: a Flower outside :data:`SUPPORTED_FLWR`,
or one that lacks a name used here, stops the import with an ImportError naming the
installed version, the range and :data:`INSTALL_COMMAND`.
"""

import time
import types

try:
    import flwr
except ModuleNotFoundError as error:  # get_backend names the extra from this error's name
    raise ModuleNotFoundError(f"skfedspd.flower needs Flower: {error}", name=error.name) from error

from packaging.specifiers import SpecifierSet  # a dependency of Flower
from packaging.version import InvalidVersion

__all__ = [
    "SUPPORTED_FLWR", "INSTALL_COMMAND", "unsupported_flower", "check_flower_version", "FLWR_VERSION",
    "run_vce", "start_inmemory_run", "register_virtual_nodes", "runtime_client", "set_object_pull_backoff",
    "patch_supernode_loop", "AcquireTaskRequest", "add_superexec_auth_secret_args", "Backend",
    "context_from_proto", "context_to_proto", "ErrorCode", "fab_from_proto", "fitres_to_recorddict",
    "flower_supernode", "flush_logs", "get_fused_config_from_dir", "get_load_client_app_fn",
    "get_project_config", "get_project_dir", "HeartbeatSender", "HttpGrid", "install_from_fab",
    "load_superexec_auth_secret", "LoadClientAppError", "MAIN_CONFIGS_RECORD", "MAIN_PARAMS_RECORD",
    "make_simple_http_retry_invoker", "make_task_heartbeat_fn_http", "mirror_output_to_queue",
    "pull_task_input", "PullTaskInputRequest", "push_message", "push_task_output", "PushTaskOutputRequest",
    "RECORD_KEY_CONFIGS", "run_from_proto", "run_serverapp", "RuntimeHttpClient",
    "RuntimeTokenHttpInterceptor", "RuntimeVersionHttpInterceptor", "start_log_uploader",
    "start_parent_process_monitor", "stop_log_uploader", "SubStatus", "SuperExecAuthHttpInterceptor",
    "TaskIdentity", "TaskType", "VceMetrics", "WorkflowKey"
]

#: The Flower releases this package runs on (the ``flower`` extra's pin in ``pyproject.toml``).
SUPPORTED_FLWR = ">=1.42,<1.43"
#: How to install a supported Flower.
INSTALL_COMMAND = "pip install 'skfedspd[flower]'"


def _message(version, problem):
    return (f"skfedspd.flower supports Flower (flwr) {SUPPORTED_FLWR}, and the installed flwr {version} "
            f"{problem}: install a supported Flower with {INSTALL_COMMAND}")


def unsupported_flower(version):
    """Why Flower ``version`` cannot run ``skfedspd.flower`` (a sentence), or None.

    Examples
    --------
    >>> from skfedspd.flower._internals import unsupported_flower
    >>> unsupported_flower("1.42.0") is None, unsupported_flower("1.42.7") is None
    (True, True)
    >>> unsupported_flower("1.43.0rc1") is None  # PEP 440: a pre-release of 1.43 is not below 1.43
    False
    >>> print(unsupported_flower("1.43.0"))
    skfedspd.flower supports Flower (flwr) >=1.42,<1.43, and the installed flwr 1.43.0 is outside this range: install a supported Flower with pip install 'skfedspd[flower]'
    """
    try:
        inside = SpecifierSet(SUPPORTED_FLWR).contains(str(version), prereleases=True)
    except InvalidVersion:
        return _message(version, "has no version number")
    return None if inside else _message(version, "is outside this range")


def check_flower_version(version):
    """Raise ImportError when Flower ``version`` is outside :data:`SUPPORTED_FLWR`.

    Examples
    --------
    >>> from skfedspd.flower._internals import check_flower_version
    >>> check_flower_version("1.42.0")
    >>> check_flower_version("1.41.2")
    Traceback (most recent call last):
    ...
    ImportError: skfedspd.flower supports Flower (flwr) >=1.42,<1.43, and the installed flwr 1.41.2 is outside this range: install a supported Flower with pip install 'skfedspd[flower]'
    """
    problem = unsupported_flower(version)
    if problem is not None:
        raise ImportError(problem)


FLWR_VERSION = getattr(flwr, "__version__", "of unknown version")
check_flower_version(FLWR_VERSION)

try:
    # --- .simulation. Public alternative: flwr.simulation.run_simulation, whose only backend
    # is Ray (flwr[simulation]: a Ray cluster of daemons and an actor process per client).
    import flwr.server.superlink.fleet.vce.vce_api as _vce_api
    from flwr.common.constant import RUN_ID_NUM_BYTES, SUPERLINK_NODE_ID, TASK_ID_NUM_BYTES
    from flwr.proto.task_pb2 import Task  # pylint: disable=no-name-in-module
    # ServerApp.__call__ runs the app, not Flower's set-up and teardown of a run around it.
    from flwr.server.run_serverapp import run as run_serverapp
    # The interface the Simulation Runtime drives (no public registry of backends).
    from flwr.server.superlink.fleet.vce.backend import Backend
    from flwr.server.superlink.fleet.vce.metrics import VceMetrics
    # The in-memory LinkState and Grid that run_simulation builds and does not expose.
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.server.superlink.linkstate.utils import generate_rand_int_from_bytes
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import InMemoryGrid

    # --- .runtime. Public alternative: Flower's flwr-clientapp / flwr-serverapp processes,
    # a new process (Python, torch, skfedspd, the site's data) for every message; and
    # Flower's fixed 3 s polls (SuperNode loop, Grid) and 1 s object-pull back-off.
    import flwr.supernode.start_client_internal as _supernode_loop
    from flwr.cli.install import install_from_fab
    from flwr.clientapp.client_app import LoadClientAppError
    from flwr.clientapp.utils import get_load_client_app_fn
    from flwr.common.config import get_fused_config_from_dir, get_project_config, get_project_dir
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.common.serde import context_from_proto, context_to_proto, fab_from_proto, run_from_proto
    from flwr.proto.runtime_pb2 import (  # pylint: disable=no-name-in-module
        AcquireTaskRequest,
        PullTaskInputRequest,
        PushTaskOutputRequest,
    )
    from flwr.supercore.app_utils import start_parent_process_monitor
    from flwr.supercore.auth import add_superexec_auth_secret_args, load_superexec_auth_secret
    from flwr.supercore.constant import TaskType
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supercore.inflatable import inflatable_utils as _inflatable_utils
    from flwr.supercore.interceptors import (
        RuntimeTokenHttpInterceptor,
        RuntimeVersionHttpInterceptor,
        SuperExecAuthHttpInterceptor,
    )
    from flwr.supercore.logger import flush_logs, mirror_output_to_queue, start_log_uploader, stop_log_uploader
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    # The Runtime API's Grid (public: the abstract flwr.serverapp.Grid only).
    from flwr.superlink.grid import HttpGrid
    from flwr.supernode.cli import flower_supernode
    from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

    # --- .secure. SecAggPlusWorkflow and secaggplus_mod are public; the legacy reply they
    # mask and the workflow's state keys are not (writing them here would copy Flower's code).
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
    from flwr.compat.common.recorddict_compat import fitres_to_recorddict
    from flwr.server.workflow import SecAggPlusWorkflow  # public; checked for the stage .secure overrides
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey
    from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState as _WorkflowState
except ImportError as error:
    raise ImportError(_message(FLWR_VERSION, f"lacks what skfedspd.flower uses of it ({error})")) from error


def _require(owner, *names):
    missing = [name for name in names if not hasattr(owner, name)]
    if missing:
        where = getattr(owner, "__name__", type(owner).__name__)
        raise ImportError(_message(FLWR_VERSION, f"lacks {', '.join(f'{where}.{n}' for n in missing)}"))


# The private members used below, checked now rather than at their first call.
_require(_vce_api, "_register_nodes", "_register_node_info_stores", "run_api")
_require(_supernode_loop, "_pull_and_store_message", "time")
_require(HttpGrid, "_runtime_client")
_require(SecAggPlusWorkflow, "setup_stage")
if "nid_to_fitins" not in getattr(_WorkflowState, "__dataclass_fields__", {}):
    raise ImportError(_message(FLWR_VERSION, "lacks SecAggPlusWorkflow's nid_to_fitins state"))
if not {"initial_backoff", "backoff_cap"} <= set(_inflatable_utils.pull_objects.__kwdefaults__ or {}):
    raise ImportError(_message(FLWR_VERSION, "lacks the back-off arguments of inflatable_utils.pull_objects"))

run_vce = _vce_api.run_api


def start_inmemory_run(run_config=None, pull_interval=0.005):
    """An in-memory LinkState with one run, as ``flwr.simulation.run_simulation`` sets it up.

    Returns ``(state_factory, run, grid)``: the ServerApp's ``InMemoryGrid`` is set to the run.

    Examples
    --------
    >>> from skfedspd.flower._internals import register_virtual_nodes, start_inmemory_run
    >>> state_factory, run, grid = start_inmemory_run()
    >>> grid.run.run_id == run.run_id
    True
    >>> nodes_mapping, node_info_stores = register_virtual_nodes(3, state_factory, run)
    >>> sorted(nodes_mapping.values())  # node id -> partition id
    [0, 1, 2]
    """
    state_factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    run = Run.create_empty(run_id=generate_rand_int_from_bytes(RUN_ID_NUM_BYTES))
    run.primary_task_id = generate_rand_int_from_bytes(TASK_ID_NUM_BYTES)
    run.federation_id = NOOP_FEDERATION_ID
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = run.run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    state = state_factory.state()
    state.run_ids[run.run_id] = RunRecord(run=run)
    state.task_store[run.primary_task_id] = Task(task_id=run.primary_task_id, run_id=run.run_id)
    grid = InMemoryGrid(state_factory=state_factory, pull_interval=pull_interval)
    grid.set_run(run)
    return state_factory, run, grid


def register_virtual_nodes(num_nodes, state_factory, run):
    """Register ``num_nodes`` virtual SuperNodes: ``(nodes_mapping, node_info_stores)``
    for :func:`run_vce`.

    Examples
    --------
    See :func:`start_inmemory_run`; each virtual node gets its partition id:

    >>> from skfedspd.flower._internals import register_virtual_nodes, start_inmemory_run
    >>> state_factory, run, _ = start_inmemory_run()
    >>> len(register_virtual_nodes(2, state_factory, run)[0])
    2
    """
    nodes_mapping = _vce_api._register_nodes(num_nodes=num_nodes, state_factory=state_factory)
    return nodes_mapping, _vce_api._register_node_info_stores(nodes_mapping=nodes_mapping, run=run)


def runtime_client(grid):
    """The Runtime API client of an ``HttpGrid`` (its task's heartbeat and input use it).

    Examples
    --------
    The client is created on first use; it connects when it sends a request:

    >>> from skfedspd.flower._internals import HttpGrid, runtime_client
    >>> grid = HttpGrid(runtime_api_address="127.0.0.1:9091", insecure=True, token="<task token>")
    >>> runtime_client(grid) is runtime_client(grid)
    True
    >>> grid.close()
    """
    return grid._runtime_client


def set_object_pull_backoff(initial, cap):
    """The back-off (seconds) with which this process retries a message's objects that are
    not uploaded yet (Flower: 1 s, doubling up to 10 s).

    Examples
    --------
    >>> from flwr.supercore.inflatable import inflatable_utils
    >>> from skfedspd.flower._internals import set_object_pull_backoff
    >>> defaults = inflatable_utils.pull_objects.__kwdefaults__
    >>> saved = defaults["initial_backoff"], defaults["backoff_cap"]
    >>> set_object_pull_backoff(0.02, 0.5)
    >>> defaults["initial_backoff"], defaults["backoff_cap"]
    (0.02, 0.5)
    >>> set_object_pull_backoff(*saved)
    """
    _inflatable_utils.pull_objects.__kwdefaults__.update(initial_backoff=initial, backoff_cap=cap)


def patch_supernode_loop(wrap_pull, sleep):
    """Make this process's SuperNode loop pull with ``wrap_pull(Flower's pull)`` and sleep
    with ``sleep(seconds)`` (Flower: 3 s after an empty poll, 0.5 s while a reply is pending).

    Examples
    --------
    >>> import time
    >>> import flwr.supernode.start_client_internal as loop
    >>> from skfedspd.flower._internals import patch_supernode_loop
    >>> saved = loop._pull_and_store_message, loop.time
    >>> slept = []
    >>> patch_supernode_loop(lambda pull: pull, slept.append)
    >>> loop.time.sleep(3.0)
    >>> slept, loop.time.monotonic is time.monotonic
    ([3.0], True)
    >>> loop._pull_and_store_message, loop.time = saved
    """
    clock = types.ModuleType("time")
    clock.__dict__.update({k: v for k, v in vars(time).items() if not k.startswith("__")})
    clock.sleep = sleep
    _supernode_loop._pull_and_store_message = wrap_pull(_supernode_loop._pull_and_store_message)
    _supernode_loop.time = clock
