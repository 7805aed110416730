"""OpenAI Realtime API sessions: ``GET /v1/realtime`` (WebSocket) and ``POST /v1/realtime/calls`` (WebRTC).

The wire contract is OpenAI's (docs/realtime.md lists what is implemented), so the official SDKs
connect with only the base URL changed: ``AsyncOpenAI(base_url=".../v1").realtime.connect(...)``
opens ``ws://.../v1/realtime?model=...`` (or ``?intent=transcription``) with ``Authorization:
Bearer``, which the app's auth middleware checks like any other request.

Two kinds of session (``config.session_kind`` decides from the URL). A **transcription** session
(``?intent=transcription``, or a speech recognition model name such as ``whisper-1``) is described
below. A **conversation** (no intent; no model, ``gpt-realtime`` or another ``gpt-...`` name, or a
chat model the LLM knows) adds items and responses over the voice loop: ``conversation`` (responses
are turns of the session's ``Assistant``), ``items``, ``responses``, ``conversation_config``
(``session.update`` / ``response.create`` of a conversation); ``calls`` carries it over WebRTC, its
events on the ``oai-events`` data channel through the same ``RealtimeSession``.

Client events: ``session.update`` (GA nested shape ``session.audio.input.{format, transcription,
turn_detection}``) and ``transcription_session.update`` (beta flat shape ``input_audio_format``,
``input_audio_transcription``, ``turn_detection``; both shapes are accepted in both events),
``input_audio_buffer.append`` / ``commit`` / ``clear``. Server events: ``session.created`` on
connect (plus ``transcription_session.created`` for beta clients, who send ``OpenAI-Beta:
realtime=v1``), ``session.updated`` or ``transcription_session.updated``, ``input_audio_buffer.
speech_started`` / ``speech_stopped`` / ``committed`` / ``cleared``, ``conversation.item.added`` +
``conversation.item.done`` (beta: ``conversation.item.created``), ``conversation.item.
input_audio_transcription.delta`` / ``completed`` / ``failed``, and ``error``.

Deltas are append-only: every delta of an item is new text after the previous ones, and their
concatenation is exactly the item's ``completed.transcript`` (the ``StreamSession`` forces each decode
to start with the text already sent; the final's remainder is the last delta). With server VAD the
deltas are sent live while the user speaks, so they can precede ``speech_stopped`` and ``committed``;
their ``item_id`` is the one announced in ``speech_started``. In manual mode (``turn_detection:
null``) the transcript of a committed buffer arrives as one delta, then ``completed``.

Audio: ``audio/pcm`` is 16-bit little-endian mono at 24 kHz; ``rate: 16000`` is an extension of this
server (beta clients may send the GA format object as ``input_audio_format``). ``audio/pcmu`` /
``audio/pcma`` (beta ``g711_ulaw`` / ``g711_alaw``) are G.711 at 8 kHz. Everything is resampled to
16 kHz by a resampler that keeps its state across appends. One append carries at most 15 MiB of audio.

Turn detection maps onto the VAD segmenter: ``silence_duration_ms`` → hangover, ``prefix_padding_ms``
→ pre-roll, ``threshold`` 0..1 → webrtcvad aggressiveness 0..3 (``int(threshold * 4)``, capped at 3);
fields left out keep the server's ``stream_vad_*`` settings. ``server_vad`` ends a turn on that silence.
``semantic_vad`` is the server's semantic end of turn (mediaserver/turns, docs/turns.md): each pause
is judged on the turn model's score, its words and its length, and ``eagerness`` caps the wait for an
unfinished turn (``turn_wait_{low,medium,high}_ms``; auto = medium). Without the turn model it falls
back to silence detection, the eagerness choosing the silence (low 1000 ms, high 300 ms, else the
setting); see ``config.RealtimeConfig._turn_options`` and ``TurnDetection.segmenter``.
As with OpenAI, every detected start of speech becomes an item with a transcript (possibly empty):
the segmenter's minimum speech length is off here. Changing turn detection finishes the utterance in
progress first. ``noise_reduction`` (``near_field`` / ``far_field``) runs WebRTC noise suppression
before the VAD at the levels ``noise_near_field_level`` / ``noise_far_field_level`` (audio/noise.py);
``include`` takes OpenAI's one value (the transcription's logprobs); ``keywords`` and ``delay`` are
accepted and ignored.

Errors are ``error`` events, ``{type: "error", event_id, error: {type, code, message, param,
event_id}}`` where ``error.event_id`` is the client event that caused it; the session stays open.
Codes are OpenAI's where known (``invalid_value``, ``invalid_type``, ``missing_required_parameter``,
``input_audio_buffer_commit_empty``, ``model_not_found``), else descriptive (``invalid_json``,
``audio_too_large``, ``unsupported_event``).

Each connection is a ``SocketSession`` (transport/socket_session.py): a reader (parses, validates,
decodes), a worker that applies the reader's queue in order to the ``StreamSession`` (so a manual
commit waiting for its transcript never stops the socket from being read), and a writer that sends
queued events in order. Closing always ends in ``RealtimeSession.aclose``: the session leaves
``app[SESSIONS]`` and every task it started (all carry the session id in their names) is cancelled.

The package: ``config`` parses and validates session configuration (pure functions), ``events``
translates speech and transcript events into server events, ``session`` is the connection,
``websocket`` and ``calls`` the endpoints, ``lookups`` what the app knows (LLM models, voices),
``client_secrets`` the short-lived keys browsers connect with, ``idle`` ``turn_detection.idle_timeout_ms``,
``tool_items`` the calls' output items and ``mcp_tools`` the session's ``type: "mcp"`` servers.
"""

from aiohttp import web

from mediaserver.transport.openai.realtime import calls, client_secrets, websocket
from mediaserver.transport.openai.realtime.websocket import PATH

__all__ = ["PATH", "add_routes"]


def add_routes(app: web.Application) -> None:
    websocket.add_routes(app)
    calls.add_routes(app)
    client_secrets.add_routes(app)
