"""The child side of the processes backend: one stage's StageHost in a process of its own,
driven through one duplex pipe (omni/backends/process_backend.py is the parent side).

Why a process: in one process every stage's loop, the driver thread and the caller's event loop
take turns at one GIL, so a GPU stage's step waits while the driver builds snapshots and the
event loop delivers them (docs/gpu.md, "Stages in processes of their own"). Here the stage's
loop shares its GIL only with the two threads below, which mostly wait.

Messages, each a tuple whose first item names it:
- parent -> child: ("submit", items), ("abort", request_ids), ("stats", call_id),
  ("shutdown",);
- child -> parent: ("ready", info) once built, or ("failed", exception) instead; then
  ("events", encoded events: `encode_events`) whenever the host has some, ("stats", call_id, stats) per stats call, and
  ("died", error) if the host's loop dies (the process then exits).

Tensors cross as numpy arrays (omni/backends/transport.py), results and step rows too: the host
packs them (`pack`), and unpacks what arrives (`resolve`), as a Ray stage actor does. The child
exits when the parent says so, when the pipe closes (the parent is gone), or when its loop died;
it ignores SIGINT, which a terminal's Ctrl-C sends the whole process group.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

from omni.backends import gc_freeze
from omni.backends.transport import (
    pack,
    pack_event,
    pack_result,
    unpack,
    unpack_event,
    unpack_input,
    unpack_result,
)
from omni.config import StageConfig
from omni.host import Processor, StageHost
from omni.messages import StageEvent, StageResult, StageUpdate

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # how often the child's threads re-check that the process is stopping
STOP_S = 5.0  # longest wait for the stage's loop to stop (the parent waits 10 s in all)


def _pack(value: StageResult | dict[str, Any]) -> Any:
    return pack_result(value) if isinstance(value, StageResult) else pack(value)


def _resolve(payloads: list[Any]) -> list[Any]:
    # Step rows are read-only views, as under Ray: the consumer copies its request's rows out.
    return [unpack_result(p) if isinstance(p, StageResult) else unpack(p, False) for p in payloads]


def encode_events(events: list[StageEvent]) -> list[Any]:
    """Events for the pipe. A plain token update (every request, every step: tokens only) goes
    as a (request_id, new_token_ids, num_cached_tokens) tuple, which pickles ~10x faster than
    the dataclass; the rest as packed events. Order is kept."""
    out: list[Any] = []
    for event in events:
        if type(event) is StageUpdate and _plain(event):
            out.append((event.request_id, event.new_token_ids, event.num_cached_tokens))
        else:
            out.append(pack_event(event))
    return out


def decode_events(stage: str, encoded: list[Any]) -> list[StageEvent]:
    """The inverse of `encode_events`, for `stage`'s events."""
    return [
        StageUpdate(item[0], stage, item[1], item[2]) if type(item) is tuple else unpack_event(item)
        for item in encoded
    ]


def _plain(update: StageUpdate) -> bool:
    return not (
        update.tensors
        or update.audio is not None
        or update.sample_rate is not None
        or update.rows is not None
        or update.num_rows
        or update.new_codes
        or update.new_logprobs
    )


def _sendable(error: BaseException) -> BaseException:
    """The exception itself when it pickles (a ConfigError stays one), else its text."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def serve(
    conn: Connection, config: StageConfig, processors: Mapping[str, Processor], log_level: str
) -> None:
    """The child process's main: build the stage, then serve the parent until told to stop."""
    import torch

    # A terminal's Ctrl-C reaches the whole process group: the parent shuts the pipeline down
    # gracefully and tells this process when; a stage that died first would fail the requests
    # the parent is still finishing. SIGTERM still ends it (multiprocessing's exit terminates
    # daemonic children a parent left running, and then waits for them).
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    logging.basicConfig(level=log_level, format=f"%(levelname)s [{config.name}] %(message)s")
    torch.set_num_threads(config.num_threads)
    lock = threading.Lock()  # the forwarding thread and the command loop both send

    def send(message: tuple) -> None:
        with lock:
            conn.send(message)

    try:
        host = StageHost(config, processors, pack=_pack, resolve=_resolve)
    except BaseException as e:
        send(("failed", _sendable(e)))
        return
    gc_freeze.freeze_started()  # this process serves from now on
    device = host.engine.device
    send(("ready", {"pid": os.getpid(), "device": str(device)}))
    stopping = threading.Event()
    forward = threading.Thread(
        target=_forward, args=(host, send, stopping), name="omni-events", daemon=True
    )
    forward.start()
    try:
        _commands(conn, host, send, stopping)
    except (EOFError, OSError):
        pass  # the parent closed the pipe or is gone: nobody is left to serve
    finally:
        stopping.set()
        host.shutdown(timeout_s=STOP_S)
        forward.join(timeout=IDLE_WAIT_S * 4)
    # Served: leave without the interpreter's teardown of torch, the model and the frozen
    # start-up objects, which only delays the parent's shutdown.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _commands(conn: Connection, host: StageHost, send: Any, stopping: threading.Event) -> None:
    while not stopping.is_set():
        if not conn.poll(IDLE_WAIT_S):
            continue
        message = conn.recv()
        kind = message[0]
        if kind == "submit":
            host.submit([unpack_input(item) for item in message[1]])
        elif kind == "abort":
            host.abort(message[1])
        elif kind == "stats":
            try:
                stats = {**host.stats(), "pid": os.getpid()}
            except Exception as e:  # reported as the stage being down, not a dead process
                stats = {"stage": host.name, "error": f"stage {host.name!r}: stats failed: {e}"}
            send(("stats", message[1], stats))
        elif kind == "shutdown":
            return
        else:
            raise ValueError(f"stage {host.name!r}: unknown message {kind!r}")


def _forward(host: StageHost, send: Any, stopping: threading.Event) -> None:
    """The host's events to the parent as they come; its loop's death once, then stop."""
    try:
        while not stopping.is_set():
            try:
                events = host.poll(IDLE_WAIT_S)
            except RuntimeError as e:  # its loop died: report, then end the process
                if not stopping.is_set():
                    send(("died", host.loop_error or str(e)))
                    stopping.set()
                return
            if events:
                send(("events", encode_events(events)))
    except (EOFError, OSError):
        stopping.set()  # the parent is gone
