#include "report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "config_writer.h"
#include "json_text.h"

namespace pipesim {
namespace {

using json = nlohmann::ordered_json;  // keys in the documented order

double gib(Bytes bytes) { return double(bytes) / double(1ull << 30); }

TimeNs max_exposed_comm(const RunReport& r) {
  TimeNs most = 0;
  for (const DeviceMetrics& d : r.metrics.devices) most = std::max(most, d.exposed_comm_ns);
  return most;
}

}  // namespace

std::string memory_cell(double amount) {
  // 0.995 and up rounds to 1.00 with two decimals: the format of 1 and above.
  if (!(amount > 0) || amount >= 0.995) return fmt::format("{:.2f}", amount);
  const int decimals = 2 - static_cast<int>(std::floor(std::log10(amount)));
  return fmt::format("{:.{}f}", amount, decimals);
}

Bytes max_peak(const RunReport& r) {
  Bytes most = 0;
  for (const DeviceMetrics& d : r.metrics.devices) most = std::max(most, d.peak_memory_bytes);
  return most;
}

json run_json(const RunReport& r) {
  const RunMetrics& m = r.metrics;
  json devices = json::array();
  for (const DeviceMetrics& d : m.devices)
    devices.push_back({{"rank", d.rank},
                       {"busy_s", seconds(d.busy_ns)},
                       {"bubble_fraction", d.bubble_fraction},
                       {"peak_memory_bytes", d.peak_memory_bytes},
                       {"peak_activation_bytes", d.peak_activation_bytes},
                       {"static_memory_bytes", d.static_bytes},
                       {"peak_op", r.peak_ops[std::size_t(d.rank)]},
                       {"peak_time_s", seconds(d.peak_time_ns)},
                       {"comm_s", seconds(d.comm_ns)},
                       {"exposed_comm_s", seconds(d.exposed_comm_ns)}});
  json out{{"config", r.config},
          {"schedule", r.schedule},
          {"vocab", r.vocab},
          {"cost_source", r.cost_source},
          {"pp", r.parallel.pp},
          {"tp", r.parallel.tp},
          {"dp", r.parallel.dp},
          {"chunks", r.parallel.chunks},
          {"microbatches", r.parallel.microbatches},
          {"cp", r.parallel.cp},
          {"sequence_parallel", r.parallel.sequence_parallel}};
  const TrainingConfig& t = r.training;
  out["recompute_granularity"] = recompute_name(t.recompute_granularity);
  if (t.recompute_granularity == Recompute::Full) {  // method and layers say nothing otherwise
    out["recompute_method"] = t.recompute_method == RecomputeMethod::Block ? "block" : "uniform";
    out["recompute_num_layers"] = t.recompute_num_layers;
  }
  out.update(json{{"zero_stage", t.zero_stage},
          {"overlap_grad_reduce", t.overlap_grad_reduce},
          {"overlap_param_gather", t.overlap_param_gather},
          {"tp_comm_overlap", t.tp_comm_overlap},
          {"overlap_p2p_comm", t.overlap_p2p_comm},
          {"fp8", fp8_json(r.fp8)},
          {"optimizer_post_validation", t.optimizer_post_validation},
          {"layers_per_stage", r.layers_per_stage},
          {"vocab_padding", r.vocab_padding},
          {"iteration_time_s", seconds(m.iteration_ns)},
          {"tokens_per_s", m.tokens_per_s},
          {"mfu", r.mfu_defined ? json(m.mfu) : json(nullptr)},
          {"bubble_fraction", m.bubble_fraction},
          {"exposed_comm_s", seconds(max_exposed_comm(r))},
          {"peak_memory_bytes", max_peak(r)},
          {"memory_imbalance", m.memory_imbalance},
          {"memory_capacity_bytes", m.memory_capacity_bytes},
          {"fits_in_memory", m.fits_in_memory},
          {"headroom_bytes", m.headroom_bytes},
          {"devices", devices}});
  return out;
}

namespace {

std::string join(const std::vector<int>& values) {
  std::string out;
  for (int v : values) out += (out.empty() ? "" : " ") + std::to_string(v);
  return out;
}

/// Columns a terminal shows: UTF-8 continuation bytes take none (fmt pads by display width too).
std::size_t display_width(const std::string& text) {
  return std::size_t(std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

/// RFC 4180: a cell holding a comma, a quote or a line break is quoted, its quotes doubled.
std::string csv_cell(const std::string& cell) {
  if (cell.find_first_of(",\"\n\r") == std::string::npos) return cell;
  std::string quoted = "\"";
  for (char c : cell) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

/// The settings that differ from the defaults, as ", recompute full, ZeRO 1, ...": the summary line shows
/// that what the user set took.
std::string changed_settings(const RunReport& r) {
  const TrainingConfig& t = r.training;
  const TrainingConfig defaults;
  std::string out;
  if (t.recompute_granularity != Recompute::None) out += fmt::format(", recompute {}", recompute_name(t.recompute_granularity));
  if (t.recompute_granularity == Recompute::Full &&
      (t.recompute_method != defaults.recompute_method || t.recompute_num_layers != defaults.recompute_num_layers))
    out += fmt::format(" ({}, {} layer(s))", t.recompute_method == RecomputeMethod::Block ? "block" : "uniform",
                       t.recompute_num_layers);
  if (t.zero_stage != defaults.zero_stage) out += fmt::format(", ZeRO {}", t.zero_stage);
  if (r.parallel.sequence_parallel != ParallelConfig{}.sequence_parallel)
    out += r.parallel.sequence_parallel ? ", sequence parallel" : ", no sequence parallelism";
  if (t.overlap_grad_reduce) out += ", overlap_grad_reduce";
  if (t.overlap_param_gather) out += ", overlap_param_gather";
  if (t.tp_comm_overlap) out += ", tp_comm_overlap";
  if (t.overlap_p2p_comm) out += ", overlap_p2p_comm";
  if (r.fp8 != Fp8Format::None) out += fmt::format(", fp8 {}", fp8_format_name(r.fp8));
  if (t.optimizer_post_validation) out += ", optimizer_post_validation";
  return out;
}

}  // namespace

std::string csv_line(const std::vector<std::string>& cells) {
  std::string line;
  for (const std::string& cell : cells) line += (line.empty() ? "" : ",") + csv_cell(cell);
  return line + "\n";
}

void write_table(const std::vector<Column>& columns, std::size_t row_count,
                 const std::function<std::vector<std::string>(std::size_t)>& row, Format format,
                 const std::function<void(std::string_view)>& out) {
  std::vector<std::string> header;
  for (const Column& c : columns) header.push_back(c.name);
  if (format == Format::Csv) {
    out(csv_line(header));
    for (std::size_t i = 0; i < row_count; ++i) out(csv_line(row(i)));
    return;
  }
  std::vector<std::size_t> width(columns.size());
  for (std::size_t c = 0; c < columns.size(); ++c) width[c] = display_width(header[c]);
  for (std::size_t i = 0; i < row_count; ++i) {
    const std::vector<std::string> cells = row(i);
    for (std::size_t c = 0; c < columns.size(); ++c) width[c] = std::max(width[c], display_width(cells[c]));
  }
  const auto line = [&](const std::vector<std::string>& cells) {
    std::string s = format == Format::Markdown ? "|" : "";
    for (std::size_t c = 0; c < cells.size(); ++c) {
      s += format == Format::Markdown ? " " : (c ? "  " : "");
      s += columns[c].left ? fmt::format("{:<{}}", cells[c], width[c]) : fmt::format("{:>{}}", cells[c], width[c]);
      if (format == Format::Markdown) s += " |";
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  out(line(header));
  if (format == Format::Markdown) {
    std::vector<std::string> rule;
    for (std::size_t c = 0; c < columns.size(); ++c)
      rule.push_back(std::string(width[c] - 1, '-') + (columns[c].left ? "-" : ":"));
    out(line(rule));
  }
  for (std::size_t i = 0; i < row_count; ++i) out(line(row(i)));
}

std::string format_table(const std::vector<Column>& columns, const std::vector<std::vector<std::string>>& rows,
                         Format format) {
  std::string out;
  write_table(
      columns, rows.size(), [&rows](std::size_t i) { return rows[i]; }, format,
      [&out](std::string_view text) { out += text; });
  return out;
}

std::string mfu_cell(const RunReport& report, int decimals) {
  return report.mfu_defined ? fmt::format("{:.{}f}", 100 * report.metrics.mfu, decimals) : "n/a";
}

RunReport make_report(const Plan& plan, const std::string& cost_source, const RunMetrics& metrics) {
  RunReport r;
  r.config = plan.config.source;
  r.schedule = plan.config.schedule.name;
  r.vocab = vocab_mode_name(plan.config.schedule.vocab);
  r.cost_source = cost_source;
  r.mfu_defined = !plan.config.costs.has_value();
  r.parallel = plan.config.parallel;
  r.training = plan.config.training;
  r.fp8 = plan.config.precision.fp8;
  for (const VirtualStage& s : plan.layout.stages) r.layers_per_stage.push_back(s.layers);
  r.vocab_padding = plan.layout.padded_vocab - plan.config.model.vocab;
  for (const DeviceMetrics& d : metrics.devices)
    r.peak_ops.push_back(d.peak_op == kNoTask ? "" : plan.graph.describe(d.peak_op));
  r.metrics = metrics;
  return r;
}

std::string format_run(const RunReport& r, Format format) {
  if (format == Format::Json) return json_text(run_json(r), 2) + "\n";
  const RunMetrics& m = r.metrics;
  // Small models (the CPU runtime's) read better in MiB.
  const bool small = max_peak(r) < Bytes(1) << 30;
  const char* unit = small ? "MiB" : "GiB";
  const auto mem = [small](Bytes b) { return small ? double(b) / double(1 << 20) : gib(b); };
  std::string out = fmt::format(
      "{}: schedule {}, vocab {}, pp {} tp {} dp {}{}, {} microbatches, {} chunk(s), {} costs{}\n"
      "layers per stage: {}{}\n"
      "iteration {:.3f} ms, {:.0f} tokens/s, MFU {}, bubble {:.1f}% (mean), exposed comm {:.3f} ms (max)\n"
      "peak memory {} {} of {:.2f} {}{}, imbalance {:.2f}x\n\n",
      r.config, r.schedule, r.vocab, r.parallel.pp,
      r.parallel.tp, r.parallel.dp, r.parallel.cp != 1 ? fmt::format(" cp {}", r.parallel.cp) : "",
      r.parallel.microbatches, r.parallel.chunks, r.cost_source, changed_settings(r),
      join(r.layers_per_stage),
      r.vocab_padding ? fmt::format("; vocabulary padded by {} rows to split evenly over {} devices", r.vocab_padding,
                                    r.parallel.pp)
                      : "",
      m.iteration_ns / 1e6, m.tokens_per_s, mfu_cell(r, 1) + (r.mfu_defined ? "%" : ""),
      100 * m.bubble_fraction, max_exposed_comm(r) / 1e6, memory_cell(mem(max_peak(r))), unit,
      mem(m.memory_capacity_bytes), unit,
      m.fits_in_memory ? "" : " -- DOES NOT FIT", m.memory_imbalance);
  std::vector<std::vector<std::string>> rows;
  for (const DeviceMetrics& d : m.devices)
    rows.push_back({std::to_string(d.rank), r.peak_ops[std::size_t(d.rank)], fmt::format("{:.3f}", d.busy_ns / 1e6),
                    fmt::format("{:.1f}", 100 * d.bubble_fraction), memory_cell(mem(d.static_bytes)),
                    memory_cell(mem(d.peak_activation_bytes)), memory_cell(mem(d.peak_memory_bytes)),
                    fmt::format("{:.3f}", d.exposed_comm_ns / 1e6)});
  const std::string u = small ? "mib" : "gib";
  return out + format_table({{"rank", true}, {"memory peaks at", true}, {"busy_ms"}, {"bubble_pct"}, {"static_" + u},
                             {"activation_" + u}, {"peak_" + u}, {"exposed_comm_ms"}},
                            rows, Format::Text);
}

std::string format_comparison(const std::vector<RunReport>& reports, Format format) {
  const RunReport& reference = reports.front();
  if (format == Format::Json) {
    json all = json::array();
    for (const RunReport& r : reports) all.push_back(comparison_json(r, reference, &r == &reference));
    return json_text(all, 2) + "\n";
  }
  std::vector<std::vector<std::string>> rows;
  for (const RunReport& r : reports) rows.push_back(comparison_cells(r, reference));
  return format_table(comparison_columns(), rows, format) + reference_line(comparison_reference(reference), format);
}

std::string comparison_reference(const RunReport& reference) {
  return fmt::format("row 1 ({}, {}, {})", reference.config, reference.schedule, reference.vocab);
}

double speedup(const RunReport& r, const RunReport& reference) {
  return r.metrics.tokens_per_s / reference.metrics.tokens_per_s;
}

json comparison_json(const RunReport& r, const RunReport& reference, bool is_reference) {
  json object = run_json(r);
  object["speedup"] = speedup(r, reference);
  object["reference"] = is_reference;
  return object;
}

std::string reference_line(const std::string& reference, Format format) {
  if (format != Format::Text && format != Format::Markdown) return "";
  return fmt::format("\nspeedup = tokens/s ÷ those of {}; mem_vs_first = peak memory ÷ its peak memory\n",
                     reference);
}

std::vector<Column> comparison_columns() {
  return {{"config", true}, {"schedule", true}, {"vocab", true}, {"iter_ms"},  {"tokens_per_s"},
          {"mfu_pct"},          {"bubble_pct"},     {"peak_mem_gib"},  {"speedup"}, {"mem_vs_first"},
          {"fits"},             {"headroom_gib"}};
}

std::vector<std::string> comparison_cells(const RunReport& r, const RunReport& reference) {
  const RunMetrics& m = r.metrics;
  return {r.config, r.schedule, r.vocab, fmt::format("{:.3f}", m.iteration_ns / 1e6), fmt::format("{:.0f}", m.tokens_per_s),
          mfu_cell(r, 2), fmt::format("{:.2f}", 100 * m.bubble_fraction),
          memory_cell(gib(max_peak(r))),
          fmt::format("{:.3f}", speedup(r, reference)),
          fmt::format("{:.3f}", double(max_peak(r)) / double(max_peak(reference))), m.fits_in_memory ? "yes" : "NO",
          memory_cell(gib(m.headroom_bytes))};
}

}  // namespace pipesim
