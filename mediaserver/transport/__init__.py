"""The faces: each protocol family in its own folder, translating its wire format to the session
core's typed events and back. No face imports another; what several share sits here.

- ``webrtc/``: the WIS data-channel session (/api/rtc/asr).
- ``ws/``: the device stream WebSocket (/api/ws/asr).
- ``wyoming/``: the Wyoming TCP server (Home Assistant): ASR, TTS, framing.
- ``openai/``: transcriptions, speech, chat and embeddings, models, and ``realtime/``.
- ``wis/``: the Willow Inference Server routes: ASR, TTS, the chatbot.
- Shared: ``rtc_peer/`` (the WebRTC peer layer both WebRTC faces use: ``peer``, ``audio``, ``sdp``,
  ``rtcp``, ``liveness``, ``patches``), ``common`` (request values), ``socket_session`` (the
  WebSocket shell), ``voice`` (the assistant of a session), ``tts_http`` (speech over HTTP),
  ``lenient_http`` (Willow's raw URLs).
"""
