"""NVTX ranges named exactly like the spans, so Nsight and the trace UI show the same words.

Backend choice (once, at import of the ledger): the `nvtx` package when importable (as verl
does, with colours and domains), else `torch.cuda.nvtx` when torch is already imported and
CUDA is available, else nothing. Tests inject a recording backend with `set_backend`.
"""

from __future__ import annotations

import sys
from typing import Protocol


class NvtxBackend(Protocol):
    """Push/pop of a named range on the calling thread."""

    def push(self, name: str, color: str | None) -> None: ...

    def pop(self) -> None: ...


class _NvtxPackage:
    def __init__(self, module) -> None:
        self._push_range = module.push_range
        self._pop_range = module.pop_range

    def push(self, name: str, color: str | None) -> None:
        self._push_range(message=name, color=color)

    def pop(self) -> None:
        self._pop_range()


class _TorchCudaNvtx:
    def __init__(self, module) -> None:
        self._range_push = module.range_push
        self._range_pop = module.range_pop

    def push(self, name: str, color: str | None) -> None:
        self._range_push(name)

    def pop(self) -> None:
        self._range_pop()


def detect_backend() -> NvtxBackend | None:
    try:
        import nvtx
    except ImportError:
        pass
    else:
        return _NvtxPackage(nvtx)
    torch = sys.modules.get("torch")  # importing torch here would cost seconds for non-users
    if torch is not None and torch.cuda.is_available():
        return _TorchCudaNvtx(torch.cuda.nvtx)
    return None


_backend: NvtxBackend | None = detect_backend()


def backend() -> NvtxBackend | None:
    return _backend


def set_backend(new: NvtxBackend | None) -> NvtxBackend | None:
    """Replace the process-wide backend (tests, custom tools); returns the previous one."""
    global _backend
    previous, _backend = _backend, new
    return previous
