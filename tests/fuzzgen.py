"""Deterministic generators of bad input for the fuzz tests: every case comes from a seeded
``random.Random``, so a failure names a case that the next run produces again.

- SDP: truncation after every line, deletion and duplication of every line (as aiortc's own parser
  tests cut their fixtures at every position), then seeded byte and line mutations.
- Control messages: JSON of every shape (wrong types, unknown keys, huge and deep values) around
  each protocol's real message types, plus text that is not JSON at all.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from typing import Any

SDP_FIXTURES = Path(__file__).parent / "fixtures" / "sdp"

_WEIRD_STRINGS = [
    "",
    " ",
    "\x00",
    "é",
    "\u202e",
    "\ud7ff",
    "💥" * 3,
    "a" * 5000,
    "null",
    "NaN",
    "../../etc/passwd",
    "base",
    "tiny.en",
    "whisper-1",
    "en",
    "auto",
    "xx-YY",
    "push_to_talk",
    "server_vad",
    "float32",
    "pcm16",
    "translate",
]
_WEIRD_NUMBERS: list[Any] = [0, -1, 1, 2, 7, 16000, 48000, 8000, 2**31, -(2**63), 10**30, 0.5, -0.0, 1e308, True, False]


def sdp_fixtures() -> dict[str, str]:
    """The captured offers (aiortc and Chromium, with and without a data channel, every audio direction)."""
    return {path.stem: path.read_bytes().decode() for path in sorted(SDP_FIXTURES.glob("*.sdp"))}


def sdp_sweeps(sdp: str, *, truncate: bool, delete: bool, duplicate: bool) -> list[tuple[str, str]]:
    lines = sdp.split("\r\n")
    cases: list[tuple[str, str]] = []
    for i in range(len(lines)):
        if truncate:
            cases.append((f"truncated after line {i}", "\r\n".join(lines[:i])))
        if delete:
            cases.append((f"without line {i} ({lines[i][:20]!r})", "\r\n".join(lines[:i] + lines[i + 1 :])))
        if duplicate:
            cases.append((f"line {i} twice", "\r\n".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])))
    return cases


def sdp_mutations(sdp: str, rng: random.Random, count: int) -> list[tuple[str, str]]:
    """Seeded mutations: a byte changed, inserted or removed, two lines swapped, a value emptied, a
    line's value replaced by something absurd, the line ending changed."""
    cases: list[tuple[str, str]] = []
    lines = sdp.split("\r\n")
    for n in range(count):
        kind = rng.randrange(7)
        if kind == 0:
            at = rng.randrange(len(sdp))
            mutated = sdp[:at] + rng.choice(string.printable) + sdp[at + 1 :]
        elif kind == 1:
            at = rng.randrange(len(sdp))
            mutated = sdp[:at] + rng.choice(["\x00", "\r\n", ":", " ", "=", "é", "-1", "99999999999"]) + sdp[at:]
        elif kind == 2:
            at = rng.randrange(len(sdp))
            mutated = sdp[:at] + sdp[at + rng.randint(1, 40) :]
        elif kind == 3:
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            swapped = list(lines)
            swapped[a], swapped[b] = swapped[b], swapped[a]
            mutated = "\r\n".join(swapped)
        elif kind == 4:
            at = rng.randrange(len(lines))
            changed = list(lines)
            changed[at] = changed[at].split(":", 1)[0] + ":" if ":" in changed[at] else changed[at][:2]
            mutated = "\r\n".join(changed)
        elif kind == 5:
            at = rng.randrange(len(lines))
            changed = list(lines)
            head = changed[at].split(" ", 1)[0]
            changed[at] = f"{head} {rng.choice(_WEIRD_STRINGS)[:200]} {rng.choice(_WEIRD_NUMBERS)}"
            mutated = "\r\n".join(changed)
        else:
            mutated = sdp.replace("\r\n", rng.choice(["\n", "\r", "\r\r\n", " "]))
        cases.append((f"mutation {n} (kind {kind})", mutated))
    return cases


def random_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.35:
        return rng.choice([None, rng.choice(_WEIRD_STRINGS), rng.choice(_WEIRD_NUMBERS)])
    if roll < 0.65:
        return {rng.choice(_KEYS): random_json(rng, depth + 1) for _ in range(rng.randint(0, 5))}
    return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]


_KEYS = [
    "type",
    "obj",
    "message",
    "model",
    "language",
    "beam_size",
    "sample_rate",
    "encoding",
    "channels",
    "mode",
    "partials",
    "hands_free",
    "task",
    "prompt",
    "assistant",
    "speak",
    "voice",
    "system_prompt",
    "audio_sample_rate",
    "segments",
    "detect_language",
    "session",
    "audio",
    "event_id",
    "item_id",
    "turn_detection",
    "input_audio_format",
    "input_audio_transcription",
]


def control_messages(rng: random.Random, types: list[str], count: int, *, obj_key: str | None) -> list[str]:
    """``count`` text messages for a JSON control protocol whose message types are ``types``:
    real types with random fields (under ``obj_key`` when the protocol nests them), random types,
    JSON that is not an object, nesting far too deep for a parser, and text that is not JSON."""
    messages: list[str] = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.55:
            fields = {rng.choice(_KEYS): random_json(rng, 1) for _ in range(rng.randint(0, 6))}
            fields.pop("type", None)
            body: dict[str, Any] = {"type": rng.choice(types)}
            if obj_key is None:
                body.update(fields)
            else:
                body[obj_key] = fields if rng.random() < 0.8 else random_json(rng, 1)
            messages.append(json.dumps(body))
        elif roll < 0.7:
            messages.append(json.dumps({"type": random_json(rng, 2), **{rng.choice(_KEYS): random_json(rng, 1)}}))
        elif roll < 0.8:
            messages.append(json.dumps(random_json(rng)))
        elif roll < 0.85:
            depth = rng.choice([900, 5000, 20000])
            opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
            messages.append(opener * depth + "1" + closer * depth)
        elif roll < 0.9:
            messages.append(json.dumps({"type": rng.choice(types)})[: rng.randint(0, 12)])
        else:
            messages.append("".join(rng.choice(string.printable + "é💥\x00") for _ in range(rng.randint(0, 300))))
    return messages
