"""Prometheus metrics, one registry per app so tests can run several apps in one process."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests_in_flight = Gauge(
            "mediaserver_requests_in_flight",
            "HTTP requests being handled now, by route (a WebSocket counts while it is open)",
            ["route"],
            registry=self.registry,
        )
        self.requests = Counter(
            "mediaserver_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.failed_after_headers = Counter(
            "mediaserver_responses_failed_after_headers",
            "Streamed HTTP responses that failed after their status line went out (an SSE stream ended by an "
            "error event, an audio stream cut short), by route and error code; mediaserver_requests_total counts "
            "them with the status the client got",
            ["route", "code"],
            registry=self.registry,
        )
        self.audio_seconds = Counter(
            "mediaserver_audio_seconds",
            "Seconds of audio received for ASR, by route: uploads (openai, asr, willow ...), streams (ws, rtc, "
            "realtime) and wyoming",
            ["route"],
            registry=self.registry,
        )
        self.inference_seconds = Histogram(
            "mediaserver_inference_seconds",
            "Engine time per ASR batch",
            ["model"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.queue_wait_seconds = Histogram(
            "mediaserver_asr_queue_wait_seconds",
            "Time an ASR job waited before its batch ran",
            ["model"],
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "mediaserver_asr_batch_size",
            "Jobs per ASR batch",
            ["model"],
            buckets=(1, 2, 4, 8, 16, 32),
            registry=self.registry,
        )
        self.queue_depth = Gauge("mediaserver_asr_queue_depth", "ASR jobs waiting", ["model"], registry=self.registry)
        self.wyoming_connections = Gauge(
            "mediaserver_wyoming_connections",
            "Open Wyoming connections (Home Assistant, satellites)",
            registry=self.registry,
        )
        self.wyoming_errors = Counter(
            "mediaserver_wyoming_errors",
            "Error events sent to Wyoming clients, by code (voice_not_found, text_too_long, audio_buffer_full ...)",
            ["code"],
            registry=self.registry,
        )
        self.wake_detections = Counter(
            "mediaserver_wake_detections",
            "Wake words heard, by route (wyoming, ws, rtc) and wake word",
            ["route", "name"],
            registry=self.registry,
        )
        self.sessions = Gauge(
            "mediaserver_sessions", "Open streaming sessions (WebRTC, WebSocket, Realtime)", registry=self.registry
        )
        self.rejected = Counter(
            "mediaserver_asr_rejected",
            "ASR jobs refused because the queue was full",
            ["model"],
            registry=self.registry,
        )

        self.stream_dropped = Counter(
            "mediaserver_stream_utterances_dropped",
            "Utterances of a streaming session dropped with an `overloaded` error: stream_max_pending_finals "
            "of its finals were already waiting",
            registry=self.registry,
        )
        self.backend_requests = Counter(
            "mediaserver_asr_backend_requests",
            "Requests to remote ASR backends by model, backend kind and outcome (ok, error, timeout, unreachable)",
            ["model", "backend", "outcome"],
            registry=self.registry,
        )
        self.backend_seconds = Histogram(
            "mediaserver_asr_backend_seconds",
            "Time of one request to a remote ASR backend",
            ["model", "backend"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=self.registry,
        )
        self.backend_up = Gauge(
            "mediaserver_asr_backend_up",
            "1 when the remote ASR backend answered its last probe or request, else 0",
            ["model", "backend"],
            registry=self.registry,
        )
        # --- semantic end of turn (mediaserver/turns) and speculative answers ---
        self.turn_decision_seconds = Histogram(
            "mediaserver_turn_decision_seconds",
            "Time from a pause being scored to the turn model's answer (features, queue, inference), by outcome",
            ["outcome"],
            buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2),
            registry=self.registry,
        )
        self.turn_batch_size = Histogram(
            "mediaserver_turn_batch_size", "Pauses per turn-model batch", buckets=(1, 2, 4, 8), registry=self.registry
        )
        self.turn_unfinished_words = Counter(
            "mediaserver_turn_unfinished_words",
            "Pauses whose transcript reads unfinished (it ends on turn_unfinished_words or "
            "turn_unfinished_endings): the turn went on whatever the turn model scored",
            registry=self.registry,
        )
        self.turn_ends = Counter(
            "mediaserver_turn_ends",
            "Semantic turns ended, by what decided: model (the turn model's score with the words), words (a "
            "finished sentence's pause reached turn_finished_silence_ms), silence (the model failed on the pause), "
            "text (turn_text_model vetoed the pause's end and it reached turn_text_hold_ms), "
            "cap (nothing decided: the eagerness cap ended it; should be rare)",
            ["by"],
            registry=self.registry,
        )
        self.turn_model_failures = Counter(
            "mediaserver_turn_model_failures",
            "Pauses the turn model failed to score (they end as silence detection would)",
            registry=self.registry,
        )
        self.turn_text_failures = Counter(
            "mediaserver_turn_text_failures",
            "Pauses whose words the LLM engine could not score for turn_text_model (not running, restarting, "
            "too slow, an error): judged without the text",
            registry=self.registry,
        )
        self.turn_text_seconds = Histogram(
            "mediaserver_turn_text_seconds",
            "turn_text_model: the time to score a pause's words on the LLM engine",
            buckets=(0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0),
            registry=self.registry,
        )
        self.echo_auto = Counter(
            "mediaserver_echo_auto_decisions",
            "echo_cancellation auto: streams whose microphone was found to carry the answers' echo (echo: the "
            "canceller's output is used) or none (none: the microphone passes uncancelled); docs/echo.md",
            ["found"],
            registry=self.registry,
        )
        self.echo_delay_changes = Counter(
            "mediaserver_echo_delay_changes",
            "Server echo cancellation: the echo's delay moved mid-stream and the delay tracker re-aligned the answer "
            "audio to it (moved: a later echo) or found the canceller on it by itself (followed); docs/echo.md",
            ["change"],
            registry=self.registry,
        )
        self.speculative_answers = Counter(
            "mediaserver_speculative_answers",
            "Answers started before the turn ended: hit (the turn ended: sent) or miss (speech resumed: dropped)",
            ["result"],
            registry=self.registry,
        )

        # --- models in memory: idle unload (*_keep_alive_s) and cold loads (mediaserver/keep_alive.py) ---
        self.model_loaded = Gauge(
            "mediaserver_model_loaded",
            "1 while the model is in memory, 0 once it was unloaded (idle past its *_keep_alive_s, or evicted); "
            "by engine (asr, tts, llm, embedding) and model",
            ["engine", "model"],
            registry=self.registry,
        )
        self.model_load_seconds = Histogram(
            "mediaserver_model_load_seconds",
            "Time to load a model (a cold start: the request that needed it waited this long), by engine and model",
            ["engine", "model"],
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.model_load_failures = Counter(
            "mediaserver_model_load_failures",
            "Loads that failed (the request got a 503 with the reason; the next request tries again)",
            ["engine", "model"],
            registry=self.registry,
        )
        self.model_unloads = Counter(
            "mediaserver_model_unloads",
            "Models unloaded, by engine, model and reason (idle: unused for its *_keep_alive_s; limit: evicted by "
            "max_loaded_models or tts_max_loaded_voices)",
            ["engine", "model", "reason"],
            registry=self.registry,
        )

    def watch_engines(self, source: Callable[[], Mapping[str, Mapping[str, int]]]) -> None:
        """Expose each loaded engine's decode counters (read at scrape time, nothing on the hot path)."""
        self.registry.register(_EngineCounters(source))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCounters(Collector):
    """``mediaserver_asr_windows_total{model, kind}``: windows decoded, how many were short (under
    30 s) or packed, how many short ones were decoded again on 30 s (``short_window_retries``),
    and how often packed jobs had to be decoded again (repacked, then alone) or fell back to
    faster-whisper's sequential loop. ``mediaserver_asr_jobs_total{model, packing}``: jobs decoded
    in a window shared with other jobs (``packed``) or in windows of their own (``alone``)."""

    def __init__(self, source: Callable[[], Mapping[str, Mapping[str, int]]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        windows = CounterMetricFamily(
            "mediaserver_asr_windows",
            "Engine decode counters by model and kind (windows, short_windows, short_window_retries, packed_windows, "
            "repacked, unpack_retries, sequential, window_fallbacks, abandoned: not decoded, the caller gone)",
            labels=["model", "kind"],
        )
        jobs = CounterMetricFamily(
            "mediaserver_asr_jobs",
            "ASR jobs by model and packing (packed: shared a 30 s window with other jobs; alone: did not)",
            labels=["model", "packing"],
        )
        guards = CounterMetricFamily(
            "mediaserver_asr_guard",
            "Decodes that tripped a loop or hallucination guard, by model, reason (repetition, speaking_rate, "
            "no_speech) and action (redecode: a final or upload decoded again safely; keep: a partial, dropped)",
            labels=["model", "reason", "action"],
        )
        for model, counters in self._source().items():
            for kind, value in dict(counters).items():
                if kind.startswith("jobs_"):
                    jobs.add_metric([model, kind.removeprefix("jobs_")], value)
                elif kind.startswith("guard_"):
                    action, _, reason = kind.removeprefix("guard_").partition("_")
                    guards.add_metric([model, reason, action], value)
                else:
                    windows.add_metric([model, kind], value)
        yield windows
        yield jobs
        yield guards
