// The "Your voice" panel: say three sentences and you are enrolled (POST /api/speakers).
//
// Each sentence is recorded from the microphone with MediaRecorder (the browser's own encoder; the
// server decodes any format FFmpeg reads) for RECORD_S seconds, then the three clips go to the
// server in one multipart request. Enrolled voices are listed with a button to forget each one.
// Voice embeddings are biometric data: the server keeps them only in its speakers_dir.

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
// A client secret in the fragment (#client_secret=ek_...), else ?api_key= (as app.js).
const apiKey = new URLSearchParams(location.hash.slice(1)).get("client_secret") || params.get("api_key") || null;
const RECORD_S = Number(params.get("enrol_seconds")) || 4.5;
const SENTENCES = [
  "Turn on the lights in the kitchen, please.",
  "What is the weather going to be like tomorrow?",
  "Remind me to call my sister after dinner.",
];

/** What a test (or a curious developer) may read: window.mediaserverEnrol. */
const state = { recording: false, clips: 0, result: null, error: null, speakers: [] };
window.mediaserverEnrol = state;

function headers() {
  return apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
}

function setStatus(text, isError = false) {
  const el = $("enrol-status");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

async function errorText(res) {
  try {
    const body = await res.json();
    return typeof body.error === "string" ? body.error : body.error?.message || res.statusText;
  } catch {
    return res.statusText;
  }
}

async function loadSpeakers() {
  // A client secret (ek_...) opens a voice session only: enrolment needs the server's own credentials,
  // so the panel stays hidden (and the page makes no request that would be refused).
  if (apiKey && apiKey.startsWith("ek_")) return;
  const res = await fetch("../api/speakers", { headers: headers() });
  if (!res.ok) {
    $("enrol-card").hidden = res.status === 503; // the server has no speaker model: no panel
    return;
  }
  $("enrol-card").hidden = false;
  state.speakers = (await res.json()).speakers;
  const list = $("enrolled");
  list.replaceChildren();
  for (const speaker of state.speakers) {
    const item = document.createElement("li");
    item.textContent = `${speaker.name} (${speaker.clips} clips, ${speaker.speech_s} s) `;
    const forget = document.createElement("button");
    forget.type = "button";
    forget.className = "small";
    forget.textContent = "Forget";
    forget.addEventListener("click", () => forgetSpeaker(speaker.name));
    item.append(forget);
    list.append(item);
  }
}

async function forgetSpeaker(name) {
  const res = await fetch(`../api/speakers/${encodeURIComponent(name)}`, { method: "DELETE", headers: headers() });
  setStatus(res.ok ? `Forgot ${name}.` : await errorText(res), !res.ok);
  await loadSpeakers();
}

function record(stream, seconds) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    const recorder = new MediaRecorder(stream);
    recorder.addEventListener("dataavailable", (event) => chunks.push(event.data));
    recorder.addEventListener("stop", () => resolve(new Blob(chunks, { type: recorder.mimeType })));
    recorder.addEventListener("error", (event) => reject(event.error));
    recorder.start();
    setTimeout(() => recorder.stop(), seconds * 1000);
  });
}

async function enrol() {
  const name = $("enrol-name").value.trim();
  if (!name) {
    setStatus("Type your name first.", true);
    return;
  }
  Object.assign(state, { recording: true, clips: 0, result: null, error: null });
  $("enrol-start").disabled = true;
  let stream = null;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: { echoCancellation: true, noiseSuppression: true } });
    const form = new FormData();
    form.append("name", name);
    form.append("replace", $("enrol-replace").checked ? "true" : "false");
    for (const [n, sentence] of SENTENCES.entries()) {
      setStatus(`Say (${n + 1} of ${SENTENCES.length}): “${sentence}”`);
      const clip = await record(stream, RECORD_S);
      form.append("file", clip, `sentence-${n + 1}.webm`);
      state.clips = n + 1;
    }
    setStatus("Enrolling…");
    const res = await fetch("../api/speakers", { method: "POST", headers: headers(), body: form });
    if (!res.ok) throw new Error(await errorText(res));
    state.result = await res.json();
    setStatus(`Enrolled ${state.result.name}: ${state.result.speech_s} s of speech in ${state.result.clips} clips.`);
  } catch (err) {
    state.error = String(err.message || err);
    setStatus(state.error, true);
  } finally {
    for (const track of stream?.getTracks() || []) track.stop();
    state.recording = false;
    $("enrol-start").disabled = false;
    await loadSpeakers();
  }
}

$("enrol-start").addEventListener("click", enrol);
loadSpeakers();
