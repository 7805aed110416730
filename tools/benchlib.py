"""What the benchmarks share: a mediaserver child process on free loopback ports, and small helpers."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # the kit tools and tests share (tests/ports.py ...)
    sys.path.insert(0, str(REPO))

from tests.ports import free_port  # noqa: E402

__all__ = ["REPO", "CpuWatch", "child_server", "free_port", "get_json", "median", "percentile"]


def get_json(url: str, timeout_s: float = 5.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.loads(response.read())
    except (OSError, urllib.error.URLError, ValueError):
        return None


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


@contextlib.contextmanager
def child_server(
    log_path: Path,
    startup_timeout_s: float,
    env_overrides: Mapping[str, str] | None = None,
    cwd: Path = REPO,
    log_level: str = "WARNING",
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``python -m mediaserver`` on free loopback ports (HTTP, HTTPS, Wyoming); yields (url, process).

    ``cwd`` is the source tree the server runs from (another commit unpacked somewhere, say).
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-certs-") as cert_dir, open(log_path, "wb") as log_file:
        command = [
            sys.executable, "-m", "mediaserver", "--http-port", str(port), "--host", "127.0.0.1",
            "--https-port", str(free_port()), "--cert-dir", cert_dir, "--log-level", log_level,
        ]  # fmt: skip
        env = dict(os.environ)
        env.setdefault("MEDIASERVER_WYOMING_HOST", "127.0.0.1")
        env.setdefault("MEDIASERVER_WYOMING_PORT", str(free_port()))
        env.update(env_overrides or {})
        if cwd != REPO:
            env["PYTHONPATH"] = str(cwd)
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + startup_timeout_s
            while get_json(f"{url}/health") is None:
                if process.poll() is not None:
                    raise SystemExit(f"the server exited with {process.returncode}; see {log_path}")
                if time.monotonic() > deadline:
                    raise SystemExit(f"no /health within {startup_timeout_s:g} s; see {log_path}")
                time.sleep(0.2)
            yield url, process
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)


class CpuWatch:
    """CPU time used by other processes (neither the server nor this benchmark) over an interval.

    A noise indicator: the machine may be shared, and other work skews every figure here.
    """

    def __init__(self, server_pid: int | None) -> None:
        import psutil

        self._self = psutil.Process()
        self._server: Any = psutil.Process(server_pid) if server_pid is not None else None
        self._start: tuple[float, float, float, float] | None = None

    def _snapshot(self) -> tuple[float, float, float, float]:
        import psutil

        t = psutil.cpu_times()
        busy = sum(float(getattr(t, name, 0.0)) for name in ("user", "nice", "system", "irq", "softirq", "steal"))
        own = self._self.cpu_times()
        server = 0.0
        if self._server is not None:
            with contextlib.suppress(psutil.Error):
                st = self._server.cpu_times()
                server = float(st.user + st.system)
        return time.monotonic(), busy, float(own.user + own.system), server

    def start(self) -> None:
        self._start = self._snapshot()

    def stop(self) -> float | None:
        """Average cores busy with other processes since start() (None if never started)."""
        if self._start is None:
            return None
        end = self._snapshot()
        wall = end[0] - self._start[0]
        if wall <= 0:
            return None
        other = (end[1] - self._start[1]) - (end[2] - self._start[2]) - (end[3] - self._start[3])
        return max(0.0, other / wall)
