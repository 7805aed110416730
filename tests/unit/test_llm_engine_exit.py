"""What clients and /health read of the llama-server engine's end: words, not its raw log lines."""

from __future__ import annotations

from mediaserver.llm.engine_output import describe_exit, is_error_line, line_level, summarize_error

# Lines as llama-server (--log-prefix) wrote them for a file that is not a GGUF, and while serving.
BROKEN_MODEL = [
    "0.00.010.318 I srv    load_model: loading model '/tmp/broken.gguf'",
    "0.00.010.449 E gguf_init_from_reader: invalid magic characters: 'xxxx', expected 'GGUF'",
    "0.00.011.458 E llama_model_load: error loading model: llama_model_loader: failed to load model from "
    "/tmp/broken.gguf",
    "0.00.011.723 E cmn  common_init_: failed to load model '/tmp/broken.gguf'",
    "0.00.011.774 E srv    load_model: failed to load model, '/tmp/broken.gguf'",
    "0.00.012.230 E srv  llama_server: exiting due to model loading error",
]
TIMINGS = (
    "0.01.277.252 I slot print_timing: id  0 | task 0 | prompt eval time =     307.51 ms /    31 tokens "
    "(    9.92 ms per token,   100.81 tokens per second)"
)
SECURITY = (
    "0.00.008.982 W srv  llama_server: security: no API key is set and CORS allows all origins "
    "(see https://github.com/ggml-org/llama.cpp/pull/25655)"
)


def test_levels_are_read_after_the_timestamp() -> None:
    assert [line_level(line) for line in BROKEN_MODEL] == ["I", "E", "E", "E", "E", "E"]
    assert line_level(TIMINGS) == "I" and line_level(SECURITY) == "W"
    assert line_level("/src/ggml.c:1234: GGML_ASSERT(n > 0) failed") is None


def test_error_lines() -> None:
    assert [is_error_line(line) for line in BROKEN_MODEL] == [False, True, True, True, True, True]
    assert not is_error_line(TIMINGS) and not is_error_line(SECURITY)
    assert is_error_line("/src/ggml.c:1234: GGML_ASSERT(n > 0) failed")  # no level: says it failed


def test_an_error_line_is_summarised_without_its_prefixes() -> None:
    assert summarize_error(BROKEN_MODEL[1]) == "invalid magic characters: 'xxxx', expected 'GGUF'"
    assert summarize_error(BROKEN_MODEL[2]) == (
        "error loading model: llama_model_loader: failed to load model from /tmp/broken.gguf"
    )
    assert summarize_error(BROKEN_MODEL[3]) == "failed to load model '/tmp/broken.gguf'"
    assert summarize_error(BROKEN_MODEL[4]) == "failed to load model, '/tmp/broken.gguf'"
    long = summarize_error("0.00.012.230 E srv  llama_server: " + "x" * 500)
    assert len(long) == 160 and long.endswith("…")


def test_an_exit_is_said_in_words() -> None:
    assert describe_exit(1) == "exited with code 1"
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(-9) == "was killed by signal 9 (SIGKILL)"
    assert describe_exit(-6) == "was killed by signal 6 (SIGABRT)"
    assert describe_exit(-200) == "was killed by signal 200"
