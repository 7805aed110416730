"""llama.cpp's own ``llama-server`` as a supervised child process: the embedded LLM engine.

One child per local GGUF model, on a free loopback port, with ``--parallel llm_slots`` slots that
llama.cpp batches continuously (every slot advances one token per decode step, a new request joins
the running batch at once) and a prompt cache per slot (a conversation's next turn only evaluates
what is new). mediaserver talks to it with the same OpenAI-compatible client as to any upstream
(``mediaserver.llm.upstream``), so there is one LLM client path.

The supervisor starts it and waits for ``/health``; a child that exits is restarted after a backoff
that doubles per crash in a row (a request meanwhile waits up to ``llm_engine_ready_wait_s``, then
gets a 503 saying why); ``aclose()`` stops it (SIGTERM, then SIGKILL). On Linux the child also
gets SIGTERM if this process dies without cleaning up.

A child can also stay alive and stop answering (stopped, deadlocked): a watchdog asks its ``/health``
every ``llm_engine_probe_interval_s``. After ``llm_engine_probe_failures`` probes in a row without an
answer within ``llm_engine_probe_timeout_s`` it is ``unresponsive``: requests get a 503 with
``Retry-After`` at once instead of waiting out ``llm_request_timeout_s``. One that answers again is
``ready`` again; one that has answered nothing for ``llm_engine_hang_restart_s`` is killed (SIGKILL)
and restarted like a crash.

Its output goes to the ``mediaserver.llm.engine`` logger (errors as such, the rest at DEBUG) and
stays there: what clients and ``/health`` read is said in words (``last_exit``: the exit
code or signal, and at most its last error message, summarised).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
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
from mediaserver.errors import EngineBuilding, ModelUnavailable, Overloaded
from mediaserver.llm.defaults import chat_template_for
from mediaserver.llm.engine_binary import binary_problem, build_progress, find_binary
from mediaserver.llm.engine_output import describe_exit, is_error_line, line_level, summarize_error
from mediaserver.llm.tools import ToolConfig
from mediaserver.llm.types import ChatMessage

log = logging.getLogger(__name__)
engine_log = logging.getLogger("mediaserver.llm.engine")

HEALTH_POLL_S = 0.1
STABLE_AFTER_S = 60.0  # a child that ran this long resets the backoff
# Connections this process may hold open to one child besides the slots' own streams: the
# watchdog's probe, the /slots, /tokenize and /health reads, and the streams' keep-alive
# connections between requests (one per slot).
HTTP_SPARE_CONNECTIONS = 4

EngineState = Literal["stopped", "starting", "ready", "unresponsive", "restarting", "failed"]


def template_body(messages: Sequence[ChatMessage], tools: ToolConfig | None) -> dict[str, Any]:
    """What llama-server's ``/apply-template`` renders: the messages, and the tools they list."""
    body: dict[str, Any] = {"messages": [m.openai(json_arguments=True) for m in messages]}
    if tools is not None:
        body["tools"] = [tool.openai() for tool in tools.tools]
    return body


def http_threads(slots: int) -> int:
    """llama-server's ``--threads-http``: a thread for every connection this process may hold open.

    cpp-httplib serves a connection on one thread for as long as it is kept alive (up to 100
    requests, or 5 s idle), and starts an extra thread for a new connection only when none is idle
    at that moment: when a burst of new connections outnumbers the idle threads, the rest wait for
    a kept-alive connection to end. With ``slots`` threads, keep-alive connections (the watchdog's
    probe holds one for 100 probes) made four streams at once run one after another (measured:
    first tokens 0.25 / 1.26 / 2.25 / 3.27 s with three connections held, all four at 0.73-1.01 s
    with these threads)."""
    return 2 * slots + HTTP_SPARE_CONNECTIONS


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
    # all cores with ASR (or anything else) stalls them (docs/llm.md, "Models").
    return settings.llm_threads or max(1, (os.cpu_count() or 2) // 2)


def restart_backoff_s(settings: Settings, crashes_in_a_row: int) -> float:
    """The pause before restarting a crashed engine: ``llm_engine_restart_backoff_s`` doubled per
    earlier crash in a row, at most ``llm_engine_restart_max_backoff_s``."""
    backoff_s: float = settings.llm_engine_restart_backoff_s * 2**crashes_in_a_row
    return min(backoff_s, settings.llm_engine_restart_max_backoff_s)


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
        scoring_slot: bool = False,
    ) -> None:
        self.alias = alias
        self.label = alias  # how logs and errors name this engine (an embedding engine says so)
        self.model_path = model_path
        self.projector_path = projector_path  # a vision model's multimodal projector (--mmproj)
        self.settings = settings
        self.device = device
        self.slots = settings.llm_slots  # the generations' slots, 0 .. slots - 1
        # The turn text scorer (turn_text_model, llm/registry.scores_turn_text): one more slot, the
        # last, for the pauses' one-token scorings (turns/text_eou.py), so they never evict a
        # conversation's cached prompt (measured: the voice loop's prompt cache 92 % -> 61 %, first
        # token 0.24 -> 0.76 s).
        self.scoring_slot: int | None = self.slots if scoring_slot else None
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.state: EngineState = "stopped"
        self.restarts = 0
        self.last_exit: str | None = None  # why the previous child ended, in words (for errors and /health)
        self.last_answer = time.monotonic()  # when the child last answered a health probe
        self._on_restart = on_restart
        self._process: asyncio.subprocess.Process | None = None
        self._ready = asyncio.Event()
        # Set by the supervisor once the current child has exited: a request that failed on it waits for this.
        self._child_gone = asyncio.Event()
        self._hang: str | None = None  # why the watchdog killed the current child
        self._tail: deque[str] = deque(maxlen=40)
        self._supervisor: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._http: aiohttp.ClientSession | None = None
        self._probe_http: aiohttp.ClientSession | None = None
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
        """The running child's (None while there is none: not started, or exited and not yet replaced)."""
        process = self._process
        return process.pid if process is not None and process.returncode is None else None

    def command(self, binary: Path) -> list[str]:
        s = self.settings
        threads = _threads(s)
        on_gpu = self.device is not None and self.device.device == "cuda"
        layers = ("all" if s.llm_gpu_layers < 0 else str(s.llm_gpu_layers)) if on_gpu else "0"
        parallel = self.slots + (1 if self.scoring_slot is not None else 0)
        return [
            str(binary), "--model", self.model_path, "--alias", self.alias,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--parallel", str(parallel), "--cont-batching", "--no-kv-unified",
            "--ctx-size", str(parallel * s.llm_context_tokens),
            "--batch-size", str(min(s.llm_batch_tokens, s.llm_context_tokens)),
            "--ubatch-size", str(min(s.llm_ubatch_tokens, s.llm_batch_tokens, s.llm_context_tokens)),
            "--threads", str(threads), "--threads-batch", str(s.llm_threads_batch or threads),
            "--threads-http", str(http_threads(parallel)),
            "--cache-prompt", "--cache-ram", str(s.llm_engine_cache_ram_mb),
            "--cache-reuse", str(s.llm_engine_cache_reuse_tokens),
            "--n-gpu-layers", layers, "--no-webui", "--metrics", "--log-prefix", "--log-colors", "off",
            # A conversation's last message from the assistant is a whole message, as OpenAI reads
            # it (a Realtime response.create after an answer, a client's greeting item): llama-server
            # would otherwise continue it, and refuse two in a row.
            "--no-prefill-assistant",
            "--jinja", *(["--chat-template-file", str(self.chat_template)] if self.chat_template else []),
            *(["--mmproj", self.projector_path] if self.projector_path else ["--no-mmproj"]),
        ]  # fmt: skip

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the child and wait for its health; ModelUnavailable (with its last output) if it
        exits or does not become healthy within ``llm_engine_start_timeout_s``."""
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        # The watchdog's own connection: its probes never queue behind token counts or /slots reads.
        self._probe_http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
        problem = self._start_problem()
        if problem:
            self.state = "failed"
            self.last_exit = problem
            progress = build_progress(self.settings)
            if progress is not None and progress.building:  # make run's build: a 503 until it is done
                raise EngineBuilding(problem, retry_after_s=progress.remaining_s())
            raise ModelUnavailable(problem)
        try:
            await self._spawn()
        except ModelUnavailable:
            self.state = "failed"
            raise
        loop = asyncio.get_running_loop()
        self._supervisor = loop.create_task(self._supervise(), name=f"llm-engine-{self.label}")
        self._watchdog = loop.create_task(self._watch(), name=f"llm-engine-watchdog-{self.label}")

    def _start_problem(self) -> str | None:
        """Why the child cannot start: no binary, or a configured file that is not there."""
        problem = binary_problem(self.settings)
        if problem is None and self.chat_template is not None and not self.chat_template.is_file():
            problem = (
                f"the chat template {str(self.chat_template)!r} of {self.label!r} is not a file (llm_chat_templates)"
            )
        if problem is None and self.projector_path is not None and not Path(self.projector_path).is_file():
            problem = (
                f"the vision projector {self.projector_path!r} of {self.label!r} is not a file (llm_vision_projectors)"
            )
        return problem

    async def _spawn(self) -> None:
        binary = find_binary(self.settings)
        assert binary is not None
        self.state = "starting"
        self._tail.clear()
        self._hang = None
        self._child_gone = asyncio.Event()
        command = self.command(binary)
        log.info("starting llama-server for %s on port %d: %s", self.label, self.port, " ".join(command))
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
        self.last_answer = time.monotonic()
        self._ready.set()
        log.info("llama-server for %s ready in %.1f s (pid %s)", self.label, time.monotonic() - started, self.pid)

    async def _wait_healthy(self, process: asyncio.subprocess.Process, timeout_s: float) -> None:
        assert self._http is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if process.returncode is not None:
                await asyncio.sleep(0.05)  # let the reader take the last lines
                raise ModelUnavailable(
                    f"the llama-server engine for {self.label!r} {describe_exit(process.returncode)} at start"
                    f"{self.error_summary()}"
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self._http.get(f"{self.base_url}/health") as response:
                    if response.status == 200:
                        return
            if time.monotonic() > deadline:
                raise ModelUnavailable(
                    f"the llama-server engine for {self.label!r} was not healthy within {timeout_s:g} s "
                    f"(llm_engine_start_timeout_s){self.error_summary()}"
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
            log.warning("llama-server for %s: no /props (%s); tools and images are off for it", self.label, exc)
            props = {}
        caps = props.get("chat_template_caps") or {}
        self.supports_tools = bool(caps.get("supports_tools") and caps.get("supports_tool_calls"))
        self.supports_images = bool((props.get("modalities") or {}).get("vision"))

    def output_tail(self, lines: int = 6) -> str:
        """The child's last lines of output, errors first (for the server's log only: raw lines)."""
        tail = list(self._tail)
        errors = [line for line in tail if is_error_line(line)]
        return " | ".join((errors or tail)[-lines:]) or "(no output)"

    def error_summary(self) -> str:
        """``": <its first error message, summarised>"`` from the child's recent output (the first is
        the cause, the rest its consequences), or ``""``: what a client or /health may read of it,
        never timings, token counts or other raw lines (those stay in the server's log)."""
        errors = [line for line in self._tail if is_error_line(line)]
        summary = summarize_error(errors[0]) if errors else ""
        return f": {summary}" if summary else ""

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
            # Its errors as such (the level follows a timestamp: "0.00.011.723 E ..."), the rest at DEBUG:
            # its warnings include one per cancelled request.
            level = logging.ERROR if line_level(line) == "E" else logging.DEBUG
            engine_log.log(level, "[%s] %s", self.label, line)

    async def _supervise(self) -> None:
        """Restart the child whenever it exits, until aclose()."""
        crashes_in_a_row = 0
        while True:
            process = self._process
            assert process is not None
            ran_from = time.monotonic()
            gone = self._child_gone
            code = await process.wait()
            if self._closing:
                return
            self._ready.clear()
            self.state = "restarting"
            gone.set()  # requests that failed on this child may now wait for the next one
            if self._reader is not None:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1.0):
                        await self._reader
            if time.monotonic() - ran_from > STABLE_AFTER_S:
                crashes_in_a_row = 0
            if self._hang is not None:
                self.last_exit = self._hang
            else:
                self.last_exit = f"{describe_exit(code)}{self.error_summary()}"
            log.error("llama-server for %s %s; its last output: %s", self.label, self.last_exit, self.output_tail(3))
            while True:  # until a child is healthy again
                backoff = restart_backoff_s(self.settings, crashes_in_a_row)
                crashes_in_a_row += 1
                self.restarts += 1
                if self._on_restart is not None:
                    self._on_restart()
                log.info("restarting llama-server for %s in %.1f s", self.label, backoff)
                await asyncio.sleep(backoff)
                if self._closing:
                    return
                try:
                    await self._spawn()
                    break
                except ModelUnavailable as exc:
                    self.state = "restarting"  # (backing off again: not "starting" a child that is gone)
                    self.last_exit = exc.message
                    log.error("%s", exc.message)

    async def wait_ready(self) -> None:
        """Return once the engine answers; a 503 at once while it is unresponsive, and after
        ``llm_engine_ready_wait_s`` of restarting."""
        if self._ready.is_set():
            return
        if self.state in ("failed", "stopped"):
            raise ModelUnavailable(f"the llama-server engine for {self.label!r} is not running: {self.last_exit}")
        self.check_responsive()
        wait_s = self.settings.llm_engine_ready_wait_s
        try:
            async with asyncio.timeout(wait_s):
                await self._ready.wait()
        except TimeoutError:
            raise Overloaded(
                f"the llama-server engine for {self.label!r} is restarting (it {self.last_exit}); "
                f"not back within {wait_s:g} s (llm_engine_ready_wait_s)",
                retry_after_s=self.settings.llm_engine_restart_max_backoff_s,
            ) from None

    def check_responsive(self) -> None:
        """A 503 (Overloaded, with Retry-After) while the child is alive but not answering."""
        if self.state == "unresponsive":
            raise Overloaded(self._unresponsive_message(), retry_after_s=self._unresponsive_retry_after_s())

    def _unresponsive_message(self) -> str:
        silent_s = time.monotonic() - self.last_answer
        return (
            f"the llama-server engine for {self.label!r} has not answered its health checks for {silent_s:.0f} s; "
            f"it is restarted if it stays silent for {self.settings.llm_engine_hang_restart_s:g} s "
            "(llm_engine_hang_restart_s)"
        )

    def _unresponsive_retry_after_s(self) -> float:
        """Until the watchdog restarts it, and the restart's own pause."""
        s = self.settings
        left_s = s.llm_engine_hang_restart_s - (time.monotonic() - self.last_answer)
        return max(0.0, left_s) + s.llm_engine_probe_interval_s + s.llm_engine_restart_backoff_s

    @property
    def unanswered_s(self) -> float | None:
        """While unresponsive, how long the child has answered no health probe (/health)."""
        return time.monotonic() - self.last_answer if self.state == "unresponsive" else None

    def child(self) -> asyncio.Event:
        """The current child, as the token a request keeps: set once that child has exited."""
        return self._child_gone

    async def child_failed(self, child: asyncio.Event) -> bool:
        """Whether a request's failure was the child's (it has exited, or is unresponsive): the
        supervisor's own word, set once it saw the exit, however long that takes on a loaded
        machine. A child that still answers its health check failed that request on its own."""
        assert self._http is not None
        timeout_s = self.settings.llm_engine_probe_timeout_s
        while not child.is_set():
            if self.state == "unresponsive":
                return True
            if await self._probe(self._http, timeout_s) is not None:
                # An answer: this child is alive, unless it has exited meanwhile and the answer came
                # from its successor on the same port.
                return child.is_set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEALTH_POLL_S):
                    await child.wait()
        return True

    async def _probe(self, session: aiohttp.ClientSession, timeout_s: float) -> int | None:
        """The status of the child's ``/health``, or None without an answer within ``timeout_s``."""
        try:
            async with session.get(
                f"{self.base_url}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                return response.status
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def _watch(self) -> None:
        """Probe the running child's health; mark it unresponsive, healthy again, or kill a hung one."""
        s = self.settings
        failures = 0
        watched: asyncio.subprocess.Process | None = None
        while True:
            await asyncio.sleep(s.llm_engine_probe_interval_s)
            process = self._process
            if self.state not in ("ready", "unresponsive") or process is None or process.returncode is not None:
                continue
            if process is not watched:
                watched, failures = process, 0
            assert self._probe_http is not None
            status = await self._probe(self._probe_http, s.llm_engine_probe_timeout_s)
            if process is not self._process or self.state not in ("ready", "unresponsive"):
                continue  # it exited meanwhile: the supervisor's
            now = time.monotonic()
            if status == 200:
                failures = 0
                if self.state == "unresponsive":
                    log.warning(
                        "llama-server for %s answers again after %.1f s of silence: healthy",
                        self.label,
                        now - self.last_answer,
                    )
                    self.state = "ready"
                    self._ready.set()
                self.last_answer = now
                continue
            failures += 1
            silent_s = now - self.last_answer
            if self.state == "ready" and failures >= s.llm_engine_probe_failures:
                self.state = "unresponsive"
                self._ready.clear()
                log.error(
                    "llama-server for %s (pid %s) answered none of %d health probes (%g s each) for %.1f s: unhealthy; "
                    "LLM requests get a 503 until it answers, and it is restarted if silent for %g s "
                    "(llm_engine_hang_restart_s)",
                    self.label,
                    process.pid,
                    failures,
                    s.llm_engine_probe_timeout_s,
                    silent_s,
                    s.llm_engine_hang_restart_s,
                )
            if self.state == "unresponsive" and silent_s >= s.llm_engine_hang_restart_s:
                self._hang = (
                    f"answered no health check for {silent_s:.0f} s and was killed "
                    f"(llm_engine_hang_restart_s {s.llm_engine_hang_restart_s:g} s)"
                )
                log.error("llama-server for %s (pid %s) %s; restarting it", self.label, process.pid, self._hang)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()  # SIGKILL: a stopped process gets it too
                await process.wait()  # the supervisor restarts it

    async def slot_states(self) -> list[dict[str, Any]]:
        """llama-server's ``/slots``: per slot, ``is_processing``, ``n_decoded`` ... (tests, /health)."""
        assert self._http is not None
        async with self._http.get(f"{self.base_url}/slots") as response:
            response.raise_for_status()
            slots: list[dict[str, Any]] = await response.json()
            return slots

    async def post_json(self, path: str, body: dict[str, Any], timeout_s: float) -> Any:
        """POST ``body`` to llama-server's own API (``/completion``, ``/tokenize`` ...) on the current
        child, bounded by ``timeout_s``; ModelUnavailable when no healthy child is serving."""
        if self._http is None or not self.ready:
            raise ModelUnavailable(f"the llama-server engine of {self.label!r} is {self.state}")
        async with self._http.post(
            f"{self.base_url}{path}", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            response.raise_for_status()
            return await response.json()

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage], tools: ToolConfig | None = None) -> int:
        """The prompt's length in tokens, with the model's chat template (``/apply-template``, ``/tokenize``)."""
        assert self._http is not None
        async with self._http.post(f"{self.base_url}/apply-template", json=template_body(messages, tools)) as response:
            response.raise_for_status()
            prompt = (await response.json())["prompt"]
        async with self._http.post(f"{self.base_url}/tokenize", json={"content": prompt, "add_special": True}) as resp:
            resp.raise_for_status()
            return len((await resp.json())["tokens"])

    async def _kill(self) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        signal_name = "SIGKILL" if self.state == "unresponsive" else "SIGTERM"
        with contextlib.suppress(ProcessLookupError):
            if self.state == "unresponsive":
                process.kill()  # a stopped child would only take SIGTERM once it runs again
            else:
                process.terminate()
        timeout_s = self.settings.llm_engine_stop_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                await process.wait()
        except TimeoutError:
            engine_log.warning(
                "the llama-server engine of %r (pid %d, %s) did not exit within %g s of %s "
                "(llm_engine_stop_timeout_s): killed",
                self.label,
                process.pid,
                self.state,
                timeout_s,
                signal_name,
            )
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    async def aclose(self) -> None:
        self._closing = True
        self._ready.clear()
        for task in (self._watchdog, self._supervisor):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._kill()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._reader
        for session in (self._http, self._probe_http):
            if session is not None:
                await session.close()
        self.state = "stopped"
