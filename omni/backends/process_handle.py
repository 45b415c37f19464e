"""ProcessHandle: the caller's side of one stage process (omni/backends/stage_process.py is the
process's side): spawn it and wait until its stage is built, send it messages, read what it
sends on a thread of its own, and stop it.

Invariants:
- one thread reads the pipe (the reader); any thread may send, one at a time (`_send_lock`);
- one thread at a time waits for the process (`_wait_lock`): two threads reaping one child race
  (the loser's waitpid fails, and multiprocessing then takes the reaped child for alive);
- `on_exit` is called once, from the reader, when the process's pipe closes or its loop died,
  unless `stop` was called first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from omni.backends.stage_process import serve
from omni.config import StageConfig
from omni.host import Processor

logger = logging.getLogger(__name__)

JOIN_S = 10.0  # longest wait for a stage process to stop when asked
WAIT_S = 0.5  # how often a wait re-checks that the stage process is still there


class ProcessHandle:
    def __init__(
        self,
        context: Any,  # multiprocessing's spawn context
        config: StageConfig,
        processors: Mapping[str, Processor],
        log_level: str,
        on_message: Callable[[tuple], None],
        on_exit: Callable[[ProcessHandle, str], None],
    ) -> None:
        self.name = config.name
        self._on_message, self._on_exit = on_message, on_exit
        self._send_lock = threading.Lock()
        self._wait_lock = threading.Lock()
        self._stopped = False
        self.info: dict[str, Any] = {}  # the process's "ready" message: pid, device
        self.conn, child_conn = context.Pipe(duplex=True)
        self.process = context.Process(
            target=serve,
            args=(child_conn, config, dict(processors), log_level),
            name=f"omni-{self.name}",
            daemon=True,
        )
        self.process.start()
        child_conn.close()  # ours closed: the child's exit shows as EOF on our end
        self._reader = threading.Thread(target=self._read, name=f"omni-{self.name}-reader")
        self._reader.daemon = True

    def wait_ready(self, timeout_s: float) -> None:
        """Until the stage is built; then its messages flow to on_message. Raises the stage's
        own error (a ConfigError stays one) when it failed to build, and a RuntimeError or
        TimeoutError when the process died or took too long; the process is then gone."""
        deadline = time.monotonic() + timeout_s
        try:
            while not self.conn.poll(WAIT_S):
                if not self.process.is_alive():
                    raise self._exited_while_starting()
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"stage {self.name!r}: not started within {timeout_s:g} s "
                        "(runtime.request_timeout_s)"
                    )
            try:
                message = self.conn.recv()
            except EOFError:  # it exited before saying anything
                raise self._exited_while_starting() from None
            if message[0] == "failed":
                raise message[1]
        except BaseException:
            self.stop()
            raise
        self.info = message[1]
        self._reader.start()

    def _exited_while_starting(self) -> RuntimeError:
        with self._wait_lock:
            self.process.join(timeout=JOIN_S)
            code = self.process.exitcode
        return RuntimeError(
            f"stage {self.name!r}: its process exited with code {code} while starting (its log "
            "above says why). If that log is multiprocessing's about bootstrapping: a script "
            "that starts a pipeline on runtime.backend processes must do so under "
            '`if __name__ == "__main__":`, since each stage process imports the script first'
        )

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, message: tuple, *, quiet: bool = False) -> None:
        """To the process; a pipe that broke is the reader's to report."""
        try:
            with self._send_lock:
                self.conn.send(message)
        except (OSError, ValueError) as e:
            if not quiet:
                logger.warning("stage %r: send failed (%s); its process is gone", self.name, e)

    def stop(self) -> None:
        """Ask the process to stop, wait for it (killed after JOIN_S), close the pipe."""
        self._stopped = True
        self.send(("shutdown",), quiet=True)  # (a process that died has closed its end)
        with self._wait_lock:
            self.process.join(timeout=JOIN_S)
            if self.process.is_alive():
                logger.warning("stage %r: did not stop within %g s; killed", self.name, JOIN_S)
                self.process.kill()
                self.process.join(timeout=JOIN_S)
        self.conn.close()
        if self._reader.is_alive() and self._reader is not threading.current_thread():
            self._reader.join(timeout=JOIN_S)

    def _read(self) -> None:
        why = f"stage {self.name!r}: its process exited"
        try:
            while True:
                message = self.conn.recv()
                if message[0] == "died":
                    why = message[1]
                    break
                self._on_message(message)
        except (EOFError, OSError):
            if self._stopped:
                return  # stop's own join reaps it
            with self._wait_lock:
                self.process.join(timeout=WAIT_S)
                code = self.process.exitcode
            why += "" if code is None else f" with code {code}"
        if not self._stopped:
            self._on_exit(self, why)
