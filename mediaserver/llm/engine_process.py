"""llama.cpp's own ``llama-server`` as a supervised child process: the embedded LLM engine.

One child per local GGUF model, on a free loopback port, with ``--parallel llm_slots`` slots that
llama.cpp batches continuously (every slot advances one token per decode step, a new request joins
the running batch at once) and a prompt cache per slot (a conversation's next turn only evaluates
what is new). mediaserver talks to it with the same OpenAI-compatible client as to any upstream
(``mediaserver.llm.upstream``), so there is one LLM client path.

The supervisor starts it and waits for ``/health``; a child that exits is restarted after a backoff
that doubles per crash in a row (a request meanwhile waits up to ``llm_engine_ready_wait_s``, then
gets a 503 naming the crash); ``aclose()`` stops it (SIGTERM, then SIGKILL). On Linux the child also
gets SIGTERM if this process dies without cleaning up. Its output goes to the
``mediaserver.llm.engine`` logger: errors and warnings as such, the rest at DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import os
import shutil
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import aiohttp

from mediaserver.config import Settings
from mediaserver.devices import DeviceChoice
from mediaserver.errors import ModelUnavailable, Overloaded
from mediaserver.llm.defaults import chat_template_for
from mediaserver.llm.tools import ToolConfig
from mediaserver.llm.types import ChatMessage

log = logging.getLogger(__name__)
engine_log = logging.getLogger("mediaserver.llm.engine")

SERVER_CACHE = Path.home() / ".cache" / "mediaserver" / "llama-server"
# Written by `make setup` into the venv: the path of the llama-server built for this venv's flags.
VENV_POINTER = ".llama-server"
HEALTH_POLL_S = 0.1
STABLE_AFTER_S = 60.0  # a child that ran this long resets the backoff
STOP_TIMEOUT_S = 5.0

EngineState = Literal["stopped", "starting", "ready", "restarting", "failed"]


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


def binary_problem(settings: Settings) -> str | None:
    """Why no engine can run here, or None."""
    binary = find_binary(settings)
    if binary is None:
        return (
            "llama-server is not built: run `make setup` (tools/build_llama_cpp.py --server) or set llm_engine_binary"
        )
    if not os.access(binary, os.X_OK):
        return f"llm_engine_binary {str(binary)!r} is not an executable file"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _threads(settings: Settings) -> int:
    # Half the cores by default: llama.cpp's threads wait on each other at every layer, so sharing
    # all cores with ASR (or anything else) stalls them (see README, "Threads").
    return settings.llm_threads or max(1, (os.cpu_count() or 2) // 2)


class LlamaServerProcess:
    """One supervised llama-server serving one GGUF under the name ``alias``."""

    def __init__(
        self,
        alias: str,
        model_path: str,
        settings: Settings,
        device: DeviceChoice | None = None,
        *,
        on_restart: Callable[[], None] | None = None,
        projector_path: str | None = None,
    ) -> None:
        self.alias = alias
        self.model_path = model_path
        self.projector_path = projector_path  # a vision model's multimodal projector (--mmproj)
        self.settings = settings
        self.device = device
        self.slots = settings.llm_slots
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.state: EngineState = "stopped"
        self.restarts = 0
        self.last_exit: str | None = None  # why the previous child ended (for errors and /health)
        self._on_restart = on_restart
        self._process: asyncio.subprocess.Process | None = None
        self._ready = asyncio.Event()
        self._tail: deque[str] = deque(maxlen=40)
        self._supervisor: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._http: aiohttp.ClientSession | None = None
        self.chat_template = chat_template_for(alias, settings)
        # What the chat template and model can do (llama-server's /props), read once the child is healthy.
        self.supports_tools = False
        self.supports_images = False

    @property
    def ready(self) -> bool:
        """The child is up and answered its health check (and has not exited since)."""
        process = self._process
        return self._ready.is_set() and process is not None and process.returncode is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def command(self, binary: Path) -> list[str]:
        s = self.settings
        threads = _threads(s)
        on_gpu = self.device is not None and self.device.device == "cuda"
        layers = ("all" if s.llm_gpu_layers < 0 else str(s.llm_gpu_layers)) if on_gpu else "0"
        return [
            str(binary), "--model", self.model_path, "--alias", self.alias,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--parallel", str(self.slots), "--cont-batching", "--no-kv-unified",
            "--ctx-size", str(self.slots * s.llm_context_tokens),
            "--batch-size", str(min(s.llm_batch_tokens, s.llm_context_tokens)),
            "--ubatch-size", str(min(s.llm_ubatch_tokens, s.llm_batch_tokens, s.llm_context_tokens)),
            "--threads", str(threads), "--threads-batch", str(s.llm_threads_batch or threads),
            "--threads-http", str(max(2, self.slots)),
            "--cache-prompt", "--cache-ram", str(s.llm_engine_cache_ram_mb),
            "--n-gpu-layers", layers, "--no-webui", "--metrics", "--log-prefix", "--log-colors", "off",
            "--jinja", *(["--chat-template-file", str(self.chat_template)] if self.chat_template else []),
            *(["--mmproj", self.projector_path] if self.projector_path else ["--no-mmproj"]),
        ]  # fmt: skip

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the child and wait for its health; ModelUnavailable (with its last output) if it
        exits or does not become healthy within ``llm_engine_start_timeout_s``."""
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        problem = self._start_problem()
        if problem:
            self.state = "failed"
            self.last_exit = problem
            raise ModelUnavailable(problem)
        try:
            await self._spawn()
        except ModelUnavailable:
            self.state = "failed"
            raise
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name=f"llm-engine-{self.alias}")

    def _start_problem(self) -> str | None:
        """Why the child cannot start: no binary, or a configured file that is not there."""
        problem = binary_problem(self.settings)
        if problem is None and self.chat_template is not None and not self.chat_template.is_file():
            problem = (
                f"the chat template {str(self.chat_template)!r} of {self.alias!r} is not a file (llm_chat_templates)"
            )
        if problem is None and self.projector_path is not None and not Path(self.projector_path).is_file():
            problem = (
                f"the vision projector {self.projector_path!r} of {self.alias!r} is not a file (llm_vision_projectors)"
            )
        return problem

    async def _spawn(self) -> None:
        binary = find_binary(self.settings)
        assert binary is not None
        self.state = "starting"
        self._tail.clear()
        command = self.command(binary)
        log.info("starting llama-server for %s on port %d: %s", self.alias, self.port, " ".join(command))
        started = time.monotonic()
        self._process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self._reader = asyncio.get_running_loop().create_task(self._read_output(self._process))
        try:
            await self._wait_healthy(self._process, self.settings.llm_engine_start_timeout_s)
        except ModelUnavailable:
            await self._kill()
            raise
        await self._read_capabilities()
        self.state = "ready"
        self._ready.set()
        log.info("llama-server for %s ready in %.1f s (pid %d)", self.alias, time.monotonic() - started, self.pid)

    async def _wait_healthy(self, process: asyncio.subprocess.Process, timeout_s: float) -> None:
        assert self._http is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if process.returncode is not None:
                await asyncio.sleep(0.05)  # let the reader take the last lines
                raise ModelUnavailable(
                    f"the llama-server engine for {self.alias!r} exited with code {process.returncode} at start: "
                    f"{self.output_tail()}"
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self._http.get(f"{self.base_url}/health") as response:
                    if response.status == 200:
                        return
            if time.monotonic() > deadline:
                raise ModelUnavailable(
                    f"the llama-server engine for {self.alias!r} was not healthy within {timeout_s:g} s "
                    f"(llm_engine_start_timeout_s): {self.output_tail()}"
                )
            await asyncio.sleep(HEALTH_POLL_S)

    async def _read_capabilities(self) -> None:
        """Whether the chat template renders tools and calls (so llama-server parses and constrains
        them), and whether the model sees images (a projector loaded): llama-server's ``/props``."""
        assert self._http is not None
        try:
            async with self._http.get(f"{self.base_url}/props") as response:
                response.raise_for_status()
                props = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("llama-server for %s: no /props (%s); tools and images are off for it", self.alias, exc)
            props = {}
        caps = props.get("chat_template_caps") or {}
        self.supports_tools = bool(caps.get("supports_tools") and caps.get("supports_tool_calls"))
        self.supports_images = bool((props.get("modalities") or {}).get("vision"))

    def output_tail(self, lines: int = 6) -> str:
        """The child's last lines of output, errors first: what a start failure is explained by."""
        tail = list(self._tail)
        errors = [line for line in tail if line.startswith("E ") or "error" in line.lower()]
        return " | ".join((errors or tail)[-lines:]) or "(no output)"

    async def _read_output(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        while True:
            raw = await process.stdout.readline()
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip()
            if not line:
                continue
            self._tail.append(line)
            level = logging.DEBUG
            if line.startswith("E "):
                level = logging.ERROR
            elif line.startswith("W "):
                level = logging.WARNING
            engine_log.log(level, "[%s] %s", self.alias, line)

    async def _supervise(self) -> None:
        """Restart the child whenever it exits, until aclose()."""
        crashes_in_a_row = 0
        while True:
            process = self._process
            assert process is not None
            ran_from = time.monotonic()
            code = await process.wait()
            if self._reader is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._reader, 1.0)
            if self._closing:
                return
            self._ready.clear()
            self.state = "restarting"
            if time.monotonic() - ran_from > STABLE_AFTER_S:
                crashes_in_a_row = 0
            self.last_exit = f"exited with code {code}: {self.output_tail(3)}"
            log.error("llama-server for %s %s", self.alias, self.last_exit)
            while True:  # until a child is healthy again
                backoff = min(
                    self.settings.llm_engine_restart_backoff_s * 2**crashes_in_a_row,
                    self.settings.llm_engine_restart_max_backoff_s,
                )
                crashes_in_a_row += 1
                self.restarts += 1
                if self._on_restart is not None:
                    self._on_restart()
                log.info("restarting llama-server for %s in %.1f s", self.alias, backoff)
                await asyncio.sleep(backoff)
                if self._closing:
                    return
                try:
                    await self._spawn()
                    break
                except ModelUnavailable as exc:
                    self.last_exit = exc.message
                    log.error("%s", exc.message)

    async def wait_ready(self) -> None:
        """Return once the engine answers; a 503 after ``llm_engine_ready_wait_s`` of restarting."""
        if self._ready.is_set():
            return
        if self.state in ("failed", "stopped"):
            raise ModelUnavailable(f"the llama-server engine for {self.alias!r} is not running: {self.last_exit}")
        wait_s = self.settings.llm_engine_ready_wait_s
        try:
            await asyncio.wait_for(self._ready.wait(), wait_s)
        except TimeoutError:
            raise Overloaded(
                f"the llama-server engine for {self.alias!r} is restarting ({self.last_exit}); "
                f"not back within {wait_s:g} s (llm_engine_ready_wait_s)",
                retry_after_s=self.settings.llm_engine_restart_max_backoff_s,
            ) from None

    async def slot_states(self) -> list[dict[str, Any]]:
        """llama-server's ``/slots``: per slot, ``is_processing``, ``n_decoded`` ... (tests, /health)."""
        assert self._http is not None
        async with self._http.get(f"{self.base_url}/slots") as response:
            response.raise_for_status()
            slots: list[dict[str, Any]] = await response.json()
            return slots

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage], tools: ToolConfig | None = None) -> int:
        """The prompt's length in tokens, with the model's chat template (``/apply-template``, ``/tokenize``)."""
        assert self._http is not None
        body: dict[str, Any] = {"messages": [m.openai() for m in messages]}
        if tools is not None:
            body["tools"] = [tool.openai() for tool in tools.tools]
        async with self._http.post(f"{self.base_url}/apply-template", json=body) as response:
            response.raise_for_status()
            prompt = (await response.json())["prompt"]
        async with self._http.post(f"{self.base_url}/tokenize", json={"content": prompt, "add_special": True}) as resp:
            resp.raise_for_status()
            return len((await resp.json())["tokens"])

    async def _kill(self) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    async def aclose(self) -> None:
        self._closing = True
        self._ready.clear()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        await self._kill()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 1.0)
        if self._http is not None:
            await self._http.close()
        self.state = "stopped"
