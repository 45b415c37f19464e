"""install_fused_kernels on tiny transformers models, against the same models unpatched.

Oracle: transformers' own modules. Without a GPU the fused kernels run under Triton's
interpreter on the CPU (interpret_on_cpu=True; without it nothing on the CPU is patched), where
bfloat16 results are within one rounding of transformers'. With a GPU the same cases run
compiled on it, where the fused q/k/v and gate/up GEMMs may round differently from the separate
ones (cuBLAS picks other tilings): bfloat16 is then compared with a looser tolerance and greedy
tokens only in float32. Through our paged-attention hook (omni_attn passes through the fused
forwards) and through transformers' own generate.
"""

import copy
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

pytest.importorskip("triton")

from omni.runtime.attention import (  # noqa: E402
    AttentionMetadata,
    allocate_kv_caches,
    register_paged_attention,
)
from omni.runtime.fused_layers import install_fused_kernels, uninstall_fused_kernels  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=256,
)
FAMILIES = {"qwen2": (Qwen2ForCausalLM, Qwen2Config), "llama": (LlamaForCausalLM, LlamaConfig)}
# Per layer: the layer, its two norms, attention, MLP; plus the model's final norm.
PATCHED = 5 * TINY["num_hidden_layers"] + 1


def make_pair(family: str, dtype=torch.float32, attn: str = "sdpa", **config):
    model_class, config_class = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(**{**TINY, **config})).eval().to(DEVICE, dtype)
    model.set_attn_implementation(attn)
    fused = copy.deepcopy(model)
    assert install_fused_kernels(fused, interpret_on_cpu=True) == PATCHED
    return model, fused


def tolerance(dtype):
    if dtype == torch.float32:
        return {"atol": 1e-5, "rtol": 1e-5}
    return {"atol": 0, "rtol": 2**-7} if DEVICE == "cpu" else {"atol": 3e-2, "rtol": 3e-2}


def tokens_comparable(dtype) -> bool:
    """Whether greedy tokens must be equal: float32, or the interpreter's bf16 (whose GEMMs
    are torch's CPU ones, fused or not)."""
    return dtype == torch.float32 or DEVICE == "cpu"


def test_nothing_is_patched_on_the_cpu_by_default():
    model = Qwen2ForCausalLM(Qwen2Config(**TINY)).eval()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    assert install_fused_kernels(model) == 0
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_install_is_idempotent_and_undone_by_uninstall():
    model, fused = make_pair("qwen2")
    attn = fused.model.layers[0].self_attn
    assert install_fused_kernels(fused, interpret_on_cpu=True) == 0
    # q/k/v are rows of one tensor now: same values, same state_dict, no extra parameters.
    assert attn.k_proj.weight.data_ptr() == attn.q_proj.weight.data_ptr() + 64 * 64 * 4
    assert fused.state_dict().keys() == model.state_dict().keys()
    for name, value in model.state_dict().items():
        assert torch.equal(fused.state_dict()[name], value), name
    count = sum(p.numel() for p in fused.parameters())
    assert count == sum(p.numel() for p in model.parameters())
    assert uninstall_fused_kernels(fused) == PATCHED
    assert not any("forward" in m.__dict__ for m in fused.modules())
    ids = torch.tensor([[3, 1, 4, 1, 5]], device=DEVICE)
    with torch.no_grad():
        torch.testing.assert_close(fused(ids).logits, model(ids).logits, atol=1e-6, rtol=0)


def test_a_foreign_forward_is_kept():
    model = Qwen2ForCausalLM(Qwen2Config(**TINY)).eval()
    norm = model.model.norm
    norm.forward = lambda hidden_states: hidden_states  # e.g. an accelerate hook
    assert install_fused_kernels(model, interpret_on_cpu=True) == PATCHED - 1
    assert norm.forward(torch.ones(2)).tolist() == [1.0, 1.0]


def test_each_layer_hands_its_sum_to_the_next_norm(monkeypatch):
    """A layer's last residual add runs as one add_rms_norm with the next norm (the next layer's
    input norm, the last layer's the final norm; omni/runtime/fused_residual.py): per forward
    one plain rms_norm (the first layer's input) and two add_rms_norm per layer, with
    transformers' output. A tensor other than the one handed over is normed as before."""
    from omni.runtime import fused_layers, fused_residual

    model, fused = make_pair("qwen2", torch.float32)
    layers = fused.model.layers
    assert [layer.__dict__[fused_residual.NEXT_NORM] for layer in layers] == [
        layers[1].input_layernorm,
        fused.model.norm,
    ]
    calls = {"rms_norm": 0, "add_rms_norm": 0}

    def counted(name, function):
        def run(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return run

    monkeypatch.setattr(fused_layers, "rms_norm", counted("rms_norm", fused_layers.rms_norm))
    for module in (fused_layers, fused_residual):
        monkeypatch.setattr(module, "add_rms_norm", counted("add_rms_norm", module.add_rms_norm))
    ids = torch.tensor([[5, 17, 99, 3, 64]], device=DEVICE)
    with torch.no_grad():
        want, got = model(ids).logits, fused(ids).logits
    torch.testing.assert_close(got, want, **tolerance(torch.float32))
    assert calls == {"rms_norm": 1, "add_rms_norm": 2 * TINY["num_hidden_layers"]}
    # Handed over for one tensor only: another one (here the sum changed, as deepstack does)
    # is normed itself.
    norm = fused.model.norm
    hidden = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    out = fused_residual.finish_layer(layers[1], hidden, torch.ones_like(hidden))
    torch.testing.assert_close(norm(out + 1), model.model.norm(hidden + 2))
    assert fused_residual.HANDED not in norm.__dict__  # taken (and dropped) by that call
    assert fused_layers.uninstall_fused_kernels(fused) == PATCHED
    assert all(fused_residual.NEXT_NORM not in layer.__dict__ for layer in layers)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoder_layer_matches_transformers(family, dtype):
    """One decoder layer, batch 2: the fused forward vs transformers' on the same weights.
    Per-row cos/sin take the rotary kernel; broadcast ones (one row for the batch) take
    transformers' rotary."""
    model, fused = make_pair(family, dtype, attention_bias=True)
    gen = torch.Generator().manual_seed(1)
    hidden = (torch.randn(2, 7, 64, generator=gen) * 2).to(DEVICE, dtype)
    positions = (torch.arange(7).expand(2, 7) + torch.tensor([[0], [5]])).to(DEVICE)
    for position_ids in (positions, positions[:1]):
        cos_sin = model.model.rotary_emb(hidden, position_ids)
        with torch.no_grad():
            want = model.model.layers[1](hidden, position_embeddings=cos_sin)
            got = fused.model.layers[1](hidden, position_embeddings=cos_sin)
        torch.testing.assert_close(got, want, **tolerance(dtype))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_generate_greedy_tokens_equal(family):
    """transformers' generate (its DynamicCache goes through past_key_values.update): the same
    tokens, and logits at every step within bf16 rounding."""
    model, fused = make_pair(family, torch.bfloat16)
    ids = torch.tensor([[5, 17, 99, 3, 64, 8, 21]], device=DEVICE)
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, output_logits=True)
    want = model.generate(ids, return_dict_in_generate=True, **kw)
    got = fused.generate(ids, return_dict_in_generate=True, **kw)
    assert got.sequences.tolist() == want.sequences.tolist()
    # On a GPU the fused q/k/v and gate/up GEMMs take other cuBLAS kernels than the separate
    # ones, so bf16 rounding differs in places (measured on an H200: up to 2e-3 absolute).
    atol = 1e-2 if DEVICE == "cuda" else 0.0
    torch.testing.assert_close(
        torch.stack(got.logits), torch.stack(want.logits), atol=atol, rtol=2**-7
    )


class PagedGreedy:
    """Packed steps through the paged hook, as the model runner makes them: prompts, then one
    greedy token per sequence per step."""

    def __init__(self, model, dtype, block_size=4, num_blocks=48):
        config = model.config
        self.model, self.block_size = model, block_size
        head_dim = config.hidden_size // config.num_attention_heads
        self.kv_caches = allocate_kv_caches(
            config.num_hidden_layers, num_blocks, block_size, config.num_key_value_heads,
            head_dim, dtype, device=DEVICE,
        )  # fmt: skip
        self.free = list(range(num_blocks))
        random.Random(0).shuffle(self.free)
        self.blocks: list[list[int]] = []
        self.lens: list[int] = []

    def step(self, feeds: list[list[int]]) -> tuple[list[int], torch.Tensor]:
        ids, positions, slots, starts, seq_lens = [], [], [], [0], []
        for i, tokens in enumerate(feeds):
            if i == len(self.lens):
                self.lens.append(0)
                self.blocks.append([])
            start, end = self.lens[i], self.lens[i] + len(tokens)
            while len(self.blocks[i]) * self.block_size < end:
                self.blocks[i].append(self.free.pop())
            for pos in range(start, end):
                block = self.blocks[i][pos // self.block_size]
                slots.append(block * self.block_size + pos % self.block_size)
            ids += tokens
            positions += range(start, end)
            starts.append(starts[-1] + len(tokens))
            seq_lens.append(end)
            self.lens[i] = end
        width = max(len(b) for b in self.blocks)
        meta = AttentionMetadata.build(
            slot_mapping=torch.tensor(slots),  # moved to the caches' device by build()
            query_start_loc=torch.tensor(starts),
            seq_lens=torch.tensor(seq_lens),
            block_tables=torch.tensor([b + [0] * (width - len(b)) for b in self.blocks]),
            kv_caches=self.kv_caches,
            block_size=self.block_size,
        )
        with torch.no_grad():
            logits = self.model(
                input_ids=torch.tensor([ids], device=DEVICE),
                position_ids=torch.tensor([positions], device=DEVICE),
                use_cache=False,
                omni_attn=meta,
            ).logits[0]
        last = logits[torch.tensor(starts[1:], device=DEVICE) - 1]
        return last.argmax(-1).tolist(), last.float()


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_greedy_tokens_equal(family, dtype, monkeypatch):
    """Three prompts packed in one prefill, then 5 packed decode steps through omni_paged. The
    fused layers write K/V with their rotary kernel (rotary_and_cache_), the hook then does not;
    transformers' layers leave the write to the hook."""
    from omni.runtime import attention, fused_layers

    writes: list[str] = []
    for module, name in ((fused_layers, "rotary_and_cache_"), (attention, "reshape_and_cache")):
        original = getattr(module, name)
        spy = lambda *a, name=name, original=original: writes.append(name) or original(*a)  # noqa: E731
        monkeypatch.setattr(module, name, spy)
    model, fused = make_pair(family, dtype, attn=register_paged_attention())
    prompts = [[5, 17, 99, 3, 64], [8, 21, 2, 90, 11, 40, 7, 7, 1], [120]]
    runs = []
    for m in (model, fused):
        writes.clear()
        runner, feeds, tokens, logits = PagedGreedy(m, dtype), prompts, [], []
        for _ in range(6):
            step_tokens, step_logits = runner.step(feeds)
            tokens.append(step_tokens)
            logits.append(step_logits)
            feeds = [[t] for t in step_tokens]
        runs.append((tokens, torch.stack(logits)))
        writer = "rotary_and_cache_" if m is fused else "reshape_and_cache"
        assert writes == [writer] * (6 * TINY["num_hidden_layers"]), writes
    if tokens_comparable(dtype):
        assert runs[1][0] == runs[0][0]
        torch.testing.assert_close(runs[1][1], runs[0][1], **tolerance(dtype))
    else:  # the prefill's logits: later steps feed tokens that may differ
        torch.testing.assert_close(runs[1][1][0], runs[0][1][0], **tolerance(dtype))


def test_qwen2_5_omni_text_models():
    """The thinker's text model with 3-D (multimodal) positions whose axes differ, the talker
    model, and a vision block's biased MLP."""
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as omni

    from tools.tiny_omni import SPECIALS, omni_config

    config = omni_config("tiny", {s: 500 + i for i, s in enumerate(SPECIALS)})
    gen = torch.Generator().manual_seed(2)
    positions = torch.stack([torch.arange(6), torch.arange(6) // 2, torch.arange(6) % 3])
    positions = positions[:, None].to(DEVICE)
    text_config = config.thinker_config.text_config
    for model_class, sub_config in (
        (omni.Qwen2_5OmniThinkerTextModel, text_config),
        (omni.Qwen2_5OmniTalkerModel, config.talker_config),
    ):
        sub_config._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = model_class(sub_config).eval().to(DEVICE)
        fused = copy.deepcopy(model)
        assert install_fused_kernels(fused, interpret_on_cpu=True) == 5 * 2 + 1
        embeds = torch.randn(1, 6, sub_config.hidden_size, generator=gen).to(DEVICE)
        with torch.no_grad():
            want = model(inputs_embeds=embeds, position_ids=positions).last_hidden_state
            got = fused(inputs_embeds=embeds, position_ids=positions).last_hidden_state
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    mlp = omni.Qwen2_5OmniMLP(config.thinker_config.vision_config, bias=True).eval().to(DEVICE)
    fused_mlp = copy.deepcopy(mlp)
    assert install_fused_kernels(fused_mlp, interpret_on_cpu=True) == 1
    x = torch.randn(10, mlp.hidden_size, generator=gen).to(DEVICE)
    with torch.no_grad():
        torch.testing.assert_close(fused_mlp(x), mlp(x), atol=1e-5, rtol=1e-5)


def test_qwen3_omni_text_models():
    """Qwen3-Omni's thinker text model (MoE layers, q_norm/k_norm, 3-D positions, a recorded
    hidden layer), talker model (MoE with a gated shared expert) and code predictor: their
    norms, layers, attention (q/k norms on the fused heads) and dense MLPs fused, their MoE
    blocks left as they are."""
    from collections import Counter

    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as q3

    from omni.runtime.fused_layers import FORWARDS
    from tools.tiny_qwen3_omni import SPECIALS, omni_config

    config = omni_config("tiny", {s: 400 + i for i, s in enumerate(SPECIALS)})
    gen = torch.Generator().manual_seed(3)
    positions = torch.stack([torch.arange(6), torch.arange(6) // 2, torch.arange(6) % 3])
    talker = config.talker_config
    for model_class, sub_config, position_ids, record in (
        (q3.Qwen3OmniMoeThinkerTextModel, config.thinker_config.text_config, positions[:, None], 1),
        (q3.Qwen3OmniMoeTalkerModel, talker.text_config, positions[:, None], None),
        (q3.Qwen3OmniMoeTalkerCodePredictorModel, talker.code_predictor_config, None, None),
    ):
        sub_config._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = model_class(sub_config).eval()
        with torch.no_grad():  # the experts' parameters are left uninitialised (torch.empty)
            for param in model.parameters():
                param.normal_(0.0, 0.05) if param.dim() > 1 else param.uniform_(0.5, 1.5)
        model = model.to(DEVICE)
        fused = copy.deepcopy(model)
        assert install_fused_kernels(fused, interpret_on_cpu=True) > 0
        kinds = Counter(
            next(k for k, f in FORWARDS.items() if m.forward.__func__ is f)
            for m in fused.modules()
            if "forward" in m.__dict__
        )
        layers = sub_config.num_hidden_layers
        # Every layer's two norms, q_norm and k_norm, and the final norm; every layer.
        assert kinds["norm"] == 4 * layers + 1 and kinds["layer"] == layers, kinds
        assert kinds["attention"] == layers, kinds
        # Dense MLPs: the talker's shared experts and the code predictor's; none in the thinker.
        assert kinds["mlp"] == (0 if record is not None else layers), kinds
        embeds = torch.randn(1, 6, sub_config.hidden_size, generator=gen).to(DEVICE)
        kwargs = {"inputs_embeds": embeds}
        if position_ids is not None:
            kwargs["position_ids"] = position_ids.to(DEVICE)
        if record is not None:  # the thinker: deepstack rows added after its first 2 layers
            kwargs["output_hidden_states"] = [record]
            mask = torch.tensor([[False, True, True, False, False, False]], device=DEVICE)
            rows = [torch.randn(2, sub_config.hidden_size, generator=gen) for _ in range(2)]
            kwargs["visual_pos_masks"] = mask
            kwargs["deepstack_visual_embeds"] = [r.to(DEVICE) for r in rows]
        with torch.no_grad():
            want, got = model(**kwargs), fused(**kwargs)
        torch.testing.assert_close(
            got.last_hidden_state, want.last_hidden_state, atol=1e-5, rtol=1e-5
        )
        if record is not None:  # what the talker reads: the recorded layer's output
            torch.testing.assert_close(
                got.hidden_states[record], want.hidden_states[record], atol=1e-5, rtol=1e-5
            )
