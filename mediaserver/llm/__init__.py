"""The language model stage: a registry of models, two backends (llama.cpp in-process, an
OpenAI-compatible upstream) and the shared service with its queue, limits and metrics."""
