import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def qwen2_dir() -> str:
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("qwen2", "tiny", 0))


@pytest.fixture(scope="session")
def llama_dir() -> str:
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("llama", "tiny", 0))


@pytest.fixture(scope="module")
def omni_dir():
    """The tiny Qwen2.5-Omni checkpoint, with one torch thread for the module (see below)."""
    import torch

    from tools.make_tiny_checkpoint import ensure_checkpoint

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield str(ensure_checkpoint("qwen2_5_omni", "tiny"))
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models gain nothing from threads, and on a busy 2-core machine every OpenMP region
    waits for a descheduled peer thread (measured 10-50x slower with 2 threads under load)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def pytest_collection_modifyitems(config, items):
    """`cuda` tests run only where torch sees a GPU (CI has none: they show as skipped)."""
    # The marker, not the keyword: keywords include the path, and tests/cuda/test_tf32_off.py
    # runs everywhere.
    cuda_items = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not cuda_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    for item in cuda_items:
        item.add_marker(skip)
