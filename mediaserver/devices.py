"""Pick where Whisper runs and with which CTranslate2 compute type.

GPUs with compute capability 7.0 or newer have fast int8 tensor paths with float16 activations;
older ones only do int8 well. Without CUDA we run int8 on the CPU, which is 3-4x faster than float32
at nearly the same accuracy.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    compute_capability: tuple[int, int]
    total_memory_bytes: int


@dataclass(frozen=True)
class DeviceChoice:
    device: Literal["cpu", "cuda"]
    compute_type: str
    cpu_threads: int
    device_index: tuple[int, ...]
    gpus: tuple[GpuInfo, ...]
    reason: str


def probe_gpus() -> tuple[GpuInfo, ...]:
    """List NVIDIA GPUs through NVML; an empty tuple when there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return ()
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode()
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(GpuInfo(index, str(name), (int(major), int(minor)), int(memory.total)))
        return tuple(gpus)
    except Exception as exc:
        log.warning("NVML query failed: %s", exc)
        return ()
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def ctranslate2_cuda_devices() -> int:
    try:
        import ctranslate2

        return int(ctranslate2.get_cuda_device_count())
    except Exception:
        return 0


def compute_type_for_capability(capability: tuple[int, int]) -> str:
    return "int8_float16" if capability >= (7, 0) else "int8"


def choose_device(
    requested_device: str = "auto",
    requested_compute_type: str = "auto",
    requested_cpu_threads: int = 0,
    *,
    gpus: tuple[GpuInfo, ...] | None = None,
    ctranslate2_cuda_count: int | None = None,
    cpu_count: int | None = None,
) -> DeviceChoice:
    """Decide device and compute type; probes the machine for whatever is not passed in."""
    if gpus is None:
        gpus = probe_gpus() if requested_device != "cpu" else ()
    if ctranslate2_cuda_count is None:
        ctranslate2_cuda_count = ctranslate2_cuda_devices() if gpus else 0
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)

    usable_gpus = tuple(g for g in gpus if g.index < ctranslate2_cuda_count)
    if requested_device == "cuda" and not usable_gpus:
        raise RuntimeError("device=cuda was requested but no CUDA device is usable by CTranslate2")
    if requested_device != "cpu" and usable_gpus:
        # The weakest GPU decides: CTranslate2 replicates the model on every listed device.
        weakest = min(g.compute_capability for g in usable_gpus)
        compute_type = (
            requested_compute_type if requested_compute_type != "auto" else compute_type_for_capability(weakest)
        )
        return DeviceChoice(
            device="cuda",
            compute_type=compute_type,
            # On a GPU the CPU only feeds it: a few threads are enough unless asked otherwise.
            cpu_threads=requested_cpu_threads or min(cores, 4),
            device_index=tuple(g.index for g in usable_gpus),
            gpus=usable_gpus,
            reason=f"CUDA compute capability {weakest[0]}.{weakest[1]}",
        )
    compute_type = requested_compute_type if requested_compute_type != "auto" else "int8"
    reason = "no CUDA device found" if requested_device == "auto" else "device=cpu requested"
    return DeviceChoice(
        device="cpu",
        compute_type=compute_type,
        cpu_threads=requested_cpu_threads or cores,
        device_index=(0,),
        gpus=(),
        reason=reason,
    )
