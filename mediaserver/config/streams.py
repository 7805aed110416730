"""Settings of streaming sessions: utterances and partials, wake words and noise, semantic end of turn."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from mediaserver.config.keep_alive import KeepAliveSeconds, keep_alive_field
from mediaserver.turns.words import DEFAULT_UNFINISHED_ENDINGS, DEFAULT_UNFINISHED_WORDS, FINISHED_SILENCE_MS


class StreamSettings(BaseModel):
    """How every streaming face (WebRTC, WebSocket, Realtime, devices) cuts and hears speech (part of ``Settings``)."""

    # --- streaming sessions (WebRTC, WebSocket, Realtime) --------------------------------------
    max_sessions: int = Field(
        64, ge=1, description="open streaming sessions (WebRTC, WebSocket, Realtime); past it a 503 `too_many_sessions`"
    )
    session_idle_timeout_s: float = Field(7 * 24 * 3600.0, gt=0, description="close a session idle this long")
    stream_vad_aggressiveness: int = Field(3, ge=0, le=3, description="the streams' webrtcvad mode (0-3)")
    stream_vad_hangover_ms: int = Field(500, ge=60, description="silence that ends an utterance")
    stream_vad_preroll_ms: int = Field(
        150,
        ge=0,
        description="audio kept from before speech starts (the VAD's 5-frame trigger window): at 300 ms, tiny.en "
        "heard a real 'ten of clubs' streamed as 'ten of close' where its upload said 'clubs' (tools/eval_parity.py)",
    )
    stream_min_speech_ms: int = Field(
        200,
        ge=0,
        description="shorter bursts of voiced audio are ignored; with semantic turns the turn model does not judge "
        "such a burst's pause (speech resuming within stream_vad_hangover_ms joins it to the utterance)",
    )
    stream_vad_warmup_ms: int = Field(
        120,
        ge=0,
        description="webrtcvad starts cold: it calls the first 90-120 ms of every stream voiced, a -60 dBFS noise "
        "floor included, so each stream began with a speech_started at 0 ms and its discard (a device trial); over "
        "a stream's first this many ms a frame counts as voiced only above -35 dBFS (speech is louder); 0 = off",
    )
    stream_max_utterance_s: float = Field(
        28.0, gt=1.0, le=29.5, description="a streamed utterance is cut at this length"
    )
    stream_max_recording_s: float = Field(
        300.0,
        gt=1.0,
        description="a push-to-talk recording (device WebSocket or WebRTC push_to_talk, Realtime without turn "
        "detection) keeps at most this much audio: what comes past it is dropped with one recording_too_long error, "
        "and stop sends the final of what was kept (float32 audio: 19 MB per 300 s held until then)",
    )
    stream_partial_interval_ms: int = Field(
        300, ge=50, description="a partial decode starts at most this often (from the start of the last one)"
    )
    stream_partial_agreement: int = Field(
        3, ge=2, le=5, description="consecutive partial hypotheses that must agree on a word before it is sent"
    )
    stream_partial_commit_lag_ms: int = Field(
        2000,
        ge=0,
        description="a word is promised only once a partial decode of at least this much more audio than the decode "
        "that first agreed on it still has it: the first second of an utterance alone is often misheard ('How do you "
        "marry' for 'Had he married', agreed on by decodes 1 s apart on a quiet machine), and a promised word cannot "
        "be taken back",
    )
    stream_partial_min_audio_ms: int = Field(
        500, ge=100, description="the first partial decode starts once the utterance (with pre-roll) is this long"
    )
    stream_final_early_ms: int = Field(
        200,
        ge=0,
        description="start the final this long before the utterance ends: once the speech has been silent for "
        "stream_vad_hangover_ms minus this, the final is decoded on the audio so far (speech that resumes cancels "
        "it), so it is ready about when the utterance ends; 0 = decode after the end (with semantic turns a "
        "pause's final still starts at turn_final_silence_ms: its words are the turn rule's evidence). At 300 "
        "(200 ms of silence with the default hangover) a final through an OpenAI-compatible remote engine lost its "
        "last words",
    )
    stream_max_pending_finals: int = Field(
        8,
        ge=1,
        description="utterances of one session waiting for their transcripts; one more is dropped with an "
        "`overloaded` error instead of queueing without bound",
    )
    stream_gap_fill_ms: int = Field(
        120,
        ge=0,
        description="no audio for this long while someone speaks counts as silence (Opus DTX, paused tracks, "
        "devices that stop sending in silence), so the utterance still ends on time; 0 = off",
    )

    # --- wake words and noise suppression (mediaserver/wake, mediaserver/audio/noise.py) -----------
    wake_enabled: bool = Field(True, description="offer wake word detection (Wyoming, device streams)")
    wake_models_dir: Path | None = Field(
        None, description="custom microWakeWord models (a JSON config beside each .tflite); none = built-ins only"
    )
    wake_refractory_s: float = Field(
        2.0, ge=0, description="after a detection, the same wake word is not reported again for this long"
    )
    wake_default_models: list[str] = Field(
        default_factory=lambda: ["okay_nabu"],
        description="wake words of device streams that name none; empty = every model",
    )
    wake_conversation_timeout_s: float = Field(
        0.0,
        ge=0,
        description="after a wake word, device streams keep listening this long after each answer; 0 = one utterance",
    )
    wake_listen_timeout_s: float = Field(
        8.0, gt=0, description="after a wake word, back to waiting if no speech starts within this long"
    )
    noise_suppression_level: int = Field(
        2, ge=1, le=4, description="WebRTC noise suppression level when a stream turns it on (1 low .. 4 very high)"
    )
    noise_auto_gain_dbfs: int = Field(
        3, ge=0, le=31, description="WebRTC automatic gain target (dBFS below full scale) with suppression; 0 = off"
    )
    noise_default: bool = Field(False, description="suppress noise on every stream unless it asks otherwise")
    noise_near_field_level: int = Field(1, ge=1, le=4, description="level for Realtime noise_reduction near_field")
    noise_far_field_level: int = Field(2, ge=1, le=4, description="level for Realtime noise_reduction far_field")
    echo_cancellation_default: Literal["auto", "on", "off"] = Field(
        "auto",
        description="server-side echo cancellation of the spoken answers (docs/echo.md) on a device WebSocket or "
        "Realtime WebSocket stream that does not set echo_cancellation: auto = where the server speaks its answers "
        "and the microphone is heard to carry their echo (echo_auto_echo_likeness; a microphone without echo "
        "passes uncancelled), on = the canceller's output always, off = never",
    )
    echo_auto_echo_likeness: float = Field(
        0.85,
        gt=0,
        le=1,
        description="echo_cancellation auto: the microphone carries the answers' echo (the canceller's output is "
        "used, for the rest of the stream) once its 10 ms levels correlate this well with the answer's at the best "
        "delay up to 1 s, over the last 3 s (or echo_auto_min_compared_s if longer; each delay on that much at "
        "least: audio/echo_presence.py; echoing devices 0.9-1.0, a person over a device without echo up to 0.74)",
    )
    echo_auto_quiet_likeness: float = Field(
        0.5,
        ge=0,
        le=1,
        description="echo_cancellation auto: ... and carries none (the microphone passes uncancelled and the speech "
        "gate stands aside) while that correlation stays under this, once echo_auto_min_sound_s of answer audio "
        "has been compared; in between (undecided) the canceller's output is used",
    )
    echo_auto_hold_ms: int = Field(
        3000,
        ge=0,
        description="echo_cancellation auto: until it has decided whether the microphone carries the answers' echo "
        "(about 2 s into the first answer), the microphone audio waits, at most this long once a stream, and is "
        "then heard as decided: as it came where there is no echo, cancelled where there is. Heard at once, "
        "cancelled and gated as with on, a person speaking over the first answer's first seconds on a device that "
        "cancels its own echo was not heard (a Realtime trial). 0 = heard at once",
    )
    echo_auto_streamed_ahead_s: float = Field(
        1.0,
        gt=0,
        description="echo_cancellation auto: audio that has come this many seconds ahead of real time (a file sent "
        "as fast as it is read, an SDK app appending a recording) is no microphone by a loudspeaker: it passes "
        "uncancelled for the rest of the stream",
    )
    echo_auto_min_sound_s: float = Field(
        0.8,
        gt=0,
        le=3,
        description="echo_cancellation auto: seconds of answer audio (within the window compared, and 1 s old: "
        "its echo in at the longest delay) compared before a microphone is found to carry no echo",
    )
    echo_auto_min_compared_s: float = Field(
        2.0,
        ge=0.5,
        le=10,
        description="echo_cancellation auto: the least seconds of levels compared at any delay; on fewer the "
        "correlation says nothing (a person over an answer their client is not playing read 1.0 on a few frames, "
        "0.86 at best on 1 s, 0.62 on 2 s), and no echo is decided only once every delay up to 1 s has this much",
    )
    rtc_echo_cancellation_default: Literal["auto", "on", "off"] = Field(
        "off",
        description="the same for a WebRTC voice loop (/api/rtc/asr) whose start does not set it: off, since "
        "browsers cancel the echo of what they play themselves (getUserMedia's echoCancellation) and the server's "
        "canceller on top of theirs delays barge-in; a client without one asks for on",
    )
    echo_speech_gate_db: float = Field(
        20.0,
        ge=0,
        description="with the server's echo canceller on a stream: while its answer's echo can be arriving (and the "
        "canceller converging: echo_speech_gate_converge_s), only audio this far above the canceller output's floor "
        "(dB) starts an utterance, so what AEC3 leaks does not cut the answer (tools/echo_leaks.py); 0 = off (it also "
        "holds back a person speaking under a louder echo: docs/echo.md, the speech gate)",
    )
    echo_speech_gate_converge_s: float = Field(
        2.0,
        ge=0,
        description="... only until the stream's canceller has heard this many seconds of answer audio (it converges "
        "over about one answer, where most leaks are), and then for echo_speech_gate_onset_ms into each answer; "
        "0 = over the whole echo of every answer. 6 s stopped more leaks but held back a person barging in 2 s into "
        "the second answer (docs/echo.md)",
    )
    echo_speech_gate_hold_s: float = Field(
        2.0,
        ge=0,
        description="... and until a fresh canceller has heard this many seconds of answer audio, nothing in the "
        "echo starts an utterance: AEC3 passes the first words' echo whole until it has found it (1.5-2.5 s seen "
        "live; docs/echo.md); a person speaking then is heard once it has passed; 0 = no hold",
    )
    echo_speech_gate_restart_ms: int = Field(
        600,
        ge=0,
        description="... and, once it has converged, a speech start within this long of where the device started "
        "playing afresh (answer audio after echo_speech_gate_onset_gap_ms without any) is a suspect start: with "
        "assistant_barge_in_echo_suspects the answer pauses and the words decide. The echo's delay may move there "
        "by a frame and AEC3 lets the first syllable through ('Bees'); 600 covers a 300 ms delay and the syllable "
        "(docs/echo.md); 0 = off",
    )
    echo_speech_gate_onset_ms: int = Field(
        0,
        ge=0,
        description="... and, once the canceller has converged, for this long from each onset of the answer audio "
        "(echo_speech_gate_onset_gap_ms), where AEC3 still leaks a sentence's first syllable ('They', 'Bees are'); "
        "500 covers a device's delay (up to 300 ms) and the syllable: tools/echo_leaks.py --sentences, 8 leaks "
        "instead of 27, but live it cost a person barging in their first words in 9 of 16 runs (docs/echo.md); "
        "0 = none",
    )
    echo_speech_gate_onset_gap_ms: int = Field(
        100,
        ge=10,
        description="... where an onset is answer audio after at least this long without any: a sentence's or a "
        "clause's first syllable (Piper leaves 140-170 ms between sentences, 170-320 ms at a comma, under 80 ms "
        "inside words); answer audio sent this long after the audio sent before ended restarts the device's "
        "playback (echo_speech_gate_restart_ms)",
    )
    echo_speech_gate_residual: float = Field(
        0.0,
        ge=0,
        description="... a voiced frame in the echo does not count towards a speech start while the canceller's "
        "output over the last 0.4 s correlates with the answer audio at the delay the microphone does (GCC-PHAT: the "
        "microphone's peak at least 6 times its mean, the output's there this many times its own; what AEC3 let "
        "through is the echo: tools/echo_leaks.py); it also holds a person under a louder echo (docs/echo.md); 0 = off",
    )
    echo_speech_gate_residual_suspect: float = Field(
        4.0,
        ge=0,
        description="... a voiced frame in the echo whose canceller output over the last 0.4 s correlates with the "
        "answer audio at the delay the microphone does (the measure of echo_speech_gate_residual, its output's peak "
        "this many times its mean) is noted as the canceller's residual: a speech start made mostly of such frames is "
        "a suspect start (it pauses the answer instead of cutting it), and the share of an utterance's voiced frames "
        "that are such frames is what assistant_barge_in_echo_residual_share weighs (where the echo's delay jumps, "
        "AEC3 lets speech-loud echo through until the delay tracker moves: tools/echo_stock_phrases.py); 0 = off",
    )
    echo_speech_gate_tail_ms: int = Field(
        600,
        ge=0,
        description="... for this long after the answer audio sent stops: the device's delay and the room's echo",
    )
    echo_speech_gate_removed_db: float = Field(
        8.0,
        gt=0,
        description="... and only audio the canceller took less than this out of (dB): a person speaking over the "
        "answer is mostly kept, what is left of the echo is not (docs/echo.md)",
    )

    echo_delay_track_s: float = Field(
        1.0,
        ge=0,
        le=10,
        description="server echo cancellation: the delay tracker's window (s; GCC-PHAT between the microphone and "
        "the answer audio, every quarter of it): after the echo's delay jumps (a player that buffers more) it "
        "re-aligns the reference so AEC3 keeps the delay it converged on, instead of searching for seconds "
        "(audio/echo_delay.py; live, tools/echo_live_jump.py: answers cut by their own echo after a jump 7 of 18 "
        "against 13 of 18 without it); 0 = off",
    )
    echo_delay_track_max_ms: int = Field(
        500,
        ge=10,
        le=2000,
        description="... the longest echo delay it looks for (ms; each delay compares the whole window with the "
        "answer audio that long before it; the residual-echo check of echo_speech_gate_residual looks as far)",
    )
    echo_delay_track_lost_db: float = Field(
        12.0,
        gt=0,
        description="... it moves the reference only while the canceller took less than this out of the microphone "
        "(dB, the median over the last 0.5 s of its output with sound): it has lost the echo; this much or more "
        "at the delay AEC3 has (or at a new one, two windows agreeing: followed) shows AEC3 has had the echo, "
        "which a move needs first",
    )

    echo_mic_gap_ms: int = Field(
        1000,
        ge=100,
        description="server echo cancellation on the device and Realtime WebSockets: microphone audio that comes "
        "this long after the end of the audio before it marks a gap (a device that mutes its microphone while it "
        "plays): the canceller's clock moves on by as much, and the answer audio played meanwhile is dropped",
    )
    echo_max_ahead_s: float = Field(
        60.0,
        gt=0,
        description="... answer audio sent while the microphone's clock is this far behind the audio sent before "
        "(a client that sends no microphone audio while it plays, or a text-only one) plays from the microphone's "
        "clock, not after all of it",
    )
    echo_align_wait_ms: int = Field(
        60,
        ge=0,
        le=1000,
        description="... an answer's first audio (and audio after the device ran out of it) waits up to this long "
        "for the microphone's next frame and goes right after it, so every answer reaches the canceller at the same "
        "delay (a device starts playing at its next frame: sent at random, answers land 0 or one frame apart and "
        "the next answer's first syllable leaks, docs/echo.md); 0 = send at once",
    )
    rtc_track_pause_ms: int = Field(
        500,
        ge=100,
        description="server echo cancellation on WebRTC: no microphone frame for this long is a gap, whatever the "
        "RTP timestamps say (senders whose timestamps go on where they stopped, such as aiortc); a gap moves the "
        "canceller's clock on",
    )

    # --- semantic end of turn: Smart Turn v3.2 (mediaserver/turns) -----------------------------
    turn_detection: Literal["auto", "silence", "semantic"] = Field(
        "auto",
        description="how a streamed utterance ends when its session does not choose (device sockets, WebRTC, the "
        "voice loop): 'silence' (after stream_vad_hangover_ms), 'semantic' (each pause is judged on the turn "
        "model's score, its words, their text score and its length, see turn_* and docs/turns.md; falls back to "
        "silence without the turn model), or 'auto': semantic for the voice loop (a session the server answers), "
        "silence for transcription, where a turn ended at a short mid-sentence pause would split a sentence into "
        "two finals (docs/turns.md, Measured). Realtime server_vad is always silence",
    )
    turn_eagerness: Literal["low", "medium", "high", "auto"] = Field(
        "auto", description="semantic turns: how long an unfinished turn is waited for (turn_wait_*_ms); auto = medium"
    )
    turn_model_path: Path | None = Field(
        None,
        description="the Smart Turn v3.2 ONNX file; none = ~/.cache/mediaserver/turn/smart-turn-v3.2-cpu.onnx "
        "(make setup fetches it); missing = semantic turns fall back to silence detection",
    )
    turn_candidate_silence_ms: int = Field(
        200, ge=30, description="semantic turns: a pause this long is scored by the turn model"
    )
    turn_final_silence_ms: int = Field(
        30,
        ge=0,
        description="semantic turns: the final (and a speculative answer on it) starts once a pause is this long, "
        "before the turn model's check (turn_candidate_silence_ms), so the answer is ready when a finished turn "
        "ends (voice loop, 1 session: 0.73-0.76 s to the first audio at 30, 0.91-0.96 s at 80, 1.04 s with the "
        "check); each pause this long costs a decode that speech resuming cancels; 0 = with the check",
    )
    turn_unfinished_words: list[str] = Field(
        default_factory=lambda: list(DEFAULT_UNFINISHED_WORDS),
        description="semantic turns: a pause whose transcript ends on one of these words is not the end of the "
        "turn, whatever the turn model scores (it hears intonation: 'Turn on the' read with a falling pitch scores "
        "0.94); the turn then ends when the speech resumes or at the eagerness cap; empty = the model alone",
    )
    turn_unfinished_endings: list[str] = Field(
        default_factory=lambda: list(DEFAULT_UNFINISHED_ENDINGS),
        description="semantic turns: a pause whose transcript ends on one of these marks is not the end of the turn, "
        "as with turn_unfinished_words (Whisper writes 'He was not an ill...' and '7 of Cl-' for fragments); empty "
        "= none",
    )
    turn_finished_silence_ms: int = Field(
        FINISHED_SILENCE_MS,
        ge=0,
        description="semantic turns: a pause whose transcript ends as a finished sentence ('.', '?', '!', and not "
        "on turn_unfinished_words) ends the turn once it is this long, whatever the turn model scores (real "
        "speakers' finished sentences can score 0.01); 0 = the model and the cap alone",
    )
    turn_open_silence_ms: int = Field(
        400,
        ge=0,
        description="semantic turns: when the pause's transcript has no final mark ('10 of', 'And Mr. John Dashwood "
        "had then leisure'), the turn model's 'complete' ends the turn only once the pause is this long (a person "
        "pausing mid-sentence has often resumed by then); with a final mark it ends at once. 0 = at once either "
        "way (tools/README.md, bench_turns.py: 400 halves the real 0.4 s mid-sentence cut-offs for +0.06 s on "
        "the real whole sentences' median)",
    )
    turn_decision_hold_ms: int = Field(
        2000,
        ge=0,
        description="semantic turns: while a pause is being judged (the turn model's score, and the pause's words "
        "once it is turn_candidate_silence_ms long), the stream's later audio waits, at most this long for each, so "
        "a pause is judged at the same stream time whether the audio comes in real time or faster and however busy "
        "the machine is; a live stream waits only for the decision (30-300 ms); 0 = never wait (fast streams then "
        "run past their pauses before the decision arrives)",
    )
    turn_rescore_ms: int = Field(
        300,
        ge=0,
        description="semantic turns: a pause scored unfinished is scored again each time it has gone on this much "
        "longer (the model grows surer with more silence), until the eagerness cap; 0 = once per pause",
    )
    turn_threshold: float = Field(
        0.5, gt=0, lt=1, description="semantic turns: a score (probability of a finished turn) at least this ends it"
    )
    turn_rescore_threshold: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="semantic turns: the score that ends the turn at a rescore (the model scores a fragment higher "
        "the longer the silence after it: 'Remind me to buy' 0.01 after 200 ms, 0.84 after 500 ms)",
    )
    turn_text_model: Literal["off", "llm", "auto"] = Field(
        "auto",
        description="semantic turns: a second opinion on the pause's words from a language model (docs/turns.md). "
        "auto (the default): llm when the default LLM model is the bundled SmolLM2-135M on its local engine (the "
        "one turn_text_threshold was measured on), else off. llm: the server's own LLM engine (a local "
        "llama-server) reads the probability that the sentence ends after the words (tiny.en's trailing marks "
        "removed); below turn_text_threshold it vetoes the turn model's 'complete' and the finished-words end, "
        "and that pause ends at turn_text_hold_ms of silence instead (or when the speech resumes, or at the "
        "eagerness cap). Fewer fragments cut (real 0.7 s pauses: 53 % -> 40 %); a finished sentence it scores "
        "low waits up to turn_text_hold_ms. Needs the LLM on with a local engine: with an upstream LLM or none, "
        "it is off (said in the log and /health's turns); a score that fails or is late (the engine restarting) "
        "leaves the rule as with off",
    )
    turn_text_threshold: float = Field(
        0.001,
        gt=0,
        lt=1,
        description="turn_text_model: a pause whose words score below this (the probability of a sentence's end "
        "after them) is vetoed as unfinished (the bundled SmolLM2: real 0.7 s mid-sentence pauses cut 53 % -> 40 %; "
        "1 of 40 everyday requests vetoed, 'Can you help me?'; at 0.01: 33 %, but 6 of the 40)",
    )
    turn_text_skip_endings: list[str] = Field(
        default_factory=lambda: ["?"],
        description="turn_text_model: words the ASR ends with one of these marks get no text score (the pause is "
        "judged as with the text off). The text reads the bare words, not the question mark Whisper writes for a "
        "question's intonation, and vetoes misheard or terse questions: 'What colors the sky?' (tiny.en's 'What "
        "color is the sky?') 3e-8, 'Can you help me?' below 1e-5, each then waiting turn_text_hold_ms; no "
        "fragment of bench_turns.py ending '?' scored below turn_text_threshold. Empty = every pause's words",
    )
    turn_text_finished: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="turn_text_model: words without a final mark ('Remind me to buy eggs and bread', which the turn "
        "model scored low and waited the 4 s cap for) that the text scores at least this end the turn at "
        "turn_finished_silence_ms, as finished words do (bench_turns.py: no paused sentence waits the cap; real "
        "0.7 s pauses cut 40 % -> 42 %); 0 = never",
    )
    turn_text_hold_ms: int = Field(
        1000,
        gt=0,
        description="turn_text_model: a pause the text vetoed ends the turn once it is this long; the text's score "
        "is also waited for at most this long (later, the pause is judged without it)",
    )
    turn_wait_low_ms: int = Field(8000, ge=60, description="eagerness low: silence that ends an unfinished turn")
    turn_wait_medium_ms: int = Field(4000, ge=60, description="eagerness medium/auto: the same")
    turn_wait_high_ms: int = Field(2000, ge=60, description="eagerness high: the same")
    turn_threads: int = Field(1, ge=1, description="onnxruntime threads of one turn-model inference")
    turn_batch_max: int = Field(
        8, ge=1, description="pauses of different sessions waiting together are scored in one batch of up to this"
    )
    turn_keep_alive_s: KeepAliveSeconds = keep_alive_field(
        "the turn model (its onnxruntime session, ~8 MB of ONNX; a streaming session with semantic turns uses it "
        "at each pause, so give it longer than a conversation's pauses)"
    )
    turn_speculative_answers: bool = Field(
        True,
        description="voice loop: start the answer (LLM and first clause's TTS, nothing sent) on the final decoded in "
        "a pause, before the turn has ended; speech resuming drops it unheard, the turn ending sends it at once",
    )
    turn_prefill_partials: bool = Field(
        True,
        description="voice loop on a local LLM engine: put the prompt of the question being spoken (the history and "
        "the latest partial transcript) in the engine's cache as each partial comes, so the answer's request "
        "evaluates only the words after the last partial (tools/README.md: bench_prefill.py --partials); "
        "one prefill at a time per session, none while an answer runs",
    )
    turn_prefill_decodes: bool | Literal["auto"] = Field(
        "auto",
        description="with turn_prefill_partials: a voice-loop session that asked for no partials (the device "
        "socket's usual) runs partial decodes all the same, for the prefill alone (none is sent). On 2 cores "
        "(tools/README.md) one session's first token came 0.10-0.14 s sooner, four speaking at once answered "
        "0.22 s later (the decodes compete with the turns and finals). auto: each such decode only while no other "
        "stream hears someone speak and the ASR has no other job; true: always (a server with cores to spare); "
        "false: only sessions that asked for partials prefill",
    )
