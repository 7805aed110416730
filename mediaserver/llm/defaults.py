"""Sampling defaults per model: what a request gets for the parameters it leaves out.

A small model answers sensibly only near its card's settings: SmolLM2-135M-Instruct at the server's
old 0.7 without repetition control answered "What is the capital of France?" with 1024 tokens of
looping French; at its card's temperature 0.2 and top_p 0.9, with llama.cpp's repetition penalty
and DRY (which stops runaway repetition), it answers "Paris". Models not listed get the global
``llm_default_temperature`` / ``llm_default_top_p`` and no repetition control (an upstream's own
defaults then apply); ``llm_generation_defaults`` adds or overrides models by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mediaserver.config import GenerationDefaults, Settings

CHAT_TEMPLATES = Path(__file__).parent / "chat_templates"

# The model cards' recommended values (huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct: temperature
# 0.2, top_p 0.9); the repetition controls are llama.cpp's, set where the bundled model stops looping.
BUILTIN: dict[str, GenerationDefaults] = {
    "smollm2-135m-instruct": GenerationDefaults(temperature=0.2, top_p=0.9, repeat_penalty=1.1, dry_multiplier=0.8),
}


# Chat templates that replace a GGUF's own for the llama-server engine. SmolLM2's renders no tools;
# its replacement renders exactly the same prompts without tools, and with them lists the tools and
# writes calls and results the way llama.cpp recognizes (Hermes' <tool_call>), so llama-server
# parses the calls and constrains them with a grammar.
BUILTIN_CHAT_TEMPLATES: dict[str, Path] = {
    "smollm2-135m-instruct": CHAT_TEMPLATES / "smollm2-tools.jinja",
}


def chat_template_for(model: str, settings: Settings) -> Path | None:
    """The template file replacing ``model``'s own (``llm_chat_templates`` first), or None."""
    return settings.llm_chat_templates.get(model) or BUILTIN_CHAT_TEMPLATES.get(model)


@dataclass(frozen=True)
class ModelDefaults:
    temperature: float
    top_p: float
    repeat_penalty: float | None
    dry_multiplier: float | None


def defaults_for(model: str, settings: Settings) -> ModelDefaults:
    """The built-in defaults of ``model``, overridden field by field by ``llm_generation_defaults``."""
    builtin = BUILTIN.get(model, GenerationDefaults())
    configured = settings.llm_generation_defaults.get(model, GenerationDefaults())

    def pick(field: str) -> float | None:
        value: float | None = getattr(configured, field)
        fallback: float | None = getattr(builtin, field)
        return value if value is not None else fallback

    temperature, top_p = pick("temperature"), pick("top_p")
    return ModelDefaults(
        temperature=settings.llm_default_temperature if temperature is None else temperature,
        top_p=settings.llm_default_top_p if top_p is None else top_p,
        repeat_penalty=pick("repeat_penalty"),
        dry_multiplier=pick("dry_multiplier"),
    )
