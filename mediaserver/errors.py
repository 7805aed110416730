"""Errors that map to a client-facing HTTP status with a stable code.

Raised anywhere below a handler; the error middleware renders them in the wire format of the API the
request came in on (WIS ``{"error": ...}`` or OpenAI ``{"error": {"message", "type", "code"}}``).
"""

from __future__ import annotations

import math


class ApiError(Exception):
    """A client-facing error. ``retryable`` errors (a full queue, the session cap) are transient:
    HTTP answers carry ``Retry-After``, from ``retry_after_s`` when the raiser could estimate it
    (queue depth × measured work time), else the ``retry_after_fallback_s`` setting."""

    status: int = 400
    code: str = "bad_request"
    retryable: bool = False

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s


def retry_after_header(seconds: float) -> str:
    """An HTTP ``Retry-After`` value (RFC 9110: whole seconds); at least 1, rounded up."""
    if not math.isfinite(seconds):
        seconds = 1.0
    return str(max(1, math.ceil(seconds)))


class InvalidAudio(ApiError):
    status = 400
    code = "invalid_audio"


class AudioTooLarge(ApiError):
    status = 413
    code = "audio_too_large"


class InvalidParameter(ApiError):
    status = 400
    code = "invalid_parameter"


class UnknownModel(ApiError):
    status = 400
    code = "model_not_found"


class ModelUnavailable(ApiError):
    status = 503
    code = "model_unavailable"


class EngineBuilding(ModelUnavailable):
    """The engine's binary is still being compiled (``make run`` on a fresh machine): try again later."""

    retryable = True


class Overloaded(ApiError):
    status = 503
    code = "overloaded"
    retryable = True


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"


class Forbidden(ApiError):
    status = 403
    code = "forbidden"


class VoiceNotAuthorized(ApiError):
    status = 406
    code = "unauthorized_voice"


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class InvalidBody(ApiError):
    """The request body could not be read as sent (a Content-Encoding it does not match, bad framing)."""

    status = 400
    code = "invalid_body"


class RequestTimeout(ApiError):
    status = 408
    code = "request_timeout"


class GatewayTimeout(ApiError):
    """The base of every 504: work that did not finish in time (ASR, LLM, TTS, a remote backend or
    upstream). ``except GatewayTimeout`` covers them all; each subclass keeps its own ``code``."""

    status = 504
    code = "timeout"


class Timeout(GatewayTimeout, TimeoutError):
    """An ASR job did not finish in time (a queued job past its deadline, a slow backend).

    Also a ``TimeoutError``, so code that waits on it with the standard idiom still catches it."""


class BackendUnavailable(ApiError):
    """A remote ASR backend (Triton, an OpenAI-compatible server) is down, refused the work, or answered
    something that is not a transcript: a 502 whose message names the backend."""

    status = 502
    code = "backend_unavailable"


class BackendTimeout(Timeout):
    """A remote ASR backend did not answer within its timeout: a 504 whose message names the backend."""
