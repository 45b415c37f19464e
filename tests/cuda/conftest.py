"""The tests here compare float32 on the GPU with float32 references (transformers on the same GPU
or on the CPU): TF32 is off while each of their modules runs, so that a difference means a bug
and not TF32's 10-bit mantissa in matmuls and convolutions. Module-scoped and autouse, it is set
before the modules' own fixtures compute references, and torch's settings come back afterwards
(the rest of the suite keeps its defaults)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def tf32_off():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
