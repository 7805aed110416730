"""The app-wide ASR service: loaded models, one scheduler each, and option validation.

Created once per app (aiohttp cleanup_ctx) and shared by every transport, so however many sessions
are open there is one copy of each model in memory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from mediaserver.asr.backends import build_remote_engine
from mediaserver.asr.engine import AsrEngine, AsrJob, WhisperEngine
from mediaserver.asr.guards import GuardConfig
from mediaserver.asr.models import ModelRegistry
from mediaserver.asr.remote import RemoteEngine
from mediaserver.asr.scheduler import AsrScheduler
from mediaserver.asr.vocabulary import with_vocabulary
from mediaserver.asr.windows import WINDOW_S, PackingConfig
from mediaserver.audio.vad import VadConfig
from mediaserver.config import Settings
from mediaserver.devices import DeviceChoice
from mediaserver.errors import ModelUnavailable
from mediaserver.events import AudioArray, Priority, Transcript, TranscriptionOptions
from mediaserver.keep_alive import ModelKeeper, SharedLoads, return_freed_memory
from mediaserver.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    name: str
    engine: AsrEngine | RemoteEngine
    scheduler: AsrScheduler


class Listener(Protocol):
    """A streaming session, as the service counts them (``streams``)."""

    @property
    def speaking(self) -> bool: ...


class AsrService:
    """The app's one ASR service: loaded models and the scheduler in front of each.

    It owns the engines (loaded on first use or at start, at most ``max_loaded_models``, the least
    recently used unloaded when idle) and one ``AsrScheduler`` per engine, so every session and
    request of every transport shares one copy of each model and one queue per model. Requests
    name models as clients do; ``models`` (the ``ModelRegistry``) resolves them and decides what
    each model can do.
    """

    def __init__(self, settings: Settings, device: DeviceChoice, registry: ModelRegistry, metrics: Metrics) -> None:
        self.settings = settings
        self.device = device
        self.models = registry
        self.metrics = metrics
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()
        self._load_locks: dict[str, asyncio.Lock] = {}
        self._loading: SharedLoads[LoadedModel] = SharedLoads("asr")  # one load per cold start
        self._closed = False
        # Idle unload of local models (asr_keep_alive_s); remote engines hold no weights here.
        self.keeper = ModelKeeper("asr", settings.asr_keep_alive_s, metrics, self._unload_idle)
        metrics.watch_engines(lambda: {name: m.engine.counters for name, m in self._loaded.items()})
        # The streaming sessions decoding here (StreamSession adds itself): whether others are in
        # speech decides a prefill-only partial decode (``turn_prefill_decodes`` auto).
        self.streams: weakref.WeakSet[Listener] = weakref.WeakSet()

    def others_in_speech(self, stream: Listener) -> bool:
        """Whether a streaming session other than ``stream`` hears someone speaking now."""
        return any(other.speaking for other in list(self.streams) if other is not stream)

    @property
    def loaded_models(self) -> list[str]:
        return list(self._loaded)

    def open_jobs(self) -> int:
        """Jobs whose callers still wait for them, queued or running, across every model."""
        return sum(loaded.scheduler.open_jobs for loaded in self._loaded.values())

    async def start(self) -> None:
        for name in self.settings.asr_preload_models:
            await self.get_model(name)
        for name in self.settings.remote_models:  # cheap, and /health shows their state from the start
            await self.get_model(name)

    def backend_status(self) -> dict[str, dict[str, Any]]:
        """Each remote model's backend as last seen (cached: never waits for the backend)."""
        return {
            name: loaded.engine.status()
            for name, loaded in self._loaded.items()
            if isinstance(loaded.engine, RemoteEngine)
        }

    async def get_model(self, requested: str | None) -> LoadedModel:
        name = self.models.resolve(requested)
        loaded = self._loaded.get(name)
        if loaded is not None:
            self._loaded.move_to_end(name)
            return loaded
        return await self._loading.load(name, lambda: self._load_once(name))

    async def _load_once(self, name: str) -> LoadedModel:
        lock = self._load_locks.setdefault(name, asyncio.Lock())
        async with lock:
            loaded = self._loaded.get(name)
            if loaded is not None:
                return loaded
            if self._closed:
                raise ModelUnavailable("the ASR service is shutting down")
            started = time.perf_counter()
            try:
                loaded = await self._load(name)
            except ModelUnavailable as exc:  # a 503 with the reason; the next request tries again
                self.keeper.load_failed(name, exc.message)
                raise
            if self._closed:  # it shut down meanwhile
                await self._free(loaded, "shutdown")
                raise ModelUnavailable("the ASR service is shutting down")
            self._loaded[name] = loaded
            if not isinstance(loaded.engine, RemoteEngine):
                self.keeper.loaded(name, time.perf_counter() - started)
            await self._evict_over_limit()
            return loaded

    async def _unload_idle(self, name: str) -> bool:
        """The keeper's idle unload: under the model's load lock, and only with nothing in flight or
        queued (a request that arrived meanwhile holds a use: the model stays)."""
        async with self._load_locks.setdefault(name, asyncio.Lock()):
            loaded = self._loaded.get(name)
            if loaded is None or self._closed or isinstance(loaded.engine, RemoteEngine):
                return False
            if self.keeper.in_use(name) or loaded.scheduler.open_jobs or loaded.scheduler.depth:
                return False
            del self._loaded[name]
            await self._free(loaded, "idle")
            return True

    async def _free(self, loaded: LoadedModel, reason: str) -> None:
        """Stop a local model's scheduler and free its weights (in a thread: it may take a while)."""
        await loaded.scheduler.aclose()
        if isinstance(loaded.engine, WhisperEngine):
            engine = loaded.engine

            def free() -> None:
                engine.close()
                return_freed_memory()

            await asyncio.to_thread(free)
        self.keeper.unloaded(loaded.name, reason)

    async def _load(self, name: str) -> LoadedModel:
        remote = self.settings.remote_models.get(name)
        if remote is not None:
            return self._load_remote(name)

        def load() -> WhisperEngine:
            model_dir = self.models.materialize(name)
            return WhisperEngine(
                name,
                model_dir,
                device=self.device.device,
                compute_type=self.device.compute_type,
                cpu_threads=self._threads_per_replica(),
                device_index=self.device.device_index,
                vad=self._vad(),
                neural_vad_filter=self.settings.asr_vad_filter,
                batching=self.settings.asr_batching,
                packing=PackingConfig(
                    enabled=self.settings.asr_pack_windows,
                    gap_s=self.settings.asr_pack_gap_s,
                    max_job_s=self.settings.asr_pack_max_job_s,
                    max_window_s=self.settings.asr_pack_max_window_s,
                    min_waiting=self.settings.asr_pack_min_waiting or self.settings.asr_max_batch + 1,
                    min_saving_s=self.settings.asr_pack_min_saving_s,
                ),
                speech_pad_s=self.settings.asr_speech_pad_ms / 1000.0,
                replicas=self.settings.asr_replicas,
                max_encoder_windows=self.settings.asr_encoder_max_windows,
                guards=self._guards(),
                max_windows_per_call=self.settings.asr_max_batch,
            )

        try:
            engine = await asyncio.to_thread(load)
        except ModelUnavailable:
            raise
        except Exception as exc:
            log.exception("loading model %s failed", name)
            raise ModelUnavailable(f"model {name!r} could not be loaded: {exc}") from exc
        self.models.learn(name, engine.multilingual)
        scheduler = AsrScheduler(
            name,
            engine.transcribe_batch,
            max_batch=self.settings.asr_max_batch,
            max_wait_ms=self.settings.asr_max_wait_ms,
            max_collect_ms=self.settings.asr_max_collect_ms,
            max_queue=self.settings.asr_max_queue,
            metrics=self.metrics,
            max_inflight_batches=self.settings.asr_replicas,
        )
        scheduler.start()
        return LoadedModel(name, engine, scheduler)

    def _threads_per_replica(self) -> int:
        """On the CPU the cores are split between replicas (0 keeps CTranslate2's default)."""
        if self.device.device != "cpu" or self.settings.asr_replicas == 1:
            return self.device.cpu_threads
        cores = self.device.cpu_threads or os.cpu_count() or 1
        return max(1, cores // self.settings.asr_replicas)

    def _vad(self) -> VadConfig:
        """The webrtcvad gate in front of every engine, on its 30 ms frames (``vad_frame_ms`` was removed)."""
        return VadConfig(self.settings.vad_aggressiveness, min_speech_ms=self.settings.vad_min_speech_ms)

    def _guards(self) -> GuardConfig:
        return GuardConfig(
            max_words_per_s=self.settings.asr_guard_max_words_per_s, repeat_min=self.settings.asr_guard_repeat_min
        )

    def _load_remote(self, name: str) -> LoadedModel:
        config = self.settings.remote_models[name]
        engine = build_remote_engine(
            name,
            config,
            vad=self._vad(),
            metrics=self.metrics,
            default_language=self.settings.default_language,
            guards=self._guards(),
        )
        engine.start()
        self.models.learn(name, engine.multilingual)
        scheduler = AsrScheduler(
            name,
            None,
            async_batch_fn=engine.transcribe_batch_async,
            max_inflight_batches=config.max_concurrency,
            max_batch=self.settings.asr_max_batch,
            max_wait_ms=self.settings.asr_max_wait_ms,
            max_collect_ms=self.settings.asr_max_collect_ms,
            max_queue=self.settings.asr_max_queue,
            metrics=self.metrics,
        )
        scheduler.start()
        log.info("model %s is served by %s", name, engine.label)
        return LoadedModel(name, engine, scheduler)

    async def _evict_over_limit(self) -> None:
        # Remote engines hold no weights here: only local models count against the limit.
        def local() -> int:
            return sum(not isinstance(m.engine, RemoteEngine) for m in self._loaded.values())

        while local() > self.settings.max_loaded_models:
            victim_name = next(
                (
                    n
                    for n, m in self._loaded.items()
                    if m.scheduler.depth == 0
                    and m.scheduler.open_jobs == 0
                    and not self.keeper.in_use(n)
                    and not isinstance(m.engine, RemoteEngine)
                ),
                None,
            )
            if victim_name is None:
                return
            victim = self._loaded.pop(victim_name)
            log.info("unloading model %s (max_loaded_models=%d)", victim_name, self.settings.max_loaded_models)
            await self._free(victim, "limit")

    async def transcribe(
        self,
        audio: AudioArray,
        options: TranscriptionOptions,
        *,
        model: str | None = None,
        priority: Priority = Priority.FILE,
        supersede_key: str | None = None,
        stream: bool = False,
    ) -> Transcript:
        """``stream``: a stream's utterance, which starts at its VAD's preroll (tuned on its own:
        tools/eval_parity.py), so no ``asr_lead_silence_ms`` silence goes before it."""
        # A request that named no model and asks for another language: the multilingual fallback.
        model = self.models.for_options(model, options)
        # The use is held from before the lookup until the answer: an idle unload never takes the
        # model from under it, and one that took it just before makes the lookup load it again.
        with self.keeper.use(self.models.resolve(model)):
            return await self._transcribe(audio, options, model, priority, supersede_key, stream)

    async def _transcribe(
        self,
        audio: AudioArray,
        options: TranscriptionOptions,
        model: str | None,
        priority: Priority,
        supersede_key: str | None,
        stream: bool,
    ) -> Transcript:
        loaded = await self.get_model(model)
        self.models.check_options(loaded.name, options)
        partial = priority is Priority.PARTIAL
        return await loaded.scheduler.submit(
            AsrJob(
                audio,
                with_vocabulary(options, self.settings.asr_vocabulary),
                min_window_s=self.settings.asr_partial_window_s
                if partial
                else self.settings.asr_window_s.get(loaded.name, WINDOW_S),
                on_guard="keep" if partial else "redecode",
                lead_s=0.0 if stream else self.settings.asr_lead_silence_ms / 1000.0,
            ),
            priority=priority,
            timeout_s=self.settings.asr_request_timeout_s,
            supersede_key=supersede_key,
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.keeper.aclose()
        await self._loading.settle()
        for loaded in list(self._loaded.values()):
            await loaded.scheduler.aclose()
            if isinstance(loaded.engine, RemoteEngine):
                await loaded.engine.aclose()
        self._loaded.clear()
