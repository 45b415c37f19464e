"""Run `omni serve` as a subprocess on 127.0.0.1 and a free port (tests, benchmarks).

    with ServeProcess(["--model", model_dir, "--set", "runtime.backend=local"]) as server:
        client = OpenAI(base_url=server.base_url + "/v1", api_key="-")

Start-up waits (bounded) for the server's `omni: serving ... on http://HOST:PORT` line; the
process's output is kept (`server.lines`) for failure messages.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READY = "omni: serving "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    def __init__(
        self, args: list[str], *, threads: int = 1, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.env = {
            **os.environ,
            "OMP_NUM_THREADS": str(threads),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            # The repo first, then the caller's path (packages installed with pip --target).
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
            ),
            **(env or {}),
        }
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()

    def start(self) -> ServeProcess:
        cmd = [sys.executable, "-m", "omni.entrypoints.cli", "serve", *self.args]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith(READY):
                self._ready.set()

    def wait_ready(self, timeout: float = 120.0) -> ServeProcess:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"omni serve exited {self.proc.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"omni serve not ready after {timeout} s:\n{self.output()}")
        return self

    def output(self) -> str:
        return "\n".join(self.lines[-60:])

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; SIGKILL if it does not stop in time. The exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)

    def __enter__(self) -> ServeProcess:
        return self.start().wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()
