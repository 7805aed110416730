#!/usr/bin/env python3
"""Build the llama-cpp-python wheel, or llama.cpp's own ``llama-server``, once per machine, and say where.

llama-cpp-python ships only as source on PyPI; pip would build it (several minutes on 2 cores)
into its own cache with llama.cpp's default ``-march=native``, a wheel that can die with an illegal
instruction on another CPU. This builds it explicitly instead: CPU only, ``GGML_NATIVE=OFF`` (AVX2,
FMA and F16C on x86-64, so any x86-64 CPU since 2013; the plain baseline elsewhere), without the
multimodal library this server does not load (``LLAVA_BUILD=OFF``), all cores, with a progress line,
into a wheelhouse keyed by the version and the CMake flags. ``make setup`` installs from there; a
second venv (or ``make clean && make run``) reuses the wheel in seconds.

Progress goes to stderr; the wheelhouse directory is the only line on stdout:

    pip install --find-links "$(python tools/build_llama_cpp.py)" llama-cpp-python==X

Set ``LLAMA_CPP_CMAKE_ARGS`` for another build (``-DGGML_CUDA=on`` on a CUDA machine,
``-DGGML_NATIVE=ON`` for the fastest build for this CPU only); it gets its own wheelhouse.

``--server`` builds ``llama-server`` instead (the engine mediaserver runs as a supervised child:
continuous batching over parallel slots), from the same pinned sdist, which vendors llama.cpp with
its ``tools/server`` sources, with the same flags, statically linked, without its web UI (whose
build would download assets). It goes to ``--server-cache/llama-server-VERSION-ARCH-TAG/`` and the
binary's path is the only line on stdout; mediaserver finds it there at run time
(``llm_engine_binary`` overrides). CMake and Ninja come from PyPI when the machine has none.
``--server --cuda '75;80;90'`` builds it with llama.cpp's CUDA backend for those GPU architectures
(the GPU Docker image does; needs CUDA's nvcc), the CPU code still with the portable flags.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
# llama-cpp-python forces LLAMA_BUILD_COMMON on (a cache variable set with FORCE), yet never loads
# or even packages llama.cpp's "common" library, which is over half of the compile time (with the
# cpp-httplib it pulls in). A file CMake includes right after llama.cpp's project() call sets it off
# as a normal variable, which shadows the forced cache entry in llama.cpp's directory scope (and
# option() leaves it alone, policy CMP0077). Were llama.cpp to rename either, the file does nothing
# and the build only takes longer.
SKIP_COMMON_CMAKE = "set(LLAMA_BUILD_COMMON OFF)\n"
SKIP_COMMON_HOOK = "CMAKE_PROJECT_llama.cpp_INCLUDE"
# llama-server alone: no tests, examples, web UI (its provisioning downloads), HTTPS or shared libs.
SERVER_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
    "-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF "
    "-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF"
)
# llama-cpp-python's own options, meaningless to llama.cpp's CMake (it would warn about them).
WHEEL_ONLY_ARGS = ("-DLLAVA_BUILD=",)
PROGRESS = re.compile(r"^\s*\[(\d+)/(\d+)\]")
REPORT_EVERY_S = 20.0


def locked_version(lock: Path) -> str:
    for line in lock.read_text().splitlines():
        name, _, version = line.strip().partition("==")
        if name.lower().replace("_", "-") == "llama-cpp-python" and version:
            return version.strip()
    raise SystemExit(f"{lock} pins no llama-cpp-python version")


def wheelhouse_for(root: Path, version: str, cmake_args: str) -> Path:
    tag = hashlib.sha256((cmake_args + SKIP_COMMON_CMAKE).encode()).hexdigest()[:10]
    return root / f"llama-cpp-python-{version}-{platform.machine()}-{tag}"


def server_dir_for(root: Path, version: str, cmake_args: str) -> Path:
    tag = hashlib.sha256((cmake_args + SERVER_CMAKE_ARGS).encode()).hexdigest()[:10]
    return root / f"llama-server-{version}-{platform.machine()}-{tag}"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build(version: str, target: Path, cmake_args: str, python: str, scratch: Path) -> None:
    jobs = os.cpu_count() or 2
    hook = scratch / "skip-common.cmake"
    hook.write_text(SKIP_COMMON_CMAKE)
    all_args = f"{cmake_args} -D{SKIP_COMMON_HOOK}={hook}"
    env = {**os.environ, "CMAKE_ARGS": all_args, "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs)}
    log(
        f"Building llama-cpp-python {version} from source (llama.cpp for the CPU, CMAKE_ARGS={cmake_args!r}, "
        f"{jobs} jobs). This happens once per machine and takes a few minutes..."
    )
    started = time.monotonic()
    command = [
        python, "-m", "pip", "wheel", "--verbose", "--no-deps", "--no-cache-dir",
        "--no-binary", "llama-cpp-python", "--wheel-dir", str(scratch), f"llama-cpp-python=={version}",
    ]  # fmt: skip
    _run_with_progress(command, "llama.cpp", started, env=env)
    wheels = list(scratch.glob("llama_cpp_python-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one wheel, found {wheels}")
    target.mkdir(parents=True, exist_ok=True)
    partial = target / (wheels[0].name + ".partial")
    shutil.copy2(wheels[0], partial)
    partial.rename(target / wheels[0].name)  # atomic: a build cut short leaves no wheel behind
    log(f"Built {wheels[0].name} in {time.monotonic() - started:.0f} s into {target}")


def _run_with_progress(command: list[str], what: str, started: float, **kwargs: Any) -> None:
    """Run a build step, showing ``[n/total]`` progress every ``REPORT_EVERY_S``; its tail on failure."""
    last_report = started
    tail: deque[str] = deque(maxlen=80)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", **kwargs
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line.rstrip())
            match = PROGRESS.match(line)
            now = time.monotonic()
            if match and (now - last_report >= REPORT_EVERY_S or match.group(1) == match.group(2)):
                done, total = int(match.group(1)), int(match.group(2))
                log(f"  {what}: {done}/{total} compiled ({100 * done // total} %), {now - started:.0f} s")
                last_report = now
    if process.returncode != 0:
        log("\n".join(tail))
        raise SystemExit(f"{what} failed (exit {process.returncode}); the output ends above")


def _build_tools(python: str, scratch: Path) -> tuple[str, str | None]:
    """CMake (and Ninja if possible): the machine's, else the PyPI packages in ``scratch``."""
    cmake, ninja = shutil.which("cmake"), shutil.which("ninja")
    if cmake is None:
        target = scratch / "cmake-tools"
        log("No cmake on this machine: installing CMake and Ninja from PyPI for the build...")
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--target", str(target), "cmake", "ninja"], check=True
        )
        cmake = str(target / "bin" / "cmake")
        found = target / "bin" / "ninja"
        ninja = str(found) if found.exists() else ninja
    return cmake, ninja


def find_nvcc() -> str | None:
    """CUDA's compiler: on PATH, else where the CUDA images and installers put it."""
    found = shutil.which("nvcc")
    if found is None and Path("/usr/local/cuda/bin/nvcc").is_file():
        found = "/usr/local/cuda/bin/nvcc"
    return found


def cuda_cmake_args(cmake_args: str, architectures: str, nvcc: str) -> str:
    """``cmake_args`` plus llama.cpp's CUDA backend for ``architectures`` (CMake's list: ``75;80;90``,
    or ``native``: the GPUs of this machine). The CPU code keeps the portable flags of ``cmake_args``."""
    if not re.fullmatch(r"native|\d+[a-z]?(-real|-virtual)?(;\d+[a-z]?(-real|-virtual)?)*", architectures):
        raise SystemExit(f"CUDA architectures {architectures!r}: expected 'native' or a list like '75;80;90'")
    return f"{cmake_args} -DGGML_CUDA=ON -DCMAKE_CUDA_COMPILER={nvcc} -DCMAKE_CUDA_ARCHITECTURES={architectures}"


def server_cmake_args(cmake_args: str, cuda: str | None, nvcc: str | None) -> str:
    """The flags of a ``--server`` build: ``cmake_args``, plus CUDA for the ``cuda`` architectures when
    asked (``--cuda``), which needs ``nvcc``."""
    if cuda is None:
        return cmake_args
    if nvcc is None:
        raise SystemExit("--cuda needs CUDA's nvcc (on PATH or in /usr/local/cuda/bin)")
    return cuda_cmake_args(cmake_args, cuda, nvcc)


def download_sources(version: str, python: str, scratch: Path) -> Path:
    """llama.cpp as llama-cpp-python ``version``'s sdist vendors it, unpacked under ``scratch``."""
    download = [python, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                "--dest", str(scratch), f"llama-cpp-python=={version}"]  # fmt: skip
    subprocess.run(download, check=True)
    sdists = list(scratch.glob("llama_cpp_python-*.tar.gz"))
    if len(sdists) != 1:
        raise SystemExit(f"expected one llama-cpp-python sdist, found {sdists}")
    return unpack_sources(sdists[0], scratch / "src")


def unpack_sources(sdist: Path, into: Path) -> Path:
    """The sdist's ``vendor/llama.cpp`` tree, unpacked into ``into``; its path."""
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if "/vendor/llama.cpp/" in m.name]
        archive.extractall(into, members=members, filter="data")
    return next(into.glob("*/vendor/llama.cpp"))


def build_server(version: str, target: Path, cmake_args: str, python: str, scratch: Path) -> Path:
    """Build llama-server from llama-cpp-python's sdist (its vendored llama.cpp) into ``target``."""
    started = time.monotonic()
    log(f"Building llama-server from llama-cpp-python {version}'s llama.cpp (CMAKE_ARGS={cmake_args!r}). "
        "This happens once per machine and takes several minutes...")  # fmt: skip
    sources = download_sources(version, python, scratch)
    return compile_server(sources, target, cmake_args, python, scratch, started)


def configure_command(cmake: str, ninja: str | None, sources: Path, build: Path, cmake_args: str) -> list[str]:
    """The CMake configure step of llama-server (llama.cpp's own CMake, ``SERVER_CMAKE_ARGS`` first)."""
    user_args = [a for a in cmake_args.split() if not a.startswith(WHEEL_ONLY_ARGS)]
    configure = [cmake, "-S", str(sources), "-B", str(build), *SERVER_CMAKE_ARGS.split(), *user_args]
    if ninja:
        configure += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    return configure


def compile_server(sources: Path, target: Path, cmake_args: str, python: str, scratch: Path, started: float) -> Path:
    """Configure and build llama-server from the llama.cpp tree ``sources``; copy it into ``target``."""
    cmake, ninja = _build_tools(python, scratch)
    subprocess.run(configure_command(cmake, ninja, sources, scratch / "build", cmake_args), check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    jobs = os.cpu_count() or 2
    command = [cmake, "--build", str(scratch / "build"), "--target", "llama-server", "-j", str(jobs)]
    _run_with_progress(command, "llama-server", started)
    built = scratch / "build" / "bin" / "llama-server"
    target.mkdir(parents=True, exist_ok=True)
    partial = target / "llama-server.partial"
    shutil.copy2(built, partial)
    partial.rename(target / "llama-server")  # atomic: a build cut short leaves no binary behind
    log(f"Built llama-server in {time.monotonic() - started:.0f} s into {target}")
    return target / "llama-server"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lock", type=Path, default=REPO / "requirements.lock")
    parser.add_argument("--wheelhouse", type=Path, default=Path.home() / ".cache" / "mediaserver" / "wheels")
    parser.add_argument("--cmake-args", default=os.environ.get("LLAMA_CPP_CMAKE_ARGS") or DEFAULT_CMAKE_ARGS)
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose pip builds the wheel")
    parser.add_argument("--server", action="store_true", help="build llama-server instead of the wheel")
    parser.add_argument("--server-cache", type=Path, default=Path.home() / ".cache" / "mediaserver" / "llama-server")
    parser.add_argument(
        "--cuda",
        metavar="ARCHITECTURES",
        help="with --server: build it with CUDA for these GPU architectures (CMake's list, e.g. '75;80;86;89;90', "
        "or 'native'); needs nvcc",
    )
    args = parser.parse_args()
    version = locked_version(args.lock)
    if args.cuda and not args.server:
        raise SystemExit("--cuda goes with --server")
    args.cmake_args = server_cmake_args(args.cmake_args, args.cuda, find_nvcc() if args.cuda else None)
    if args.server:
        server_dir = server_dir_for(args.server_cache, version, args.cmake_args)
        binary = server_dir / "llama-server"
        if binary.is_file():
            log(f"llama-server {version}: using {binary} (built before with {args.cmake_args!r})")
        else:
            with tempfile.TemporaryDirectory(prefix="llama-server-") as scratch:
                binary = build_server(version, server_dir, args.cmake_args, args.python, Path(scratch))
        print(binary)
        return
    target = wheelhouse_for(args.wheelhouse, version, args.cmake_args)
    found = sorted(target.glob(f"llama_cpp_python-{version}-*.whl"))
    if found:
        log(f"llama-cpp-python {version}: using {found[0]} (built before with {args.cmake_args!r})")
    else:
        with tempfile.TemporaryDirectory(prefix="llama-wheel-") as scratch:
            build(version, target, args.cmake_args, args.python, Path(scratch))
    print(target)


if __name__ == "__main__":
    main()
