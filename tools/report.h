#pragma once
/// One run's results as the user sees them: JSON (the stable shape), text, CSV and Markdown.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "metrics.h"
#include "plan.h"

namespace pipesim {

struct RunReport {
  std::string config;  ///< config source (file name)
  std::string schedule;
  std::string vocab;
  std::string cost_source;  ///< analytic, explicit, or measured (...)
  bool measured = false;    ///< from a real run: MFU is not reported (it is defined against the config's GPU)
  ParallelConfig parallel;
  std::vector<int> layers_per_stage;
  int vocab_padding = 0;  ///< rows added so the vocabulary splits evenly over the devices
  std::vector<std::string> peak_ops;  ///< per device: the op at which memory peaked
  RunMetrics metrics;
};

RunReport make_report(const Plan& plan, const std::string& cost_source, const RunMetrics& metrics);

enum class Format { Text, Json, Csv, Markdown };

/// simulate: one object (JSON) or a readable summary with a per-device table (text).
std::string format_run(const RunReport& report, Format format);
/// The JSON object of one run, keys in documented order (what `simulate --format json` prints).
nlohmann::ordered_json run_json(const RunReport& report);
/// compare: one row per run, speedup and memory against the first row.
std::string format_comparison(const std::vector<RunReport>& reports, Format format);

}  // namespace pipesim
