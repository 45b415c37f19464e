"""Qwen2.5-Omni stages: thinker (text + image + audio in, text out), talker, token2wav.

Thinker side: ``prompt_processor.OmniPromptProcessor`` turns user prompts with images and audio
into token ids, multimodal ranges and encoder inputs; ``thinker.OmniThinkerAdapter`` runs the
thinker on omni's paged attention, with per-item encoder outputs kept in ``encoder_cache``.
Talker: ``talker.OmniTalkerAdapter``; vocoder: ``token2wav.OmniToken2WavAdapter``; the edges
between them: ``input_processors``. ``family.py`` declares them all; omni imports each module on
first use (the manifest's "module:attr" names), so importing this package stays cheap.
"""
