"""run_server: load the pipeline, serve it with uvicorn until SIGINT/SIGTERM, shut the stages
down. Prints exactly one line, `omni: serving MODEL on http://HOST:PORT`, once the socket is
listening."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

from omni.entrypoints.openai.app import build_app
from omni.entrypoints.openai.args import ServerArgs
from omni.entrypoints.openai.realtime.events import MAX_EVENT_BYTES


class _Server(uvicorn.Server):
    """uvicorn re-raises a captured SIGTERM after shutting down (the process then dies of it);
    omni stops its stages first and exits 0, so the handlers only ask uvicorn to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting for open connections
        self.should_exit = True


def run_server(async_omni: Any, args: ServerArgs) -> int:
    """Serve `async_omni` (an AsyncOmni) until a signal; it is shut down on the way out."""
    try:
        app = build_app(async_omni, args)
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=10,
            # /v1/realtime: an event over MAX_EVENT_BYTES is an `error` event on an open
            # connection; only a frame over this limit closes it (1009, message too big).
            ws_max_size=4 * MAX_EVENT_BYTES,
        )
        server = _Server(config)
        return asyncio.run(_serve(server, args))
    finally:
        async_omni.shutdown()


async def _serve(server: _Server, args: ServerArgs) -> int:
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():  # e.g. the port is taken: uvicorn has logged why
            with contextlib.suppress(SystemExit):
                task.result()
            return 1
        await asyncio.sleep(0.02)
    port = args.port
    for s in getattr(server, "servers", []):
        for sock in getattr(s, "sockets", []) or []:
            port = sock.getsockname()[1]
    print(
        f"omni: serving {args.model_name} on http://{args.host}:{port}", file=sys.stderr, flush=True
    )
    try:
        await task
    except SystemExit as e:
        return int(e.code or 0)
    return 0
