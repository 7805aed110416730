"""Wyoming (TCP, Home Assistant): the server and its ASR side, TTS, and the framing reader."""
