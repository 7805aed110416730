"""Real server processes for the scale-out tests: mediaserver replicas, HAProxy and Triton.

Each is started on loopback ports found free at run time, waited for through its own health check,
and stopped by its PID (its whole process group, since Triton and HAProxy run children).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from mediaserver.app import create_app
from mediaserver.asr.models import ModelRegistry
from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.devices import choose_device
from mediaserver.metrics import Metrics
from mediaserver.tts.service import TtsService
from tests.conftest import LiveServer
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]


async def wait_http_ok(url: str, timeout_s: float = 90.0, process: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``url`` until it answers 200; fail early if ``process`` exits."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while True:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"process for {url} exited with {process.returncode}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer 200 within {timeout_s:g} s")
            await asyncio.sleep(0.25)


@dataclass
class ManagedProcess:
    """A child process in its own process group, with its output in a log file."""

    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = ROOT
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.process = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole group at once: a crash, with no chance to finish anything."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            assert self.process is not None
            self.process.wait(timeout=10)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL what is left of the group."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # children that outlived their parent
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def mediaserver_process(
    log_dir: Path, *, http_port: int | None = None, name: str = "mediaserver", **settings: str
) -> tuple[ManagedProcess, str]:
    """``python -m mediaserver`` on loopback (Wyoming and TTS off unless asked), and its base URL."""
    port = http_port or free_port()
    env = {
        "MEDIASERVER_WYOMING_ENABLED": "false",
        "MEDIASERVER_TTS_ENABLED": "false",
        "MEDIASERVER_ASR_PRELOAD_MODELS": '["tiny.en"]',
        "MEDIASERVER_SAVE_AUDIO_DIR": str(log_dir / f"{name}-audio"),
        "MEDIASERVER_CERT_DIR": str(log_dir / "no-certs"),
    }
    env.update({f"MEDIASERVER_{k.upper()}": v for k, v in settings.items()})
    argv = [sys.executable, "-m", "mediaserver", "--host", "127.0.0.1", "--http-port", str(port)]
    return ManagedProcess(argv, log_dir / f"{name}.log", env), f"http://127.0.0.1:{port}"


@asynccontextmanager
async def serving(app: web.Application, runner_class: type[web.AppRunner] = web.AppRunner) -> AsyncIterator[str]:
    """``app`` served on loopback, port 0, until the block ends: its base URL."""
    runner = runner_class(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def front_server(
    base_settings: Settings, tts_service: TtsService | None = None, **overrides: Any
) -> AsyncIterator[LiveServer]:
    """An in-process server with its own ASR service built from settings (remote models cost nothing
    to load), sharing the session's TTS voice; on loopback, port 0. No LLM unless the overrides
    ask for one (``llm_enabled=True``): these servers test ASR engines, and each would otherwise
    start its own llama-server child."""
    settings = base_settings.model_copy(update={"asr_preload_models": [], "llm_enabled": False, **overrides})
    service = AsrService(settings, choose_device("cpu"), ModelRegistry(settings), Metrics())
    await service.start()
    app = create_app(settings, asr_service=service, tts_service=tts_service)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", "127.0.0.1", port, app)
    finally:
        await runner.cleanup()
        await service.aclose()


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM a child the test started, SIGKILL it if it is still there after ``timeout_s``."""
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --- Triton -------------------------------------------------------------------------------------

TRITON_VENV = ROOT / ".triton-venv"
TRITON_REQUIREMENTS = ROOT / "tools" / "triton-requirements.txt"
# PyTriton's stub embeds Debian's libpython3.11: the venv must be made with that interpreter.
DEBIAN_PYTHON = Path(os.environ.get("MEDIASERVER_TEST_TRITON_PYTHON", "/usr/bin/python3.11"))


def ensure_triton_venv() -> tuple[Path, float]:
    """The Triton venv's python (made from PyPI on first use, kept while its requirements match),
    and the seconds spent making it (0 when it was there)."""
    stamp = TRITON_VENV / ".requirements"
    wanted = TRITON_REQUIREMENTS.read_text()
    python = TRITON_VENV / "bin" / "python"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python, 0.0
    if not DEBIAN_PYTHON.exists():
        raise FileNotFoundError(f"{DEBIAN_PYTHON} (Debian's python3.11) is needed for the Triton venv")
    started = time.monotonic()
    subprocess.run([str(DEBIAN_PYTHON), "-m", "venv", "--clear", str(TRITON_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-r", str(TRITON_REQUIREMENTS)], check=True)
    stamp.write_text(wanted)
    return python, time.monotonic() - started


def triton_process(python: Path, model_dir: str, log_dir: Path, *, model_name: str = "infer_bls") -> ManagedProcess:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    argv = [
        str(python),
        str(ROOT / "tools" / "triton_whisper_server.py"),
        "--model-dir",
        model_dir,
        "--model-name",
        model_name,
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
    ]
    ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
    return ManagedProcess(argv, log_dir / "triton.log", {"PYTHONUNBUFFERED": "1"}, ports=ports)


# --- HAProxy ------------------------------------------------------------------------------------

HAPROXY_CONFIG = ROOT / "deploy" / "haproxy.cfg"


def haproxy_process(log_dir: Path, replicas: list[dict[str, int]]) -> ManagedProcess:
    """HAProxy running ``deploy/haproxy.cfg`` as shipped, its addresses set for two loopback replicas
    (each ``{"http": port, "wyoming": port}``)."""
    assert len(replicas) == 2, "deploy/haproxy.cfg lists two replicas"
    http_port, wyoming_port = free_port(), free_port()
    env = {"MS_HTTP_BIND": f"127.0.0.1:{http_port}", "MS_WYOMING_BIND": f"127.0.0.1:{wyoming_port}"}
    for number, ports in enumerate(replicas, start=1):
        env[f"MS_R{number}_HTTP"] = f"127.0.0.1:{ports['http']}"
        env[f"MS_R{number}_WYOMING"] = f"127.0.0.1:{ports['wyoming']}"
        env[f"MS_R{number}_HEALTH_PORT"] = str(ports["http"])
    argv = ["haproxy", "-db", "-f", str(HAPROXY_CONFIG)]
    return ManagedProcess(argv, log_dir / "haproxy.log", env, ports={"http": http_port, "wyoming": wyoming_port})
