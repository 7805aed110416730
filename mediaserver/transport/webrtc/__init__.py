"""WebRTC: the WIS data-channel session at /api/rtc/asr and the peer toolkit every WebRTC face shares
(SDP checks, the outbound audio track, RTCP and liveness)."""
