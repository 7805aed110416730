"""Idle unload of the small models that run on a worker thread of their own: the turn model
(``turn_keep_alive_s``) and the speaker encoder (``speaker_keep_alive_s``).

Real parts: Smart Turn v3.2's ONNX file, GE2E's weights, Piper speech and real recordings. Each
test builds its own model or service with a non-default keep-alive (the shared ones keep theirs
loaded for good) and waits on the keeper's state changes, never on a fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from mediaserver.config import Settings
from mediaserver.errors import ModelUnavailable
from mediaserver.keep_alive import ModelKeeper
from mediaserver.metrics import Metrics
from mediaserver.speakers import fetch as speaker_fetch
from mediaserver.speakers.service import SpeakerService
from mediaserver.state import SETTINGS, SPEAKERS
from mediaserver.turns import model as turn_models
from mediaserver.turns.fetch import default_dir, fetch
from mediaserver.turns.model import TurnModel
from tests.conftest import Clip, LiveServer
from tests.faults import metric_samples
from tests.integration.test_speakers import ENROL, SAME_READER, HumanClips, clip

READER = SAME_READER[0]  # another recording of the reader ENROL enrols


def paused(clip: Clip) -> np.ndarray:
    return np.concatenate([clip.audio16k, np.zeros(3200, np.float32)])  # 200 ms of pause


# --- the turn model ---------------------------------------------------------------------------------


async def test_the_turn_model_closes_when_idle_and_the_next_pauses_open_it_once(
    speech: Callable[[str], Clip],
) -> None:
    """turn_keep_alive_s 0.5: the session closes once unused; three pauses scored at once open it
    again with one load, and score as the model did before it closed."""
    model = TurnModel(fetch(default_dir()), keep_alive_s=0.5, metrics=Metrics())
    keeper, name = model.weights.keeper, model.weights.name
    try:
        audio = [paused(speech(t)) for t in ("What time is it?", "Turn off the lights in", "Play some music.")]
        before = [s.probability for s in await asyncio.gather(*(model.score(a) for a in audio))]
        assert keeper.loads(name) == 1 and model.weights.loaded
        await keeper.wait_for(lambda: not keeper.is_loaded(name), timeout_s=30)
        assert not model.weights.loaded and keeper.status()[name]["unloads"] == 1
        after = [s.probability for s in await asyncio.gather(*(model.score(a) for a in audio))]
        assert keeper.loads(name) == 2, keeper.status()
        assert after == pytest.approx(before, abs=1e-6)
        await keeper.wait_for(lambda: not keeper.is_loaded(name), timeout_s=30)  # and it leaves again
    finally:
        await model.aclose()


async def test_a_turn_model_closed_after_each_pause_scores_every_pause(speech: Callable[[str], Clip]) -> None:
    """turn_keep_alive_s 0: closed as soon as its last pause is scored; pauses that keep coming
    while it closes and opens again are all scored (the close and the load queue on its thread)."""
    model = TurnModel(fetch(default_dir()), keep_alive_s=0, metrics=Metrics())
    keeper, name = model.weights.keeper, model.weights.name
    audio = paused(speech("What time is it?"))
    try:
        scores = []
        for _ in range(3):  # each pause opens it, and it closes after each
            scores.append((await model.score(audio)).probability)
            await keeper.wait_for(lambda: not keeper.is_loaded(name), timeout_s=30)
        assert keeper.loads(name) == 3 and keeper.status()[name]["unloads"] == 3, keeper.status()
        # Pauses back to back: each close races the next pause; every pause is scored all the same.
        for _ in range(5):
            scores.append((await model.score(audio)).probability)
        assert len({round(p, 6) for p in scores}) == 1, scores
    finally:
        await model.aclose()


# --- the speaker encoder ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def enrolled(
    settings: Settings, human_clips: HumanClips
) -> AsyncIterator[tuple[SpeakerService, ModelKeeper, str]]:
    """A speaker service of its own with ``settings``, the reader enrolled; its keeper and model name."""
    service = SpeakerService(settings, Metrics())
    await service.start()
    assert service.weights is not None
    try:
        await service.enrol("reader", [clip(human_clips, n) for n in ENROL], replace=False)
        yield service, service.weights.keeper, service.weights.name
    finally:
        await service.aclose()


async def test_the_speaker_encoder_unloads_when_idle_and_the_next_voice_loads_it(
    human_clips: HumanClips, tmp_path: Path
) -> None:
    """speaker_keep_alive_s 0.5: GE2E's weights leave once unused; a verification after that loads
    them again (one load for two voices at once) and knows the enrolled reader as before."""
    settings = Settings(_env_file=None, speakers_dir=tmp_path, speaker_keep_alive_s=0.5)
    async with enrolled(settings, human_clips) as (service, keeper, name):
        known = (await service.identify(clip(human_clips, READER)))[0]
        await keeper.wait_for(lambda: not keeper.is_loaded(name), timeout_s=30)
        assert service.status()["in_memory"] is False and service.status()["available"] is True
        again, other = await asyncio.gather(
            service.identify(clip(human_clips, READER)), service.identify(clip(human_clips, "jfk"))
        )
        assert keeper.loads(name) == 2, keeper.status()
        assert again[0].name == "reader" and again[0].score == pytest.approx(known.score, abs=1e-5)
        assert not service.accepted(other)
        await keeper.wait_for(lambda: not keeper.is_loaded(name), timeout_s=30)
        assert keeper.status()[name]["unloads"] == 2


async def test_a_speaker_model_that_cannot_load_again_is_a_503_and_the_next_voice_tries_again(
    human_clips: HumanClips, tmp_path: Path
) -> None:
    """The weights file goes away while the encoder is unloaded: a verification is refused with the
    reason (ModelUnavailable, a 503), /health's state has it; the file put back, the next one loads."""
    weights = tmp_path / "encoder.pt"
    shutil.copy(speaker_fetch.fetch(speaker_fetch.default_dir()), weights)
    settings = Settings(
        _env_file=None, speakers_dir=tmp_path / "store", speaker_model_path=weights, speaker_keep_alive_s=0.3
    )
    async with enrolled(settings, human_clips) as (service, keeper, name):
        await keeper.wait_for(lambda: not keeper.is_loaded(name), timeout_s=30)
        hidden = weights.rename(tmp_path / "elsewhere.pt")
        with pytest.raises(ModelUnavailable, match="could not be loaded again"):
            await service.identify(clip(human_clips, READER))
        assert "last_error" in keeper.status()[name]
        hidden.rename(weights)
        matches = await service.identify(clip(human_clips, READER))
        assert matches[0].name == "reader" and service.accepted(matches)
        assert keeper.is_loaded(name) and "last_error" not in keeper.status()[name]


# --- what /health and /metrics say ------------------------------------------------------------------


async def _health(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/health") as resp:
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body


async def test_health_and_metrics_show_the_turn_and_speaker_models_leave_and_come_back(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip], tmp_path: Path
) -> None:
    """A server with both keep-alives at 0.5 s: /health's model_states has them loaded, then not
    (the server stays "ok": an unloaded model is healthy), and a device socket's pause brings the
    turn model back (its turn decided), as /metrics' mediaserver_model_loaded says."""
    server: LiveServer = await server_factory(
        turn_keep_alive_s=0.5, speaker_keep_alive_s=0.5, speakers_dir=tmp_path, turn_detection="semantic"
    )
    health = await _health(server.url)
    [turn] = health["model_states"]["turn"]
    [speaker] = health["model_states"]["speaker"]
    # Wait on the keepers' own state changes (the models behind /health), then read /health once.
    turn_model = turn_models.shared(server.app[SETTINGS])
    speaker_model = server.app[SPEAKERS].weights
    assert turn_model is not None and speaker_model is not None
    turn_keeper, speaker_keeper = turn_model.weights.keeper, speaker_model.keeper
    await turn_keeper.wait_for(lambda: not turn_keeper.is_loaded(turn), timeout_s=30)
    await speaker_keeper.wait_for(lambda: not speaker_keeper.is_loaded(speaker), timeout_s=30)
    health = await _health(server.url)
    assert not health["model_states"]["turn"][turn]["loaded"], health["model_states"]
    assert health["status"] == "ok" and health["turns"]["model_loaded"] and not health["turns"]["in_memory"]
    assert health["speakers"]["available"] and not health["speakers"]["in_memory"]
    assert health["model_states"]["turn"][turn]["keep_alive_s"] == 0.5
    # A pause over the device socket: the turn model opens again and decides it.
    pcm = np.concatenate([np.zeros(4800), speech("What time is it?").audio16k, np.zeros(24000)]) * 32767
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{server.url}/api/ws/asr") as ws:
        await ws.send_str(json.dumps({"type": "start", "mode": "server_vad", "turn_detection": "semantic"}))
        assert json.loads((await ws.receive(timeout=30)).data)["type"] == "ready"
        await ws.send_bytes(pcm.astype("<i2").tobytes())
        async with asyncio.timeout(60):
            while (message := json.loads((await ws.receive()).data))["type"] != "turn":
                pass
    assert message["by"] in ("model", "words"), message
    health = await _health(server.url)
    assert health["model_states"]["turn"][turn]["loads"] == 2, health["model_states"]["turn"]
    samples = await metric_samples(server.url)
    unloads = ("mediaserver_model_unloads_total", (("engine", "turn"), ("model", turn), ("reason", "idle")))
    assert samples[unloads] >= 1 and samples[("mediaserver_model_loaded", (("engine", "turn"), ("model", turn)))] == 1
