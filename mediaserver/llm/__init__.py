"""The language model stage: a registry of models, engines behind one OpenAI-compatible client
(llama.cpp's llama-server as a supervised child for local GGUFs, or an external upstream), and the
shared service with its queue, limits and metrics. Embeddings run on a llama-server child too
(``mediaserver.llm.embedder``)."""
