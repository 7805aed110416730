"""``turn_detection.idle_timeout_ms`` of a conversation session, as OpenAI does it.

After that much input audio without speech, with no response in progress and no user turn waiting
for its transcript, the server sends ``input_audio_buffer.timeout_triggered`` (``audio_start_ms`` to
``audio_end_ms``: the silent stretch, on the input audio's clock), commits that stretch as an empty
user audio item (``input_audio_buffer.committed`` and the item events) and, when ``create_response``
is on, answers from the conversation so far: the model prompts the user to go on.

Time is input audio time (what the client has appended), as OpenAI measures ``audio_start_ms``: a
client that stops sending audio altogether has no idle time-out (``ws_idle_timeout_s`` closes it).
The count starts at the session's start, at the end of each user turn, and after each response:
at its ``response.done`` plus the length of the audio it spoke (the user is still listening to it).
"""

from __future__ import annotations

import logging

from mediaserver.events import SAMPLE_RATE_HZ
from mediaserver.transport.openai.realtime.config import TurnDetection
from mediaserver.transport.openai.realtime.conversation import Conversation
from mediaserver.transport.openai.realtime.conversation_config import ResponseOptions
from mediaserver.transport.openai.realtime.input_transcription import AudioInput, InputTranscription
from mediaserver.transport.openai.realtime.responses import Response
from mediaserver.transport.openai.realtime.values import new_id

log = logging.getLogger(__name__)


class IdleTimer:
    """Counts a conversation session's input samples since the last sign of a turn."""

    def __init__(self, conversation: Conversation, items: InputTranscription) -> None:
        self.conversation = conversation
        self.items = items
        self.since_sample = 0  # the session's sample count where the silent stretch began
        self._response: Response | None = None  # the response seen in progress at the last check
        self.triggered = 0

    def _busy(self, fed_samples: int, in_speech: bool) -> bool:
        """True (and the count restarted) while a turn or an answer is under way."""
        response = self.conversation.response
        if response is not None:
            self._response = response
            self.since_sample = fed_samples
            return True
        if self._response is not None:  # an answer just ended: count from the end of its audio
            finished, self._response = self._response, None
            item = finished.item
            spoken = 0
            if item is not None and item.kind == "output_audio" and item.rate_hz:
                spoken = item.audio_samples * SAMPLE_RATE_HZ // item.rate_hz
            self.since_sample = fed_samples + spoken
            return True
        if in_speech or self.items.speaking is not None or self.conversation.items.pending():
            self.since_sample = fed_samples
            return True
        return False

    async def check(self, turn: TurnDetection | None, fed_samples: int, in_speech: bool) -> None:
        """After each piece of input audio: trigger once ``idle_timeout_ms`` of it had no turn."""
        if self._busy(fed_samples, in_speech) or turn is None or turn.idle_timeout_ms is None:
            return
        if (fed_samples - self.since_sample) * 1000 < turn.idle_timeout_ms * SAMPLE_RATE_HZ:
            return
        start_ms = self.since_sample * 1000 // SAMPLE_RATE_HZ
        end_ms = fed_samples * 1000 // SAMPLE_RATE_HZ
        self.since_sample = fed_samples
        self.triggered += 1
        item = AudioInput(new_id("item"))
        host = self.conversation.host
        host.send("input_audio_buffer.timeout_triggered", audio_start_ms=start_ms, audio_end_ms=end_ms, item_id=item.id)
        self.items.committed(item)
        self.conversation.transcribed(item.id, "")  # silence: nothing to transcribe, nothing to wait for
        log.info("realtime session %s: idle for %d ms of input audio; answering", host.id, end_ms - start_ms)
        if turn.create_response:
            await self.conversation.create_response(ResponseOptions.of(self.conversation.config))
