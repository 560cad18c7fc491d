"""Test stand-in, not part of rlotel: a CPU platform for verl 0.9.1, which ships only
nvidia/npu/rocm ones. verl loads it in every process through its own hook
(`VERL_USE_EXTERNAL_MODULES=rlotel_test_cpu_platform`, `VERL_PLATFORM=cpu`).

Ray keeps its "GPU" resource (the test starts Ray with fake GPUs), so verl's placement code
runs unchanged. Fixes ride along, each for an error the e2e runs meet on CPU:
- verl asks torch for backend "cpu:gloo,cpu:gloo" ("Duplicate device type cpu"): plain gloo;
- vLLM-CPU prepacks linear weights and drops `weight_loader`, so verl's weight sync fails
  ("'Parameter' object has no attribute 'weight_loader'"): keep the live weight, F.linear;
- verl loads a PPO critic with `attn_implementation="flash_attention_2"` hard-coded (there is
  no FlashAttention on CPU): torch's sdpa instead;
- verl's FSDP2 engine offloads forward-only models (the reference policy) with pinned memory,
  which needs an accelerator: the same offload, unpinned.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

_SPECIAL = {
    "mem_get_info": lambda *a, **k: (64 << 30, 64 << 30),
    "get_device_name": lambda *a, **k: "cpu",
    "get_rng_state": lambda *a, **k: torch.get_rng_state(),
    "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
}


class CPUDeviceModule:
    """`torch.cpu`, with the torch.cuda memory and statistics calls verl makes as no-ops."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # e.g. ABCMeta's __isabstractmethod__ probe
            raise AttributeError(name)
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name == "memory":
            return self
        return _SPECIAL.get(name, lambda *a, **k: 0)


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    device_name = "cpu"
    vendor_name = "cpu"
    device_module = CPUDeviceModule()

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return os.environ.get("VERL_PLATFORM") == "cpu"

    def current_device(self) -> str:
        return "cpu"  # verl does `tensor.to(get_device_id())`: an int means cuda:<n>

    def device_count(self) -> int:
        return 1

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def set_device(self, device_index: int) -> None: ...
    def synchronize(self, device_index: int | None = None) -> None: ...
    def set_allocator_settings(self, settings: str) -> None: ...
    def empty_cache(self) -> None: ...
    def profiler_start(self) -> None: ...
    def profiler_stop(self) -> None: ...
    def cudart(self) -> None: ...


_init_process_group = dist.init_process_group


def init_process_group(*args: Any, **kwargs: Any) -> Any:
    if str(kwargs.get("backend", "")).replace(" ", "") == "cpu:gloo,cpu:gloo":
        kwargs["backend"] = "gloo"
    return _init_process_group(*args, **kwargs)


dist.init_process_group = init_process_group


def _live_weight_gemm() -> None:
    import vllm.model_executor.layers.utils as layer_utils

    prepack = layer_utils.dispatch_cpu_unquantized_gemm

    def dispatch(layer: Any, remove_weight: bool) -> None:
        if layer.weight.is_meta or layer.weight.ndim != 2:
            return prepack(layer, remove_weight)
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch


if "vllm" in sys.modules:  # the vLLM server and its engine worker
    _live_weight_gemm()


def _sdpa_for_flash_attention() -> None:
    from transformers import PreTrainedModel

    load = PreTrainedModel.from_pretrained.__func__

    def from_pretrained(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("attn_implementation") == "flash_attention_2":
            kwargs["attn_implementation"] = "sdpa"
        return load(cls, *args, **kwargs)

    PreTrainedModel.from_pretrained = classmethod(from_pretrained)


def _unpinned_offload() -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy

    init = CPUOffloadPolicy.__init__

    def unpinned(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.pin_memory = False

    CPUOffloadPolicy.__init__ = unpinned


_sdpa_for_flash_attention()
_unpinned_offload()
