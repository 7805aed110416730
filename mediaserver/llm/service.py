"""The app-wide LLM service: models by name, a bounded queue per model, limits, metrics, cancellation.

Created once per app (aiohttp cleanup_ctx) and shared by every transport and, next, the voice loop:

    async with llm.stream(messages, GenerationParams(max_tokens=200)) as answer:
        async for delta in answer:          # text deltas, in order
            ...
    answer.usage, answer.finish_reason      # once the loop has ended

Breaking out of the loop, cancelling the consuming task, ``aclose()`` or dropping the stream stops
the engine before its next token (its HTTP stream is closed). The service keeps no conversation:
the caller owns the history and sends it with every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp

from mediaserver.config import Settings
from mediaserver.devices import DeviceChoice
from mediaserver.errors import ApiError, GatewayTimeout, InvalidParameter, ModelUnavailable, Overloaded
from mediaserver.keep_alive import ModelKeeper, return_freed_memory
from mediaserver.llm.defaults import defaults_for
from mediaserver.llm.embedder import LlamaServerEmbedder
from mediaserver.llm.embeddings import EmbeddingBatcher, Vector
from mediaserver.llm.engine import LlamaServerEngine, LlmEngine
from mediaserver.llm.engine_binary import binary_problem, build_progress, find_binary, wait_for_build
from mediaserver.llm.engine_process import LlamaServerProcess
from mediaserver.llm.metrics import LlmMetrics
from mediaserver.llm.prompt_size import PromptTokens, estimate_tokens, prompt_bytes
from mediaserver.llm.registry import LlmRegistry, LlmSource
from mediaserver.llm.tools import ToolCall, ToolCallAccumulator, ToolCallDelta, ToolConfig
from mediaserver.llm.types import (
    ChatMessage,
    ChatRequest,
    Finished,
    FinishReason,
    GenerationParams,
    ModelInfo,
    TextDelta,
    Usage,
)
from mediaserver.metrics import Metrics

log = logging.getLogger(__name__)

TOKEN_RATE_WINDOW_S = 10.0  # /health's and /metrics' tokens/s: all generations over this window


class LlmTimeout(GatewayTimeout):
    status = 504
    code = "timeout"


@dataclass
class _Gate:
    """The bounded queue of one model: ``slots`` generations run, at most ``max_queue`` wait."""

    slots: asyncio.Semaphore
    concurrency: int = 1
    waiting: int = 0
    busy: int = 0
    generation_s: float | None = None  # smoothed time of a finished generation
    recent_tokens: deque[float] = field(default_factory=deque)  # when each recent text delta came

    def count_token(self, now: float, window_s: float) -> float:
        """Note a generated token; the tokens/s of all generations over the last ``window_s``."""
        self.recent_tokens.append(now)
        return self.tokens_per_second(now, window_s)

    def tokens_per_second(self, now: float, window_s: float) -> float:
        while self.recent_tokens and self.recent_tokens[0] < now - window_s:
            self.recent_tokens.popleft()
        return len(self.recent_tokens) / window_s

    def observe(self, seconds: float) -> None:
        self.generation_s = seconds if self.generation_s is None else 0.8 * self.generation_s + 0.2 * seconds

    def drain_estimate_s(self) -> float | None:
        """How long the generations waiting now take (None before one finished): ``Retry-After``."""
        if self.generation_s is None:
            return None
        return max(1, self.waiting) / self.concurrency * self.generation_s


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: FinishReason
    usage: Usage | None
    model: str


@dataclass(frozen=True)
class Embeddings:
    vectors: list[Vector]
    prompt_tokens: int
    model: str


@dataclass
class _Outcome:
    """What a generation reports at its end; shared by the stream and its generator (which must
    not hold the stream itself, or a dropped stream would live on until the cycle collector runs)."""

    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    time_to_first_token_s: float | None = None


class LlmStream:
    """The text deltas of one generation (an async iterator), then its usage and finish reason.

    With tools, ``events()`` also yields the ``ToolCallDelta`` pieces (iterating the stream itself
    skips them); either way ``tool_calls`` has the whole calls once the generation ended.
    """

    def __init__(self, service: LlmService, source: LlmSource, request: ChatRequest) -> None:
        self.model = source.name
        self._cancel = threading.Event()
        self._outcome = _Outcome()
        self._calls = ToolCallAccumulator()
        self._gen = _generate(service, source, request, self._cancel, self._outcome)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self._calls.calls()

    async def events(self) -> AsyncGenerator[str | ToolCallDelta, None]:
        """Text deltas and tool-call pieces, in order (pieces cleaned of repeated ids and names)."""
        while True:
            try:
                item = await self._next()
            except StopAsyncIteration:
                return
            yield self._calls.clean(item) if isinstance(item, ToolCallDelta) else item

    @property
    def finish_reason(self) -> FinishReason | None:
        return self._outcome.finish_reason

    @property
    def usage(self) -> Usage | None:
        return self._outcome.usage

    @property
    def time_to_first_token_s(self) -> float | None:
        return self._outcome.time_to_first_token_s

    def __aiter__(self) -> LlmStream:
        return self

    async def __anext__(self) -> str:
        while True:
            item = await self._next()
            if isinstance(item, str):
                return item
            self._calls.add(item)

    async def _next(self) -> str | ToolCallDelta:
        try:
            return await self._gen.__anext__()
        except BaseException:  # the end, an error, or the consumer cancelled: the worker stops
            self._cancel.set()
            raise

    def cancel(self) -> None:
        """Stop the generation before its next token (thread-safe, idempotent)."""
        self._cancel.set()

    async def aclose(self) -> None:
        self._cancel.set()
        await self._gen.aclose()

    async def __aenter__(self) -> LlmStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # Dropped without aclose(): stop the worker now; the generator's own finalizer (asyncio's
        # async-generator hook) then frees the model's slot.
        self._cancel.set()

    async def text(self) -> str:
        """Collect the whole answer."""
        return "".join([delta async for delta in self])


async def _generate(
    service: LlmService, source: LlmSource, request: ChatRequest, cancel: threading.Event, outcome: _Outcome
) -> AsyncGenerator[str | ToolCallDelta, None]:
    """One generation, holding its model's use from before the engine is looked up to the end: an
    idle stop (``llm_keep_alive_s``) never takes the engine from under it, and a consumer that goes
    away (closing or dropping the stream) releases it."""
    with service.keeper.use(source.name):
        async with contextlib.aclosing(_generate_on(service, source, request, cancel, outcome)) as events:
            async for event in events:
                yield event


async def _generate_on(
    service: LlmService, source: LlmSource, request: ChatRequest, cancel: threading.Event, outcome: _Outcome
) -> AsyncGenerator[str | ToolCallDelta, None]:
    metrics = service.metrics
    model = source.name
    timeout_s = service.settings.llm_request_timeout_s
    # The deadline covers the queue and the generation. It wraps each wait below, never a yield:
    # a timeout scope left open across a yield would cancel whatever the consumer does meanwhile.
    deadline = asyncio.get_running_loop().time() + timeout_s
    backend = await service.backend(source)
    gate = service.gate(model, backend.max_concurrency)
    try:
        backend.check_available()
    except ApiError:
        metrics.requests.labels(model, backend.kind, "rejected").inc()
        raise
    if gate.waiting >= service.settings.llm_max_queue:
        metrics.requests.labels(model, backend.kind, "rejected").inc()
        raise Overloaded(
            f"the LLM queue for {model!r} is full ({gate.waiting} waiting, llm_max_queue); retry later",
            retry_after_s=gate.drain_estimate_s(),
        )
    queued_at = time.monotonic()
    gate.waiting += 1
    metrics.queue_depth.labels(model).inc()
    try:
        async with asyncio.timeout_at(deadline):
            await gate.slots.acquire()
    except TimeoutError:
        metrics.requests.labels(model, backend.kind, "timeout").inc()
        raise LlmTimeout(f"the LLM queue did not free up within {timeout_s:g} s (llm_request_timeout_s)") from None
    finally:
        gate.waiting -= 1
        metrics.queue_depth.labels(model).dec()
    result = "error"
    gate.busy += 1
    metrics.slots_busy.labels(model).inc()
    try:
        started = time.monotonic()
        metrics.queue_wait.labels(model).observe(started - queued_at)
        first_at: float | None = None
        events = backend.stream(request, cancel, service.settings.llm_max_prompt_tokens)
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        event = await anext(events)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    result = "timeout"
                    raise LlmTimeout(f"the LLM did not finish within {timeout_s:g} s (llm_request_timeout_s)") from None
                if isinstance(event, TextDelta | ToolCallDelta):
                    if isinstance(event, TextDelta):
                        now = time.monotonic()
                        metrics.recent_tokens_per_second.labels(model).set(gate.count_token(now, TOKEN_RATE_WINDOW_S))
                    if first_at is None:
                        first_at = time.monotonic()
                        outcome.time_to_first_token_s = first_at - started
                        metrics.time_to_first_token.labels(model).observe(first_at - started)
                    yield event.text if isinstance(event, TextDelta) else event
                elif isinstance(event, Finished):
                    outcome.finish_reason = event.finish_reason
                    outcome.usage = event.usage
        finally:
            await events.aclose()
        result = "cancelled" if outcome.finish_reason == "cancelled" else "ok"
        if result == "ok":
            gate.observe(time.monotonic() - started)
        usage = outcome.usage
        if usage is not None:
            metrics.prompt_tokens.labels(model).inc(usage.prompt_tokens)
            if usage.cached_tokens:
                metrics.cached_prompt_tokens.labels(model).inc(usage.cached_tokens)
            metrics.completion_tokens.labels(model).inc(usage.completion_tokens)
            if first_at is not None and usage.completion_tokens > 1:
                elapsed = time.monotonic() - first_at
                if elapsed > 0:
                    metrics.tokens_per_second.labels(model).observe((usage.completion_tokens - 1) / elapsed)
    except (GeneratorExit, asyncio.CancelledError):
        result = "cancelled"
        raise
    except BaseException:
        if result != "timeout":
            result = "error"
        raise
    finally:
        gate.busy -= 1
        metrics.slots_busy.labels(model).dec()
        gate.slots.release()
        metrics.requests.labels(model, backend.kind, result).inc()


@dataclass
class LlmService:
    """One per app. ``device`` decides GPU offload for llama.cpp (CPU when None)."""

    settings: Settings
    metrics_registry: Metrics
    device: DeviceChoice | None = None
    registry: LlmRegistry = field(init=False)
    metrics: LlmMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.sources = LlmRegistry(self.settings)
        self.metrics = LlmMetrics.of(self.metrics_registry)
        self._backends: dict[str, LlmEngine] = {}
        self._upstream: LlmEngine | None = None
        self._gates: dict[str, _Gate] = {}
        self._load_lock = asyncio.Lock()
        self._batchers: dict[str, EmbeddingBatcher] = {}
        self._embedders: dict[str, LlamaServerEmbedder] = {}
        self._closed = False
        # Idle stop of local engines (llm_keep_alive_s): the llama-server child of a model unused
        # that long is stopped (its memory returned); the next request starts it again.
        self.keeper = ModelKeeper("llm", self.settings.llm_keep_alive_s, self.metrics_registry, self._unload_idle)
        # The embedding model's llama-server child idles out the same way.
        self.embedding_keeper = ModelKeeper(
            "embedding", self.settings.llm_keep_alive_s, self.metrics_registry, self._unload_embedder
        )
        # Why start() could not make the LLM usable (the app turns the feature off with it).
        self.start_problem: str | None = None
        self._build_watch: asyncio.Task[None] | None = None  # waits for make run's llama-server build

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Ask the upstream for its models (when configured and not listed) and preload the default."""
        if self.settings.llm_upstream_url:
            from mediaserver.llm.upstream import UpstreamChat

            upstream = UpstreamChat.from_settings(self.settings)
            self._upstream = upstream
            if not self.settings.llm_upstream_models:
                try:
                    for name in await upstream.list_models():
                        self.sources.add_upstream_model(name)
                except ApiError as exc:
                    self.start_problem = (
                        f"the upstream's models could not be listed ({exc.message}); set llm_upstream_models"
                    )
                    log.warning("%s", self.start_problem)
                self.sources.refresh_default()
                if self.sources.default_name is None and self.start_problem is None:
                    self.start_problem = "the upstream lists no models; set llm_upstream_models or llm_model"
        default = self.sources.default_name
        if build_progress(self.settings) is not None:
            # `make run` on a fresh machine: llama-server is still compiling. Everything else serves
            # meanwhile; the engine starts (preloaded or not) once the binary is there.
            log.warning("LLM: %s", binary_problem(self.settings))
            self._build_watch = asyncio.get_running_loop().create_task(self._start_when_built(), name="llm-build")
            return
        if self.settings.llm_preload and default and self.sources.location_problem(default) is None:
            await self.backend(self.sources.source(default))

    async def _start_when_built(self) -> None:
        """Wait for the build; once the binary is there, preload the default model."""
        failed = await wait_for_build(self.settings)
        if failed is not None:  # requests say why (binary_problem)
            log.error("LLM: %s", failed.describe())
            return
        default = self.sources.default_name
        log.info("LLM: llama-server is built (%s)", find_binary(self.settings))
        if self.settings.llm_preload and default and self.sources.location_problem(default) is None:
            with contextlib.suppress(ApiError):  # a 503 with the reason for requests; they try again
                await self.backend(self.sources.source(default))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._build_watch is not None:
            self._build_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._build_watch
        await self.keeper.aclose()
        await self.embedding_keeper.aclose()
        for batcher in self._batchers.values():
            await batcher.aclose()
        for embedder in self._embedders.values():
            await embedder.aclose()
        for backend in self._backends.values():
            await backend.aclose()
        if self._upstream is not None:
            await self._upstream.aclose()

    # --- models ----------------------------------------------------------------------------------
    def models(self) -> list[ModelInfo]:
        return self.sources.models()

    @property
    def loaded_models(self) -> list[str]:
        return list(self._backends)

    def running_engine(self, name: str) -> LlamaServerProcess | None:
        """The llama-server child serving ``name`` if its engine was started (None: not started, or
        an upstream model); it may be restarting (``ready``)."""
        engine = self._backends.get(name)
        return engine.process if isinstance(engine, LlamaServerEngine) else None

    def gate(self, model: str, concurrency: int) -> _Gate:
        gate = self._gates.get(model)
        if gate is None:
            gate = self._gates[model] = _Gate(asyncio.Semaphore(concurrency), concurrency)
            self.metrics.slots.labels(model).set(concurrency)
        return gate

    async def status(self) -> dict[str, Any]:
        """Per model: its engine (state, whether it is healthy, restarts, why it last ended), the
        queue, and tokens/s over the last ``TOKEN_RATE_WINDOW_S`` (``/health``)."""
        now = time.monotonic()
        models: dict[str, Any] = {}
        for name, gate in self._gates.items():
            models[name] = {
                "slots": gate.concurrency,
                "slots_busy": gate.busy,
                "queue": gate.waiting,
                "tokens_per_second": round(gate.tokens_per_second(now, TOKEN_RATE_WINDOW_S), 1),
            }
        for name, engine in self._backends.items():
            if isinstance(engine, LlamaServerEngine):
                process = engine.process
                entry = models.setdefault(name, {"slots": process.slots})
                entry["engine"] = {
                    "kind": "llama-server",
                    "state": process.state,
                    "healthy": process.state == "ready",
                    "pid": process.pid,
                    "restarts": process.restarts,
                    "last_exit": process.last_exit,
                }
                unanswered_s = process.unanswered_s
                if unanswered_s is not None:  # unresponsive: how long it has been silent
                    entry["engine"]["unanswered_s"] = round(unanswered_s, 1)
        for name, kept in self.keeper.status().items():
            entry = models.setdefault(name, {})
            if name not in self._backends and "engine" not in entry:
                # Stopped on purpose (idle past llm_keep_alive_s), or its start failed: the next
                # request starts it (again). Idle is healthy; a failed start is not (the server is
                # degraded until a start succeeds), and last_error says why.
                failed = "last_error" in kept
                entry["engine"] = {
                    "kind": "llama-server",
                    "state": "failed" if failed else "unloaded",
                    "healthy": not failed,
                    "pid": None,
                }
            entry["loaded"] = kept["loaded"]
            entry["load_seconds"] = kept["load_seconds"]
            entry["loads"] = kept["loads"]
            entry["unloads"] = kept["unloads"]
            entry["idle_s"] = kept["idle_s"]
            entry["keep_alive_s"] = kept["keep_alive_s"]
            if "last_error" in kept:
                entry["last_error"] = kept["last_error"]
        progress = build_progress(self.settings)
        if progress is not None:  # make run's llama-server build: under way (or failed)
            default = self.sources.default_name
            if default is not None and default not in self._backends:
                entry = models.setdefault(default, {})
                state = "building" if progress.building else "failed"
                entry["engine"] = {"kind": "llama-server", "state": state, "healthy": False, "pid": None}
                entry["engine"]["build"] = progress.as_dict()
        return {"default": self.sources.default_name, "models": models}

    async def _unload_idle(self, name: str) -> bool:
        """The keeper's idle stop: under the load lock, and only with no generation running or
        waiting (a request that arrived meanwhile holds a use: the engine stays)."""
        async with self._load_lock:
            engine = self._backends.get(name)
            if engine is None or self._closed or self.keeper.in_use(name):
                return False
            gate = self._gates.get(name)
            if gate is not None and (gate.busy or gate.waiting):
                return False
            del self._backends[name]
            # A deliberate stop, not a fault: aclose() tells the supervisor not to restart it.
            await engine.aclose()
            self.keeper.unloaded(name, "idle")
            return True

    async def backend(self, source: LlmSource) -> LlmEngine:
        if source.backend == "upstream":
            if self._upstream is None:
                raise ModelUnavailable("no llm_upstream_url is configured")
            return self._upstream
        loaded = self._backends.get(source.name)
        if loaded is not None:
            return loaded
        async with self._load_lock:
            loaded = self._backends.get(source.name)
            if loaded is None:
                if self._closed:
                    raise ModelUnavailable("the LLM service is shutting down")
                log.info("starting the LLM engine of %s (%s)", source.name, source.location)
                started = time.monotonic()
                restarts = self.metrics.engine_restarts.labels(source.name)
                try:
                    problem = self.sources.location_problem(source.name)  # asked each time: a file may come back
                    if problem:
                        raise ModelUnavailable(problem)
                    try:
                        loaded = await LlamaServerEngine.start(
                            source, self.settings, self.device, on_restart=restarts.inc
                        )
                    except ApiError:
                        raise
                    except Exception as exc:  # the binary cannot run, a hub id that does not resolve ...
                        raise ModelUnavailable(f"LLM {source.name!r} cannot be used: {exc}") from exc
                except ApiError as exc:  # a 503 with the reason; the next request tries again
                    self.keeper.load_failed(source.name, exc.message)
                    raise
                log.info("LLM %s serving in %.1f s", source.name, time.monotonic() - started)
                self._backends[source.name] = loaded
                self.keeper.loaded(source.name, time.monotonic() - started)
                self.gate(source.name, loaded.max_concurrency)  # /health and /metrics show its slots from now
            return loaded

    # --- chat ------------------------------------------------------------------------------------
    def resolve(self, params: GenerationParams, model: str) -> GenerationParams:
        """``params`` with what the request left out filled in (``llm_default_max_tokens``, the
        model's sampling defaults) and the limits checked (400 past the cap)."""
        cap = self.settings.llm_max_completion_tokens
        default = min(self.settings.llm_default_max_tokens, cap)
        max_tokens = params.max_tokens if params.max_tokens is not None else default
        if max_tokens <= 0:
            raise InvalidParameter(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
        if max_tokens > cap:
            raise InvalidParameter(
                f"max_tokens is {max_tokens}; this server allows at most {cap} (llm_max_completion_tokens)",
                param="max_tokens",
            )
        defaults = defaults_for(model, self.settings)
        return GenerationParams(
            max_tokens=max_tokens,
            temperature=defaults.temperature if params.temperature is None else params.temperature,
            top_p=defaults.top_p if params.top_p is None else params.top_p,
            stop=params.stop,
            seed=params.seed,
            repeat_penalty=defaults.repeat_penalty if params.repeat_penalty is None else params.repeat_penalty,
        )

    def stream(
        self, messages: Sequence[ChatMessage], params: GenerationParams | None = None, *, model: str | None = None
    ) -> LlmStream:
        """Start a generation (it runs as the stream is iterated). Bad input raises here, at once."""
        params = params or GenerationParams()
        if not messages:
            raise InvalidParameter("messages must contain at least one message", param="messages")
        source = self.sources.resolve(model)
        resolved = self.resolve(params, source.name)
        assert resolved.max_tokens is not None and resolved.temperature is not None and resolved.top_p is not None
        request = ChatRequest(
            model=source.location if source.backend == "upstream" else source.name,
            messages=tuple(messages),
            max_tokens=resolved.max_tokens,
            temperature=resolved.temperature,
            top_p=resolved.top_p,
            stop=resolved.stop,
            seed=resolved.seed,
            repeat_penalty=resolved.repeat_penalty,
            dry_multiplier=defaults_for(source.name, self.settings).dry_multiplier,
            tools=params.tools,
        )
        return LlmStream(self, source, request)

    async def prompt_tokens(
        self, messages: Sequence[ChatMessage], tools: ToolConfig | None, *, model: str | None = None
    ) -> PromptTokens:
        """How long ``messages`` with ``tools`` are for ``model``, and the most it takes.

        The local engine's limit is the one it enforces (``llm_max_prompt_tokens``, below the
        context window); a prompt under its byte bound is not counted further, a longer one is
        counted by llama-server's own chat template and tokenizer (``/apply-template``,
        ``/tokenize``), or, when the engine cannot answer, given as the bound. An upstream's is
        estimated at ``llm_upstream_bytes_per_token`` against ``llm_max_prompt_tokens``. Raises what
        ``stream`` would for an unknown or unavailable model."""
        settings = self.settings
        source = self.sources.resolve(model)
        if source.backend == "upstream":
            estimate = estimate_tokens(messages, tools, settings.llm_upstream_bytes_per_token)
            return PromptTokens(estimate, settings.llm_max_prompt_tokens)
        limit = min(settings.llm_max_prompt_tokens, settings.llm_context_tokens - 1)
        bound = prompt_bytes(messages, tools)
        if bound <= limit:
            return PromptTokens(bound, limit)
        with self.keeper.use(source.name):
            engine = await self.backend(source)
            if isinstance(engine, LlamaServerEngine):
                try:
                    await engine.process.wait_ready()
                    return PromptTokens(await engine.process.count_prompt_tokens(messages, tools), limit, exact=True)
                except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                    log.info("the prompt of %s could not be counted (%s); using its byte bound", source.name, exc)
        return PromptTokens(bound, limit)

    async def complete(
        self, messages: Sequence[ChatMessage], params: GenerationParams | None = None, *, model: str | None = None
    ) -> Completion:
        async with self.stream(messages, params, model=model) as answer:
            text = await answer.text()
        return Completion(text, answer.finish_reason or "stop", answer.usage, answer.model)

    # --- embeddings ------------------------------------------------------------------------------
    async def _batcher(self, source: LlmSource) -> tuple[EmbeddingBatcher, LlamaServerEmbedder]:
        batcher = self._batchers.get(source.name)
        if batcher is not None:
            return batcher, self._embedders[source.name]
        async with self._load_lock:
            batcher = self._batchers.get(source.name)
            if batcher is None:
                problem = self.sources.location_problem(source.name, embedding=True)
                if problem:
                    raise ModelUnavailable(problem)
                if self._closed:
                    raise ModelUnavailable("the LLM service is shutting down")
                started = time.monotonic()
                try:
                    embedder = await LlamaServerEmbedder.start(source, self.settings, self.device)
                except ApiError as exc:  # a 503 with the reason; the next request tries again
                    self.embedding_keeper.load_failed(source.name, exc.message)
                    raise
                s = self.settings
                batcher = EmbeddingBatcher(
                    source.name,
                    embedder.embed,
                    window_ms=s.llm_embedding_batch_window_ms,
                    max_batch=s.llm_embedding_max_batch,
                    max_pending=s.llm_embedding_max_batch * s.llm_max_queue,
                    cache_entries=s.llm_embedding_cache_entries,
                    metrics=self.metrics,
                )
                self._embedders[source.name] = embedder
                self._batchers[source.name] = batcher
                self.embedding_keeper.loaded(source.name, time.monotonic() - started)
            return batcher, self._embedders[source.name]

    async def _unload_embedder(self, name: str) -> bool:
        """The embedding keeper's idle unload: under the load lock, with no request using it."""
        async with self._load_lock:
            batcher = self._batchers.get(name)
            if batcher is None or self._closed or self.embedding_keeper.in_use(name):
                return False
            del self._batchers[name]
            embedder = self._embedders.pop(name)
            await batcher.aclose()
            await embedder.aclose()
            await asyncio.to_thread(return_freed_memory)
            self.embedding_keeper.unloaded(name, "idle")
            return True

    async def embed(self, texts: Sequence[str], *, model: str | None = None) -> Embeddings:
        if not texts:
            raise InvalidParameter("input must not be empty", param="input")
        limit = self.settings.llm_embedding_max_inputs
        if len(texts) > limit:
            raise InvalidParameter(
                f"input has {len(texts)} items; at most {limit} per request (llm_embedding_max_inputs)",
                param="input",
            )
        source = self.sources.resolve(model, embedding=True)
        with self.embedding_keeper.use(source.name):
            return await self._embed(texts, source)

    async def _embed(self, texts: Sequence[str], source: LlmSource) -> Embeddings:
        batcher, embedder = await self._batcher(source)
        counts = await embedder.count_tokens(list(texts))
        max_tokens = self.settings.llm_embedding_max_input_tokens
        for index, (text, count) in enumerate(zip(texts, counts, strict=True)):
            if not text:
                raise InvalidParameter(f"input[{index}] is empty", param="input")
            if count > max_tokens:
                raise InvalidParameter(
                    f"input[{index}] is {count} tokens; at most {max_tokens} (llm_embedding_max_input_tokens)",
                    param="input",
                )
        vectors = await batcher.embed(list(texts))
        return Embeddings(vectors, sum(counts), source.name)

    def embedding_dimensions(self, name: str) -> int | None:
        embedder = self._embedders.get(name)
        return int(getattr(embedder, "dimensions", 0)) or None
