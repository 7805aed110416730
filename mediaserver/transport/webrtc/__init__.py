"""WebRTC: the WIS data-channel session at /api/rtc/asr. The peer toolkit it shares with the
Realtime calls face (SDP checks, the outbound audio track, RTCP and liveness) is ``rtc_peer/``."""
