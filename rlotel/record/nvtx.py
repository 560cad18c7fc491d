"""NVTX ranges named exactly like the spans, so Nsight and the trace UI show the same words.

Backend choice (once, at import): the `nvtx` package when importable and a tool such as
Nsight Systems is attached to receive the ranges (as verl does, with colours), else
`torch.cuda.nvtx` when torch is already imported and CUDA is available, else nothing.
Tests inject a recording backend with `set_backend`.
"""

from __future__ import annotations

import sys
from typing import Protocol


class NvtxBackend(Protocol):
    """Push/pop of a named range on the calling thread."""

    def push(self, name: str, color: str | None) -> None: ...

    def pop(self) -> None: ...


class _NvtxPackage:
    """The `nvtx` package's domain API with event attributes cached per (name, colour)."""

    MAX_CACHED = 4096

    def __init__(self, module) -> None:
        self._domain = module.get_domain()
        self._attributes: dict[tuple[str, str | None], object] = {}
        self.pop = self._domain.pop_range

    def push(self, name: str, color: str | None) -> None:
        key = (name, color)
        attributes = self._attributes.get(key)
        if attributes is None:
            attributes = self._domain.get_event_attributes(message=name, color=color)
            if len(self._attributes) < self.MAX_CACHED:
                self._attributes[key] = attributes
        self._domain.push_range(attributes)


class _TorchCudaNvtx:
    def __init__(self, module) -> None:
        self._range_push = module.range_push
        self.pop = module.range_pop

    def push(self, name: str, color: str | None) -> None:
        self._range_push(name)  # torch's ranges take no colour


def detect_backend() -> NvtxBackend | None:
    try:
        import nvtx
    except ImportError:
        pass
    else:
        # Without an attached tool (Nsight sets NVTX_INJECTION64_PATH before start) the
        # package hands out a dummy domain that records nothing: skip the calls entirely.
        dummy = getattr(getattr(nvtx, "_lib", None), "DummyDomain", ())
        if isinstance(nvtx.get_domain(), dummy):
            return None
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
