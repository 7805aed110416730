"""One shared queue per loaded model, drained by a worker thread in batches.

Jobs from every session and transport land here. The worker takes the most urgent job and keeps
collecting while more arrive: it stops when ``max_wait_ms`` pass with no new job, when the batch
has lingered ``max_collect_ms`` in all, or when the most urgent job's slack would run out, and hands
up to ``max_batch`` jobs to the engine in one call. A lone request waits ``max_wait_ms`` at most; a
burst of requests (many clients answering at once) is gathered into one full batch instead of
being split into a small batch and a leftover. The queue is bounded: when it is full a new job
is refused at once (Overloaded → 503) rather than waiting behind an ever-growing backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from mediaserver.asr.engine import AsrJob
from mediaserver.errors import Overloaded, Timeout
from mediaserver.events import Priority, Transcript
from mediaserver.metrics import Metrics

log = logging.getLogger(__name__)

# (jobs, backlog): the jobs of one batch and how many more wait behind them.
BatchFn = Callable[[Sequence[AsrJob], int], list[Transcript | BaseException]]
# The same for a remote engine, awaited on the event loop (asr/remote.py).
AsyncBatchFn = Callable[[Sequence[AsrJob], int], Awaitable[list[Transcript | BaseException]]]


class DeadlineExceeded(Timeout):
    """The job's deadline passed before it was transcribed (a 504 ``timeout`` for every transport)."""


class Superseded(Exception):
    """A newer job with the same supersede key (newer audio of the same stream) replaced this one."""


@dataclass(order=True)
class _Pending:
    priority: int
    deadline: float
    seq: int
    job: AsrJob = field(compare=False)
    future: asyncio.Future[Transcript] = field(compare=False)
    enqueued_at: float = field(compare=False, default=0.0)
    supersede_key: str | None = field(compare=False, default=None)
    started: bool = field(compare=False, default=False)
    popped: bool = field(compare=False, default=False)  # taken out of the queue by the worker
    dead: bool = field(compare=False, default=False)  # done (withdrawn, superseded) while still queued
    started_at: float = field(compare=False, default=0.0)  # when its batch was handed to the engine


class AsrScheduler:
    """The queue in front of one engine, and the single worker thread that runs it.

    It owns the pending jobs (a bounded priority queue: finals before partials before files, then
    by deadline), the batching decision (how long to keep collecting), and the engine's thread, so
    jobs from any number of sessions reach the model in batches and never concurrently. Cancelling
    a caller withdraws its job; a newer partial of the same stream supersedes an older one.

    A remote engine gives ``async_batch_fn`` instead of ``batch_fn``: its batches are awaited on the
    event loop, up to ``max_inflight_batches`` at once (the backend does the work, so the next batch
    need not wait for the last), and a batch whose callers have all gone is cancelled, which
    cancels its upstream requests. A local engine with several replicas runs up to
    ``max_inflight_batches`` batches at once too, each in a thread of its own.
    """

    def __init__(
        self,
        model_name: str,
        batch_fn: BatchFn | None,
        *,
        max_batch: int = 8,
        max_wait_ms: float = 5.0,
        max_collect_ms: float = 50.0,
        max_queue: int = 64,
        metrics: Metrics | None = None,
        async_batch_fn: AsyncBatchFn | None = None,
        max_inflight_batches: int = 1,
    ) -> None:
        if (batch_fn is None) == (async_batch_fn is None):
            raise ValueError("give exactly one of batch_fn and async_batch_fn")
        self.model_name = model_name
        self._batch_fn = batch_fn
        self._async_batch_fn = async_batch_fn
        self._inflight = asyncio.Semaphore(max_inflight_batches)
        self._max_inflight_batches = max_inflight_batches
        self._inflight_tasks: set[asyncio.Task[None]] = set()
        self._max_batch = max_batch
        self._max_wait_s = max_wait_ms / 1000.0
        self._max_collect_s = max(max_collect_ms, max_wait_ms) / 1000.0
        self._max_queue = max_queue
        self._metrics = metrics
        self._queue: asyncio.PriorityQueue[_Pending] = asyncio.PriorityQueue()
        self._seq = itertools.count()
        self._concurrent = async_batch_fn is not None or max_inflight_batches > 1
        workers = max_inflight_batches if batch_fn is not None else 1
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"asr-{model_name}")
        self._worker: asyncio.Task[None] | None = None
        self._closed = False
        self._latest: dict[str, _Pending] = {}
        self.open_jobs = 0  # callers waiting in submit (a caller that went away is not counted)
        # Queued jobs nobody waits for any more (the caller hung up, was superseded or timed out):
        # they stay in the queue until the worker reaches them, but take no room in it.
        self._dead = 0
        self.batches_run = 0
        self.last_batch_size = 0
        # Smoothed engine time of one batch: the slack a job needs to still meet its deadline.
        self.estimated_batch_s = 1.0

    @property
    def depth(self) -> int:
        """Jobs queued that someone still waits for."""
        return self._queue.qsize() - self._dead

    def _on_done(self, pending: _Pending) -> None:
        if not pending.popped and not pending.dead:
            pending.dead = True
            self._dead += 1

    def _popped(self, items: list[_Pending]) -> None:
        for item in items:
            item.popped = True
            if item.dead:
                item.dead = False
                self._dead -= 1

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name=f"asr-scheduler-{self.model_name}")

    async def submit(
        self,
        job: AsrJob,
        *,
        priority: Priority = Priority.FILE,
        timeout_s: float = 300.0,
        supersede_key: str | None = None,
    ) -> Transcript:
        """Queue a job and wait for its transcript; cancelling the caller withdraws the job.

        With ``supersede_key`` (a stream's partials use their session id), a newer job replaces an
        older one of the same key that has not started yet: the older caller gets ``Superseded``.
        """
        if self._closed:
            raise Overloaded("the ASR service is shutting down")
        if self.depth >= self._max_queue:
            if self._metrics:
                self._metrics.rejected.labels(self.model_name).inc()
            raise Overloaded(
                f"server overloaded: {self.depth} ASR jobs are already queued for model "
                f"{self.model_name!r}; retry later",
                retry_after_s=self.drain_estimate_s(),
            )
        self.start()
        now = time.monotonic()
        abandoned = threading.Event()  # the engine stops decoding a job nobody waits for (AsrJob.abandoned)
        job = replace(job, abandoned=abandoned)
        future: asyncio.Future[Transcript] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda done: abandoned.set() if done.cancelled() else None)
        pending = _Pending(int(priority), now + timeout_s, next(self._seq), job, future, now, supersede_key)
        future.add_done_callback(lambda _: self._on_done(pending))
        if supersede_key is not None:
            older = self._latest.get(supersede_key)
            if older is not None and not older.started and not older.future.done():
                older.future.set_exception(Superseded(f"superseded by newer audio of {supersede_key!r}"))
            self._latest[supersede_key] = pending
        self._queue.put_nowait(pending)
        self._update_depth()
        self.open_jobs += 1
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except TimeoutError as exc:
            if isinstance(exc, Timeout):  # the engine's own (a remote backend's), not this wait's
                raise
            future.cancel()
            raise DeadlineExceeded(
                f"the transcription did not finish within {timeout_s:g} s (model {self.model_name!r}); retry later"
            ) from None
        finally:
            self.open_jobs -= 1
            if supersede_key is not None and self._latest.get(supersede_key) is pending:
                del self._latest[supersede_key]

    def drain_estimate_s(self) -> float:
        """How long the jobs queued now take to run: batches of ``max_batch`` at the measured batch
        time, ``max_inflight_batches`` at once (a remote engine). What a refused client is told to
        wait (``Retry-After``): then its job finds room."""
        batches = -(-self.depth // self._max_batch)
        rounds = -(-max(1, batches) // self._max_inflight_batches)
        return rounds * self.estimated_batch_s

    def _update_depth(self) -> None:
        if self._metrics:
            self._metrics.queue_depth.labels(self.model_name).set(self.depth)

    async def _collect(self) -> list[_Pending]:
        first = await self._queue.get()
        batch = [first]
        # Wait for more only while the most urgent job still has slack to run after the wait.
        collect_until = min(time.monotonic() + self._max_collect_s, first.deadline - self.estimated_batch_s)
        while len(batch) < self._max_batch:
            try:
                batch.append(self._queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            now = time.monotonic()
            remaining = min(now + self._max_wait_s, collect_until) - now
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    batch.append(await self._queue.get())
            except TimeoutError:
                break
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        concurrent = self._concurrent
        while True:
            if concurrent:  # collect once a batch can be sent: what waits meanwhile joins it
                await self._inflight.acquire()
            batch = await self._collect()
            self._popped(batch)
            self._update_depth()
            now = time.monotonic()
            live: list[_Pending] = []
            for item in batch:
                if item.future.done():  # caller went away or timed out
                    continue
                if item.deadline <= now:
                    item.future.set_exception(
                        DeadlineExceeded(
                            f"the transcription did not start before its deadline (model {self.model_name!r}); "
                            "retry later"
                        )
                    )
                    continue
                item.started = True
                item.started_at = now
                live.append(item)
            if not live:
                if concurrent:
                    self._inflight.release()
                continue
            if self._metrics:
                for item in live:
                    self._metrics.queue_wait_seconds.labels(self.model_name).observe(now - item.enqueued_at)
                self._metrics.batch_size.labels(self.model_name).observe(len(live))
            if concurrent:
                run = (
                    self._run_remote(live) if self._async_batch_fn is not None else self._run_local(live, release=True)
                )
                task = loop.create_task(run, name=f"asr-batch-{self.model_name}")
                self._inflight_tasks.add(task)
                task.add_done_callback(self._inflight_tasks.discard)
                continue
            await self._run_local(live)

    async def _run_local(self, live: list[_Pending], *, release: bool = False) -> None:
        """One batch on the local engine's thread; ``release`` frees its in-flight slot after."""
        assert self._batch_fn is not None
        started = time.perf_counter()
        try:
            try:
                results = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._batch_fn, [item.job for item in live], self.depth
                )
            except Exception as exc:
                log.exception("ASR batch failed on model %s", self.model_name)
                results = [exc] * len(live)
            self._finish(live, results, time.perf_counter() - started)
        except asyncio.CancelledError:  # shutting down: nobody waits on this batch any more
            for item in live:
                if item.job.abandoned is not None:
                    item.job.abandoned.set()  # the engine's thread stops at its next window
                if not item.future.done():
                    item.future.set_exception(Overloaded("the ASR service is shutting down"))
            raise
        finally:
            if release:
                self._inflight.release()

    async def _run_remote(self, live: list[_Pending]) -> None:
        """One batch of a remote engine; cancelled (with its upstream requests) once no caller waits."""
        assert self._async_batch_fn is not None
        task = asyncio.current_task()
        waiting = len(live)
        finishing = False

        def caller_gone(_: asyncio.Future[Transcript]) -> None:
            nonlocal waiting
            waiting -= 1
            if waiting == 0 and not finishing and task is not None:
                task.cancel()

        for item in live:
            item.future.add_done_callback(caller_gone)
        started = time.perf_counter()
        try:
            try:
                results = await self._async_batch_fn([item.job for item in live], self.depth)
            except Exception as exc:
                log.warning("ASR batch failed on model %s: %s", self.model_name, exc)
                results = [exc] * len(live)
            finishing = True
            self._finish(live, results, time.perf_counter() - started)
        except asyncio.CancelledError:
            log.debug("model %s: batch of %d cancelled, no caller waits for it", self.model_name, len(live))
        finally:
            for item in live:
                item.future.remove_done_callback(caller_gone)
            self._inflight.release()

    def _finish(self, live: list[_Pending], results: Sequence[Transcript | BaseException], elapsed: float) -> None:
        self.batches_run += 1
        self.estimated_batch_s = 0.8 * self.estimated_batch_s + 0.2 * elapsed
        self.last_batch_size = len(live)
        log.debug(
            "model %s: batch of %d job(s) in %.3f s, %d still queued",
            self.model_name,
            len(live),
            elapsed,
            self.depth,
        )
        if self._metrics:
            self._metrics.inference_seconds.labels(self.model_name).observe(elapsed)
        for item, result in zip(live, results, strict=True):
            if item.future.done():
                continue
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:  # the engine times its own work (infer_time_s); the wait before it is measured here
                item.future.set_result(replace(result, queue_time_s=item.started_at - item.enqueued_at))

    async def aclose(self) -> None:
        """Stop the worker, fail what is queued, and release the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        for task in list(self._inflight_tasks):
            task.cancel()
        for task in list(self._inflight_tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if not item.future.done():
                item.future.set_exception(Overloaded("the ASR service is shutting down"))
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
