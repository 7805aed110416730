"""Speaker embeddings: who is speaking (a GE2E encoder run in numpy, no torch)."""
