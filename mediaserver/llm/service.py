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
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from mediaserver.config import Settings
from mediaserver.devices import DeviceChoice
from mediaserver.errors import ApiError, InvalidParameter, ModelUnavailable
from mediaserver.keep_alive import ModelKeeper, return_freed_memory
from mediaserver.llm.defaults import defaults_for
from mediaserver.llm.embedder import LlamaServerEmbedder
from mediaserver.llm.embeddings import EmbeddingBatcher, Vector
from mediaserver.llm.engine import LlamaServerEngine, LlmEngine
from mediaserver.llm.engine_binary import binary_problem, build_progress, find_binary, wait_for_build
from mediaserver.llm.engine_process import LlamaServerProcess
from mediaserver.llm.generation import TOKEN_RATE_WINDOW_S, Gate, LlmStream
from mediaserver.llm.metrics import LlmMetrics
from mediaserver.llm.prompt_size import PromptTokens, estimate_tokens, prompt_bytes
from mediaserver.llm.registry import LlmRegistry, LlmSource, scores_turn_text
from mediaserver.llm.tools import ToolConfig
from mediaserver.llm.types import (
    ChatMessage,
    ChatRequest,
    FinishReason,
    GenerationParams,
    ModelInfo,
    Usage,
)
from mediaserver.metrics import Metrics

log = logging.getLogger(__name__)


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
        self._gates: dict[str, Gate] = {}
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
                    for name, chat in await upstream.list_models():
                        self.sources.add_upstream_model(name, chat=chat)
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
        # The engines' children stop together: each may take llm_engine_stop_timeout_s to be killed.
        closing = [*(embedder.aclose() for embedder in self._embedders.values())]
        closing += [backend.aclose() for backend in self._backends.values()]
        failures = [r for r in await asyncio.gather(*closing, return_exceptions=True) if isinstance(r, BaseException)]
        if failures:
            raise failures[0]
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

    def gate(self, model: str, concurrency: int) -> Gate:
        gate = self._gates.get(model)
        if gate is None:
            gate = self._gates[model] = Gate(asyncio.Semaphore(concurrency), concurrency)
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
                entry["engine"] = _engine_status(process)
        for name, embedder in self._embedders.items():
            # The embedding engine (its own llama-server child), beside the model's chat engine, if any.
            models.setdefault(name, {})["embedding_engine"] = _engine_status(embedder.process)
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
                            source,
                            self.settings,
                            self.device,
                            on_restart=restarts.inc,
                            # the turn text scorer asks the default model (turns/text_eou.py)
                            scoring_slot=source.name == self.sources.default_name
                            and scores_turn_text(self.settings, source.name),
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
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
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
            frequency_penalty=resolved.frequency_penalty,
            presence_penalty=resolved.presence_penalty,
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

    async def prefill(
        self,
        messages: Sequence[ChatMessage],
        tools: ToolConfig | None = None,
        *,
        model: str | None = None,
        question: bool = False,
    ) -> int:
        """Evaluate a conversation's start (its system prompt) ahead of its first turn, into the slot
        that turn will take, on ``model``'s local engine if it is already running (nothing else:
        an upstream, an engine not started). ``question``: a question still being spoken (its
        conversation's own slot only: ``LlamaServerEngine.prefill``). The prompt tokens evaluated;
        failures are logged, not raised (the turn then evaluates them itself)."""
        try:
            source = self.sources.resolve(model)
            engine = self._backends.get(source.name)
            if not isinstance(engine, LlamaServerEngine):
                return 0
            evaluated = await engine.prefill(messages, tools, question=question)
            self.metrics.prefills.labels(source.name).inc()
            return evaluated
        except (ApiError, aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            log.debug("no prefill of %s: %s", model or "the default model", exc)
            return 0

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
                    restarts = self.metrics.engine_restarts.labels(f"{source.name} (embeddings)")
                    embedder = await LlamaServerEmbedder.start(source, self.settings, self.device, restarts.inc)
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


def _engine_status(process: LlamaServerProcess) -> dict[str, Any]:
    """A llama-server child as /health shows it: its state, pid, restarts, why it last ended, and
    how long it has been silent while it does not answer."""
    status: dict[str, Any] = {
        "kind": "llama-server",
        "state": process.state,
        "healthy": process.state == "ready",
        "pid": process.pid,
        "restarts": process.restarts,
        "last_exit": process.last_exit,
    }
    if process.unanswered_s is not None:  # unresponsive: how long it has been silent
        status["unanswered_s"] = round(process.unanswered_s, 1)
    return status
