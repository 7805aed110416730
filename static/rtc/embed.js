// Compact talk button for dashboards (Home Assistant iframe card and the like).
//
// Query parameters:
//   hands_free=1      listen continuously after connecting; the button pauses/resumes listening
//   assistant=1       answer aloud what is said (implies hands_free); talking over an answer stops it
//   toggle=1          tap to start, tap to stop (default: hold to talk)
//   model, beam_size, language   Whisper options (language=auto detects the language)
//   theme=auto|light|dark|transparent   (default auto: follows the OS)
//   autoconnect=0     wait for a tap before asking for the microphone (default: connect on load)
//   api_key           sent as a Bearer token when the server requires one
// Fragment: #client_secret=ek_...   a short-lived client secret instead of api_key (python -m mediaserver.mint_secret)
import { MediaserverClient } from "./client.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const flag = (name, fallback = false) => {
  const value = params.get(name);
  if (value === null) return fallback;
  return ["1", "true", "yes", "on", ""].includes(value.toLowerCase());
};

const config = {
  assistant: flag("assistant"),
  handsFree: flag("hands_free") || flag("assistant"),
  toggle: flag("toggle"),
  autoconnect: flag("autoconnect", true),
  theme: params.get("theme") || "auto",
};
document.documentElement.dataset.theme = config.theme;

/** Why this page cannot use the microphone where it is shown, or null. */
function environmentProblem() {
  if (!window.isSecureContext) {
    return "the microphone needs HTTPS (on this page and on the dashboard around it)";
  }
  const policy = document.permissionsPolicy || document.featurePolicy;
  if (policy && typeof policy.allowsFeature === "function" && !policy.allowsFeature("microphone")) {
    return "the dashboard does not let this frame use the microphone: add allow: microphone to the card";
  }
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    return "this browser gives no access to a microphone";
  }
  return null;
}

const credential = new URLSearchParams(location.hash.slice(1)).get("client_secret") || params.get("api_key");
const client = new MediaserverClient({ apiKey: credential || undefined });
const state = {
  connection: { ...client.state },
  connecting: false,
  connected: false,
  recording: false,
  handsFree: false,
  speaking: false,
  transcript: [],
  lastText: "",
  partial: "",
  partialCount: 0,
  bitrate: null,
  logs: [],
  errors: [],
  problem: environmentProblem(),
  config,
  answer: "",
  answers: [],
  assistantSpeaking: false,
  audioPlaying: false,
};
window.mediaserver = { client, state };

function options() {
  const out = {};
  if (params.get("model")) out.model = params.get("model");
  if (params.get("beam_size")) out.beamSize = Number(params.get("beam_size"));
  const language = params.get("language");
  if (language === "auto") out.detectLanguage = true;
  else if (language) {
    out.language = language;
    out.detectLanguage = false;
  }
  return out;
}

function render() {
  const talk = $("talk");
  const dot = $("dot");
  talk.disabled = state.connecting;
  talk.classList.toggle("active", state.recording);
  talk.classList.toggle("speaking", state.speaking);
  let status;
  $("status").classList.toggle("problem", !!state.problem && !state.connected);
  if (state.problem && !state.connected && !state.connecting) {
    dot.className = "";
    status = state.problem;
  } else if (state.connected) {
    dot.className = "connected";
    if (state.handsFree) {
      // What listening costs right now (with Opus DTX, ~2 kbps while it is quiet).
      const kbps = state.bitrate && state.bitrate.totalKbps !== null ? ` · ${state.bitrate.totalKbps.toFixed(1)} kbps` : "";
      status = (state.speaking ? "hearing you" : "listening") + kbps;
    }
    else if (state.recording) status = "recording";
    else status = config.handsFree ? "paused · tap to listen" : config.toggle ? "tap to talk" : "hold to talk";
  } else if (state.connecting) {
    dot.className = "connecting";
    status = "connecting…";
  } else {
    dot.className = "";
    status = state.errors.length ? "offline · tap to retry" : "tap to connect";
  }
  $("status-text").textContent = status;
  $("status").title = state.errors.length ? state.errors[state.errors.length - 1] : "";
  talk.setAttribute("aria-pressed", String(state.recording));
}

function showLine(text, partial, title = "") {
  const line = $("line");
  line.textContent = text;
  line.classList.toggle("partial", partial);
  line.title = title;
}

client.addEventListener("statechange", (ev) => {
  state.connection = { ...ev.detail };
  const wasConnected = state.connected;
  state.connected = ev.detail.connected;
  if (!state.connected) {
    state.recording = false;
    state.handsFree = false;
    state.speaking = false;
    if (wasConnected && !userClosed) scheduleReconnect();
  }
  render();
});
client.addEventListener("recording", (ev) => {
  state.recording = ev.detail.recording;
  state.handsFree = ev.detail.handsFree;
  if (!state.recording) state.speaking = false;
  render();
});
client.addEventListener("log", (ev) => state.logs.push(ev.detail.message));
client.addEventListener("error", (ev) => {
  state.errors.push(ev.detail.message);
  console.warn("mediaserver:", ev.detail.message);
});
client.addEventListener("partial", (ev) => {
  const { text, full, unstable } = ev.detail;
  state.partialCount += 1;
  state.partial = typeof full === "string" ? full : state.partial + text;
  // The agreed words, then the latest guess after them (it may change with the next partial).
  showLine([state.partial, unstable].filter(Boolean).join(" "), true);
});
client.addEventListener("infer", (ev) => {
  const { text, final, latencyMs } = ev.detail;
  state.partial = "";
  state.transcript.push({ text, final, latencyMs, at: Date.now() });
  if (text) state.lastText = text;
  const latency = latencyMs === null ? "" : `${Math.round(latencyMs)} ms`;
  if (text) showLine(text, false, latency);
  else if (!state.handsFree) showLine("(nothing heard)", true, latency);
});
client.addEventListener("speech_started", () => {
  state.speaking = true;
  render();
});
client.addEventListener("speech_stopped", () => {
  state.speaking = false;
  render();
});
client.addEventListener("bitrate", (ev) => {
  state.bitrate = { ...ev.detail };
  if (state.handsFree) render();
});
client.addEventListener("assistant", (ev) => {
  state.answer = ev.detail.full;
  showLine(state.answer, false);
  if (ev.detail.final && ev.detail.interrupted) {
    // cut before any of its audio: no audio events come for it
    state.answers.push({ text: state.answer, heard: "", interrupted: true });
  }
});
client.addEventListener("assistant_audio_started", () => {
  state.assistantSpeaking = true;
});
client.addEventListener("assistant_audio_stopped", (ev) => {
  state.assistantSpeaking = false;
  state.answers.push({ text: state.answer, heard: ev.detail.heard, interrupted: ev.detail.interrupted });
});
client.addEventListener("assistant_track", (ev) => {
  const audio = document.createElement("audio");
  audio.autoplay = true;
  audio.srcObject = ev.detail.stream;
  audio.addEventListener("playing", () => {
    state.audioPlaying = true;
  });
  document.body.append(audio);
  audio.play().catch(() => {});
});

// --- connection, with reconnection for dashboards that stay open for days --------------------

let userClosed = false;
let retryMs = 2000;
let retryTimer = null;

function scheduleReconnect() {
  if (retryTimer) return;
  retryTimer = setTimeout(() => {
    retryTimer = null;
    connect({ retry: true });
  }, retryMs);
  retryMs = Math.min(retryMs * 2, 60000);
}

async function connect({ retry = false } = {}) {
  if (state.connected || state.connecting) return;
  if (!retry && retryTimer) {
    clearTimeout(retryTimer);
    retryTimer = null;
  }
  userClosed = false;
  state.connecting = true;
  render();
  try {
    await client.connect(options());
    retryMs = 2000;
    if (config.handsFree) await listen(true);
  } catch {
    // A first connection that fails (no microphone permission, server down) waits for a tap;
    // a lost session keeps retrying by itself, with a growing delay.
    if (retry) scheduleReconnect();
  } finally {
    state.connecting = false;
    state.connected = client.connected;
    render();
  }
}

async function listen(on) {
  if (on) {
    state.partial = "";
    await client.start({ ...options(), handsFree: config.handsFree, partials: true, unstable: true, assistant: config.assistant });
  } else {
    await client.stop(options());
  }
}

// --- the button ----------------------------------------------------------------------------

const holdToTalk = !config.handsFree && !config.toggle;
let holding = false;

async function press() {
  if (!state.connected) {
    await connect();
    return;
  }
  try {
    if (holdToTalk) {
      if (holding || state.recording) return;
      holding = true;
      await listen(true);
    } else {
      await listen(!state.recording);
    }
  } catch (err) {
    state.errors.push(err.message);
  }
}

async function release() {
  if (!holdToTalk || !holding) return;
  holding = false;
  try {
    await listen(false);
  } catch (err) {
    state.errors.push(err.message);
  }
}

const talk = $("talk");
talk.addEventListener("pointerdown", (ev) => {
  if (ev.button !== 0) return;
  if (holdToTalk) talk.setPointerCapture(ev.pointerId);
  press();
});
for (const name of ["pointerup", "pointercancel", "lostpointercapture"]) talk.addEventListener(name, release);
talk.addEventListener("contextmenu", (ev) => ev.preventDefault());
talk.addEventListener("keydown", (ev) => {
  if ((ev.code === "Space" || ev.code === "Enter") && !ev.repeat) {
    ev.preventDefault();
    press();
  }
});
talk.addEventListener("keyup", (ev) => {
  if (ev.code === "Space" || ev.code === "Enter") {
    ev.preventDefault();
    release();
  }
});
window.addEventListener("pagehide", () => {
  userClosed = true;
  client.close();
});

render();
if (config.autoconnect && !state.problem) connect();
