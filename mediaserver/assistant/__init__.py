"""The voice loop: a session's final transcripts answered by the LLM and spoken back by TTS."""
