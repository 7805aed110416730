"""Requests from the event loop, run in batches on one worker thread (the turn model, the speaker
encoder): requests that arrive while a batch runs wait together for the next one (up to
``batch_max``), since one batched run costs much less than the same inputs one by one. The event
loop never waits on the thread; each request's own result, or its own error, comes back to it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


@dataclass
class _Request(Generic[In, Out]):
    item: In
    future: asyncio.Future[Out]
    loop: asyncio.AbstractEventLoop


class ThreadBatches(Generic[In, Out]):
    """``run`` takes a batch of inputs on the worker thread and gives one result or exception per
    input (an exception it raises is every input's)."""

    def __init__(
        self, executor: Executor, batch_max: int, run: Callable[[list[In]], Sequence[Out | BaseException]]
    ) -> None:
        self._executor = executor
        self._batch_max = max(1, batch_max)
        self._run = run
        self._lock = threading.Lock()
        self._queue: list[_Request[In, Out]] = []
        self._draining = False

    async def submit(self, item: In) -> Out:
        loop = asyncio.get_running_loop()
        request: _Request[In, Out] = _Request(item, loop.create_future(), loop)
        with self._lock:
            self._queue.append(request)
            start = not self._draining
            self._draining = True
        if start:
            self._executor.submit(self._drain)
        return await request.future

    def _drain(self) -> None:
        while True:
            with self._lock:
                batch = [r for r in self._queue[: self._batch_max] if not r.future.done()]  # not cancelled
                del self._queue[: self._batch_max]
                if not batch and not self._queue:
                    self._draining = False
                    return
            if not batch:
                continue
            results: Sequence[Out | BaseException]
            try:
                results = self._run([r.item for r in batch])
            except Exception as exc:  # a broken model, say: every waiting request hears of it
                results = [exc] * len(batch)
            for request, result in zip(batch, results, strict=True):
                request.loop.call_soon_threadsafe(_settle, request.future, result)


def _settle(future: asyncio.Future[Out], result: Out | BaseException) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
