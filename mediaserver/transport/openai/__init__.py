"""OpenAI-compatible faces: audio transcriptions, speech, chat and embeddings, models, and Realtime."""
