"""TTS metrics, registered once in the app's Prometheus registry (``mediaserver.metrics.Metrics``)."""

from __future__ import annotations

import weakref

from prometheus_client import Counter, Gauge, Histogram

from mediaserver.metrics import Metrics

_BY_METRICS: weakref.WeakKeyDictionary[Metrics, TtsMetrics] = weakref.WeakKeyDictionary()


class TtsMetrics:
    def __init__(self, metrics: Metrics) -> None:
        registry = metrics.registry
        self.requests = Counter(
            "mediaserver_tts_requests",
            "TTS requests by voice and outcome (ok, cancelled, error)",
            ["voice", "outcome"],
            registry=registry,
        )
        self.characters = Counter("mediaserver_tts_characters", "Characters synthesized", ["voice"], registry=registry)
        self.audio_seconds = Counter(
            "mediaserver_tts_audio_seconds", "Seconds of speech synthesized", ["voice"], registry=registry
        )
        self.sentences = Counter("mediaserver_tts_sentences", "Sentences synthesized", ["voice"], registry=registry)
        self.dropped_sentences = Counter(
            "mediaserver_tts_dropped_sentences",
            "Sentences dropped unsynthesized because their request ended (client gone, barge-in)",
            ["voice"],
            registry=registry,
        )
        self.first_audio_seconds = Histogram(
            "mediaserver_tts_time_to_first_audio_seconds",
            "From a request's start to its first audio",
            ["voice"],
            buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30),
            registry=registry,
        )
        self.real_time_factor = Histogram(
            "mediaserver_tts_real_time_factor",
            "Synthesis time divided by the audio's duration, per sentence (below 1 is faster than real time)",
            ["voice"],
            buckets=(0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5),
            registry=registry,
        )
        self.synthesis_seconds = Histogram(
            "mediaserver_tts_synthesis_seconds",
            "Engine time per sentence",
            ["voice"],
            buckets=(0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
            registry=registry,
        )
        self.queue_depth = Gauge(
            "mediaserver_tts_queue_depth",
            "Open TTS requests per voice (waiting or speaking)",
            ["voice"],
            registry=registry,
        )
        self.rejected = Counter(
            "mediaserver_tts_rejected",
            "TTS requests refused because the voice's queue was full",
            ["voice"],
            registry=registry,
        )
        self.cache = Counter(
            "mediaserver_tts_cache", "TTS cache lookups by result (hit, miss, bypass)", ["result"], registry=registry
        )
        self.cache_bytes = Gauge("mediaserver_tts_cache_bytes", "Bytes held by the TTS cache", registry=registry)
        self.cache_entries = Gauge("mediaserver_tts_cache_entries", "Entries in the TTS cache", registry=registry)

    @classmethod
    def of(cls, metrics: Metrics) -> TtsMetrics:
        """The TTS metrics of ``metrics``' registry, created on first use (services may share one)."""
        found = _BY_METRICS.get(metrics)
        if found is None:
            found = _BY_METRICS[metrics] = cls(metrics)
        return found
