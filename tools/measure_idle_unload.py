#!/usr/bin/env python3
"""Whether idle unload (``*_keep_alive_s``) gives the memory back: RSS before a load, loaded, after
the idle unload, over a few load/unload cycles (a leak would grow them).

- ASR: each Whisper model in turn (tiny.en, base), in this process: one transcription loads it,
  ``asr_keep_alive_s`` (1 s) unloads it (CTranslate2's ``unload_model``).
- TTS: the default Piper voice, in this process.
- LLM: the bundled SmolLM2's ``llama-server`` child: its RSS while it runs; after the idle stop
  the process is gone, and this process's RSS is read too.
- Embeddings: the same GGUF on its embedding ``llama-server`` child, also on ``llm_keep_alive_s``.
- The turn model (Smart Turn's ONNX Runtime session) and the speaker encoder (GE2E), in this
  process, on ``turn_keep_alive_s`` and ``speaker_keep_alive_s``.

On CUDA the measure would be NVML's used memory; this reads RSS (psutil), the CPU's.

    python tools/measure_idle_unload.py [--cycles 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mediaserver.asr.models import ModelRegistry
from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.devices import choose_device
from mediaserver.events import TranscriptionOptions
from mediaserver.keep_alive import ModelKeeper
from mediaserver.llm.engine import LlamaServerEngine
from mediaserver.llm.registry import BUNDLED_NAME
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage, GenerationParams
from mediaserver.metrics import Metrics
from mediaserver.speakers.service import SpeakerService
from mediaserver.tts.service import TtsService
from mediaserver.turns import model as turn_models

MB = 1024 * 1024
ME = psutil.Process(os.getpid())


def rss_mb(process: psutil.Process = ME) -> float:
    gc.collect()
    return round(float(process.memory_info().rss) / MB, 1)


def speech_like(seconds: float = 3.0) -> np.ndarray:
    """A few seconds of a voiced tone: enough for the VAD gate to pass it to the model."""
    t = np.arange(int(16000 * seconds)) / 16000
    wave = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return wave.astype(np.float32)


async def in_process_cycles(
    engine: str, keeper: ModelKeeper, name: str, use: Callable[[], Awaitable[object]], cycles: int
) -> dict[str, Any]:
    """RSS of this process before ``use()`` loads the model, right after, and after its idle unload,
    ``cycles`` times (the model is unloaded when this starts)."""
    rows: list[dict[str, float]] = []
    for _ in range(cycles):
        before = rss_mb()
        await use()
        loaded = rss_mb()
        await keeper.wait_for(lambda: not keeper.is_loaded(name), timeout_s=60)
        rows.append({"before_mb": before, "loaded_mb": loaded, "after_unload_mb": rss_mb()})
    return {"engine": engine, "model": name, "load_seconds": keeper.status()[name]["load_seconds"], "cycles": rows}


async def measure_asr(settings: Settings, model: str, cycles: int) -> dict[str, Any]:
    asr = AsrService(settings, choose_device("cpu", "auto", 0), ModelRegistry(settings), Metrics())
    try:
        options = TranscriptionOptions(language="en")
        return await in_process_cycles(
            "asr", asr.keeper, model, lambda: asr.transcribe(speech_like(), options, model=model), cycles
        )
    finally:
        await asr.aclose()


async def measure_tts(settings: Settings, cycles: int) -> dict[str, Any]:
    tts = TtsService(settings.model_copy(update={"tts_preload_default_voice": False}), Metrics())
    try:
        voice = await tts.voice(None)
        return await in_process_cycles(
            "tts", tts.keeper, voice.name, lambda: tts.synthesize("Memory comes and goes.", voice), cycles
        )
    finally:
        await tts.aclose()


async def measure_llm(settings: Settings, cycles: int) -> dict[str, Any]:
    llm = LlmService(settings.model_copy(update={"llm_preload": False}), Metrics())
    rows: list[dict[str, Any]] = []
    try:
        await llm.start()
        for _ in range(cycles):
            before = rss_mb()
            await llm.complete([ChatMessage("user", "Name three colors.")], GenerationParams(max_tokens=16))
            backend = await llm.backend(llm.sources.source(BUNDLED_NAME))  # loaded: no new start
            assert isinstance(backend, LlamaServerEngine) and backend.process.pid is not None
            child = psutil.Process(backend.process.pid)
            child_rss = rss_mb(child)
            await llm.keeper.wait_for(lambda: not llm.keeper.is_loaded(BUNDLED_NAME), timeout_s=60)
            rows.append(
                {
                    "server_before_mb": before,
                    "child_loaded_mb": child_rss,
                    "child_after_unload": "gone" if not child.is_running() else f"{rss_mb(child)} MB",
                    "server_after_unload_mb": rss_mb(),
                }
            )
        load_s = llm.keeper.status()[BUNDLED_NAME]["load_seconds"]
    finally:
        await llm.aclose()
    return {"engine": "llm", "model": BUNDLED_NAME, "load_seconds": load_s, "cycles": rows}


def unloaded(llm: LlmService, name: str) -> Callable[[], bool]:
    return lambda: not llm.embedding_keeper.is_loaded(name)


async def measure_embedding(settings: Settings, cycles: int) -> dict[str, Any]:
    llm = LlmService(settings.model_copy(update={"llm_preload": False}), Metrics())
    rows: list[dict[str, Any]] = []
    name = ""
    try:
        for _ in range(cycles):
            before = rss_mb()
            name = (await llm.embed(["memory comes and goes"])).model
            pid = llm._embedders[name].process.pid
            assert pid is not None
            child = psutil.Process(pid)
            child_rss = rss_mb(child)
            await llm.embedding_keeper.wait_for(unloaded(llm, name), timeout_s=60)
            rows.append(
                {
                    "server_before_mb": before,
                    "child_loaded_mb": child_rss,
                    "child_after_unload": "gone" if not child.is_running() else f"{rss_mb(child)} MB",
                    "server_after_unload_mb": rss_mb(),
                }
            )
        load_s = llm.embedding_keeper.status()[name]["load_seconds"]
    finally:
        await llm.aclose()
    return {"engine": "embedding", "model": name, "load_seconds": load_s, "cycles": rows}


async def measure_turn(settings: Settings, cycles: int) -> dict[str, Any]:
    model = turn_models.load_shared(settings, Metrics())
    assert model is not None, "the turn model is missing (make setup fetches it)"
    keeper, name = model.weights.keeper, model.weights.name
    try:
        model.weights.announce()
        await keeper.wait_for(lambda: not keeper.is_loaded(name), timeout_s=60)
        return await in_process_cycles("turn", keeper, name, lambda: model.score(speech_like()), cycles)
    finally:
        await model.aclose()


async def measure_speaker(settings: Settings, cycles: int) -> dict[str, Any]:
    from tests.human_speech import default_dir, load_clips  # a real voice (make setup-dev fetches them)

    [(_, voice, _)] = load_clips(default_dir(), ["jfk"])
    with tempfile.TemporaryDirectory() as store:
        service = SpeakerService(settings.model_copy(update={"speakers_dir": Path(store)}), Metrics())
        await service.start()
        assert service.weights is not None, service.problem
        keeper, name = service.weights.keeper, service.weights.name
        try:
            await keeper.wait_for(lambda: not keeper.is_loaded(name), timeout_s=60)
            return await in_process_cycles("speaker", keeper, name, lambda: service.embed(voice), cycles)
        finally:
            await service.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    settings = Settings(
        asr_preload_models=[],
        asr_keep_alive_s=1.0,
        tts_keep_alive_s=1.0,
        llm_keep_alive_s=1.0,
        turn_keep_alive_s=1.0,
        speaker_keep_alive_s=1.0,
        llm_slots=1,
    )
    print(f"start: this process {rss_mb()} MB")
    results = [
        await measure_asr(settings, "tiny.en", args.cycles),
        await measure_asr(settings, "base", args.cycles),
        await measure_tts(settings, args.cycles),
        await measure_llm(settings, args.cycles),
        await measure_embedding(settings, args.cycles),
        await measure_turn(settings, args.cycles),
        await measure_speaker(settings, args.cycles),
    ]
    for result in results:
        print(f"{result['engine']} {result['model']} (load {result['load_seconds']} s):")
        for index, row in enumerate(result["cycles"], 1):
            print(f"  cycle {index}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
