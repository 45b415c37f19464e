"""`omni run`: one prompt through the pipeline, printed for a person (or as JSON).

A chat model's prompt goes through its chat template unless `--raw`: an instruct model fed the
bare text often answers nothing at all. The answer is printed as plain text, then one summary
line: tokens, time to first token, tokens/s and the prompt tokens each stage took from its prefix
cache.

`--stream-audio` runs the streaming path (`Omni.stream`): the talker starts before the thinker has
finished, the vocoder decodes in chunks, and `--output-wav` grows chunk by chunk as they arrive
(its header is patched after every write, so the file is a valid WAV at every moment). The
summary then adds the audio chunks, the time to first audio and the real-time factor.
"""

from __future__ import annotations

import argparse
import json
import sys
import wave
from pathlib import Path
from typing import Any

from omni.config import ConfigError, OmniConfig
from omni.core.logprobs import TokenLogprobs
from omni.messages import OmniOutput, StageResult

EXIT_CONFIG = 2
EXIT_FAILED = 1


def run(args: argparse.Namespace, config: OmniConfig) -> int:
    from omni.entrypoints.omni import Omni

    try:
        with Omni(config) as omni:
            prompt = _prompt(omni, args)
            chunks = None
            if args.stream_audio:
                output, chunks = _streamed(omni, prompt, args.output_wav)
            else:
                (output,) = omni.generate([prompt], use_tqdm=False)
    except ConfigError as e:  # e.g. the stages do not fit the Ray cluster's resources
        print(f"omni: config error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except ValueError as e:  # a bad prompt (e.g. images for a text-only root stage)
        print(f"omni: {e}", file=sys.stderr)
        return EXIT_FAILED
    wav = None
    if output.error is None and args.output_wav:
        final = output.final
        if final.audio is None or final.sample_rate is None:
            print(
                f"omni: --output-wav: the final stage {final.stage!r} produced no audio",
                file=sys.stderr,
            )
            return EXIT_FAILED
        if chunks is None:  # streamed: _streamed wrote it as the chunks came
            from omni.audio import write_wav

            write_wav(args.output_wav, final.audio, final.sample_rate)
        wav = args.output_wav
    if args.json:
        print(json.dumps(as_json(output, config, wav, chunks), indent=2))
    else:
        _print(output, config, wav, chunks)
    if output.error is not None:
        print(f"omni: request failed: {output.error}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _prompt(omni: Any, args: argparse.Namespace) -> dict[str, Any]:
    tokenizer = omni.async_omni.prompt_processor.tokenizer
    if args.raw or tokenizer is None or not getattr(tokenizer, "chat_template", None):
        prompt: dict[str, Any] = {"prompt": args.prompt}
        if args.image:
            prompt["images"] = list(args.image)
        return prompt
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": path}} for path in args.image
    ]
    content = [*parts, {"type": "text", "text": args.prompt}] if parts else args.prompt
    chat: dict[str, Any] = omni.chat_prompt([{"role": "user", "content": content}])
    return chat


def _streamed(omni: Any, prompt: dict[str, Any], wav_path: str | None) -> tuple[OmniOutput, int]:
    """Run the prompt with `Omni.stream`, appending each audio chunk to `wav_path` as it comes;
    the request's output (as `generate` would return it) and the number of audio chunks. A
    request that fails leaves the WAV with the audio that came before the failure."""
    finished: dict[str, StageResult] = {}
    chunks = 0
    wav = _WavStream(wav_path) if wav_path else None
    try:
        for result in omni.stream([prompt], stream_audio=True):
            if result.finished:
                finished[result.stage] = result
            else:  # Omni.stream's only partial results: the audio stage's new samples
                chunks += 1
                if wav is not None and result.sample_rate:  # a vocoder's chunks carry it
                    wav.write(result.audio, result.sample_rate)
    finally:
        if wav is not None:
            wav.close()
    return _output(finished, omni.config), chunks


def _output(finished: dict[str, StageResult], config: OmniConfig) -> OmniOutput:
    """The finished OmniOutput of one request from its stages' finished results: the final
    stage's result, or the one that failed the request (the stages after it never finish)."""
    stages = {name: finished[name] for name in config.topological_order() if name in finished}
    failed = next((r for r in stages.values() if r.error is not None), None)
    final = failed if failed is not None else stages[config.final_stage.name]
    return OmniOutput(
        request_id=final.request_id,
        stages=stages,
        final=final,
        error=failed.error if failed is not None else None,
    )


class _WavStream:
    """A mono 16-bit PCM WAV written chunk by chunk, opened at the first chunk (which brings
    the sample rate). stdlib `wave` rewrites the header's sizes after every write, so the file
    is valid whenever a chunk has been written; the samples are omni.audio.write_wav's."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: wave.Wave_write | None = None

    def write(self, audio: Any, sample_rate: int) -> None:
        from omni.entrypoints.openai.audio_encoding import pcm16

        if self._file is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            # Closed by close(); opened here because the first chunk brings the sample rate.
            self._file = wave.open(self.path, "wb")  # noqa: SIM115
            self._file.setnchannels(1)
            self._file.setsampwidth(2)
            self._file.setframerate(int(sample_rate))
        self._file.writeframes(pcm16(audio).tobytes())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _text_stage(output: OmniOutput, config: OmniConfig) -> StageResult | None:
    texts = [r for r in output.stages.values() if r.text is not None]
    return texts[-1] if texts else None


def _print(
    output: OmniOutput, config: OmniConfig, wav: str | None, chunks: int | None = None
) -> None:
    text = _text_stage(output, config)
    if text is not None:
        print(text.text)
    parts = []
    if text is not None:
        parts.append(f"{len(text.token_ids)} tokens")
        first = text.timings.get("first_token_s")
        if first is not None:
            parts.append(f"first token {first:.3f} s")
            decode_s = text.timings.get("finished_s", first) - first
            if len(text.token_ids) > 1 and decode_s > 0:
                parts.append(f"{(len(text.token_ids) - 1) / decode_s:.1f} tokens/s")
    cached = ", ".join(
        f"{name} {r.num_cached_tokens}"
        for name, r in output.stages.items()
        if config.stage(name).kind == "ar" and r.error is None
    )
    if cached:
        parts.append(f"cached prompt tokens: {cached}")
    final = output.final
    if final.audio is not None and final.sample_rate:
        seconds = f"audio {final.audio.numel() / final.sample_rate:.2f} s"
        parts.append(seconds if chunks is None else f"{seconds} in {chunks} chunks")
        if chunks is not None:  # streamed: how soon the audio began, how fast it came
            first, rtf = final.timings.get("first_audio_s"), final.timings.get("rtf")
            if first is not None:
                parts.append(f"first audio {first:.3f} s")
            if rtf is not None:
                parts.append(f"RTF {rtf:.3f}")
    if wav is not None:
        parts.append(f"wrote {wav}")
    print(f"[omni] {'; '.join(parts)}")


def as_json(
    output: OmniOutput, config: OmniConfig, wav: str | None = None, chunks: int | None = None
) -> dict[str, Any]:
    """A machine-readable result: the text, every stage's tokens and timings, the audio (with
    the number of chunks it came in when streamed)."""
    text = _text_stage(output, config)
    final = output.final
    audio = None
    if final.audio is not None and final.sample_rate:
        audio = {
            "seconds": final.audio.numel() / final.sample_rate,
            "sample_rate": final.sample_rate,
            "wav": wav,
        }
        if chunks is not None:
            audio["chunks"] = chunks
    return {
        "request_id": output.request_id,
        "text": text.text if text is not None else None,
        "error": output.error,
        "stages": {
            name: {
                "token_ids": r.token_ids,
                "text": r.text,
                "finish_reason": r.finish_reason,
                "num_prompt_tokens": r.num_prompt_tokens,
                "num_cached_tokens": r.num_cached_tokens,
                **{k: round(v, 6) for k, v in r.timings.items()},
                **_logprobs(r),
            }
            for name, r in output.stages.items()
        },
        "audio": audio,
    }


def _logprobs(result: StageResult) -> dict[str, Any]:
    """sampling.logprobs / prompt_logprobs set: [logprob, [[token id, logprob], ...]] per token
    (null for the first prompt token)."""

    def rows(entries: list[TokenLogprobs | None]) -> list[Any]:
        return [None if e is None else [e.logprob, [list(t) for t in e.top]] for e in entries]

    out = {}
    if result.logprobs is not None:
        out["logprobs"] = rows(list(result.logprobs))
    if result.prompt_logprobs is not None:
        out["prompt_logprobs"] = rows(result.prompt_logprobs)
    return out
