"""Settings of the transports: WebRTC peers, WebSocket streams, OpenAI Realtime, Wyoming."""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, Field, SecretStr, field_validator


class TransportSettings(BaseModel):
    """Per-protocol limits and timeouts of the faces in ``mediaserver/transport`` (part of ``Settings``)."""

    # --- WebRTC --------------------------------------------------------------------------------
    rtc_ice_servers: list[str] = Field(default_factory=list, description="stun:/turn: URLs; none = host candidates")
    rtc_turn_username: str | None = Field(
        None, description="the TURN user name for the `turn:` URLs of `rtc_ice_servers`"
    )
    rtc_turn_password: str | None = Field(
        None, description="the TURN password for the `turn:` URLs of `rtc_ice_servers`"
    )
    rtc_udp_port_min: int = Field(0, ge=0, le=65535, description="0 = any ephemeral port")
    rtc_udp_port_max: int = Field(
        0,
        ge=0,
        le=65535,
        description="the highest UDP port of WebRTC media (see `rtc_udp_port_min`); 0 = any ephemeral port",
    )
    rtc_connect_timeout_s: float = Field(
        10.0, gt=0, description="an answered offer whose peer has not connected by then is closed (frees its slot)"
    )
    rtc_dead_peer_timeout_s: float = Field(
        5.0,
        ge=0,
        description="a connected peer that sends nothing at all (no media, RTCP, data or ICE) for this long is "
        "closed; after half of it the server sends an ICE consent check to make a live peer answer; 0 = off "
        "(then only ICE consent expiry, ~30 s, ends it)",
    )
    rtc_audio_jitter_frames: int = Field(
        1,
        ge=1,
        le=15,
        description="audio packets an inbound track's jitter buffer holds before passing the oldest on (aiortc's "
        "own: 4, 80 ms added to every end of speech; 1: a packet goes on when the next shows it is whole); "
        "reordered packets are still put in order",
    )
    rtc_opus_dtx: bool = Field(True, description="ask browsers for Opus DTX (silence costs ~2 kbps, not ~25)")
    rtc_idle_rtcp_interval_s: float = Field(
        5.0,
        ge=0,
        description="RTCP reports of a stream with no media since its previous report (a paused microphone, "
        "an assistant not speaking) come every this many seconds (± 50 %) instead of aiortc's 0.5–1.5 s; "
        "0 = aiortc's cadence always",
    )

    # --- WebSocket streams ---------------------------------------------------------------------
    ws_max_message_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="the largest message on every WebSocket (a message of exactly this size is accepted); Realtime "
        "takes at least one whole 15 MiB audio append, base64-encoded (about 21 MiB), whatever this says",
    )
    ws_heartbeat_s: float = Field(20.0, gt=0, description="the WebSockets' ping interval")
    ws_idle_timeout_s: float = Field(
        300.0, gt=0, description="a device stream or Realtime session with no message this long is closed"
    )
    ws_answer_lead_ms: int = Field(200, ge=0, description="answer audio sent ahead of real time (voice loop)")

    # --- OpenAI Realtime conversations (/v1/realtime, /v1/realtime/calls) ------------------------
    realtime_audio_lead_ms: int = Field(
        1000, ge=0, description="WebSocket answer audio sent at most this far ahead of real time"
    )
    realtime_prefix_padding_ms: int = Field(
        300,
        ge=0,
        description="server_vad prefix_padding_ms when a Realtime session does not set it: OpenAI's documented "
        "default (the other streams use stream_vad_preroll_ms)",
    )
    realtime_max_items: int = Field(1000, ge=2, description="conversation items kept; older ones are forgotten")
    realtime_max_call_bytes: int = Field(
        256 * 1024, ge=1024, description="POST /v1/realtime/calls body (the SDP offer and the session)"
    )
    # Client secrets (ephemeral keys, /v1/realtime/client_secrets): stateless HMAC-signed tokens.
    realtime_client_secret_key: SecretStr | None = Field(
        None,
        description="the key client secrets are sealed under (AES-256-GCM); the same on every replica so any "
        "accepts them. "
        "Unset: a random key per process (a restart invalidates every secret)",
    )
    realtime_client_secret_default_ttl_s: int = Field(600, ge=10, description="expires_after.seconds by default")
    realtime_client_secret_max_ttl_s: int = Field(7200, ge=10, description="the longest expires_after.seconds")
    realtime_client_secret_max_chars: int = Field(
        4096, ge=256, description="a secret carries its session config: past this length minting is a 400"
    )

    # --- Wyoming (Home Assistant) --------------------------------------------------------------
    wyoming_enabled: bool = Field(True, description="serve Wyoming (Home Assistant) on `wyoming_port`")
    wyoming_host: str | None = Field(
        None,
        description="address the Wyoming server listens on; unset = 0.0.0.0, or 127.0.0.1 when auth is on "
        "(Wyoming clients cannot send credentials: exposing it then is an explicit choice)",
    )
    wyoming_allowed_networks: list[str] = Field(
        default_factory=list, description="client networks (CIDRs) allowed to connect; empty = any"
    )
    wyoming_max_connections: int = Field(32, ge=1, description="open Wyoming connections; more get an error")
    wyoming_max_buffered_audio_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="audio held for transcription across all Wyoming connections"
    )
    wyoming_port: int = Field(10300, ge=0, le=65535, description="the Wyoming TCP port")
    wyoming_zeroconf: bool = Field(
        False, description="announce the server as `_wyoming._tcp` so Home Assistant discovers it"
    )
    wyoming_zeroconf_name: str = Field("mediaserver", description="the name zeroconf announces")
    wyoming_max_event_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="the largest Wyoming event a client may send"
    )
    wyoming_idle_timeout_s: float = Field(
        60.0, gt=0, description="a Wyoming connection that sends nothing (or reads nothing) this long is closed"
    )

    @field_validator("wyoming_allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            ipaddress.ip_network(network.strip(), strict=False)  # ValueError names the bad entry
        return [network.strip() for network in value]
