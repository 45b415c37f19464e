"""Torch side of a stage: model runner, paged attention hook, output cache, sampler."""
