"""Which ``llama-server`` binary the engines run, and whether one is still being built.

``make setup`` builds it once per machine (tools/build_llama_cpp.py) and writes its path into the
venv (``VENV_POINTER``). ``make run`` on a fresh machine does not wait for that build: it starts it
in the background and the server at once, so speech is served within a minute or two while llama.cpp
compiles. The build writes its progress into the venv (``BUILD_STATUS``: its pid, how many of how
many files are compiled, or why it failed); until it is done, the LLM is "building": ``/health``
says so with the progress, requests get a 503 with ``Retry-After``, and the service starts the
engine as soon as the binary is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mediaserver.config import Settings

SERVER_CACHE = Path.home() / ".cache" / "mediaserver" / "llama-server"
# Written by `make setup` into the venv: the path of the llama-server built for this venv's flags.
VENV_POINTER = ".llama-server"
# Written into the venv by a build in progress (tools/build_llama_cpp.py --status), removed when done.
BUILD_STATUS = ".llama-server-build.json"
BUILD_POLL_S = 2.0  # how often a service waiting for the build looks at it
# How long a build that has compiled nothing yet is assumed to still need (for Retry-After).
UNKNOWN_REMAINING_S = 60.0


def find_binary(settings: Settings) -> Path | None:
    """The llama-server to run: the setting, the venv's pointer, the cached build, or PATH."""
    if settings.llm_engine_binary is not None:
        return settings.llm_engine_binary
    pointer = Path(sys.prefix) / VENV_POINTER
    with contextlib.suppress(OSError):
        recorded = Path(pointer.read_text().strip())
        if recorded.is_file():
            return recorded
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        version = "*"
    builds = sorted(SERVER_CACHE.glob(f"llama-server-{version}-*/llama-server"), key=lambda p: p.stat().st_mtime)
    if builds:
        return builds[-1]
    found = shutil.which("llama-server")
    return Path(found) if found else None


@dataclass(frozen=True)
class BuildProgress:
    """A llama-server build this venv is waiting for (``building``), or one that failed."""

    building: bool
    done: int
    total: int
    elapsed_s: float
    log: str | None
    error: str | None

    def describe(self) -> str:
        where = f"; its log: {self.log}" if self.log else ""
        if not self.building:
            return f"the llama-server build failed ({self.error or 'it stopped'}){where}; run `make setup` to retry"
        share = f"{100 * self.done // self.total} %, {self.done} of {self.total} files" if self.total else "starting"
        so_far = f"{self.elapsed_s:.0f} s" if self.elapsed_s < 120 else f"{self.elapsed_s / 60:.0f} min"
        return f"llama-server is still being built ({share}, {so_far} so far{where}); the LLM starts when it is done"

    def remaining_s(self) -> float:
        """Seconds the build may still take, from its pace so far."""
        if not self.building or self.done <= 0 or self.total <= 0:
            return UNKNOWN_REMAINING_S
        return max(1.0, self.elapsed_s * (self.total - self.done) / self.done)

    def as_dict(self) -> dict[str, Any]:
        return {
            "building": self.building,
            "compiled": self.done,
            "of": self.total,
            "elapsed_s": round(self.elapsed_s),
            "log": self.log,
            "error": self.error,
        }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def build_progress(settings: Settings) -> BuildProgress | None:
    """The venv's llama-server build in progress (or failed), while no binary is found; else None."""
    if settings.llm_engine_binary is not None or find_binary(settings) is not None:
        return None
    try:
        status = json.loads((Path(sys.prefix) / BUILD_STATUS).read_text())
        pid = int(status["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    error = status.get("error")
    building = error is None and _alive(pid)
    return BuildProgress(
        building=building,
        done=int(status.get("done") or 0),
        total=int(status.get("total") or 0),
        elapsed_s=max(0.0, time.time() - float(status.get("started") or time.time())),
        log=status.get("log"),
        error=error if error is not None or building else "the build process is gone",
    )


def binary_problem(settings: Settings) -> str | None:
    """Why no engine can run here, or None."""
    binary = find_binary(settings)
    if binary is None:
        progress = build_progress(settings)
        if progress is not None:
            return progress.describe()
        return "llama-server is not built: run `make setup` (tools/build_llama_cpp.py) or set llm_engine_binary"
    if not os.access(binary, os.X_OK):
        return f"llm_engine_binary {str(binary)!r} is not an executable file"
    return None


def lasting_binary_problem(settings: Settings) -> str | None:
    """``binary_problem``, but None while a build is under way: the LLM stays on, "building"."""
    progress = build_progress(settings)
    if progress is not None and progress.building:
        return None
    return binary_problem(settings)


async def wait_for_build(settings: Settings) -> BuildProgress | None:
    """Return once the build in progress is over: None when the binary is there, else how it failed.
    It is another process's work, seen only through its status file: polled every ``BUILD_POLL_S``."""
    while True:
        progress = build_progress(settings)
        if progress is None or not progress.building:
            return progress
        await asyncio.sleep(BUILD_POLL_S)
