"""The keep-alive of a model: how long it stays in memory without use (``*_keep_alive_s``).

As Ollama's ``keep_alive``: ``-1`` keeps it loaded for good (the default, as before these settings),
``0`` unloads it as soon as its last request is answered, ``N > 0`` after N seconds without use.
Unloaded, it loads again on its next request (a cold start, not an error).
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator, Field

NEVER = -1.0


def check_keep_alive(value: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise ValueError("keep-alive must be -1 (never unload), 0 (unload after each use) or a number of seconds > 0")
    if value < 0 and value != NEVER:
        raise ValueError(
            f"keep-alive is {value:g}: it must be -1 (never unload), 0 (unload after each use) or seconds > 0"
        )
    return value


def keep_alive_field(what: str) -> float:
    """A ``*_keep_alive_s`` field of ``what``: -1 (the default) never unloads."""
    return Field(
        NEVER,
        description=f"seconds {what} stays loaded without use, then it is unloaded (its memory returned) and loads "
        "again on the next request; -1 = never unload, 0 = unload as soon as its last request is answered",
    )


KeepAliveSeconds = Annotated[float, AfterValidator(check_keep_alive)]
