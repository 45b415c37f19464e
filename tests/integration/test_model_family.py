"""A new model family is its package plus one line, and nothing else in omni/.

The family here is a throwaway package written to tmp_path: a manifest (an adapter that reuses the
causal-LM model class under the family's own name, an edge reusing hidden_to_embeds, a prompt
processor with one voice, a claimed model_type, a sample rate, and a stage config shipped in the
package). Its one line is an `omni.model_families` entry point, the form an installed package
uses for the line a family in this repository adds to omni/registry.py's FAMILIES. A fresh
interpreter finds it: `config_for_model` picks its pipeline, `Omni(model=DIR)` runs it, and the
family's stage gives transformers' greedy tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import python_path, transformers_greedy

from omni import registry
from omni.config import config_for_model

REPO = Path(__file__).resolve().parents[2]
PROMPT = [5, 9, 14, 3, 27, 8]
NUM_TOKENS = 4

MANIFEST = """
from omni.family import AdapterSpec, EdgeSpec, ModelFamily

FAMILY = ModelFamily(
    name="tinyfam",
    adapters=(
        AdapterSpec(
            "tinyfam_lm",
            "tinyfam.adapter:TinyLMAdapter",
            model_types=("llama",),
            requires_causal_lm=True,
        ),
    ),
    edges=(EdgeSpec("tinyfam_to_embeds", "stages.two_stage:hidden_to_embeds"),),
    prompt_processor="tinyfam.prompts:TinyPromptProcessor",
    model_types=("llama",),
    stage_config="tinyfam",
    sample_rate=16000,
)
"""
ADAPTER = """
from stages.causal_lm import CausalLMAdapter


class TinyLMAdapter(CausalLMAdapter):
    '''The causal-LM adapter under the family's own name.'''
"""
PROMPTS = """
from omni.engine.prompt_processor import PromptProcessor


class TinyPromptProcessor(PromptProcessor):
    def __init__(self, model_dir: str) -> None:
        super().__init__(model_dir)
        self.voices = ["tiny"]
"""
STAGE = f"""
    engine: {{block_size: 16, num_blocks: 32, max_num_seqs: 2, max_model_len: 128, device: cpu}}
    resources: {{num_cpus: 1}}
    sampling: {{temperature: 0.0, max_tokens: {NUM_TOKENS}, ignore_eos: true}}
"""
STAGE_CONFIG = f"""
runtime: {{backend: local}}
stages:
  - name: lm
    model: ${{MODEL}}
    adapter: tinyfam_lm{STAGE}
  - name: embeds
    model: ${{MODEL}}
    adapter: embeds_lm
    inputs: [lm]
    input_processor: tinyfam_to_embeds{STAGE}
"""
ENTRY_POINT = "[omni.model_families]\ntinyfam = tinyfam.family\n"  # the one line (and its section)

RUN = """
import json, sys
from omni import Omni, registry
from omni.config import config_for_model

model = sys.argv[1]
config = config_for_model(model)
with Omni(model=model) as llm:
    (out,) = llm.generate({"prompt_token_ids": json.loads(sys.argv[2])}, use_tqdm=False)
    async_omni = llm.async_omni
    print(json.dumps({
        "family": registry.family_for_model_type("llama").name,
        "stages": [(s.name, s.adapter, s.input_processor) for s in config.stages],
        "processor": type(async_omni.prompt_processor).__name__,
        "voices": async_omni.voices,
        "sample_rate": async_omni.sample_rate,
        "tokens": {name: list(r.token_ids) for name, r in out.stages.items()},
        "embeds_prompt": list(out.stages["embeds"].prompt_token_ids),
        "error": out.error,
    }))
"""


def _write_family(site: Path) -> None:
    package = site / "tinyfam"
    package.mkdir(parents=True)
    files = {
        "__init__.py": '"""A throwaway model family."""\n',
        "family.py": MANIFEST,
        "adapter.py": ADAPTER,
        "prompts.py": PROMPTS,
        "tinyfam.yaml": STAGE_CONFIG,
    }
    for name, text in files.items():
        (package / name).write_text(textwrap.dedent(text).lstrip())
    dist = site / "tinyfam-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyfam\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINT)


def test_a_new_family_is_its_package_plus_one_line(tmp_path, llama_dir):
    # Without the line, a llama checkpoint gets the causal-LM fallback.
    assert registry.family_for_model_type("llama") is None
    assert [s.adapter for s in config_for_model(llama_dir).stages] == ["causal_lm"]
    site = tmp_path / "site"
    _write_family(site)
    env = {**os.environ, "PYTHONPATH": python_path(site, REPO)}
    done = subprocess.run(
        [sys.executable, "-c", RUN, llama_dir, json.dumps(PROMPT)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    (expected,) = transformers_greedy(llama_dir, [PROMPT], NUM_TOKENS)
    assert got["error"] is None
    assert got["family"] == "tinyfam"
    assert got["stages"] == [
        ["lm", "tinyfam_lm", None],
        ["embeds", "embeds_lm", "tinyfam_to_embeds"],
    ]
    assert got["processor"] == "TinyPromptProcessor" and got["voices"] == ["tiny"]
    assert got["sample_rate"] == 16000
    assert got["tokens"]["lm"] == expected
    # The family's edge fed the second stage what the first fed through its model.
    assert got["embeds_prompt"] == PROMPT + expected[:-1]
    assert len(got["tokens"]["embeds"]) == NUM_TOKENS
