"""Semantic end of turn: Smart Turn v3.2 scores each pause (``model``) on Whisper features (``features``);
``fetch`` installs the model file (``make setup``)."""
