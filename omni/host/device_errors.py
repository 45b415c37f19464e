"""Which exceptions end a stage rather than the requests in flight: a CUDA error.

A device-side assert, an illegal memory access or a launch failure leaves the process's CUDA
context unusable ("sticky"): every later call on it fails, so the stage cannot recover the way it
recovers from a bad request on the CPU (StageEngine.fail_all). torch raises these as RuntimeError
(torch.AcceleratorError in newer versions, a RuntimeError too) with "CUDA error" in the message;
Triton's launcher says "Triton Error [CUDA]". Allocation failures are not sticky ("CUDA out of
memory", "CUDA error: out of memory", cuBLAS's ALLOC_FAILED): the context stays usable and only
the step fails. Classified by message, so the host needs no torch import.
"""

from __future__ import annotations

FATAL_MARKERS = ("CUDA error", "Triton Error [CUDA]", "CUDA driver error")
NOT_STICKY_MARKERS = ("out of memory", "ALLOC_FAILED")


def fatal_device_error(error: BaseException) -> BaseException | None:
    """The CUDA error in `error` or its causes (an adapter may wrap it), or None: what makes
    the stage's GPU context unusable (see the module docstring)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        message = str(current)
        if any(m in message for m in FATAL_MARKERS) and not any(
            m in message for m in NOT_STICKY_MARKERS
        ):
            return current
        current = current.__cause__ or current.__context__
    return None


def loop_death(error: BaseException) -> str:
    """Why a stage's loop ended, for its error: a CUDA error said as such (the stage is dead,
    not the loop's code broken)."""
    fatal = fatal_device_error(error)
    if fatal is None:
        return f"engine loop died: {type(error).__name__}: {error}"
    why = f"{type(fatal).__name__}: {fatal}"
    return f"died of a CUDA error, which leaves its GPU context unusable: {why}"
