"""Embeddings: concurrent requests micro-batched into one llama.cpp call, repeated inputs from an LRU cache.

A request's inputs wait at most ``llm_embedding_batch_window_ms`` for others to join them, then go
to the model in batches of up to ``llm_embedding_max_batch``; texts already embedded (in this
request, a concurrent one or the cache) are computed once. The pending queue is bounded: past
``llm_embedding_max_batch × llm_max_queue`` waiting inputs a request is refused (503).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import numpy as np
import numpy.typing as npt

from mediaserver.errors import Overloaded
from mediaserver.llm.metrics import LlmMetrics

log = logging.getLogger(__name__)

Vector = npt.NDArray[np.float32]
EmbedFn = Callable[[list[str]], Awaitable[list[list[float]]]]


class EmbeddingBatcher:
    def __init__(
        self,
        model: str,
        embed: EmbedFn,
        *,
        window_ms: float,
        max_batch: int,
        max_pending: int,
        cache_entries: int,
        metrics: LlmMetrics,
    ) -> None:
        self.model = model
        self._embed = embed
        self._window_s = window_ms / 1000.0
        self._max_batch = max_batch
        self._max_pending = max_pending
        self._cache_entries = cache_entries
        self._cache: OrderedDict[str, Vector] = OrderedDict()
        self._metrics = metrics
        self._pending: OrderedDict[str, asyncio.Future[Vector]] = OrderedDict()
        self._worker: asyncio.Task[None] | None = None
        self.calls = 0  # llama.cpp embedding calls made (tests compare it with the inputs sent)

    def _cached(self, text: str) -> Vector | None:
        vector = self._cache.get(text)
        if vector is not None:
            self._cache.move_to_end(text)
        return vector

    def _remember(self, text: str, vector: Vector) -> None:
        if self._cache_entries <= 0:
            return
        self._cache[text] = vector
        self._cache.move_to_end(text)
        while len(self._cache) > self._cache_entries:
            self._cache.popitem(last=False)

    async def embed(self, texts: list[str]) -> list[Vector]:
        """One unit vector per text, in order."""
        results: dict[str, Vector | asyncio.Future[Vector]] = {}
        new = 0
        for text in dict.fromkeys(texts):
            cached = self._cached(text)
            if cached is not None:
                results[text] = cached
            elif text in self._pending:
                results[text] = self._pending[text]
            else:
                new += 1
        if new and len(self._pending) + new > self._max_pending:
            raise Overloaded(
                f"the embedding queue is full ({len(self._pending)} inputs waiting, "
                f"llm_embedding_max_batch × llm_max_queue = {self._max_pending}); retry later"
            )
        loop = asyncio.get_running_loop()
        for text in dict.fromkeys(texts):
            if text not in results:
                future: asyncio.Future[Vector] = loop.create_future()
                # A failed batch fails every input; a request stops awaiting at its first failure, so
                # the rest would each log "exception was never retrieved" (a fault trial: 7 tracebacks).
                future.add_done_callback(_retrieve)
                self._pending[text] = future
                results[text] = future
        hits = sum(1 for t in texts if isinstance(results[t], np.ndarray))
        self._metrics.embedding_inputs.labels(self.model, "hit").inc(hits)
        self._metrics.embedding_inputs.labels(self.model, "miss").inc(len(texts) - hits)
        if self._pending and (self._worker is None or self._worker.done()):
            self._worker = asyncio.create_task(self._drain())
        out: list[Vector] = []
        for text in texts:
            item = results[text]
            # shield: one request giving up must not cancel an input another request shares.
            out.append(item if isinstance(item, np.ndarray) else await asyncio.shield(item))
        return out

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(self._window_s)
            batch = list(self._pending.items())[: self._max_batch]
            texts = [text for text, _ in batch]
            self.calls += 1
            self._metrics.embedding_batch_size.labels(self.model).observe(len(texts))
            try:
                vectors = await self._embed(texts)
            except Exception as exc:
                log.exception("embedding batch of %d failed", len(texts))
                for text, future in batch:
                    self._pending.pop(text, None)
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (text, future), values in zip(batch, vectors, strict=True):
                vector = np.asarray(values, dtype=np.float32)
                vector.flags.writeable = False
                self._remember(text, vector)
                self._pending.pop(text, None)
                if not future.done():
                    future.set_result(vector)

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()


def _retrieve(future: asyncio.Future[Vector]) -> None:
    """Mark a failed input's exception as seen (whoever awaits it still gets it raised)."""
    if not future.cancelled():
        future.exception()
