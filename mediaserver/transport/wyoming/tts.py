"""Wyoming speech out: the TTS half of a Wyoming connection (``wyoming/server.py`` owns the socket).

- ``describe`` → ``info`` lists a TTS program (``supports_synthesize_streaming``) with every voice.
- ``synthesize{text, voice?}`` → ``audio-start``, ``audio-chunk``… (sentence after sentence, the
  first as soon as it is made), ``audio-stop``.
- Streaming, as Home Assistant sends an LLM's answer: ``synthesize-start{voice?}``, then
  ``synthesize-chunk{text}`` as the text arrives; every sentence completed by the chunks so far is
  spoken at once (its own ``audio-start``/``audio-chunk``…/``audio-stop``) while more text is read;
  ``synthesize-stop`` speaks the rest and ends with ``synthesize-stopped``. The ``synthesize`` that
  clients send inside a stream for older servers is ignored. Text past ``tts_max_streamed_chars``
  is not spoken (one ``error`` event says so; the stream goes on to its end).

Voices are chosen by ``voice.name`` (a voice, an alias, a downloadable Piper name) or
``voice.language``; ``voice.speaker`` picks a speaker of a multi-speaker voice (by name or number;
one the voice does not have is an ``error`` event, ``speaker_not_found``). A client that
disconnects mid-answer leaves nothing running: its pending sentences are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, TtsProgram, TtsVoice, TtsVoiceSpeaker
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from mediaserver import __version__
from mediaserver.capabilities import Capabilities, FeatureDisabled
from mediaserver.errors import InvalidParameter
from mediaserver.tts.service import Speech, TextTooLong, TtsService
from mediaserver.tts.text import clean_text, readable
from mediaserver.tts.types import SynthesisParams, TtsChunk, VoiceInfo

log = logging.getLogger(__name__)

SAMPLES_PER_CHUNK: Final = 1024  # per audio-chunk, as wyoming-piper sends them
SILENCE_MS: Final = 100  # what a text with nothing to read is answered with
_PIPER_ATTRIBUTION: Final = Attribution(name="rhasspy/piper", url="https://github.com/OHF-Voice/piper1-gpl")

Send = Callable[..., Awaitable[None]]


def tts_program(tts: TtsService) -> TtsProgram:
    """The TTS program of ``info``: one entry per voice."""
    voices = [
        TtsVoice(
            name=voice.name,
            description=voice.description or voice.name,
            attribution=_PIPER_ATTRIBUTION,
            installed=True,
            version=None,
            languages=[voice.language_tag],
            speakers=[TtsVoiceSpeaker(name=s) for s in voice.speakers] or None,
        )
        for voice in tts.voices.voices()
    ]
    return TtsProgram(
        name="mediaserver-tts",
        description="mediaserver text-to-speech (Piper)",
        attribution=_PIPER_ATTRIBUTION,
        installed=True,
        version=__version__,
        voices=voices,
        supports_synthesize_streaming=True,
    )


def _voice_fields(data: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    voice = data.get("voice")
    if voice is None:
        return None, None, None
    if not isinstance(voice, dict):
        raise InvalidParameter(f"voice must be an object, got {voice!r}", param="voice")
    fields = []
    for key in ("name", "language", "speaker"):
        value = voice.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidParameter(f"voice.{key} must be a string, got {value!r}", param=f"voice.{key}")
        fields.append(value or None)
    return fields[0], fields[1], fields[2]


def _silence(rate: int) -> list[Event]:
    """``SILENCE_MS`` of silence as one answer: what a text with nothing to read gets."""
    silence = bytes(2 * (rate * SILENCE_MS // 1000))
    return [
        AudioStart(rate=rate, width=2, channels=1).event(),
        AudioChunk(rate=rate, width=2, channels=1, audio=silence).event(),
        AudioStop().event(),
    ]


def audio_events(chunk: TtsChunk) -> list[Event]:
    """A sentence's PCM as ``audio-chunk`` events of ``SAMPLES_PER_CHUNK`` samples."""
    step = SAMPLES_PER_CHUNK * 2
    return [
        AudioChunk(rate=chunk.sample_rate_hz, width=2, channels=1, audio=chunk.pcm[i : i + step]).event()
        for i in range(0, len(chunk.pcm), step)
    ]


class WyomingTts:
    """The synthesis state of one connection; ``handle`` takes the TTS events."""

    def __init__(
        self,
        tts: TtsService | None,
        capabilities: Capabilities | None,
        send: Send,
        peer: str,
        *,
        max_streamed_chars: int,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self._tts = tts
        self.max_streamed_chars = max_streamed_chars  # tts_max_streamed_chars
        self._on_error = on_error  # an error event sent without closing (counted by code)
        self._streamed_text = False  # the open stream brought text (not only spaces)
        self._told_too_long = False
        self._spoke = False  # the open stream's writer sent audio
        self._capabilities = capabilities
        self._send = send
        self.peer = peer
        self._speech: Speech | None = None
        self._speech_cm: AbstractAsyncContextManager[Speech] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._streamed_chars = 0

    @staticmethod
    def handles(event_type: str) -> bool:
        return any(kind.is_type(event_type) for kind in (Synthesize, SynthesizeStart, SynthesizeChunk, SynthesizeStop))

    def _service(self) -> TtsService:
        if self._capabilities is not None:
            self._capabilities.require("tts")
        if self._tts is None:
            raise FeatureDisabled("TTS is disabled on this server: the Wyoming server has no TTS service")
        return self._tts

    async def _voice(self, data: dict[str, Any]) -> tuple[VoiceInfo, SynthesisParams]:
        name, language, speaker = _voice_fields(data)
        voice = await self._service().voice(name, language=language)
        return voice, SynthesisParams(speaker=speaker)

    async def handle(self, event: Event) -> None:
        kind = event.type
        if Synthesize.is_type(kind):
            if self._speech is not None:
                return  # the compatibility copy of a streamed text
            await self._synthesize(event.data)
        elif SynthesizeStart.is_type(kind):
            await self._start(event.data)
        elif SynthesizeChunk.is_type(kind):
            text = event.data.get("text")
            if not isinstance(text, str):
                raise InvalidParameter("synthesize-chunk needs a 'text' string", param="text")
            if self._speech is None:
                raise InvalidParameter("synthesize-chunk before synthesize-start", param="text")
            await self._chunk(self._speech, text)
        elif SynthesizeStop.is_type(kind):
            await self._stop()

    async def _chunk(self, speech: Speech, text: str) -> None:
        """A streamed piece of text: spoken as it completes sentences, up to ``max_streamed_chars``.
        Past it the rest is dropped (cut back to a word's end) and the client is told once; the stream
        ends as usual at synthesize-stop (a user trial: an LLM's 5470 characters, refused at 4096 by
        closing the connection, lost the sentences already sent)."""
        self._streamed_text = self._streamed_text or bool(text.strip())
        limit = self.max_streamed_chars
        room = limit - self._streamed_chars
        self._streamed_chars += len(text)
        if self._streamed_chars <= limit:
            speech.feed(text)
            return
        if room > 0:
            kept = text[:room]
            if not text[room].isspace():  # (not half a word: back to the last space, if the piece has one)
                kept = kept[: max(kept.rfind(" "), 0)] if " " in kept else ""
            speech.feed(kept)
        if self._told_too_long:
            return
        self._told_too_long = True
        log.warning("wyoming %s: streamed text past %d characters: the rest is not spoken", self.peer, limit)
        if self._on_error is not None:
            self._on_error(TextTooLong.code)
        message = (
            f"the streamed text passed {limit} characters (tts_max_streamed_chars): what came within them is "
            "spoken, the rest is not"
        )
        await self._send(Error(text=message, code=TextTooLong.code).event())

    async def _synthesize(self, data: dict[str, Any]) -> None:
        text = data.get("text")
        if not isinstance(text, str):
            raise InvalidParameter("synthesize needs a 'text' string", param="text")
        tts = self._service()
        voice, params = await self._voice(data)
        if text.strip() and not readable(clean_text(text)):
            # Nothing to read ("🙂", "..."): a moment of silence, not an error (an LLM's reply of emoji
            # alone made Home Assistant show a TTS failure: a trial), and not a WAV of no frames,
            # which players refuse (a later trial).
            log.info("wyoming %s: %r has nothing to read: %d ms of silence", self.peer, text[:40], SILENCE_MS)
            await self._send(*_silence(voice.sample_rate_hz))
            return
        tts.check_text(text)
        async with tts.speak(text, voice, params) as speech:
            started = False
            async for chunk in speech:
                if not started:
                    await self._send(AudioStart(rate=chunk.sample_rate_hz, width=2, channels=1).event())
                    started = True
                await self._send(*audio_events(chunk))
            if not started:
                await self._send(AudioStart(rate=voice.sample_rate_hz, width=2, channels=1).event())
            await self._send(AudioStop().event())
        log.info("wyoming %s: spoke %d sentence(s) with %s", self.peer, len(speech.sentences), voice.name)

    async def _start(self, data: dict[str, Any]) -> None:
        if self._speech is not None:
            raise InvalidParameter("synthesize-start while a stream is already open", param="text")
        tts = self._service()
        voice, params = await self._voice(data)
        self._speech_cm = tts.open(voice, params)
        self._speech = await self._speech_cm.__aenter__()
        self._streamed_chars = 0
        self._streamed_text = False
        self._told_too_long = False
        self._spoke = False
        self._writer = asyncio.get_running_loop().create_task(self._write(self._speech), name="wyoming-tts-writer")

    async def _write(self, speech: Speech) -> None:
        """Each sentence as its own audio-start … audio-stop, as soon as it is made."""
        async for chunk in speech:
            self._spoke = True
            events = [AudioStart(rate=chunk.sample_rate_hz, width=2, channels=1).event(), *audio_events(chunk)]
            await self._send(*events, AudioStop().event())

    async def _stop(self) -> None:
        speech, writer = self._speech, self._writer
        if speech is None or writer is None:
            await self._send(SynthesizeStopped().event())  # nothing was started: nothing to say
            return
        speech.end()
        try:
            await writer
        finally:
            await self.aclose()
        log.info("wyoming %s: streamed %d sentence(s) with %s", self.peer, len(speech.sentences), speech.voice.name)
        if self._streamed_text and not self._spoke:
            # Text, but nothing to read in it (an LLM's "👍"): a moment of silence, as synthesize gives.
            await self._send(*_silence(speech.voice.sample_rate_hz))
        await self._send(SynthesizeStopped().event())

    async def aclose(self) -> None:
        """Stop an open stream and drop what it has not spoken yet. Idempotent."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.cancel()  # (a writer already done keeps its outcome, retrieved here: a send that
            with contextlib.suppress(asyncio.CancelledError, Exception):  # failed on a closed connection)
                await writer
        cm, self._speech_cm, self._speech = self._speech_cm, None, None
        if cm is not None:
            await cm.__aexit__(None, None, None)
