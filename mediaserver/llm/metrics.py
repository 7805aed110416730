"""Prometheus metrics of the LLM stage, registered in the app's ``Metrics`` registry.

One set per registry (tests run several apps on one shared service and registry).
"""

from __future__ import annotations

import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mediaserver.metrics import Metrics

_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, LlmMetrics] = weakref.WeakKeyDictionary()


class LlmMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "mediaserver_llm_requests",
            "LLM generations by model, backend and outcome (ok, cancelled, error, timeout, rejected)",
            ["model", "backend", "outcome"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "mediaserver_llm_prompt_tokens", "Prompt tokens of finished generations", ["model"], registry=registry
        )
        self.cached_prompt_tokens = Counter(
            "mediaserver_llm_cached_prompt_tokens",
            "Prompt tokens the engine took from its prompt cache instead of evaluating them",
            ["model"],
            registry=registry,
        )
        self.completion_tokens = Counter(
            "mediaserver_llm_completion_tokens", "Tokens generated", ["model"], registry=registry
        )
        self.time_to_first_token = Histogram(
            "mediaserver_llm_time_to_first_token_seconds",
            "From admission (after the queue) to the first text delta",
            ["model"],
            buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=registry,
        )
        self.queue_wait = Histogram(
            "mediaserver_llm_queue_wait_seconds",
            "Time a generation waited for its model",
            ["model"],
            buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60),
            registry=registry,
        )
        self.tokens_per_second = Histogram(
            "mediaserver_llm_tokens_per_second",
            "Generation speed after the first token, per request",
            ["model"],
            buckets=(1, 5, 10, 20, 50, 100, 200, 500, 1000),
            registry=registry,
        )
        self.queue_depth = Gauge(
            "mediaserver_llm_queue_depth", "Generations waiting for their model", ["model"], registry=registry
        )
        self.slots = Gauge(
            "mediaserver_llm_slots", "Generations a model runs at once (llm_slots)", ["model"], registry=registry
        )
        self.slots_busy = Gauge("mediaserver_llm_slots_busy", "Generations running now", ["model"], registry=registry)
        self.recent_tokens_per_second = Gauge(
            "mediaserver_llm_recent_tokens_per_second",
            "Tokens generated per second by all of a model's generations over the last 10 s (as of the last token)",
            ["model"],
            registry=registry,
        )
        self.prefills = Counter(
            "mediaserver_llm_prefills",
            "System prompts evaluated ahead of a conversation's first turn (a voice-loop or Realtime session's)",
            ["model"],
            registry=registry,
        )
        self.engine_restarts = Counter(
            "mediaserver_llm_engine_restarts",
            "Restarts of a model's llama-server engine after it exited",
            ["model"],
            registry=registry,
        )
        self.embedding_inputs = Counter(
            "mediaserver_llm_embedding_inputs",
            "Embedding inputs by cache result (hit, miss)",
            ["model", "cache"],
            registry=registry,
        )
        self.embedding_batch_size = Histogram(
            "mediaserver_llm_embedding_batch_size",
            "Inputs per llama.cpp embedding call (micro-batched across requests)",
            ["model"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=registry,
        )

    @classmethod
    def of(cls, metrics: Metrics) -> LlmMetrics:
        found = _BY_REGISTRY.get(metrics.registry)
        if found is None:
            found = _BY_REGISTRY[metrics.registry] = cls(metrics.registry)
        return found
