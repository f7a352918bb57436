#include "parallel_shape.h"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "model_math.h"
#include "sizes.h"

namespace pipesim {

int gpu_count(const ParallelConfig& p) { return p.pp * p.tp * p.cp * p.dp; }

std::int64_t global_batch_size(const Config& c) {
  return std::int64_t(c.parallel.microbatches) * c.model.micro_batch_size * c.parallel.dp;
}

std::optional<int> microbatches_for(std::int64_t global_batch, int micro_batch_size, int dp) {
  const std::int64_t per_step = std::int64_t(micro_batch_size) * dp;  // sequences of one microbatch on every replica
  if (per_step < 1 || global_batch < per_step || global_batch % per_step != 0 || global_batch / per_step > INT_MAX)
    return std::nullopt;
  return int(global_batch / per_step);
}

namespace {

/// What makes a global batch that does not split into micro-batches over the replicas split: the nearest
/// multiples of micro_batch_size · dp around it and, when dp divides it, the nearest micro-batch sizes
/// that divide each replica's share.
std::string global_batch_fixes(std::int64_t global_batch, int micro_batch_size, int dp) {
  const std::int64_t per_step = std::int64_t(micro_batch_size) * dp;
  const std::int64_t below = global_batch / per_step * per_step, above = below + per_step;
  // A global batch is an int: past INT_MAX there is no larger one to offer.
  std::string fixes = below == 0 && above > INT_MAX ? std::string("use a smaller micro_batch_size or dp")
                      : below == 0                  ? fmt::format("use {}", above)
                      : above > INT_MAX             ? fmt::format("use {}", below)
                                                    : fmt::format("use {} or {}", below, above);
  if (global_batch % dp != 0) return fixes;  // no micro-batch size splits what dp does not
  const std::int64_t share = global_batch / dp;
  std::int64_t smaller = 1, larger = 0;  // the nearest divisors of the share either side
  for (std::int64_t d = 1; d * d <= share; ++d)
    for (const std::int64_t divisor : {d, share / d})
      if (share % d == 0) {
        if (divisor < micro_batch_size) smaller = std::max(smaller, divisor);
        if (divisor > micro_batch_size && (larger == 0 || divisor < larger)) larger = divisor;
      }
  return fixes + (larger > 0 ? fmt::format(", or a micro_batch_size of {} or {}", smaller, larger)
                             : fmt::format(", or a micro_batch_size of {}", smaller));
}

}  // namespace

std::optional<FieldError> derive_microbatches(Config& c) {
  if (!c.training.global_batch_size) return std::nullopt;
  const std::int64_t global_batch = *c.training.global_batch_size;
  const int b = c.model.micro_batch_size, dp = c.parallel.dp;
  const std::optional<int> m = microbatches_for(global_batch, b, dp);
  if (!m)
    return FieldError{"training.global_batch_size",
                      fmt::format("{} sequences do not split over dp {} (parallel.dp) in micro-batches of {} "
                                  "(model.micro_batch_size): the global batch must be a multiple of {} x {} = {}; {}",
                                  global_batch, dp, b, b, dp, std::int64_t(b) * dp, global_batch_fixes(global_batch, b, dp))};
  if (*m > limits::kMicrobatches)
    return FieldError{"training.global_batch_size",
                      fmt::format("{} sequences over dp {} in micro-batches of {} make {} microbatches per pipeline, "
                                  "over pipesim's limit of {}; use a larger micro_batch_size or dp, or a global batch "
                                  "of at most {}",
                                  global_batch, dp, b, *m, limits::kMicrobatches,
                                  std::int64_t(limits::kMicrobatches) * b * dp)};
  c.parallel.microbatches = *m;
  return std::nullopt;
}

int global_rank(const ParallelConfig& p, int device) { return device * p.tp * p.cp * p.dp; }

double rank_tokens(const Config& c) { return double(c.model.micro_batch_size) * c.model.seq_len / c.parallel.cp; }

double hidden_activation_bytes(const Config& c) {
  const ParallelConfig& p = c.parallel;
  // Under sequence parallelism each tensor-parallel rank holds its 1/tp of the tokens; without it, all.
  return rank_tokens(c) * c.model.hidden * c.precision.activation_bytes / (p.sequence_parallel ? p.tp : 1);
}

double expert_exchange_bytes(const Config& c) {
  const ModelConfig& m = c.model;
  return rank_tokens(c) / c.parallel.tp * m.moe_router_topk * moe_load(m) * m.hidden * c.precision.activation_bytes;
}

bool exchanges_experts(const Config& c) { return c.model.has_experts() && c.parallel.ep * c.parallel.expert_tp() > 1; }

int expert_ranks_per_node(const Config& c) {
  return std::clamp(c.hardware.gpus_per_node / c.parallel.expert_tp(), 1, c.parallel.ep);
}

namespace {
/// Expected distinct bins hit by `draws` independent, even draws over `bins` bins.
double distinct_bins(double bins, double draws) { return bins * (1 - std::pow(1 - 1 / bins, draws)); }
/// C(n, r) / C(n + d, r): the chance that r picks without replacement from n + d avoid d given ones.
double avoid_chance(int n, int d, int r) {
  double p = 1;
  for (int i = 0; i < r; ++i) p *= double(n - i) / double(n + d - i);
  return std::max(p, 0.0);
}
}  // namespace

double expert_nodes_per_token(const Config& c) {
  const ModelConfig& m = c.model;
  const int ep = c.parallel.ep, in_node = expert_ranks_per_node(c), k = m.moe_router_topk;
  if (ep <= in_node) return 1;
  // A group of ep ranks may end part-way into a node (ep 12 over nodes of 8): its share of them.
  const double unlimited = distinct_bins(double(ep) / in_node, k);
  const int groups = m.moe_router_num_groups, chosen = m.moe_router_group_topk, nodes = ep / in_node;
  if (groups == 0 || ep % in_node != 0) return unlimited;
  // The experts, and so the groups, lie in order over the ranks and nodes.
  if (groups % nodes == 0) {  // groups/nodes whole groups in each node: a node is missed when all
    const int per_node = groups / nodes;  // `chosen` groups come from the other nodes
    return std::min(unlimited, nodes * (1 - avoid_chance(groups - per_node, per_node, chosen)));
  }
  if (nodes % groups == 0) {  // each group spans nodes/groups nodes: the k copies fall in chosen of them
    const double reach = double(chosen) * nodes / groups;
    return std::min(unlimited, distinct_bins(reach, k));
  }
  // Groups straddle node boundaries: each chosen group reaches at most ceil(nodes/groups) + 1 nodes.
  return std::min(unlimited, chosen * (std::ceil(double(nodes) / groups) + 1.0));
}

ExpertTraffic expert_traffic(const Config& c, bool mxfp8_wire) {
  const ModelConfig& m = c.model;
  const int ep = c.parallel.ep, in_node = expert_ranks_per_node(c);
  if (ep <= 1) return {};
  const double nodes = double(ep) / in_node;
  // MXFP8: one byte a value and a one-byte scale for each block of 32.
  const double value_bytes = mxfp8_wire ? 1 + 1.0 / 32 : c.precision.activation_bytes;
  const double copies = expert_exchange_bytes(c) / c.precision.activation_bytes / m.hidden;  // routed copies
  const double copy_bytes = m.hidden * value_bytes;
  if (c.training.moe_token_dispatcher_type == MoeDispatcher::AllToAll)  // each copy to its expert's rank
    return {copies * (in_node - 1) / ep * copy_bytes, copies * (ep - in_node) / ep * copy_bytes};
  // Flex (DeepEP, as DeepSeek-V3's report, section 3.2.2, describes it): a token crosses the network once
  // to each other node it goes to, landing on the GPU of the sender's local index there, and NVLink
  // takes each copy on from there to its expert's GPU unless it already is that GPU.
  const double tokens = copies / m.moe_router_topk;
  const double remote_nodes = expert_nodes_per_token(c) * (nodes - 1) / nodes;
  return {copies * (in_node - 1) / in_node * copy_bytes, tokens * remote_nodes * copy_bytes};
}

double ZeroSharding::bytes_per_param(const PrecisionConfig& p) const {
  const auto part = [&](bool sharded, double bytes) { return sharded ? bytes / dp : bytes; };
  return part(parameters(), p.param_bytes) + part(gradients(), p.grad_bytes) + part(optimizer_states(), p.optimizer_bytes);
}

ZeroSharding zero_sharding(const Config& c) { return {.stage = c.training.zero_stage, .dp = c.parallel.dp}; }

int expert_data_parallel(const ParallelConfig& p) { return std::max(1, p.tp * p.cp * p.dp / (p.ep * p.expert_tp())); }

ZeroSharding expert_zero_sharding(const Config& c) {
  return {.stage = c.training.zero_stage, .dp = expert_data_parallel(c.parallel)};
}

RankParams layers_rank_params(const Config& c, int first, int count) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const int moe = moe_layer_count(m, first, count);
  const LayerParams dense = layer_param_parts(m, LayerKind::Dense), experts = layer_param_parts(m, LayerKind::Moe);
  const double routed = moe * experts.experts / (p.ep * p.expert_tp());
  return {.all = ((count - moe) * dense.total() + moe * experts.tensor_parallel) / p.tp + moe * experts.replicated + routed,
          .experts = routed};
}

double stage_params(const Config& c, const VirtualStage& stage) {
  const ModelConfig& m = c.model;
  double vocab = 0;
  if (stage.has_embedding) vocab += vocab_params(m);
  if (stage.has_head) vocab += vocab_params(m) + 2.0 * m.hidden;
  return layers_rank_params(c, stage.first_layer, stage.layers).all + vocab / c.parallel.tp;
}

double stage_expert_params(const Config& c, const VirtualStage& stage) {
  return layers_rank_params(c, stage.first_layer, stage.layers).experts;
}

double gradient_bucket_params(const Config& c) {
  const TrainingConfig& t = c.training;
  if (!t.overlap_grad_reduce || zero_sharding(c).parameters()) return 0;
  return t.bucket_size > 0 ? double(t.bucket_size) : std::max(40e6, 1e6 * c.parallel.dp);
}

std::vector<double> device_expert_params(const Config& c, const Layout& layout) {
  std::vector<double> params(std::size_t(layout.devices), 0.0);
  for (const VirtualStage& stage : layout.stages) params[std::size_t(stage.device)] += stage_expert_params(c, stage);
  return params;
}

double vocab_shard_params(const Config& c, const Layout& layout) {
  if (layout.vocab == VocabPlacement::OnStages) return 0;
  // Rows of the embedding and of the LM head; tied, one matrix serves both.
  return (c.model.tied_embeddings ? 1.0 : 2.0) * layout.padded_vocab / layout.devices * c.model.hidden / c.parallel.tp;
}

namespace {
bool first_and_last_on(const Layout& layout, int device) {
  return layout.stages.front().device == device && layout.stages.back().device == device;
}
}  // namespace

double tied_copy_params(const Config& c, const Layout& layout, int device) {
  const bool both = layout.stages.front().has_embedding && layout.stages.back().has_head && first_and_last_on(layout, device);
  return c.model.tied_embeddings && both ? vocab_params(c.model) / c.parallel.tp : 0;
}

double tied_apart_params(const Config& c, const Layout& layout) {
  const bool apart = c.model.tied_embeddings && layout.vocab == VocabPlacement::OnStages &&
                     layout.stages.front().device != layout.stages.back().device;
  return apart ? vocab_params(c.model) / c.parallel.tp : 0;
}

std::vector<double> device_params(const Config& c, const Layout& layout) {
  std::vector<double> params(std::size_t(layout.devices), vocab_shard_params(c, layout));
  for (const VirtualStage& stage : layout.stages) params[std::size_t(stage.device)] += stage_params(c, stage);
  return params;
}

double updated_params(const Config& c, const Layout& layout, int device) {
  const auto d = std::size_t(device);
  const double experts = device_expert_params(c, layout)[d];
  const double params = device_params(c, layout)[d] - tied_copy_params(c, layout, device) - experts;
  const ZeroSharding zero = zero_sharding(c), expert_zero = expert_zero_sharding(c);
  return (zero.optimizer_states() ? params / zero.dp : params) +
         (expert_zero.optimizer_states() ? experts / expert_zero.dp : experts);
}

double device_layer_params(const Config& c, const Layout& layout, int device) {
  double params = 0;
  for (const VirtualStage& stage : layout.stages)
    if (stage.device == device) params += layers_rank_params(c, stage.first_layer, stage.layers).all;
  return params;
}

namespace {

/// What ZeRO-3 holds gathered at once, per device, one unit of it (it holds two: the one in use and
/// the next, prefetched): at pp 1 FSDP's unit, as PyTorch FSDP wraps a model in torchtitan and LLM
/// Foundry (a decoder block, the embedding, the LM head; a device's vocabulary shards are one more);
/// under a pipeline a virtual stage.
std::vector<double> largest_gathered_unit(const Config& c, const Layout& layout) {
  const bool fsdp_units = c.parallel.pp == 1;
  std::vector<double> largest(std::size_t(layout.devices), fsdp_units ? vocab_shard_params(c, layout) : 0.0);
  for (const VirtualStage& stage : layout.stages) {
    double unit;
    if (!fsdp_units) {
      unit = stage_params(c, stage);
    } else {
      unit = stage.has_embedding || stage.has_head ? vocab_params(c.model) / c.parallel.tp : 0;
      for (int l = stage.first_layer; l < stage.first_layer + stage.layers; ++l)
        unit = std::max(unit, layers_rank_params(c, l, 1).all);
    }
    double& on_device = largest[std::size_t(stage.device)];
    on_device = std::max(on_device, unit);
  }
  return largest;
}

}  // namespace

std::vector<Bytes> static_memory_bytes(const Config& c, const Layout& layout) {
  const auto devices = static_cast<std::size_t>(layout.devices);
  std::vector<double> params = device_params(c, layout);
  const std::vector<double> experts = device_expert_params(c, layout);
  const ZeroSharding zero = zero_sharding(c), expert_zero = expert_zero_sharding(c);
  const std::vector<double> gathered = zero.parameters() ? largest_gathered_unit(c, layout) : std::vector<double>();
  std::vector<Bytes> bytes;
  for (std::size_t d = 0; d < devices; ++d) {
    params[d] -= tied_copy_params(c, layout, int(d)) + experts[d];
    double held = params[d] * zero.bytes_per_param(c.precision) + experts[d] * expert_zero.bytes_per_param(c.precision);
    // DeepSpeed's accumulation keeps each backward's gradients in the parameters' type until the next one.
    if (c.training.grad_accumulation == GradAccumulation::DeepSpeed) held += (params[d] + experts[d]) * c.precision.param_bytes;
    if (zero.parameters()) held += 2 * gathered[d] * c.precision.param_bytes;
    if (c.precision.fp8 != Fp8Format::None) held += 2 * device_layer_params(c, layout, int(d));
    bytes.push_back(static_cast<Bytes>(std::llround(held)));
  }
  return bytes;
}

ActivationsKept activations_kept(const Config& c, int first, int layers) {
  // A stage's layers keep the sum of theirs; recomputation rebuilds at most its largest, MoE's if any.
  const int moe = moe_layer_count(c.model, first, layers);
  const auto sum = [&](const Config& of) {
    return (layers - moe) * layer_activation_bytes(of) + moe * layer_activation_bytes(of, LayerKind::Moe);
  };
  const double layer = moe > 0 ? layer_activation_bytes(c, LayerKind::Moe) : layer_activation_bytes(c);
  const double input = hidden_activation_bytes(c);
  ActivationsKept kept{sum(c), 0, sum(c)};
  const TrainingConfig& t = c.training;
  if (t.recompute_granularity == Recompute::Selective || t.recompute_granularity == Recompute::SelectiveOp) {
    Config all = c;
    all.training.recompute_granularity = Recompute::None;
    kept.without_recompute = sum(all);
    // Each layer's backward rebuilds what it did not keep: the scores, or what per-op checkpointing reran.
    const double rebuilt = t.recompute_granularity == Recompute::Selective ? layer_score_bytes(c)
                                                                           : layer_activation_bytes(all) - layer;
    kept.rebuilt = layers > 0 ? rebuilt : 0;
  } else if (const int recomputed = recomputed_layers(t, layers); recomputed > 0) {
    if (t.recompute_method == RecomputeMethod::Uniform) {
      const int group = std::min(t.recompute_num_layers, layers);
      kept.from_forward = double((layers + group - 1) / group) * input;
      kept.rebuilt = group * layer;
    } else {
      // Block: the first `recomputed` layers keep their input; the rest keep everything.
      const int kept_moe = moe_layer_count(c.model, first + recomputed, layers - recomputed);
      kept.from_forward = recomputed * input + (layers - recomputed - kept_moe) * layer_activation_bytes(c) +
                          kept_moe * layer_activation_bytes(c, LayerKind::Moe);
      kept.rebuilt = layer;
    }
  }
  return kept;
}

Bytes memory_capacity_bytes(const HardwareConfig& h) {
  return static_cast<Bytes>(std::max(0.0, h.memory_gib - h.reserved_gib) * double(1ull << 30));
}

Bytes host_memory_bytes() { return Bytes(sysconf(_SC_PHYS_PAGES)) * Bytes(sysconf(_SC_PAGE_SIZE)); }

}  // namespace pipesim
