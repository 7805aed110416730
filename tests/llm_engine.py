"""What tests read from the real llama-server engine: its slots, as llama-server's ``/slots`` reports them."""

from __future__ import annotations

import asyncio
from typing import Any

from mediaserver.llm.engine import LlamaServerEngine
from mediaserver.llm.engine_process import LlamaServerProcess
from mediaserver.llm.registry import BUNDLED_NAME
from mediaserver.llm.service import LlmService


async def engine(llm: LlmService, model: str = BUNDLED_NAME) -> LlamaServerProcess:
    backend = await llm.backend(llm.sources.source(model))
    assert isinstance(backend, LlamaServerEngine)
    return backend.process


async def slots(llm: LlmService) -> list[dict[str, Any]]:
    return await (await engine(llm)).slot_states()


async def busy_slots(llm: LlmService) -> list[dict[str, Any]]:
    return [slot for slot in await slots(llm) if slot["is_processing"]]


async def wait_busy(llm: LlmService, count: int = 1, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Until at least ``count`` slots are generating; returns them."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        busy = await busy_slots(llm)
        if len(busy) >= count:
            return busy
        assert asyncio.get_running_loop().time() < deadline, f"{len(busy)} slots busy, waited for {count}"
        await asyncio.sleep(0.01)


async def wait_idle(llm: LlmService, timeout_s: float = 30.0) -> None:
    """Until no slot of the engine is generating (a cancelled generation has stopped)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while busy := await busy_slots(llm):
        assert asyncio.get_running_loop().time() < deadline, f"slots still generating: {busy}"
        await asyncio.sleep(0.01)


async def wait_stopped(llm: LlmService, busy: dict[str, Any], timeout_s: float = 30.0) -> int:
    """Until the task that was running in slot ``busy`` (from ``busy_slots``) has stopped; returns the
    tokens it had generated when last seen running, 10 ms or so before it stopped (llama-server
    resets a cancelled slot's counts, so they cannot be read afterwards)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    last = int(busy["next_token"][0]["n_decoded"])
    while True:
        slot = next(s for s in await slots(llm) if s["id"] == busy["id"])
        if not (slot["is_processing"] and slot.get("id_task") == busy["id_task"]):
            return last
        last = int(slot["next_token"][0]["n_decoded"])
        assert asyncio.get_running_loop().time() < deadline, f"slot {busy['id']} still generating: {slot}"
        await asyncio.sleep(0.01)
