"""The processes backend (omni/backends/process_backend.py): every stage in a spawned process of
its own, driven through a pipe.

Greedy tokens equal transformers' generate, and the tiny Qwen2.5-Omni pipeline (the talker
streamed from the thinker, the audio streamed from the talker) gives the local backend's tokens,
codes and audio. A stage process ignores Ctrl-C (the parent stops it) and stops when told; one
killed mid-request fails its requests within seconds, naming the stage, and is replaced (up to
runtime.max_stage_restarts times; then later requests are refused); a stage that cannot start
raises its own ConfigError from the constructor; a caller that exits without shutdown stops
its stage processes on the way out, and one that starts a pipeline at import is told to guard
its entry point; `omni serve` on it streams the Python API's text and stops
its stage process at SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import torch
from helpers import OMNI_ON_CPU, cli_sets, on_cpu, python_path, transformers_greedy

from omni import AsyncOmni, Omni
from omni.config import ConfigError
from omni.core.sampling_params import SamplingParams
from omni.entrypoints.openai.prompts import chat_prompt
from tools.serve_process import ServeProcess

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROCESSES = {"backend": "processes", "log_level": "WARNING", "request_timeout_s": 60}


def test_tokens_equal_transformers_in_a_stage_process(qwen2_dir):
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [5, 6, 7, 8, 9, 10, 40, 41]]
    want = transformers_greedy(qwen2_dir, prompts, 12)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    omni = Omni(model=qwen2_dir, runtime=PROCESSES, **{"stages.llm.engine.device": "cpu"})
    try:
        process = omni.backend.stages["llm"].process
        got = [o.final.token_ids for o in omni.generate(prompts, params, use_tqdm=False)]
        assert got == want
        # Ctrl-C reaches the whole process group: the stage keeps serving (the parent stops it).
        os.kill(process.pid, signal.SIGINT)
        time.sleep(0.5)
        again = omni.generate(prompts[:1], params, use_tqdm=False)
        assert again[0].final.token_ids == want[0]
        stats = omni.stats()["llm"]
        assert stats["pid"] == process.pid != os.getpid()
        assert stats["steps"] > 0 and stats["device"] == "cpu"
    finally:
        started = time.monotonic()
        omni.shutdown()
    assert not process.is_alive() and process.exitcode == 0  # it stopped when told, not killed
    assert time.monotonic() - started < 5.0


def test_omni_pipeline_streams_what_the_local_backend_does(omni_dir):
    prompts = [{"prompt": "tell me about the sea"}, [5, 6, 7, 8]]
    params = [  # per stage: thinker, talker, token2wav
        SamplingParams(max_tokens=6, ignore_eos=True),
        SamplingParams(max_tokens=40, ignore_eos=True, stop_token_ids=(8292, 8294)),
        SamplingParams(max_tokens=1, seed=0),
    ]
    outputs = {}
    for backend in ("local", "processes"):
        runtime = {**PROCESSES, "backend": backend}
        with Omni(model=omni_dir, runtime=runtime, **OMNI_ON_CPU) as omni:
            outputs[backend] = omni.generate(prompts, params, use_tqdm=False, stream_audio=True)
    for local, separate in zip(outputs["local"], outputs["processes"], strict=True):
        assert local.error is None and separate.error is None, (local.error, separate.error)
        for stage in ("thinker", "talker"):
            assert local.stages[stage].token_ids == separate.stages[stage].token_ids, stage
        assert separate.final.audio.numel() > 0
        torch.testing.assert_close(local.final.audio, separate.final.audio, atol=1e-5, rtol=1e-4)


def test_a_killed_stage_process_fails_its_requests_and_is_replaced_once(qwen2_dir):
    params = SamplingParams(max_tokens=2000, ignore_eos=True)
    overrides = {"stages.llm.engine.device": "cpu", "stages.llm.engine.max_model_len": 4096}
    short = SamplingParams(max_tokens=4, ignore_eos=True)

    async def kill_mid_request(omni: AsyncOmni) -> str:
        """Kill the stage process while a request decodes; that request's error."""
        outputs = omni.generate([5, 6, 7], params)
        first = await anext(outputs)  # a step's snapshot: it is decoding
        assert first.error is None and not first.finished
        os.kill(omni._driver().backend.stages["llm"].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        last = first
        async for output in outputs:
            last = output
        assert time.monotonic() - killed_at < 5.0
        assert last.error is not None
        return last.error

    async def main() -> None:
        runtime = {**PROCESSES, "max_stage_restarts": 1}
        async with AsyncOmni(model=qwen2_dir, runtime=runtime, **overrides) as omni:
            first_pid = omni.stats()["llm"]["pid"]
            error = await kill_mid_request(omni)
            assert "stage 'llm': its process exited with code -9" in error, error
            # Replaced: a request sent while it restarts is held, then served.
            later = [output async for output in omni.generate([5, 6], short)][-1]
            assert later.error is None and len(later.final.token_ids) == 4
            stats = omni.stats()["llm"]
            assert stats["restarts"] == 1 and stats["pid"] != first_pid
            assert await omni.check_health() == []
            # Past runtime.max_stage_restarts: dead, and later requests are refused.
            await kill_mid_request(omni)
            with pytest.raises(RuntimeError, match="not restarted again"):
                await omni.check_health()
            with pytest.raises(RuntimeError, match="stage 'llm': its process exited"):
                async for _ in omni.generate([5, 6], short):
                    pass  # refused when added: the stage it needs is dead

    asyncio.run(asyncio.wait_for(main(), timeout=180))


EXIT_WITHOUT_SHUTDOWN = """
import atexit
import sys
from omni import Omni
from omni.core.sampling_params import SamplingParams
from omni.entrypoints.openai.prompts import chat_prompt
from tools.serve_process import ServeProcess

def report():  # registered first, so it runs after the exit hooks registered later (omni's)
    print("stages left", list(omni.backend.stages), flush=True)

if __name__ == "__main__":
    atexit.register(report)
    omni = Omni(model=sys.argv[1], runtime={"backend": "processes"},
                **{"stages.llm.engine.device": "cpu"})
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    print(omni.generate([[5, 6, 7]], params, use_tqdm=False)[0].final.token_ids)
    print("pid", omni.stats()["llm"]["pid"], flush=True)
"""


def test_a_caller_exiting_without_shutdown_stops_its_stage_processes(qwen2_dir, tmp_path):
    script = tmp_path / "leave.py"
    script.write_text(EXIT_WITHOUT_SHUTDOWN)
    env = {**os.environ, "PYTHONPATH": python_path(REPO)}
    run = subprocess.run(
        [sys.executable, str(script), qwen2_dir], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "stages left []" in run.stdout, run.stdout  # shut down before multiprocessing's exit
    assert "restarting" not in run.stderr and "died" not in run.stderr, run.stderr[-3000:]
    pid = int(run.stdout.split("pid ")[1].split()[0])
    assert not Path(f"/proc/{pid}").exists()  # stopped (and reaped), not left behind


def _stage_processes(pid: int) -> list[int]:
    """The live stage processes pid spawned (not multiprocessing's resource tracker), from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            child = f"\nPPid:\t{pid}\n" in status and "\nState:\tZ" not in status
            if child and b"spawn_main" in command:
                out.append(int(entry.name))
    return out


def test_omni_serve_on_stage_processes_streams_the_python_apis_tokens(qwen2_dir):
    messages = [{"role": "user", "content": "Tell me about foxes."}]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    with Omni(model=qwen2_dir, runtime={"backend": "local"}, **on_cpu("llm")) as lm:
        prompt = chat_prompt(lm.async_omni.prompt_processor.tokenizer, messages)
        (want,) = lm.generate([prompt], params, use_tqdm=False)
    args = ["--model", qwen2_dir, "--served-model-name", "lm", "--set", "runtime.backend=processes"]
    server = ServeProcess(args + cli_sets(on_cpu("llm"))).start()
    try:
        server.wait_ready()
        assert server.proc is not None
        (stage_pid,) = _stage_processes(server.proc.pid)  # the one stage's process
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="-", max_retries=0)
        stream = client.chat.completions.create(
            model="lm", messages=messages, max_tokens=8, stream=True,
            extra_body={"stage_sampling": {"llm": {"ignore_eos": True}}},
        )  # fmt: skip
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert text == want.final.text
    finally:
        assert server.stop() == 0, server.output()  # SIGTERM: a graceful shutdown
    assert not Path(f"/proc/{stage_pid}").exists()


def test_an_unguarded_script_gets_told_to_guard_its_entry_point(qwen2_dir, tmp_path):
    """Spawn imports the script in each stage process: one that starts a pipeline at import
    would start another there; the stage process fails, and the error says what to do."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import sys\nfrom omni import Omni\n"
        "Omni(model=sys.argv[1], runtime={'backend': 'processes'},"
        " **{'stages.llm.engine.device': 'cpu'})\n"
    )
    env = {**os.environ, "PYTHONPATH": python_path(REPO)}
    run = subprocess.run(
        [sys.executable, str(script), qwen2_dir], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert run.returncode != 0
    assert "stage 'llm': its process exited with code 1 while starting" in run.stderr
    assert 'must do so under `if __name__ == "__main__":`' in run.stderr


def test_a_stage_that_cannot_start_raises_its_config_error(qwen2_dir):
    overrides = {"stages.llm.engine.device": "cpu", "stages.llm.engine.num_blocks": 10**9}
    with pytest.raises(ConfigError, match=r"stages\.llm\.engine\.num_blocks=1000000000 needs"):
        Omni(model=qwen2_dir, runtime=PROCESSES, **overrides)
