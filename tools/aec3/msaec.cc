// A C ABI over webrtc-audio-processing 2.x's APM whose AEC3 takes a config, for tools/aec3_config.py.
//
// pywebrtc-audio (the server's binding) builds AEC3 with its default EchoCanceller3Config and exposes
// none of it; this wrapper sets the suppressor's fields by name, so the tool can measure what tuning
// AEC3 buys under double talk (issue #37). Built by the tool, not by `make setup`: it is not in the
// server. Loaded with ctypes.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <array>
#include "api/audio/audio_processing.h"
#include "api/audio/echo_canceller3_config.h"
#include "modules/audio_processing/aec3/echo_canceller3.h"

namespace {
class Factory : public webrtc::EchoControlFactory {
 public:
  explicit Factory(const webrtc::EchoCanceller3Config& c) : config_(c) {}
  std::unique_ptr<webrtc::EchoControl> Create(int rate, int render, int capture) override {
    return std::make_unique<webrtc::EchoCanceller3>(config_, std::nullopt, rate, render, capture);
  }
 private:
  webrtc::EchoCanceller3Config config_;
};

struct Handle {
  rtc::scoped_refptr<webrtc::AudioProcessing> apm;
  webrtc::StreamConfig stream{16000, 1};
  bool linear = false;
};

// One of the suppressor's two tunings (near-end state "nt.", normal "no."): k without its prefix.
bool set_tuning(webrtc::EchoCanceller3Config::Suppressor::Tuning& t, const std::string& k, float v) {
  auto& m = k.compare(0, 3, "lf.") == 0 ? t.mask_lf : t.mask_hf;
  const std::string field = k.size() > 3 ? k.substr(3) : "";
  if (k.compare(0, 3, "lf.") == 0 || k.compare(0, 3, "hf.") == 0) {
    if (field == "enr_transparent") m.enr_transparent = v;
    else if (field == "enr_suppress") m.enr_suppress = v;
    else if (field == "emr_transparent") m.emr_transparent = v;
    else return false;
  } else if (k == "max_inc_factor") t.max_inc_factor = v;
  else if (k == "max_dec_factor_lf") t.max_dec_factor_lf = v;
  else return false;
  return true;
}

bool set(webrtc::EchoCanceller3Config& c, const std::string& k, float v) {
  auto& s = c.suppressor;
  auto& dn = s.dominant_nearend_detection;
  if (k.compare(0, 3, "nt.") == 0) return set_tuning(s.nearend_tuning, k.substr(3), v);
  if (k.compare(0, 3, "no.") == 0) return set_tuning(s.normal_tuning, k.substr(3), v);
  if (k == "dn.enr_threshold") dn.enr_threshold = v;
  else if (k == "dn.enr_exit_threshold") dn.enr_exit_threshold = v;
  else if (k == "dn.snr_threshold") dn.snr_threshold = v;
  else if (k == "dn.hold_duration") dn.hold_duration = (int)v;
  else if (k == "dn.trigger_threshold") dn.trigger_threshold = (int)v;
  else if (k == "dn.use_during_initial_phase") dn.use_during_initial_phase = v != 0;
  else if (k == "ep.default_len") c.ep_strength.default_len = v;
  else if (k == "ep.nearend_len") c.ep_strength.nearend_len = v;
  else if (k == "ep.default_gain") c.ep_strength.default_gain = v;
  else if (k == "ep.bounded_erl") c.ep_strength.bounded_erl = v != 0;
  else if (k == "subband") s.use_subband_nearend_detection = v != 0;
  else if (k == "hb.max_gain_during_echo") s.high_bands_suppression.max_gain_during_echo = v;
  else return false;
  return true;
}
}  // namespace

extern "C" {
// options: "key=value;key=value" (see set()); returns null on an unknown key.
void* msaec_create(int sample_rate, const char* options, int linear) {
  webrtc::EchoCanceller3Config config;
  std::stringstream ss(options ? options : "");
  std::string item;
  while (std::getline(ss, item, ';')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) return nullptr;
    if (!set(config, item.substr(0, eq), std::strtof(item.c_str() + eq + 1, nullptr))) return nullptr;
  }
  config.filter.export_linear_aec_output = linear != 0;
  if (!webrtc::EchoCanceller3Config::Validate(&config)) return nullptr;
  webrtc::AudioProcessing::Config apm_config;
  apm_config.echo_canceller.enabled = true;
  apm_config.echo_canceller.export_linear_aec_output = linear != 0;
  apm_config.high_pass_filter.enabled = true;
  auto* h = new Handle();
  h->linear = linear != 0;
  h->stream = webrtc::StreamConfig(sample_rate, 1);
  h->apm = webrtc::AudioProcessingBuilder()
               .SetConfig(apm_config)
               .SetEchoControlFactory(std::make_unique<Factory>(config))
               .Create();
  return h;
}

// One 10 ms frame: ref (played), mic (captured) -> out; linear_out (160 samples at 16 kHz) if linear.
int msaec_process(void* handle, const float* ref, const float* mic, float* out, float* linear_out) {
  auto* h = static_cast<Handle*>(handle);
  float rbuf[480], rout[480];
  size_t n = h->stream.num_frames();
  std::memcpy(rbuf, ref, n * sizeof(float));
  const float* rin[1] = {rbuf};
  float* rdst[1] = {rout};
  int err = h->apm->ProcessReverseStream(rin, h->stream, h->stream, rdst);
  if (err) return err;
  float mbuf[480];
  std::memcpy(mbuf, mic, n * sizeof(float));
  const float* min_[1] = {mbuf};
  float* mdst[1] = {out};
  h->apm->set_stream_delay_ms(0);
  err = h->apm->ProcessStream(min_, h->stream, h->stream, mdst);
  if (err) return err;
  if (h->linear && linear_out) {
    std::array<float, 160> lin[1];
    if (h->apm->GetLinearAecOutput(rtc::ArrayView<std::array<float, 160>>(lin, 1))) {
      std::memcpy(linear_out, lin[0].data(), 160 * sizeof(float));
    }
  }
  return 0;
}

void msaec_destroy(void* handle) { delete static_cast<Handle*>(handle); }
}
