"""Our engine's greedy tokens equal transformers' model.generate, prompt by prompt, under every
cache configuration: prefix caching on/off, eviction and preemption, chunked prefill, block sizes."""

import pytest
from helpers import make_engine, run_engine, shared_prefix_prompts, transformers_greedy

from omni.core.sampling_params import SamplingParams

pytestmark = pytest.mark.slow
MAX_NEW = 16
GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)

CONFIGS = {
    "caching-on": {"block_size": 4},
    "caching-off": {"block_size": 4, "enable_prefix_caching": False},
    "block-size-1": {"block_size": 1, "num_blocks": 4096},
    "block-size-16": {"block_size": 16},
    "chunked-prefill": {"block_size": 4, "max_num_batched_tokens": 24},
    "tiny-pool": {"block_size": 4, "num_blocks": 48, "max_model_len": 192},
    "tiny-pool-chunked": {
        "block_size": 4,
        "num_blocks": 40,
        "max_num_batched_tokens": 16,
        "max_model_len": 160,
    },
    # Decode steps padded to the CUDA-graph ladder (1, 2, 4, 5 / 1, 2, 4, 6), run eagerly here.
    "padded-decode": {"block_size": 4, "cuda_graphs": True, "max_num_seqs": 5},
    "padded-tiny-pool": {
        "block_size": 4,
        "num_blocks": 48,
        "max_model_len": 192,
        "cuda_graphs": True,
        "max_num_seqs": 6,
    },
    # The ladder capped below max_num_seqs (1, 2, 4): larger decode batches run eagerly.
    "padded-capped": {
        "block_size": 4,
        "cuda_graphs": True,
        "max_num_seqs": 6,
        "max_graph_batch": 4,
    },
}


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def family_case(request, qwen2_dir, llama_dir):
    model_dir = qwen2_dir if request.param == "qwen2" else llama_dir
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    prompts = shared_prefix_prompts(vocab)
    return model_dir, prompts, transformers_greedy(model_dir, prompts, MAX_NEW)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tokens_equal_transformers(family_case, name):
    model_dir, prompts, expected = family_case
    engine = make_engine(model_dir, **CONFIGS[name])
    padded_preempting, eager_decode_sizes = _record_padded_steps(engine)
    results = run_engine(engine, prompts, GREEDY)
    for prompt_index, (result, want) in enumerate(zip(results, expected, strict=True)):
        assert result.token_ids == want, f"{name}: prompt {prompt_index} differs"
    stats = engine.stats()
    if "tiny-pool" in name:
        assert stats["preemptions"] > 0 and stats["kv_evictions"] > 0, stats
    if name.startswith("padded"):  # pure decode steps took the ladder, some with padding rows
        assert stats["padded_decode_steps"] > 0 and stats["padded_rows"] > 0, stats
        assert stats["eager_steps"] > 0, stats  # prefill and recompute stay eager
    else:
        assert "padded_rows" not in stats
    if name == "padded-tiny-pool":  # a request preempted in a step whose others ran padded
        assert padded_preempting, stats
    if name == "padded-capped":  # above the capped ladder's top, and only there, steps run eager
        assert engine.runner.decode_graphs.batch_sizes == [1, 2, 4]
        assert eager_decode_sizes and min(eager_decode_sizes) > 4, eager_decode_sizes
    elif name.startswith("padded"):
        assert not eager_decode_sizes, eager_decode_sizes
    if name == "caching-off":
        assert all(r.num_cached_tokens == 0 for r in results)
    else:
        assert stats["kv_hit_tokens"] > 0


def _record_padded_steps(engine) -> tuple[list[int], list[int]]:
    """Per launched step, watching the padded path: the padding rows of each step that preempted
    a request and ran the rest padded; the batch size of each step that decoded one token per
    request but did not run padded."""
    padded_preempting: list[int] = []
    eager_decode_sizes: list[int] = []
    graphs, launch = engine.runner.decode_graphs, engine.runner.launch

    def recording(scheduler_output, *args):
        num_padded, padded_rows = graphs.num_padded_steps, graphs.num_padded_rows
        launched = launch(scheduler_output, *args)
        if scheduler_output.preempted_request_ids and graphs.num_padded_rows > padded_rows:
            padded_preempting.append(graphs.num_padded_rows - padded_rows)
        scheduled = scheduler_output.scheduled
        decode = scheduled and all(len(e.token_ids) == 1 and e.sample for e in scheduled)
        if decode and graphs.num_padded_steps == num_padded:
            eager_decode_sizes.append(len(scheduled))
        return launched

    if graphs is not None:
        engine.runner.launch = recording
    return padded_preempting, eager_decode_sizes


def test_second_round_is_served_by_the_cache(family_case):
    model_dir, prompts, expected = family_case
    engine = make_engine(model_dir, block_size=4)
    run_engine(engine, prompts, GREEDY, prefix="first")
    second = run_engine(engine, prompts, GREEDY, prefix="second")
    for prompt, result, want in zip(prompts, second, expected, strict=True):
        assert result.token_ids == want
        # All full blocks but the one holding the last prompt token: (n - 1) // 4 blocks.
        assert result.num_cached_tokens == (len(prompt) - 1) // 4 * 4


def test_same_batch_hits_count_shared_prefixes(family_case):
    model_dir, prompts, expected = family_case
    engine = make_engine(model_dir, block_size=4)
    results = run_engine(engine, prompts, GREEDY)
    for index, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        shared = 0
        for earlier in prompts[:index]:
            n = 0
            while n < min(len(earlier), len(prompt)) and earlier[n] == prompt[n]:
                n += 1
            shared = max(shared, n)
        want = min(shared // 4, (len(prompt) - 1) // 4) * 4
        assert result.num_cached_tokens == want, f"prompt {index}"
