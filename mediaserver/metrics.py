"""Prometheus metrics, one registry per app so tests can run several apps in one process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "mediaserver_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.audio_seconds = Counter(
            "mediaserver_audio_seconds",
            "Seconds of audio received for ASR",
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
        self.sessions = Gauge(
            "mediaserver_sessions", "Open streaming sessions (WebRTC, WebSocket, Realtime)", registry=self.registry
        )
        self.rejected = Counter(
            "mediaserver_asr_rejected",
            "ASR jobs refused because the queue was full",
            ["model"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
