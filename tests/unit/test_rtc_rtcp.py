"""The aiortc patches (the idle-RTCP wrapper and the others) lean on aiortc internals: these fail
when an aiortc upgrade moves them."""

from __future__ import annotations

import inspect

from aiortc.rtcrtpreceiver import RTCRtpReceiver
from aiortc.rtcrtpsender import RTCRtpSender
from aiortc.rtp import RtcpByePacket, RtcpReceiverInfo, RtcpRrPacket, RtcpSenderInfo, RtcpSrPacket

from mediaserver.transport.rtc_peer import patches
from mediaserver.transport.rtc_peer import rtcp as rtc_rtcp


def test_every_patch_is_installed() -> None:
    installed = patches.install()
    assert installed == dict.fromkeys(
        ("bye_filter", "connect_guard", "idle_rtcp_sender", "idle_rtcp_receiver", "receive_stamp"), True
    )
    assert patches.install() == installed  # idempotent


def test_installed_on_both_report_loops() -> None:
    patches.install()
    for cls, name in ((RTCRtpSender, "idle_rtcp_sender"), (RTCRtpReceiver, "idle_rtcp_receiver")):
        assert getattr(cls._send_rtcp, "_mediaserver_patch", None) == name, cls


def test_aiortc_loops_still_look_as_the_wrapper_expects() -> None:
    """Each report loop is ``_run_rtcp``, sleeps 0.5 + random() s (AIORTC_CADENCE_S on average), then
    builds an SR (sender) or RR (receiver) and hands it to ``self._send_rtcp``."""
    for cls, packet in ((RTCRtpSender, "RtcpSrPacket("), (RTCRtpReceiver, "RtcpRrPacket(")):
        source = inspect.getsource(getattr(cls, rtc_rtcp.LOOP))
        assert "asyncio.sleep(0.5 + random.random())" in source, cls
        assert rtc_rtcp.AIORTC_CADENCE_S == 1.0
        assert packet in source and "await self._send_rtcp(" in source, cls


def test_counters_tell_reports_from_other_rtcp() -> None:
    info = RtcpSenderInfo(ntp_timestamp=1, rtp_timestamp=2, packet_count=7, octet_count=99)
    assert rtc_rtcp._counters([RtcpSrPacket(ssrc=1, sender_info=info)]) == ("sr", 7)
    block = RtcpReceiverInfo(ssrc=5, fraction_lost=0, packets_lost=0, highest_sequence=1234, jitter=0, lsr=0, dlsr=0)
    assert rtc_rtcp._counters([RtcpRrPacket(ssrc=1, reports=[block])]) == ("rr", ((5, 1234),))
    assert rtc_rtcp._counters([RtcpByePacket(sources=[1])]) is None
    assert rtc_rtcp._counters([]) is None
