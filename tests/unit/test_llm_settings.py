"""The LLM's settings at non-default values, each shown changing what runs: the llama-server
command line, the engine's start and restart timing, sampling defaults and caps, model aliases, the
upstream's concurrency and the WIS chatbot's system prompt. No engine is started here but the one
that must not become healthy in time."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest

from mediaserver.config import GenerationDefaults, Settings
from mediaserver.devices import DeviceChoice, GpuInfo, choose_device
from mediaserver.errors import InvalidParameter, ModelUnavailable, UnknownModel
from mediaserver.llm.embedder import EmbeddingServerProcess
from mediaserver.llm.engine_process import LlamaServerProcess, restart_backoff_s
from mediaserver.llm.registry import BUNDLED_NAME, LlmRegistry, bundled_gguf
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage, GenerationParams
from mediaserver.metrics import Metrics
from mediaserver.transport.wis.chatbot import _messages

UPSTREAM_MODEL = "qwen-upstream"  # a model with no built-in sampling defaults


def cuda() -> DeviceChoice:
    gpu = GpuInfo(0, "Test GPU", (8, 6), 8 * 1024 * 1024 * 1024)
    return choose_device("auto", gpus=(gpu,), ctranslate2_cuda_count=1, cpu_count=8)


def flags(settings: Settings, device: DeviceChoice | None = None) -> dict[str, str]:
    """The llama-server command's ``--flag value`` pairs for ``settings``."""
    gguf = bundled_gguf()
    assert gguf is not None
    command = LlamaServerProcess(BUNDLED_NAME, str(gguf), settings, device).command(Path("llama-server"))
    return {flag: value for flag, value in itertools.pairwise(command) if flag.startswith("--")}


# --- the llama-server engine's command line ----------------------------------------------------


def test_threads_and_batches_reach_the_engine_command() -> None:
    default = flags(Settings(_env_file=None))
    assert default["--batch-size"] == default["--ubatch-size"] == "512"
    assert default["--threads-batch"] == default["--threads"]
    tuned = flags(
        Settings(_env_file=None, llm_threads=3, llm_threads_batch=5, llm_batch_tokens=256, llm_ubatch_tokens=64)
    )
    assert (tuned["--threads"], tuned["--threads-batch"]) == ("3", "5")
    assert (tuned["--batch-size"], tuned["--ubatch-size"]) == ("256", "64")
    # llm_threads_batch left at 0 follows llm_threads.
    assert flags(Settings(_env_file=None, llm_threads=3))["--threads-batch"] == "3"


def test_the_engine_prompt_cache_size_reaches_the_command() -> None:
    assert flags(Settings(_env_file=None))["--cache-ram"] == "256"
    assert flags(Settings(_env_file=None, llm_engine_cache_ram_mb=0))["--cache-ram"] == "0"  # off


def test_the_engine_cache_reuse_reaches_the_command() -> None:
    """llm_engine_cache_reuse_tokens: what a trimmed history reuses (test_llm_engine.py measures it)."""
    assert flags(Settings(_env_file=None))["--cache-reuse"] == "64"
    assert flags(Settings(_env_file=None, llm_engine_cache_reuse_tokens=256))["--cache-reuse"] == "256"
    assert flags(Settings(_env_file=None, llm_engine_cache_reuse_tokens=0))["--cache-reuse"] == "0"  # off
    assert flags(Settings(_env_file=None, llm_engine_cache_ram_mb=1024))["--cache-ram"] == "1024"


def test_gpu_layers_are_offloaded_on_cuda_only() -> None:
    assert flags(Settings(_env_file=None), cuda())["--n-gpu-layers"] == "all"
    assert flags(Settings(_env_file=None, llm_gpu_layers=10), cuda())["--n-gpu-layers"] == "10"
    assert flags(Settings(_env_file=None, llm_gpu_layers=10), choose_device("cpu"))["--n-gpu-layers"] == "0"


def test_the_embedding_engine_gets_its_slots_input_size_pooling_and_the_same_threads_and_layers() -> None:
    gguf = bundled_gguf()
    assert gguf is not None
    settings = Settings(
        _env_file=None,
        llm_threads=3,
        llm_threads_batch=5,
        llm_gpu_layers=10,
        llm_embedding_slots=3,
        llm_embedding_max_input_tokens=100,
    )
    command = EmbeddingServerProcess(BUNDLED_NAME, str(gguf), settings, cuda(), "cls").command(Path("llama-server"))
    given = {flag: value for flag, value in itertools.pairwise(command) if flag.startswith("--")}
    assert (given["--parallel"], given["--ctx-size"], given["--batch-size"], given["--ubatch-size"]) == (
        "3", "300", "300", "100",
    )  # fmt: skip
    assert (given["--threads"], given["--threads-batch"], given["--n-gpu-layers"]) == ("3", "5", "10")
    assert given["--pooling"] == "cls" and "--embeddings" in command
    auto = EmbeddingServerProcess(BUNDLED_NAME, str(gguf), Settings(_env_file=None), None, "auto")
    assert "--pooling" not in auto.command(Path("llama-server"))  # the model's own
    assert auto.slots == 4


async def test_an_engine_not_healthy_within_the_start_timeout_is_refused_and_stopped() -> None:
    """The real llama-server on the bundled GGUF takes longer than 50 ms to answer /health; with the
    default 120 s it would start."""
    gguf = bundled_gguf()
    assert gguf is not None
    process = LlamaServerProcess(BUNDLED_NAME, str(gguf), Settings(_env_file=None, llm_engine_start_timeout_s=0.05))
    started = time.monotonic()
    try:
        with pytest.raises(ModelUnavailable, match=r"not healthy within 0\.05 s \(llm_engine_start_timeout_s\)"):
            await asyncio.wait_for(process.start(), 60)
        assert process.state == "failed" and not process.ready
        assert process._process is not None and process._process.pid  # a child was started ...
        assert process._process.returncode is not None  # ... and stopped, not left running
        assert process.pid is None  # (/health shows no pid for a child that is gone)
    finally:
        await process.aclose()
    assert time.monotonic() - started < 30


def test_the_restart_backoff_doubles_up_to_its_cap() -> None:
    capped = Settings(_env_file=None, llm_engine_restart_backoff_s=0.5, llm_engine_restart_max_backoff_s=2.0)
    assert [restart_backoff_s(capped, n) for n in range(5)] == [0.5, 1.0, 2.0, 2.0, 2.0]
    default = Settings(_env_file=None, llm_engine_restart_backoff_s=0.5)
    assert [restart_backoff_s(default, n) for n in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


# --- sampling defaults and caps ------------------------------------------------------------------


def service(**settings: object) -> LlmService:
    """A service whose settings are ``settings`` over an upstream model's (nothing is started)."""
    base = {"llm_upstream_url": "http://127.0.0.1:9/v1", "llm_upstream_models": [UPSTREAM_MODEL]}
    return LlmService(Settings(_env_file=None, **{**base, **settings}), Metrics())  # type: ignore[arg-type]


def test_the_completion_cap_refuses_more_and_caps_the_default() -> None:
    capped = service(llm_max_completion_tokens=50)
    with pytest.raises(InvalidParameter, match=r"at most 50 \(llm_max_completion_tokens\)") as caught:
        capped.resolve(GenerationParams(max_tokens=51), UPSTREAM_MODEL)
    assert caught.value.param == "max_tokens"
    assert capped.resolve(GenerationParams(max_tokens=50), UPSTREAM_MODEL).max_tokens == 50
    # A request that sets none gets llm_default_max_tokens (256), never past the cap.
    assert capped.resolve(GenerationParams(), UPSTREAM_MODEL).max_tokens == 50
    assert service().resolve(GenerationParams(max_tokens=51), UPSTREAM_MODEL).max_tokens == 51


def test_global_sampling_defaults_apply_to_models_without_their_own() -> None:
    tuned = service(llm_default_temperature=1.3, llm_default_top_p=0.5)
    resolved = tuned.resolve(GenerationParams(), UPSTREAM_MODEL)
    assert (resolved.temperature, resolved.top_p) == (1.3, 0.5)
    default = service().resolve(GenerationParams(), UPSTREAM_MODEL)
    assert (default.temperature, default.top_p) == (0.7, 0.95)
    # A request's own values win; the bundled model keeps its card's.
    assert tuned.resolve(GenerationParams(temperature=0.1), UPSTREAM_MODEL).temperature == 0.1
    bundled = tuned.resolve(GenerationParams(), BUNDLED_NAME)
    assert (bundled.temperature, bundled.top_p) == (0.2, 0.9)


def test_per_model_generation_defaults_override_field_by_field() -> None:
    tuned = service(
        llm_generation_defaults={
            BUNDLED_NAME: GenerationDefaults(temperature=0.9, repeat_penalty=1.0),
            UPSTREAM_MODEL: GenerationDefaults(top_p=0.3),
        }
    )
    bundled = tuned.resolve(GenerationParams(), BUNDLED_NAME)
    assert (bundled.temperature, bundled.top_p, bundled.repeat_penalty) == (0.9, 0.9, 1.0)  # top_p: built-in
    upstream = tuned.resolve(GenerationParams(), UPSTREAM_MODEL)
    assert (upstream.temperature, upstream.top_p, upstream.repeat_penalty) == (0.7, 0.3, None)
    assert service().resolve(GenerationParams(), BUNDLED_NAME).repeat_penalty == 1.1


def test_generation_defaults_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDIASERVER_LLM_GENERATION_DEFAULTS", '{"qwen-upstream": {"temperature": 0.1}}')
    assert Settings(_env_file=None).llm_generation_defaults == {UPSTREAM_MODEL: GenerationDefaults(temperature=0.1)}


# --- model names ---------------------------------------------------------------------------------


def test_chat_model_aliases_replace_the_openai_names() -> None:
    registry = LlmRegistry(Settings(_env_file=None, llm_model_aliases={"fast": "@default", "named": BUNDLED_NAME}))
    assert registry.resolve("fast").name == registry.resolve("named").name == BUNDLED_NAME
    with pytest.raises(UnknownModel, match=r"available: .*fast"):
        registry.resolve("gpt-4o-mini")  # a default alias, no longer configured
    assert [info.aliases for info in registry.models() if info.name == BUNDLED_NAME] == [("fast",)]


def test_embedding_model_aliases_replace_the_openai_names() -> None:
    registry = LlmRegistry(Settings(_env_file=None, llm_embedding_aliases={"vectors": "@embedding"}))
    assert registry.resolve("vectors", embedding=True).name == BUNDLED_NAME
    with pytest.raises(UnknownModel, match="unknown embedding model 'text-embedding-3-small'"):
        registry.resolve("text-embedding-3-small", embedding=True)


# --- the upstream ----------------------------------------------------------------------------------


async def test_generations_in_flight_to_the_upstream_are_bounded() -> None:
    """With llm_upstream_max_concurrency=1 the second generation waits in the queue and never reaches
    the upstream while the first is in flight (the default 8 sends both). The upstream accepts and
    never answers: a busy server, which a real one cannot be made to be on demand."""
    connections: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)

    upstream = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    llm = service(llm_upstream_url=f"http://127.0.0.1:{port}/v1", llm_upstream_max_concurrency=1)
    await llm.start()
    question = [ChatMessage("user", "Name three colors.")]

    async def ask() -> str:
        async with llm.stream(question, model=UPSTREAM_MODEL) as answer:
            return await answer.text()

    tasks = [asyncio.ensure_future(ask()) for _ in range(2)]
    try:
        async with asyncio.timeout(30):
            while not connections or (await llm.status())["models"].get(UPSTREAM_MODEL, {}).get("queue") != 1:
                await asyncio.sleep(0.01)
        model = (await llm.status())["models"][UPSTREAM_MODEL]
        assert (model["slots"], model["slots_busy"], model["queue"]) == (1, 1, 1)
        assert len(connections) == 1
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await llm.aclose()
        for writer in connections:
            writer.close()
        upstream.close()
        await upstream.wait_closed()


# --- the WIS chatbot -------------------------------------------------------------------------------


def test_the_wis_chatbot_sends_the_configured_system_prompt() -> None:
    question = "What time is it?"
    messages = _messages(Settings(_env_file=None, llm_system_prompt="Answer like a pirate."), question)
    assert messages == [ChatMessage("system", "Answer like a pirate."), ChatMessage("user", question)]
    assert _messages(Settings(_env_file=None, llm_system_prompt=""), question) == [ChatMessage("user", question)]
    default = _messages(Settings(_env_file=None), question)[0]
    assert default.role == "system" and "voice assistant" in default.content


def test_the_turn_text_scorer_gets_one_more_slot_of_its_own() -> None:
    """turn_text_model "llm": the default model's engine runs llm_slots + 1 slots, the last one the
    scorer's (turns/text_eou.py names it), each with llm_context_tokens; the generations keep theirs."""
    gguf = bundled_gguf()
    assert gguf is not None
    settings = Settings(_env_file=None, llm_slots=3, llm_context_tokens=1024)
    scoring = LlamaServerProcess(BUNDLED_NAME, str(gguf), settings, scoring_slot=True)
    given = dict(itertools.pairwise(scoring.command(Path("llama-server"))))
    assert (given["--parallel"], given["--ctx-size"], scoring.slots, scoring.scoring_slot) == ("4", "4096", 3, 3)
    plain = LlamaServerProcess(BUNDLED_NAME, str(gguf), settings)
    given = dict(itertools.pairwise(plain.command(Path("llama-server"))))
    assert (given["--parallel"], given["--ctx-size"], plain.scoring_slot) == ("3", "3072", None)
