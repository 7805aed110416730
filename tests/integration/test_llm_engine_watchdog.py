"""The llama-server engine alive but not answering (SIGSTOPped: what a deadlock or a wedged GPU
looks like from outside), and an engine whose exit its supervisor sees late.

Each test has an engine of its own (the bundled SmolLM2, one slot: a second or two to start), with
the watchdog's settings at non-default values, so the session's shared engine is never stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from mediaserver.config import Settings
from mediaserver.llm.engine_binary import find_binary
from mediaserver.llm.engine_process import LlamaServerProcess
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage, GenerationParams
from mediaserver.metrics import Metrics
from tests.llm_engine import engine

pytestmark = pytest.mark.asyncio(loop_scope="session")

QUESTION = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 8}


@contextlib.asynccontextmanager
async def own_llm(base_settings: Settings, **overrides: Any) -> AsyncIterator[LlmService]:
    settings = base_settings.model_copy(update={"llm_slots": 1, "llm_context_tokens": 512, **overrides})
    # Metrics of its own: the session's registry shows the shared engine's slots (test_llm_engine.py).
    service = LlmService(settings, Metrics())
    await service.start()
    try:
        yield service
    finally:
        await service.aclose()


async def _health_engine(session: aiohttp.ClientSession, url: str) -> tuple[str, dict[str, Any]]:
    async with session.get(f"{url}/health") as resp:
        body = await resp.json()
    return body["status"], body["llm"]["models"]["smollm2-135m-instruct"]["engine"]


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> float:
    """Poll ``check`` every 50 ms until true; the seconds it took."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s:g} s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def _resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


async def test_a_stopped_engine_is_unhealthy_answers_503_fast_and_is_restarted(
    base_settings: Settings, server_factory: Callable[..., Any]
) -> None:
    """SIGSTOP the engine: /health says so within the probes' bound, a request gets a 503 with
    Retry-After at once (not a 504 after llm_request_timeout_s), and after llm_engine_hang_restart_s
    without an answer the engine is killed and restarted: a request sent to the stopped one is
    answered by the new one, and so are new requests. Before the fix, /health said 'ready' and every
    request waited the whole llm_request_timeout_s."""
    interval_s, timeout_s, failures, hang_s = 0.5, 1.0, 3, 8.0
    async with own_llm(
        base_settings,
        llm_engine_probe_interval_s=interval_s,
        llm_engine_probe_timeout_s=timeout_s,
        llm_engine_probe_failures=failures,
        llm_engine_hang_restart_s=hang_s,
        llm_engine_restart_backoff_s=0.1,
    ) as llm:
        server = await server_factory(llm=llm)
        process = await engine(llm)
        pid = process.pid
        assert pid is not None
        async with aiohttp.ClientSession() as session:
            status, state = await _health_engine(session, server.url)
            assert status == "ok" and state["state"] == "ready" and state["healthy"], state

            stopped_at = time.monotonic()
            os.kill(pid, signal.SIGSTOP)  # if the test fails, aclose() kills the stopped child (SIGKILL)
            # Sent to the stopped engine before anyone knows: it waits, then is sent again to the new one.
            waiting = asyncio.create_task(
                llm.complete([ChatMessage("user", "Name a fruit.")], GenerationParams(max_tokens=8))
            )

            async def unhealthy() -> bool:
                _, state = await _health_engine(session, server.url)
                return bool(state["state"] == "unresponsive")

            # The first probe starts within an interval; `failures` of them time out, an interval apart.
            bound_s = interval_s + failures * (timeout_s + interval_s) + 2.0
            await _until(unhealthy, bound_s, "unhealthy")
            unhealthy_after_s = time.monotonic() - stopped_at
            status, state = await _health_engine(session, server.url)
            assert status == "degraded" and not state["healthy"] and state["unanswered_s"] > 0, state
            assert state["restarts"] == 0 and state["pid"] == pid, state

            asked_at = time.monotonic()
            async with session.post(f"{server.url}/v1/chat/completions", json=QUESTION) as resp:
                answer_status, retry_after, body = resp.status, resp.headers.get("Retry-After"), await resp.json()
            answered_in_s = time.monotonic() - asked_at
            assert answer_status == 503 and body["error"]["code"] == "overloaded", body
            assert "has not answered its health checks" in body["error"]["message"], body
            assert retry_after is not None and 1 <= int(retry_after) <= hang_s + 2, retry_after
            assert answered_in_s < 2.0, answered_in_s  # at once: no wait for the engine
            assert not waiting.done()

            async def restarted() -> bool:
                _, state = await _health_engine(session, server.url)
                return bool(state["state"] == "ready" and state["pid"] != pid)

            await _until(restarted, hang_s + 30.0, "restarted")
            restarted_after_s = time.monotonic() - stopped_at
            status, state = await _health_engine(session, server.url)
            assert status == "ok" and state["restarts"] == 1, state
            assert state["last_exit"].startswith("answered no health check for"), state
            assert "llm_engine_hang_restart_s" in state["last_exit"], state
            # Killed only once silent for the bound: not as soon as it was unhealthy.
            assert restarted_after_s >= hang_s, restarted_after_s

            completion = await asyncio.wait_for(waiting, 60)
            assert completion.text, completion
            async with session.post(f"{server.url}/v1/chat/completions", json=QUESTION) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["choices"][0]["message"]["content"]
        print(f"unhealthy {unhealthy_after_s:.1f} s after SIGSTOP, 503 in {answered_in_s * 1000:.0f} ms, "
              f"restarted and ready {restarted_after_s:.1f} s after SIGSTOP")  # fmt: skip


async def test_an_engine_that_answers_again_is_healthy_without_a_restart(base_settings: Settings) -> None:
    """SIGSTOP, then SIGCONT once it is unhealthy and before llm_engine_hang_restart_s: it is ready
    again, the same child, not restarted, and answers."""
    async with own_llm(
        base_settings,
        llm_engine_probe_interval_s=0.3,
        llm_engine_probe_timeout_s=0.7,
        llm_engine_hang_restart_s=120.0,
    ) as llm:
        process = await engine(llm)
        pid = process.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)

        def state_is(wanted: str) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return process.state == wanted

            return check

        try:
            await _until(state_is("unresponsive"), 0.3 + 2 * (0.7 + 0.3) + 2.0, "unhealthy")
            status = (await llm.status())["models"]["smollm2-135m-instruct"]["engine"]
            assert status["state"] == "unresponsive" and not status["healthy"], status
        finally:
            _resume(pid)
        await _until(state_is("ready"), 10.0, "healthy again")
        assert process.pid == pid and process.restarts == 0 and process.last_exit is None
        answer = await llm.complete([ChatMessage("user", "Name three colors.")], GenerationParams(max_tokens=8))
        assert answer.text


async def test_an_engine_that_does_not_exit_when_told_is_killed_after_the_stop_timeout(
    base_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """``llm_engine_stop_timeout_s`` at 0.5 s (the default is 2): a child that does not exit on SIGTERM
    (SIGSTOPped before the watchdog could notice, so it is told to stop as a well one is) is killed
    then, and says so; closing took as long as the 5 s constant before it, which held up a
    shutdown past its grace in CI."""
    async with own_llm(base_settings, llm_engine_probe_interval_s=60.0, llm_engine_stop_timeout_s=0.5) as llm:
        process = await engine(llm)
        pid = process.pid
        assert pid is not None and process.state == "ready"
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        with caplog.at_level("WARNING", logger="mediaserver.llm.engine"):
            await llm.aclose()
        closed_after_s = time.monotonic() - started
    print(f"closed {closed_after_s:.2f} s after SIGSTOP")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped
    assert f"(pid {pid}, ready) did not exit within 0.5 s of SIGTERM (llm_engine_stop_timeout_s): killed" in caplog.text
    assert 0.5 <= closed_after_s < 2.5, closed_after_s  # the wait, then at most the log reader's 1 s


SLOW_EXIT_WRAPPER = """#!/bin/sh
# llama-server under a wrapper that outlives it by {lag_s} s: its supervisor sees the exit late.
"{binary}" "$@" &
child=$!
trap 'kill -TERM $child 2>/dev/null; wait $child; exit 143' TERM INT
wait $child
sleep {lag_s}
"""


async def test_a_request_that_meets_a_dead_engine_waits_for_the_supervisors_word(
    base_settings: Settings, tmp_path: Path
) -> None:
    """The engine dies before a request is sent, and its supervisor learns of it only 3 s later (its
    child is a wrapper script that outlives llama-server, as a loaded machine delays the notice): the
    request waits for the supervisor and is answered by the restarted engine. A fixed 0.2 s wait
    decided before, and the request failed with a 502."""
    binary = find_binary(base_settings)
    assert binary is not None
    wrapper = tmp_path / "llama-server-wrapper.sh"
    wrapper.write_text(SLOW_EXIT_WRAPPER.format(binary=binary, lag_s=3))
    wrapper.chmod(0o755)
    async with own_llm(
        base_settings,
        llm_engine_binary=wrapper,
        # Probes far apart: the watchdog must not call the dead server unresponsive during the lag.
        llm_engine_probe_interval_s=5.0,
        llm_engine_restart_backoff_s=0.1,
    ) as llm:
        process: LlamaServerProcess = await engine(llm)
        wrapper_pid = process.pid
        assert wrapper_pid is not None
        children = (await asyncio.to_thread(Path(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children").read_text)).split()
        assert len(children) == 1, children
        os.kill(int(children[0]), signal.SIGKILL)
        answer = await llm.complete([ChatMessage("user", "Name three colors.")], GenerationParams(max_tokens=8))
        assert answer.text and process.restarts == 1 and process.pid != wrapper_pid
        assert process.last_exit == "exited with code 0", process.last_exit
