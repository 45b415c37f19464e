"""Our top-level `kernels` package shares its import name with a PyPI package that transformers
probes for; transformers must not mistake ours for it."""

from transformers.utils import import_utils


def test_transformers_does_not_see_a_kernels_hub_package():
    assert import_utils.is_kernels_available() is False
