"""The OpenAPI 3.1 document served at /api/openapi.json: ``document`` (the whole, ``spec()``, with the
speech and transcription paths and the docs page), ``llm`` (chat, embeddings, the WIS chatbot),
``rtc`` (WebRTC signalling and the streaming WebSockets) and ``schema`` (the error shapes and the
builders the parts share)."""
