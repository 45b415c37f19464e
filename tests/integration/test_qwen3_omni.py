"""The Qwen3-Omni pipeline (thinker -> talker -> code2wav, local backend) against
`Qwen3OmniMoeForConditionalGeneration.generate` on CPU float32 greedy: thinker tokens, every code
group of every frame and the waveform are equal (torch.equal), for text, image, audio and
image+audio prompts and each speaker of the checkpoint, with prefix caching on (a second round
hits in thinker and talker) and off, and with KV pools so small that requests are preempted and
blocks evicted.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from omni import Omni
from omni.config import config_for_model
from omni.core.sampling_params import SamplingParams
from tests.integration.qwen3_omni_reference import load_hf, run_generate

pytestmark = pytest.mark.slow

THINKER_TOKENS, TALKER_TOKENS = 6, 12
TEXT = "tell me what you notice in it, with every colour and every shape you can see there"
SYSTEM = "<|im_start|>system\nbe brief<|im_end|>\n"
STAGES = ("thinker", "talker", "code2wav")
ON_CPU = {f"stages.{s}.engine.device": "cpu" for s in STAGES}
RUNTIME = {"backend": "local", "return_tensors": "all"}  # the talker's tensors["codes"] too
# transformers' thinker stops on id 151645 (outside the tiny vocabulary): exactly THINKER_TOKENS.
PARAMS = [
    SamplingParams(max_tokens=THINKER_TOKENS, ignore_eos=True),
    SamplingParams(max_tokens=TALKER_TOKENS),
    SamplingParams(max_tokens=1),
]


def _prompts() -> dict[str, dict]:
    """One case per input kind, each with another speaker (text: the default, "Ethan")."""
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (84, 112, 3), np.uint8))
    audio = (np.sin(np.arange(16000) / 9.0) * 0.4, 16000)
    return {
        "text": {"prompt": SYSTEM + f"<|im_start|>user\n{TEXT}<|im_end|>\n<|im_start|>assistant\n"},
        "image": {"prompt": TEXT, "images": [image], "speaker": "Chelsie"},
        "audio": {"prompt": TEXT, "audio": [audio], "speaker": "aiden"},
        # transformers' talker crashes here unless given the thinker's audio config (below)
        "image+audio": {"prompt": TEXT, "images": [image], "audio": [audio], "speaker": "chelsie"},
    }


@pytest.fixture(scope="module")
def qwen3_dir(one_torch_thread):
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("qwen3_omni_moe", "tiny"))


@pytest.fixture(scope="module")
def references(qwen3_dir):
    from stages.qwen3_omni_moe.prompt_processor import Qwen3OmniPromptProcessor

    model = load_hf(qwen3_dir)
    processor = Qwen3OmniPromptProcessor(qwen3_dir)
    refs = {}
    for name, prompt in _prompts().items():
        inputs = processor(name, prompt)
        if name == "image+audio":  # the one attribute its talker lacks (docs/qwen3_omni.md)
            model.talker.config.audio_config = model.config.thinker_config.audio_config
        refs[name] = run_generate(
            model, inputs.prompt_token_ids, dict(inputs.extras),
            thinker_tokens=THINKER_TOKENS, talker_tokens=TALKER_TOKENS,
            speaker=prompt.get("speaker", "Ethan"),
        )  # fmt: skip
    return refs


def test_transformers_talker_crashes_on_image_and_audio(qwen3_dir):
    """Why omni supplies the thinker's audio config to its talker: without it, transformers'
    generate fails on a prompt with both an image and audio."""
    from stages.qwen3_omni_moe.prompt_processor import Qwen3OmniPromptProcessor

    inputs = Qwen3OmniPromptProcessor(qwen3_dir)("x", _prompts()["image+audio"])
    with pytest.raises(AttributeError, match="no attribute 'audio_config'"):
        run_generate(load_hf(qwen3_dir), inputs.prompt_token_ids, dict(inputs.extras),
                     thinker_tokens=2, talker_tokens=2, speaker="Ethan")  # fmt: skip


def _check(out, ref, name: str) -> None:
    assert out.error is None, out.error
    _check_stages(out.stages, ref, name)


def _check_stages(stages: dict, ref, name: str) -> None:
    assert stages["thinker"].prompt_token_ids == ref.prompt_ids, name
    assert stages["thinker"].token_ids == ref.thinker_ids, name
    talker = stages["talker"]
    assert talker.token_ids == ref.layer0, name
    codes = talker.tensors["codes"]
    assert codes.dtype == torch.int64 and codes.shape == (len(ref.layer0), len(ref.frames[0]))
    assert codes[:-1].tolist() == ref.frames, name  # generate never decodes the last frame
    assert stages["code2wav"].sample_rate == 24000
    assert torch.equal(stages["code2wav"].audio, ref.wav), name
    assert float(ref.wav.abs().max()) > 0.05  # audio, not near-silence


def test_speakers_differ(references):
    """Each case speaks with another voice: the codes depend on the speaker (else the speaker
    cases would test nothing)."""
    frames = [tuple(map(tuple, r.frames)) for r in references.values()]
    assert len(set(frames)) == len(frames)


# padded: the thinker's and talker's decode steps run their CUDA-graph bodies (padded batches,
# mrope deltas on every row, grouped_mm experts; the talker's frame inputs built before its
# body), eagerly here; chunked prompts join the decode batch one by one, so 3 rows pad to 4 of
# the ladder [1, 2, 4, 6]. ahead: the thinker's steps also launch one ahead.
PADDED = {"cuda_graphs": True, "max_num_seqs": 6, "max_num_batched_tokens": 48}


@pytest.mark.parametrize(
    "caching, thinker",
    [(True, {}), (False, {}), (True, PADDED), (True, {**PADDED, "async_scheduling": True})],
    ids=["caching", "no-caching", "padded-decode", "ahead"],
)
def test_pipeline_equals_transformers(qwen3_dir, references, caching, thinker):
    overrides = {**ON_CPU}
    for stage in ("thinker", "talker"):
        overrides[f"stages.{stage}.engine.enable_prefix_caching"] = caching
        overrides[f"stages.{stage}.engine.block_size"] = 4
    for key, value in thinker.items():  # both stages (the talker's frames fed from the device)
        overrides[f"stages.thinker.engine.{key}"] = value
        overrides[f"stages.talker.engine.{key}"] = value
    prompts = _prompts()
    with Omni(model=qwen3_dir, runtime=RUNTIME, **overrides) as omni:
        rounds = [omni.generate(list(prompts.values()), PARAMS, use_tqdm=False) for _ in range(2)]
        engine = omni.backend.hosts["thinker"].engine
        assert engine.model.encoder_runs == {"image": 1, "audio": 1}  # once per distinct item
        stats = engine.stats()
        assert (stats.get("padded_rows", 0) > 0) == bool(thinker), stats
        assert (stats["steps_launched_ahead"] > 0) == ("async_scheduling" in thinker), stats
        talker = omni.backend.hosts["talker"].engine
        assert (talker.stats().get("padded_rows", 0) > 0) == bool(thinker), talker.stats()
        ahead = talker.stats()["steps_launched_ahead"]
        assert (ahead > 0) == ("async_scheduling" in thinker), talker.stats()
        # Greedy frames' residual codes through the padded predictor graphs' buffers.
        assert (talker.model._predictor.num_replayed > 0) == bool(thinker)
        hits = {
            s: omni.backend.hosts[s].engine.stats()["kv_hit_tokens"] for s in ("thinker", "talker")
        }
    for round_, outputs in enumerate(rounds):
        for name, out in zip(prompts, outputs, strict=True):
            _check(out, references[name], name)
            for stage in ("thinker", "talker"):
                cached = out.stages[stage].num_cached_tokens
                # image+audio starts as the image prompt does: it may hit that one's blocks
                if not (name == "image+audio" and round_ == 0):
                    assert (cached > 0) == (caching and round_ == 1), (name, stage, round_)
    assert all((n > 0) == caching for n in hits.values()), hits


def _stage_by_stage(config, prompts: list[dict]) -> tuple[list[dict], dict]:
    """The pipeline by hand (each stage's engine, the family's edges), every stage given all its
    requests before its first step. Through Omni the stages' overlap, hence whether a tiny pool
    preempts, would depend on thread timing (the driver routes each finished request as it comes,
    and shared stages take turns by measured time); here it is fixed."""
    from omni.engine.generation_engine import GenerationEngine
    from omni.engine.stage_engine import StageEngine
    from omni.messages import StageInput
    from omni.registry import get_input_processor, get_prompt_processor

    root = config.stages[0]
    processor = get_prompt_processor(root.adapter)(root.model)
    inputs = {f"r{i}": processor(f"r{i}", prompt) for i, prompt in enumerate(prompts)}
    results: dict[str, dict] = {request_id: {} for request_id in inputs}
    stats = {}
    for stage, params in zip(config.stages, PARAMS, strict=True):
        engine = (GenerationEngine if stage.kind == "generation" else StageEngine)(stage)
        for request_id, prompt in inputs.items():
            if stage.input_processor is None:
                engine.add_request(StageInput(request_id, list(prompt.prompt_token_ids), params,
                                              prompt.mm_inputs, extras=dict(prompt.extras)))  # fmt: skip
            else:
                edge = get_input_processor(stage.input_processor)
                upstream = {name: results[request_id][name] for name in stage.inputs}
                stage_input = edge(upstream, prompt)
                engine.add_request(dataclasses.replace(stage_input, sampling_params=params))
        for result in engine.run_until_done():
            results[result.request_id][stage.name] = result
        stats[stage.name] = engine.stats()
    return [results[request_id] for request_id in inputs], stats


@pytest.mark.parametrize("padded", [False, True], ids=["eager", "padded-decode"])
def test_tiny_kv_pool_preempts_and_stays_equal(qwen3_dir, references, padded):
    """Pools of a few blocks: requests are preempted (their prompt blocks evicted and
    recomputed), the talker refeeds whole frames from the codes the engine kept; padded, the
    others decode on through the ladder (and the predictor's padded buffers) meanwhile."""
    overrides = {**ON_CPU}
    for stage in ("thinker", "talker"):  # 34 blocks of 4: two prompts fit, not their replies
        overrides[f"stages.{stage}.engine.block_size"] = 4
        overrides[f"stages.{stage}.engine.num_blocks"] = 34
        overrides[f"stages.{stage}.engine.max_model_len"] = 128
        if padded:
            overrides.update({f"stages.{stage}.engine.{k}": v for k, v in PADDED.items()})
    prompts = _prompts()
    outputs, stats = _stage_by_stage(config_for_model(qwen3_dir, overrides), list(prompts.values()))
    for name, stages in zip(prompts, outputs, strict=True):
        _check_stages(stages, references[name], name)
    assert stats["thinker"]["preemptions"] > 0 and stats["talker"]["preemptions"] > 0, stats
    assert stats["thinker"]["kv_evictions"] > 0, stats
    for stage in ("thinker", "talker"):  # (2 fit at once: batches 1 and 2, no padding rows)
        assert (stats[stage].get("padded_decode_steps", 0) > 0) == padded, stats[stage]


def test_first_token_eos_gives_empty_audio(qwen3_dir, references):
    """transformers crashes when the thinker's first token ends it or the talker's first code is
    codec EOS; omni answers with empty audio (and the text)."""
    ref = references["text"]
    prompt = _prompts()["text"]
    stop_thinker = SamplingParams(max_tokens=THINKER_TOKENS, stop_token_ids=[ref.thinker_ids[0]])
    stop_talker = SamplingParams(max_tokens=TALKER_TOKENS, stop_token_ids=[ref.layer0[0]])
    with Omni(model=qwen3_dir, runtime=RUNTIME, **ON_CPU) as omni:
        (silent,) = omni.generate([prompt], [stop_thinker, *PARAMS[1:]], use_tqdm=False)
        (no_frames,) = omni.generate([prompt], [PARAMS[0], stop_talker, PARAMS[2]], use_tqdm=False)
        eos = omni.backend.hosts["talker"].engine.model.eos_token_id
    assert silent.error is None and silent.stages["thinker"].token_ids == ref.thinker_ids[:1]
    assert silent.stages["talker"].token_ids == [eos]
    assert no_frames.error is None and no_frames.stages["talker"].token_ids == ref.layer0[:1]
    for out in (silent, no_frames):
        assert out.final.audio.numel() == 0


def test_chat_second_turn_hits_thinker_and_talker(qwen3_dir):
    """Omni.chat frames the conversation; the second turn's thinker prompt extends the first,
    and the talker's prompt (the user turns) too: both stages serve it from the prefix cache.
    The default voice is "Ethan" (transformers' default)."""
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": TEXT}]
    with Omni(model=qwen3_dir, runtime=RUNTIME, **ON_CPU) as omni:
        assert omni.async_omni.voices == ["aiden", "chelsie", "ethan"]
        (one,) = omni.chat([first], PARAMS, use_tqdm=False)
        reply = one.stages["thinker"].text
        second = [
            *first,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": TEXT},
        ]
        (two,) = omni.chat([second], PARAMS, use_tqdm=False)
    assert one.error is None and two.error is None
    assert one.final.audio.numel() > 0 and two.final.audio.numel() > 0
    for stage in ("thinker", "talker"):
        assert one.stages[stage].num_cached_tokens == 0
        assert two.stages[stage].num_cached_tokens >= 16, stage


def test_omni_run_output_wav(qwen3_dir, tmp_path, capsys):
    """`omni run --model DIR --output-wav` writes the waveform Omni.generate gives the prompt."""
    from omni.audio import write_wav
    from omni.entrypoints.cli import main

    sets = {**ON_CPU, "stages.thinker.sampling.max_tokens": THINKER_TOKENS,
            "stages.talker.sampling.max_tokens": TALKER_TOKENS}  # fmt: skip
    path = tmp_path / "out.wav"
    argv = ["run", "--model", qwen3_dir, "--prompt", TEXT, "--output-wav", str(path),
            "--set", "runtime.backend=local"]  # fmt: skip
    assert main(argv + [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]) == 0
    assert "out.wav" in capsys.readouterr().out
    with Omni(model=qwen3_dir, runtime={"backend": "local"}, **sets) as omni:
        (ref,) = omni.generate([{"prompt": TEXT}], use_tqdm=False)
    assert ref.error is None and ref.final.audio.numel() > 0 and ref.final.sample_rate == 24000
    write_wav(tmp_path / "ref.wav", ref.final.audio, 24000)
    assert path.read_bytes() == (tmp_path / "ref.wav").read_bytes()  # one process: same floats


def test_memory_profile_runs_the_encoders_on_the_largest_items(qwen3_dir):
    """As the Qwen2.5-Omni thinker's (tests/integration/test_omni_thinker.py): the profile runs
    each encoder once on the largest item a prompt can bring, and leaves the cache alone."""
    from omni.engine.stage_engine import StageEngine
    from omni.registry import get_prompt_processor
    from stages.qwen2_5_omni.encoder_profile import largest_items

    config = config_for_model(qwen3_dir, overrides=ON_CPU)
    engine = StageEngine(config.stages[0])
    adapter = engine.model
    items = largest_items(adapter.model.config, adapter.max_image_pixels)
    largest = {m: adapter._tower(m, extras, 0).shape[1] for m, extras in items.items()}
    proc = get_prompt_processor(config.stages[0].adapter)(qwen3_dir)
    images = [Image.new("RGB", size, "red") for size in [(4000, 3000), (300, 2000), (900, 900)]]
    lengths = [proc("p", {"prompt": "x", "images": [i]}).mm_inputs[0].length for i in images]
    assert max(lengths) == largest["image"] and all(n <= largest["image"] for n in lengths)
    speech = (np.zeros(30 * 16000, dtype=np.float32), 16000)
    assert proc("p", {"prompt": "x", "audio": [speech]}).mm_inputs[0].length == largest["audio"]
    longer = (np.zeros(45 * 16000, dtype=np.float32), 16000)
    with pytest.raises(ValueError, match="longer than 30.0 s"):  # so 30 s is the largest
        proc("p", {"prompt": "x", "audio": [longer]})
    tower, ran = adapter._tower, []
    adapter._tower = lambda modality, extras, index: (
        ran.append(modality) or tower(modality, extras, index)
    )
    adapter.profile_extra_work()
    assert sorted(ran) == ["audio", "image"]
    assert adapter.encoder_runs == {} and len(adapter.encoder_cache) == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_bfloat16_stages_speak(qwen3_dir, stream):
    """bfloat16 thinker and talker (a GPU stage's default dtype), whole and streamed: the
    thinker's bfloat16 rows reach the talker through the edge (numpy has no bfloat16, so the
    edge keeps them in torch; through numpy every request failed in the talker's input)."""
    overrides = {**ON_CPU, **{f"stages.{s}.engine.dtype": "bfloat16" for s in STAGES[:2]}}
    prompts = list(_prompts().values())[:2]  # text, and an image (the talker's hidden rows)
    with Omni(model=qwen3_dir, runtime=RUNTIME, **overrides) as omni:
        if stream:  # Omni.stream: each stage's pieces; the last, code2wav's finished result
            results = [list(omni.stream([p], PARAMS, stream_audio=True)) for p in prompts]
            finals = [pieces[-1] for pieces in results]
        else:
            outputs = omni.generate(prompts, PARAMS, use_tqdm=False)
            for out in outputs:
                assert out.stages["thinker"].tensors["inputs_embeds"].dtype == torch.bfloat16
                assert len(out.stages["talker"].token_ids) > 0
            finals = [out.final for out in outputs]
        stats = omni.stats()
    assert stats["thinker"]["dtype"] == stats["talker"]["dtype"] == "bfloat16"
    for final in finals:
        assert final.error is None, final.error
        assert final.stage == "code2wav" and final.finished and final.audio.numel() > 0
