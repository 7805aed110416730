"""What llama-server prints, read: the level of each log line, which lines are errors, an error said
briefly, and an exit status in words (what ``/health`` and clients read of a child that failed:
``engine_process.py``)."""

from __future__ import annotations

import re
import signal

# What a summary of an error line keeps of it, at most.
SUMMARY_CHARS = 160

# A line of llama-server's log (--log-prefix): "0.00.011.723 E cmn  common_init_: failed to load model '…'",
# that is a timestamp, the level, a component and the C function. Lines without it (an assertion
# printed by ggml) have no level.
_LOG_LINE = re.compile(r"^(?:\d+(?:\.\d+)+\s+)?([EWIDT])\s+(?:(?:srv|cmn|slot|que|res|log)\s+)?")
_C_FUNCTION = re.compile(r"^\s*[A-Za-z_][\w:~<>]*(?:\(\))?:\s+")
_ERROR_WORDS = ("error", "failed", "abort")


def line_level(line: str) -> str | None:
    """The level letter of a llama-server log line (E, W, I, D, T), or None without one."""
    match = _LOG_LINE.match(line)
    return match.group(1) if match else None


def is_error_line(line: str) -> bool:
    """An error line of the child: its level is E, or it has none and says it failed."""
    level = line_level(line)
    return level == "E" or (level is None and any(word in line.lower() for word in _ERROR_WORDS))


def summarize_error(line: str) -> str:
    """One error line of the child, said briefly: without the timestamp, level, component and C
    function names ("failed to load model '/models/x.gguf'"), at most ``SUMMARY_CHARS``."""
    text = _LOG_LINE.sub("", line.strip(), count=1)
    while (match := _C_FUNCTION.match(text)) is not None and "_" in match.group(0):
        text = text[match.end() :]
    text = " ".join(text.split())
    if len(text) > SUMMARY_CHARS:
        text = text[: SUMMARY_CHARS - 1].rstrip() + "…"
    return text


def describe_exit(code: int) -> str:
    """An exit status in words: "exited with code 1", "was killed by signal 9 (SIGKILL)"."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"was killed by signal {-code}"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"
