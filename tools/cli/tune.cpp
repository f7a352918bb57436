// `pipesim tune` as a command: options in, the search's rows out as compare's table with the knobs of
// each row, a rank and a `changes` column under the config as given (yours, their reference), or JSON
// with the search's counts; --write-config saves one row as a config `simulate` runs as it is.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "config_files.h"
#include "config_writer.h"
#include "json_text.h"
#include "options.h"
#include "output_file.h"
#include "tune.h"
#include "tune_table.h"

namespace pipesim {
namespace {

/// `pipesim tune`: the fastest configurations that fit, at the config's GPU count and global batch.
struct TuneOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::vector<std::string> fixes;  ///< --fix key=value[,value...]
  double memory_gib = 0;           ///< 0: the config's hardware.memory_gib
  int gpus = 0;                    ///< 0: the config's pp x tp x dp x cp
  int top = 10;
  Format format = Format::Text;
  std::string write_config;  ///< empty: nothing written
  int rank = 1;              ///< the row --write-config writes: 1 is the fastest that fits, as the rank column counts
  std::string framework = "any";  ///< --framework: only candidates it runs
};

/// How a config tune wrote begins: a later --write-config may replace such a file, and no other.
constexpr std::string_view kTuneConfigMarker = "{\n  \"description\": \"written by pipesim tune";

/// The knobs of a row's config among its JSON fields (pp, tp, dp, chunks and microbatches are run_json's
/// already, where it ran, and keep their place).
void add_knobs(nlohmann::ordered_json& row, const Config& config) {
  const ParallelConfig& p = config.parallel;
  const TrainingConfig& t = config.training;
  row["pp"] = p.pp, row["tp"] = p.tp, row["dp"] = p.dp, row["cp"] = p.cp;
  if (config.model.has_experts()) row["ep"] = p.ep, row["etp"] = p.expert_tp();
  row["sequence_parallel"] = p.sequence_parallel, row["microbatches"] = p.microbatches;
  row["micro_batch_size"] = config.model.micro_batch_size;
  row["chunks"] = chunks_run(config);
  row["recompute_granularity"] = recompute_name(t.recompute_granularity);
  if (t.recompute_granularity == Recompute::Full) {
    row["recompute_method"] = t.recompute_method == RecomputeMethod::Block ? "block" : "uniform";
    row["recompute_num_layers"] = t.recompute_num_layers;
  }
  row["zero_stage"] = t.zero_stage;
}

/// A run's object as compare's JSON has it, with the per-GPU figures after the totals they divide.
nlohmann::ordered_json run_object(const RunReport& report, const RunReport& reference) {
  const nlohmann::ordered_json compared = comparison_json(report, reference, &report == &reference);
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (auto field = compared.begin(); field != compared.end(); ++field) {
    out[field.key()] = *field;
    if (field.key() == "tokens_per_s") out["tokens_per_s_per_gpu"] = tokens_per_s_per_gpu(report);
    if (field.key() == "speedup") out["speedup_per_gpu"] = speedup_per_gpu(report, reference);
  }
  return out;
}

nlohmann::ordered_json yours_json(const Config& config, const TuneResult& r) {
  nlohmann::ordered_json yours;
  if (r.yours) {
    yours = run_object(*r.yours, *r.yours);
  } else {
    yours = {{"config", config.source}, {"schedule", config.schedule.name}, {"vocab", vocab_mode_name(config.schedule.vocab)},
             {"error", r.yours_error}};
  }
  add_knobs(yours, config);
  yours["changes"] = yours_changes(r);
  return yours;
}

void print_json(const Config& config, const TuneResult& r, const RunReport& reference) {
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const TuneRow& row = r.rows[i];
    nlohmann::ordered_json result = {{"rank", i + 1}};
    result.update(run_object(row.report, reference));
    add_knobs(result, row.config);
    result["changes"] = row.changes;
    results.push_back(std::move(result));
  }
  const nlohmann::ordered_json out = {{"evaluated", r.evaluated},
                                      {"pruned", r.pruned()},
                                      {"simulated", r.simulated},
                                      {"refused", r.refused},
                                      {"seconds", r.seconds},
                                      {"reference", r.yours ? "yours" : "results[0]"},
                                      {"yours", yours_json(config, r)},
                                      {"results", results}};
  fmt::print("{}\n", json_text(out, 2));
}

void print_table(const Config& config, const TuneResult& r, const RunReport& reference, Format format) {
  fmt::print("{}{}", format_table(tune_columns(config), tune_table_rows(config, r, reference), format),
             reference_line(tune_reference_name(r), format));
}

/// --write-config: the row of --rank as a complete config, which `simulate` runs to the same numbers.
Status write_row(OutputFile& file, const TuneOptions& o, const TuneResult& r) {
  const TuneRow& row = r.rows[std::size_t(o.rank - 1)];
  const std::string description =
      fmt::format("written by pipesim tune from {}, rank {} of {}: {}", row.config.source, o.rank, r.rows.size(),
                  row.changes == "none" ? "the config as given" : row.changes);
  if (Status s = file.write(json_text(config_json(row.config, description), 2) + "\n"); !s.ok()) return s;
  return file.commit();
}

ExitStatus run_tune(const TuneOptions& o) {
  std::vector<Pin> pins;
  for (const std::string& fix : o.fixes) {
    Result<Pin> pin = parse_pin(fix);
    if (!pin.ok()) return fail(pin.error().message);
    pins.push_back(std::move(pin).value());
  }
  Result<Config> config = load_config(o.config, o.overrides);
  if (!config.ok()) return fail(config.error().message);
  if (o.memory_gib > 0) config.value().hardware.memory_gib = o.memory_gib;
  // An existing file is refused now, not after the search.
  std::optional<OutputFile> written;
  if (!o.write_config.empty()) {
    Result<OutputFile> file = OutputFile::create(o.write_config, kTuneConfigMarker);
    if (!file.ok()) return fail("--write-config: " + file.error().message);
    written.emplace(std::move(file).value());
  }
  const bool text = o.format == Format::Text;
  const TuneSearch search{.gpus = o.gpus,
                          .top = std::size_t(o.top),
                          .progress = text && isatty(fileno(stderr)),
                          .pins = pins,
                          .framework = *framework_named(o.framework)};
  Result<TuneResult> searched = tune(config.value(), search);
  if (!searched.ok()) return fail(searched.error().message);
  const TuneResult& r = searched.value();
  if (written && std::size_t(o.rank) > r.rows.size())
    return fail(fmt::format("--rank {}: only {} row(s) are shown{}; give a rank from 1 to {}", o.rank, r.rows.size(),
                            r.rows.size() < std::size_t(o.top) ? " (all that fit)" : fmt::format(" (--top {})", o.top),
                            r.rows.size()));
  // The rows are measured against the config as given; against the fastest when it cannot run.
  const RunReport& reference = tune_reference(r);
  if (o.format == Format::Json)
    print_json(config.value(), r, reference);
  else
    print_table(config.value(), r, reference, o.format);
  if (text)
    fmt::print(stderr,
               "pipesim: note: tune: {} configurations in {:.1f} s: {} simulated, {} pruned ({} cannot fit, {} cannot "
               "reach the top {}), {} refused by the config checks or the schedule\n",
               r.evaluated, r.seconds, r.simulated, r.pruned(), r.pruned_by_memory, r.pruned_by_time, o.top, r.refused);
  if (!written) return ExitStatus::Success;
  if (Status s = write_row(*written, o, r); !s.ok()) return fail("--write-config: " + s.error().message);
  note_written(o.write_config, fmt::format("rank {}; `pipesim simulate {}` runs it", o.rank, o.write_config));
  return ExitStatus::Success;
}

}  // namespace

void define_tune(CLI::App& tn, ExitStatus& status) {
  auto o = std::make_shared<TuneOptions>();
  tn.add_option("config", o->config, "JSON config file")->required()->check(kNonEmpty);
  tn.add_option("--set", o->overrides, "override a config field: key.path=value (repeatable)");
  tn.add_option("--fix", o->fixes,
                "search only candidates with one of these values: key=value[,value...], key a column (pp, tp, dp, "
                "cp, sp, m, mbs, chunks, schedule, vocab, recompute, zero) or its config key (parallel.pp, "
                "training.zero_stage, ...) (repeatable, one knob each)");
  tn.add_option("--framework", o->framework,
                "only candidates this framework runs: megatron, torchtitan, pytorch or any (default); `pipesim export "
                "--format megatron|torchtitan` then writes the launch file (docs/frameworks.md)")
      ->check(one_of(framework_names()));
  tn.add_option("--memory-gib", o->memory_gib, "device memory a config must fit in (default: hardware.memory_gib)")
      ->check(finite_in(0, 1e9));
  tn.add_option("--gpus", o->gpus, "GPUs to factor into pp x tp x dp x cp (default: the config's pp x tp x dp x cp)")
      ->check(whole_from(1, 1 << 24));
  tn.add_option("--top", o->top, "rows to print, fastest first (default 10)")->check(whole_from(1, 1000000));
  add_format_option(tn, o->format, {"text", "csv", "json", "markdown"});
  CLI::Option* write = tn.add_option("--write-config", o->write_config,
                                     "write the row of --rank as a complete JSON config that `pipesim simulate` runs "
                                     "as tune did (a new file, or one an earlier --write-config wrote)")
                           ->check(kNonEmpty);
  tn.add_option("--rank", o->rank,
                "the row --write-config writes, as the rank column numbers them: 1 is the fastest that fits, the "
                "last the slowest shown; yours has none (default 1)")
      ->check(whole_from(1, 1000000))
      ->needs(write);
  tn.callback([o, &status] { status = run_tune(*o); });
}

}  // namespace pipesim
