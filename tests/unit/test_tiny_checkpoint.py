"""Tests for tools/make_tiny_checkpoint.py: loadable, consistent, deterministic checkpoints."""

from __future__ import annotations

import hashlib
import pathlib

import pytest

from tools import make_tiny_checkpoint as mtc


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    # Module scope: each family is built once and shared by the tests below.
    root = tmp_path_factory.mktemp("omni_cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("OMNI_CACHE_DIR", str(root))
    yield root
    mp.undo()


def _hashes(path: pathlib.Path) -> dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.iterdir())
        if f.is_file()
    }


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_lm_checkpoint_loads_with_consistent_shapes(cache_dir, family):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = mtc.ensure_checkpoint(family, "tiny", seed=0)
    assert path == cache_dir / "checkpoints" / f"{family}-tiny-seed0"
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        assert (path / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    cfg = model.config
    assert type(model).__name__ == {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[family]
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == (64, 2, 128)
    # GQA: fewer KV heads than query heads, visible in the projection shapes.
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    attn = model.model.layers[0].self_attn
    assert attn.k_proj.weight.shape == (2 * head_dim, 64)
    assert attn.q_proj.weight.shape == (4 * head_dim, 64)
    assert cfg.vocab_size == len(tok) == 512
    assert not cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert tok.eos_token_id is not None and 0 <= tok.eos_token_id < cfg.vocab_size
    assert cfg.eos_token_id == tok.eos_token_id
    assert cfg.max_position_embeddings == 4096
    # A table-like prompt uses far fewer tokens than bytes (the BPE learned real merges).
    text = "| 1 | John Doe | 29 | Engineer | USA | john.doe@example.com |\nWhat is the age of John?"
    ids = tok(text).input_ids
    assert len(ids) < len(text) // 2
    assert tok.decode(ids, skip_special_tokens=True) == text
    # Greedy choices are decisive: the top-1/top-2 logit margin is far above fp32 noise.
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=20,
            min_new_tokens=20,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    margins = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    assert min(margins) > 1e-4
    assert len(set(out.sequences[0, len(ids) :].tolist())) > 5  # no immediate collapse


def test_ensure_returns_existing_without_rebuild(cache_dir):
    path = mtc.ensure_checkpoint("qwen2", "tiny", 0)
    before = (path / "model.safetensors").stat().st_mtime_ns
    assert mtc.ensure_checkpoint("qwen2", "tiny", 0) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == before
    leftovers = [p.name for p in path.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # temp build directories were renamed or removed


def test_stale_version_is_rebuilt(cache_dir):
    path = mtc.ensure_checkpoint("llama", "tiny", 0)
    want = _hashes(path)
    (path / ".tiny_ckpt_version").write_text("stale\n")
    (path / "model.safetensors").write_bytes(b"garbage")
    assert mtc.ensure_checkpoint("llama", "tiny", 0) == path
    assert _hashes(path) == want


def test_same_seed_is_byte_identical_other_seed_differs(tmp_path):
    mtc.build_checkpoint("qwen2", "tiny", 0, tmp_path / "a")
    mtc.build_checkpoint("qwen2", "tiny", 0, tmp_path / "b")
    mtc.build_checkpoint("qwen2", "tiny", 1, tmp_path / "c")
    a, b, c = (_hashes(tmp_path / x) for x in "abc")
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"]
    assert a["tokenizer.json"] == c["tokenizer.json"]  # tokenizer does not depend on the seed


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("gpt2", "tiny", 0), "qwen2, llama, qwen2_5_omni"),
        (("qwen2", "huge", 0), "tiny, bench"),
        (("qwen2", "tiny", -1), "seed"),
    ],
)
def test_bad_arguments_raise_value_error(cache_dir, args, match):
    with pytest.raises(ValueError, match=match):
        mtc.ensure_checkpoint(*args)
    with pytest.raises(ValueError, match=match):
        mtc.build_checkpoint(*args, cache_dir / "never")
    assert not (cache_dir / "never").exists()


def test_cli_out_prints_path_and_parameter_count(tmp_path, capsys):
    out = tmp_path / "ckpt"
    assert mtc.main(["--family", "llama", "--size", "tiny", "--seed", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == str(out)
    assert printed[1] == f"parameters: {mtc.count_parameters(out):,}"
    assert 100_000 < mtc.count_parameters(out) < 200_000
