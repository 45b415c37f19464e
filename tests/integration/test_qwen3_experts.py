"""The Qwen3-Omni MoE experts implementation (stages/qwen3_omni_moe/experts.py): grouped_mm where
torch has the kernel (the CPU, bfloat16 on SM80+ GPUs), which is what lets the thinker's decode
steps be captured; elsewhere transformers' loop, and the thinker's decode stays eager with the
reason. That the grouped path gives transformers' tokens, codes and waveforms is
test_qwen3_omni.py (every case runs it on the CPU); the cuda twin is tests/cuda/test_cuda_qwen3.py.
"""

from __future__ import annotations

import pytest
import torch

from omni.config import ConfigError, load_config
from omni.engine.graph_plan import padded_decode
from stages.qwen3_omni_moe import experts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen3_dir(one_torch_thread):
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("qwen3_omni_moe", "tiny"))


@pytest.fixture(scope="module")
def thinker(qwen3_dir):
    from stages.qwen3_omni_moe.thinker import Qwen3OmniThinkerAdapter

    return Qwen3OmniThinkerAdapter(qwen3_dir)


def test_choice_by_device_and_dtype(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert experts.choose(cpu, torch.float32) == "grouped_mm"
    assert experts.choose(gpu, torch.float32) is None  # torch's grouped GEMM is bf16-only there
    assert experts.choose(gpu, torch.float16) is None
    probed = []
    monkeypatch.setattr(experts, "_probe", lambda device, *dims: probed.append(dims))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert experts.choose(gpu, torch.bfloat16, 2048, 768) == "grouped_mm"
    assert probed == [(2048, 768)]  # tried once on the device first
    assert experts.choose(gpu, torch.bfloat16, 2048, 36) is None  # rows not 16-byte aligned
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert experts.choose(gpu, torch.bfloat16, 2048, 768) is None


def test_a_failing_grouped_gemm_keeps_the_loop(monkeypatch, caplog):
    """A GPU whose torch lacks the kernel (or rejects the layout) keeps transformers' loop: the
    stage starts, its decode steps eager."""
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))

    def unsupported(device, *dims):
        raise RuntimeError("grouped gemm is not supported here")

    monkeypatch.setattr(experts, "_probe", unsupported)
    assert experts.choose(gpu, torch.bfloat16, 2048, 768) is None
    assert "grouped_mm failed (grouped gemm is not supported here)" in caplog.text


def test_the_probe_runs_transformers_grouped_gemm(monkeypatch):
    """The probe calls the experts' dispatcher with their layout (here on the CPU, in bf16), and
    a wrong result is a failure too."""
    from transformers.integrations import moe

    experts._probe(torch.device("cpu"), 16, 8)
    monkeypatch.setattr(moe, "_grouped_mm", lambda rows, weight, offs: rows)
    with pytest.raises(RuntimeError, match=r"grouped_mm gave \(4, 16\), not \(4, 8\)"):
        experts._probe(torch.device("cpu"), 16, 8)


def test_thinker_and_talker_experts_run_grouped_on_the_cpu(qwen3_dir, thinker):
    from stages.qwen3_omni_moe.talker import Qwen3OmniTalkerAdapter

    layers = thinker.num_layers
    assert experts.install(thinker.text_model, None) == layers  # one experts module per layer
    assert thinker.decode_graph_blocker() is None
    talker = Qwen3OmniTalkerAdapter(qwen3_dir)
    assert experts.install(talker.talker, None) == talker.num_layers
    assert experts.blocker(talker.talker) is None and talker.decode_graph_blocker() is None


def test_looped_experts_keep_decode_eager(qwen3_dir, thinker):
    """What a float32 GPU stage gets: the loop (a host sync per layer), so its decode steps are
    not captured; cuda_graphs: true then is a ConfigError naming the field and why."""
    experts.install(thinker.text_model, "eager")
    try:
        blocker = thinker.decode_graph_blocker()
        assert blocker is not None and "'eager'" in blocker and "bfloat16" in blocker
        stage = {"name": "thinker", "model": qwen3_dir, "adapter": "qwen3_omni_moe_thinker"}
        for requested, expected in ((None, False), (False, False)):
            config = load_config({"stages": [{**stage, "engine": {"cuda_graphs": requested}}]})
            assert padded_decode(config.stages[0], thinker, torch.device("cuda")) is expected
        config = load_config({"stages": [{**stage, "engine": {"cuda_graphs": True}}]})
        with pytest.raises(ConfigError, match=r"stages\.thinker\.engine\.cuda_graphs.*'eager'"):
            padded_decode(config.stages[0], thinker, torch.device("cpu"))
    finally:
        experts.install(thinker.text_model, experts.CAPTURABLE)
