"""The device stream WebSocket, GET /api/ws/asr (docs/ws-protocol.md)."""
