"""Smart Turn v3.2 on onnxruntime: the probability that a pause ends the speaker's turn.

One worker thread per model runs every inference, so the event loop never waits on it. Pauses of
several sessions that arrive while an inference runs are scored together in the next batch (up to
``turn_batch_max``): one batched run costs much less than the same windows one by one. Each score
reports its feature and inference times, the cost of one decision.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort

from mediaserver.batches import ThreadBatches
from mediaserver.config import Settings
from mediaserver.config.keep_alive import NEVER
from mediaserver.events import AudioArray
from mediaserver.keep_alive import WorkerModel
from mediaserver.metrics import Metrics
from mediaserver.turns.features import log_mel
from mediaserver.turns.fetch import default_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnScore:
    probability: float  # of a finished turn
    features_ms: float  # this window's features
    inference_ms: float  # the whole batch's inference
    batch: int  # windows in that batch


class TurnModel:
    """Smart Turn on its worker thread. Its onnxruntime session is opened at construction (a broken
    file fails here) and, with ``keep_alive_s`` >= 0 (``turn_keep_alive_s``), closed once unused that
    long and opened again by the next pause scored (keep_alive.WorkerModel)."""

    def __init__(
        self,
        path: Path,
        *,
        threads: int = 1,
        batch_max: int = 8,
        keep_alive_s: float = NEVER,
        metrics: Metrics | None = None,
    ) -> None:
        self.path = path
        self.threads = threads
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="turn-model")
        started = time.perf_counter()
        session = self._open()
        self.weights: WorkerModel[ort.InferenceSession] = WorkerModel(
            "turn", path.stem, self._open, keep_alive_s, metrics or Metrics(), self._executor
        )
        self.weights.loaded_at_start(session, time.perf_counter() - started)
        self._batches: ThreadBatches[AudioArray, TurnScore] = ThreadBatches(
            self._executor, batch_max, lambda windows: self.score_now(windows)
        )

    def _open(self) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(str(self.path), sess_options=options, providers=["CPUExecutionProvider"])

    def score_now(self, windows: list[AudioArray]) -> list[TurnScore]:
        """Score ``windows`` in one batch on the calling thread (benchmarks; the server uses ``score``)."""
        started = time.perf_counter()
        features = [log_mel(audio) for audio in windows]
        features_ms = (time.perf_counter() - started) * 1000.0 / max(1, len(windows))
        session = self.weights.get()  # opened again here if it idled out
        started = time.perf_counter()
        output = session.run(None, {session.get_inputs()[0].name: np.stack(features)})[0]
        inference_ms = (time.perf_counter() - started) * 1000.0
        probabilities = np.asarray(output, dtype=np.float64).reshape(-1)
        return [TurnScore(float(p), features_ms, inference_ms, len(windows)) for p in probabilities]

    async def score(self, audio: AudioArray) -> TurnScore:
        """The probability that the turn whose audio so far is ``audio`` (16 kHz, ending in the
        pause) is finished, computed on the model's thread."""
        with self.weights.use():  # no idle close while it waits
            return await self._batches.submit(audio)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def aclose(self) -> None:
        await self.weights.aclose()
        self.close()


def model_path(settings: Settings) -> Path:
    return settings.turn_model_path or default_path()


_shared: dict[tuple[Path, int, int, float], TurnModel | None] = {}


def _key(settings: Settings) -> tuple[Path, int, int, float]:
    return (model_path(settings), settings.turn_threads, settings.turn_batch_max, settings.turn_keep_alive_s)


def load_shared(settings: Settings, metrics: Metrics | None = None) -> TurnModel | None:
    """The server's turn model (loaded once per path and settings; blocking: call it off the event
    loop), or None, with a log line saying why, when the file is missing or unreadable. Its loads
    and unloads count in ``metrics`` (the first caller's)."""
    key = _key(settings)
    if key in _shared:
        return _shared[key]
    path = key[0]
    model: TurnModel | None = None
    if not path.is_file():
        log.warning(
            "turn model %s is missing: semantic end of turn is off, every utterance ends on silence "
            "(fetch it with `make setup` or `python -m mediaserver.turns.fetch`)",
            path,
        )
    else:
        try:
            model = TurnModel(
                path,
                threads=settings.turn_threads,
                batch_max=settings.turn_batch_max,
                keep_alive_s=settings.turn_keep_alive_s,
                metrics=metrics,
            )
            log.info("turn model Smart Turn v3.2 loaded from %s (%d thread(s))", path, settings.turn_threads)
        except Exception as exc:
            log.warning("turn model %s could not be loaded (%s): semantic end of turn is off", path, exc)
    _shared[key] = model
    return model


def mode_for(wanted: Literal["auto", "silence", "semantic"], *, answering: bool) -> Literal["silence", "semantic"]:
    """The turn mode ``wanted`` (a session's, or the ``turn_detection`` setting) means for a stream:
    ``auto`` is semantic where the server answers (the voice loop), silence where it only transcribes."""
    if wanted == "auto":
        return "semantic" if answering else "silence"
    return wanted


def status(settings: Settings) -> dict[str, object]:
    """What ``/health`` says of turns: the default mode (``turn_detection``), the mode it runs as
    (silence without the model; ``auto`` as such), the mode each kind of stream gets by default
    (``auto``: semantic for the voice loop, silence for transcription), whether the model is
    loaded, and from where."""
    model = shared(settings)
    loaded = model is not None

    def in_force(answering: bool) -> str:
        return mode_for(settings.turn_detection, answering=answering) if loaded else "silence"

    return {
        "default": settings.turn_detection,
        "default_in_force": settings.turn_detection if loaded else "silence",
        "default_for": {"voice_loop": in_force(True), "transcription": in_force(False)},
        # Usable (the file opened at start); "in_memory" says whether it is open now (turn_keep_alive_s).
        "model_loaded": loaded,
        "in_memory": model is not None and model.weights.loaded,
        "model_path": str(model_path(settings)),
    }


def shared(settings: Settings) -> TurnModel | None:
    """The turn model ``load_shared`` loaded for these settings, without loading it (None if not)."""
    return _shared.get(_key(settings))
