"""The Qwen3-Omni talker's residual codes: its code predictor, batched over a step's sampled rows.

A talker step samples each row's code 0 from `codec_head`; the other num_code_groups - 1 codes of
the frame come from the code predictor, as transformers' code-predictor generate makes them for
one request: the inputs [talker hidden, embedding of code 0], then one position per residual
code, each read by its own lm_head and fed back through its own embedding, with the predictor's
own small cache (sdpa). Greedy rows take the argmax; sampled rows draw with transformers'
predictor settings (top_k 50, top_p 0.8, temperature 1), seeded per request.

That is num_code_groups - 1 small forwards per frame (15 on the real checkpoint, ~1,500 kernel
launches), so on a GPU steps whose rows are all greedy (the shipped default) replay it as one
CUDA graph per padded row count (the batch ladder up to engine.max_graph_batch), all captured
at start-up (`enable_graphs`; on the CPU the same padded buffers run eagerly, which is how the
tests check them). Steps with sampled rows, or more rows, run it eagerly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from omni.core.sampling_params import SamplingParams
from omni.runtime.graph_cache import GraphCache, capture_graph
from omni.runtime.graph_shapes import batch_ladder
from omni.runtime.sampler import Sampler

Pick = Callable[[torch.Tensor, int], torch.Tensor]  # (logits [R, V], group) -> codes [R]


def _codes(talker: Any, hidden: torch.Tensor, code0: torch.Tensor, pick: Pick) -> torch.Tensor:
    """[R, num_code_groups - 1] residual codes of R frames (hidden [R, H], code 0 [R])."""
    predictor = talker.code_predictor
    embeds = torch.stack([hidden, talker.get_input_embeddings()(code0)], dim=1)
    cache = DynamicCache(config=predictor.config)
    codes: list[torch.Tensor] = []
    for group in range(talker.config.num_code_groups - 1):
        if group:
            embeds = predictor.model.get_input_embeddings()[group - 1](codes[-1]).unsqueeze(1)
        out = predictor.model(inputs_embeds=embeds, past_key_values=cache, use_cache=True)
        logits = predictor.lm_head[group](out.last_hidden_state)[:, -1].float()
        codes.append(pick(logits, group))
    return torch.stack(codes, dim=1)


def _greedy(logits: torch.Tensor, group: int) -> torch.Tensor:
    return logits.argmax(dim=-1)  # the sampler's choice for a greedy row


class _Graph:
    """One padded row count of the greedy predictor: captured on a GPU, eager buffers elsewhere."""

    def __init__(self, talker: Any, rows: int, hidden_dim: int, like: torch.Tensor, pool: Any):
        self._hidden = torch.zeros(rows, hidden_dim, dtype=like.dtype, device=like.device)
        self._code0 = torch.zeros(rows, dtype=torch.long, device=like.device)
        self._run = functools.partial(_codes, talker, self._hidden, self._code0, _greedy)
        self._graph = None
        if like.device.type == "cuda":
            self._graph, self._output = capture_graph(self._run, like.device, pool)

    def __call__(self, hidden: torch.Tensor, code0: torch.Tensor) -> torch.Tensor:
        rows = hidden.shape[0]  # the padding rows keep earlier inputs: their codes are dropped
        self._hidden[:rows].copy_(hidden)
        self._code0[:rows].copy_(code0)
        if self._graph is None:
            return self._run()[:rows]
        self._graph.replay()
        return self._output[:rows].clone()  # the next replay overwrites the output


class CodePredictor:
    def __init__(self, talker: Any, sampler: Sampler) -> None:
        self.talker = talker
        self.sampler = sampler
        self.graphs: GraphCache[_Graph] | None = None
        self.ladder: list[int] = []
        self.num_replayed = 0  # steps whose residual codes came from a graph (or its buffers)

    @torch.inference_mode()  # as the steps that replay them
    def enable_graphs(self, max_rows: int, *, required: bool = False) -> None:
        """Greedy steps of up to max_rows rows through padded graphs, every size captured now
        (a capture that fails leaves them eager, unless required); 0: none, any kept dropped."""
        self.ladder, self.graphs = [], None
        if max_rows < 1:
            return
        self.ladder = batch_ladder(max_rows)
        self.graphs = GraphCache(
            "Qwen3-Omni code predictor", max_graphs=len(self.ladder), required=required
        )
        param = self.talker.codec_head.weight
        for rows in self.ladder:
            self._entry(rows, param)

    def __call__(  # in the runner's inference mode
        self,
        hidden_states: torch.Tensor,
        token_ids: torch.Tensor,
        params: list[SamplingParams],
        num_output_tokens: list[int],
    ) -> torch.Tensor:
        """[R, num_code_groups - 1] codes for the R sampled rows (hidden [R, H], code 0 [R])."""
        rows = hidden_states.shape[0]
        if self.ladder and rows <= self.ladder[-1] and all(p.greedy for p in params):
            size = next(n for n in self.ladder if n >= rows)
            entry = self._entry(size, hidden_states)
            if entry is not None:
                self.num_replayed += 1
                return entry(hidden_states, token_ids)
        settings = [
            p if p.greedy else SamplingParams(temperature=1.0, top_k=50, top_p=0.8, seed=p.seed)
            for p in params
        ]
        num_groups = self.talker.config.num_code_groups

        def pick(logits: torch.Tensor, group: int) -> torch.Tensor:
            # Each row's draw counter: its frames so far, then this group (seeded rows repeat).
            counts = [n * num_groups + group + 1 for n in num_output_tokens]
            return self.sampler.sample(logits, settings, counts)

        return _codes(self.talker, hidden_states, token_ids, pick)

    def _entry(self, rows: int, like: torch.Tensor) -> _Graph | None:
        graphs = self.graphs
        if graphs is None:
            return None
        hidden_dim = self.talker.config.text_config.hidden_size
        build = lambda: _Graph(self.talker, rows, hidden_dim, like, graphs.pool)  # noqa: E731
        return graphs.get(rows, build, like.device)
