"""The LLM service as the voice loop uses it: ``async for delta in llm.stream(messages, params)``.

Real SmolLM2 generations on the session's shared service and its llama-server engine. Cancellation
is checked on the engine itself (its slots, as its ``/slots`` reports them), not only on the consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import aiohttp
import pytest

from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter, Overloaded, UnknownModel
from mediaserver.llm.generation import LlmTimeout
from mediaserver.llm.prompt_size import PromptTooLong
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage, GenerationParams
from mediaserver.metrics import Metrics
from tests.faults import eventually
from tests.llm_engine import wait_busy, wait_idle, wait_stopped

STORY = [ChatMessage("user", "Tell me a long story about a cat who travels the world.")]
COLORS = [ChatMessage("user", "Name three colors.")]
# Greedy, without the bundled model's repeat penalty (it breaks the numbered list); DRY stays on.
GREEDY = GenerationParams(temperature=0.0, seed=3, max_tokens=40, repeat_penalty=1.0)


async def _stopped_early(llm: LlmService, busy: dict[str, Any], max_tokens: int) -> None:
    """The generation stopped in the engine long before ``max_tokens``, and every slot is free."""
    generated = await wait_stopped(llm, busy)
    assert generated < max_tokens // 2, generated
    await wait_idle(llm)


async def test_deltas_concatenate_to_the_answer_with_usage(llm_service: LlmService) -> None:
    async with llm_service.stream(COLORS, GREEDY) as answer:
        deltas = [delta async for delta in answer]
    assert "".join(deltas) == "1. Red\n2. Blue\n3. Green"
    assert answer.finish_reason == "stop"
    # llama-server counts the end-of-generation token too.
    assert answer.usage is not None and answer.usage.completion_tokens in (len(deltas), len(deltas) + 1)
    assert answer.time_to_first_token_s is not None and answer.time_to_first_token_s > 0
    completion = await llm_service.complete(COLORS, GREEDY)
    assert completion.text == "".join(deltas)


async def test_breaking_out_frees_the_engine_slot(llm_service: LlmService) -> None:
    await wait_idle(llm_service)
    params = GenerationParams(temperature=0.0, max_tokens=500)
    stream = llm_service.stream(STORY, params)
    async for _ in stream:
        (busy,) = await wait_busy(llm_service)
        break
    await stream.aclose()  # what ``async with`` does; breaking alone sets the cancel flag too
    await _stopped_early(llm_service, busy, 500)
    assert stream.finish_reason in (None, "cancelled")


async def test_cancelling_the_consumer_task_frees_the_engine_slot(llm_service: LlmService) -> None:
    await wait_idle(llm_service)
    received: list[str] = []
    started = asyncio.Event()

    async def consume() -> None:
        async for delta in llm_service.stream(STORY, GenerationParams(temperature=0.0, max_tokens=500)):
            received.append(delta)
            if len(received) == 5:
                started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 60)
    (busy,) = await wait_busy(llm_service)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _stopped_early(llm_service, busy, 500)
    assert len(received) < 500


async def test_dropping_the_stream_sets_its_cancel_flag(llm_service: LlmService) -> None:
    """A consumer that forgets the stream (no aclose) still stops the generation."""
    await wait_idle(llm_service)
    stream = llm_service.stream(STORY, GenerationParams(temperature=0.0, max_tokens=500))
    await anext(stream)
    (busy,) = await wait_busy(llm_service)
    cancel: threading.Event = stream._cancel
    del stream
    assert cancel.is_set()
    await _stopped_early(llm_service, busy, 500)


async def test_generation_runs_off_the_event_loop(llm_service: LlmService) -> None:
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            await asyncio.sleep(0)
            ticks += 1

    task = asyncio.create_task(ticker())
    answer = llm_service.stream(STORY, GenerationParams(temperature=0.0, max_tokens=30))
    text = await answer.text()
    stop.set()
    await task
    assert answer.usage is not None and answer.usage.completion_tokens == 30 and text
    # A blocked loop would tick about once per token; a free one spins many times per token.
    assert ticks > 20 * answer.usage.completion_tokens


async def test_stop_strings_split_across_tokens(llm_service: LlmService) -> None:
    params = GenerationParams(temperature=0.0, max_tokens=40, stop=("2. Bl",), repeat_penalty=1.0)
    assert (await llm_service.complete(COLORS, params)).text == "1. Red\n"


async def test_seeded_sampling_repeats_whatever_ran_before(llm_service: LlmService) -> None:
    params = GenerationParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=25)
    first = await llm_service.complete(STORY, params)
    # The same prompt again (now cached in llama.cpp's KV), and after another prompt.
    second = await llm_service.complete(STORY, params)
    await llm_service.complete(COLORS, GenerationParams(max_tokens=5))
    third = await llm_service.complete(STORY, params)
    assert first.text == second.text == third.text
    other_seed = await llm_service.complete(STORY, GenerationParams(temperature=0.9, seed=99, max_tokens=25))
    assert other_seed.text != first.text


async def test_limits_are_errors_before_any_work(llm_service: LlmService) -> None:
    with pytest.raises(InvalidParameter, match="at most 1024"):
        llm_service.stream(COLORS, GenerationParams(max_tokens=1025))
    with pytest.raises(InvalidParameter, match="at least 1"):
        llm_service.stream(COLORS, GenerationParams(max_tokens=0))
    with pytest.raises(InvalidParameter, match="at least one message"):
        llm_service.stream([], GREEDY)
    with pytest.raises(UnknownModel):
        llm_service.stream(COLORS, GREEDY, model="gpt-9-ultra")
    with pytest.raises(PromptTooLong) as caught:
        await llm_service.complete([ChatMessage("user", "lorem ipsum dolor " * 2000)], GREEDY)
    assert caught.value.status == 400


def queued_now(service: LlmService) -> int:
    """Generations waiting for a slot, over the service's models."""
    return sum(gate.waiting for gate in service._gates.values())


async def test_full_queue_is_overloaded_and_timeouts_are_504(base_settings: Settings, server_factory: Any) -> None:
    # An engine of its own, with one slot: a second generation waits for the first.
    settings = base_settings.model_copy(update={"llm_slots": 1, "llm_max_queue": 1, "llm_request_timeout_s": 3.0})
    service = LlmService(settings, Metrics())
    await service.start()
    try:
        params = GenerationParams(temperature=0.0, max_tokens=1000)
        running = service.stream(STORY, params)
        await anext(running)  # holds the model
        # The queued one's deadline starts a second later than the running one's: once the running
        # one times out, the queued one has that second to get its first token.
        await asyncio.sleep(1.0)
        waiting = service.stream(STORY, params)
        waiter = asyncio.create_task(anext(waiting))
        await eventually(lambda: queued_now(service) == 1, 10, 0.01)  # the second one is now in the queue
        with pytest.raises(Overloaded, match="llm_max_queue") as refused:
            await anext(service.stream(STORY, params))
        assert refused.value.retryable and refused.value.retry_after_s is None  # nothing measured yet
        with pytest.raises(LlmTimeout, match="llm_request_timeout_s"):
            async for _ in running:
                pass
        await running.aclose()
        assert isinstance(await waiter, str)  # the queued one runs once the model is free
        await waiting.aclose()
        # A generation that finishes is measured, and the next refusal's Retry-After comes from it.
        assert await service.stream(STORY, GenerationParams(temperature=0.0, max_tokens=8)).text()
        held = service.stream(STORY, GenerationParams(temperature=0.0, max_tokens=200))
        await anext(held)
        queued = service.stream(STORY, params)
        queued_first = asyncio.create_task(anext(queued))
        await eventually(lambda: queued_now(service) == 1, 10, 0.01)
        with pytest.raises(Overloaded) as refused:
            await anext(service.stream(STORY, params))
        assert refused.value.retry_after_s is not None and refused.value.retry_after_s > 0
        # Over HTTP: a 503 with the estimate as Retry-After.
        live = await server_factory(llm=service)
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi."}]}
        async with aiohttp.ClientSession() as session, session.post(f"{live.url}/v1/chat/completions", json=body) as r:
            assert r.status == 503 and int(r.headers["Retry-After"]) >= 1
            assert "llm_max_queue" in (await r.json())["error"]["message"]
        queued_first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await queued_first
        await held.aclose()
        await queued.aclose()
        metrics = service.metrics_registry.render().decode()
        assert 'outcome="rejected"' in metrics and 'outcome="timeout"' in metrics
    finally:
        await service.aclose()
