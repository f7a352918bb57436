#pragma once
/// The largest sizes pipesim accepts, checked in one place with overflow-checked 64-bit arithmetic
/// before anything proportional to them is allocated. Each cap sits far above any real training
/// run and low enough that every product the cost model and the graph builder form stays exact
/// (docs/config.md lists them with the reasons).
#include <cstdint>
#include <optional>

#include "config.h"
#include "units.h"

namespace pipesim {

namespace limits {
constexpr int kPp = 1024;                    ///< streams grow with pp² (one channel per device pair)
constexpr int kChunks = 127;                 ///< each op names its chunk in one byte (Task)
constexpr int kLayers = 4096;                ///< the balanced split weighs stages × layers candidates
constexpr int kHidden = 1 << 17;             ///< 131072; the largest published models use under 30k
constexpr int kFfnHidden = 1 << 19;          ///< 4 × kHidden
constexpr int kSeqLen = 1 << 22;             ///< 4M tokens
constexpr int kVocab = 1 << 24;              ///< 16.7M entries; real vocabularies are under 1M
constexpr int kTokensPerMicrobatch = 1 << 22;  ///< micro_batch_size × seq_len
constexpr int kMicrobatches = 1 << 20;
constexpr std::int64_t kGpus = 1 << 24;      ///< pp × tp × dp, so global ranks fit an int
constexpr int kGpusPerNode = 1 << 16;
constexpr std::int64_t kTasks = std::int64_t(1) << 28;  ///< about 70 GiB of graph at kBytesPerTask
constexpr Bytes kModelBytes = Bytes(1) << 56;  ///< weights, or activations of all microbatches (64 PiB)
/// hardware.memory_gib: its bytes (× 2³⁰) stay inside 64 bits, as large as any model pipesim takes.
constexpr double kMemoryGib = double(kModelBytes >> 30);
/// What one task of a built plan costs in memory (graph, timeline and metrics), measured with
/// peak RSS: about 260 B (pp 1024, m 8192: 13 GB for 50M tasks) with 99 bytes of graph per op;
/// rounded up, and kept as a bound now that the graph takes 51.
constexpr Bytes kBytesPerTask = 280;
}  // namespace limits

/// An upper bound on the tasks any schedule builds for `config` in its vocabulary mode, or nullopt
/// when even the bound does not fit 64 bits.
std::optional<std::int64_t> estimated_tasks(const Config& config);

/// The first size beyond its cap, as a FieldError naming the field and the knob to turn.
std::optional<FieldError> check_sizes(const Config& config);

/// Refuses a plan whose estimated memory exceeds `available` bytes (the machine's memory).
std::optional<FieldError> check_plan_fits(const Config& config, Bytes available);

}  // namespace pipesim
