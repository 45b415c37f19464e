"""A stage's engine settings: EngineConfig (its paged KV cache, scheduler limits, numerics and
device) and StreamConfig (streamed input while the upstream stage still generates, and the
output chunks of a generation stage). Both sit under a StageConfig (omni/config/schema.py, which
re-exports them) and follow its rules: frozen, every value checked when built, one docstring
per field. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omni.config.validate import check_types, one_of, require

HASH_ALGOS = ("xxhash", "sha256")
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
OUTPUT_CACHE_DEVICES = ("cpu", "cuda")
# Past this, the ladder's steps of 8 mean hundreds of graphs (each captured twice at start-up: the
# memory profile's trial, then the real one) for batches whose kernels run long enough that the
# launches matter less.
DEFAULT_MAX_GRAPH_BATCH = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
CPU_MAX_NUM_BATCHED_CODES = 256  # a generation stage's step on the CPU: ~1.5 s of 3 50-code chunks
GPU_MAX_NUM_BATCHED_CODES = 1 << 20  # on a GPU: only max_num_seqs bounds a batch


@dataclass(frozen=True)
class EngineConfig:
    """One stage engine: its paged KV cache, scheduler limits and numerics."""

    block_size: int = 16
    """Tokens per KV cache block (also the prefix-caching granularity)."""
    num_blocks: int | None = None
    """KV cache blocks in this stage's pool (bounds the tokens resident at once); null means as
    many as kv_cache_memory holds, at most enough for max_num_seqs sequences of max_model_len."""
    kv_cache_memory: float = 0.1
    """Memory for the KV and output caches when num_blocks is null: a share (0 < x <= 1) of the
    memory available when the stage starts, or a number of bytes (> 1)."""
    max_num_seqs: int = 32
    """Most requests running in one step."""
    max_num_batched_tokens: int | None = None
    """Most tokens fed in one step; longer prompts are prefilled in chunks (null: 2048). A
    generation stage: most codes decoded in one step, chunks with their context and padding, one
    item always running (null: 256 on the CPU, where a long step holds back the stages sharing
    its thread; on a GPU no bound but max_num_seqs, since a batch of chunks costs about one)."""
    max_model_len: int | None = None
    """Longest sequence (prompt + generated tokens) a request may reach; null means the
    checkpoint's max_position_embeddings (4096 when it has none)."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of identical prompt prefixes across requests."""
    cache_outputs: bool | None = None
    """Keep per-token stage outputs beside the KV blocks; null means enable_prefix_caching."""
    hash_algo: str = "xxhash"
    """Block hash function: xxhash (fast) or sha256 (collision-proof)."""
    dtype: str | None = None
    """Model weights and activations: float32, bfloat16 or float16; null means bfloat16 on a
    GPU and float32 on the CPU."""
    device: str = "auto"
    """Where weights, KV cache and activations live: cpu, cuda, or auto (a GPU when the stage
    has one, resources.num_gpus > 0 or planned so, else the CPU; see omni/config/devices.py)."""
    gpu_memory_utilization: float | None = None
    """Share (0 < x <= 1) of its GPU's memory this stage may use on a GPU (weights, KV and
    output caches, activations); null means 0.9 of the stage's GPU fraction (resources.num_gpus,
    planned when null), 0.9 for a whole GPU. Shares on one GPU may sum to at most 0.95."""
    output_cache_device: str = "cpu"
    """Where a GPU stage keeps its stage-output cache: cpu (host memory, written by asynchronous
    copies through pinned staging) or cuda (GPU memory)."""
    cuda_graphs: bool | None = None
    """Replay decode steps (and short sampled suffixes; token2wav: streamed chunks' DiT) as CUDA
    graphs, padded to fixed shapes; null means on for GPU stages whose model allows it,
    false runs every step eagerly (debugging); true on the CPU runs the same padded steps eagerly."""
    max_graph_batch: int | None = None
    """The largest decode batch run padded (replayed as a CUDA graph on a GPU): the top of the
    batch ladder, so the graphs captured at start-up; larger batches run eagerly. null means
    min(max_num_seqs, 256)."""
    async_scheduling: bool = False
    """Launch the next decode step before this one's sampled ids are read, feeding them on the
    device, so the host's work overlaps the GPU's (needs CUDA-graph steps and an adapter whose
    decode steps take device ids: plain decoders; docs/gpu.md). On the CPU it runs the same
    bookkeeping with nothing to overlap (the tests' path)."""
    fused_kernels: bool | None = None
    """Fused Triton kernels in the decoder layers (RMSNorm + residual add, q/k/v and gate/up as
    one GEMM each, rotary, SiLU*mul) on a GPU stage; null: on for CUDA stages."""
    batch_whole_requests: bool | None = None
    """A generation stage: decode up to max_num_seqs whole requests in one batched adapter call
    (generate_batch, rows padded to the longest) instead of one per step; null means on for CUDA
    stages. On the CPU a batched row equals its single decode only up to float rounding (PyTorch
    picks convolution kernels by shape), so there the default keeps transformers' exact bits."""
    seed: int = 0
    """Seed of this stage's generator for requests that bring no seed of their own."""
    num_threads: int | None = None
    """Torch threads in this stage; null means from resources.num_cpus."""
    outputs: tuple[str, ...] | None = None
    """Per-token outputs (e.g. hidden_states) this stage caches and returns: null means all
    its adapter emits when another stage consumes it and none for the final stage; [] none."""

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("block_size", "max_num_seqs"):
            require(getattr(self, name) >= 1, self, name, "an integer >= 1")
        for name in ("num_blocks", "max_model_len", "max_graph_batch", "max_num_batched_tokens"):
            ok = getattr(self, name) is None or getattr(self, name) >= 1
            require(ok, self, name, "an integer >= 1 or null")
        ok = math.isfinite(self.kv_cache_memory) and self.kv_cache_memory > 0
        require(ok, self, "kv_cache_memory", "a share in (0, 1] or a number of bytes > 1")
        require(self.hash_algo in HASH_ALGOS, self, "hash_algo", one_of(HASH_ALGOS))
        require(self.dtype is None or self.dtype in DTYPES, self, "dtype", one_of(DTYPES))
        require(self.device in DEVICES, self, "device", one_of(DEVICES))
        utilization = self.gpu_memory_utilization
        ok = utilization is None or (math.isfinite(utilization) and 0 < utilization <= 1)
        require(ok, self, "gpu_memory_utilization", "a share in (0, 1] or null")
        choices = OUTPUT_CACHE_DEVICES
        require(self.output_cache_device in choices, self, "output_cache_device", one_of(choices))
        require(self.seed >= 0, self, "seed", "an integer >= 0")
        ok = not (self.async_scheduling and self.cuda_graphs is False)
        require(
            ok,
            self,
            "async_scheduling",
            "false when cuda_graphs is false (it launches padded steps)",
        )
        require(self.num_threads is None or self.num_threads >= 1, self, "num_threads", ">= 1")
        # Cached outputs are found only through prefix hits: without APC they would never be read.
        ok = not (self.cache_outputs and not self.enable_prefix_caching)
        require(ok, self, "cache_outputs", "false or null when enable_prefix_caching is false")

    @property
    def graph_batch_limit(self) -> int:
        """max_graph_batch with its null default resolved, never above max_num_seqs."""
        limit = DEFAULT_MAX_GRAPH_BATCH if self.max_graph_batch is None else self.max_graph_batch
        return min(self.max_num_seqs, limit)

    def resolved_max_num_batched_tokens(
        self, generation: bool = False, on_gpu: bool = False
    ) -> int:
        """max_num_batched_tokens with its null default resolved: an ar stage's does not depend on
        the device; a generation stage's does (on_gpu)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if not generation:
            return DEFAULT_MAX_NUM_BATCHED_TOKENS
        return GPU_MAX_NUM_BATCHED_CODES if on_gpu else CPU_MAX_NUM_BATCHED_CODES

    def resolved_dtype(self, on_gpu: bool) -> str:
        """The dtype with the null default resolved for the stage's device."""
        if self.dtype is not None:
            return self.dtype
        return "bfloat16" if on_gpu else "float32"

    def resolved_fused_kernels(self, on_gpu: bool) -> bool:
        """Whether to install the fused kernels, with the null default resolved (never on the
        CPU: there transformers' own modules run, float32-exact)."""
        return on_gpu and self.fused_kernels is not False

    def resolved_batch_whole_requests(self, on_gpu: bool) -> bool:
        """Whether a generation stage batches whole requests, with the null default resolved."""
        return on_gpu if self.batch_whole_requests is None else self.batch_whole_requests

    @property
    def outputs_cached(self) -> bool:
        """Whether the stage-output cache is on, with the null default resolved."""
        if self.cache_outputs is None:
            return self.enable_prefix_caching
        return self.cache_outputs


@dataclass(frozen=True)
class StreamConfig:
    """How this stage takes a streaming request (one with stream_audio, AsyncOmni.generate)
    while its upstream stage is still generating it, and, for a generation stage, the chunks it
    decodes. The YAML key is `stream:`, the stage's side of stream_audio: a setting of what the
    stage may do, where a request's own choice is stream_audio and the resulting input state is
    StageInput.input_complete."""

    enabled: bool = False
    """Start a stream_audio request as soon as the upstream produced what the input processor
    needs, and take the rest as it arrives (input_complete=False); false: wait until the
    upstream has finished it. Off unless a stage's config turns it on (the shipped Qwen2.5-Omni
    talker and token2wav do)."""
    first_chunk_size: int = 10
    """Input tokens (e.g. codec codes) in a request's first output chunk: small, for latency."""
    chunk_size: int = 50
    """Input tokens in each later output chunk."""
    ramp: tuple[int, ...] = ()
    """Input tokens in the chunks after the first and before chunk_size takes over, in order
    (e.g. [4, 8] after a first chunk of 2, then chunk_size 25): first audio after a few codes,
    fewer decodes later; empty: chunk_size from the second chunk on."""
    left_context: int | None = None
    """Input tokens before a chunk that its decode also sees; null: the adapter's default."""
    look_ahead: int | None = None
    """Input tokens after a chunk that must have arrived (unless the input is complete) and that
    its decode also sees; null: the adapter's default."""
    dtype: str | None = None
    """The chunk decoder's matmul precision (token2wav's DiT, under torch.autocast; norms and
    the ODE stay float32): float32, float16 or bfloat16; null: float16 on a GPU, float32 on the
    CPU. A chunk batch whose reduced-precision result is not finite is decoded again in float32."""

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("first_chunk_size", "chunk_size"):
            require(getattr(self, name) >= 1, self, name, "an integer >= 1")
        require(all(size >= 1 for size in self.ramp), self, "ramp", "integers >= 1")
        for name in ("left_context", "look_ahead"):
            ok = getattr(self, name) is None or getattr(self, name) >= 0
            require(ok, self, name, "an integer >= 0 or null")
        dtypes = ("float32", "float16", "bfloat16")
        require(self.dtype is None or self.dtype in dtypes, self, "dtype", one_of(dtypes))

    def chunk_tokens(self, index: int) -> int:
        """Input tokens in chunk `index` of a request (0: the first)."""
        if index == 0:
            return self.first_chunk_size
        return self.ramp[index - 1] if index <= len(self.ramp) else self.chunk_size
