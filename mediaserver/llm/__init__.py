"""The language model stage: a registry of models, engines behind one OpenAI-compatible client
(llama.cpp's llama-server as a supervised child for local GGUFs, or an external upstream), and the
shared service with its queue, limits and metrics. Embeddings run in-process (llama-cpp-python)."""
