// The /rtc/ page: connect, push-to-talk or hands-free, transcript, states, bitrate and log.
import { MediaserverClient } from "./client.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);

// The credential: a short-lived client secret in the fragment (#client_secret=ek_...: a fragment never
// reaches the server, its logs or a Referer), else an API key in ?api_key= (kept for compatibility).
const credential = new URLSearchParams(location.hash.slice(1)).get("client_secret") || params.get("api_key");
const client = new MediaserverClient({ apiKey: credential || undefined });

/** Everything a test (or a curious developer in the console) may want to read. */
const state = {
  connection: { ...client.state },
  connecting: false,
  connected: false,
  recording: false,
  handsFree: false,
  turn: "",  // the turn model's last decision (semantic turns)
  turns: null, // hands-free: how utterances end, as the server runs it {turnDetection, eagerness, fallback}
  speaking: false,
  wake: null, // hands-free with a wake word: {awake, text, heard}; null without

  transcript: [], // {text, final, latencyMs, latencyFrom, at}
  lastText: "",
  partial: "",
  unstable: "", // the latest guess after the agreed words (greyed; may change)
  partialCount: 0, // partial messages received (all utterances)
  bitrate: null, // {audioKbps, audioPayloadKbps, totalKbps, intervalMs}
  micLevelDb: null,
  models: [],
  logs: [],
  errors: [],
  // Assistant mode: answers as they are written, whether one is being spoken, the answer track.
  assistant: false,
  answer: "",
  answers: [], // {text, heard, interrupted}
  assistantSpeaking: false,
  assistantTrack: false,
  audioPlaying: false,
  // The page's own tool (a function it declares and runs when the assistant calls it).
  pageColor: "",
  toolCalls: [], // {name, arguments, output, isError}
};
window.mediaserver = { client, state };

// --- options -------------------------------------------------------------------------------

function options() {
  const out = {};
  const model = $("model").value;
  const beam = $("beam-size").value;
  const language = $("language").value;
  if (model) out.model = model;
  if ($("noise").checked) out.noiseSuppression = true;
  const turns = $("turn-detection").value;
  if (turns) out.turnDetection = turns;  // else the server's default (semantic with the assistant)
  if (beam) out.beamSize = Number(beam);
  if (language === "auto") out.detectLanguage = true;
  else if (language) {
    out.language = language;
    out.detectLanguage = false;
  }
  return out;
}

/** The wake word option (hands-free and assistant only: push-to-talk needs none). */
function wakeOption() {
  return $("wake").checked ? { wake: true } : {};
}

function selectValue(select, value) {
  if (!value) return;
  if (![...select.options].some((o) => o.value === value)) select.add(new Option(value, value));
  select.value = value;
}

async function loadModels() {
  const ids = await client.listModels();
  state.models = ids;
  const select = $("model");
  for (const id of ids) {
    if (![...select.options].some((o) => o.value === id)) select.add(new Option(id, id));
  }
  selectValue(select, params.get("model"));
}

// --- log -----------------------------------------------------------------------------------

function log(message, kind = "log") {
  const line = `${new Date().toLocaleTimeString()}  ${message}`;
  (kind === "error" ? state.errors : state.logs).push(message);
  const pane = $("log");
  const span = document.createElement("span");
  if (kind === "error") span.className = "error";
  span.textContent = line + "\n";
  pane.append(span);
  while (pane.childNodes.length > 500) pane.firstChild.remove();
  pane.scrollTop = pane.scrollHeight;
}

// --- rendering -----------------------------------------------------------------------------

function renderConnection() {
  const c = state.connection;
  $("pc-state").textContent = c.connectionState;
  $("ice-state").textContent = c.iceConnectionState;
  $("dc-state").textContent = c.dataChannelState;
  const dot = $("status-dot");
  let text;
  if (state.connected) {
    text = "connected";
    dot.className = "dot connected";
  } else if (state.connecting) {
    text = "connecting…";
    dot.className = "dot connecting";
  } else if (c.connectionState === "failed") {
    text = "failed";
    dot.className = "dot failed";
  } else {
    text = "disconnected";
    dot.className = "dot";
  }
  $("status-text").textContent = text;
  $("connect").disabled = state.connected || state.connecting;
  $("disconnect").disabled = !(state.connected || state.connecting);
  $("talk").disabled = !state.connected || state.handsFree;
  $("hands-free").disabled = !state.connected || (state.recording && !state.handsFree) || state.assistant;
  $("hands-free").checked = state.handsFree;
  $("assistant").disabled = !state.connected || (state.recording && !state.assistant);
  $("assistant").checked = state.assistant;
  $("assistant-card").hidden = !state.assistant && state.answers.length === 0;
  $("interrupt").disabled = !state.assistantSpeaking;
  $("assistant-state").textContent = state.assistant ? (state.assistantSpeaking ? "speaking" : "listening") : "";
  $("talk").classList.toggle("recording", state.recording && !state.handsFree);
  $("talk-label").textContent = state.handsFree
    ? "Hands-free listening"
    : state.recording
      ? "Listening… release to send"
      : "Hold to talk";
  $("wake").disabled = state.recording;
  $("page-tool").disabled = state.recording;
  const vad = $("vad");
  const waitingForWake = state.handsFree && state.wake !== null && !state.wake.awake;
  vad.textContent = waitingForWake
    ? state.wake.text
    : state.handsFree
      ? state.speaking
        ? "speech"
        : "waiting for speech"
      : "";
  if (state.handsFree && !waitingForWake && state.turn) vad.textContent += ` · ${state.turn}`;
  else if (state.handsFree && !waitingForWake && state.turns) vad.textContent += ` · ${turnsText(state.turns)}`;
  vad.title = state.handsFree && state.turns?.fallback ? state.turns.fallback : "";
  vad.classList.toggle("speaking", state.speaking);
}

function renderPartial() {
  const line = $("partial");
  line.textContent = state.partial;
  if (state.unstable) {
    const guess = document.createElement("span");
    guess.className = "unstable";
    guess.textContent = (state.partial ? " " : "") + state.unstable;
    line.append(guess);
  }
}

function addTranscript(entry) {
  state.transcript.push(entry);
  if (entry.text) state.lastText = entry.text;
  const li = document.createElement("li");
  if (!entry.text) li.className = "empty";
  const text = document.createElement("span");
  text.className = "text";
  text.textContent = entry.text || "(nothing heard)";
  li.append(text);
  if (entry.latencyMs !== null) {
    const latency = document.createElement("span");
    latency.className = "latency";
    latency.textContent = `${Math.round(entry.latencyMs)} ms`;
    latency.title =
      entry.latencyFrom === "release"
        ? "from release to transcript"
        : entry.latencyFrom === "server"
          ? "the server's time on the transcript after your utterance ended"
          : "from the server's end of speech to transcript";
    li.append(latency);
  }
  const list = $("transcript");
  list.append(li);
  list.scrollTop = list.scrollHeight;
}

function fmtKbps(value) {
  return value === null || value === undefined ? "–" : value.toFixed(1);
}

// --- client events -------------------------------------------------------------------------

client.addEventListener("statechange", (ev) => {
  state.connection = { ...ev.detail };
  state.connected = ev.detail.connected;
  if (!state.connected && !state.connecting) {
    state.recording = false;
    state.handsFree = false;
    state.speaking = false;
    if (state.assistantSpeaking || state.answer) finishAnswer("", true); // (the connection dropped mid-answer)
  }
  renderConnection();
});
client.addEventListener("recording", (ev) => {
  state.recording = ev.detail.recording;
  state.handsFree = ev.detail.handsFree;
  if (!state.recording) {
    state.speaking = false;
    state.assistant = false;
    state.wake = null;
    state.turns = null;
  }
  renderConnection();
});
client.addEventListener("log", (ev) => log(ev.detail.message));
client.addEventListener("wake_waiting", (ev) => {
  state.wake = { awake: false, text: ev.detail.message, heard: state.wake ? state.wake.heard : 0 };
  log(ev.detail.message);
  renderConnection();
});
client.addEventListener("wake_word", (ev) => {
  state.wake = { awake: true, text: ev.detail.message, heard: (state.wake ? state.wake.heard : 0) + 1 };
  log(`${ev.detail.message}: speak your command`);
  renderConnection();
});
client.addEventListener("error", (ev) => log(`${ev.detail.source} error: ${ev.detail.message}`, "error"));
client.addEventListener("partial", (ev) => {
  const { text, full, unstable } = ev.detail;
  state.partialCount += 1;
  state.partial = typeof full === "string" ? full : state.partial + text;
  state.unstable = unstable || "";
  renderPartial();
});
client.addEventListener("infer", (ev) => {
  const { text, final, latencyMs, latencyFrom } = ev.detail;
  state.partial = "";
  state.unstable = "";
  renderPartial();
  addTranscript({ text, final, latencyMs, latencyFrom, at: Date.now() });
});
client.addEventListener("turn", (ev) => {
  // A decision at a pause: when the server thinks you finished, the utterance ends now.
  const { complete, by, probability, decisionMs, silenceMs } = ev.detail;
  const p = typeof probability === "number" ? probability.toFixed(2) : "?";
  if (!complete) state.turn = `still listening: sounds unfinished (p ${p})`;
  else if (by === "words") state.turn = `you finished a sentence (${silenceMs} ms pause)`;
  else if (by === "silence") state.turn = `you paused ${silenceMs} ms (turn model unavailable)`;
  else state.turn = `you finished (p ${p}, decided in ${Math.round(decisionMs)} ms)`;
  renderConnection();
});
function turnsText({ turnDetection, eagerness, fallback }) {
  if (turnDetection === "semantic") return `semantic turns (eagerness ${eagerness})`;
  return fallback ? "silence turns (turn model unavailable)" : "silence turns";
}
client.addEventListener("turns", (ev) => {
  // Hands-free started: the turn detection in force, which "server default" leaves to the server.
  state.turns = ev.detail;
  renderConnection();
});
client.addEventListener("speech_started", () => {
  state.turn = "";
  state.speaking = true;
  renderConnection();
});
client.addEventListener("speech_stopped", () => {
  state.speaking = false;
  renderConnection();
});
client.addEventListener("assistant", (ev) => {
  state.answer = ev.detail.full;
  $("answer").textContent = state.answer;
  if (ev.detail.final && ev.detail.interrupted) finishAnswer("", true); // cut before its audio
});
client.addEventListener("assistant_audio_started", () => {
  state.assistantSpeaking = true;
  renderConnection();
});
client.addEventListener("assistant_audio_stopped", (ev) => {
  const { heard, interrupted } = ev.detail;
  finishAnswer(heard, interrupted);
});
/** The answer being shown ends: it joins the list (cut where the user stopped hearing it). */
function finishAnswer(heard, interrupted) {
  state.assistantSpeaking = false;
  if (!state.answer && !interrupted) {
    renderConnection();
    return;
  }
  state.answers.push({ text: state.answer, heard, interrupted });
  const li = document.createElement("li");
  if (interrupted) li.className = "interrupted";
  const text = document.createElement("span");
  text.className = "text";
  text.textContent = interrupted ? heard || "(interrupted)" : state.answer;
  li.append(text);
  $("answers").append(li);
  state.answer = "";
  $("answer").textContent = "";
  renderConnection();
}
// Tool calls (MCP servers the operator configured) show in the conversation as they run.
function addToolLine(text, isError) {
  const li = document.createElement("li");
  li.className = isError ? "tool error" : "tool";
  const span = document.createElement("span");
  span.className = "text";
  span.textContent = text;
  li.append(span);
  $("answers").append(li);
  $("assistant-card").hidden = false;
}
client.addEventListener("assistant_tool_call", (ev) => {
  addToolLine(`\u2192 ${ev.detail.name}(${ev.detail.arguments})${ev.detail.client ? " (this page)" : ""}`, false);
  if (ev.detail.client) runPageTool(ev.detail);
});
client.addEventListener("assistant_tool_result", (ev) => {
  addToolLine(`\u2190 ${ev.detail.name}: ${ev.detail.result}`, !!ev.detail.is_error);
});
client.addEventListener("assistant_track", (ev) => {
  state.assistantTrack = true;
  const audio = $("assistant-audio");
  audio.srcObject = ev.detail.stream;
  audio.play().catch(() => {}); // autoplay needs a user gesture on some browsers: Connect is one
});
$("assistant-audio").addEventListener("playing", () => {
  state.audioPlaying = true;
});

client.addEventListener("bitrate", (ev) => {
  state.bitrate = { ...ev.detail };
  $("kbps-audio").textContent = fmtKbps(ev.detail.audioKbps);
  $("kbps-total").textContent = fmtKbps(ev.detail.totalKbps);
});

setInterval(() => {
  const level = state.connected ? client.micLevel() : null;
  state.micLevelDb = level;
  $("mic-level").value = level === null ? -80 : Math.max(-80, level);
}, 100);

// --- the page's own tool ----------------------------------------------------------------------
// Declared in `start` when "Page tool" is on; the server sends its calls here (`client: true`) and
// waits for the answer (docs/tools.md, "Tools the client runs").

const PAGE_COLORS = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "white", "black", "gray"];
const PAGE_TOOLS = [
  {
    type: "function",
    name: "set_page_color",
    description: "Change the background colour of the web page the user is looking at.",
    parameters: {
      type: "object",
      properties: { color: { type: "string", enum: PAGE_COLORS, description: "the new background colour" } },
      required: ["color"],
    },
  },
];

function setPageColor(args) {
  const color = String(args.color || "").toLowerCase();
  if (!PAGE_COLORS.includes(color)) throw new Error(`unknown colour ${JSON.stringify(args.color)}`);
  document.body.style.background = color;
  state.pageColor = color;
  return `The page background is now ${color}.`;
}

function runPageTool({ call_id: callId, name, arguments: argsText }) {
  let output;
  let isError = false;
  try {
    if (name !== "set_page_color") throw new Error(`this page has no tool ${name}`);
    output = setPageColor(JSON.parse(argsText || "{}"));
  } catch (err) {
    output = `Error: ${err.message}`;
    isError = true;
  }
  state.toolCalls.push({ name, arguments: argsText, output, isError });
  try {
    client.sendToolOutput(callId, output, { isError });
  } catch (err) {
    log(`tool ${name}: could not answer: ${err.message}`, "error");
  }
}

/** The page's tools for `start` (with ?tool_choice=required, every answer calls one: for small models). */
function pageToolOptions() {
  if (!$("page-tool").checked) return {};
  const choice = params.get("tool_choice");
  return choice ? { tools: PAGE_TOOLS, toolChoice: choice } : { tools: PAGE_TOOLS };
}

// --- actions -------------------------------------------------------------------------------

async function connect() {
  if (state.connected || state.connecting) return;
  state.connecting = true;
  renderConnection();
  log("connecting…");
  try {
    await client.connect(options());
    log("connected; microphone paused until you talk");
  } catch {
    /* reported through the error event */
  } finally {
    state.connecting = false;
    state.connected = client.connected;
    renderConnection();
  }
}

function disconnect() {
  client.close();
  // An answer being spoken ends with the connection: listed as cut, the Interrupt button off.
  if (state.assistantSpeaking || state.answer) finishAnswer("", true);
  state.connecting = false;
  state.connected = false;
  state.recording = false;
  state.handsFree = false;
  state.speaking = false;
  state.partial = "";
  state.unstable = "";
  renderPartial();
  renderConnection();
  log("disconnected");
}

let pttActive = false;

async function pttDown() {
  if (!state.connected || state.handsFree || pttActive) return;
  pttActive = true;
  state.partial = "";
  state.unstable = "";
  renderPartial();
  try {
    await client.start({ ...options(), partials: true, unstable: true });
  } catch (err) {
    pttActive = false;
    log(`start failed: ${err.message}`, "error");
  }
}

async function pttUp() {
  if (!pttActive) return;
  pttActive = false;
  try {
    await client.stop(options());
  } catch (err) {
    log(`stop failed: ${err.message}`, "error");
  }
}

async function setHandsFree(on) {
  if (!state.connected) return;
  try {
    if (on) {
      state.partial = "";
      state.unstable = "";
      renderPartial();
      state.wake = null;
      await client.start({ ...options(), ...wakeOption(), handsFree: true, partials: true, unstable: true });
    } else {
      await client.stop(options());
    }
  } catch (err) {
    log(`hands-free: ${err.message}`, "error");
  }
  renderConnection();
}

$("connect").addEventListener("click", connect);
$("disconnect").addEventListener("click", disconnect);
$("clear").addEventListener("click", () => {
  state.transcript.length = 0;
  state.lastText = "";
  $("transcript").replaceChildren();
});
$("hands-free").addEventListener("change", (ev) => setHandsFree(ev.target.checked));

async function setAssistant(on) {
  if (!state.connected) return;
  try {
    if (on) {
      state.partial = "";
      state.unstable = "";
      renderPartial();
      state.wake = null;
      await client.start({
        ...options(),
        ...wakeOption(),
        ...pageToolOptions(),
        handsFree: true,
        partials: true,
        unstable: true,
        assistant: true,
      });
      state.assistant = true;
      log("assistant: listening; talk, and talk over an answer to interrupt it");
    } else {
      await client.stop(options());
      state.assistant = false;
    }
  } catch (err) {
    log(`assistant: ${err.message}`, "error");
  }
  renderConnection();
}
$("assistant").addEventListener("change", (ev) => setAssistant(ev.target.checked));
$("interrupt").addEventListener("click", () => {
  if (state.connected) client.interrupt();
});
$("reset").addEventListener("click", () => {
  if (state.connected) client.resetConversation();
  state.answers.length = 0;
  $("answers").replaceChildren();
  renderConnection();
});

const talk = $("talk");
talk.addEventListener("pointerdown", (ev) => {
  if (ev.button !== 0) return;
  talk.setPointerCapture(ev.pointerId);
  pttDown();
});
for (const name of ["pointerup", "pointercancel", "lostpointercapture"]) talk.addEventListener(name, pttUp);
talk.addEventListener("contextmenu", (ev) => ev.preventDefault());

function typing(target) {
  return target instanceof HTMLInputElement || target instanceof HTMLSelectElement || target instanceof HTMLTextAreaElement;
}
document.addEventListener("keydown", (ev) => {
  if (ev.code !== "Space" || typing(ev.target)) return;
  ev.preventDefault();
  if (!ev.repeat) pttDown();
});
document.addEventListener("keyup", (ev) => {
  if (ev.code !== "Space" || typing(ev.target)) return;
  ev.preventDefault();
  pttUp();
});
window.addEventListener("blur", pttUp);
window.addEventListener("pagehide", () => client.close());

// --- start-up ------------------------------------------------------------------------------

if (!window.isSecureContext) {
  log("the microphone needs a secure page: open it over HTTPS (see tools/gen_cert.py) or from localhost", "error");
}
selectValue($("beam-size"), params.get("beam_size"));
$("page-tool").checked = params.get("page_tool") === "1";
selectValue($("language"), params.get("language"));
selectValue($("model"), params.get("model")); // before any connect: ?model= goes into the offer
renderConnection();
// Autoconnect once the models are listed (or could not be): connecting first sent the offer without
// ?model=, so a bad name was accepted and every utterance failed on it (a user trial).
const modelsListed = loadModels().catch((err) => log(`models not listed: ${err.message || err}`, "error"));
if (params.get("autoconnect") === "1") {
  modelsListed.then(connect).then(() => {
    if (params.get("assistant") === "1" && state.connected) setAssistant(true);
  });
}
