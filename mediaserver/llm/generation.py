"""One generation on the LLM service: the per-model gate (bounded queue and slots), the stream a
caller iterates, and the generator that holds a slot from the queue to the last token.

``LlmService.stream`` makes an ``LlmStream``; breaking out of its loop, cancelling the consuming
task, ``aclose()`` or dropping it stops the engine before its next token and frees the slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol

from mediaserver.config import Settings
from mediaserver.errors import ApiError, GatewayTimeout, Overloaded
from mediaserver.keep_alive import ModelKeeper
from mediaserver.llm.engine import LlmEngine
from mediaserver.llm.metrics import LlmMetrics
from mediaserver.llm.registry import LlmSource
from mediaserver.llm.tools import ToolCall, ToolCallAccumulator, ToolCallDelta
from mediaserver.llm.types import ChatRequest, Finished, FinishReason, Progress, TextDelta, Usage


class GenerationHost(Protocol):
    """What a generation needs of the service that runs it (``LlmService``)."""

    settings: Settings
    metrics: LlmMetrics
    keeper: ModelKeeper

    async def backend(self, source: LlmSource) -> LlmEngine: ...

    def gate(self, model: str, concurrency: int) -> Gate: ...


TOKEN_RATE_WINDOW_S = 10.0  # /health's and /metrics' tokens/s: all generations over this window


class LlmTimeout(GatewayTimeout):
    status = 504
    code = "timeout"


@dataclass
class Gate:
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


@dataclass
class _Outcome:
    """What a generation reports at its end; shared by the stream and its generator (which must
    not hold the stream itself, or a dropped stream would live on until the cycle collector runs)."""

    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    progress: Usage | None = None  # the tokens taken so far, as the engine reports them (``Progress``)

    @property
    def taken(self) -> Usage | None:
        """The usage once finished, else the tokens taken so far where the backend says (the
        llama-server engine): what a generation cancelled midway reports and is counted by."""
        return self.usage or self.progress

    time_to_first_token_s: float | None = None


class LlmStream:
    """The text deltas of one generation (an async iterator), then its usage and finish reason.

    With tools, ``events()`` also yields the ``ToolCallDelta`` pieces (iterating the stream itself
    skips them); either way ``tool_calls`` has the whole calls once the generation ended.
    """

    def __init__(self, service: GenerationHost, source: LlmSource, request: ChatRequest) -> None:
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
    def usage_so_far(self) -> Usage | None:
        """``usage``, or for a generation cancelled midway the tokens it took (``_Outcome.taken``)."""
        return self._outcome.taken

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
    service: GenerationHost, source: LlmSource, request: ChatRequest, cancel: threading.Event, outcome: _Outcome
) -> AsyncGenerator[str | ToolCallDelta, None]:
    """One generation, holding its model's use from before the engine is looked up to the end: an
    idle stop (``llm_keep_alive_s``) never takes the engine from under it, and a consumer that goes
    away (closing or dropping the stream) releases it."""
    with service.keeper.use(source.name):
        async with contextlib.aclosing(_generate_on(service, source, request, cancel, outcome)) as events:
            async for event in events:
                yield event


async def _generate_on(
    service: GenerationHost, source: LlmSource, request: ChatRequest, cancel: threading.Event, outcome: _Outcome
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
                elif isinstance(event, Progress):
                    outcome.progress = event.usage
                elif isinstance(event, Finished):
                    outcome.finish_reason = event.finish_reason
                    outcome.usage = event.usage
        finally:
            await events.aclose()
        result = "cancelled" if outcome.finish_reason == "cancelled" else "ok"
        if result == "ok":
            gate.observe(time.monotonic() - started)
        usage = outcome.usage
        if usage is not None and result == "ok" and first_at is not None and usage.completion_tokens > 1:
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
        # Tokens taken, however it ended: a generation cancelled midway counts what it took so far
        # (the engine's per-token count), as its usage says, whichever way it was cancelled.
        taken = outcome.taken
        if taken is not None:
            metrics.prompt_tokens.labels(model).inc(taken.prompt_tokens)
            if taken.cached_tokens:
                metrics.cached_prompt_tokens.labels(model).inc(taken.cached_tokens)
            metrics.completion_tokens.labels(model).inc(taken.completion_tokens)
