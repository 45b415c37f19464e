"""The Qwen2.5-Omni thinker stage against transformers on the tiny checkpoint.

Oracle: ``Qwen2_5OmniForConditionalGeneration.generate(generation_mode="text")`` for the tokens and
the thinker's ``output_hidden_states`` ([0] = merged embeddings, [-1] = last layer after the norm)
for the per-token tensors, on inputs built independently by tools/omni_preprocess.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import all_outputs
from PIL import Image

from omni.config import load_config
from omni.core.sampling_params import SamplingParams
from omni.engine import StageEngine
from omni.messages import StageInput

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

MAX_TOKENS = 5
CHAT = "<|im_start|>user\n{mm}{text}<|im_end|>\n<|im_start|>assistant\n"
IMAGE = "<|vision_bos|><|IMAGE|><|vision_eos|>"
AUDIO = "<|audio_bos|><|AUDIO|><|audio_eos|>"
LONG = " and then please describe every single colour, shape, corner and edge you can see there"


@pytest.fixture(scope="module")
def omni_dir() -> str:
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("qwen2_5_omni", "tiny", 0))


@pytest.fixture(scope="module")
def proc(omni_dir):
    from stages.qwen2_5_omni.prompt_processor import OmniPromptProcessor

    return OmniPromptProcessor(omni_dir)


@pytest.fixture(scope="module")
def oracle(omni_dir):
    from transformers import Qwen2_5OmniForConditionalGeneration

    from tools.omni_preprocess import OmniPreprocessor

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(omni_dir, dtype=torch.float32)
    model.eval().thinker.generation_config.eos_token_id = None  # both sides: exactly MAX_TOKENS
    return model, OmniPreprocessor(omni_dir)


NUM_TINY_POOL_BLOCKS = 16  # blocks of 8: fewer than the three requests and their replies need


def _engine(omni_dir: str, **engine) -> StageEngine:
    engine = {"block_size": 8, "num_blocks": 96, "device": "cpu", **engine}  # as the oracle
    stage = {"name": "thinker", "model": omni_dir, "adapter": "qwen2_5_omni_thinker"}
    return StageEngine(
        all_outputs(load_config({"stages": [{**stage, "engine": engine}]}).stages[0])
    )


def _image(seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (84, 112, 3), dtype=np.uint8))  # 12 tokens


def _audio() -> tuple[np.ndarray, int]:
    return (np.sin(np.arange(16000) / 9.0) * 0.4, 16000)  # 1 s: 25 tokens


def _cases() -> dict[str, tuple[dict, str, dict]]:
    """name -> (our prompt, oracle text, oracle media)."""
    img, wav = _image(), _audio()
    text = "tell me what you notice"
    return {
        "text": ({"prompt": "hello there, tell me a story"}, "hello there, tell me a story", {}),
        "image": (
            {"prompt": text, "images": [img]},
            CHAT.format(mm=IMAGE, text=text),
            {"images": [img]},
        ),
        "audio": (
            {"prompt": text, "audio": [wav]},
            CHAT.format(mm=AUDIO, text=text),
            {"audios": [wav[0].astype(np.float32)]},
        ),
    }


def _reference(oracle, text: str, media: dict):
    """(input_ids, generated tokens, hidden_states[0] and [-1] over prompt + generated[:-1])."""
    model, pre = oracle
    inputs = pre(text, **media)
    with torch.inference_mode():
        out = model.generate(
            **pre.generate_kwargs(inputs),
            generation_mode="text",
            thinker_max_new_tokens=MAX_TOKENS,
            thinker_do_sample=False,
        )
        prompt_len = inputs["input_ids"].shape[1]
        fed = out[:, :-1]
        mm = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
        states = model.thinker(
            input_ids=fed, attention_mask=torch.ones_like(fed), output_hidden_states=True, **mm
        ).hidden_states
    return (
        inputs["input_ids"][0].tolist(),
        out[0, prompt_len:].tolist(),
        states[0][0],
        states[-1][0],
    )


def _rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.float() - ref.float()).norm() / ref.float().norm())


def _submit(engine, proc, request_id: str, prompt: dict) -> None:
    p = proc(request_id, prompt)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    engine.add_request(
        StageInput(request_id, p.prompt_token_ids, params, p.mm_inputs, p.cache_salt, p.extras)
    )


def _run(engine, proc, prompts: dict[str, dict]) -> dict:
    for request_id, prompt in prompts.items():
        _submit(engine, proc, request_id, prompt)
    return {r.request_id: r for r in engine.run_until_done()}


@pytest.fixture(scope="module")
def references(oracle):
    return {name: _reference(oracle, text, media) for name, (_, text, media) in _cases().items()}


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {"enable_prefix_caching": True},
        {"enable_prefix_caching": False},
        {"max_num_batched_tokens": 8},
        {"cuda_graphs": True, "max_num_seqs": 5},  # 3 decoding: padded to 4, run eagerly here
        {"cuda_graphs": True, "max_num_seqs": 5, "async_scheduling": True},
        # 3 decoding in a pool too small for them: preempted, the others padded meanwhile
        {"cuda_graphs": True, "max_num_seqs": 5, "num_blocks": NUM_TINY_POOL_BLOCKS},
    ],
    ids=["caching", "no-caching", "chunked", "padded-decode", "ahead", "padded-tiny-pool"],
)
def test_tokens_and_tensors_match_transformers(omni_dir, proc, references, engine_kwargs):
    engine = _engine(omni_dir, **engine_kwargs)
    prompts = {name: prompt for name, (prompt, _, _) in _cases().items()}
    for round_ in range(2):  # the second round hits the prefix cache where it is on
        results = _run(engine, proc, {f"{name}-{round_}": p for name, p in prompts.items()})
        for name in prompts:
            ids, tokens, embeds, hidden = references[name]
            result = results[f"{name}-{round_}"]
            assert result.prompt_token_ids == ids, name  # our processor == the HF-style one
            assert result.token_ids == tokens, name
            assert _rel_err(result.tensors["hidden_states"], hidden) < 1e-4, name
            assert _rel_err(result.tensors["inputs_embeds"], embeds) < 1e-4, name
            tiny = engine_kwargs.get("num_blocks") == NUM_TINY_POOL_BLOCKS  # the cache evicted
            if round_ == 1 and engine_kwargs.get("enable_prefix_caching", True) and not tiny:
                assert result.num_cached_tokens > 0, name
    if engine_kwargs.get("num_blocks") == NUM_TINY_POOL_BLOCKS:
        assert engine.stats()["preemptions"] > 0
    if engine_kwargs.get("cuda_graphs"):  # image and audio requests decode with mrope deltas
        assert engine.stats()["padded_rows"] > 0
        launched_ahead = engine.stats()["steps_launched_ahead"]
        assert (launched_ahead > 0) == engine_kwargs.get("async_scheduling", False)
        assert engine.runner.decode_graphs.suffix_sizes == []  # prompts always run eagerly
    engine.step()  # the runner hears of the last finished requests on the next step
    assert engine.model._mrope == {}  # released with the finished requests
    assert engine.model.encoder_runs == {"image": 1, "audio": 1}  # once per distinct item


def test_fully_cached_image_skips_the_encoder(omni_dir, proc):
    engine = _engine(omni_dir)
    adapter = engine.model
    prompt = {"prompt": "what is this" + LONG, "images": [_image(1)]}
    first = _run(engine, proc, {"a": prompt})["a"]
    assert adapter.encoder_runs["image"] == 1
    lookups = (adapter.encoder_cache.stats.hits, adapter.encoder_cache.stats.misses)
    second = _run(engine, proc, {"b": prompt})["b"]
    image = proc("x", prompt).mm_inputs[0]
    assert second.num_cached_tokens >= image.offset + image.length  # the whole span was a hit
    assert adapter.encoder_runs["image"] == 1  # not re-run ...
    assert (adapter.encoder_cache.stats.hits, adapter.encoder_cache.stats.misses) == lookups
    assert second.token_ids == first.token_ids  # ... and not even looked up
    for key in ("hidden_states", "inputs_embeds"):
        assert _rel_err(second.tensors[key], first.tensors[key]) < 1e-5
    # Another image of the same size: same token ids, but no hit reaches into its span.
    other = _run(engine, proc, {"c": {**prompt, "images": [_image(5)]}})["c"]
    assert other.prompt_token_ids == first.prompt_token_ids
    assert other.num_cached_tokens <= image.offset
    assert adapter.encoder_runs["image"] == 2
    assert _rel_err(other.tensors["inputs_embeds"], first.tensors["inputs_embeds"]) > 1e-3


def test_partial_image_hit_uses_encoder_cache(omni_dir, proc, oracle):
    engine = _engine(omni_dir)
    adapter = engine.model
    img = _image(2)
    _run(engine, proc, {"a": {"prompt": "first question here", "images": [img]}})
    runs, hits = adapter.encoder_runs["image"], adapter.encoder_cache.stats.hits
    question = "a different one"
    result = _run(engine, proc, {"b": {"prompt": question, "images": [img]}})["b"]
    image = proc("x", {"prompt": question, "images": [img]}).mm_inputs[0]
    # The hit (2 blocks of 8) ends inside the image's span [6, 18): its tail is fed again.
    assert image.offset < result.num_cached_tokens < image.offset + image.length
    assert adapter.encoder_runs["image"] == runs
    assert adapter.encoder_cache.stats.hits == hits + 1
    ids, tokens, embeds, hidden = _reference(
        oracle, CHAT.format(mm=IMAGE, text=question), {"images": [img]}
    )
    assert result.prompt_token_ids == ids and result.token_ids == tokens
    assert _rel_err(result.tensors["hidden_states"], hidden) < 1e-4
    assert _rel_err(result.tensors["inputs_embeds"], embeds) < 1e-4


def test_mrope_positions_equal_get_rope_index(omni_dir, proc, oracle):
    from stages.qwen2_5_omni.mrope import find_items

    model, _ = oracle
    engine = _engine(omni_dir)
    small = _image(3).resize((56, 70))
    prompt = {
        "prompt": "a <|IMAGE|> b <|AUDIO|> c <|IMAGE|> d",
        "images": [_image(4), small],
        "audio": [_audio()],
    }
    p = proc("r", prompt)
    items = find_items(p.mm_inputs, p.extras)
    positions, delta = engine.model.mrope_positions(items, p.extras)
    ids = torch.tensor([p.prompt_token_ids])
    ref, ref_delta = model.thinker.get_rope_index(
        ids,
        torch.tensor(np.stack(p.extras["image_grid_thw"])),
        None,
        torch.ones_like(ids),
        False,
        torch.tensor(p.extras["audio_feature_lengths"]),
    )
    assert torch.equal(positions, ref[:, 0, : positions.shape[1]])
    assert delta == int(ref_delta)
    tail = ref[:, 0, positions.shape[1] :]
    assert torch.equal(tail, torch.arange(positions.shape[1], ids.shape[1]).expand(3, -1) + delta)


def test_memory_profile_runs_the_encoders_on_the_largest_items(omni_dir, proc):
    """A GPU stage's memory profile runs each encoder once on the largest item a prompt can
    bring (stages/qwen2_5_omni/encoder_profile.py): no image the processor accepts encodes to
    more tokens (a square one to as many), the audio is the processor's longest (30 s); the
    cache and counters are left alone, and the encoder cache's bound is the adapter's reserve."""
    from stages.qwen2_5_omni.encoder_profile import largest_items

    adapter = _engine(omni_dir).model
    items = largest_items(adapter.model.config, adapter.max_image_pixels)
    largest = {m: adapter._tower(m, extras, 0).shape[0] for m, extras in items.items()}
    images = [Image.new("RGB", size, "red") for size in [(4000, 3000), (300, 2000), (900, 900)]]
    lengths = [proc("p", {"prompt": "x", "images": [i]}).mm_inputs[0].length for i in images]
    assert max(lengths) == largest["image"] and all(n <= largest["image"] for n in lengths)
    speech = (np.zeros(30 * 16000, dtype=np.float32), 16000)
    audio = proc("p", {"prompt": "x", "audio": [speech]}).mm_inputs[0]
    assert audio.length == largest["audio"]
    tower, ran = adapter._tower, []
    adapter._tower = lambda modality, extras, index: ran.append(
        (modality, tower(modality, extras, index).shape[0])
    )
    adapter.profile_extra_work()
    assert sorted(ran) == sorted(largest.items())  # each tower once, on its largest item
    assert adapter.encoder_runs == {} and len(adapter.encoder_cache) == 0
    assert adapter.reserved_bytes == adapter.encoder_cache.max_bytes == 256 << 20
