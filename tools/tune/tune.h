#pragma once
/// `pipesim tune`: the fastest configurations that fit in memory, searched over schedule ×
/// vocabulary mode × (pp, tp, dp, cp) × sequence parallelism × microbatches × chunks × layer split ×
/// recomputation × ZeRO stage at a fixed GPU count and global batch (docs/tune.md). Library code: it returns errors and prints nothing but the progress bar.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "config.h"
#include "frameworks.h"
#include "report.h"
#include "status.h"
#include "tune_knobs.h"
#include "units.h"

namespace pipesim {

/// One point of the search: the base config with these fields replaced.
struct Candidate {
  ParallelConfig parallel;  ///< chunks as the schedule runs them
  /// With parallel.microbatches and dp: the config's global batch, microbatches × micro_batch_size
  /// × dp sequences.
  int micro_batch_size = 1;
  std::string schedule;
  VocabMode vocab = VocabMode::Baseline;
  std::vector<int> layers_per_stage;  ///< `redistribute` only; empty: "auto"
  /// How the split differs from the config's, for `changes`: empty (it does not), "split auto", or
  /// "1 layer s3→s4" (the auto split with one layer moved off its slowest stage).
  std::string split_change;
  /// With "auto": the split it comes to, balanced once for the whole search. The planner would balance
  /// it again for every candidate, and at thousands of layers balancing takes longer than the rest.
  std::vector<int> auto_split;
  /// Recomputation and ZeRO's stage: what trades memory for time besides the layout (with cp and
  /// sequence parallelism, in `parallel`). Method and layer count matter for full recomputation only.
  Recompute recompute = Recompute::None;
  RecomputeMethod recompute_method = RecomputeMethod::Uniform;
  int recompute_num_layers = 1;
  int zero_stage = 0;
  Fp8Format fp8 = Fp8Format::None;  ///< tried on and off where the GPU has FP8 tensor cores
};

/// Every candidate for `config` on `gpus` GPUs, in the stable order that breaks ties. The config's
/// own pp, tp, dp, cp, sequence parallelism, microbatches, chunks, split, recomputation and ZeRO stage
/// are among them whenever pp × tp × dp × cp = gpus. docs/tune.md lists what else is tried.
std::vector<Candidate> tune_space(const Config& config, int gpus);

/// `config` with the candidate's fields ("auto" as the split it comes to: the same plan).
Config apply_candidate(const Config& config, const Candidate& candidate);

/// What the candidate changes, e.g. "pp 8→4, tp 1→2, m 32→16, mbs 1→2, schedule zb-v, vocab vocab-2";
/// "none".
std::string describe_changes(const Config& config, const Candidate& candidate);

/// What no simulation of a config can beat, computed from its layout and the cost model without
/// building the graph.
struct LowerBounds {
  /// Per device: static bytes (weights, gradients, optimizer states) plus one microbatch's
  /// activations in every stage it holds (all alive once its last-held stage's forward starts),
  /// or the vocabulary pass's logits shard when that is larger.
  std::vector<Bytes> memory_bytes;
  /// The busiest device's forward, backward and weight-gradient time for every microbatch: its
  /// compute stream runs them one at a time (vocabulary passes, transfers and the optimizer ignored).
  TimeNs iteration_ns = 0;
};
/// Errors (a config check or a layout the schedule cannot have) name the field, as make_plan's do.
Result<LowerBounds> lower_bounds(const Config& config);

struct TuneSearch {
  int gpus = 0;          ///< 0: the config's pp × tp × dp
  std::size_t top = 10;  ///< rows kept
  bool prune = true;     ///< false: simulate every candidate (what tests compare the pruned search with)
  /// Candidates simulated between two updates of the pruning threshold. The threshold depends only
  /// on whole batches, so what is pruned never depends on thread timing.
  std::size_t batch = 128;
  bool progress = false;  ///< draw the progress bar on stderr
  /// `--fix`: only candidates with these values are searched (yours is simulated all the same).
  std::vector<Pin> pins = {};
  /// `--framework`: only candidates that framework runs (frameworks.h); yours is simulated all the same.
  Framework framework = Framework::Any;
};

struct TuneRow {
  std::size_t candidate = 0;  ///< index in tune_space's order
  std::string changes;
  Config config;  ///< what the row ran: the config with the candidate applied, as --write-config writes it
  RunReport report;
};

struct TuneResult {
  std::vector<TuneRow> rows;  ///< fitting runs, fastest first; ties in candidate order
  /// The config as given, simulated under the same memory cap, whether it fits or not: what the rows
  /// are measured against. Empty when it cannot run; `yours_error` then says why.
  std::optional<RunReport> yours;
  std::string yours_error;
  std::size_t evaluated = 0;  ///< every candidate: simulated + pruned + refused
  std::size_t simulated = 0;
  std::size_t pruned_by_memory = 0, pruned_by_time = 0;
  std::size_t refused = 0;  ///< configs the checks or the schedule refuse
  double seconds = 0;
  std::size_t pruned() const { return pruned_by_memory + pruned_by_time; }
};

/// The search. When nothing fits, the error names the smallest peak memory of any candidate (what an
/// exhaustive search would find), its device, its candidate and the cap, and what to change.
Result<TuneResult> tune(const Config& config, const TuneSearch& search);

}  // namespace pipesim
