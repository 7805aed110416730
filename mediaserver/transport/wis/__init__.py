"""Willow Inference Server (WIS) faces: /api/willow and /api/asr, speech out (/api/tts, /api/sts),
and the legacy chatbot."""
