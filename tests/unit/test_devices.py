"""Device and compute-type choice: pure decision logic fed with explicit GPU lists."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mediaserver.devices import GpuInfo, choose_device, compute_type_for_capability

GIB = 1024**3


def gpu(index: int, capability: tuple[int, int], name: str = "Test GPU") -> GpuInfo:
    return GpuInfo(index=index, name=name, compute_capability=capability, total_memory_bytes=8 * GIB)


def test_no_gpu_runs_int8_on_cpu() -> None:
    choice = choose_device(gpus=(), ctranslate2_cuda_count=0, cpu_count=12)
    assert choice.device == "cpu"
    assert choice.compute_type == "int8"
    assert choice.cpu_threads == 12
    assert choice.device_index == (0,)
    assert choice.gpus == ()
    assert "no CUDA" in choice.reason


@pytest.mark.parametrize(
    ("capability", "compute_type"),
    [((7, 0), "int8_float16"), ((8, 6), "int8_float16"), ((9, 0), "int8_float16"), ((6, 1), "int8"), ((5, 2), "int8")],
)
def test_capability_decides_compute_type(capability: tuple[int, int], compute_type: str) -> None:
    choice = choose_device(gpus=(gpu(0, capability),), ctranslate2_cuda_count=1, cpu_count=16)
    assert choice.device == "cuda"
    assert choice.compute_type == compute_type
    assert compute_type_for_capability(capability) == compute_type
    assert choice.device_index == (0,)
    assert choice.gpus == (gpu(0, capability),)
    assert f"{capability[0]}.{capability[1]}" in choice.reason
    assert choice.cpu_threads == 4  # the GPU does the work; a few threads feed it


def test_cuda_threads_not_above_core_count() -> None:
    choice = choose_device(gpus=(gpu(0, (8, 6)),), ctranslate2_cuda_count=1, cpu_count=2)
    assert choice.cpu_threads == 2


@pytest.mark.parametrize(
    ("capabilities", "compute_type"),
    [
        (((8, 6), (6, 1)), "int8"),
        (((6, 1), (8, 6)), "int8"),
        (((9, 0), (7, 0), (8, 9)), "int8_float16"),
        (((7, 5), (5, 2), (8, 0)), "int8"),
    ],
)
def test_mixed_gpus_weakest_decides(capabilities: tuple[tuple[int, int], ...], compute_type: str) -> None:
    gpus = tuple(gpu(i, cap) for i, cap in enumerate(capabilities))
    choice = choose_device(gpus=gpus, ctranslate2_cuda_count=len(gpus), cpu_count=8)
    assert choice.device == "cuda"
    assert choice.compute_type == compute_type
    assert choice.device_index == tuple(range(len(gpus)))
    weakest = min(capabilities)
    assert f"{weakest[0]}.{weakest[1]}" in choice.reason


@pytest.mark.parametrize("requested", ["float16", "int8", "float32", "int8_float32"])
def test_requested_compute_type_wins_on_cuda(requested: str) -> None:
    choice = choose_device("auto", requested, gpus=(gpu(0, (8, 6)),), ctranslate2_cuda_count=1, cpu_count=8)
    assert (choice.device, choice.compute_type) == ("cuda", requested)


@pytest.mark.parametrize("requested", ["float32", "int8_float32", "int16"])
def test_requested_compute_type_wins_on_cpu(requested: str) -> None:
    choice = choose_device("auto", requested, gpus=(), ctranslate2_cuda_count=0, cpu_count=8)
    assert (choice.device, choice.compute_type) == ("cpu", requested)


def test_device_cpu_ignores_gpus() -> None:
    choice = choose_device("cpu", gpus=(gpu(0, (8, 6)), gpu(1, (9, 0))), ctranslate2_cuda_count=2, cpu_count=6)
    assert choice.device == "cpu"
    assert choice.compute_type == "int8"
    assert choice.cpu_threads == 6
    assert choice.gpus == ()
    assert "device=cpu" in choice.reason


def test_device_cuda_explicit() -> None:
    choice = choose_device("cuda", gpus=(gpu(0, (6, 1)),), ctranslate2_cuda_count=1, cpu_count=8)
    assert (choice.device, choice.compute_type) == ("cuda", "int8")


@pytest.mark.parametrize(
    ("gpus", "ct2_count"),
    [((), 0), ((gpu(0, (8, 6)),), 0), ((gpu(1, (8, 6)),), 1)],
    ids=["no-gpu", "ct2-without-cuda", "gpu-index-not-visible-to-ct2"],
)
def test_device_cuda_without_usable_gpu_raises(gpus: tuple[GpuInfo, ...], ct2_count: int) -> None:
    with pytest.raises(RuntimeError, match="device=cuda"):
        choose_device("cuda", gpus=gpus, ctranslate2_cuda_count=ct2_count, cpu_count=8)


def test_nvml_gpus_but_ctranslate2_without_cuda_falls_back_to_cpu() -> None:
    choice = choose_device(gpus=(gpu(0, (8, 6)), gpu(1, (8, 6))), ctranslate2_cuda_count=0, cpu_count=8)
    assert choice.device == "cpu"
    assert choice.compute_type == "int8"
    assert choice.cpu_threads == 8
    assert choice.gpus == ()


def test_only_gpus_ctranslate2_sees_are_used() -> None:
    gpus = (gpu(0, (8, 6)), gpu(1, (6, 1)))
    choice = choose_device(gpus=gpus, ctranslate2_cuda_count=1, cpu_count=8)
    assert choice.device_index == (0,)
    assert choice.gpus == (gpus[0],)
    assert choice.compute_type == "int8_float16"  # the unusable older GPU does not drag it down


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_explicit_cpu_threads_honoured_on_cpu(device: str) -> None:
    choice = choose_device(device, "auto", 3, gpus=(), ctranslate2_cuda_count=0, cpu_count=32)
    assert choice.cpu_threads == 3
    choice = choose_device(device, "auto", 64, gpus=(), ctranslate2_cuda_count=0, cpu_count=2)
    assert choice.cpu_threads == 64


def test_explicit_cpu_threads_honoured_on_cuda() -> None:
    choice = choose_device("auto", "auto", 8, gpus=(gpu(0, (8, 6)),), ctranslate2_cuda_count=1, cpu_count=32)
    assert choice.cpu_threads == 8


def test_this_machine_has_no_gpu() -> None:
    choice = choose_device()
    assert choice.device == "cpu"
    assert choice.compute_type == "int8"
    assert choice.cpu_threads == (os.cpu_count() or 1)
    assert choice.gpus == ()


def test_malloc_arenas_are_capped_on_glibc() -> None:
    import sys

    from mediaserver.cli import limit_malloc_arenas

    assert limit_malloc_arenas(0) is False  # 0 keeps glibc's default
    if sys.platform.startswith("linux"):
        assert limit_malloc_arenas(2) is True


ARENA_PROBE = """
import ctypes, sys, threading
from mediaserver import cli

async def probe(settings, listening=None):  # in place of the server: what the process is like once main() has set it up
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    ready = threading.Barrier(6)
    def work():
        pointer = libc.malloc(4096)
        ready.wait()  # five threads allocating at once
        libc.free(pointer)
    threads = [threading.Thread(target=work) for _ in range(5)]
    for thread in threads:
        thread.start()
    ready.wait()
    for thread in threads:
        thread.join()
    libc.malloc_stats()  # one "Arena N:" block per arena, on stderr

cli.serve = probe
sys.exit(cli.main([]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_malloc_arena_max_caps_the_arenas_of_the_server_process() -> None:
    """``python -m mediaserver`` with MEDIASERVER_MALLOC_ARENA_MAX=1: threads allocating at once share
    one arena (the default, 2, gives them two; glibc's own, one each)."""
    env = {**os.environ, "MEDIASERVER_MALLOC_ARENA_MAX": "1"}
    done = subprocess.run([sys.executable, "-c", ARENA_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    arenas = [line for line in done.stderr.splitlines() if line.startswith("Arena ")]
    assert arenas == ["Arena 0:"], done.stderr
