"""veRL on CPU: a platform whose device is ``cpu`` and whose collectives run on gloo.

veRL 0.9.1 knows CUDA, ROCm and Ascend NPUs; on a machine with none of them
it falls back to ``nvidia`` and fails at the first collective (``nccl2
requires at least one CUDA device``). :class:`CpuPlatform` is registered in
veRL's platform registry under :data:`PLATFORM` and chosen with
``VERL_PLATFORM=openforge-cpu``; :func:`install` also

* makes the workers' process group plain ``gloo``: veRL asks for
  ``cpu:gloo,{device}:{backend}``, which on CPU names the device ``cpu``
  twice (``Duplicate device type cpu``);
* registers veRL's FSDP/FSDP2 engines for the ``cpu`` device (veRL registers
  them for ``cuda`` and ``npu`` only).

Ray still schedules veRL's workers on ``GPU`` resources, so the local Ray
cluster declares logical GPUs, one per worker (:mod:`verl_launch`).

This is for tests, laptops and CI; on GPUs the same plan drops these keys
(docs/trainer.md; not run on a GPU here). It touches veRL internals, so veRL
is pinned and the veRL trainer test is the alarm when an upgrade breaks them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM = "openforge-cpu"
ENV = "VERL_PLATFORM"


def _meminfo() -> tuple[int, int]:
    """(available, total) bytes of this machine's memory, from /proc/meminfo."""
    fields: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            fields[name] = int(rest.split()[0]) * 1024
    return fields.get("MemAvailable", 0), fields.get("MemTotal", 0)


def _device_module() -> ModuleType:
    """``torch.cpu`` with the ``torch.cuda`` functions veRL calls on its device module.

    Memory figures are the machine's (free, total) or 0; RNG state is torch's
    global generator; caches and IPC handles do not exist on CPU.
    """
    module = ModuleType("openforge_cpu_device", doc=_device_module.__doc__)
    module.__dict__.update({k: v for k, v in vars(torch.cpu).items() if not k.startswith("_")})
    module.__dict__.update(
        empty_cache=lambda: None,
        ipc_collect=lambda: None,
        mem_get_info=lambda device=None: _meminfo(),
        memory_allocated=lambda device=None: 0,
        memory_reserved=lambda device=None: 0,
        max_memory_allocated=lambda device=None: 0,
        max_memory_reserved=lambda device=None: 0,
        reset_peak_memory_stats=lambda device=None: None,
        set_per_process_memory_fraction=lambda fraction, device=None: None,
        get_rng_state=lambda device=None: torch.get_rng_state(),
        set_rng_state=lambda state, device=None: torch.set_rng_state(state),
        get_device_name=lambda device=None: "cpu",
    )
    return module


_DEVICE_MODULE = _device_module()


class CpuPlatform(PlatformBase):
    """Device ``cpu``, collectives on gloo, Ray's (logical) ``GPU`` resource per worker."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "openforge"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return os.environ.get(ENV, "").strip().lower() == PLATFORM

    def current_device(self) -> Any:
        # veRL moves modules to ``current_device()``; an int would mean ``cuda:N``
        return torch.cpu.current_device()  # "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        del device_index  # one device, the CPU

    def synchronize(self, device_index: int | None = None) -> None:
        del device_index

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        del settings

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for its (logical) GPUs

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        del msg
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _gloo_process_group(original: Any) -> Any:
    def initialize_global_process_group_ray(
        timeout_second: int | None = None, backend: str | None = None
    ) -> Any:
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray.__wrapped__ = original  # type: ignore[attr-defined]
    return initialize_global_process_group_ray


def install() -> None:
    """Register the platform; on it, gloo process groups and the FSDP engines for ``cpu``.

    Idempotent. The process-group and engine changes apply only in a process
    whose ``VERL_PLATFORM`` is this platform, so importing the plugin on a GPU
    machine changes nothing.
    """
    PlatformRegistry.register(platform=PLATFORM)(CpuPlatform)
    if os.environ.get(ENV, "").strip().lower() != PLATFORM:
        return
    from verl.utils import distributed
    from verl.workers import engine_workers

    for module in (distributed, engine_workers):
        current = getattr(module, "initialize_global_process_group_ray")  # noqa: B009
        if not hasattr(current, "__wrapped__"):
            setattr(module, "initialize_global_process_group_ray", _gloo_process_group(current))  # noqa: B010
    _register_fsdp_for_cpu()


def _register_fsdp_for_cpu() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    registry = EngineRegistry._engines
    for model_type, cls in (
        ("language_model", transformer_impl.FSDPEngineWithLMHead),
        ("value_model", transformer_impl.FSDPEngineWithValueHead),
    ):
        for backend in ("fsdp", "fsdp2"):
            registry.setdefault(model_type, {}).setdefault(backend, {}).setdefault("cpu", cls)
