"""Start-up: settings, logging, TLS, and the HTTP(S) listeners."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from mediaserver.app import create_app
from mediaserver.config import Settings
from mediaserver.config.environment import warn_unknown_in_dotenv, warn_unknown_variables
from mediaserver.transport.lenient_http import LenientAppRunner

log = logging.getLogger("mediaserver")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mediaserver",
        description="Realtime speech inference server. Every option is also an environment variable "
        "MEDIASERVER_<NAME> (see docs/ and the docs site's configuration page: make docs).",
    )
    parser.add_argument("--host", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--http-port", type=int, help="plain HTTP port (default 19001)")
    parser.add_argument("--https-port", type=int, help="HTTPS port, used when certs exist (default 19000)")
    parser.add_argument("--cert-dir", help="directory with cert.pem and key.pem (default ./certs)")
    parser.add_argument("--model", dest="asr_default_model", help="default ASR model (default tiny.en)")
    parser.add_argument("--preload", nargs="*", dest="asr_preload_models", help="models to load at start-up")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], help="inference device")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING ...")
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    return Settings(**overrides)


SECRET_WORDS = ("key", "password", "secret", "token", "auth", "header")


def settings_problem(exc: Exception) -> str:
    """Invalid settings in an operator's words: each setting by its variable, what is wrong, and the
    value given (not pydantic's four lines and link); a list or object setting that is not JSON says so."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    if isinstance(exc, SettingsError):
        field = str(exc).split('"')[1] if str(exc).count('"') >= 2 else ""
        if field:
            return (
                f"MEDIASERVER_{field.upper()} ({field}) is not valid JSON: a list or an object, e.g. "
                f'MEDIASERVER_{field.upper()}=\'["a"]\' or \'{{"name": "value"}}\''
            )
        return str(exc)
    if not isinstance(exc, ValidationError):
        return str(exc)
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        name = str(error["loc"][0]) if error["loc"] else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        given = error.get("input")
        secret = any(word in name for word in SECRET_WORDS)  # (never a key or a password on stderr, in the logs)
        shown = name and not secret and given is not None and not isinstance(given, dict) and "got " not in message
        value = f" (got {given!r})" if shown else ""
        problems.append(f"MEDIASERVER_{name.upper()} ({where}): {message}{value}" if name else message)
    return "; ".join(problems)


class StartupError(Exception):
    """The server cannot start, for a reason the operator can act on (one line, no traceback)."""


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    cert, key = settings.cert_paths()
    if not (cert.is_file() and key.is_file()):
        if cert.is_file() != key.is_file():  # half a pair is a mistake, not "no TLS wanted"
            have, lacking = (cert, key) if cert.is_file() else (key, cert)
            log.warning("%s is there but %s is not: HTTPS is off until both are", have, lacking)
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise StartupError(
            f"the TLS certificate {cert} or its key {key} cannot be used ({exc}); fix or remove them "
            "(python tools/gen_cert.py writes a pair), or point MEDIASERVER_CERT_DIR elsewhere"
        ) from None
    return context


async def serve(settings: Settings, listening: asyncio.Event | None = None) -> None:
    """Serve until SIGINT or SIGTERM; ``listening`` is set once every site listens."""
    context = tls_context(settings)  # (a certificate that cannot be used stops the start before the models load)
    app = create_app(settings)
    # Willow sends unencoded TTS text (lenient_http). On shutdown, open sessions are closed at once
    # (app.close_on_shutdown); requests still running get shutdown_grace_s to finish.
    runner = LenientAppRunner(
        app,
        access_log=None,
        shutdown_timeout=settings.shutdown_grace_s,
        max_line_size=settings.http_max_line_bytes,
    )
    await runner.setup()
    try:
        sites = [web.TCPSite(runner, settings.host, settings.http_port)]
        if context is not None:
            sites.append(web.TCPSite(runner, settings.host, settings.https_port, ssl_context=context))
        elif not any(path.is_file() for path in settings.cert_paths()):
            log.info("no TLS certificate in %s: HTTPS is off (run tools/gen_cert.py)", settings.cert_dir)
        for site in sites:
            await site.start()
            log.info("listening on %s", site.name)
        if listening is not None:
            listening.set()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down")
    finally:
        await runner.cleanup()


M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas (as MALLOC_ARENA_MAX does); True if it was applied.

    Every thread that allocates (CTranslate2's, ONNX Runtime's, the executors') otherwise gets an
    arena of its own, up to 8 per core, and freed memory stays spread over them: with 2 arenas,
    50 WebRTC sessions with 25 speaking peaked at 663 MB instead of 746 MB here (tools/README.md).
    Must run before the threads start. Not glibc (musl, macOS): nothing to do.
    """
    if arenas <= 0 or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False


def configure_logging(level: str) -> None:
    """The log format, and libraries kept to what an operator needs: aioice logs every ICE candidate
    pair check at INFO (half a dozen lines per WebRTC session); the sessions log their own one line
    each way; the HTTP clients (httpx, and httpx2 under the openai package, which the LLM engine
    client uses) log every request at INFO. At DEBUG everything is shown."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for name in ("aioice", "httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = settings_from_args(args)
    except Exception as exc:
        print(f"mediaserver: invalid settings: {settings_problem(exc)}", file=sys.stderr)
        return 2
    limit_malloc_arenas(settings.malloc_arena_max)
    configure_logging(settings.log_level)
    warn_unknown_variables(os.environ, Settings.model_fields)  # typos and old names: a hint, not a failure
    warn_unknown_in_dotenv(Path(".env"), Settings.model_fields)  # (read by the settings too: its typos as well)
    listening = asyncio.Event()
    try:
        asyncio.run(serve(settings, listening))
    except Exception as exc:
        if listening.is_set():  # it ran, then failed: the whole story
            log.exception("the server stopped on an error")
            return 1
        # One line naming what to change, not a traceback wall (at DEBUG: the traceback).
        log.error("cannot start: %s", startup_problem(exc))
        log.debug("what stopped the start", exc_info=exc)
        return 1
    return 0


def startup_problem(exc: Exception) -> str:
    """Why the server could not start, and which setting changes it."""
    if isinstance(exc, StartupError):
        return str(exc)
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc}"
    if isinstance(exc, socket.gaierror) or (isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL):
        return f"{exc}: MEDIASERVER_HOST must be an address of this machine (0.0.0.0: all of them)"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        # A port that is taken: say which setting moves it.
        return (
            f"{exc}. Another program is using the port; change MEDIASERVER_HTTP_PORT, MEDIASERVER_HTTPS_PORT or "
            "MEDIASERVER_WYOMING_PORT (or set MEDIASERVER_WYOMING_ENABLED=false)"
        )
    if isinstance(exc, OSError | ValueError | RuntimeError):
        return f"{exc} (run with MEDIASERVER_LOG_LEVEL=DEBUG for the traceback)"
    return f"{type(exc).__name__}: {exc} (run with MEDIASERVER_LOG_LEVEL=DEBUG for the traceback)"
