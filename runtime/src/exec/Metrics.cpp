//===- Metrics.cpp --------------------------------------------------------===//
#include "mapp/rt/Metrics.h"
#include "mapp/rt/Error.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

using namespace mapp::rt;

MetricsWriter::MetricsWriter(const std::string &path, bool append)
    : out_(path, append ? std::ios::app : std::ios::out), path_(path) {
  if (!out_)
    fail("cannot write metrics file '", path, "'");
}

static nlohmann::json num(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

void MetricsWriter::write(const StepMetrics &m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", num(m.loss)},
                      {"lr", m.lr},
                      {"grad_norm", num(m.gradNorm)},
                      {"tokens_per_s", m.tokensPerS},
                      {"step_ms", m.stepMs},
                      {"tokens", m.tokens},
                      {"loss_scale", m.lossScale},
                      {"skipped", m.skipped}};
  if (!m.expertTokens.empty()) {
    nlohmann::json experts = nlohmann::json::object();
    for (const auto &[name, counts] : m.expertTokens)
      experts[name] = counts;
    j["expert_tokens"] = experts;
  }
  out_ << j.dump() << "\n";
  out_.flush();
  if (!out_)
    fail("error writing metrics file '", path_, "'");
}

Progress::Progress(int64_t totalSteps, bool tty, bool quiet)
    : total_(totalSteps), tty_(tty), quiet_(quiet) {}

void Progress::update(const StepMetrics &m) {
  if (quiet_)
    return;
  if (tty_) {
    const int width = 30;
    int filled =
        static_cast<int>(width * (m.step + 1) / std::max<int64_t>(total_, 1));
    std::string bar(filled, '#');
    bar.resize(width, '.');
    std::printf("\r[%s] step %lld/%lld  loss %.4f  %.0f tok/s  ", bar.c_str(),
                static_cast<long long>(m.step + 1),
                static_cast<long long>(total_), m.loss, m.tokensPerS);
  } else {
    std::printf("step %lld/%lld loss %.6f lr %.6g grad_norm %.6g tokens/s %.1f "
                "step_ms %.2f\n",
                static_cast<long long>(m.step + 1),
                static_cast<long long>(total_), m.loss, m.lr, m.gradNorm,
                m.tokensPerS, m.stepMs);
  }
  std::fflush(stdout);
}

void Progress::finish() {
  if (tty_ && !quiet_)
    std::printf("\n");
}
