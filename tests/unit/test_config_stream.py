"""The `stream:` section of a stage config: who may stream, and its refusals."""

from __future__ import annotations

from tests.unit.config_support import error_of, make_model


def test_a_root_stage_that_streams_is_a_config_error(tmp_path):
    """stream.enabled needs one input whose processor streams; a root stage has none (its
    message once read a dotted attribute and raised AttributeError instead)."""
    model = make_model(tmp_path / "ckpt")
    error_of(
        {"stages": [{"name": "a", "model": model, "stream": {"enabled": True}}]},
        "stages.a.stream.enabled",
        "got None",
    )
