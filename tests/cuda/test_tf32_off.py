"""tests/cuda/conftest.py turns TF32 off for the modules here. Not a `cuda` test: the flags exist
in every torch build, so CI checks the fixture too."""

from __future__ import annotations

import torch


def test_tf32_is_off_in_tests_cuda():
    assert not torch.backends.cuda.matmul.allow_tf32
    assert not torch.backends.cudnn.allow_tf32
