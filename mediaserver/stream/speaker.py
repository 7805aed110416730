"""Who spoke a stream's utterance (mediaserver/speakers), for its final.

Only when someone is enrolled: then the utterance's voice is compared with every enrolled
speaker while its transcription runs, so the final waits for whichever is slower (the ASR decode,
on this machine). A voice that cannot be told (too little speech) is a match with no score; a
failure is logged and the final goes out without a speaker.
"""

from __future__ import annotations

import logging

from mediaserver.errors import InvalidAudio
from mediaserver.events import AudioArray, SpeakerMatch
from mediaserver.speakers.service import SpeakerService

log = logging.getLogger(__name__)


def wanted(service: SpeakerService | None) -> bool:
    """Whether a stream's utterances are worth comparing: the model runs and someone is enrolled."""
    return service is not None and service.problem is None and len(service.store) > 0


async def identify(service: SpeakerService, audio: AudioArray) -> SpeakerMatch | None:
    try:
        matches = await service.identify(audio)
    except InvalidAudio:
        return SpeakerMatch(None, None)
    except Exception:
        log.exception("speaker identification failed; the final goes out without a speaker")
        return None
    if not matches:  # the last speaker was deleted meanwhile
        return None
    best = matches[0]
    accepted = service.accepted(matches)
    return SpeakerMatch(best.name if accepted else None, round(best.score, 3))
