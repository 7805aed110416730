"""The llama-server engine: continuous batching, its prompt cache, and its faults, on the real engine.

Every test here uses the session's one engine (the ``llm_service`` fixture) but the last, whose
model cannot start. Slot states come from llama-server's own ``/slots``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from mediaserver.app import create_app
from mediaserver.assistant.turn_types import AssistantOptions
from mediaserver.assistant.turns import Assistant
from mediaserver.config import Settings
from mediaserver.errors import ApiError
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage, GenerationParams
from mediaserver.metrics import Metrics
from tests.llm_engine import engine, wait_busy, wait_idle

STORY = [{"role": "user", "content": "Tell me a long story about a cat who travels the world."}]


async def _stream_chat(url: str, index: int, max_tokens: int, started: asyncio.Event) -> dict[str, Any]:
    """One streamed chat over HTTP: when its first token and its end came (monotonic)."""
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": f"Story {index}: tell me a long story about a lighthouse."}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    first: float | None = None
    tokens = 0
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    tokens += 1
                    first = first or time.monotonic()
                    started.set()
    return {"first": first, "end": time.monotonic(), "tokens": tokens}


async def test_four_streams_progress_at_once(server: Any, llm_service: LlmService) -> None:
    """Four chats at once on four slots: all have their first token before any has finished, and
    /health and /metrics show the four slots busy meanwhile. Other connections to the engine kept
    alive meanwhile (as the watchdog's probe and the readers of /slots keep theirs) do not make the
    four wait for one another: llama-server serves a kept-alive connection on one of its HTTP
    threads, and with too few of them the four ran one after another (CI, twice)."""
    await wait_idle(llm_service)
    process = await engine(llm_service)
    stop = asyncio.Event()
    pinned = await _pin(process.base_url, PINNED_CONNECTIONS, stop)
    try:
        await _four_streams_progress_at_once(server, llm_service)
    finally:
        stop.set()
        await asyncio.gather(*pinned)


PINNED_CONNECTIONS = 2


async def test_a_burst_straight_to_the_engine_starts_together_beside_kept_alive_connections(
    llm_service: LlmService,
) -> None:
    """Four streams opened at the same instant on the engine itself, while 0 to 3 other connections
    are kept alive: all four get their first token before any ends. llama-server starts a thread
    for a new connection only when none is idle at that moment, so with as many HTTP threads as
    slots a burst larger than the idle ones waited for streams to end (first tokens 0.25 / 1.26 /
    2.25 / 3.27 s: one after another); which count of kept-alive connections leaves too few idle
    depends on the engine's own (the watchdog's probe, the /slots reads), hence all of them."""
    process = await engine(llm_service)

    async def one(index: int, began: float) -> tuple[float, float]:
        body = {
            "messages": [{"role": "user", "content": f"Story {index}: a long story."}],
            "max_tokens": 40,
            "stream": True,
        }
        first: float | None = None
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{process.base_url}/v1/chat/completions", json=body) as resp,
        ):
            async for line in resp.content:
                if first is None and line.startswith(b"data: {"):
                    first = time.monotonic() - began
        assert first is not None
        return first, time.monotonic() - began

    for kept in range(4):
        await wait_idle(llm_service)
        stop = asyncio.Event()
        pinned = await _pin(process.base_url, kept, stop)
        try:
            began = time.monotonic()
            results = await asyncio.gather(*(one(i, began) for i in range(4)))
        finally:
            stop.set()
            await asyncio.gather(*pinned)
        assert max(first for first, _ in results) < min(end for _, end in results), (kept, results)


async def _pin(base_url: str, count: int, stop: asyncio.Event) -> list[asyncio.Task[None]]:
    """``count`` connections to the engine kept alive until ``stop`` (``_keep_alive``), returned
    once each has been served."""
    connected = [asyncio.Event() for _ in range(count)]
    pinned = [asyncio.create_task(_keep_alive(base_url, stop, ready)) for ready in connected]
    await asyncio.wait_for(asyncio.gather(*(ready.wait() for ready in connected)), 30)
    return pinned


async def _keep_alive(base_url: str, stop: asyncio.Event, ready: asyncio.Event) -> None:
    """One connection to the engine, kept alive by a /health read every 50 ms until ``stop``;
    ``ready`` is set once it has had its first answer (the connection is open and served)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        while not stop.is_set():
            async with http.get(f"{base_url}/health") as resp:
                await resp.read()
            ready.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)


async def _four_streams_progress_at_once(server: Any, llm_service: LlmService) -> None:
    started = [asyncio.Event() for _ in range(4)]
    runs = [asyncio.create_task(_stream_chat(server.url, i, 160, started[i])) for i in range(4)]
    began = time.monotonic()
    busy = asyncio.create_task(wait_busy(llm_service, 4))
    done, _ = await asyncio.wait([busy, *runs], return_when=asyncio.FIRST_COMPLETED)
    if busy not in done or busy.exception() is not None:
        # Say what the service and the engine were doing, not only "0 slots busy".
        busy.cancel()
        failed = None if busy.cancelled() else busy.exception()
        gate = llm_service._gates.get("smollm2-135m-instruct")
        status = (await llm_service.status())["models"].get("smollm2-135m-instruct", {}).get("engine")
        ended = [repr(task.exception()) if task.exception() else task.result() for task in runs if task.done()]
        process = await engine(llm_service)
        async with aiohttp.ClientSession() as http, http.get(f"{process.base_url}/metrics") as resp:
            counts = [line for line in (await resp.text()).splitlines() if line.startswith("llamacpp:requests")]
        states = [(s["id"], s["is_processing"], s.get("id_task")) for s in await process.slot_states()]
        raise AssertionError(
            f"four slots never busy after {time.monotonic() - began:.1f} s ({failed!r}):"
            f" gate busy={gate.busy if gate else None} waiting={gate.waiting if gate else None},"
            f" engine {status}, streams ended (began {began:.2f}): {ended}; llama-server: {counts}, slots {states};"
            f" its output: {process.output_tail(12)}"
        )
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in started)), 60)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/health") as resp:
            health = await resp.json()
        async with session.get(f"{server.url}/metrics") as resp:
            metrics = await resp.text()
    results = await asyncio.gather(*runs)
    assert all(r["first"] is not None and r["tokens"] > 20 for r in results), results
    assert max(r["first"] for r in results) < min(r["end"] for r in results), results
    model = health["llm"]["models"]["smollm2-135m-instruct"]
    assert model["slots"] == 4 and model["slots_busy"] == 4 and model["queue"] == 0, model
    assert model["engine"]["state"] == "ready" and model["tokens_per_second"] > 0, model
    assert 'mediaserver_llm_slots_busy{model="smollm2-135m-instruct"} 4.0' in metrics
    assert 'mediaserver_llm_slots{model="smollm2-135m-instruct"} 4.0' in metrics


async def test_a_conversation_keeps_its_prompt_cache(llm_service: LlmService) -> None:
    """Two conversations interleaved, three turns each: every turn after the first is served from
    its own slot's cache (the whole earlier conversation), not evaluated again."""
    system = ChatMessage("system", "You are a helpful assistant. Answer in one sentence.")
    questions = ["Name a fruit.", "What color is it?", "Where does it grow?"]
    histories = {name: [system] for name in ("a", "b")}
    last_prompt: dict[str, int] = {}
    for turn, question in enumerate(questions):
        for name, history in histories.items():
            history.append(ChatMessage("user", f"{question} ({name})"))
            async with llm_service.stream(history, GenerationParams(max_tokens=30)) as answer:
                text = await answer.text()
            usage = answer.usage
            assert usage is not None and usage.cached_tokens is not None
            if turn:
                # At least everything up to this conversation's previous question came from the cache.
                assert usage.cached_tokens >= last_prompt[name], (name, turn, usage)
            last_prompt[name] = usage.prompt_tokens
            history.append(ChatMessage("assistant", text))


async def test_a_history_trimmed_to_its_budget_keeps_its_prompt_cache(llm_service: LlmService) -> None:
    """Past its history budget the voice loop drops the oldest turn, so every later prompt starts
    differently: it still goes to the slot that holds the rest (SlotAffinity) and llama-server
    reuses those moved tokens (--cache-reuse, llm_engine_cache_reuse_tokens 64), instead of
    evaluating the whole history again (3.9-5.4 s to the first token in the voice loop on 2 cores)."""
    system = ChatMessage("system", "You are a helpful assistant. Answer in one sentence.")
    history = {name: [system] for name in ("a", "b")}
    for turn in range(4):  # two conversations interleaved, so the slots are not a's alone
        for name, messages in history.items():
            messages.append(ChatMessage("user", f"Tell me one fact about the number {turn} ({name})."))
            async with llm_service.stream(messages, GenerationParams(max_tokens=30)) as answer:
                messages.append(ChatMessage("assistant", await answer.text()))
    trimmed = [system, *history["a"][3:], ChatMessage("user", "And about the number 4?")]
    async with llm_service.stream(trimmed, GenerationParams(max_tokens=5)) as answer:
        await answer.text()
    usage = answer.usage
    assert usage is not None and usage.cached_tokens is not None
    # All but the system prompt's end, the dropped turn's place and the new question came from the cache.
    assert usage.cached_tokens >= 0.6 * usage.prompt_tokens, usage


async def test_a_prefilled_system_prompt_is_the_first_turns_cache(llm_service: LlmService) -> None:
    """``LlmService.prefill`` (the voice loop's, when a session starts) evaluates a new system prompt
    into the slot the conversation's first turn takes: that turn gets it from the cache, where the
    first turn of another new system prompt, not prefilled, evaluates it again."""
    await wait_idle(llm_service)

    def system(name: str) -> ChatMessage:
        return ChatMessage("system", f"{name} is your name. You answer in one short sentence, kindly and clearly.")

    question = ChatMessage("user", "Name a fruit.")
    async with llm_service.stream([system("Juniper"), question], GenerationParams(max_tokens=3)) as answer:
        await answer.text()
    cold = answer.usage
    evaluated = await llm_service.prefill([system("Marigold")])
    assert evaluated >= 15, evaluated  # the system turn: ~20 tokens
    async with llm_service.stream([system("Marigold"), question], GenerationParams(max_tokens=3)) as answer:
        await answer.text()
    warm = answer.usage
    assert cold is not None and warm is not None and cold.cached_tokens is not None and warm.cached_tokens is not None
    assert warm.cached_tokens >= evaluated - 4, (evaluated, warm)  # all but the prefill's "assistant" turn
    assert cold.cached_tokens < 10 <= warm.cached_tokens - cold.cached_tokens, (cold, warm)
    assert await llm_service.prefill([system("Aster")], model="no-such-model") == 0  # an unknown model: nothing


async def test_a_voice_loop_session_prefills_the_prompt_its_first_turn_sends(llm_service: LlmService) -> None:
    """``Assistant.prefill`` (a voice-loop session's start) evaluates the very system prompt its first
    turn sends (``Assistant.messages``): that turn takes it from the cache."""
    await wait_idle(llm_service)
    settings = llm_service.settings
    options = replace(
        AssistantOptions.from_settings(settings), system_prompt="Thistle is your name. Answer in one short sentence."
    )

    async def emit(_: object) -> None:
        return None

    assistant = Assistant(llm_service, None, settings, options, emit, None, Metrics())
    assistant.prefill()
    await asyncio.wait_for(asyncio.gather(*assistant._helpers), 30)
    async with llm_service.stream(assistant.messages("Name a fruit."), GenerationParams(max_tokens=3)) as answer:
        await answer.text()
    assert answer.usage is not None and (answer.usage.cached_tokens or 0) >= 15, answer.usage
    await assistant.aclose()


async def test_only_an_answer_to_speech_counts_in_the_voice_latency(llm_service: LlmService) -> None:
    """``mediaserver_voice_latency_seconds`` counts from the end of the user's speech: a response
    to a typed request (a Realtime ``response.create`` with no speech before it) adds nothing."""
    settings = llm_service.settings
    options = replace(AssistantOptions.from_settings(settings), max_answer_tokens=4)

    async def emit(_: object) -> None:
        return None

    metrics = Metrics()
    assistant = Assistant(llm_service, None, settings, options, emit, None, metrics)

    def first_tokens() -> float:
        return (
            metrics.registry.get_sample_value("mediaserver_voice_latency_seconds_count", {"stage": "llm_first_token"})
            or 0.0
        )

    try:
        typed = await assistant.respond([ChatMessage("user", "Name a fruit.")])
        assert (await typed.outcome()).status == "completed"
        assert first_tokens() == 0.0
        spoken = await assistant.respond([ChatMessage("user", "Name a fruit.")], speech_ended_at=time.monotonic())
        assert (await spoken.outcome()).status == "completed"
        assert first_tokens() == 1.0
    finally:
        await assistant.aclose()


async def test_engine_killed_mid_answer_restarts(server: Any, llm_service: LlmService) -> None:
    """The engine dies mid-answer: that answer ends with an error naming the engine, the supervisor
    restarts it, and the next request is answered."""
    await wait_idle(llm_service)
    process = await engine(llm_service)
    pid, restarts = process.pid, process.restarts
    assert pid is not None
    story = [ChatMessage("user", STORY[0]["content"])]
    with pytest.raises(ApiError) as caught:
        async with llm_service.stream(story, GenerationParams(max_tokens=500)) as stream:
            async for _ in stream:
                os.kill(pid, signal.SIGKILL)
    assert caught.value.status == 502 and "llama-server engine" in caught.value.message, caught.value.message
    # A request sent now waits for the restarted engine (llm_engine_ready_wait_s) and is answered.
    answer = await llm_service.complete([ChatMessage("user", "Name three colors.")], GenerationParams(max_tokens=20))
    assert answer.text and process.pid != pid and process.restarts == restarts + 1 and process.state == "ready"
    # In words, not the engine's last log lines (its timings and token counts stay in the server's log).
    assert process.last_exit == "was killed by signal 9 (SIGKILL)", process.last_exit
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/metrics") as resp:
        assert 'mediaserver_llm_engine_restarts_total{model="smollm2-135m-instruct"}' in await resp.text()


async def test_an_engine_that_cannot_start_turns_the_llm_off_naming_why(
    base_settings: Settings, asr_service: Any, tts_service: Any, tmp_path: Path
) -> None:
    """A model file llama-server cannot load: the server runs without the LLM, and says why."""
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a GGUF file" * 100)
    settings = base_settings.model_copy(update={"llm_model": str(bad), "llm_embedding_model": str(bad)})
    app = create_app(settings, asr_service=asr_service, tts_service=tts_service)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/health") as resp:
                health = await resp.json()
            body = {"model": "gpt-4o-mini", "messages": STORY}
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                status, error = resp.status, (await resp.json())["error"]
            async with session.get(f"{url}/v1/audio/transcriptions") as resp:
                assert resp.status != 503  # the rest of the server runs
    finally:
        await runner.cleanup()
    feature = health["features"]["llm"]
    assert feature["enabled"] is False and "llama-server" in feature["reason"], feature
    assert status == 503 and error["code"] == "feature_disabled" and "llama-server" in error["message"], error
    # Why, summarised from its first error line; not its log lines (timestamps, levels, C functions).
    assert "exited with code 1 at start: invalid magic characters" in error["message"], error
    assert not re.search(r"\d+\.\d+\.\d+\.\d+ [EWI] |gguf_init|llama_model_load| \| ", error["message"]), error


async def test_health_shows_an_idle_engines_slots_before_its_first_request(
    base_settings: Settings, asr_service: Any
) -> None:
    """A preloaded engine nobody asked yet: /health's figures for it are there, idle (they appeared
    only after the first request before)."""
    settings = base_settings.model_copy(update={"llm_slots": 2, "llm_context_tokens": 512})
    service = LlmService(settings, asr_service.metrics)
    await service.start()
    try:
        status = await service.status()
    finally:
        await service.aclose()
    model = status["models"]["smollm2-135m-instruct"]
    assert model["slots"] == 2 and model["slots_busy"] == 0 and model["queue"] == 0, model
    assert model["tokens_per_second"] == 0 and model["engine"]["state"] == "ready", model
