"""Loading stage models for a GPU on a plain install (no accelerate, which only the `real` extra
brings), and the two-stage projection computed where the embedding table lives."""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM

from stages.causal_lm import load_kwargs
from stages.two_stage import PROJECTION_SEED, EmbedsLMAdapter

CUDA = torch.device("cuda", 0)


def test_gpu_loading_needs_no_accelerate(qwen2_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "accelerate", None)  # `import accelerate` now fails
    kwargs = load_kwargs(CUDA)
    assert "device_map" not in kwargs  # transformers refuses device_map without accelerate
    # What the adapters do with those arguments: load (here on the CPU), then `.to(device)`.
    model = AutoModelForCausalLM.from_pretrained(qwen2_dir, dtype=torch.float32, **kwargs)
    assert next(model.parameters()).device.type == "cpu"
    assert load_kwargs(torch.device("cpu")) == {}


def test_projection_scale_is_the_embedding_rms(llama_dir):
    adapter = EmbedsLMAdapter(llama_dir)
    upstream_dim = 48
    table = adapter.model.get_input_embeddings().weight.detach().double()
    rms = table.pow(2).mean().sqrt().item()
    w = torch.randn(
        upstream_dim, adapter.hidden_size, generator=torch.Generator().manual_seed(PROJECTION_SEED)
    )
    expected = w.double() * rms / upstream_dim**0.5
    got = adapter.projection(upstream_dim)
    assert got.dtype == torch.float32 and got.device.type == "cpu"
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=0)
