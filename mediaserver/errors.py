"""Errors that map to a client-facing HTTP status with a stable code.

Raised anywhere below a handler; the error middleware renders them in the wire format of the API the
request came in on (WIS ``{"error": ...}`` or OpenAI ``{"error": {"message", "type", "code"}}``).
"""

from __future__ import annotations


class ApiError(Exception):
    status: int = 400
    code: str = "bad_request"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


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


class Overloaded(ApiError):
    status = 503
    code = "overloaded"


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"


class VoiceNotAuthorized(ApiError):
    status = 406
    code = "unauthorized_voice"


class RequestTimeout(ApiError):
    status = 408
    code = "request_timeout"


class Timeout(ApiError, TimeoutError):
    """The work did not finish in time (a queued ASR job past its deadline, a slow backend).

    Also a ``TimeoutError``, so code that waits on it with the standard idiom still catches it."""

    status = 504
    code = "timeout"


class BackendUnavailable(ApiError):
    """A remote ASR backend (Triton, an OpenAI-compatible server) is down, refused the work, or answered
    something that is not a transcript: a 502 whose message names the backend."""

    status = 502
    code = "backend_unavailable"


class BackendTimeout(Timeout):
    """A remote ASR backend did not answer within its timeout: a 504 whose message names the backend."""
