"""The WebRTC peer layer every WebRTC face uses (``webrtc/`` on /api/rtc/asr,
``openai/realtime/calls.py`` on /v1/realtime/calls) and neither owns: ``peer`` (ICE servers,
answering an offer, reading the microphone track, the watchdogs, closing), ``audio`` (the outbound
track), ``sdp`` (offer checks, Opus DTX), ``rtcp`` (quiet reports while idle), ``liveness`` (the
dead-peer watchdog) and ``patches`` (the aiortc/aioice fixes they rely on)."""
