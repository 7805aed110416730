"""Settings of the voice loop (mediaserver/assistant) and the MCP servers whose tools it calls."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

# The default system prompt of spoken answers: the voice loop's (assistant_system_prompt) and the WIS
# chatbot's (llm_system_prompt).
SPOKEN_SYSTEM_PROMPT = (
    "You are a friendly voice assistant. Answer in one or two short, plain English sentences. For example, "
    "asked 'What is the capital of Germany?', you answer 'The capital of Germany is Berlin.'"
)


class McpServerConfig(BaseModel):
    """An MCP server whose tools the assistant may call (``mcp_servers``): a URL or a command.

    ``url``: streamable HTTP (``transport: "http"``, what Home Assistant's MCP Server integration
    serves at ``/api/mcp``) or legacy SSE (``transport: "sse"``), with ``headers`` on every request
    (``{"Authorization": "Bearer <long-lived token>"}``). ``command`` + ``args``: a stdio server, a
    child process of mediaserver.
    """

    model_config = {"extra": "forbid"}

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,32}$", description="names the server in logs and metrics")
    url: str | None = None
    transport: Literal["http", "sse"] = "http"
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    allowed_tools: list[str] | None = Field(None, description="offer only these of the server's tools")

    @model_validator(mode="after")
    def _one_way(self) -> McpServerConfig:
        if (self.url is None) == (self.command is None):
            raise ValueError(f"MCP server {self.name!r}: give either url or command")
        return self


class AssistantSettings(BaseModel):
    """Spoken answers and their tools from MCP servers, incl. Realtime sessions' own (part of ``Settings``)."""

    # --- the voice loop: answers spoken back on WebRTC and device sockets (mediaserver/assistant) --
    assistant_system_prompt: str = Field(
        SPOKEN_SYSTEM_PROMPT,
        description="the system prompt of spoken conversations (a client may send its own). The example answer "
        "matters to the bundled SmolLM2-135M: without one it answered 'What is the capital of France?' in French "
        "nonsense with 3 of 48 seeded questions (0 with it) and got 37 of 48 right (42 with it)",
    )
    assistant_speak: bool = Field(True, description="speak answers (false: text only)")
    assistant_voice: str | None = Field(None, description="TTS voice of answers; none = tts_default_voice")
    assistant_llm_model: str | None = Field(None, description="LLM of answers; none = llm_model")
    assistant_max_answer_tokens: int = Field(200, ge=1, description="cap on one spoken answer")
    assistant_temperature: float | None = Field(
        None,
        ge=0,
        le=2,
        description="none = the answering model's own default, as for a chat request without one "
        "(llm/defaults.py: llm_generation_defaults, else the bundled SmolLM2's 0.2, else llm_default_temperature)",
    )
    assistant_history_turns: int = Field(8, ge=0, description="earlier user turns sent with each question")
    assistant_history_tokens: int = Field(
        1500, ge=0, description="and at most this much history (estimated at 4 characters a token)"
    )
    assistant_history_drop_turns: int = Field(
        4,
        ge=1,
        description="once the history holds assistant_history_turns earlier turns, the oldest go this many at a "
        "time (at most assistant_history_turns), so the turns after a drop keep the history's start, which the "
        "LLM engine's prompt cache holds: one at a time, every turn past the limit re-reads or shifts the whole "
        "history (the voice loop's first token 0.15-0.33 s after the turn instead of 0.05-0.09 s, "
        "tools/README.md); 1 = one at a time (the model always sees assistant_history_turns)",
    )
    assistant_turn_timeout_s: float = Field(
        30.0, gt=0, description="an answer whose LLM and TTS produce nothing for this long ends with an error"
    )
    assistant_barge_in: bool = Field(True, description="the user speaking stops the answer being played")
    assistant_rejoin_ms: int = Field(
        2000,
        ge=0,
        description="the same speaker speaking on within this long of a turn's end, before any of its answer "
        "was heard (a turn ended at a pause mid-sentence), makes the two one turn: one user message, one "
        "answer; 0 = never (docs/turns.md)",
    )
    assistant_barge_in_echo_check: bool = Field(
        False,
        description="barge-in on WebRTC and the device WebSocket: speech starting pauses the answer, and the "
        "utterance's final decides: words that are the answer's own (its echo on a device without echo "
        "cancellation) resume it and are not answered, other words cut it (docs/echo.md); false: speech starting "
        "cuts the answer at once. Experimental: off until Whisper's stock phrases on the canceller's residual "
        "echo ('Thank you.') are told from a person",
    )
    assistant_barge_in_echo_suspects: bool | Literal["all"] = Field(
        True,
        description="with assistant_barge_in_echo_check off, on a stream the server cancels echo on: speech that "
        "starts over the answer on frames the canceller's speech gate would have held had it been holding (most "
        "of them quiet against the output's floor or mostly removed by the canceller, as its leaks at a "
        "sentence's first syllable are) pauses the answer instead of cutting it, and the utterance decides: "
        "no words, too short to be speech, the answer's own words, words Whisper scores as no speech "
        "(assistant_barge_in_echo_no_speech) or an utterance mostly of the canceller's residual echo "
        "(assistant_barge_in_echo_residual_share) resume it; any other words cut it (the rule of what the "
        "canceller removed, assistant_barge_in_echo_removed_db, is not applied; docs/echo.md); all: every start over "
        "the answer on such a stream is held so, a burst the segmenter discards resuming the answer instead of "
        "having cut it, but a person whose words the double talk took resumes it too (a barge-in test lost its "
        "person 2 times in 10 loaded runs); false: every start cuts the answer at once",
    )
    assistant_barge_in_echo_match: float = Field(
        0.8,
        gt=0,
        le=1,
        description="the share of a barge-in's words (lowercase, no punctuation) found in the answer played so far "
        "that makes it the answer's echo",
    )
    assistant_barge_in_echo_removed_db: float = Field(
        2.0,
        ge=0,
        description="with the word check, on a stream the server cancels echo on: a barge-in the canceller took this "
        "much out of (dB, the median over its frames with sound) is its residual echo, whatever Whisper wrote on it "
        "('Thank you.'); it also takes a third of short barge-ins said over the echo ('Stop.') for it "
        "(tools/bench_echo_residual.py); 0 = off (docs/echo.md)",
    )
    assistant_barge_in_echo_no_speech: float = Field(
        0.65,
        ge=0,
        le=1,
        description="on a stream the server cancels echo on, over a paused answer: an utterance whose final "
        "Whisper scores at least this likely to be no speech (its segments' highest no_speech_prob) is the "
        "canceller's residual echo, on which Whisper writes its stock phrase ('Thank you.'), whatever its words: "
        "the answer resumes (Whisper's own threshold, 0.6, took a person's 'Thanks.' over the echo; "
        "tools/echo_stock_phrases.py); 0 = off (docs/echo.md)",
    )
    assistant_barge_in_echo_residual_share: float = Field(
        0.6,
        ge=0,
        le=1,
        description="on a stream the server cancels echo on, over a paused answer: an utterance this share or more "
        "of whose voiced frames were the canceller's residual echo (echo_speech_gate_residual_suspect) is the echo, "
        "whatever its words: the answer resumes (leaks after the echo's delay jumped that Whisper wrote words on: 27 "
        "of 32 at 0.6 or more; people's words over the echo: at most 0.42; tools/echo_stock_phrases.py); 0 = off, "
        "and so it is where the speech gate is (echo_speech_gate_db 0) or echo_speech_gate_residual_suspect is 0 "
        "(docs/echo.md)",
    )
    assistant_barge_in_echo_wait_ms: int = Field(
        5000, ge=100, description="an answer paused this long by a barge-in without a decision on its words is cut"
    )
    assistant_barge_in_echo_resume_ms: int = Field(
        300,
        ge=0,
        description="an answer paused for speech that came to nothing (too short to be speech, or no words) "
        "resumes this long after, unless speech starts again meanwhile: that speech then decides, over the "
        "paused answer (a person who starts as a leak ends is heard without the answer's echo over them); "
        "0 = resume at once",
    )
    assistant_barge_in_echo_burst_ms: int = Field(
        250,
        ge=0,
        description="while the paused answer waits on an utterance, one still shorter than stream_min_speech_ms "
        "of voice (a burst the segmenter will discard) ends after this much silence instead of "
        "stream_vad_hangover_ms, and the answer resumes assistant_barge_in_echo_resume_ms after it: each pause "
        "for a leak is that much shorter (a device trial heard one every ~3.5 s of a long answer, 0.6-1.4 s of "
        "held frames each); 0 = stream_vad_hangover_ms",
    )
    assistant_barge_in_echo_defer_restarts: bool = Field(
        True,
        description="a suspect start (assistant_barge_in_echo_suspects) just after the device's playback started "
        "afresh (within echo_speech_gate_restart_ms: a sentence after the device ran dry, an answer resumed), "
        "where the canceller lets the first syllable through, waits to pause the answer until it has "
        "stream_min_speech_ms of voice: pausing on each such leak left a 0.6 s hole every 1-2 s of a long answer "
        "on a busy machine (a user trial); what is shorter is discarded and pauses nothing. With "
        "assistant_barge_in_echo_duck_db 0, other suspect starts pause at once, and false makes every suspect "
        "start pause; with it above 0 (the default) every suspect start waits, and true keeps the answer as written "
        "over those at a restart (false ducks it for them too: a duck's end is itself a restart, and its leak, "
        "ducked again, made dip after dip, tools/echo_long_answers.py)",
    )
    assistant_barge_in_echo_duck_db: float = Field(
        20.0,
        ge=0,
        le=60,
        description="every suspect start (assistant_barge_in_echo_suspects), not only those at a playback restart, "
        "waits to pause the answer until it has stream_min_speech_ms of voice, the answer playing on this many dB "
        "quieter meanwhile: a leak too short to be kept (most of them: a device without echo cancellation heard one "
        "every ~3.5 s of a long answer) is a dip of about half a second instead of a pause, and a person's start "
        "still pauses it once long enough (tools/echo_long_answers.py); 0 = off: those starts pause the answer at "
        "once, and only starts at a restart wait (docs/echo.md)",
    )
    assistant_barge_in_echo_duck_starts: Literal["suspect", "all"] = Field(
        "suspect",
        description="which starts over the answer wait, ducked (assistant_barge_in_echo_duck_db above 0), until "
        "they have stream_min_speech_ms of voice: 'suspect', the suspect starts alone (a start like a person's cuts "
        "the answer at once); 'all', on a stream the server cancels echo on, every start, so a leak as loud and as "
        "kept as a person that turns out too short to be speech is a dip instead of a cut answer; a start that is "
        "not suspect then cuts the answer once it is long enough and still voiced past its duck's reach "
        "(assistant_barge_in_echo_duck_reach_ms), a suspect one pauses it and its words decide (docs/echo.md)",
    )
    assistant_barge_in_echo_duck_reach_ms: int = Field(
        500,
        ge=0,
        le=5000,
        description="with assistant_barge_in_echo_duck_starts 'all', a start that is not suspect cuts the answer only "
        "once it is long enough and still voiced this long after its duck began (the duck reaching the microphone: "
        "the echo goes quiet with it, a person talks on: an echo delay of up to 300 ms, and webrtcvad calling some "
        "120 ms after a voice stops voiced); one whose voice ends sooner pauses the answer as a suspect start does, "
        "and its words decide. Where the echo's delay jumped, such leaks cut the answer 0.1-0.3 s after their duck, "
        "before it could be heard "
        "(tools/echo_live_jump.py); 0 = cut once long enough",
    )
    assistant_first_clause_words: int = Field(
        4,
        ge=0,
        description="speak the answer's first clause (at a comma) once it has this many words; 0 = whole sentences",
    )
    assistant_first_phrase_words: int = Field(
        8,
        ge=0,
        description="speak the answer's first sentence, when it has no clause mark by this many words, up to the "
        "next word that starts a phrase ('and', 'which', 'with', 'from' ...: tts/text.py), so a long first sentence "
        "does not hold back the first audio (a 0.1 s break there: tools/phrase_cut_pitch.py); 0 = whole first "
        "sentences (tools/README.md: bench_voice_loop.py)",
    )
    assistant_greeting: str = Field(
        "Hi {name}.",
        description="voice loop: the first answer to an enrolled speaker starts with this ({name}: theirs) unless "
        "the model's own first words name them (the bundled 135M model often does not); again after another "
        "enrolled speaker's turn; empty = the model alone",
    )
    assistant_client_tool_timeout_s: float = Field(
        10.0,
        gt=0,
        description="WebRTC: the page's answer to a call of a tool it declared (start.obj tools); past it the model "
        "gets an error result (keep it below assistant_turn_timeout_s)",
    )

    # --- tools from MCP servers for the voice loop (mediaserver/assistant/mcp.py) ---------------
    mcp_servers: list[McpServerConfig] = Field(
        default_factory=list, description="MCP servers whose tools the assistant may call (JSON list)"
    )
    mcp_connect_timeout_s: float = Field(10.0, gt=0, description="connecting to a server and listing its tools")
    mcp_reconnect_s: float = Field(10.0, gt=0, description="wait before connecting again to a server that is down")
    mcp_call_timeout_s: float = Field(10.0, gt=0, description="one tool call; past it the model gets an error result")
    mcp_check_s: float = Field(
        10.0,
        ge=0,
        description="a connected server is asked for its tools this often: one whose transport fails, or that leaves "
        "two listings in a row unanswered within mcp_call_timeout_s, went away, and its tools are withdrawn before a "
        "user's call finds it down (a changed listing is taken); 0 = no checks",
    )
    mcp_max_calls_per_turn: int = Field(4, ge=1, description="tool calls in one answer; more end it with an error")
    mcp_max_result_chars: int = Field(
        4000, ge=100, description="a tool result longer than this is cut for the model, with a note"
    )
    mcp_tool_choice: Literal["auto", "required"] = Field(
        "auto", description="required: every spoken answer starts with a tool call (for models that never choose one)"
    )
    # Realtime sessions' own ``type: "mcp"`` tools (transport/openai/realtime/mcp_tools.py): a client
    # telling the server to connect somewhere is a request forgery risk, so only these are reached.
    realtime_mcp_allowed_urls: list[str] = Field(
        default_factory=list,
        description="URL prefixes a Realtime client's MCP server_url may start with (scheme, host and port "
        "must match, the path must be under the prefix's); empty: client-given URLs are refused",
    )
    realtime_mcp_operator_servers: bool = Field(
        True,
        description="a Realtime MCP tool without server_url whose server_label names one of mcp_servers uses "
        "that server (its URL, headers or command stay the operator's)",
    )
    realtime_mcp_max_servers: int = Field(4, ge=1, le=32, description="type mcp tools in one Realtime session")

    @field_validator("assistant_greeting")
    @classmethod
    def _greeting_names_the_speaker(cls, value: str) -> str:
        if not value.strip():
            return ""
        try:
            filled = value.format(name="Alice")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"assistant_greeting: only {{name}} may be filled in ({exc})") from None
        if "Alice" not in filled:
            raise ValueError("assistant_greeting must contain {name} (or be empty: the model alone)")
        return value.strip()
