// The "Speak" panel: text in, the server's voice out, playing while the rest is synthesized.
//
// GET /api/tts streams a WAV (a header, then PCM sentence by sentence). The page reads the body as
// it arrives and schedules each piece on a WebAudio clock, so the first sentence plays while the
// server is still making the next. fetch (rather than <audio src>) can send the API key.

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
// A client secret in the fragment (#client_secret=ek_...), else ?api_key= (as app.js).
const apiKey = new URLSearchParams(location.hash.slice(1)).get("client_secret") || params.get("api_key") || null;

/** What a test (or a curious developer) may read: window.mediaserverSpeak. */
const state = {
  voices: [],
  speaking: false,
  requests: 0,
  firstAudioMs: null, // from the click to the first audio scheduled
  seconds: 0, // audio received in the last request
  peakDb: null, // loudest output level measured while playing
  error: null,
};
window.mediaserverSpeak = state;

let context = null;
let analyser = null;
let current = null; // {controller, sources}

function headers() {
  return apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
}

function setStatus(text, isError = false) {
  const el = $("speak-status");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

async function loadVoices() {
  try {
    const res = await fetch("../api/speaker", { headers: headers() });
    if (!res.ok) throw new Error((await res.json()).error || `HTTP ${res.status}`);
    const listing = await res.json();
    state.voices = listing.speakers;
    const select = $("speak-voice");
    select.replaceChildren(...listing.speakers.map((name) => new Option(name, name, false, name === listing.default)));
    $("speak-play").disabled = false;
  } catch (err) {
    state.error = `voices: ${err.message}`;
    setStatus(`speech is not available: ${err.message}`, true);
  }
}

function ensureContext() {
  if (context === null) {
    context = new AudioContext();
    analyser = context.createAnalyser();
    analyser.fftSize = 1024;
    analyser.connect(context.destination);
  }
  return context;
}

function meterWhilePlaying() {
  const data = new Float32Array(analyser.fftSize);
  const tick = () => {
    if (!state.speaking && current === null) return;
    analyser.getFloatTimeDomainData(data);
    let sum = 0;
    for (const x of data) sum += x * x;
    const db = 10 * Math.log10(sum / data.length + 1e-12);
    if (state.peakDb === null || db > state.peakDb) state.peakDb = db;
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}

function stop() {
  if (current) {
    current.controller.abort();
    for (const source of current.sources) source.stop();
    current = null;
  }
  state.speaking = false;
  $("speak-play").textContent = "Speak";
}

async function speak() {
  if (current) {
    stop();
    setStatus("stopped");
    return;
  }
  const text = $("speak-text").value.trim();
  if (!text) {
    setStatus("type something to say", true);
    return;
  }
  const ctx = ensureContext();
  await ctx.resume();
  const started = performance.now();
  const controller = new AbortController();
  current = { controller, sources: [] };
  const mine = current;
  state.speaking = true;
  state.requests += 1;
  state.firstAudioMs = null;
  state.seconds = 0;
  state.peakDb = null;
  state.error = null;
  $("speak-play").textContent = "Stop";
  setStatus("speaking…");
  meterWhilePlaying();
  const query = new URLSearchParams({
    format: "WAV",
    speaker: $("speak-voice").value,
    speed: $("speak-speed").value,
    text,
  });
  try {
    const res = await fetch(`../api/tts?${query}`, { headers: headers(), signal: controller.signal });
    if (!res.ok) {
      const body = await res.json().catch(() => ({}));
      throw new Error(body.error || `HTTP ${res.status}`);
    }
    const reader = res.body.getReader();
    let pending = new Uint8Array(0);
    let rate = null;
    let playAt = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      const joined = new Uint8Array(pending.length + value.length);
      joined.set(pending);
      joined.set(value, pending.length);
      pending = joined;
      if (rate === null) {
        if (pending.length < 44) continue;
        const view = new DataView(pending.buffer, pending.byteOffset);
        rate = view.getUint32(24, true);
        pending = pending.slice(44);
      }
      const usable = pending.length - (pending.length % 2);
      if (usable === 0) continue;
      const pcm = new Int16Array(pending.buffer.slice(pending.byteOffset, pending.byteOffset + usable));
      pending = pending.slice(usable);
      const buffer = ctx.createBuffer(1, pcm.length, rate);
      const channel = buffer.getChannelData(0);
      for (let i = 0; i < pcm.length; i++) channel[i] = pcm[i] / 32768;
      const source = ctx.createBufferSource();
      source.buffer = buffer;
      source.connect(analyser);
      playAt = Math.max(playAt, ctx.currentTime + 0.02);
      source.start(playAt);
      playAt += buffer.duration;
      mine.sources.push(source);
      state.seconds += buffer.duration;
      if (state.firstAudioMs === null) {
        state.firstAudioMs = performance.now() - started;
        setStatus(`playing (first audio after ${Math.round(state.firstAudioMs)} ms)…`);
      }
    }
    const left = Math.max(0, playAt - ctx.currentTime);
    setStatus(`${state.seconds.toFixed(1)} s of speech, first audio after ${Math.round(state.firstAudioMs ?? 0)} ms`);
    await new Promise((resolve) => setTimeout(resolve, left * 1000));
  } catch (err) {
    if (err.name !== "AbortError") {
      state.error = err.message;
      setStatus(err.message, true);
    }
  } finally {
    if (current === mine) {
      current = null;
      state.speaking = false;
      $("speak-play").textContent = "Speak";
    }
  }
}

$("speak-play").addEventListener("click", speak);
$("speak-text").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) speak();
});
loadVoices();
