#!/usr/bin/env python3
"""One prepared check of mediaserver's GPU path, for a machine with an NVIDIA GPU and no network.

Here (a machine with the project's venv and network), pack what the GPU machine cannot fetch:

    python tools/gpu_check.py --pack build/gpu-check

writes into that directory ``llama.cpp.tar.gz``, the part of llama.cpp (as the llama-cpp-python
version pinned in requirements.lock vendors it) that ``llama-server`` builds from, CUDA backend
included, at most 30 MB; CTranslate2's wheel for Python 3.12; and a random tiny Whisper in
CTranslate2's format. Carry it with the repository to the GPU machine (Python 3.12, CUDA's nvcc,
CMake and Ninja; PyTorch and matplotlib are used when there) and run, within about 8 minutes:

    python tools/gpu_check.py --run build/gpu-check --out gpu-check-results

It prints, each phase against its time budget:
  1. gpu:     the GPU, its driver and CUDA versions (nvidia-smi; PyTorch's too if installed);
  2. ctranslate2: whether CTranslate2 imports, sees the GPU and loads a Whisper model on it, and if
     not, why (its PyPI wheels link CUDA 12's cuBLAS: ``libcublas.so.12``; a CUDA 13 machine has
     ``.so.13``: CTranslate2 issue #1933);
  3. build:   llama-server from the pack, with ``-DGGML_CUDA=ON`` for this GPU's architecture
     (tools/build_llama_cpp.py, the same flags as the GPU Docker image but one architecture);
  4. models:  GGUF files of Llama 3.2 1B's and Llama 3.1 8B's shapes in Q4_0, with random weights,
     written by this file (speed does not depend on the weights' values), during the build;
  5. llm-1b, llm-8b: llama-server on each, every layer on the GPU, with mediaserver's engine flags
     and one slot per stream, at 1, 4, 16 and 64 concurrent streams: time to first token p50/p95
     and total tokens/s, as tools/bench_llm.py measures them (see ``summarize``).

and writes ``gpu-check.json`` and ``gpu-check.png`` into ``--out`` (the PNG needs matplotlib; where
it is missing, ``python tools/gpu_check.py --plot gpu-check-results/gpu-check.json`` draws it later).

Exit codes: 0 every phase passed; 1 a phase failed (the report says which, and why); 2 bad usage or
no pack; 3 no NVIDIA GPU found (one line says so; nothing else runs).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import functools
import http.client
import importlib
import io
import json
import os
import platform
import random
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_llama_cpp

REPO = Path(__file__).resolve().parent.parent
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_GPU = 3
PACK_LIMIT_BYTES = 30_000_000  # llama.cpp's subset
CARRY_LIMIT_BYTES = 64 * 2**20  # all that travels to the GPU machine: the repository and the pack
REPO_ALLOWANCE_BYTES = 8 * 2**20  # the repository's tracked files (4.3 MB when this was written)
LLAMA_PACK = "llama.cpp.tar.gz"
TOTAL_BUDGET_S = 480.0
# Seconds per phase; "models" runs during "build" (the GGUF files are written while nvcc compiles).
BUDGETS_S = {
    "gpu": 10.0,
    "ctranslate2": 30.0,
    "build": 300.0,
    "models": 90.0,
    "llm-1b": 50.0,
    "llm-8b": 80.0,
    "llm-tiny": 30.0,
}
CONCURRENCY = (1, 4, 16, 64)
PROMPT_TOKENS = 256
ANSWER_TOKENS = 128
CONTEXT_PER_SLOT = 1024  # mediaserver's llm_context_tokens is per slot too (ctx-size = slots × it)
CTRANSLATE2_CUBLAS = "libcublas.so.12"
# Where NVIDIA's container runtime and driver installers put the driver's libcuda.so.1.
DRIVER_DIRS = (
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib/wsl/lib",
)  # what CTranslate2 4.x's PyPI wheels are linked against

# --- the pack: the part of llama.cpp that llama-server needs ------------------------------------

# Top-level entries of llama.cpp that llama-server's CMake build reads; everything else (models,
# docs, tests, examples, the Python converters, the web UI's sources) stays behind.
PACK_TOP: tuple[str, ...] = ("CMakeLists.txt", "LICENSE", "cmake/", "common/", "ggml/", "include/", "licenses/")
PACK_TOP += ("src/", "tools/", "vendor/", "scripts/")
# ggml's other backends (CUDA and the CPU are built), and what is left of the dropped parts.
OTHER_BACKENDS = "cann et hexagon hip metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn"
UI_KEEP = ("tools/ui/CMakeLists.txt", "tools/ui/ui.h.in", "tools/ui/ui.cpp.in")
PACK_DROP = (
    *(f"ggml/src/ggml-{backend}/" for backend in OTHER_BACKENDS.split(" ")),
    "tools/server/tests/",
    "tools/server/public",
    "tools/server/webui/",
)


def pack_keeps(relative: str) -> bool:
    """Whether ``relative`` (a path inside llama.cpp's tree) goes into the pack."""
    if not relative.startswith(PACK_TOP) or relative.startswith(PACK_DROP):
        return False
    if relative.startswith("tools/ui/"):  # the web UI: its CMake file, which builds an empty UI from
        return relative in UI_KEEP  # the two templates that scripts/ui-assets.cmake fills
    if relative.startswith("scripts/"):  # shell and Python helpers; CMake includes only its .cmake files
        return relative.endswith(".cmake")
    return not relative.endswith((".md", ".png", ".jpg", ".jpeg", ".gif", ".mp3", ".mp4", ".wav"))


def pack(sources: Path, out: Path, version: str) -> int:
    """Write llama.cpp's ``sources`` tree, what ``pack_keeps``, as ``out`` (``llama.cpp/...``); its size."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    files = 0
    with tarfile.open(partial, "w:gz", compresslevel=9) as archive:
        for path in sorted(sources.rglob("*")):
            relative = path.relative_to(sources).as_posix()
            if path.is_file() and not path.is_symlink() and pack_keeps(relative):
                archive.add(path, arcname=f"llama.cpp/{relative}", recursive=False)
                files += 1
        manifest = json.dumps({"llama_cpp_python": version, "files": files}).encode()
        info = tarfile.TarInfo("llama.cpp/gpu-check.json")
        info.size = len(manifest)
        archive.addfile(info, io.BytesIO(manifest))
    size = partial.stat().st_size
    if size > PACK_LIMIT_BYTES:
        partial.unlink()
        raise SystemExit(f"the pack would be {size / 1e6:.1f} MB, over the {PACK_LIMIT_BYTES / 1e6:.0f} MB limit")
    partial.rename(out)
    return size


def ctranslate2_wheel(version: str, python: str, dest: Path) -> Path:
    """CTranslate2 ``version``'s wheel for the GPU machine's Python 3.12 on x86-64, from PyPI."""
    command = [
        python,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--python-version",
        "3.12",
        "--platform",
        "manylinux_2_28_x86_64",
        "--dest",
        str(dest),
        f"ctranslate2=={version}",
    ]
    subprocess.run(command, check=True)
    return next(dest.glob(f"ctranslate2-{version}-cp312-*.whl"))


def locked(lock: Path, name: str) -> str:
    """The version ``lock`` pins for ``name``."""
    for line in lock.read_text().splitlines():
        pinned, _, version = line.strip().partition("==")
        if pinned.lower().replace("_", "-") == name and version:
            return version.strip()
    raise SystemExit(f"{lock} pins no {name}")


def make_pack(out: Path, sdist: Path | None, lock: Path, with_ctranslate2: bool) -> dict[str, int]:
    """The pack directory ``out``: ``llama.cpp.tar.gz``, and for the CTranslate2 phase its wheel and
    a random tiny Whisper (``whisper-random/``); each one's size, and "total"."""
    version = build_llama_cpp.locked_version(lock)
    out.mkdir(parents=True, exist_ok=True)
    sizes = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-pack-") as scratch:
        if sdist:
            sources = build_llama_cpp.unpack_sources(sdist, Path(scratch))
        else:
            sources = build_llama_cpp.download_sources(version, sys.executable, Path(scratch))
        sizes[LLAMA_PACK] = pack(sources, out / LLAMA_PACK, version)
    if with_ctranslate2:
        for old in out.glob("ctranslate2-*.whl"):
            old.unlink()
        wheel = ctranslate2_wheel(locked(lock, "ctranslate2"), sys.executable, out)
        sizes[wheel.name] = wheel.stat().st_size
        sizes["whisper-random"] = write_random_whisper(out / "whisper-random")
    sizes["total"] = sum(sizes.values())
    if sizes["total"] > CARRY_LIMIT_BYTES - REPO_ALLOWANCE_BYTES:
        raise SystemExit(
            f"the pack is {sizes['total'] / 1e6:.1f} MB: with the repository it would not fit the "
            f"{CARRY_LIMIT_BYTES / 2**20:.0f} MiB that travel"
        )
    return sizes


def unpack(pack_path: Path, into: Path) -> Path:
    """The pack's llama.cpp tree, unpacked into ``into``."""
    with tarfile.open(pack_path) as archive:
        archive.extractall(into, filter="data")
    return into / "llama.cpp"


# --- the GPU --------------------------------------------------------------------------------------


def gpu_info() -> dict[str, Any] | None:
    """The first NVIDIA GPU (name, memory, compute capability), the driver's and CUDA's versions, or
    None when there is none (no nvidia-smi, or it lists no GPU)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = [smi, "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader,nounits"]
    try:
        listed = subprocess.run(query, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
        banner = subprocess.run([smi], capture_output=True, text=True, timeout=20).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    if not listed:
        return None
    gpus = [[field.strip() for field in line.split(",")] for line in listed.splitlines()]
    name, driver, memory_mib, compute_cap = (gpus[0] + ["", "", "", ""])[:4]
    cuda = banner.split("CUDA Version:", 1)[1].split()[0] if "CUDA Version:" in banner else None
    info: dict[str, Any] = {
        "gpu": name,
        "gpus": len(gpus),
        "memory_mib": memory_mib,
        "compute_capability": compute_cap,
        "driver": driver,
        "cuda_driver_api": cuda,
        "nvcc": _nvcc_version(),
    }
    info.update(_torch_info())
    return info


def _nvcc_version() -> str | None:
    nvcc = build_llama_cpp.find_nvcc()
    if nvcc is None:
        return None
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else None


def _torch_info() -> dict[str, Any]:
    """PyTorch's version, its CUDA's, and whether it sees the GPU: a second opinion beside nvidia-smi."""
    try:
        import torch  # type: ignore[import-not-found]

        info = {
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "torch_sees_gpu": torch.cuda.is_available(),
        }
        if info["torch_sees_gpu"]:
            info["torch_gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        return {"torch": None}
    except Exception as error:  # a broken install is a finding, not a reason to stop the check
        return {"torch": f"{type(error).__name__}: {error}"}
    return info


def cuda_architecture(compute_capability: str) -> str:
    """CMake's architecture for nvidia-smi's compute capability (``9.0`` → ``90``); 90 when unknown."""
    major, _, minor = compute_capability.partition(".")
    return f"{major}{minor}" if major.isdigit() and minor.isdigit() else "90"


def cuda_library_args(toolkit: Path, search: Sequence[str], driver_dirs: Sequence[str] = DRIVER_DIRS) -> list[str]:
    """CMake arguments that point llama.cpp at the CUDA libraries the toolkit at ``toolkit`` lacks:
    nvcc from pip has no cuBLAS (PyTorch's ``nvidia-cublas`` wheel has it: ``nvidia/cu13/{include,lib}``
    under site-packages, in ``search``, the libraries under their versioned names only) and no
    ``libcuda`` stub (the driver's own ``libcuda.so.1`` then, from ``driver_dirs``)."""
    args = []
    if not (toolkit / "include" / "cublas_v2.h").is_file():
        for header in (h for entry in search for h in sorted(Path(entry).glob("nvidia/*/include/cublas_v2.h"))):
            lib = header.parent.parent / "lib"
            cublas, cublas_lt = sorted(lib.glob("libcublas.so.*")), sorted(lib.glob("libcublasLt.so.*"))
            if cublas and cublas_lt:
                include = f"-I{header.parent}"
                args += [
                    f"-DCUDA_cublas_LIBRARY={cublas[0]}",
                    f"-DCUDA_cublasLt_LIBRARY={cublas_lt[0]}",
                    f"-DCMAKE_CUDA_FLAGS={include}",
                    f"-DCMAKE_CXX_FLAGS={include}",
                ]
                break
    if not any((toolkit / lib / "stubs" / "libcuda.so").is_file() for lib in ("lib64", "lib")):
        drivers = [Path(d) / "libcuda.so.1" for d in driver_dirs if (Path(d) / "libcuda.so.1").is_file()]
        if drivers:
            args.append(f"-DCUDA_cuda_driver_LIBRARY={drivers[0]}")
    return args


# --- CTranslate2 ----------------------------------------------------------------------------------


def library_loads(name: str) -> bool:
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


def write_random_whisper(out: Path, seed: int = 0) -> int:
    """A tiny Whisper in CTranslate2's format (1 layer each side, width 64, 256 tokens, random
    float16 weights; 0.5 MB): the same model type and kernels as faster-whisper's (the encoder's
    convolutions, cuBLAS matrix products), small enough to carry. Needs ctranslate2 and numpy; the
    bytes written."""
    import numpy as np
    from ctranslate2.specs import whisper_spec

    width, heads, ffn, mels = 64, 2, 128, 80
    tokens = [
        "<|endoftext|>",
        "<|startoftranscript|>",
        "<|en|>",
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nocaptions|>",
        "<|notimestamps|>",
    ]
    tokens += [f"w{i}" for i in range(256 - len(tokens))]
    spec = whisper_spec.WhisperSpec(1, heads, 1, heads)
    rng = np.random.default_rng(seed)

    def shape(name: str) -> tuple[int, ...]:
        parts = name.split("/")
        if parts[-1] in ("gamma", "beta"):
            return (width,)
        if "conv1" in parts or "conv2" in parts:
            return (width, mels if "conv1" in parts else width, 3)
        if "embeddings" in parts or "projection" in parts:
            return (len(tokens), width)
        if "ffn" in parts:
            return (ffn, width) if "linear_0" in parts else (width, ffn)
        if "self_attention" in parts:
            return (3 * width, width) if "linear_0" in parts else (width, width)
        return (2 * width, width) if "linear_1" in parts else (width, width)  # cross-attention

    for name, value in spec.variables().items():
        if value is not None or not name.endswith(("/weight", "/gamma", "/beta")):
            continue
        owner: Any = spec
        for part in name.split("/")[:-1]:  # "layer_0" and "linear_1" are items of lists
            stem, _, index = part.rpartition("_")
            listed = not hasattr(owner, part) and index.isdigit()
            owner = getattr(owner, stem)[int(index)] if listed else getattr(owner, part)
        leaf = name.rsplit("/", 1)[1]
        values = {"gamma": np.ones(shape(name)), "beta": np.zeros(shape(name))}.get(leaf)
        setattr(owner, leaf, (values if values is not None else rng.normal(0, 0.05, shape(name))).astype(np.float32))
    spec.encoder.position_encodings.encodings = rng.normal(0, 0.05, (1500, width)).astype(np.float32)
    spec.decoder.position_encodings.encodings = rng.normal(0, 0.05, (448, width)).astype(np.float32)
    spec.register_vocabulary(tokens)
    spec.config.suppress_ids, spec.config.suppress_ids_begin = [], []
    spec.config.lang_ids, spec.config.alignment_heads = [2], [(0, 0)]
    spec.validate()
    spec.optimize(quantization="float16")
    out.mkdir(parents=True, exist_ok=True)
    spec.save(str(out))
    return sum(path.stat().st_size for path in out.iterdir())


def import_ctranslate2(pack_dir: Path, site: Path) -> Any:
    """ctranslate2: the machine's, else the pack's wheel, unpacked into ``site`` (a wheel is a zip:
    no pip, no network)."""
    try:
        import ctranslate2  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        wheels = sorted(pack_dir.glob("ctranslate2-*.whl"))
        if not wheels:
            raise
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(site)
        for library in site.rglob("*.so*"):  # zipfile drops the execute bits
            library.chmod(0o755)
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        import ctranslate2  # type: ignore[import-untyped,unused-ignore]
    return ctranslate2


def check_ctranslate2(pack_dir: Path, site: Path, whisper_dir: Path | None, device: str = "cuda") -> dict[str, Any]:
    """Does CTranslate2 run Whisper on ``device``? Import it, count the GPUs, load a Whisper model
    (``whisper_dir``, else the pack's random tiny one) and run its encoder and two decoding steps;
    which cuBLAS the dynamic loader finds says why not."""
    result: dict[str, Any] = {
        "cublas_12_loads": library_loads(CTRANSLATE2_CUBLAS),
        "cublas_13_loads": library_loads("libcublas.so.13"),
    }
    try:
        ctranslate2 = import_ctranslate2(pack_dir, site)
    except ImportError as error:
        result.update(loads=False, verdict=f"ctranslate2 is not installed here, nor in the pack ({error})")
        return result
    result["version"] = ctranslate2.__version__
    result["cuda_devices"] = ctranslate2.get_cuda_device_count()
    model_dir = whisper_dir or pack_dir / "whisper-random"
    if not (model_dir / "model.bin").is_file():
        result.update(loads=False, verdict=f"no Whisper model at {model_dir} to load (--whisper-model DIR)")
        return result
    import numpy as np

    try:
        model = ctranslate2.models.Whisper(str(model_dir), device=device)
        features = ctranslate2.StorageView.from_array(np.zeros((1, 80, 3000), np.float32))  # 30 s of log-mels
        encoded = model.encode(features)
        ids = model.generate(features, [[1, 2, 4, 8]], max_length=6)[0].sequences_ids[0]
    except Exception as error:  # the reason is the result
        reason = f"{type(error).__name__}: {error}"
        if "libcublas" in reason or "libcudnn" in reason:  # a CUDA library the wheel was linked against
            found = "loads" if result["cublas_12_loads"] else "does not load"
            reason += (
                f" (the PyPI wheel links CUDA 12's libraries; {CTRANSLATE2_CUBLAS} {found} here: CTranslate2 #1933)"
            )
        result.update(loads=False, verdict=reason)
        return result
    result.update(
        loads=True,
        verdict=f"{model_dir.name} on {device}: encoder output {list(encoded.shape)}, decoded {len(ids)} tokens",
    )
    return result


# --- GGUF: a llama-architecture model with random Q4_0 weights ------------------------------------

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32
# GGUF metadata value types and ggml tensor types (llama.cpp's ggml/include/gguf.h and ggml.h).
U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
GGML_F32, GGML_Q4_0 = 0, 2
Q4_0_BLOCK, Q4_0_BYTES = 32, 18  # 32 weights: one f16 scale and 16 bytes of 4-bit values
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_BYTE = 1, 2, 3, 6
SPECIAL_AND_BYTE_TOKENS = 3 + 256  # <unk>, <s>, </s>, <0x00>..<0xFF>: the vocabulary's first ids


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    dim: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool  # the output layer is the token embedding (Llama 3.2 1B), no output.weight

    def tensors(self) -> list[tuple[str, tuple[int, ...], int]]:
        """(name, ggml dims with ne0 first, type) of every tensor, in file order."""
        kv = self.dim // self.heads * self.kv_heads
        tensors: list[tuple[str, tuple[int, ...], int]] = [("token_embd.weight", (self.dim, self.vocab), GGML_Q4_0)]
        for i in range(self.layers):
            tensors += [
                (f"blk.{i}.attn_norm.weight", (self.dim,), GGML_F32),
                (f"blk.{i}.attn_q.weight", (self.dim, self.dim), GGML_Q4_0),
                (f"blk.{i}.attn_k.weight", (self.dim, kv), GGML_Q4_0),
                (f"blk.{i}.attn_v.weight", (self.dim, kv), GGML_Q4_0),
                (f"blk.{i}.attn_output.weight", (self.dim, self.dim), GGML_Q4_0),
                (f"blk.{i}.ffn_norm.weight", (self.dim,), GGML_F32),
                (f"blk.{i}.ffn_gate.weight", (self.dim, self.ffn), GGML_Q4_0),
                (f"blk.{i}.ffn_up.weight", (self.dim, self.ffn), GGML_Q4_0),
                (f"blk.{i}.ffn_down.weight", (self.ffn, self.dim), GGML_Q4_0),
            ]
        tensors.append(("output_norm.weight", (self.dim,), GGML_F32))
        if not self.tied:
            tensors.append(("output.weight", (self.dim, self.vocab), GGML_Q4_0))
        return tensors

    @property
    def parameters(self) -> int:
        total = 0
        for _, dims, _ in self.tensors():
            count = 1
            for d in dims:
                count *= d
            total += count
        return total


SHAPES = {
    "1b": Shape("llama-3.2-1b-shape", layers=16, dim=2048, heads=32, kv_heads=8, ffn=8192, vocab=128256, tied=True),
    "8b": Shape("llama-3.1-8b-shape", layers=32, dim=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, tied=False),
    "tiny": Shape("tiny", layers=2, dim=64, heads=4, kv_heads=2, ffn=128, vocab=320, tied=False),
}


def _string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(kind: int, value: Any) -> bytes:
    if kind == STRING:
        return _string(value)
    return struct.pack({U32: "<I", I32: "<i", F32: "<f", BOOL: "<?"}[kind], value)


def _metadata(key: str, kind: int, value: Any, item: int = 0) -> bytes:
    head = _string(key) + struct.pack("<I", kind)
    if kind != ARRAY:
        return head + _value(kind, value)
    return head + struct.pack("<IQ", item, len(value)) + b"".join(_value(item, v) for v in value)


def vocabulary(size: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: unknown, BOS, EOS, the 256 byte tokens, then made-up words."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256
    tokens += [f"\u2581w{i}" for i in range(size - len(tokens))]
    types += [TOKEN_NORMAL] * (size - len(types))
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(i) for i in range(size - 259)]
    return tokens, scores, types


def _random_q4_0(blocks: int, rng: random.Random) -> bytes:
    """``blocks`` Q4_0 blocks: a scale of 0.001-0.004 (weights of std ~0.01) and random 4-bit values."""
    out = bytearray()
    for _ in range(blocks):
        out += struct.pack("<e", rng.uniform(0.001, 0.004)) + rng.randbytes(16)
    return bytes(out)


def _pad(handle: BinaryIO) -> None:
    handle.write(b"\0" * (-handle.tell() % ALIGNMENT))


def write_gguf(shape: Shape, path: Path, seed: int = 0) -> int:
    """Write ``shape`` as a llama GGUF with random Q4_0 weights (norms 1.0) at ``path``; its size.
    The weights repeat a 1 MB random pattern: compute does not depend on their values. Greedy
    decoding picks none of the special and byte tokens (their output rows are zero)."""
    if shape.dim % Q4_0_BLOCK or shape.ffn % Q4_0_BLOCK or shape.dim % shape.heads:
        raise ValueError(f"{shape}: dim and ffn must be multiples of {Q4_0_BLOCK}, dim of heads")
    tokens, scores, types = vocabulary(shape.vocab)
    head_dim = shape.dim // shape.heads
    metadata = [
        ("general.architecture", STRING, "llama"),
        ("general.name", STRING, shape.name),
        ("general.file_type", U32, 2),  # LLAMA_FTYPE_MOSTLY_Q4_0
        ("llama.context_length", U32, 8192),
        ("llama.embedding_length", U32, shape.dim),
        ("llama.block_count", U32, shape.layers),
        ("llama.feed_forward_length", U32, shape.ffn),
        ("llama.attention.head_count", U32, shape.heads),
        ("llama.attention.head_count_kv", U32, shape.kv_heads),
        ("llama.rope.dimension_count", U32, head_dim),
        ("llama.rope.freq_base", F32, 500000.0),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("llama.vocab_size", U32, shape.vocab),
        ("tokenizer.ggml.model", STRING, "llama"),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.unknown_token_id", U32, 0),
        ("tokenizer.ggml.add_bos_token", BOOL, True),
    ]
    tensors = shape.tensors()
    rng = random.Random(seed)
    pattern = _random_q4_0(1 << 16, rng)  # 1.2 MB
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as handle:
        handle.write(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(metadata) + 3))
        for key, kind, value in metadata:
            handle.write(_metadata(key, kind, value))
        handle.write(_metadata("tokenizer.ggml.tokens", ARRAY, tokens, STRING))
        handle.write(_metadata("tokenizer.ggml.scores", ARRAY, scores, F32))
        handle.write(_metadata("tokenizer.ggml.token_type", ARRAY, types, I32))
        offset = 0
        sizes = []
        for name, dims, kind in tensors:
            count = 1
            for d in dims:
                count *= d
            size = count * 4 if kind == GGML_F32 else count // Q4_0_BLOCK * Q4_0_BYTES
            sizes.append(size)
            handle.write(_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims))
            handle.write(struct.pack("<IQ", kind, offset))
            offset += size + (-size % ALIGNMENT)
        _pad(handle)
        logits = "token_embd.weight" if shape.tied else "output.weight"
        for (name, _, kind), size in zip(tensors, sizes, strict=True):
            if kind == GGML_F32:
                handle.write(struct.pack("<f", 1.0) * (size // 4))
                _pad(handle)
                continue
            if name == logits:
                # The output rows of the special and byte tokens are zero: their logits are 0, below
                # the largest of the others, so greedy decoding never picks them. A byte token can
                # be half a UTF-8 character, which llama-server holds back from the stream.
                zeros = SPECIAL_AND_BYTE_TOKENS * shape.dim // Q4_0_BLOCK * Q4_0_BYTES
                handle.write(b"\0" * zeros)
                size -= zeros
            for start in range(0, size, len(pattern)):
                handle.write(pattern[: min(len(pattern), size - start)])
            _pad(handle)
    partial.rename(path)
    return path.stat().st_size


# --- llama-server and its streams -----------------------------------------------------------------


def server_args(
    binary: Path, model: Path, port: int, slots: int, gpu_layers: str = "all", threads: int | None = None
) -> list[str]:
    """llama-server's command: mediaserver's engine flags (``LlamaServerProcess.command`` with its
    default settings) for ``slots`` slots of ``CONTEXT_PER_SLOT`` tokens, ``gpu_layers`` on the GPU."""
    threads = threads or max(1, (os.cpu_count() or 2) // 2)
    return [
        str(binary),
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        str(slots),
        "--cont-batching",
        "--no-kv-unified",
        "--ctx-size",
        str(slots * CONTEXT_PER_SLOT),
        "--batch-size",
        "512",
        "--ubatch-size",
        "512",
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        "--threads-http",
        str(2 * slots + 4),  # mediaserver.llm.engine_process.http_threads
        "--n-gpu-layers",
        gpu_layers,
        "--no-webui",
        "--metrics",
        "--no-mmproj",
    ]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def running_server(
    command: list[str], port: int, log_path: Path, timeout_s: float, library_dirs: Sequence[str] = ()
) -> Iterator[None]:
    """llama-server started with ``command`` (``library_dirs`` first on its loader's path), healthy on
    ``port``; stopped on the way out."""
    env = dict(os.environ)
    if library_dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*library_dirs, *filter(None, [env.get("LD_LIBRARY_PATH")])])
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        try:
            deadline = time.monotonic() + timeout_s
            while not _healthy(port):
                if process.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {process.returncode} at start: {_tail(log_path)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"llama-server not healthy within {timeout_s:.0f} s: {_tail(log_path)}")
                time.sleep(0.2)
            yield
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _tail(path: Path, lines: int = 15) -> str:
    return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])


def _healthy(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


@dataclass
class Run:
    """One stream, as tools/bench_llm.py's ``Run``: times relative to its own start, and its start
    relative to its batch's."""

    ttft_s: float
    tokens: int
    first_s: float
    last_s: float
    start_s: float


def stream(port: int, prompt: list[int], tokens: int, started: float) -> Run:
    """One ``POST /completion`` (llama-server's own endpoint: the prompt as token ids, so its length is
    exact), streamed; exactly ``tokens`` tokens (``ignore_eos``), greedy like bench_llm."""
    body = json.dumps(
        {
            "prompt": prompt,
            "n_predict": tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "cache_prompt": False,
        }
    )
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    begin = time.perf_counter()
    first = last = None
    count = predicted = 0
    try:
        connection.request("POST", "/completion", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"llama-server answered {response.status}: {response.read()[:300]!r}")
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("stop"):
                predicted = int(chunk.get("timings", {}).get("predicted_n", 0))
                break
            now = time.perf_counter()
            first = now if first is None else first
            last = now
            count += 1
    finally:
        connection.close()
    if first is None or last is None:
        raise RuntimeError("llama-server streamed no token")
    return Run(first - begin, predicted or count, first - begin, last - begin, begin - started)


def tokens_per_s(run: Run) -> float:
    """A stream's decoding rate: (tokens - 1) / (last token - first), bench_llm's definition."""
    return (run.tokens - 1) / (run.last_s - run.first_s) if run.last_s > run.first_s else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (benchlib.percentile's definition)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def summarize(batches: list[list[Run]]) -> dict[str, float]:
    """Streams started together in batches: TTFT (from each request's send, waiting included) p50
    and p95 over every stream, per-stream tokens/s (median), and total tokens/s: each batch's tokens
    over its wall time, first start to last token (median over batches), as bench_llm's concurrent runs."""
    runs = [run for batch in batches for run in batch]
    totals = []
    for batch in batches:
        wall = max(r.start_s + r.last_s for r in batch) - min(r.start_s for r in batch)
        totals.append(sum(r.tokens for r in batch) / wall)
    return {
        "ttft_p50_s": percentile([r.ttft_s for r in runs], 50),
        "ttft_p95_s": percentile([r.ttft_s for r in runs], 95),
        "stream_tokens_per_s": statistics.median(tokens_per_s(r) for r in runs),
        "tokens_per_s": statistics.median(totals),
        "streams": len(runs),
        "tokens": statistics.mean(r.tokens for r in runs),
    }


def measure(
    port: int,
    vocab: int,
    concurrency: Sequence[int],
    prompt_tokens: int,
    answer_tokens: int,
    requests_per_level: int = 16,
) -> dict[str, dict[str, float]]:
    """Each level of ``concurrency``: batches of that many streams at once, until at least
    ``requests_per_level`` streams; a different random prompt each (nothing cached)."""
    rng = random.Random(1)

    def prompt() -> list[int]:
        return [rng.randrange(SPECIAL_AND_BYTE_TOKENS, vocab) for _ in range(prompt_tokens)]

    results: dict[str, dict[str, float]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(concurrency)) as pool:
        warm = [pool.submit(stream, port, prompt(), 4, time.perf_counter()) for _ in range(max(concurrency))]
        for future in warm:  # every slot once: CUDA graphs and buffers are made outside the figures
            future.result()
        for level in concurrency:
            batches = []
            for _ in range(max(1, -(-requests_per_level // level))):
                prompts = [prompt() for _ in range(level)]
                started = time.perf_counter()
                futures = [pool.submit(stream, port, p, answer_tokens, started) for p in prompts]
                batches.append([future.result() for future in futures])
            results[str(level)] = summary = summarize(batches)
            print(
                f"    {level:3} streams: TTFT p50 {summary['ttft_p50_s'] * 1000:7.1f} ms, p95 "
                f"{summary['ttft_p95_s'] * 1000:7.1f} ms, {summary['tokens_per_s']:8.1f} tokens/s in all, "
                f"{summary['stream_tokens_per_s']:6.1f} per stream",
                flush=True,
            )
    return results


# --- the report -----------------------------------------------------------------------------------


def write_report(result: dict[str, Any], out: Path) -> list[Path]:
    """``gpu-check.json`` and, with matplotlib, ``gpu-check.png`` in ``out``; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    report = out / "gpu-check.json"
    report.write_text(json.dumps(result, indent=2, default=str))
    written = [report]
    try:
        written.append(plot(result, out / "gpu-check.png"))
    except ImportError:
        print(f"matplotlib is not here: no PNG; draw it elsewhere with: python tools/gpu_check.py --plot {report}")
    return written


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    llm: dict[str, dict[str, Any]] = result.get("llm", {})
    fig, (ttft_ax, tps_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for model, measured in llm.items():
        levels: dict[str, dict[str, float]] = measured["levels"]
        xs = [int(level) for level in levels]
        line = ttft_ax.plot(xs, [v["ttft_p50_s"] * 1000 for v in levels.values()], marker="o", label=f"{model} p50")
        ttft_ax.plot(
            xs,
            [v["ttft_p95_s"] * 1000 for v in levels.values()],
            marker="x",
            linestyle="--",
            color=line[0].get_color(),
            label=f"{model} p95",
        )
        tps_ax.plot(xs, [v["tokens_per_s"] for v in levels.values()], marker="o", label=model)
    machine = result.get("machine", {})
    for ax, title in ((ttft_ax, "time to first token (ms)"), (tps_ax, "tokens/s, all streams")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(CONCURRENCY), [str(c) for c in CONCURRENCY])
        ax.set_xlabel("concurrent streams")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"llama-server (CUDA) on {machine.get('gpu', '?')}, driver {machine.get('driver', '?')}, "
        f"{PROMPT_TOKENS}-token prompts, {ANSWER_TOKENS}-token answers, Q4_0 random weights",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --- phases ---------------------------------------------------------------------------------------


class Phases:
    """Runs each phase against its budget, prints how long it took, and keeps going after a failure
    (the report says which phase failed and why). The JSON report is rewritten after every phase:
    a run cut short keeps what it measured."""

    def __init__(self, result: dict[str, Any], total_budget_s: float, out: Path) -> None:
        self.result = result
        self.started = time.monotonic()
        self.deadline = self.started + total_budget_s
        self.ok = True
        self.out = out
        self._lock = threading.Lock()

    def run(self, name: str, work: Callable[[], Any], report_as: tuple[str, ...] = ()) -> Any:
        """``work()``'s value (None if it failed), kept in the report under the keys ``report_as``."""
        budget = BUDGETS_S[name]
        if time.monotonic() > self.deadline:
            self._record(name, budget, 0.0, "skipped: the check's total time is spent")
            return None
        print(f"[{name}] (budget {budget:.0f} s)", flush=True)
        began = time.monotonic()
        try:
            value = work()
        except Exception as error:  # recorded; the next phases still run
            traceback.print_exc()
            self._record(name, budget, time.monotonic() - began, f"{type(error).__name__}: {error}")
            return None
        if report_as:
            with self._lock:
                place = self.result
                for key in report_as[:-1]:
                    place = place.setdefault(key, {})
                place[report_as[-1]] = value
        self._record(name, budget, time.monotonic() - began, None)
        return value

    def _record(self, name: str, budget: float, took: float, error: str | None) -> None:
        over = took > budget
        with self._lock:
            self.ok = self.ok and error is None
            self.result.setdefault("phases", {})[name] = {
                "budget_s": budget,
                "took_s": round(took, 1),
                "over_budget": over,
                "error": error,
            }
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "gpu-check.json").write_text(json.dumps(self.result, indent=2, default=str))
        state = "FAILED: " + error if error else ("over budget" if over else "ok")
        print(f"[{name}] {took:.1f} s of {budget:.0f} s: {state}", flush=True)


def run_check(args: argparse.Namespace) -> int:
    if args.cpu_rehearsal:  # the whole run on this CPU, for the tests: no nvidia-smi, no CUDA build
        if args.binary is None:
            print("gpu_check: --cpu-rehearsal runs a llama-server that is built already: give --binary")
            return EXIT_USAGE
        machine: dict[str, Any] | None = {"gpu": None, "rehearsal": "on the CPU: no CUDA, no GPU figures"}
    else:
        machine = gpu_info()
    if machine is None:
        print("gpu_check: no NVIDIA GPU found (no nvidia-smi, or it lists none): nothing to check here", flush=True)
        return EXIT_NO_GPU
    if args.binary is None and not (args.run / LLAMA_PACK).is_file():
        print(f"gpu_check: no {LLAMA_PACK} in {args.run}: make the pack where there is network (--pack) and bring it")
        return EXIT_USAGE
    result: dict[str, Any] = {
        "machine": machine,
        "host": platform.node(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    phases = Phases(result, args.budget_s, args.out)
    phases.run("gpu", lambda: print("  " + ", ".join(f"{k} {v}" for k, v in machine.items()), flush=True))
    work = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=args.work))
    device = "cpu" if args.cpu_rehearsal else "cuda"
    phases.run("ctranslate2", lambda: _ctranslate2_phase(args.run, work, args.whisper_model, device), ("ctranslate2",))
    architecture = args.cuda_architecture or cuda_architecture(machine.get("compute_capability", ""))
    shapes = [SHAPES[name] for name in args.models]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as writer:
        models_future = writer.submit(phases.run, "models", lambda: _models_phase(shapes, work))
        if args.binary is None:
            binary = phases.run("build", lambda: _build_phase(args.run, work, architecture, result))
        else:
            binary, result["build"] = args.binary, {"binary": str(args.binary), "built": False}
        models = models_future.result()
    gpu_layers = "0" if args.cpu_rehearsal else "all"
    for name, shape in zip(args.models, shapes, strict=True):
        if binary is None or models is None:
            break
        model_path = models[shape.name]
        library_dirs = result.get("build", {}).get("library_dirs", [])
        measure_phase = functools.partial(_llm_phase, binary, model_path, shape, args, work, gpu_layers, library_dirs)
        phases.run(f"llm-{name}", measure_phase, ("llm", name))
    for path in write_report(result, args.out):
        print(f"wrote {path}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if phases.ok else EXIT_FAILED


def _ctranslate2_phase(pack_dir: Path, work: Path, whisper_model: Path | None, device: str) -> dict[str, Any]:
    """``check_ctranslate2`` in a child process: a CUDA library that aborts takes only the child."""
    command = [sys.executable, str(Path(__file__).resolve()), "--ctranslate2-child", str(pack_dir),
               "--work", str(work / "site"), "--device", device]  # fmt: skip
    if whisper_model is not None:
        command += ["--whisper-model", str(whisper_model)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BUDGETS_S["ctranslate2"] * 4)
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        found: dict[str, Any] = json.loads(lines[-1])
    else:
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        tail = " | ".join(done.stderr.strip().splitlines()[-5:])
        found = {
            "loads": False,
            "verdict": f"the process checking it died ({how}): {tail}",
            "cublas_12_loads": library_loads(CTRANSLATE2_CUBLAS),
            "cublas_13_loads": library_loads("libcublas.so.13"),
        }
    print(
        f"  ctranslate2 on {device}: {'loads' if found['loads'] else 'does NOT load'}: {found['verdict']} "
        f"({CTRANSLATE2_CUBLAS} loads: {found['cublas_12_loads']}, libcublas.so.13: {found['cublas_13_loads']})"
    )
    return found


def _build_phase(pack_dir: Path, work: Path, architecture: str, result: dict[str, Any]) -> Path:
    nvcc = build_llama_cpp.find_nvcc()
    if nvcc is None:
        raise RuntimeError("no nvcc (on PATH or in /usr/local/cuda/bin): llama-server cannot be built with CUDA")
    sources = unpack(pack_dir / LLAMA_PACK, work / "src")
    cmake_args = build_llama_cpp.cuda_cmake_args(build_llama_cpp.DEFAULT_CMAKE_ARGS, architecture, nvcc)
    libraries = cuda_library_args(Path(nvcc).resolve().parent.parent, sys.path)
    cmake_args = " ".join([cmake_args, *libraries])
    result["build"] = {
        "cmake_args": cmake_args,
        # Where the libraries found outside the toolkit are, for llama-server's loader too.
        "library_dirs": sorted({str(Path(a.split("=", 1)[1]).parent) for a in libraries if "_LIBRARY=" in a}),
        "architecture": architecture,
        "pack": json.loads((sources / "gpu-check.json").read_text()),
    }
    print(f"  llama.cpp of llama-cpp-python {result['build']['pack']['llama_cpp_python']}: {cmake_args}", flush=True)
    return build_llama_cpp.compile_server(sources, work / "bin", cmake_args, sys.executable, work, time.monotonic())


def _models_phase(shapes: list[Shape], work: Path) -> dict[str, Path]:
    paths = {}
    for shape in shapes:
        began = time.monotonic()
        path = work / f"{shape.name}-q4_0.gguf"
        size = write_gguf(shape, path)
        print(
            f"  {path.name}: {shape.parameters / 1e9:.2f} B parameters, {size / 1e9:.2f} GB, "
            f"{time.monotonic() - began:.1f} s",
            flush=True,
        )
        paths[shape.name] = path
    return paths


def _llm_phase(
    binary: Path,
    model: Path,
    shape: Shape,
    args: argparse.Namespace,
    work: Path,
    gpu_layers: str,
    library_dirs: list[str],
) -> dict[str, Any]:
    port = free_port()
    slots = max(args.concurrency)
    command = server_args(binary, model, port, slots, gpu_layers)
    print("  " + " ".join(command), flush=True)
    began = time.monotonic()
    with running_server(command, port, work / f"{shape.name}.log", 120, library_dirs):
        load_s = time.monotonic() - began
        print(f"  loaded in {load_s:.1f} s", flush=True)
        levels = measure(port, shape.vocab, args.concurrency, PROMPT_TOKENS, ANSWER_TOKENS)
    offloaded = [
        line for line in (work / f"{shape.name}.log").read_text(errors="replace").splitlines() if "offloaded" in line
    ]
    return {"levels": levels, "load_s": round(load_s, 1), "offload": offloaded[-1:]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--pack", type=Path, metavar="DIR", help="here: write the pack (llama.cpp's subset and more)")
    mode.add_argument("--run", type=Path, metavar="DIR", help="on the GPU machine: the check, from the pack")
    mode.add_argument("--plot", type=Path, metavar="JSON", help="draw a report's PNG (beside it)")
    mode.add_argument("--ctranslate2-child", type=Path, metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--sdist", type=Path, help="--pack: llama-cpp-python's sdist (default: pip downloads it)")
    parser.add_argument("--no-ctranslate2", action="store_true", help="--pack: without CTranslate2's wheel and model")
    parser.add_argument("--lock", type=Path, default=REPO / "requirements.lock")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "gpu-check")
    parser.add_argument("--work", type=Path, help="where to build and write the models (default: the temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the build and the models")
    parser.add_argument("--models", type=lambda s: s.split(","), default=["1b", "8b"])
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=list(CONCURRENCY))
    parser.add_argument("--cuda-architecture", help="default: the GPU's own (nvidia-smi's compute capability)")
    parser.add_argument("--whisper-model", type=Path, help="a CTranslate2 Whisper model directory to load instead")
    parser.add_argument("--budget-s", type=float, default=TOTAL_BUDGET_S)
    parser.add_argument("--binary", type=Path, help="--run with this llama-server instead of building one")
    parser.add_argument("--cpu-rehearsal", action="store_true", help="--run on this CPU (tests): needs --binary")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if any(name not in SHAPES for name in args.models):
        parser.error(f"--models: from {', '.join(SHAPES)}")
    if args.ctranslate2_child:  # the ctranslate2 phase's child: its result as one JSON line
        site = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-site-"))
        print(json.dumps(check_ctranslate2(args.ctranslate2_child, site, args.whisper_model, args.device)))
        return 0
    if args.plot:
        print(f"wrote {plot(json.loads(args.plot.read_text()), args.plot.with_suffix('.png'))}")
        return 0
    if args.pack:
        sizes = make_pack(args.pack, args.sdist, args.lock, not args.no_ctranslate2)
        for name, size in sizes.items():
            print(f"{args.pack / name if name != 'total' else 'total'}: {size / 1e6:.1f} MB")
        return 0
    return run_check(args)


if __name__ == "__main__":
    sys.exit(main())
