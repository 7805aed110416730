"""Idle unload: the models of one engine in memory, who uses each now, and the timer that unloads it.

Each engine's service (ASR models, TTS voices, the LLM's llama-server children) has one
``ModelKeeper``. A request holds ``keeper.use(name)`` from before it looks the model up until its
answer is done (or it is cancelled: a client that hangs up leaves nothing held). When the last use
of a model ends, a timer of ``keep_alive_s`` starts (``*_keep_alive_s``: -1 never, 0 at once, N
seconds); a new use cancels it. When it fires with the model still unused, the service's ``unload``
runs: under the service's load lock, so a request arriving meanwhile either finds the model still
loaded (and the unload, seeing it in use, gives up) or waits for the unload and loads it again.

The keeper also keeps what ``/health`` and ``/metrics`` show of each model: loaded or not, how long
its last load took, how many loads and unloads, how long it has been unused, the last load error.
Nothing here blocks the event loop: the timer is a ``call_later``, the unload a task (a service
frees a model's memory in a thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mediaserver.metrics import Metrics

log = logging.getLogger(__name__)

Unload = Callable[[str], Awaitable[bool]]
T = TypeVar("T")


class SharedLoads(Generic[T]):
    """One load per cold start, in a task of its own: every request for a model meanwhile waits for
    the same load, and a request that goes away (its client hung up) leaves it to finish for the
    others (the model then idles out as any other). ASR models and TTS voices load this way."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._tasks: dict[str, asyncio.Task[T]] = {}

    def __contains__(self, name: str) -> bool:
        """Whether a load of ``name`` is under way."""
        return name in self._tasks

    async def load(self, name: str, start: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """The model ``name``: the load under way, or one started now with ``start()``."""
        task = self._tasks.get(name)
        if task is None:
            task = asyncio.get_running_loop().create_task(start(), name=f"{self._kind}-load-{name}")
            self._tasks[name] = task
            task.add_done_callback(lambda done: self._finished(name, done))
        return await asyncio.shield(task)

    def _finished(self, name: str, task: asyncio.Task[T]) -> None:
        if self._tasks.get(name) is task:
            del self._tasks[name]
        if not task.cancelled():
            task.exception()  # retrieved: a load nobody waits for any more fails quietly (the service logs it)

    async def settle(self) -> None:
        """Wait for the loads under way, whatever they end in (shutting down)."""
        for task in list(self._tasks.values()):
            with contextlib.suppress(Exception):
                await task


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    return trim


def return_freed_memory() -> None:
    """Hand memory freed by an unload back to the system (glibc's ``malloc_trim``; blocking, brief).

    A freed model's buffers stay in glibc's per-thread arenas otherwise: measured on tiny.en, RSS
    after an unload kept 54 MB of its 110 MB and grew by ~45 MB per load/unload cycle (each load
    runs in another thread, so another arena); with the trim it falls back to within 30 MB of the
    never-loaded process and stays there (docs/idle-unload.md)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@dataclass
class ModelState:
    loaded: bool = False
    loads: int = 0
    unloads: int = 0
    load_seconds: float | None = None  # the last successful load
    loaded_at: float | None = None  # monotonic
    last_used: float | None = None  # monotonic: when its last use ended (or it was loaded)
    last_error: str | None = None  # why the last load failed (cleared by a successful one)


class ModelKeeper:
    """The idle timers and load/unload record of one engine's models (see the module)."""

    def __init__(self, engine: str, keep_alive_s: float, metrics: Metrics, unload: Unload) -> None:
        self.engine = engine
        self.keep_alive_s = keep_alive_s
        self._metrics = metrics
        self._unload = unload
        self._users: dict[str, int] = {}
        self._states: dict[str, ModelState] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._closed = False

    # --- uses ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def use(self, name: str) -> Iterator[None]:
        """Hold ``name`` loaded while the block runs: no idle unload starts meanwhile."""
        self._users[name] = self._users.get(name, 0) + 1
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        try:
            yield
        finally:
            self._users[name] -= 1
            if self._users[name] == 0:
                del self._users[name]
                self._state(name).last_used = time.monotonic()
                self._arm(name)

    def in_use(self, name: str) -> bool:
        return self._users.get(name, 0) > 0

    def is_loaded(self, name: str) -> bool:
        state = self._states.get(name)
        return state is not None and state.loaded

    def loads(self, name: str) -> int:
        state = self._states.get(name)
        return state.loads if state is not None else 0

    # --- what the service reports ----------------------------------------------------------------
    def loaded(self, name: str, seconds: float) -> None:
        """``name`` was loaded in ``seconds`` (a cold start for whoever waited)."""
        state = self._state(name)
        state.loaded = True
        state.loads += 1
        state.load_seconds = seconds
        state.loaded_at = state.last_used = time.monotonic()
        state.last_error = None
        self._metrics.model_loaded.labels(self.engine, name).set(1)
        self._metrics.model_load_seconds.labels(self.engine, name).observe(seconds)
        log.info("%s model %s loaded in %.2f s", self.engine, name, seconds)
        self._arm(name)  # a preloaded model, or one looked up without a use, idles out too
        self._notify()

    def load_failed(self, name: str, reason: str) -> None:
        state = self._state(name)
        state.last_error = reason
        self._metrics.model_load_failures.labels(self.engine, name).inc()
        self._metrics.model_loaded.labels(self.engine, name).set(0)
        self._notify()

    def unloaded(self, name: str, reason: str) -> None:
        """``name`` left memory (``reason``: idle, limit)."""
        state = self._state(name)
        if not state.loaded:
            return
        state.loaded = False
        state.unloads += 1
        state.loaded_at = None
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        self._metrics.model_loaded.labels(self.engine, name).set(0)
        self._metrics.model_unloads.labels(self.engine, name, reason).inc()
        self._notify()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per model ever loaded (or tried): ``/health``'s view."""
        now = time.monotonic()
        out: dict[str, dict[str, Any]] = {}
        for name, state in self._states.items():
            entry: dict[str, Any] = {
                "loaded": state.loaded,
                "in_use": self._users.get(name, 0),
                "loads": state.loads,
                "unloads": state.unloads,
                "load_seconds": None if state.load_seconds is None else round(state.load_seconds, 3),
                "idle_s": None if state.last_used is None or self.in_use(name) else round(now - state.last_used, 1),
                "keep_alive_s": self.keep_alive_s,
            }
            if state.last_error is not None:
                entry["last_error"] = state.last_error
            out[name] = entry
        return out

    async def wait_for(self, condition: Callable[[], bool], timeout_s: float) -> None:
        """Until ``condition()`` holds, re-checked at every load or unload (TimeoutError past ``timeout_s``)."""
        async with asyncio.timeout(timeout_s):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    # --- the timer -------------------------------------------------------------------------------
    def _state(self, name: str) -> ModelState:
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = ModelState()
        return state

    def _notify(self) -> None:
        self._changed.set()

    def _arm(self, name: str) -> None:
        if self._closed or self.keep_alive_s < 0 or self.in_use(name) or not self.is_loaded(name):
            return
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()
        self._timers[name] = asyncio.get_running_loop().call_later(self.keep_alive_s, self._fire, name)

    def _fire(self, name: str) -> None:
        self._timers.pop(name, None)
        if self._closed or self.in_use(name) or not self.is_loaded(name):
            return
        task = asyncio.get_running_loop().create_task(self._run_unload(name), name=f"unload-{self.engine}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_unload(self, name: str) -> None:
        try:
            done = await self._unload(name)
        except Exception:
            log.exception("unloading %s model %s failed", self.engine, name)
            return
        if done:
            log.info("%s model %s unloaded after %g s without use", self.engine, name, self.keep_alive_s)
        else:  # busy after all (work the keeper does not see): try again after another keep-alive
            self._arm(name)

    async def aclose(self) -> None:
        """Stop the timers and wait for unloads under way (the service then closes what is left)."""
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task


class WorkerModel(Generic[T]):
    """A model that lives on one worker thread (the turn model, the speaker encoder): loaded there on
    first use with ``load`` and dropped there once unused for ``keep_alive_s`` (its ``ModelKeeper``).

    Its inference already runs on that one thread, so load, use and unload never overlap: an unload
    queued behind a batch runs after it, and a request queued behind the unload loads the model
    again (a cold start). The keeper hears of loads and unloads from the thread through the event
    loop, in the order they happened. A request holds ``use()`` on the event loop while it waits."""

    def __init__(
        self,
        engine: str,
        name: str,
        load: Callable[[], T],
        keep_alive_s: float,
        metrics: Metrics,
        executor: Executor,
    ) -> None:
        self.name = name
        self._load = load
        self._executor = executor
        self._model: T | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unannounced_s: float | None = None  # a load made before the event loop was at hand
        self.keeper = ModelKeeper(engine, keep_alive_s, metrics, self._unload)

    def loaded_at_start(self, model: T, seconds: float) -> None:
        """``model`` was loaded in ``seconds`` off the event loop (at construction); the keeper hears
        of it (and its idle timer starts) at ``announce`` or the first ``use``."""
        self._model = model
        self._unannounced_s = seconds

    def announce(self) -> None:
        """On the event loop: report a load made at construction to the keeper."""
        self._loop = asyncio.get_running_loop()
        seconds, self._unannounced_s = self._unannounced_s, None
        if seconds is not None and self._model is not None:
            self.keeper.loaded(self.name, seconds)

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @contextlib.contextmanager
    def use(self) -> Iterator[None]:
        """Hold the model (no idle unload starts) while a request waits on it; on the event loop."""
        self.announce()
        with self.keeper.use(self.name):
            yield

    def get(self) -> T:
        """The model, loaded now if it is not (on the worker thread: blocking)."""
        model = self._model
        if model is None:
            started = time.perf_counter()
            try:
                model = self._load()
            except Exception as exc:
                self._tell(self.keeper.load_failed, self.name, str(exc) or type(exc).__name__)
                raise
            self._model = model
            self._tell(self.keeper.loaded, self.name, time.perf_counter() - started)
        return model

    def _tell(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    async def _unload(self, name: str) -> bool:
        self._loop = asyncio.get_running_loop()
        return await self._loop.run_in_executor(self._executor, self._drop)

    def _drop(self) -> bool:
        if self._model is not None:
            self._model = None
            return_freed_memory()
            self._tell(self.keeper.unloaded, self.name, "idle")
        return True

    async def aclose(self) -> None:
        await self.keeper.aclose()
