"""Accept a GET whose request line carries raw spaces or raw UTF-8, as Willow firmware sends them.

Willow builds its TTS URL with ``snprintf`` and does not URL-encode the text
(``GET /api/tts?format=WAV&speaker=CLB&text=turn on the lights HTTP/1.1``); nginx in front of WIS
let that through. aiohttp's parser (llhttp) rightly refuses it as a malformed request line, before
any handler runs. ``LenientAppRunner`` puts a request handler in front of the parser that
percent-encodes such a target (spaces as ``%20``, bytes ≥ 0x80 as ``%XX``) when a GET or HEAD
request line starts a received block and ends in `` HTTP/1.x``; every other byte is passed on
untouched. A new connection per request (what Willow does) always starts with its request line.

The runner also turns on aiohttp's ``handler_cancellation``: when a client hangs up, its handler
is cancelled at once, so a transcription (or a generation) it was waiting for leaves the queue
instead of running for nobody; the metrics count it as a 499.

On shutdown, a handler still running when ``shutdown_grace_s`` (the runner's ``shutdown_timeout``)
is over is cancelled then, with ``SHUTDOWN_CANCEL`` as the reason. aiohttp itself waits that long,
then cancels only the request's body and waits as long again before it cancels the handler: a
streamed answer, which reads no body, ran for twice the grace (20 s for 10, past Docker's 10 s stop).

The same handler keeps a client's malformed request out of the error log: aiohttp answers it with a
400 and would log it at ERROR with a traceback; here it is one INFO line (its reason and the client).
Server errors are logged as before.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from mediaserver.state import SETTINGS

# The reason a handler is cancelled with at the end of the shutdown grace (CancelledError's args):
# the metrics middleware logs it as the server's doing, not as a client that hung up.
SHUTDOWN_CANCEL = "the server is shutting down (shutdown_grace_s is over)"

_REQUEST_LINE = re.compile(rb"^(GET|HEAD) (/[^\r\n]*?) (HTTP/1\.[01])\r?\n")
_MAX_LINE = 16 * 1024


def fix_request_line(data: bytes) -> bytes:
    """Percent-encode raw spaces and non-ASCII bytes in the target of a leading GET/HEAD line."""
    if not data.startswith((b"GET /", b"HEAD /")):
        return data
    match = _REQUEST_LINE.match(data[:_MAX_LINE])
    if match is None:
        return data
    target = match.group(2)
    if b" " not in target and max(target) < 0x80:
        return data
    fixed = b"".join(b"%%%02X" % byte if byte == 0x20 or byte >= 0x80 else bytes((byte,)) for byte in target)
    return match.group(1) + b" " + fixed + b" " + match.group(3) + b"\r\n" + data[match.end() :]


class LenientRequestHandler(RequestHandler):
    __slots__ = ()

    def data_received(self, data: bytes) -> None:
        super().data_received(fix_request_line(data))

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, (HttpProcessingError, RequestPayloadError)):
            # The client's mistake (a malformed request line, header or body): aiohttp answers 400.
            reason = " ".join((getattr(exc, "message", "") or str(exc)).split())
            reason = reason.removeprefix("400, message: ") or type(exc).__name__
            client = args[1] if len(args) > 1 else None
            self.logger.info("malformed HTTP request%s: %s", f" from {client}" if client else "", reason)
            return
        super().log_exception(*args, **kw)


class _LenientServer(web.Server):
    def __call__(self) -> RequestHandler:
        return LenientRequestHandler(self, loop=self._loop, **self._kwargs)

    async def shutdown(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - aiohttp's signature
        timer = None
        if timeout is not None:
            timer = asyncio.get_running_loop().call_later(timeout, _cancel_handlers, list(self._connections))
        try:
            await super().shutdown(timeout)
        finally:
            if timer is not None:
                timer.cancel()


def _cancel_handlers(connections: Sequence[RequestHandler]) -> None:
    """The grace is over: cancel the handlers still running (aiohttp would wait as long again)."""
    for connection in connections:
        task = connection._task_handler  # the connection's task, which awaits its request's handler
        if task is not None and not task.done():
            task.cancel(SHUTDOWN_CANCEL)


class LenientAppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections accept Willow's unencoded request lines, log a client's
    malformed request in one line, cancel the handler of a client that hung up, cancel the
    handlers still running when the shutdown grace (``shutdown_timeout``) is over, and close a
    connection with no request in progress after ``http_keepalive_timeout_s``."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("handler_cancellation", True)
        if SETTINGS in app:  # (every runner of the server's app, the tests' too)
            kwargs.setdefault("keepalive_timeout", app[SETTINGS].http_keepalive_timeout_s)
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp builds its Server inside Application._make_handler; changing its class to this
        # subclass (no new state) only changes which protocol object each connection gets.
        server.__class__ = _LenientServer
        return server
