"""tools/build_llama_cpp.py: llama.cpp is compiled once per machine, for the engine and the bindings.

The engine (llama-server) and the tests' llama-cpp-python run the very same shared libraries; the
wheel that carries them is a valid wheel (its RECORD lists every file with its hash); the build's
directory keeps the libraries' version links, with the binary copied last."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from mediaserver.config import Settings
from mediaserver.llm.engine_binary import find_binary
from tests.unit.test_gpu_check import ROOT, build_llama_cpp


def test_the_bindings_load_the_libraries_of_the_llama_server_build() -> None:
    import llama_cpp

    binary = find_binary(Settings(_env_file=None))
    assert binary is not None, "llama-server is not built (make setup)"
    ours = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so"):
        assert (ours / name).read_bytes() == (binary.parent / name).read_bytes(), name
    assert llama_cpp.llama_supports_mmap()  # the library loads and answers


def _record(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        return {line.split(",")[0]: line for line in archive.read(name).decode().splitlines() if line}


def test_packed_files_are_in_the_wheel_and_its_record(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo/__init__.py", "")
        archive.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n")
        archive.writestr("demo-1.0.dist-info/RECORD", "demo/__init__.py,,0\ndemo-1.0.dist-info/RECORD,,\n")
    packed = tmp_path / "packed.whl"
    build_llama_cpp.add_to_wheel(wheel, packed, {"demo/lib/libx.so": b"\x7fELF library"})
    with zipfile.ZipFile(packed) as archive:
        assert archive.read("demo/lib/libx.so") == b"\x7fELF library"
        assert archive.getinfo("demo/lib/libx.so").external_attr >> 16 == 0o755
        assert archive.read("demo/__init__.py") == b""
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"\x7fELF library").digest()).rstrip(b"=").decode()
    record = _record(packed)
    assert record["demo/lib/libx.so"] == f"demo/lib/libx.so,sha256={digest},12"
    assert set(record) == {"demo/__init__.py", "demo-1.0.dist-info/RECORD", "demo/lib/libx.so"}


def test_the_build_directory_keeps_version_links_and_gets_the_binary_last(tmp_path: Path) -> None:
    built = tmp_path / "bin"
    built.mkdir()
    (built / "libllama.so.0.5.0").write_bytes(b"lib")
    (built / "libllama.so.0").symlink_to("libllama.so.0.5.0")
    (built / "libllama.so").symlink_to("libllama.so.0")
    (built / "llama-server").write_bytes(b"binary")
    os.chmod(built / "llama-server", 0o755)
    (built / "llama-cli").write_bytes(b"not ours")
    target = tmp_path / "cache" / "llama-server-x"
    build_llama_cpp.install_server(built, target)
    assert sorted(p.name for p in target.iterdir()) == [
        "libllama.so", "libllama.so.0", "libllama.so.0.5.0", "llama-server",
    ]  # fmt: skip
    assert os.readlink(target / "libllama.so") == "libllama.so.0"
    assert (target / "libllama.so").read_bytes() == b"lib"
    assert os.access(target / "llama-server", os.X_OK)
    build_llama_cpp.install_server(built, target)  # again over the same directory: no error
    assert (target / "llama-server").read_bytes() == b"binary"


# --- one build at a time, in the background for make run ----------------------------------------

SCRIPT = ROOT / "tools" / "build_llama_cpp.py"
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DTEST_ONLY=1"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def _server_dir(cache: Path) -> Path:
    version = build_llama_cpp.locked_version(build_llama_cpp.REPO / "requirements.lock")
    return Path(build_llama_cpp.server_dir_for(cache, version, CMAKE_ARGS))


def _fake_build(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "llama-server"
    binary.write_bytes(b"#!/bin/sh\n")
    binary.chmod(0o755)
    return binary


def test_a_second_build_waits_for_the_one_running_and_uses_its_binary(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    server_dir = _server_dir(cache)
    cache.mkdir()
    with open(cache / f"{server_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the build "already running"
        waiting = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--server-cache", str(cache), "--cmake-args", CMAKE_ARGS,
             "--pointer", str(tmp_path / "pointer")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert waiting.stderr is not None
        assert "Waiting for the llama-server build already running" in waiting.stderr.readline()
        binary = _fake_build(server_dir)  # the running build finishes ...
    out, err = waiting.communicate(timeout=60)  # ... and lets go of the lock
    assert waiting.returncode == 0, err
    assert out.strip() == str(binary) and "built meanwhile" in err
    assert (tmp_path / "pointer").read_text().strip() == str(binary)


def test_make_runs_background_start_returns_at_once_when_built(tmp_path: Path) -> None:
    binary = _fake_build(_server_dir(tmp_path / "cache"))
    result = _run("--background", str(tmp_path / "build.log"), "--server-cache", str(tmp_path / "cache"),
                  "--cmake-args", CMAKE_ARGS, "--pointer", str(tmp_path / "pointer"),
                  "--status", str(tmp_path / "status.json"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "pointer").read_text().strip() == str(binary)
    assert not (tmp_path / "status.json").exists() and not (tmp_path / "build.log").exists()


def test_a_background_build_reports_its_pid_then_its_failure_and_log(tmp_path: Path) -> None:
    """The detached build with an interpreter that cannot fetch the sources (``/bin/false``): the
    status names the build's process at once, then the failure; its output is in the log."""
    status, log = tmp_path / "status.json", tmp_path / "build.log"
    started = time.monotonic()
    result = _run("--background", str(log), "--server-cache", str(tmp_path / "cache"), "--cmake-args",
                  CMAKE_ARGS, "--python", "/bin/false", "--status", str(status),
                  "--pointer", str(tmp_path / "pointer"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "building it in the background" in result.stderr and str(log) in result.stderr
    first = json.loads(status.read_text())  # (the build may have failed already: /bin/false is quick)
    assert first["pid"] > 0 and first["log"] == str(log)
    while json.loads(status.read_text())["error"] is None:
        assert time.monotonic() - started < 60, status.read_text()
        time.sleep(0.1)
    failed = json.loads(status.read_text())
    assert failed["pid"] == first["pid"] and "returned non-zero exit status 1" in failed["error"]
    assert "CalledProcessError" in log.read_text()
    assert not (tmp_path / "pointer").exists()


def test_the_status_file_follows_the_build(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    status = build_llama_cpp.BuildStatus(path, tmp_path / "build.log")
    assert json.loads(path.read_text())["pid"] == os.getpid()
    status.progress(212, 212)  # the last step is always written
    assert (json.loads(path.read_text())["done"], json.loads(path.read_text())["total"]) == (212, 212)
    status.finished()
    assert not path.exists()


def test_a_background_start_while_a_build_runs_starts_no_second_one(tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    builder = subprocess.Popen(["sleep", "60"])  # the build already running
    try:
        status.write_text(
            json.dumps({"pid": builder.pid, "started": time.time(), "done": 3, "total": 9, "error": None})
        )
        result = _run("--background", str(tmp_path / "build.log"), "--server-cache", str(tmp_path / "cache"),
                      "--cmake-args", CMAKE_ARGS, "--status", str(status))  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert f"being built already (pid {builder.pid}" in result.stderr
        assert json.loads(status.read_text())["pid"] == builder.pid and not (tmp_path / "build.log").exists()
    finally:
        builder.kill()
        builder.wait()


def test_the_python_only_wheel_has_the_bindings_and_no_library(tmp_path: Path) -> None:
    """What ``pip install .`` gets before llama.cpp is built (the bundled model's package declares
    llama-cpp-python): its Python files, no compiled code, in seconds."""
    result = _run("--python-only-wheel", "--wheelhouse", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (wheel,) = Path(result.stdout.strip()).glob("llama_cpp_python-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "llama_cpp/llama_cpp.py" in names and "llama_cpp/server/app.py" in names
    assert not [name for name in names if ".so" in name]
    again = _run("--python-only-wheel", "--wheelhouse", str(tmp_path))  # packed once
    assert again.returncode == 0 and "Packing" not in again.stderr
