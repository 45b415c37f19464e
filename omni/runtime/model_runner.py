"""SchedulerOutput -> one packed ragged batch -> the stage model -> sampled tokens.

Only the uncached tokens are fed, as a single row (batch 1) with explicit positions
(omni/runtime/batch_packing.py); the paged attention reads each sequence's context from the KV
blocks through its block table. Logits are computed only at the rows where a token is sampled.
Every fed token's per-token outputs are written to the stage-output cache at the token's KV slot.

Devices: the KV cache, the step's inputs and its attention metadata live on the runner's
device, packed on the host with numpy and sent in ONE non_blocking copy from pinned memory
(omni/runtime/host_upload.py). `launch` queues a step and `LaunchedStep.result` reads its ids
(the step's one sync); `execute` is both. Per-request extras stay as the stage received them
(CPU tensors): the adapter moves what it uses to its device.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from omni.core.logprobs import MAX_LOGPROBS
from omni.core.sampling_params import SamplingParams
from omni.core.scheduler_output import RunnerOutput, ScheduledRequest, SchedulerOutput
from omni.runtime.attention import allocate_kv_caches
from omni.runtime.batch_packing import PackedBatch, pack_batch
from omni.runtime.block_tables import BlockTables
from omni.runtime.decode_graphs import DecodeGraphs, GraphStep
from omni.runtime.graph_shapes import max_suffix_tokens, num_scratch_blocks
from omni.runtime.host_upload import upload
from omni.runtime.launched_step import FedIds, LaunchedStep
from omni.runtime.output_cache import OutputCache
from omni.runtime.sampler import TOP_K_CAP, Sampler, masked
from omni.runtime.stage_model import StageModel
from omni.runtime.token_logprobs import (
    PROMPT_CHUNK,
    LogprobFrames,
    frames_of,
    logprob_frames,
    prompt_logprob_frames,
)
from omni.runtime.tracked_requests import Tracked, TrackedRequests

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(
        self,
        model: StageModel,
        *,
        num_blocks: int,
        block_size: int,
        output_cache: OutputCache | None,
        seed: int = 0,
        device: torch.device | str | None = None,
        padded_decode: bool = False,
        max_num_seqs: int = 1,
        max_num_batched_tokens: int = 1,
        max_model_len: int = 1,
        max_graph_batch: int | None = None,
    ) -> None:
        """device: where the KV cache, inputs and metadata live (None: the CPU; the weights are
        there). padded_decode: decode batches up to max_graph_batch (None: max_num_seqs) and
        short suffixes padded to fixed shapes (decode_graphs.py); the model has no blocker."""
        self.model = model
        self.block_size = block_size
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        scratch = 0
        max_graph_batch = max_num_seqs if max_graph_batch is None else max_graph_batch
        if padded_decode:
            max_suffix = max_suffix_tokens(model, max_num_batched_tokens, max_model_len)
            scratch = num_scratch_blocks(max_graph_batch, max_suffix, block_size)
        self.kv_caches = allocate_kv_caches(
            model.num_layers, num_blocks + scratch, block_size, model.num_kv_heads,
            model.head_dim, model.dtype, device=self.device,
        )  # fmt: skip
        self.output_cache = output_cache
        self.sampler = Sampler(seed, device=self.device)
        # Block tables live in one host array, appended to as blocks come (one row per request
        # with a table; +1: the warm-up's and profile's dummy request).
        max_blocks = -(-max(max_model_len, max_num_batched_tokens) // block_size)
        self.block_tables = BlockTables(max_num_seqs + 1, max_blocks)
        self.requests = TrackedRequests(self.block_tables)
        # Per-request stage inputs (upstream embeddings, pixel values, ...), kept until finished.
        self._extras: dict[str, Mapping[str, Any]] = {}
        self.decode_graphs: DecodeGraphs | None = None
        if padded_decode:
            self.decode_graphs = DecodeGraphs(
                model, self.kv_caches, num_blocks=num_blocks, block_size=block_size,
                max_batch=max_graph_batch, max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len, device=self.device,
            )  # fmt: skip
        self.num_eager_steps = 0

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.kv_caches for t in pair)

    @torch.inference_mode()
    def warm_up(self) -> None:
        """A 2-token forward before serving: every per-token output is discovered (its cache
        allocated) before any block is cached; and a 1-token one, bound to max_model_len: the
        GPU compiles the decode attention and its key-split combine now, not on a live request.
        Whatever this writes (free, uncached blocks) is overwritten."""
        batch = self._dummy_batch("__warm_up__", 2)
        outputs = self.model.forward(batch.model_inputs)
        if self.output_cache is not None:
            per_token = {"hidden_states": outputs.hidden_states, **outputs.extra}
            self.output_cache.discover(per_token, batch.slot_mapping.numel())
        decode = self._dummy_batch("__warm_up__", 1).model_inputs
        decode.attn.max_context = self.block_tables.table.shape[1] * self.block_size
        self.model.forward(decode)

    @torch.inference_mode()
    def profile_forward(self, num_tokens: int, num_sample_rows: int) -> None:
        """The largest step the scheduler can make, for memory profiling: one sequence of
        num_tokens fed tokens, then the logits and sampling of num_sample_rows rows, all with
        top-k, top-p (the costliest path: a full-vocabulary sort, softmax, cumsum, masks),
        penalties, a logit bias and logprobs: the peak holds the penalties' counts of
        num_sample_rows requests (serving that many penalized requests needs them; their slots
        are freed after); then a prompt-logprobs chunk's logits. Needs ceil(num_tokens /
        block_size) KV blocks; nothing is cached or returned."""
        batch = self._dummy_batch("__profile__", num_tokens)
        outputs = self.model.forward(batch.model_inputs)
        rows = max(1, min(num_sample_rows, num_tokens))
        logits = self.model.compute_logits(outputs.hidden_states[-rows:])
        # A top_k past TOP_K_CAP sorts the whole vocabulary: with top-p, the largest path.
        costliest = SamplingParams(
            temperature=1.0, top_k=TOP_K_CAP + 1, top_p=0.9, logprobs=MAX_LOGPROBS,
            presence_penalty=0.5, logit_bias=((0, 1.0),),
        )  # fmt: skip
        request_ids = [f"__profile__{i}" for i in range(rows)]
        params = [costliest] * rows
        ids = self.sampler.sample(logits, params, [0] * rows, adjusted=request_ids)
        logprob_frames(logits, ids, params)
        self.sampler.penalties.release(request_ids)
        del logits, ids
        # A scoring request's prompt rows: their logits PROMPT_CHUNK rows at a time.
        scored = min(PROMPT_CHUNK, num_tokens)
        zeros = torch.zeros(scored, dtype=torch.int64, device=self.device)
        frames_of(self.model.compute_logits(outputs.hidden_states[:scored]), zeros, MAX_LOGPROBS)

    def _dummy_batch(self, request_id: str, num_tokens: int) -> PackedBatch:
        """A batch of one sequence of num_tokens zeros in blocks 0, 1, ... (no request kept)."""
        block_ids = list(range(-(-num_tokens // self.block_size)))
        entry = ScheduledRequest(
            request_id, [0] * num_tokens, 0, block_ids, True, False, SamplingParams()
        )
        batch = self._pack([entry], self.requests.track([entry]))
        self.requests.forget(request_id)
        return batch

    def add_request_extras(self, request_id: str, extras: Mapping[str, Any]) -> None:
        """Per-request inputs beyond token ids (e.g. upstream hidden states), kept until release."""
        self._extras[request_id] = extras

    def release(self, request_ids: list[str]) -> None:
        """Forget finished or aborted requests at once (their inputs can be large)."""
        for request_id in request_ids:
            self.requests.forget(request_id)
            self._extras.pop(request_id, None)
        if request_ids:
            self.model.release(request_ids)  # adapters' per-request state
            self.sampler.penalties.release(request_ids)

    def step_stats(self) -> dict[str, Any]:
        """Steps run eagerly, and what the padded (CUDA-graph) steps did."""
        graphs = self.decode_graphs
        return {"eager_steps": self.num_eager_steps, **(graphs.stats() if graphs else {})}

    @torch.inference_mode()
    def capture_decode_graphs(self, *, required: bool = False) -> None:
        """On a GPU: capture the padded steps (start-up only: capture synchronises the device
        and must not interleave with serving). A capture that fails leaves every step eager,
        with a warning, unless required (then it raises)."""
        if self.decode_graphs is None or self.device.type != "cuda":
            return
        try:
            self.decode_graphs.capture()
        except Exception as e:
            if required:
                raise RuntimeError(f"CUDA-graph capture failed: {e}") from e
            logger.warning("CUDA-graph capture failed, decode steps stay eager: %s", e)
            self.decode_graphs = None

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        return self.launch(scheduler_output).result()

    @torch.inference_mode()
    def launch(self, scheduler_output: SchedulerOutput, fed: FedIds | None = None) -> LaunchedStep:
        """Queue the step's forward, logits and sampling on the device. fed: a padded decode
        step's ids, still on the device (scheduled before they were read)."""
        for request_id in scheduler_output.preempted_request_ids:
            self.requests.forget(request_id)  # block table gone; inputs stay
        if scheduler_output.is_empty:
            return LaunchedStep([])
        scheduled = scheduler_output.scheduled
        tracked = self.requests.track(scheduled)
        for entry in scheduled if self.requests.num_adjusted else ():
            if entry.penalty_prompt:  # admitted with a repetition penalty
                self.sampler.penalties.note_prompt(entry.request_id, entry.penalty_prompt)
        # Prompt logprobs need every fed row's hidden state: such a step runs eagerly.
        prompt = self.requests.num_prompt_logprobs > 0 and any(e.prompt_targets for e in scheduled)
        padded = None if prompt else self._run_padded(scheduled, tracked, fed)
        if padded is None and fed is not None:
            raise RuntimeError("a step fed ids on the device must run padded (a decode batch)")
        prompt_frames = None
        if padded is not None:  # every scheduled request samples, in order
            outputs, hidden = padded.outputs, padded.sample_hidden
            host_slots, device_slots = padded.host_slots, padded.device_slots
            sampled, params = scheduled, tracked.params
        else:
            batch = self._pack(scheduled, tracked)
            outputs = self.model.forward(batch.model_inputs)
            self.num_eager_steps += 1
            host_slots, device_slots = batch.slot_mapping, batch.model_inputs.attn.slot_mapping
            hidden = outputs.hidden_states
            if prompt:
                frames = prompt_logprob_frames(
                    self.model.compute_logits, hidden, scheduled, tracked.params
                )
                prompt_frames = ([e.request_id for e in scheduled], frames)
            if len(batch.sample_ids) != hidden.shape[0]:  # else every row samples: no gather
                hidden = hidden.index_select(0, batch.sample_rows)
            sampled = [e for e in scheduled if e.sample]  # in order, as batch.sample_ids
            params = [p for e, p in zip(scheduled, tracked.params, strict=True) if e.sample]
        if self.output_cache is not None:
            per_token = {"hidden_states": outputs.hidden_states, **outputs.extra}
            self.output_cache.discover(per_token, host_slots.numel())
            self.output_cache.write(host_slots, per_token, device_slot_mapping=device_slots)
        if not sampled:
            return LaunchedStep([], prompt_logprobs=prompt_frames)
        logits = self.model.compute_logits(hidden)
        return self._sample(logits, hidden, sampled, params, prompt_frames)

    def _sample(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        sampled: list[ScheduledRequest],
        params: list[SamplingParams],
        prompt_frames: tuple[list[str], LogprobFrames] | None = None,
    ) -> LaunchedStep:
        """The sampling rows' tokens (and a multi-code step's residual codes), on the device;
        the logprobs asked for with them (and the step's prompt logprobs) in the same copy."""
        all_greedy = self.requests.num_random == 0
        counts = [] if all_greedy else [e.num_output_tokens for e in sampled]
        sample_ids = [e.request_id for e in sampled]
        adjusted = sample_ids if self.requests.num_adjusted else None  # penalties: whose counts
        masks = [e.allowed_tokens for e in sampled] if self.requests.num_masked else None
        logprobs = bool(self.requests.num_logprobs)  # read the model's own logits: mask a copy
        chosen = masked(logits, masks, copy=logprobs) if masks else logits
        ids = self.sampler.sample(chosen, params, counts, all_greedy=all_greedy, adjusted=adjusted)
        codes = self.model.sample_codes(hidden, ids, sample_ids, params, counts)
        frames = logprob_frames(logits, ids, params) if logprobs else None
        return LaunchedStep(sample_ids, ids, codes, frames, prompt_frames)

    def _run_padded(
        self, scheduled: list[ScheduledRequest], tracked: Tracked, fed: FedIds | None
    ) -> GraphStep | None:
        graphs = self.decode_graphs
        shape = graphs.shape_for(scheduled) if graphs is not None else None
        if graphs is None or shape is None:
            return None
        if self.output_cache is not None:
            # A replay overwrites the graph's outputs, which the last step's copies may still read.
            self.output_cache.wait_copies_on_device()
        fed_ids = fed_frames = None
        if fed is not None:
            (rows,) = upload([fed.rows], self.device)
            fed_ids = fed.ids.index_select(0, rows)
            if fed.codes is not None:  # a multi-code step: each fed frame's residual codes too
                fed_frames = torch.cat([fed_ids[:, None], fed.codes.index_select(0, rows)], 1)
        return graphs.run(scheduled, self.block_tables, tracked.rows, shape, fed_ids, fed_frames)

    def _pack(self, scheduled: list[ScheduledRequest], tracked: Tracked) -> PackedBatch:
        return pack_batch(
            scheduled,
            self.block_tables.gather(tracked.rows),
            block_size=self.block_size,
            kv_caches=self.kv_caches,
            extras=self._extras,
            device=self.device,
        )
