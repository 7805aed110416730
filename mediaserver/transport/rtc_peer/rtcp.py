"""Fewer RTCP reports for a stream that has nothing to report.

aiortc's ``RTCRtpSender`` and ``RTCRtpReceiver`` each run a loop that sends a report (a sender
report, or receiver reports for the streams it has heard) every 0.5–1.5 s, for as long as the
connection lives, whether or not any media flows. A push-to-talk session is paused nearly all the
time: its microphone track sends nothing between utterances, and the assistant's track sends
nothing between answers. Those reports then repeat the same counters every second, and each one
costs the server an SRTCP encryption, a UDP send and the peer's reply traffic. Measured with 40
paused aiortc sessions on loopback, these two loops were over half of the server's CPU.

RFC 3550 (§6.2) recommends a minimum report interval of 5 s, and libwebrtc (Chrome) uses 5 s for
audio anyway. So a sender or receiver whose counters did not move since its previous report (no RTP
sent: the SR's packet count is unchanged; no RTP received: every report block's highest sequence
number is unchanged) waits ``interval_s`` × (0.5–1.5) before its next report instead of aiortc's
0.5–1.5 s; as soon as media flows again the reports follow aiortc's own cadence (the first one may
come up to one long interval late: it carries nothing a receiver needs before then). This is only
a matter of cadence: what is reported, and everything else aiortc does, is unchanged.

Only the peer connections that opt in (``patches.quiet_idle_reports``, the server's own) are
affected; others in the same process (test clients) keep aiortc's cadence. How: ``_send_rtcp`` of
both classes is wrapped (rtc_peer/patches.py); after the loop (the task running ``_run_rtcp``) sent an idle
report, the wrapper calls ``after_report``, which sleeps the extra time before returning to the
loop, which then sleeps its own 0.5–1.5 s. The loop's cancellation (``stop``) still interrupts that
sleep at once. Wrapping needs aiortc internals that may change: it is installed only if they look
as expected (``patches.INSTALLED``; a test fails otherwise), else aiortc's cadence stays and a
warning is logged.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from aiortc import RTCPeerConnection
from aiortc.rtp import RtcpRrPacket, RtcpSrPacket

log = logging.getLogger(__name__)

_INTERVAL = "_mediaserver_idle_rtcp_s"  # set on a sender/receiver that opted in
_LAST = "_mediaserver_last_rtcp_counters"  # what its previous report said
LOOP = "_run_rtcp"  # the name of aiortc's report loop (both classes)
AIORTC_CADENCE_S = 1.0  # aiortc's loop sleeps 0.5 + random() s: 1 s on average


def set_idle_interval(pc: RTCPeerConnection, interval_s: float) -> None:
    """Let ``pc``'s senders and receivers report every ``interval_s`` (± 50 %) while idle; 0 = aiortc's
    cadence. Only once the report loops are wrapped: ``patches.quiet_idle_reports`` does both."""
    for transceiver in pc.getTransceivers():
        for part in (transceiver.sender, transceiver.receiver):
            setattr(part, _INTERVAL, interval_s)


def _counters(packets: list[Any]) -> Any:
    """What a periodic report says about media, or None for any other RTCP (BYE, NACK, PLI)."""
    first = packets[0] if packets else None
    if isinstance(first, RtcpSrPacket):
        return ("sr", first.sender_info.packet_count)
    if isinstance(first, RtcpRrPacket):
        return ("rr", tuple((r.ssrc, r.highest_sequence) for r in first.reports))
    return None


def _called_by_report_loop() -> bool:
    task = asyncio.current_task()
    code = getattr(task.get_coro(), "cr_code", None) if task is not None else None
    return getattr(code, "co_name", None) == LOOP


async def after_report(part: Any, packets: list[Any]) -> None:
    """What the wrapped ``_send_rtcp`` does after a report was sent: an idle one lengthens the wait."""
    interval_s = getattr(part, _INTERVAL, 0.0)
    if interval_s <= 0:
        return
    counters = _counters(packets)
    if counters is None or not _called_by_report_loop():
        return
    idle = counters == getattr(part, _LAST, None)
    setattr(part, _LAST, counters)
    if idle:
        # The loop sleeps 0.5–1.5 s next: together interval_s × (0.5–1.5) on average.
        await asyncio.sleep(max(0.0, interval_s * (0.5 + random.random()) - AIORTC_CADENCE_S))
