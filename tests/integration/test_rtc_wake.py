"""Hands-free WebRTC with a wake word (and noise suppression), two real aiortc peers on loopback:
the data channel says "listening for 'okay nabu'", nothing is transcribed before the wake word,
and the command after it is."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from mediaserver.state import SESSIONS
from tests.conftest import SENTENCES, synthesize
from tests.rtc_peer import Peer, connect


@pytest_asyncio.fixture(loop_scope="session")
async def peer(server: Any) -> AsyncIterator[Peer]:
    p = await connect(server)
    yield p
    await p.close()


async def messages_until(
    peer: Peer, kind: str, timeout_s: float, got: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Every message up to the first of ``kind`` (appended to ``got`` as they arrive, when given)."""
    got = [] if got is None else got
    deadline = time.monotonic() + timeout_s
    start = len(got)
    while len(got) == start or got[-1]["type"] != kind:
        try:
            got.append(await peer.next(timeout=max(0.1, deadline - time.monotonic())))
        except TimeoutError:
            raise AssertionError(f"no {kind} within {timeout_s:.0f} s; got {got}") from None
    return got


async def test_hands_free_waits_for_the_wake_word(server: Any, peer: Peer, wer: Any) -> None:
    peer.send("start", {"hands_free": True, "wake": True, "noise_suppression": True, "language": "en"})
    waiting = await peer.next("wake_waiting")
    assert waiting["message"] == "listening for 'okay nabu'"
    assert waiting["obj"]["names"] == ["okay_nabu"] and waiting["obj"]["reason"] == "started"
    peer.track.play(synthesize(SENTENCES["garden"]), silence_after_s=1.0)  # no wake word: ignored
    # As a person would, say it again when it was not heard: on a loaded machine (aiortc's real-time
    # pacing, late or lost packets) a first attempt is sometimes missed. Nothing may be transcribed
    # before the wake word either way.
    before: list[dict[str, Any]] = []
    for _attempt in range(3):
        duration = peer.track.play(synthesize("okay nabu, turn on the lights"), silence_after_s=2.0)
        try:
            await messages_until(peer, "wake_word", duration + 20, before)
            break
        except AssertionError:
            continue
    else:
        sessions = [server.app[SESSIONS].get(i) for i in server.app[SESSIONS].ids()]
        gates = [getattr(x, "wake", None) for x in sessions]
        heard_p = [(g.detector.max_probability, g.detector.position_ms) for g in gates if g is not None]
        pytest.fail(
            f"the wake word was not heard in three attempts; open sessions {len(sessions)}, "
            f"their detectors (max p, audio ms): {heard_p}"
        )
    heard = before.pop()
    assert [m["type"] for m in before] == [], before  # nothing at all before the wake word
    assert heard["message"] == "heard 'okay nabu'" and heard["obj"]["name"] == "okay_nabu"
    got = await messages_until(peer, "infer", 60)
    assert wer("turn on the lights", got[-1]["obj"]["text"]) <= 0.25, got[-1]
    waiting = await peer.next("wake_waiting", timeout=30)
    assert waiting["obj"]["reason"] == "utterance_done"
    peer.send("stop")
    assert (await peer.next("log"))["message"] == "ASR hands-free - stopped"


async def test_wake_without_hands_free_is_an_error(peer: Peer) -> None:
    peer.send("start", {"wake": True})
    error = await peer.next("error")
    assert "hands_free" in error["message"]
    peer.send("start", {"hands_free": True, "wake": "computer"})
    error = await peer.next("error")
    assert "computer" in error["message"] and "okay_nabu" in error["message"]
