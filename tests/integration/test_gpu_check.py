"""tools/gpu_check.py end to end where no GPU is: the pack made from the pinned llama.cpp, CMake
configuring llama-server from it (with CUDA where nvcc is), and the whole ``--run`` rehearsed on
the CPU with the project's llama-server on a tiny random GGUF."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

from mediaserver.config import Settings
from mediaserver.llm.engine_binary import find_binary
from tests.unit.test_gpu_check import ROOT, build_llama_cpp, gpu_check


def test_the_pack_holds_what_cmake_needs_for_llama_server_in_30_mb(tmp_path: Path) -> None:
    version = build_llama_cpp.locked_version(ROOT / "requirements.lock")
    sources = build_llama_cpp.download_sources(version, sys.executable, tmp_path / "sdist")  # pip's cache after once
    size = gpu_check.pack(sources, tmp_path / "pack" / gpu_check.LLAMA_PACK, version)
    assert size <= gpu_check.PACK_LIMIT_BYTES == 30_000_000
    with tarfile.open(tmp_path / "pack" / gpu_check.LLAMA_PACK) as archive:
        names = archive.getnames()
    assert "llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu" in names and "llama.cpp/tools/server/server.cpp" in names
    assert not any(name.startswith(("llama.cpp/models/", "llama.cpp/docs/")) for name in names)
    tree = gpu_check.unpack(tmp_path / "pack" / gpu_check.LLAMA_PACK, tmp_path / "unpacked")
    assert json.loads((tree / "gpu-check.json").read_text())["llama_cpp_python"] == version

    cmake, _ = build_llama_cpp._build_tools(sys.executable, tmp_path)  # the machine's, else PyPI's

    def configure(build: str, cmake_args: str) -> subprocess.CompletedProcess[str]:
        command = build_llama_cpp.configure_command(cmake, None, tree, tmp_path / build, cmake_args)
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    cpu = configure("cpu", build_llama_cpp.DEFAULT_CMAKE_ARGS)
    assert cpu.returncode == 0, cpu.stdout[-3000:] + cpu.stderr[-3000:]
    assert "llama-server" in (tmp_path / "cpu" / "Makefile").read_text()
    # Where the first build on a GPU machine failed (the pack held no templates of the web UI): the
    # embedded UI's sources, generated from the pack alone (no npm, no network; an empty UI).
    build = [cmake, "--build", str(tmp_path / "cpu"), "--target", "llama-ui-assets"]
    ui = subprocess.run(build, capture_output=True, text=True, timeout=120)
    assert ui.returncode == 0, ui.stdout[-3000:] + ui.stderr[-3000:]
    assert (tmp_path / "cpu" / "tools" / "ui" / "ui.cpp").is_file()
    nvcc = build_llama_cpp.find_nvcc()
    if nvcc is not None:  # CUDA's compiler without cuBLAS nor a GPU, as pip installs it: stand-ins for both
        site, driver = tmp_path / "site" / "nvidia" / "cu13", tmp_path / "driver"
        (site / "include").mkdir(parents=True)
        (site / "lib").mkdir()
        driver.mkdir()
        (site / "include" / "cublas_v2.h").touch()
        for library in (site / "lib" / "libcublas.so.13", site / "lib" / "libcublasLt.so.13", driver / "libcuda.so.1"):
            library.touch()
        toolkit = Path(nvcc).resolve().parent.parent
        extra = gpu_check.cuda_library_args(toolkit, [str(tmp_path / "site")], [str(driver)])
        cuda_args = build_llama_cpp.cuda_cmake_args(build_llama_cpp.DEFAULT_CMAKE_ARGS, "90", nvcc)
        cuda = configure("cuda", " ".join([cuda_args, *extra]))
        assert cuda.returncode == 0, cuda.stdout[-3000:] + cuda.stderr[-3000:]
        assert "Including CUDA backend" in cuda.stdout


def test_a_cpu_rehearsal_of_the_whole_check_writes_its_report(tmp_path: Path) -> None:
    binary = find_binary(Settings(_env_file=None))
    assert binary is not None, "llama-server is not built (make setup)"
    pack = tmp_path / "pack"
    gpu_check.write_random_whisper(pack / "whisper-random")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--run", str(pack), "--cpu-rehearsal",
         "--binary", str(binary), "--models", "tiny", "--concurrency", "1,4", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu-check.json").read_text())
    assert {name: phase["error"] for name, phase in report["phases"].items()} == {
        "gpu": None, "ctranslate2": None, "models": None, "llm-tiny": None
    }  # fmt: skip
    assert report["ctranslate2"]["loads"] is True
    figures = report["llm"]["tiny"]["levels"]
    for level in ("1", "4"):
        assert figures[level]["tokens"] == gpu_check.ANSWER_TOKENS  # ignore_eos: every answer is whole
        assert 0 < figures[level]["ttft_p50_s"] <= figures[level]["ttft_p95_s"] < 10
        assert figures[level]["tokens_per_s"] > 0
        assert figures[level]["streams"] == 16
    assert "[llm-tiny]" in done.stdout and "budget" in done.stdout
    assert (out / "gpu-check.png").read_bytes()[:4] == b"\x89PNG"
