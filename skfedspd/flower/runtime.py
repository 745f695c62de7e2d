"""Long-lived Flower app processes for Flower's process isolation mode.

In ``--isolation subprocess`` mode, Flower 1.42 starts a new ``flwr-clientapp`` process for
every message a SuperNode receives (and a ``flwr-serverapp`` per run): each one imports
Python, torch and skfedspd (seconds) and prepares the site's data again. In
``--isolation process`` mode the SuperNode (or SuperLink) only queues the tasks on its
Runtime API, and an external process claims and runs them. This module is that process,
run once per SuperNode (and once per SuperLink)::

    flower-supernode --isolation process ...                        # the site's SuperNode
    python -m skfedspd.flower.runtime clientapp --runtime-api-address 127.0.0.1:9094 --insecure

    flower-superlink --isolation process ...                        # the server
    python -m skfedspd.flower.runtime serverapp --runtime-api-address 127.0.0.1:9093 --insecure

It claims one task at a time and runs it **in this process** with Flower's own task
protocol (pull the task input, run the app, push the reply and the task output, task
heartbeats), so torch, skfedspd and the ClientApp object, with what it keeps between
messages, stay loaded for the whole run. Idle polling backs off from 20 ms to
``--max-poll`` seconds and starts fast again after each task.

The ServerApp runs with :class:`PromptGrid`, Flower's Runtime grid whose
``send_and_receive`` polls for replies with the same back-off instead of Flower's fixed
3 s, so that a round costs its computation, not the poll.

``python -m skfedspd.flower.runtime supernode [flower-supernode options]`` runs Flower's own
SuperNode with the same back-off for its idle poll of the SuperLink (Flower: a fixed 3 s
between polls while no message is waiting, 0.5 s while a reply is pending); everything else
is Flower's ``flower-supernode``.

Flower's public API has no such process (its own ``flwr-clientapp`` is one process per
message): the Runtime API client, the task protocol and the SuperNode's loop used here are
Flower internals, imported from :mod:`skfedspd.flower._internals`, which checks the installed
Flower.
"""

import argparse
import importlib
import sys
import threading
import time
from logging import ERROR, INFO
from pathlib import Path
from queue import Empty, Queue

from flwr.app import Error, Message, RecordDict
from flwr.common import log

from ._internals import (
    AcquireTaskRequest,
    ErrorCode,
    HeartbeatSender,
    HttpGrid,
    LoadClientAppError,
    PullTaskInputRequest,
    PushTaskOutputRequest,
    RuntimeHttpClient,
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
    SubStatus,
    SuperExecAuthHttpInterceptor,
    TaskIdentity,
    TaskType,
    add_superexec_auth_secret_args,
    context_from_proto,
    context_to_proto,
    fab_from_proto,
    flower_supernode,
    flush_logs,
    get_fused_config_from_dir,
    get_load_client_app_fn,
    get_project_config,
    get_project_dir,
    install_from_fab,
    load_superexec_auth_secret,
    make_simple_http_retry_invoker,
    make_task_heartbeat_fn_http,
    mirror_output_to_queue,
    patch_supernode_loop,
    pull_task_input,
    push_message,
    push_task_output,
    run_from_proto,
    run_serverapp,
    runtime_client,
    set_object_pull_backoff,
    start_log_uploader,
    start_parent_process_monitor,
    stop_log_uploader,
)

__all__ = ["Backoff", "PromptGrid", "AppRunner", "main"]


class Backoff:
    """Poll delays: ``floor`` seconds after activity, times ``factor`` per idle poll, at
    most ``cap``. The added latency is at most ``factor - 1`` times the time waited.

    Examples
    --------
    >>> from skfedspd.flower.runtime import Backoff
    >>> backoff = Backoff(floor=0.001, cap=0.004, factor=2)
    >>> delays = []
    >>> for _ in range(4):  # idle polls
    ...     delays.append(backoff.delay)
    ...     backoff.sleep()
    >>> delays
    [0.001, 0.002, 0.004, 0.004]
    >>> backoff.reset()  # a task arrived: poll fast again
    >>> backoff.delay
    0.001
    """

    def __init__(self, floor=0.02, cap=0.5, factor=1.5):
        if not 0 < floor <= cap:
            raise ValueError(f"need 0 < floor <= cap, got floor={floor}, cap={cap}")
        self.floor, self.cap, self.factor = floor, cap, factor
        self.delay = floor

    def reset(self):
        self.delay = self.floor

    def sleep(self):
        time.sleep(self.delay)
        self.delay = min(self.cap, self.delay * self.factor)


class PromptGrid(HttpGrid):
    """Flower's Runtime grid; ``send_and_receive`` polls for the replies with a
    :class:`Backoff` (Flower's polls every 3 s). Same arguments as ``HttpGrid``, plus
    ``max_poll`` (seconds).

    Examples
    --------
    :class:`AppRunner` creates one per ServerApp run, with the token of the run's task (the
    grid connects to the SuperLink's Runtime API only when messages are sent):

    >>> from skfedspd.flower.runtime import PromptGrid
    >>> grid = PromptGrid(runtime_api_address="127.0.0.1:9091", insecure=True, token="<task token>",
    ...                   max_poll=0.2)
    >>> grid.max_poll
    0.2
    >>> grid.close()
    """

    def __init__(self, *args, max_poll=0.5, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_poll = max_poll

    def send_and_receive(self, messages, *, timeout=None):
        pending = {message_id for message_id in self.push_messages(messages) if message_id}
        end = None if timeout is None else time.time() + timeout
        backoff = Backoff(cap=self.max_poll)
        replies = []
        while pending and (end is None or time.time() < end):
            received = list(self.pull_messages(pending))
            replies += received
            pending -= {message.metadata.reply_to_message_id for message in received}
            if pending:
                backoff.sleep()
        return replies


def _error_reason(ex):
    return f"{type(ex)}:<'{ex}'>"  # Flower's format for an app's exception


class AppRunner:
    """Claim the ``task_type`` tasks of a Runtime API and run them in this process.

    Parameters
    ----------
    task_type : {"flwr-clientapp", "flwr-serverapp"}
    runtime_api_address : str
        The SuperNode's (ClientApp) or the SuperLink's (ServerApp) Runtime API.
    insecure : bool
        Plain HTTP to the Runtime API (it listens on 127.0.0.1 on the same machine).
    root_certificates : str or None
        CA certificate (PEM path) of a TLS Runtime API.
    superexec_auth_secret : bytes or None
        The shared secret of ``--superexec-auth-secret-file`` (Flower's SuperExec auth).
    max_poll : float
        Longest idle poll, in seconds.

    Examples
    --------
    The runner of a SuperNode's ClientApp tasks (``python -m skfedspd.flower.runtime
    clientapp ...``); serving needs the SuperNode's Runtime API, so it is skipped here:

    >>> from skfedspd.flower.runtime import AppRunner
    >>> runner = AppRunner("flwr-clientapp", "127.0.0.1:9094", insecure=True, max_poll=0.5)
    >>> str(runner.task_type)
    'flwr-clientapp'
    >>> runner.serve_forever()  # doctest: +SKIP
    """

    def __init__(self, task_type, runtime_api_address, *, insecure=False, root_certificates=None,
                 superexec_auth_secret=None, max_poll=0.5):
        self.task_type = TaskType(task_type)
        if self.task_type not in (TaskType.CLIENT_APP, TaskType.SERVER_APP):
            raise ValueError(f"task_type must be flwr-clientapp or flwr-serverapp, got {task_type!r}")
        self.address = runtime_api_address
        self.insecure = insecure
        self.root_certificates = root_certificates
        self.superexec_auth_secret = superexec_auth_secret
        self.max_poll = max_poll
        self._apps = {}  # (fab hash, component) -> app directory, loaded app (ClientApp)
        self._log_queue = None

    # ------------------------------------------------------------------ plumbing
    def _client(self, *interceptors):
        return RuntimeHttpClient.from_server_address(
            server_address=self.address, insecure=self.insecure, root_certificates=self.root_certificates,
            interceptors=[RuntimeVersionHttpInterceptor(component_name=str(self.task_type)), *interceptors],
            retry_invoker=make_simple_http_retry_invoker())

    def _app_dir(self, run, fab):
        """The installed Flower App (a FAB carries configuration: installed once per hash)."""
        key = fab.hash_str
        if key not in self._apps:
            install_from_fab(fab.content, skip_prompt=True)
            self._apps[key] = get_project_dir(run.fab_id, run.fab_version, fab.hash_str)
        return self._apps[key]

    def serve_forever(self, stop=None):
        """Claim and run tasks until ``stop`` (a ``threading.Event``) is set."""
        stop = stop or threading.Event()
        interceptors = []
        if self.superexec_auth_secret:
            interceptors.append(SuperExecAuthHttpInterceptor(
                master_secret=self.superexec_auth_secret, protected_methods={"/flwr.proto.Runtime/AcquireTask"}))
        if self.task_type == TaskType.SERVER_APP:
            self._log_queue = Queue()  # what the ServerApp prints reaches `flwr run --stream`
            mirror_output_to_queue(self._log_queue)
        client = self._client(*interceptors)
        backoff = Backoff(cap=self.max_poll)
        log(INFO, "%s: long-lived runner on the Runtime API at %s", self.task_type, self.address)
        try:
            while not stop.is_set():
                response = client.AcquireTask(AcquireTaskRequest(supported_task_types=[str(self.task_type)]))
                if response.HasField("task") and response.token:
                    if self.task_type == TaskType.CLIENT_APP:
                        self.run_client_task(response.token)
                    else:
                        self.run_server_task(response.token)
                    backoff.reset()
                else:
                    backoff.sleep()
        finally:
            client.close()

    # ------------------------------------------------------------------ ClientApp
    def _client_app(self, run, fab):
        self._app_dir(run, fab)
        key = (fab.hash_str, "clientapp")
        if key not in self._apps:  # loaded once: the ClientApp keeps what it caches between messages
            self._apps[key] = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)(
                run.fab_id, run.fab_version, fab.hash_str)
        return self._apps[key]

    def run_client_task(self, token):
        """One ClientApp task, as ``flwr-clientapp --token`` does, without exiting."""
        client = self._client(RuntimeTokenHttpInterceptor(token))
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
        heartbeat.start()
        message = context = reply = None
        status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        try:
            message, context, run, fab = pull_task_input(client)
            reply = self._client_app(run, fab)(message=message, context=context)
            status, details = SubStatus.COMPLETED, ""
        except Exception as ex:  # noqa: BLE001 - becomes the error reply, as in flwr-clientapp
            log(ERROR, "ClientApp raised an exception", exc_info=ex)
            code = (ErrorCode.LOAD_CLIENT_APP_EXCEPTION if isinstance(ex, LoadClientAppError)
                    else ErrorCode.CLIENT_APP_RAISED_EXCEPTION)
            details = _error_reason(ex)
            if message is not None:
                reply = Message(Error(code=code, reason=details), reply_to=message)
        finally:
            try:
                if reply is not None and context is not None:
                    push_message(client, reply, context)
            except Exception as ex:  # noqa: BLE001
                log(ERROR, "Failed to push the ClientApp's reply", exc_info=ex)
            push_task_output(client=client, context=context, sub_status=status, details=details)
            heartbeat.stop()
            client.close()

    # ------------------------------------------------------------------ ServerApp
    def run_server_task(self, token):
        """One ServerApp run, as ``flwr-serverapp --token`` does, with a :class:`PromptGrid`."""
        grid = PromptGrid(runtime_api_address=self.address, insecure=self.insecure,
                          root_certificates=self.root_certificates, token=token, max_poll=self.max_poll)
        client = runtime_client(grid)
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
        heartbeat.start()
        _drain(self._log_queue)
        uploader = context = None
        status, details = SubStatus.FAILED, "Task failed with unknown error."
        try:
            response = client.PullTaskInput(PullTaskInputRequest())
            TaskIdentity.task_id = response.task_id
            TaskIdentity.run_id = response.run.run_id
            TaskIdentity.node_id = response.context.node_id
            context = context_from_proto(response.context)
            run = run_from_proto(response.run)
            fab = fab_from_proto(response.fab)
            grid.set_run(run)
            uploader = start_log_uploader(log_queue=self._log_queue, node_id=0, run_id=run.run_id, client=client)
            app_dir = self._app_dir(run, fab)
            attr = get_project_config(app_dir)["tool"]["flwr"]["app"]["components"]["serverapp"]
            context.run_config = get_fused_config_from_dir(Path(app_dir), run.override_config)
            context = run_serverapp(grid=grid, server_app_dir=str(app_dir), server_app_attr=attr, context=context)
            context.state = RecordDict()  # as flwr-serverapp: the context goes back without its state
            status, details = SubStatus.COMPLETED, ""
        except Exception as ex:  # noqa: BLE001 - the run fails, the runner goes on
            log(ERROR, "ServerApp raised an exception", exc_info=ex)
            details = f"ServerApp failed with exception: {ex}"
        finally:
            if uploader is not None:
                flush_logs(self._log_queue)
            try:
                client.PushTaskOutput(PushTaskOutputRequest(
                    context=context_to_proto(context) if context else None, sub_status=status, details=details))
            except Exception as ex:  # noqa: BLE001
                log(ERROR, "Failed to push the ServerApp's task output: %s", ex)
            if uploader is not None:
                stop_log_uploader(self._log_queue, uploader)
            heartbeat.stop()
            grid.close()


def _drain(queue):
    """Drop what was printed between runs (it belongs to no run's log)."""
    try:
        while True:
            queue.get_nowait()
    except Empty:
        pass


def prompt_object_pulls(max_poll=0.5):
    """Retry a message's objects that are not there yet after 20 ms, doubling up to
    ``max_poll`` s (Flower: 1 s, doubling up to 10 s).

    A receiver learns of a message before its sender has uploaded all its objects (the
    SuperNode pulls a message while the ServerApp still pushes its arrays; the app process
    claims a task while the SuperNode still pulls them): with Flower's back-off, such a race
    costs a second or more per message.
    """
    set_object_pull_backoff(Backoff().floor, max_poll)


# ---------------------------------------------------------------------- SuperNode
def prompt_supernode_polling(max_poll=0.5):
    """Make this process's Flower SuperNode loop poll with a :class:`Backoff`.

    Flower's loop (``flwr.supernode.start_client_internal``) sleeps 3 s after each poll of
    the SuperLink that found no message, and 0.5 s between checks for a pending reply of the
    app; the first become the back-off (reset when a message arrives), the second 20 ms
    checks of the SuperNode's own memory.
    """
    prompt_object_pulls(max_poll)
    backoff = Backoff(cap=max_poll)

    def wrap(pull):
        def pull_and_store_message(*args, **kwargs):
            run_id = pull(*args, **kwargs)
            if run_id is not None:
                backoff.reset()
            return run_id
        return pull_and_store_message

    def sleep(seconds):
        if seconds >= 1.0:  # nothing was pulled
            backoff.sleep()
        else:  # a reply of the app is pending
            time.sleep(min(seconds, backoff.floor))

    patch_supernode_loop(wrap, sleep)


# ---------------------------------------------------------------------- CLI
def main(argv=None):
    """``python -m skfedspd.flower.runtime {clientapp, serverapp, supernode} ...``.

    Examples
    --------
    The long-lived ClientApp process next to a SuperNode whose Runtime API listens on
    127.0.0.1:9094 (it runs until stopped, so it is skipped here); the Runtime API's
    security must be given:

    >>> from skfedspd.flower.runtime import main
    >>> main(["clientapp", "--runtime-api-address", "127.0.0.1:9094", "--insecure",
    ...       "--preload", "skfedspd.flower.app"])  # doctest: +SKIP
    >>> main(["clientapp", "--runtime-api-address", "127.0.0.1:9094"])  # neither --insecure nor a CA
    Traceback (most recent call last):
    ...
    SystemExit: 2
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["supernode"]:  # the rest are flower-supernode's own options
        rest = argv[1:]
        max_poll = 0.5
        if "--max-poll" in rest:
            i = rest.index("--max-poll")
            max_poll = float(rest[i + 1])
            del rest[i:i + 2]
        prompt_supernode_polling(max_poll)
        sys.argv = ["flower-supernode", *rest]
        return flower_supernode()

    parser = argparse.ArgumentParser(prog="python -m skfedspd.flower.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("app", choices=["clientapp", "serverapp", "supernode"],
                        help="run ClientApp tasks (next to a SuperNode), ServerApp tasks (next to a SuperLink), "
                             "or a SuperNode with prompt polling (then flower-supernode's options follow)")
    parser.add_argument("--runtime-api-address", required=True,
                        help="the SuperNode's Runtime API (its --host:--port) or the SuperLink's address")
    tls = parser.add_mutually_exclusive_group(required=True)
    tls.add_argument("--insecure", action="store_true", help="plain HTTP (a Runtime API on 127.0.0.1)")
    tls.add_argument("--root-certificates", help="CA certificate (PEM) of the Runtime API's TLS certificate")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process exits")
    parser.add_argument("--max-poll", type=float, default=0.5, help="longest idle poll, seconds")
    parser.add_argument("--preload", nargs="*", default=[], metavar="MODULE",
                        help="import these modules at start (e.g. skfedspd.flower.app: torch and skfedspd are "
                             "then loaded before the first task)")
    add_superexec_auth_secret_args(parser)
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        start_parent_process_monitor(args.parent_pid)
    prompt_object_pulls(args.max_poll)
    for module in args.preload:
        importlib.import_module(module)
    AppRunner(f"flwr-{args.app}", args.runtime_api_address, insecure=args.insecure,
              root_certificates=args.root_certificates, max_poll=args.max_poll,
              superexec_auth_secret=load_superexec_auth_secret(args.superexec_auth_secret_file)).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
