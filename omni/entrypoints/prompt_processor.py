"""The user-facing import path of the prompt processor, defined below the entrypoints in
omni/engine/prompt_processor.py (where stages/ subclass it without importing the top layer)."""

from __future__ import annotations

from omni.engine.prompt_processor import PromptProcessor as PromptProcessor
from omni.engine.prompt_processor import has_tokenizer_files as has_tokenizer_files
from omni.engine.prompt_processor import load_tokenizer as load_tokenizer
