#!/usr/bin/env python3
"""Build the llama-cpp-python wheel once per machine, with portable flags, and say where it is.

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
import tempfile
import time
from collections import deque
from pathlib import Path

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
    last_report = started
    tail: deque[str] = deque(maxlen=80)
    command = [
        python, "-m", "pip", "wheel", "--verbose", "--no-deps", "--no-cache-dir",
        "--no-binary", "llama-cpp-python", "--wheel-dir", str(scratch), f"llama-cpp-python=={version}",
    ]  # fmt: skip
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, errors="replace"
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line.rstrip())
            match = PROGRESS.match(line)
            now = time.monotonic()
            if match and (now - last_report >= REPORT_EVERY_S or match.group(1) == match.group(2)):
                done, total = int(match.group(1)), int(match.group(2))
                log(f"  llama.cpp: {done}/{total} compiled ({100 * done // total} %), {now - started:.0f} s")
                last_report = now
    if process.returncode != 0:
        log("\n".join(tail))
        raise SystemExit(f"building llama-cpp-python failed (exit {process.returncode}); the output ends above")
    wheels = list(scratch.glob("llama_cpp_python-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one wheel, found {wheels}")
    target.mkdir(parents=True, exist_ok=True)
    partial = target / (wheels[0].name + ".partial")
    shutil.copy2(wheels[0], partial)
    partial.rename(target / wheels[0].name)  # atomic: a build cut short leaves no wheel behind
    log(f"Built {wheels[0].name} in {time.monotonic() - started:.0f} s into {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lock", type=Path, default=REPO / "requirements.lock")
    parser.add_argument("--wheelhouse", type=Path, default=Path.home() / ".cache" / "mediaserver" / "wheels")
    parser.add_argument("--cmake-args", default=os.environ.get("LLAMA_CPP_CMAKE_ARGS") or DEFAULT_CMAKE_ARGS)
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose pip builds the wheel")
    args = parser.parse_args()
    version = locked_version(args.lock)
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
