"""`omni run`: one prompt through the pipeline, printed for a person (or as JSON).

A chat model's prompt goes through its chat template unless `--raw`: an instruct model fed the
bare text often answers nothing at all. The answer is printed as plain text, then one summary
line: tokens, time to first token, tokens/s and the prompt tokens each stage took from its prefix
cache.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from omni.config import ConfigError, OmniConfig
from omni.messages import OmniOutput, StageResult

EXIT_CONFIG = 2
EXIT_FAILED = 1


def run(args: argparse.Namespace, config: OmniConfig) -> int:
    from omni.entrypoints.omni import Omni

    try:
        with Omni(config) as omni:
            prompt = _prompt(omni, args)
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
        from omni.audio import write_wav

        write_wav(args.output_wav, final.audio, final.sample_rate)
        wav = args.output_wav
    if args.json:
        print(json.dumps(as_json(output, config, wav), indent=2))
    else:
        _print(output, config, wav)
    if output.error is not None:
        print(f"omni: request failed: {output.error}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _prompt(omni: Any, args: argparse.Namespace) -> dict[str, Any]:
    tokenizer = omni.engine.prompt_processor.tokenizer
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


def _text_stage(output: OmniOutput, config: OmniConfig) -> StageResult | None:
    texts = [r for r in output.stages.values() if r.text is not None]
    return texts[-1] if texts else None


def _print(output: OmniOutput, config: OmniConfig, wav: str | None) -> None:
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
        parts.append(f"audio {final.audio.numel() / final.sample_rate:.2f} s")
    if wav is not None:
        parts.append(f"wrote {wav}")
    print(f"[omni] {'; '.join(parts)}")


def as_json(output: OmniOutput, config: OmniConfig, wav: str | None = None) -> dict[str, Any]:
    """A machine-readable result: the text, every stage's tokens and timings, the audio."""
    text = _text_stage(output, config)
    final = output.final
    audio = None
    if final.audio is not None and final.sample_rate:
        audio = {
            "seconds": final.audio.numel() / final.sample_rate,
            "sample_rate": final.sample_rate,
            "wav": wav,
        }
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
            }
            for name, r in output.stages.items()
        },
        "audio": audio,
    }
