"""Settings of the LLM: chat completions, embeddings, the WIS chatbot (mediaserver/llm)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from mediaserver.config.assistant import SPOKEN_SYSTEM_PROMPT
from mediaserver.config.keep_alive import KeepAliveSeconds, keep_alive_field

# OpenAI chat and embedding model names map to the default LLM / embedding model.
DEFAULT_LLM_ALIASES: dict[str, str] = {
    name: "@default"
    for name in ("gpt-4o-mini", "gpt-4o", "gpt-4.1-mini", "gpt-4.1", "gpt-3.5-turbo", "gpt-4", "gpt-5-mini", "gpt-5")
}
DEFAULT_EMBEDDING_ALIASES: dict[str, str] = {
    name: "@embedding" for name in ("text-embedding-3-small", "text-embedding-3-large", "text-embedding-ada-002")
}


class GenerationDefaults(BaseModel):
    """A model's sampling defaults (``llm_generation_defaults``); unset fields keep the built-in or global ones."""

    model_config = {"extra": "forbid"}

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    repeat_penalty: float | None = Field(None, ge=0.5, le=2.0, description="llama.cpp engines only; 1 = off")
    dry_multiplier: float | None = Field(
        None, ge=0, le=5, description="llama.cpp's DRY penalty on repeated sequences (runaway loops); 0 = off"
    )


class LlmSettings(BaseModel):
    """LLM models, the llama-server engine, an upstream, sampling defaults, embeddings (part of ``Settings``)."""

    # --- LLM: chat completions, embeddings, WIS chatbot (mediaserver/llm) ----------------------
    llm_enabled: bool = Field(True, description="false turns the LLM off: every LLM endpoint answers 503")
    llm_model: str = Field(
        "",
        description="default chat model: a name, a .gguf path or a Hugging Face 'owner/repo:file.gguf' id; "
        "empty = the upstream's model when llm_upstream_url is set, else the bundled SmolLM2",
    )
    llm_extra_models: dict[str, str] = Field(
        default_factory=dict, description="name -> .gguf path or Hugging Face 'owner/repo:file.gguf' id"
    )
    llm_model_aliases: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_LLM_ALIASES),
        description="names clients send → a model (`@default`: the default model); OpenAI's chat model names "
        "by default",
    )
    llm_preload: bool = Field(True, description="start the default chat model's engine at start-up, not on first use")
    llm_keep_alive_s: KeepAliveSeconds = keep_alive_field(
        "a local chat model (its llama-server child: stopped when idle, started again by the next request)"
    )
    llm_slots: int = Field(
        4,
        ge=1,
        le=64,
        description="generations one llama-server engine runs at once (--parallel), continuously batched; more "
        "wait in the queue (llm_max_queue); the turn text scorer (turn_text_model) gets one more slot of its own",
    )
    llm_context_tokens: int = Field(
        2048, ge=128, description="context window of each slot (prompt + answer); the engine holds llm_slots of them"
    )
    llm_max_prompt_tokens: int = Field(
        1792,
        ge=16,
        description="longer prompts get a 400 (context_length_exceeded): the embedded engine counts them with its "
        "own template and tokenizer (and also holds them below llm_context_tokens); an upstream's are estimated at "
        "llm_upstream_bytes_per_token, and one estimated over this is refused before it is sent",
    )
    llm_max_completion_tokens: int = Field(1024, ge=1, description="cap on a request's max_tokens")
    llm_default_max_tokens: int = Field(
        256,
        ge=1,
        description="max_tokens of a chat request that sets none: an answer that does not end stops here "
        "(a few seconds, not a 15 s runaway)",
    )
    llm_max_queue: int = Field(16, ge=1, description="generations waiting per model; more get a 503")
    llm_request_timeout_s: float = Field(120.0, gt=0, description="queue wait + generation; 504 past it")
    llm_max_request_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="JSON bodies of the LLM APIs")
    llm_threads: int = Field(0, ge=0, description="llama.cpp threads; 0 = half the cores (the rest for ASR)")
    llm_threads_batch: int = Field(
        0, ge=0, description="llama.cpp threads of prompt evaluation (--threads-batch); 0 = llm_threads"
    )
    llm_batch_tokens: int = Field(512, ge=16, description="llama.cpp logical batch (-b, n_batch)")
    llm_ubatch_tokens: int = Field(512, ge=16, description="llama.cpp physical batch (-ub, n_ubatch)")
    llm_gpu_layers: int = Field(-1, ge=-1, description="layers offloaded on CUDA builds; -1 = all")
    llm_engine_binary: Path | None = Field(
        None,
        description="the llama-server to run; none = the one `make setup` built (tools/build_llama_cpp.py "
        "--server, in ~/.cache/mediaserver/llama-server), else llama-server on PATH",
    )
    llm_engine_cache_ram_mb: int = Field(
        256, ge=0, description="llama-server's host-memory prompt cache (--cache-ram) beside each slot's own; 0 = off"
    )
    llm_engine_cache_reuse_tokens: int = Field(
        64,
        ge=0,
        description="llama-server reuses cached runs of at least this many prompt tokens that moved (--cache-reuse, "
        "KV shifting): when the voice loop's history drops its oldest turn, the turns after it are not evaluated "
        "again; 0 = off (every turn past assistant_history_turns then re-reads the whole history)",
    )
    llm_engine_start_timeout_s: float = Field(120.0, gt=0, description="engine start until /health answers ok")
    llm_engine_ready_wait_s: float = Field(
        30.0, gt=0, description="a request waits this long for a restarting engine, then gets a 503"
    )
    llm_engine_restart_backoff_s: float = Field(
        0.5, ge=0, description="pause before restarting a crashed engine, doubled per crash in a row"
    )
    llm_engine_restart_max_backoff_s: float = Field(
        30.0,
        ge=0,
        description="the longest wait before restarting an engine that keeps crashing (the backoff doubles "
        "per crash in a row)",
    )
    llm_engine_probe_interval_s: float = Field(
        2.0,
        gt=0,
        description="how often a running llama-server engine's own /health is asked: how a child that is "
        "alive but wedged (stopped, deadlocked) is noticed, which its exit code never tells",
    )
    llm_engine_probe_timeout_s: float = Field(
        3.0,
        gt=0,
        description="a health probe unanswered this long has failed. A busy engine answers /health from its "
        "HTTP threads, beside the decoding: at most 13 ms with all 4 slots generating on 2 cores at load 4 "
        "(measured); a stopped one never does, so seconds tell the two apart with a wide margin",
    )
    llm_engine_probe_failures: int = Field(
        2,
        ge=1,
        description="health probes failed in a row before the engine is unhealthy: /health says "
        "'unresponsive' and LLM requests get a 503 with Retry-After at once, until it answers again",
    )
    llm_engine_hang_restart_s: float = Field(
        30.0,
        gt=0,
        description="an unhealthy engine that has answered no health probe for this long is killed (SIGKILL) and "
        "restarted. Ten probe timeouts: a slow but working engine answers well within it; one that "
        "answers again sooner is healthy again without a restart",
    )
    llm_engine_stop_timeout_s: float = Field(
        2.0,
        gt=0,
        description="a llama-server engine told to stop (SIGTERM: the server's shutdown, an idle unload, a start "
        "that failed) that has not exited within this is killed (SIGKILL), with a warning. It holds nothing to "
        "save and exits within half a second when well, so the wait only bounds how long a stuck one holds up "
        "the shutdown",
    )
    llm_default_temperature: float = Field(0.7, ge=0, le=2, description="for models without defaults of their own")
    llm_default_top_p: float = Field(0.95, gt=0, le=1, description="for models without defaults of their own")
    llm_generation_defaults: dict[str, GenerationDefaults] = Field(
        default_factory=dict,
        description="model name -> sampling defaults applied when a request leaves them out (over the built-in "
        "ones of known models, mediaserver/llm/defaults.py)",
    )
    llm_chat_templates: dict[str, Path] = Field(
        default_factory=dict,
        description="model name -> a Jinja chat template file the llama-server engine uses instead of the GGUF's "
        "own (the bundled SmolLM2 gets one that renders tools, mediaserver/llm/chat_templates/)",
    )
    llm_vision_projectors: dict[str, str] = Field(
        default_factory=dict,
        description="model name -> its multimodal projector (.gguf path or Hugging Face 'owner/repo:file.gguf'): "
        "the llama-server engine then takes image_url parts for that model",
    )
    llm_max_images: int = Field(8, ge=0, description="image_url parts in one chat request; more get a 400")
    llm_chatbot_max_tokens: int = Field(
        512,
        ge=1,
        description="max_tokens of a WIS chatbot question (GET /api/chatbot, /api/chatbot/tts, WS /api/ws/chatbot) "
        "that sets no max_new_tokens (the socket cannot set one), as WIS's chatbot_max_new_tokens; a lower "
        "llm_max_completion_tokens wins",
    )
    llm_system_prompt: str = Field(
        SPOKEN_SYSTEM_PROMPT,
        description="system message of the WIS chatbot endpoints (OpenAI clients send their own); the same as "
        "assistant_system_prompt, whose description says why it holds an example",
    )
    llm_upstream_url: str | None = Field(None, description="an OpenAI-compatible base URL, e.g. http://vllm:8000/v1")
    llm_upstream_api_key: str | None = Field(None, description="the key sent to `llm_upstream_url`")
    llm_upstream_models: list[str] = Field(
        default_factory=list, description="models to offer from the upstream; empty = what it lists at start-up"
    )
    llm_upstream_connect_timeout_s: float = Field(5.0, gt=0, description="connecting to the upstream")
    llm_upstream_timeout_s: float = Field(60.0, gt=0, description="silence from the upstream before a 504")
    llm_upstream_retries: int = Field(
        2,
        ge=0,
        description="retries after a connection error: none made, or one dropped before the answer began (the "
        "request may have been sent; generating again changes nothing upstream); never after a timeout or an "
        "error answer",
    )
    llm_upstream_max_concurrency: int = Field(8, ge=1, description="generations in flight to the upstream")
    llm_upstream_bytes_per_token: float = Field(
        3.0,
        ge=1.0,
        description="an upstream's prompt is estimated at this many bytes a token (its tokenizer is not at hand): "
        "a request estimated over llm_max_prompt_tokens is a 400, and spoken answers are cut to fit it; lower is "
        "safer (1 never undercounts a byte-level tokenizer) but refuses more, and llm_max_prompt_tokens should "
        "stay below the upstream's context window",
    )
    llm_embedding_model: str = Field(
        "", description="a name, .gguf path or hub id; empty = the default chat model if a GGUF, else the bundled one"
    )
    llm_embedding_aliases: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_EMBEDDING_ALIASES),
        description="names clients send → the embedding model (`@embedding`); OpenAI's embedding model names "
        "by default",
    )
    llm_embedding_pooling: Literal["auto", "mean", "cls", "last"] = Field(
        "auto", description="auto = the model's own pooling, mean for chat models that have none"
    )
    llm_embedding_slots: int = Field(
        4, ge=1, le=64, description="inputs the embedding model's llama-server child computes at once (--parallel)"
    )
    llm_embedding_batch_window_ms: float = Field(5.0, ge=0, description="collect concurrent inputs this long")
    llm_embedding_max_batch: int = Field(32, ge=1, description="inputs per request to the embedding engine")
    llm_embedding_max_inputs: int = Field(256, ge=1, description="inputs per request")
    llm_embedding_max_input_tokens: int = Field(512, ge=8, description="longer inputs get a 400")
    llm_embedding_cache_entries: int = Field(4096, ge=0, description="LRU cache of embeddings; 0 = off")
