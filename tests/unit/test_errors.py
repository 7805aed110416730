"""Every 504 the server answers derives from one base, so one ``except`` covers them all."""

from __future__ import annotations

import importlib
import pkgutil

import mediaserver
from mediaserver.errors import ApiError, GatewayTimeout, Timeout


def all_subclasses(cls: type[ApiError]) -> set[type[ApiError]]:
    found: set[type[ApiError]] = set()
    for sub in cls.__subclasses__():
        found |= {sub, *all_subclasses(sub)}
    return found


def test_every_504_is_a_gateway_timeout() -> None:
    for module in pkgutil.walk_packages(mediaserver.__path__, "mediaserver."):
        if module.name != "mediaserver.__main__":
            importlib.import_module(module.name)
    errors = all_subclasses(ApiError)
    timeouts = {cls for cls in errors if cls.status == 504}
    names = {cls.__name__ for cls in timeouts}
    # ASR (queue deadline, remote backend), LLM (queue and generation, upstream), TTS.
    expected = {"Timeout", "DeadlineExceeded", "BackendTimeout", "LlmTimeout", "UpstreamTimeout", "SynthesisTimeout"}
    assert expected <= names, expected - names
    assert all(issubclass(cls, GatewayTimeout) for cls in timeouts), names
    assert {cls for cls in errors if issubclass(cls, GatewayTimeout)} == timeouts


def test_an_asr_timeout_is_still_a_timeout_error() -> None:
    assert issubclass(Timeout, TimeoutError)
