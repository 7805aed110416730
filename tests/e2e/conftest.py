"""A real headless Chromium for the browser tests: Debian's /usr/bin/chromium driven by Playwright.

Chromium's fake microphone plays a WAV file in a loop (``--use-file-for-fake-audio-capture``), so
every page in the browser hears the same Piper sentence: ``SILENCE_S`` of silence, the sentence,
``SILENCE_S`` of silence, again and again. The flag is process-wide, hence one browser (with a
fresh profile) per test module. Playwright's own browser download is never used: Chromium comes
from the distribution (``apt-get install chromium``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from tests.conftest import SENTENCES, Clip, synthesize

CHROMIUM = Path(os.environ.get("MEDIASERVER_CHROMIUM", "/usr/bin/chromium"))
SENTENCE = SENTENCES["kitchen"]
SILENCE_S = 2.0


def chromium_missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can.

    In CI (CI=true) a missing browser is an error, not a skip: .ci/run installs it.
    """
    reason = None
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing: apt-get install chromium (or set MEDIASERVER_CHROMIUM)"
    else:
        try:
            import playwright.async_api  # noqa: F401
        except ImportError:
            reason = "Playwright for Python is missing: pip install playwright (no browser download needed)"
    if reason and os.environ.get("CI", "").lower() in ("1", "true"):
        raise RuntimeError(f"browser tests cannot run in CI: {reason}")
    return reason


def chromium_args(wav_path: Path) -> list[str]:
    return [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav_path}",
    ]


@dataclass(frozen=True)
class FakeMicrophone:
    """What the browser's microphone plays in a loop."""

    path: Path
    text: str
    speech_s: float
    loop_s: float


@pytest.fixture(scope="session")
def fake_microphone(tmp_path_factory: pytest.TempPathFactory) -> FakeMicrophone:
    clip = synthesize(SENTENCE)
    silence = np.zeros(int(clip.rate_hz * SILENCE_S), np.int16)
    padded = Clip(SENTENCE, np.concatenate([silence, clip.pcm22k, silence]))
    path = tmp_path_factory.mktemp("fake-mic") / "sentence.wav"
    path.write_bytes(padded.wav_bytes())
    speech_s = len(clip.pcm22k) / clip.rate_hz
    return FakeMicrophone(path, SENTENCE, speech_s, speech_s + 2 * SILENCE_S)


@dataclass(frozen=True)
class Browser:
    """One Chromium with a fresh profile (a Playwright persistent context)."""

    context: Any


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def browser(tmp_path_factory: pytest.TempPathFactory, fake_microphone: FakeMicrophone) -> AsyncIterator[Browser]:
    reason = chromium_missing_reason()
    if reason:
        pytest.skip(reason)
    from playwright.async_api import async_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=False,  # the args below carry --headless=new; Playwright adds nothing of its own
            args=chromium_args(fake_microphone.path),
            permissions=["microphone"],
            timeout=60_000,
        )
        try:
            yield Browser(context)
        finally:
            await context.close()
