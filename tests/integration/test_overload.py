"""A full ASR queue refuses new work with a clear 503 instead of queueing without bound."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from mediaserver.app import create_app
from mediaserver.asr.models import ModelRegistry
from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.devices import choose_device
from mediaserver.metrics import Metrics
from tests.ports import bound_port


async def test_full_queue_is_503_and_nothing_else_fails(base_settings: Settings, speech: Any, wer: Any) -> None:
    settings = base_settings.model_copy(
        update={"asr_max_queue": 1, "asr_max_batch": 1, "asr_pack_windows": False, "asr_preload_models": ["tiny.en"]}
    )
    service = AsrService(settings, choose_device("cpu"), ModelRegistry(settings), Metrics())
    await service.start()
    runner = web.AppRunner(create_app(settings, asr_service=service))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = bound_port(runner)
    body = speech("kitchen").pcm16k_bytes
    try:
        async with aiohttp.ClientSession() as session:

            async def post() -> tuple[int, dict[str, Any]]:
                async with session.post(f"http://127.0.0.1:{port}/api/willow", data=body) as resp:
                    payload = await resp.json()
                    payload["retry_after"] = resp.headers.get("Retry-After")
                    return resp.status, payload

            results = await asyncio.gather(*(post() for _ in range(6)))
            async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                metrics = await resp.text()
    finally:
        await runner.cleanup()
        await service.aclose()
    statuses = sorted(status for status, _ in results)
    assert set(statuses) <= {200, 503}
    assert statuses.count(503) >= 1 and statuses.count(200) >= 1
    for status, payload in results:
        if status == 503:
            assert payload["code"] == "overloaded" and "retry later" in payload["error"]
            # How long the queue ahead takes at the measured batch time, in whole seconds (RFC 9110).
            assert payload["retry_after"] is not None and int(payload["retry_after"]) >= 1
        else:
            assert wer("Turn on the kitchen lights and close the garage door.", payload["text"]) <= 0.2
    assert 'mediaserver_asr_rejected_total{model="tiny.en"}' in metrics
