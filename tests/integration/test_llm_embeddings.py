"""POST /v1/embeddings: llama.cpp embedding mode on the bundled GGUF, micro-batched and cached.

Through the ``openai`` SDK (which asks for base64 by default) and plain JSON. A batch is computed
in one llama.cpp call, where the matrix products run in a different order than for one input, so
"the same vector" means equal to float32 rounding (cosine 0.9999+), not bit for bit.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest

from mediaserver.llm.service import LlmService

TEXTS = [
    "Turn on the kitchen lights.",
    "What is the weather like in Paris this afternoon?",
    "Play some quiet music in the living room.",
    "Remind me to call my mother tomorrow morning at nine.",
]


@pytest.fixture
async def client(server: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as sdk:
        yield sdk


def _vectors(response: Any) -> list[np.ndarray]:
    return [np.asarray(item.embedding, dtype=np.float64) for item in sorted(response.data, key=lambda d: d.index)]


async def _metric(server: Any, name: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/metrics") as resp:
        text = await resp.text()
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def test_same_input_same_vector_unit_length(client: openai.AsyncOpenAI) -> None:
    first = await client.embeddings.create(model="text-embedding-3-small", input=TEXTS[0])
    second = await client.embeddings.create(model="smollm2-135m-instruct", input=TEXTS[0], encoding_format="float")
    a, b = _vectors(first)[0], _vectors(second)[0]
    assert a.shape == (576,)  # SmolLM2-135M's hidden size
    assert np.array_equal(a, b)
    assert abs(np.linalg.norm(a) - 1.0) < 1e-4
    assert first.model == "smollm2-135m-instruct"
    assert first.usage.prompt_tokens > 3


async def test_a_chat_model_without_its_own_pooling_is_mean_pooled(
    client: openai.AsyncOpenAI, llm_service: LlmService
) -> None:
    """``llm_embedding_pooling`` auto: the bundled chat model pools nothing itself (llama-server
    refuses it for /v1/embeddings), so its embedding child runs with mean pooling."""
    await client.embeddings.create(model="text-embedding-3-small", input=TEXTS[0])
    embedder = llm_service._embedders["smollm2-135m-instruct"]
    assert embedder.process.pooling == "mean" and embedder.dimensions == 576
    assert embedder.process.ready and embedder.process.command(Path("llama-server"))[-2:] == ["--pooling", "mean"]


async def test_batch_of_n_equals_n_singles(client: openai.AsyncOpenAI) -> None:
    batch = _vectors(await client.embeddings.create(model="text-embedding-3-small", input=[*TEXTS, "fresh input 1"]))
    singles = [
        _vectors(await client.embeddings.create(model="text-embedding-3-small", input=text))[0]
        for text in [*TEXTS, "fresh input 1"]
    ]
    for together, alone in zip(batch, singles, strict=True):
        assert float(together @ alone) > 0.9999
        assert np.allclose(together, alone, atol=2e-3)
    # Different sentences are different vectors.
    assert float(batch[0] @ batch[1]) < 0.99


async def test_concurrent_requests_share_batches_and_the_cache(server: Any, llm_service: LlmService) -> None:
    texts = [f"concurrent sentence number {i} about the garden" for i in range(12)]
    batcher = llm_service._batchers.get("smollm2-135m-instruct")
    calls_before = batcher.calls if batcher else 0
    misses_before = await _metric(
        server, 'mediaserver_llm_embedding_inputs_total{cache="miss",model="smollm2-135m-instruct"}'
    )
    hits_before = await _metric(
        server, 'mediaserver_llm_embedding_inputs_total{cache="hit",model="smollm2-135m-instruct"}'
    )
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as sdk:
        results = await asyncio.gather(*(sdk.embeddings.create(model="text-embedding-3-small", input=t) for t in texts))
        calls = llm_service._batchers["smollm2-135m-instruct"].calls - calls_before
        assert calls < len(texts)  # micro-batched: 12 concurrent requests, fewer llama.cpp calls
        again = await sdk.embeddings.create(model="text-embedding-3-small", input=texts)
    assert llm_service._batchers["smollm2-135m-instruct"].calls - calls_before == calls  # all from the cache
    for single, vector in zip(results, _vectors(again), strict=True):
        assert np.array_equal(_vectors(single)[0], vector)
    misses = await _metric(server, 'mediaserver_llm_embedding_inputs_total{cache="miss",model="smollm2-135m-instruct"}')
    hits = await _metric(server, 'mediaserver_llm_embedding_inputs_total{cache="hit",model="smollm2-135m-instruct"}')
    assert misses - misses_before == 12
    assert hits - hits_before == 12


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": "text-embedding-3-small"}, "input", "required"),
        ({"model": "text-embedding-3-small", "input": []}, "input", "must not be empty"),
        ({"model": "text-embedding-3-small", "input": ["ok", ""]}, "input", "input[1] is empty"),
        ({"model": "text-embedding-3-small", "input": [[1, 2, 3]]}, "input", "valid string"),
        ({"model": "text-embedding-3-small", "input": "x " * 2000}, "input", "llm_embedding_max_input_tokens"),
        ({"model": "text-embedding-3-small", "input": "hi", "dimensions": 8}, "dimensions", "576"),
        ({"model": "whisper-1", "input": "hi"}, "model", "unknown embedding model"),
        ({"model": "text-embedding-3-small", "input": "hi", "encoding_format": "int8"}, "encoding_format", "float"),
    ],
)
async def test_bad_embedding_requests_are_400(server: Any, body: Any, param: str, words: str) -> None:
    async with aiohttp.ClientSession() as session, session.post(f"{server.url}/v1/embeddings", json=body) as resp:
        status, answer = resp.status, await resp.json()
    assert status == 400, answer
    assert answer["error"]["param"] == param
    assert words in answer["error"]["message"], answer


async def test_an_embedding_engine_killed_is_reported_restarted_and_retried(
    server: Any, llm_service: LlmService
) -> None:
    """The embedding engine (its own llama-server child) dies: a request sent at once waits for the
    restarted engine and is answered, or gets a 503 with Retry-After (retrying helps), never
    ``model_unavailable`` (which says it will not); /health names the engine with its restart, and
    /metrics counts the restart apart from the chat engine's (a fault trial: none of it was there)."""
    name = "smollm2-135m-instruct"
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as sdk:
        await sdk.embeddings.create(model="text-embedding-3-small", input="warm the engine")
    process = llm_service._embedders[name].process
    pid, restarts = process.pid, process.restarts
    assert pid is not None and process.label == f"{name} (embeddings)"
    os.kill(pid, signal.SIGKILL)
    body = {"model": "text-embedding-3-small", "input": "a sentence sent as the engine died"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{server.url}/v1/embeddings", json=body) as resp:
            answer = await resp.json()
            if resp.status != 200:
                assert resp.status == 503 and "Retry-After" in resp.headers, (resp.status, answer)
                assert answer["error"]["code"] != "model_unavailable", answer
        async with asyncio.timeout(60):
            while not (process.restarts == restarts + 1 and process.state == "ready"):
                await asyncio.sleep(0.05)
        async with session.post(f"{server.url}/v1/embeddings", json=body) as resp:
            assert resp.status == 200, await resp.text()
        async with session.get(f"{server.url}/health") as resp:
            health = await resp.json()
        engine = health["llm"]["models"][name]["embedding_engine"]
        assert engine["restarts"] == restarts + 1 and engine["healthy"] and engine["pid"] != pid, engine
        assert engine["last_exit"] == "was killed by signal 9 (SIGKILL)", engine
        async with session.get(f"{server.url}/metrics") as resp:
            assert f'mediaserver_llm_engine_restarts_total{{model="{name} (embeddings)"}}' in await resp.text()
