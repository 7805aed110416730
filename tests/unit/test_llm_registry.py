"""LLM model names → backends, and why the LLM is off when it is (capability gating)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mediaserver.app import feature_requests
from mediaserver.capabilities import decide
from mediaserver.config import Settings
from mediaserver.devices import choose_device
from mediaserver.errors import UnknownModel
from mediaserver.llm.registry import BUNDLED_NAME, LlmRegistry, bundled_gguf


def test_the_bundled_gguf_is_found_without_importing_its_package() -> None:
    path = bundled_gguf()
    assert path is not None and path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_default_and_aliases_resolve_to_the_bundled_model() -> None:
    registry = LlmRegistry(Settings())
    assert registry.default_name == BUNDLED_NAME
    assert registry.unavailable_reason() is None
    for name in (None, "", BUNDLED_NAME, "gpt-4o-mini", "gpt-3.5-turbo"):
        source = registry.resolve(name)
        assert source.name == BUNDLED_NAME and source.backend == "llama.cpp" and source.bundled
    assert registry.resolve("text-embedding-3-small", embedding=True).name == BUNDLED_NAME


def test_unknown_model_is_400_listing_what_exists() -> None:
    with pytest.raises(UnknownModel) as caught:
        LlmRegistry(Settings()).resolve("llama-70b")
    assert caught.value.status == 400 and caught.value.param == "model"
    assert BUNDLED_NAME in caught.value.message and "gpt-4o-mini" in caught.value.message
    with pytest.raises(UnknownModel, match="unknown embedding model"):
        LlmRegistry(Settings()).resolve("whisper-1", embedding=True)


def test_local_gguf_paths_and_extra_models(tmp_path: Path) -> None:
    gguf = tmp_path / "my-model.Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    registry = LlmRegistry(Settings(llm_model=str(gguf), llm_extra_models={"mine": str(gguf)}))
    assert registry.default_name == "my-model.Q4_K_M"
    assert registry.resolve("gpt-4o-mini").location == str(gguf)
    assert registry.resolve("mine").location == str(gguf)
    assert registry.resolve(BUNDLED_NAME).bundled  # still there by name
    # The embedding model follows a GGUF default unless set.
    assert registry.embedding_name == "my-model.Q4_K_M"


def test_hub_ids_are_sources_that_need_the_hub_client() -> None:
    registry = LlmRegistry(Settings(llm_model="bartowski/SmolLM2-360M-Instruct-GGUF:*Q4_K_M.gguf"))
    source = registry.resolve(None)
    assert source.is_hub_id and source.name == "bartowski/SmolLM2-360M-Instruct-GGUF:*Q4_K_M.gguf"


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"llm_enabled": False}, "switched off in settings (llm_enabled=false)"),
        ({"llm_model": "/nowhere/model.gguf"}, "GGUF file '/nowhere/model.gguf' does not exist"),
        ({"llm_model": "no-such-name"}, "llm_model='no-such-name' is not a known name"),
    ],
)
def test_the_llm_is_off_with_a_reason(settings: dict[str, object], reason: str) -> None:
    caps = decide(choose_device("cpu"), feature_requests(Settings(**settings)))  # type: ignore[arg-type]
    assert caps.enabled("asr") and not caps.enabled("llm")
    assert reason in caps.reason("llm")


def test_the_llm_is_on_on_cpu_and_gated_by_vram_on_cuda() -> None:
    assert decide(choose_device("cpu"), feature_requests(Settings())).enabled("llm")
    from mediaserver.devices import GpuInfo

    gpu = GpuInfo(0, "Test GPU", (8, 6), 8 * 1024 * 1024 * 1024)
    device = choose_device("auto", gpus=(gpu,), ctranslate2_cuda_count=1, cpu_count=8)
    short = decide(device, feature_requests(Settings(vram_llm_mb=4000)), free_vram=3000 * 1024 * 1024)
    assert not short.enabled("llm") and "not enough free VRAM" in short.reason("llm")
    roomy = decide(device, feature_requests(Settings(vram_llm_mb=4000)), free_vram=8000 * 1024 * 1024)
    assert roomy.enabled("llm")


def test_an_upstream_model_is_registered_by_settings() -> None:
    registry = LlmRegistry(Settings(llm_upstream_url="http://vllm:8000/v1", llm_upstream_models=["qwen2.5-7b-awq"]))
    assert registry.default_name == "qwen2.5-7b-awq"
    source = registry.resolve("gpt-4o")
    assert source.backend == "upstream" and source.location == "qwen2.5-7b-awq"
    assert registry.unavailable_reason() is None
    # Embeddings stay local: the bundled GGUF.
    assert registry.embedding_name == BUNDLED_NAME
