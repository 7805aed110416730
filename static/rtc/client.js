// MediaserverClient: the browser side of mediaserver's WebRTC speech sessions.
//
// One RTCPeerConnection per session carries the microphone (Opus) to the server and a data
// channel ("chat", ordered) carries JSON messages both ways. Signalling is one HTTP exchange,
// without trickle ICE: POST /api/rtc/asr {"sdp", "type": "offer"} -> {"sdp", "type": "answer"}.
//
// The microphone track stays attached to the connection for the whole session, but it is
// detached from the RTP sender (replaceTrack(null)) whenever nothing is being recorded, so an
// idle session costs only ICE consent checks and RTCP (a few hundred bits per second). start()
// re-attaches it, stop() detaches it again.
//
// Events (EventTarget; CustomEvent with `detail`):
//   statechange  {connectionState, iceConnectionState, iceGatheringState, signalingState,
//                 dataChannelState, connected}
//   log          {message, obj}              server `log` message
//   turns        {turnDetection, eagerness, fallback}  hands-free started: how its utterances end, as the
//                                            server runs it ("semantic" with an eagerness, or "silence";
//                                            fallback: why a session that wanted semantic turns has silence)
//   error        {message, source}           source: "server" (an `error` message) or "client"
//   infer        {text, final, latencyMs, latencyFrom, obj} a transcript; latencyMs from stop()
//                (push-to-talk: latencyFrom "release") or the server's latency_ms ("server")
//                                            or from `speech_stopped` (hands-free) to its arrival;
//                                            obj is the server's (with extensions: final, language...)
//   partial      {text, full, unstable, obj} partial transcript of the current utterance; `unstable`
//                                            (with {unstable: true}): the latest guess after `full`
//   speech_started / speech_stopped  {obj}  server VAD (hands-free only)
//   turn         {complete, by, probability, decisionMs, silenceMs, obj}  a pause was judged (semantic turns,
//                                            the default): complete = it thinks you finished; by = model,
//                                            words (a finished sentence's pause) or silence (the model failed)
//   pong         {message, rttMs}
//   assistant    {delta, full, final}        the assistant's answer as it is written (assistant mode)
//   assistant_audio_started {turn} / assistant_audio_stopped {turn, interrupted, heard}
//   assistant_tool_call {turn, call_id, name, arguments, client} / assistant_tool_result {turn, call_id, name, result, is_error}
//                                            client: a tool this page declared (start's `tools`): run it and
//                                            answer with sendToolOutput(call_id, output) (docs/tools.md, "Tools the client runs")
//   assistant_track {stream, track}          the server's outbound audio (answers), for an <audio>
//   bitrate      {audioKbps, audioPayloadKbps, totalKbps, intervalMs, bytesSent}
//   message      {msg}                       every data channel message, parsed
//   recording    {recording, handsFree}
//   wake_waiting {message, obj}              hands-free with `wake`: "listening for 'okay nabu'"
//   wake_word    {message, obj}              the wake word was heard; the next utterance is transcribed

const DEFAULT_API_BASE = new URL("../", import.meta.url).toString();

/** Whisper options in the wire names the server reads (snake_case), without empty values. */
export function serverOptions(options = {}) {
  const names = {
    handsFree: "hands_free",
    hands_free: "hands_free",
    partials: "partials",
    unstable: "unstable",
    model: "model",
    beamSize: "beam_size",
    beam_size: "beam_size",
    language: "language",
    detectLanguage: "detect_language",
    detect_language: "detect_language",
    task: "task",
    assistant: "assistant",
    systemPrompt: "system_prompt",
    system_prompt: "system_prompt",
    voice: "voice",
    speak: "speak",
    wake: "wake",
    noiseSuppression: "noise_suppression",
    noise_suppression: "noise_suppression",
    echoCancellation: "echo_cancellation",
    echo_cancellation: "echo_cancellation",
    turnDetection: "turn_detection",
    turn_detection: "turn_detection",
    eagerness: "eagerness",
    tools: "tools",
    toolChoice: "tool_choice",
    tool_choice: "tool_choice",
  };
  const out = {};
  for (const [key, value] of Object.entries(options)) {
    const wire = names[key];
    if (!wire || value === undefined || value === null || value === "") continue;
    if (wire === "beam_size") {
      // A number as a number; anything else as given, for the server to refuse by name (it was
      // dropped here, and the page showed a beam the server never heard of).
      const n = Number(value);
      out[wire] = Number.isFinite(n) ? n : value;
    } else {
      out[wire] = value;
    }
  }
  return out;
}

function waitForIceGathering(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    };
    const check = () => {
      if (pc.iceGatheringState === "complete") done();
    };
    // Past the timeout, go with the candidates gathered so far (an unreachable STUN server
    // must not block the session).
    const timer = setTimeout(done, timeoutMs);
    pc.addEventListener("icegatheringstatechange", check);
  });
}

function kbps(bytes, ms) {
  return ms > 0 ? (bytes * 8) / ms : 0; // bytes per ms * 8 = kbit/s
}

export class MediaserverClient extends EventTarget {
  /**
   * @param {object} [options]
   * @param {string} [options.apiBase] server root URL (default: the directory above this module)
   * @param {string} [options.apiKey] sent as `Authorization: Bearer` on the HTTP requests
   * @param {MediaTrackConstraints|boolean} [options.audio] getUserMedia audio constraints
   * @param {number} [options.statsIntervalMs] bitrate sampling period (default 1000; 0 = off)
   * @param {number} [options.iceGatheringTimeoutMs] (default 5000)
   * @param {number} [options.connectTimeoutMs] offer/answer plus ICE/DTLS (default 30000)
   */
  constructor(options = {}) {
    super();
    this._generation = 0;
    this._connecting = false;
    this.apiBase = options.apiBase ?? DEFAULT_API_BASE;
    this.apiKey = options.apiKey ?? null;
    // Echo cancellation matters in assistant mode: the answer played by the speakers must not be
    // heard by the server as the user talking (that would interrupt the answer).
    this.audioConstraints = options.audio ?? { echoCancellation: true, noiseSuppression: true, autoGainControl: true };
    this.statsIntervalMs = options.statsIntervalMs ?? 1000;
    this.iceGatheringTimeoutMs = options.iceGatheringTimeoutMs ?? 5000;
    this.connectTimeoutMs = options.connectTimeoutMs ?? 30000;
    this._reset();
  }

  _reset() {
    this.pc = null;
    this.dc = null;
    this.sender = null;
    this.stream = null;
    this.track = null;
    this.remoteStream = null;
    this.recording = false;
    this.handsFree = false;
    this.connected = false;
    this._sending = false;
    this._stopAt = null;
    this._speechStoppedAt = null;
    this._statsTimer = null;
    this._lastStats = null;
    this._pings = new Map();
    this._pingSeq = 0;
    this._audioContext = null;
    this._analyser = null;
    this._levelBuffer = null;
    this.bitrate = null;
    this.state = {
      connectionState: "new",
      iceConnectionState: "new",
      iceGatheringState: "new",
      signalingState: "stable",
      dataChannelState: "closed",
      connected: false,
    };
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  _updateState() {
    const pc = this.pc;
    const next = {
      connectionState: pc ? pc.connectionState : "closed",
      iceConnectionState: pc ? pc.iceConnectionState : "closed",
      iceGatheringState: pc ? pc.iceGatheringState : "complete",
      signalingState: pc ? pc.signalingState : "closed",
      dataChannelState: this.dc ? this.dc.readyState : "closed",
      connected: this.connected,
    };
    const changed = Object.keys(next).some((k) => next[k] !== this.state[k]);
    this.state = next;
    if (changed) this._emit("statechange", { ...next });
  }

  _headers(json) {
    const headers = {};
    if (json) headers["Content-Type"] = "application/json";
    if (this.apiKey) headers["Authorization"] = `Bearer ${this.apiKey}`;
    return headers;
  }

  _url(path, query) {
    const url = new URL(path, this.apiBase);
    for (const [key, value] of Object.entries(query || {})) url.searchParams.set(key, String(value));
    return url.toString();
  }

  /** GET /v1/models → the ids of the speech recognition models (`kind` "asr"; the LLMs and
   * embedding models it also lists cannot transcribe a stream), empty on failure. */
  async listModels() {
    try {
      const res = await fetch(this._url("v1/models"), { headers: this._headers(false) });
      if (!res.ok) return [];
      const body = await res.json();
      return (body.data || [])
        .filter((m) => !m.kind || m.kind === "asr")
        .map((m) => m.id)
        .filter(Boolean);
    } catch {
      return [];
    }
  }

  async _iceServers() {
    try {
      const res = await fetch(this._url("api/rtc/config"), { headers: this._headers(false) });
      if (!res.ok) return [];
      const body = await res.json();
      return Array.isArray(body.iceServers) ? body.iceServers : [];
    } catch {
      return [];
    }
  }

  /**
   * Open the session: microphone, peer connection, offer/answer, data channel.
   * `params` (model, beamSize, language, detectLanguage, task) go in the query string of the
   * offer and become the session's defaults on the server.
   */
  async connect(params = {}) {
    if (this.pc || this._connecting) throw new Error("already connected; call close() first");
    this._closing = false;
    this._connecting = true;
    const generation = ++this._generation;
    let iceServers;
    let stream;
    try {
      iceServers = await this._iceServers();
      stream = await navigator.mediaDevices.getUserMedia({ audio: this.audioConstraints, video: false });
    } catch (err) {
      const message = `microphone unavailable: ${err && err.message ? err.message : err}`;
      this._emit("error", { message, source: "client" });
      throw new Error(message);
    } finally {
      this._connecting = false;
    }
    if (generation !== this._generation) {
      // close() was called while the microphone was being opened.
      for (const t of stream.getTracks()) t.stop();
      throw new Error("closed while connecting");
    }
    this.stream = stream;
    this.track = stream.getAudioTracks()[0];
    const pc = new RTCPeerConnection({ iceServers });
    this.pc = pc;
    for (const name of [
      "connectionstatechange",
      "iceconnectionstatechange",
      "icegatheringstatechange",
      "signalingstatechange",
    ]) {
      pc.addEventListener(name, () => {
        if (this.pc === pc) this._onPeerState();
      });
    }

    // The data channel must exist before the offer so that the SDP has its m=application line.
    const dc = pc.createDataChannel("chat", { ordered: true });
    this.dc = dc;
    dc.addEventListener("open", () => {
      if (this.dc === dc) this._updateState();
    });
    dc.addEventListener("close", () => {
      if (this.dc !== dc) return;
      this._updateState();
      if (!this._closing && this.connected) this._lost("data channel closed");
    });
    dc.addEventListener("message", (ev) => {
      if (this.dc === dc) this._onMessage(ev);
    });

    // The server's answers arrive on a track of its own (silent between answers).
    pc.addEventListener("track", (ev) => {
      if (this.pc !== pc || ev.track.kind !== "audio") return;
      this.remoteStream = ev.streams && ev.streams[0] ? ev.streams[0] : new MediaStream([ev.track]);
      this._emit("assistant_track", { stream: this.remoteStream, track: ev.track });
    });

    this.sender = pc.addTrack(this.track, stream);
    this._preferOpus();
    this._startLevelMeter();

    try {
      const offer = await pc.createOffer();
      await pc.setLocalDescription(offer);
      this._updateState();
      await waitForIceGathering(pc, this.iceGatheringTimeoutMs);
      this._updateState();
      const query = serverOptions(params);
      delete query.hands_free;
      delete query.partials;
      const res = await fetch(this._url("api/rtc/asr", query), {
        method: "POST",
        headers: this._headers(true),
        body: JSON.stringify({ sdp: pc.localDescription.sdp, type: pc.localDescription.type }),
        signal: AbortSignal.timeout(this.connectTimeoutMs),
      });
      if (!res.ok) {
        let message = `${res.status} ${res.statusText}`;
        try {
          const body = await res.json();
          message = (body.error && (body.error.message || body.error)) || message;
        } catch {
          /* not JSON */
        }
        throw new Error(`offer refused: ${message}`);
      }
      const answer = await res.json();
      if (this.pc !== pc) throw new Error("closed while connecting");
      await pc.setRemoteDescription({ type: answer.type || "answer", sdp: answer.sdp });
      await this._waitUp(pc, dc, this.connectTimeoutMs);
    } catch (err) {
      const message = err && err.message ? err.message : String(err);
      this._emit("error", { message: `connect failed: ${message}`, source: "client" });
      this.close();
      throw err;
    }
    // Idle: keep ICE and DTLS alive but send no audio until start().
    if (!this._sending) await this.sender.replaceTrack(null);
    this.connected = true;
    this._updateState();
    this._startStats();
  }

  _waitUp(pc, dc, timeoutMs) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => finish(new Error("timed out waiting for the connection")), timeoutMs);
      const finish = (err) => {
        clearTimeout(timer);
        pc.removeEventListener("connectionstatechange", check);
        dc.removeEventListener("open", check);
        dc.removeEventListener("close", check);
        if (err) reject(err);
        else resolve();
      };
      const check = () => {
        if (pc.connectionState === "failed") finish(new Error("ICE/DTLS connection failed"));
        else if (pc.connectionState === "closed" || dc.readyState === "closed") finish(new Error("connection closed"));
        else if (pc.connectionState === "connected" && dc.readyState === "open") finish();
      };
      pc.addEventListener("connectionstatechange", check);
      dc.addEventListener("open", check);
      dc.addEventListener("close", check);
      check();
    });
  }

  _preferOpus() {
    // Opus only: the server decodes Opus at 48 kHz; nothing is gained by offering G.711.
    try {
      const transceiver = this.pc.getTransceivers().find((t) => t.sender === this.sender);
      const caps = RTCRtpReceiver.getCapabilities && RTCRtpReceiver.getCapabilities("audio");
      if (!transceiver || !transceiver.setCodecPreferences || !caps) return;
      const opus = caps.codecs.filter((c) => c.mimeType.toLowerCase() === "audio/opus");
      if (opus.length) transceiver.setCodecPreferences(opus);
    } catch {
      /* keep the browser's default order */
    }
  }

  _onPeerState() {
    this._updateState();
    const pc = this.pc;
    if (pc && this.connected && (pc.connectionState === "failed" || pc.connectionState === "closed")) {
      this._lost(`connection ${pc.connectionState}`);
    }
  }

  _lost(reason) {
    this._emit("error", { message: `disconnected: ${reason}`, source: "client" });
    this.close();
  }

  get isOpen() {
    return !!(this.dc && this.dc.readyState === "open");
  }

  /** Send one JSON message on the data channel. */
  send(msg) {
    if (!this.isOpen) throw new Error("not connected");
    this.dc.send(JSON.stringify(msg));
  }

  /**
   * Start recording. options: {handsFree, partials, unstable, model, beamSize, language, detectLanguage}.
   * hands-free: the server's VAD ends each utterance and sends `infer` by itself until stop().
   */
  async start(options = {}) {
    if (!this.isOpen) throw new Error("not connected");
    const obj = serverOptions(options);
    // The browser cancels the echo of what it plays (getUserMedia's echoCancellation): the server's
    // canceller is not needed on top of it, whatever the server's rtc_echo_cancellation_default says.
    if (obj.assistant && obj.echo_cancellation === undefined && this.track?.getSettings?.().echoCancellation === true) {
      obj.echo_cancellation = "off";
    }
    this.handsFree = !!obj.hands_free;
    this.recording = true;
    this._stopAt = null;
    this._speechStoppedAt = null;
    this.send(Object.keys(obj).length ? { type: "start", obj } : { type: "start" });
    this._emit("recording", { recording: true, handsFree: this.handsFree });
    await this._setSending(true);
  }

  /** Stop recording; the server transcribes what it has (options as for start()). */
  async stop(options = {}) {
    if (!this.isOpen) throw new Error("not connected");
    const obj = serverOptions(options);
    delete obj.hands_free;
    delete obj.partials;
    delete obj.unstable;
    await this._setSending(false);
    this._stopAt = performance.now();
    this.recording = false;
    this.handsFree = false;
    this.send(Object.keys(obj).length ? { type: "stop", obj } : { type: "stop" });
    this._emit("recording", { recording: false, handsFree: false });
  }

  /** Stop the answer being spoken (the server keeps what was heard in the conversation). */
  interrupt() {
    this.send({ type: "interrupt" });
  }

  /**
   * Answer a call of one of this page's tools (an `assistant_tool_call` with `client: true`):
   * `output` is the text the model gets (anything else is sent as JSON); `isError` marks a failure.
   */
  sendToolOutput(callId, output, { isError = false } = {}) {
    this.send({ type: "tool_output", obj: { call_id: callId, output, is_error: !!isError } });
  }

  /** Forget the conversation. */
  resetConversation() {
    this.send({ type: "reset" });
  }

  /** Round trip on the data channel; resolves with the RTT in ms. */
  ping(message) {
    const id = message ?? `p${++this._pingSeq}`;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this._pings.delete(String(id));
        reject(new Error("ping timed out"));
      }, 10000);
      this._pings.set(String(id), { resolve, timer, sentAt: performance.now() });
      try {
        this.send({ type: "ping", message: id });
      } catch (err) {
        clearTimeout(timer);
        this._pings.delete(String(id));
        reject(err);
      }
    });
  }

  async _setSending(on) {
    if (!this.sender || this._sending === on) return;
    this._sending = on;
    await this.sender.replaceTrack(on ? this.track : null);
  }

  _onMessage(ev) {
    let msg;
    try {
      msg = JSON.parse(ev.data);
    } catch {
      this._emit("error", { message: "unparseable message from the server", source: "client" });
      return;
    }
    if (!msg || typeof msg !== "object") return;
    const obj = msg.obj ?? null;
    const now = performance.now();
    switch (msg.type) {
      case "log":
        this._emit("log", { message: msg.message, obj });
        if (obj && typeof obj.turn_detection === "string") {
          const { turn_detection: turnDetection, eagerness = null, turn_detection_fallback: fallback = null } = obj;
          this._emit("turns", { turnDetection, eagerness, fallback });
        }
        break;
      case "error":
        this._emit("error", { message: msg.message, source: "server" });
        break;
      case "pong": {
        const pending = this._pings.get(String(msg.message));
        if (pending) {
          clearTimeout(pending.timer);
          this._pings.delete(String(msg.message));
          pending.resolve(now - pending.sentAt);
        }
        this._emit("pong", { message: msg.message, rttMs: pending ? now - pending.sentAt : null });
        break;
      }
      case "infer": {
        // From the release (push-to-talk, or a stop that ends an utterance in hands-free mode),
        // measured here; else (hands-free) the server's own time on it after the utterance ended
        // (its speech_stopped comes with the final when the turn ends on a final already decoded,
        // so timing from that event here would say 0 ms).
        const final = !!(obj && obj.final);
        let latencyMs = null;
        let latencyFrom = null;
        if (this._stopAt !== null) {
          latencyMs = now - this._stopAt;
          latencyFrom = "release";
        } else if (obj && typeof obj.latency_ms === "number") {
          latencyMs = obj.latency_ms;
          latencyFrom = "server";
        } else if (this._speechStoppedAt !== null) {
          latencyMs = now - this._speechStoppedAt;
          latencyFrom = "speech_stopped";
        }
        this._stopAt = null;
        this._speechStoppedAt = null;
        this._emit("infer", { text: (obj && obj.text) || "", final, latencyMs, latencyFrom, obj });
        break;
      }
      case "partial":
        this._emit("partial", {
          text: (obj && obj.text) || "",
          full: obj && obj.full,
          unstable: (obj && obj.unstable) || "",
          obj,
        });
        break;
      case "assistant":
        this._emit("assistant", {
          delta: (obj && obj.text) || "",
          full: (obj && obj.full) || "",
          final: !!(obj && obj.final),
          interrupted: !!(obj && obj.interrupted), // cut before any of its audio: no audio events come
        });
        break;
      case "assistant_audio_started":
        this._emit("assistant_audio_started", { turn: obj && obj.turn });
        break;
      case "assistant_tool_call":
        this._emit("assistant_tool_call", { ...(obj || {}) });
        break;
      case "assistant_tool_result":
        this._emit("assistant_tool_result", { ...(obj || {}) });
        break;
      case "assistant_audio_stopped":
        this._emit("assistant_audio_stopped", {
          turn: obj && obj.turn,
          interrupted: !!(obj && obj.interrupted),
          heard: (obj && obj.heard) || "",
        });
        break;
      case "wake_word": // {name, phrase, audio_ms}: the wake word was heard, the command follows
      case "wake_waiting": // {reason, names, phrases}: waiting for the wake word (again)
        this._emit(msg.type, { message: msg.message, obj });
        break;
      case "speech_started":
        this._speechStoppedAt = null;
        this._emit("speech_started", { obj });
        break;
      case "speech_stopped":
        this._speechStoppedAt = now;
        this._emit("speech_stopped", { obj });
        break;
      case "turn":
        this._emit("turn", {
          complete: !!(obj && obj.complete),
          by: obj ? obj.by : null,
          probability: obj ? obj.probability : null,
          decisionMs: obj ? obj.decision_ms : null,
          silenceMs: obj ? obj.silence_ms : null,
          obj,
        });
        break;
      default:
        break;
    }
    this._emit("message", { msg });
  }

  // --- bitrate -------------------------------------------------------------------------------

  /**
   * Cumulative counters from one getStats():
   *   audio        outbound audio RTP bytes (payload + RTP headers)
   *   audioPayload outbound audio RTP payload bytes
   *   total        transport bytesSent: everything DTLS carries (SRTP, SRTCP, SCTP), or null
   *   packets      transport packetsSent
   *   stunPackets  STUN requests + responses sent on the selected candidate pair (ICE consent
   *                checks; not part of `total`)
   */
  async sentBytes() {
    if (!this.pc) return null;
    const report = await this.pc.getStats();
    let audioPayload = 0;
    let audioHeaders = 0;
    let total = null;
    let packets = null;
    let timestamp = performance.now();
    const transports = [];
    const pairs = new Map();
    report.forEach((s) => {
      if (s.type === "outbound-rtp" && (s.kind === "audio" || s.mediaType === "audio")) {
        audioPayload += s.bytesSent || 0;
        audioHeaders += s.headerBytesSent || 0;
        timestamp = s.timestamp || timestamp;
      } else if (s.type === "transport") {
        transports.push(s);
      } else if (s.type === "candidate-pair") {
        pairs.set(s.id, s);
      }
    });
    let selected = transports
      .map((t) => pairs.get(t.selectedCandidatePairId))
      .filter((p) => p !== undefined);
    if (!selected.length) selected = [...pairs.values()].filter((p) => p.selected || (p.nominated && p.state === "succeeded"));
    if (transports.length) {
      total = transports.reduce((sum, t) => sum + (t.bytesSent || 0), 0);
      packets = transports.reduce((sum, t) => sum + (t.packetsSent || 0), 0);
      timestamp = transports[0].timestamp || timestamp;
    } else if (selected.length) {
      total = selected.reduce((sum, p) => sum + (p.bytesSent || 0), 0);
      packets = selected.reduce((sum, p) => sum + (p.packetsSent || 0), 0);
      timestamp = selected[0].timestamp || timestamp;
    }
    const stunPackets = selected.reduce((sum, p) => sum + (p.requestsSent || 0) + (p.responsesSent || 0), 0);
    return { audio: audioPayload + audioHeaders, audioPayload, total, packets, stunPackets, timestamp };
  }

  _startStats() {
    if (!this.statsIntervalMs || this._statsTimer) return;
    const sample = async () => {
      if (!this.pc) return;
      let now;
      try {
        now = await this.sentBytes();
      } catch {
        return;
      }
      if (!now) return;
      const last = this._lastStats;
      this._lastStats = now;
      if (!last) return;
      const ms = now.timestamp - last.timestamp;
      if (ms <= 0) return;
      this.bitrate = {
        audioKbps: kbps(now.audio - last.audio, ms),
        audioPayloadKbps: kbps(now.audioPayload - last.audioPayload, ms),
        totalKbps: now.total === null || last.total === null ? null : kbps(now.total - last.total, ms),
        intervalMs: ms,
        bytesSent: { audio: now.audio, total: now.total },
      };
      this._emit("bitrate", { ...this.bitrate });
    };
    sample();
    this._statsTimer = setInterval(sample, this.statsIntervalMs);
  }

  // --- local microphone level (works while the sender is paused) ------------------------------

  _startLevelMeter() {
    try {
      const Ctx = window.AudioContext || window.webkitAudioContext;
      if (!Ctx || !this.stream) return;
      const ctx = new Ctx();
      const source = ctx.createMediaStreamSource(this.stream);
      const analyser = ctx.createAnalyser();
      analyser.fftSize = 1024;
      source.connect(analyser);
      this._audioContext = ctx;
      this._analyser = analyser;
      this._levelBuffer = new Float32Array(analyser.fftSize);
      if (ctx.state === "suspended") ctx.resume().catch(() => {});
    } catch {
      this._audioContext = null;
      this._analyser = null;
    }
  }

  /** RMS level of the local microphone over the last ~20 ms in dBFS (null when unknown). */
  micLevel() {
    if (!this._analyser || !this._audioContext || this._audioContext.state !== "running") return null;
    this._analyser.getFloatTimeDomainData(this._levelBuffer);
    let sum = 0;
    for (const v of this._levelBuffer) sum += v * v;
    const rms = Math.sqrt(sum / this._levelBuffer.length);
    return rms > 0 ? 20 * Math.log10(rms) : -120;
  }

  // --- teardown ------------------------------------------------------------------------------

  /** Close the session (idempotent). The client can connect() again afterwards. */
  close() {
    this._generation += 1;
    if (this._closing && !this.pc) return;
    this._closing = true;
    const wasOpen = !!this.pc;
    if (this._statsTimer) clearInterval(this._statsTimer);
    for (const pending of this._pings.values()) clearTimeout(pending.timer);
    try {
      if (this.dc) this.dc.close();
    } catch {
      /* already closed */
    }
    try {
      if (this.pc) this.pc.close();
    } catch {
      /* already closed */
    }
    if (this.stream) for (const t of this.stream.getTracks()) t.stop();
    if (this._audioContext) this._audioContext.close().catch(() => {});
    const wasRecording = this.recording;
    this._reset();
    this._closing = true;
    this.state = {
      connectionState: "closed",
      iceConnectionState: "closed",
      iceGatheringState: "complete",
      signalingState: "closed",
      dataChannelState: "closed",
      connected: false,
    };
    if (wasOpen) this._emit("statechange", { ...this.state });
    if (wasRecording) this._emit("recording", { recording: false, handsFree: false });
  }
}
