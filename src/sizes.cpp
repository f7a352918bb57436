#include "sizes.h"

#include <fmt/format.h>

#include <algorithm>

#include "layout.h"
#include "model_math.h"
#include "parallel_shape.h"

namespace pipesim {
namespace {

/// a × b, or nullopt when it overflows 64 bits.
std::optional<std::int64_t> times(std::int64_t a, std::int64_t b) {
  std::int64_t product;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

std::optional<std::int64_t> plus(std::optional<std::int64_t> a, std::optional<std::int64_t> b) {
  std::int64_t sum;
  if (!a || !b || __builtin_add_overflow(*a, *b, &sum)) return std::nullopt;
  return sum;
}

std::optional<std::int64_t> times(std::optional<std::int64_t> a, std::int64_t b) {
  return a ? times(*a, b) : std::nullopt;
}

FieldError too_large(const std::string& path, std::int64_t value, std::int64_t cap) {
  return {path, fmt::format("must be at most {}, got {} (pipesim's limit; docs/config.md says why)", cap, value)};
}

std::optional<FieldError> check_model(const ModelConfig& m) {
  if (m.layers > limits::kLayers) return too_large("model.layers", m.layers, limits::kLayers);
  if (m.hidden > limits::kHidden) return too_large("model.hidden", m.hidden, limits::kHidden);
  if (m.ffn_hidden > limits::kFfnHidden)
    return too_large("model.ffn_hidden", m.ffn_hidden, limits::kFfnHidden);
  if (m.seq_len > limits::kSeqLen) return too_large("model.seq_len", m.seq_len, limits::kSeqLen);
  if (m.vocab > limits::kVocab) return too_large("model.vocab", m.vocab, limits::kVocab);
  const std::int64_t tokens = std::int64_t(m.micro_batch_size) * m.seq_len;
  if (tokens > limits::kTokensPerMicrobatch)
    return FieldError{"model.micro_batch_size",
                      fmt::format("{} x seq_len {} is {} tokens per microbatch, over pipesim's limit of {}; use a "
                                  "smaller micro_batch_size or seq_len",
                                  m.micro_batch_size, m.seq_len, tokens, limits::kTokensPerMicrobatch)};
  return std::nullopt;
}

std::optional<FieldError> check_parallel(const ParallelConfig& p, const HardwareConfig& h) {
  if (p.pp > limits::kPp) return too_large("parallel.pp", p.pp, limits::kPp);
  if (p.chunks > limits::kChunks) return too_large("parallel.chunks", p.chunks, limits::kChunks);
  if (p.microbatches > limits::kMicrobatches)
    return too_large("parallel.microbatches", p.microbatches, limits::kMicrobatches);
  const std::optional<std::int64_t> gpus = times(times(times(p.pp, p.tp), p.dp), p.cp);
  if (!gpus || *gpus > limits::kGpus)
    return FieldError{"parallel.dp", fmt::format("pp {} x tp {} x dp {} x cp {} is over pipesim's limit of {} GPUs; "
                                                 "use a smaller dp, tp or cp",
                                                 p.pp, p.tp, p.dp, p.cp, limits::kGpus)};
  if (h.gpus_per_node > limits::kGpusPerNode)
    return too_large("hardware.gpus_per_node", h.gpus_per_node, limits::kGpusPerNode);
  // Turned into bytes (an integer) for the fits-in-memory verdict: 1e10 GiB would wrap negative.
  if (!(h.memory_gib <= limits::kMemoryGib))
    return FieldError{"hardware.memory_gib", fmt::format("must be at most {} (64 PiB), got {} (pipesim's limit; "
                                                         "docs/config.md says why)",
                                                         limits::kMemoryGib, h.memory_gib)};
  return std::nullopt;
}

/// Weights and the activations of every microbatch, in doubles (the caps above keep them finite).
std::optional<FieldError> check_bytes(const Config& c) {
  const ModelConfig& m = c.model;
  const double weights = (model_layer_params(m) + 2 * vocab_params(m)) * ZeroSharding{}.bytes_per_param(c.precision);
  if (weights > double(limits::kModelBytes))
    return FieldError{"model.hidden", fmt::format("the weights would take {:.3g} bytes, over pipesim's limit of {:.3g}; "
                                                  "use a smaller hidden, ffn_hidden, vocab or fewer layers",
                                                  weights, double(limits::kModelBytes))};
  Config whole = c;  // on one device, nothing split or recomputed: a bound on every layout's share
  whole.parallel.tp = whole.parallel.cp = 1;
  whole.training.recompute_granularity = Recompute::None;
  const double per_microbatch = activations_kept(whole, 0, m.layers).from_forward +
                                double(m.micro_batch_size) * m.seq_len * (4.0 * m.vocab + 8.0 * m.hidden);
  const double activations = per_microbatch * c.parallel.microbatches;
  if (activations > double(limits::kModelBytes))
    return FieldError{"parallel.microbatches",
                      fmt::format("the activations of all microbatches would take {:.3g} bytes, over pipesim's limit "
                                  "of {:.3g}; use fewer microbatches or a smaller model",
                                  activations, double(limits::kModelBytes))};
  if (c.costs) {
    // activation_bytes is one device's even share; a stage of `redistribute` may hold up to pp shares.
    const double layers = c.costs->activation_bytes.value_or(0) * c.parallel.pp;
    if (layers * c.parallel.microbatches > double(limits::kModelBytes))
      return FieldError{"costs.activation_bytes",
                        fmt::format("{:.3g} bytes per microbatch x pp {} x {} microbatches is over pipesim's limit of "
                                    "{:.3g} bytes; give the bytes one microbatch keeps on one device",
                                    *c.costs->activation_bytes, c.parallel.pp, c.parallel.microbatches,
                                    double(limits::kModelBytes))};
    if (c.costs->output_activation_bytes * c.parallel.microbatches > double(limits::kModelBytes))
      return FieldError{"costs.output_activation_bytes",
                        fmt::format("{:.3g} bytes per microbatch x {} microbatches is over pipesim's limit of {:.3g} "
                                    "bytes; give the bytes the output layer keeps for one microbatch",
                                    c.costs->output_activation_bytes, c.parallel.microbatches,
                                    double(limits::kModelBytes))};
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::int64_t> estimated_tasks(const Config& c) {
  const ParallelConfig& p = c.parallel;
  // Per virtual stage and microbatch: F, B, W and a send and a receive each way. Per device and
  // microbatch, the vocabulary-parallel modes add at most 8 passes and collectives (the layers on
  // the first and last stage add none). Per device, the per-iteration ops. sizes_test checks the
  // bound against every schedule and mode.
  const bool vocab_passes = c.schedule.vocab != VocabMode::Baseline && c.schedule.vocab != VocabMode::Redistribute;
  const std::optional<std::int64_t> stages = times(p.pp, p.chunks);
  const std::optional<std::int64_t> per_microbatch = plus(times(stages, 7), times(p.pp, vocab_passes ? 8 : 0));
  return plus(times(per_microbatch, p.microbatches), times(p.pp, 16));
}

std::optional<FieldError> check_sizes(const Config& c) {
  if (std::optional<FieldError> e = check_model(c.model)) return e;
  if (std::optional<FieldError> e = check_parallel(c.parallel, c.hardware)) return e;
  const std::optional<std::int64_t> stages = times(c.parallel.pp, c.parallel.chunks);
  const std::optional<std::int64_t> fewest =
      stages ? std::optional(fewest_layers(c.schedule.vocab, *stages)) : std::nullopt;
  if (!fewest || *fewest > c.model.layers)
    return FieldError{"model.layers",
                      fmt::format("{} layers cannot fill {} virtual stages (pp {} x chunks {}); use at least {} layers "
                                  "or fewer stages",
                                  c.model.layers, stages ? fmt::to_string(*stages) : "too many", c.parallel.pp,
                                  c.parallel.chunks, fewest ? fmt::to_string(*fewest) : "that many")};
  if (std::optional<FieldError> e = check_bytes(c)) return e;
  const std::optional<std::int64_t> tasks = estimated_tasks(c);
  if (!tasks || *tasks > limits::kTasks)
    return FieldError{"parallel.microbatches",
                      fmt::format("pp {} x chunks {} x microbatches {} would build about {} tasks, over pipesim's limit "
                                  "of {}; use fewer microbatches or pipeline stages",
                                  c.parallel.pp, c.parallel.chunks, c.parallel.microbatches,
                                  tasks ? fmt::to_string(*tasks) : "2^63", limits::kTasks)};
  return std::nullopt;
}

std::optional<FieldError> check_plan_fits(const Config& c, Bytes available) {
  const std::optional<std::int64_t> bytes = times(estimated_tasks(c), limits::kBytesPerTask);
  if (bytes && *bytes <= available) return std::nullopt;
  return FieldError{"parallel.microbatches",
                    fmt::format("pp {} x chunks {} x microbatches {} would need about {:.1f} GiB to build and "
                                "simulate, more than this machine's {:.1f} GiB; use fewer microbatches or pipeline "
                                "stages",
                                c.parallel.pp, c.parallel.chunks, c.parallel.microbatches,
                                bytes ? double(*bytes) / double(1 << 30) : 1e10, double(available) / double(1 << 30))};
}

}  // namespace pipesim
