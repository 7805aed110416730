"""OpenAI Realtime conversations over WebRTC: ``POST /v1/realtime/calls``, as OpenAI's GA API.

The client posts its SDP offer, either as the raw body (``Content-Type: application/sdp``) or as
the multipart form the SDKs send (``sdp``, and ``session``: the session configuration as JSON,
what a ``session.update`` would say). The answer is ``201 Created`` with the answer SDP
(``application/sdp``) and ``Location: /v1/realtime/calls/{call_id}``; ICE is not trickled, as on
``/api/rtc/asr``. ``POST /v1/realtime/calls/{call_id}/hangup`` ends a call.

Events flow as JSON on the data channel the client opens, labelled ``oai-events``: the same events
as over the WebSocket (session.update, conversation.item.*, response.*) handled by the same
``RealtimeSession``, whose socket here is that channel (``ChannelSocket``). Audio flows on the media
tracks: the microphone track is read, resampled to 16 kHz and queued to the session like appended
audio (server VAD finds the turns); answers play on the outbound Opus track of the voice loop
(``rtc_peer/audio.py``'s ``AssistantAudioTrack``), which sends nothing between answers. So there are no
``response.output_audio.delta`` events here; ``output_audio_buffer.started`` / ``stopped`` /
``cleared`` say when the track plays, and an interrupted answer keeps the words that were played.

A call ends when the peer connection fails or closes, the data channel closes, the client hangs
up, it stays idle (``ws_idle_timeout_s``: no event and no audio), the peer never connects
(``rtc_connect_timeout_s``) or vanishes (nothing received for ``rtc_dead_peer_timeout_s``, as on
/api/rtc/asr), or the server shuts down; in every case ``RealtimeCall.aclose`` leaves nothing
running. A malformed offer or form is a 400, never a 500.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Final

import av
from aiohttp import BodyPartReader, WSCloseCode, WSMessage, WSMsgType, web
from aiortc import RTCDataChannel
from aiortc.mediastreams import MediaStreamTrack

from mediaserver.assistant.audio_out import AudioOut
from mediaserver.config import Settings
from mediaserver.errors import ApiError, InvalidParameter
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray
from mediaserver.state import ASR, SESSIONS, SETTINGS
from mediaserver.transport.common import json_error, loads_json
from mediaserver.transport.openai.realtime import client_secrets
from mediaserver.transport.openai.realtime.config import RealtimeConfig
from mediaserver.transport.openai.realtime.conversation_config import (
    ConversationConfig,
    default_conversation,
    parse_conversation_session,
)
from mediaserver.transport.openai.realtime.lookups import answer_defaults, check_voice, is_llm_model, llm_model_names
from mediaserver.transport.openai.realtime.mcp_tools import McpPolicy
from mediaserver.transport.openai.realtime.session import RealtimeSession
from mediaserver.transport.openai.realtime.session_update import session_kind
from mediaserver.transport.openai.realtime.values import EventError, new_id
from mediaserver.transport.rtc_peer import patches
from mediaserver.transport.rtc_peer.audio import RTC_SAMPLE_RATE_HZ, AssistantAudioTrack
from mediaserver.transport.rtc_peer.peer import (
    ServerPeer,
    answer_offer,
    can_send_audio,
    read_audio_track,
)
from mediaserver.transport.socket_session import AudioGap

log = logging.getLogger(__name__)

PATH: Final = "/v1/realtime/calls"
ENDED_CALLS_KEPT: Final = 1024  # calls whose end a late hangup is answered for


class EndedCalls:
    """The ids of the calls that ended lately (at most ``ENDED_CALLS_KEPT``): a hangup of one is a
    200, as the call is over. A browser trial's cleanup closed its peer connection, which ends the
    call, then hung up as OpenAI's examples do, and got a 404 every time."""

    def __init__(self) -> None:
        self._ids: collections.OrderedDict[str, None] = collections.OrderedDict()

    def add(self, call_id: str) -> None:
        self._ids[call_id] = None
        while len(self._ids) > ENDED_CALLS_KEPT:
            self._ids.popitem(last=False)

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._ids


ENDED_CALLS: Final = web.AppKey("ended_calls", EndedCalls)
EVENTS_CHANNEL: Final = "oai-events"


class CallNotFound(ApiError):
    status = 404
    code = "call_not_found"


class ChannelSocket:
    """A WebRTC data channel with the face of an aiohttp WebSocket, for the ``SocketSession`` shell.

    The channel is the client's (it arrives after the connection is up); messages sent before it
    opens wait for it."""

    def __init__(self) -> None:
        self.channel: RTCDataChannel | None = None
        self._inbox: asyncio.Queue[WSMessage] = asyncio.Queue()
        self._open = asyncio.Event()
        self._closed = False
        self._close_code: int | None = None

    def attach(self, channel: RTCDataChannel) -> None:
        self.channel = channel

        @channel.on("message")
        def on_message(data: str | bytes) -> None:
            kind = WSMsgType.TEXT if isinstance(data, str) else WSMsgType.BINARY
            self._inbox.put_nowait(WSMessage(kind, data, None))

        @channel.on("close")
        def on_close() -> None:
            self.gone(WSCloseCode.OK)  # the client closed it (a data channel has no close code)

        if channel.readyState == "open":
            self._open.set()
        else:
            channel.on("open", self._open.set)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def prepared(self) -> bool:
        return True

    @property
    def close_code(self) -> int | None:
        return self._close_code

    async def receive(self) -> WSMessage:
        return await self._inbox.get()

    async def send_str(self, data: str, compress: int | None = None) -> None:
        await self._open.wait()
        if not self._closed and self.channel is not None and self.channel.readyState == "open":
            self.channel.send(data)

    async def send_bytes(self, data: bytes, compress: int | None = None) -> None:
        await self._open.wait()
        if not self._closed and self.channel is not None and self.channel.readyState == "open":
            self.channel.send(data)

    def gone(self, code: int) -> None:
        """The channel ended from the client's side (``WSCloseCode.OK``: it closed it;
        ``ABNORMAL_CLOSURE``: its connection failed or went silent): what the session's close logs,
        not the code the server would have closed with."""
        if self._closed:
            return
        self._closed = True
        self._close_code = code
        self._inbox.put_nowait(WSMessage(WSMsgType.CLOSED, None, None))

    async def close(self, *, code: int = WSCloseCode.OK, message: bytes = b"", drain: bool = True) -> bool:
        if self._closed:
            return False
        self._closed = True
        self._close_code = code
        if self.channel is not None:
            self.channel.close()
        self._inbox.put_nowait(WSMessage(WSMsgType.CLOSED, None, None))
        return True


class RealtimeCall:
    """One call: the peer connection, its tracks, and the ``RealtimeSession`` on its data channel."""

    def __init__(
        self, app: web.Application, settings: Settings, config: RealtimeConfig, conversation: ConversationConfig
    ) -> None:
        self.app = app
        self.settings = settings
        self.peer = ServerPeer(settings, new_id("rtc"), "call")
        self.socket = ChannelSocket()
        self.audio_out = AudioOut(RTC_SAMPLE_RATE_HZ)
        self.session = RealtimeSession(
            app,
            self.socket,
            settings,
            config,
            beta=False,
            conversation=conversation,
            audio="track",
            audio_out=self.audio_out,
            session_id=self.peer.id,
        )
        self.id = self.session.id
        self.frames_received = 0
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE_HZ)
        self._dropping = False
        self._closed = False
        self.peer.pc.on("datachannel", self._on_datachannel)
        self.peer.pc.on("track", self._on_track)
        self.peer.pc.on("connectionstatechange", self._on_connection_state)

    @property
    def last_activity(self) -> float:
        return self.session.last_activity

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label == EVENTS_CHANNEL and self.socket.channel is None:
            self.socket.attach(channel)
        else:
            log.info("call %s: ignoring data channel %r (events go on %r)", self.id, channel.label, EVENTS_CHANNEL)

    def _on_track(self, track: MediaStreamTrack) -> None:
        self.peer.spawn(
            read_audio_track(
                track,
                self._resampler,
                self._feed,
                self._on_frame,
                on_skipped=self._on_skipped,
            ),
            "call-track",
        )

    async def _on_skipped(self, seconds: float) -> None:
        """The sender says (its timestamps) it skipped ``seconds`` (Opus DTX in silence): the call's
        audio clock goes on by them, in order with its audio (a call's echo is the browser's to
        cancel: no echo line here)."""
        if not self.session.closed:  # (what the gap watcher heard of it is taken off now, before more audio)
            net = round(seconds * SAMPLE_RATE_HZ) - self.session.stream.gap_heard_samples
            if net > 0:
                self.session.enqueue(AudioGap(net))

    def _on_frame(self) -> None:
        self.frames_received += 1
        self.session.last_activity = time.monotonic()

    async def _feed(self, samples: AudioArray) -> None:
        if self.session.closed:
            return
        if self.session.enqueue_audio(samples):
            self._dropping = False
        elif not self._dropping:  # the worker is too far behind: say so once, drop audio
            self._dropping = True
            self.session.send_error(
                "overloaded", "The server is behind by too much audio; audio dropped.", kind="server_error"
            )

    def add_outbound_track(self) -> None:
        """Answers play on a track when the offer can receive audio (silent until there is one);
        an offer that cannot gets the answers' transcripts only."""
        if can_send_audio(self.peer.pc):
            self.peer.pc.addTrack(AssistantAudioTrack(self.audio_out))
        elif self.session.conversation is not None:
            # Nothing could play an answer: answers are their transcripts only.
            self.session.conversation.assistant.out = None
            self.audio_out.close()

    def _on_connection_state(self) -> None:
        state = self.peer.pc.connectionState
        log.info("call %s: connection %s", self.id, state)
        if state in ("failed", "closed"):
            self.socket.gone(WSCloseCode.ABNORMAL_CLOSURE)  # the peer is gone: no clean close
            self.peer.spawn(self.aclose(), "call-close")

    def start(self) -> None:
        self.session.start()
        self.session.send_created()
        self.peer.spawn(self._run(), "call-events")
        self.peer.start_watchdogs(closed=lambda: self._closed, close=self._peer_lost)

    async def _peer_lost(self) -> None:
        """The watchdogs': the peer never connected, or went silent."""
        self.socket.gone(WSCloseCode.ABNORMAL_CLOSURE)
        await self.aclose()

    async def _run(self) -> None:
        try:
            await self.session.run()
        finally:
            self.peer.spawn(self.aclose(), "call-close")

    async def aclose(self) -> None:
        """Idempotent: the session (its conversation, turn and streams), the tracks, the connection."""
        if self._closed:
            return
        self._closed = True
        self.app[SESSIONS].discard(self.id)
        if ENDED_CALLS in self.app:
            self.app[ENDED_CALLS].add(self.id)
        try:
            await self.session.aclose(WSCloseCode.GOING_AWAY, "call ended")
        finally:
            await self.peer.aclose()  # its tasks, and the connection (never raises, even half built)


# --- HTTP -----------------------------------------------------------------------------------------------


async def _read_limited(read: Any, limit: int) -> bytes:
    data = bytearray()
    while chunk := await read(64 * 1024):
        data += chunk
        if len(data) > limit:
            raise InvalidParameter(f"the offer is too large (realtime_max_call_bytes={limit})", param="sdp")
    return bytes(data)


async def read_offer(request: web.Request, limit: int) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and the optional ``session`` object, from a raw SDP body or the multipart form."""
    if request.content_length is not None and request.content_length > limit:
        raise InvalidParameter(f"the offer is too large (realtime_max_call_bytes={limit})", param="sdp")
    fields: dict[str, bytes] = {}
    if request.content_type == "multipart/form-data":
        try:
            reader = await request.multipart()
            total = 0
            async for part in reader:
                if not isinstance(part, BodyPartReader) or part.name not in ("sdp", "session"):
                    continue
                fields[part.name] = await _read_limited(part.read_chunk, limit - total)
                total += len(fields[part.name])
        except (ValueError, AssertionError) as exc:  # aiohttp's multipart reader on a broken form
            raise InvalidParameter(f"malformed multipart body: {exc}", param="body") from None
    else:
        fields["sdp"] = await _read_limited(request.content.read, limit)
    sdp = fields.get("sdp", b"").decode("utf-8", "replace")
    if not sdp.strip().startswith("v="):
        raise InvalidParameter("expected an SDP offer: the body (application/sdp) or the 'sdp' form field", param="sdp")
    session: dict[str, Any] | None = None
    if "session" in fields:
        try:
            parsed = loads_json(fields["session"])
        except ValueError as exc:
            raise InvalidParameter(json_error(exc, "'session' must be a JSON object"), param="session") from None
        if not isinstance(parsed, dict):
            raise InvalidParameter("'session' must be a JSON object", param="session")
        session = parsed
    return sdp, session


def call_config(request: web.Request, session: dict[str, Any] | None) -> tuple[RealtimeConfig, ConversationConfig]:
    """The call's configuration: the URL's ``model``, then the posted ``session`` over it."""
    app, settings = request.app, request.app[SETTINGS]
    models = app[ASR].models
    secret = client_secrets.from_request(request)
    if secret is not None:
        client_secrets.check_kind(secret, "conversation")  # calls carry conversations only
    kind, config, llm_model = session_kind(
        settings, models, request.query, lambda name: is_llm_model(app, name), lambda: llm_model_names(app)
    )
    if kind != "conversation" or (session is not None and session.get("type") == "transcription"):
        raise InvalidParameter(
            "this server runs conversations (session.type 'realtime') over WebRTC; transcribe over the "
            "WebSocket with ?intent=transcription",
            param="session.type",
        )
    conversation = default_conversation(
        settings,
        config,
        llm_model,
        request.query.get("model", "").strip() or None,
        lambda name: answer_defaults(app, settings, name),
    )
    if secret is not None:  # the secret's session config, then the posted one over it
        config, applied = client_secrets.apply(app, secret.session, config, conversation)
        assert applied is not None
        conversation = applied
    if session is not None:
        try:
            conversation = parse_conversation_session(
                session,
                conversation,
                models,
                check_voice=lambda name, param: check_voice(app, name, param),
                is_llm=lambda name: is_llm_model(app, name),
                answer_of=lambda name: answer_defaults(app, settings, name),
                mcp_policy=McpPolicy.of(settings),
            )
        except EventError as exc:
            raise InvalidParameter(exc.message, param=exc.param) from None
    return conversation.input, conversation


async def calls_handler(request: web.Request) -> web.Response:
    """POST /v1/realtime/calls: SDP offer in, ``201`` with the SDP answer out."""
    settings = request.app[SETTINGS]
    client_secrets.from_request(request)  # a bad client secret is a 401 before the body is read
    sdp, session = await read_offer(request, settings.realtime_max_call_bytes)
    config, conversation = call_config(request, session)
    call = RealtimeCall(request.app, settings, config, conversation)
    try:
        request.app[SESSIONS].add(call.id, call)
    except ApiError:
        await call.aclose()
        raise

    def prepare() -> None:
        if call.peer.pc.sctp is None:
            raise InvalidParameter(
                f"the SDP offer has no data channel; open one labelled {EVENTS_CHANNEL!r} for the events",
                param="sdp",
            )
        call.add_outbound_track()

    try:
        answer = await answer_offer(
            call.peer.pc,
            sdp,
            session_id=call.id,
            prepare=prepare,
            opus_dtx=request.app[SETTINGS].rtc_opus_dtx,
            idle_rtcp_interval_s=request.app[SETTINGS].rtc_idle_rtcp_interval_s,
            audio_jitter_frames=request.app[SETTINGS].rtc_audio_jitter_frames,
        )
    except BaseException:
        await call.aclose()
        raise
    call.start()
    log.info("call %s: answered offer from %s", call.id, request.remote)
    return web.Response(
        status=201, text=answer, content_type="application/sdp", headers={"Location": f"{PATH}/{call.id}"}
    )


async def hangup_handler(request: web.Request) -> web.Response:
    """POST /v1/realtime/calls/{call_id}/hangup: end a call."""
    call_id = request.match_info["call_id"]
    call = request.app[SESSIONS].get(call_id)
    if not isinstance(call, RealtimeCall):
        if call_id in request.app[ENDED_CALLS]:
            return web.Response(status=200)  # (it ended already: closed by the client, say)
        raise CallNotFound(f"no call {call_id!r}", param="call_id")
    await call.aclose()
    return web.Response(status=200)


def add_routes(app: web.Application) -> None:
    patches.install()
    app[ENDED_CALLS] = EndedCalls()
    app.router.add_post(PATH, calls_handler)
    app.router.add_post(PATH + "/{call_id}/hangup", hangup_handler)
