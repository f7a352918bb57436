#pragma once
/// The knobs tune searches, by the names the command line gives them: the columns of tune's table and
/// what `--fix key=value` pins (docs/tune.md).
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "status.h"

namespace pipesim {

struct Candidate;

enum class Knob {
  Pp, Tp, Dp, Cp, Ep, SequenceParallel, Microbatches, MicroBatchSize, Chunks, Schedule, Vocab, Recompute, ZeroStage, Fp8
};

/// The knob's column name in tune's table, which --fix also takes (with the config's dotted key).
std::string_view knob_name(Knob knob);

/// The chunks per device `config` runs: its schedule's fixed count, or parallel.chunks for a schedule
/// that takes it (a config may say chunks 2 and run 1F1B, which has one).
int chunks_run(const Config& config);

/// The knob's value in `config` as text, as --fix compares it: a number in decimal, or a name.
/// `chunks` is chunks_run;
/// `sp` is "on" or "off"; `recompute` is the granularity alone (--fix pins that; the cell shows more).
std::string knob_value(const Config& config, Knob knob);

/// Recomputation as tune shows it: "none", "selective", or "full/uniform/1" (granularity, method, layers).
std::string recompute_text(const TrainingConfig& training);

/// The knobs a row shows besides compare's schedule and vocab columns, in table order (ep for a model
/// with `experts` only), and their cells for `config`. Full recomputation shows its method and layer
/// count too: "full/uniform/1"; expert parallelism its expert tensor parallelism: "8/1" (ep/etp).
std::vector<Knob> shown_knobs(bool experts);
std::vector<std::string> knob_cells(const Config& config);

/// One `--fix key=value[,value...]`, checked against the knob names only: whether the search can take
/// the values is pin_space's to say.
struct Pin {
  Knob knob = Knob::Pp;
  std::vector<std::string> values;  ///< as knob_value writes them (numbers without sign or leading zeros)
  std::string given;                ///< the option as the user wrote it, for messages
};
/// Errors name the flag, the key and every key --fix accepts, or the value that is not one.
Result<Pin> parse_pin(const std::string& fix);

/// The candidates that have one of each pin's values. Errors: a knob pinned twice, a value no
/// candidate of the space has (listing those it has), and pins that no candidate has all of.
Result<std::vector<Candidate>> pin_space(const Config& config, std::vector<Candidate> space,
                                         const std::vector<Pin>& pins, int gpus);

}  // namespace pipesim
