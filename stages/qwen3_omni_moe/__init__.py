"""Qwen3-Omni stages: thinker (MoE; text + image + audio in, text out), talker (one codec frame
per step: codec_head + the code predictor), code2wav (frames -> 24 kHz waveform).

``prompt_processor.Qwen3OmniPromptProcessor`` builds the thinker's input; ``thinker``, ``talker``
and ``code2wav`` are the adapters; ``input_processors`` the edges between them. Modules are
imported on use (the "module:attr" names in the manifest, family.py).
"""
