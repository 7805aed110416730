"""SDP: what the server checks in an offer before aiortc takes it, and what it changes in its answer.

aiortc parses an offer with asserts and finds some problems only later, in a background task
nobody awaits (an offer without ``a=fingerprint`` is accepted, and its DTLS start fails with an
AssertionError once ICE is done, logged as "Task exception was never retrieved"). ``check_offer``
refuses such offers up front; ``sdp_problem`` turns whatever aiortc raises into a client-facing
reason.
"""

from __future__ import annotations

import re

from aiortc import sdp as aiortc_sdp

from mediaserver.errors import InvalidParameter


def check_offer(text: str) -> None:
    """Refuse what aiortc would accept now and fail on later, in a task of its own.

    Parse errors propagate as whatever aiortc's parser raises (the caller maps them with
    ``sdp_problem``)."""
    description = aiortc_sdp.SessionDescription.parse(text)
    for index, media in enumerate(description.media):
        where = f"m-line {index} ({media.kind})"
        if media.dtls is None or not media.dtls.fingerprints:
            raise InvalidParameter(f"malformed SDP offer: {where} has no a=fingerprint or a=setup", param="sdp")
        if media.kind == "application":
            port = media.fmt[0] if media.profile == "DTLS/SCTP" and media.fmt else media.sctp_port
            if not isinstance(port, int) and not (isinstance(port, str) and port.isdigit()):
                raise InvalidParameter(f"malformed SDP offer: {where} has no SCTP port", param="sdp")


def sdp_problem(exc: Exception) -> str:
    """A client-facing reason for an offer aiortc could not take. Its ValueErrors and RTC errors
    say what is wrong ("RTCP mux is not enabled"); an assertion or a missing attribute deep in the
    parser only says that the SDP is incomplete."""
    reason = str(exc).strip()
    internal = isinstance(exc, (AssertionError, AttributeError, KeyError, IndexError, TypeError))
    if internal or not reason or reason.endswith("is not in list"):
        reason = "a required line is missing or malformed"
    return f"malformed SDP offer: {reason}"


_OPUS_RTPMAP = re.compile(r"^a=rtpmap:(\d+) opus/48000(?:/2)?$", re.IGNORECASE)


def with_opus_dtx(sdp: str) -> str:
    """Ask the browser for Opus DTX and in-band FEC in an SDP answer.

    With ``usedtx=1`` a browser sends a packet every ~400 ms (or none) while the microphone hears
    silence instead of 50 a second: a hands-free session idles at 1-3 kbps instead of ~25. The
    server's segmenter counts missing audio as silence (``stream_gap_fill_ms``), so utterances
    still end on time. aiortc writes no ``fmtp`` for Opus; an existing one is extended.
    """
    eol = "\r\n" if "\r\n" in sdp else "\n"
    lines = sdp.split(eol)
    for line in list(lines):
        match = _OPUS_RTPMAP.match(line)
        if match is None:
            continue
        prefix = f"a=fmtp:{match.group(1)} "
        existing = next((i for i, other in enumerate(lines) if other.startswith(prefix)), None)
        if existing is None:
            lines.insert(lines.index(line) + 1, f"{prefix}usedtx=1;useinbandfec=1")
            continue
        params: dict[str, str] = {}
        for part in lines[existing][len(prefix) :].split(";"):
            if part:
                key, _, value = part.partition("=")
                params[key] = value
        params.update(usedtx="1", useinbandfec="1")
        lines[existing] = prefix + ";".join(f"{k}={v}" if v else k for k, v in params.items())
    return eol.join(lines)
