// What `tune` searches: the candidates, in the order that breaks ties, and how each differs from
// the config.
#include <fmt/format.h>

#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "cost_model.h"
#include "parallel_shape.h"
#include "plan.h"
#include "sizes.h"
#include "tune.h"
#include "worker_pool.h"

namespace pipesim {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> small, large;
  for (int d = 1; std::int64_t(d) * d <= n; ++d)
    if (n % d == 0) {
      small.push_back(d);
      if (d != n / d) large.insert(large.begin(), n / d);
    }
  small.insert(small.end(), large.begin(), large.end());
  return small;
}

/// A candidate's shape: pp, tp, dp and how each replica's share of the global batch splits into
/// microbatches.
struct Shape {
  ParallelConfig parallel;
  int micro_batch_size;
};

/// The config's value first, then the others it may take, once each.
template <typename T>
std::vector<T> with_first(T own, std::vector<T> options) {
  std::erase(options, own);
  options.insert(options.begin(), own);
  return options;
}

/// Context-parallel sizes: the config's, 1, and every divisor of the GPUs that leaves each rank at
/// least kContextTokens of the sequence (and s divisible by 2·cp, as the load-balanced split needs).
/// Shorter shares are not tried: their K/V ring exchange outlasts the attention that should hide it,
/// and the activations are small already (docs/tune.md).
constexpr int kContextTokens = 4096;
std::vector<int> context_sizes(const Config& config, int gpus) {
  std::vector<int> sizes;
  if (config.costs) return {config.parallel.cp};  // explicit costs are times at the config's cp
  const int s = config.model.seq_len;
  for (int cp : divisors(gpus))
    if (cp == 1 || (s % (2 * cp) == 0 && s / cp >= kContextTokens)) sizes.push_back(cp);
  return with_first(config.parallel.cp, sizes);
}

/// Expert parallelism for a shape (a dense model's stays as it is): every ep dividing the experts and
/// every etp among the config's (tp when it gives none), the shape's tp and 1, whose expert groups fit
/// the stage's tp·cp·dp ranks (Megatron-Core's rule) and whose etp divides an expert's width. The
/// config's own first; etp as the config gives it (0: follow tp) where it is the config's.
std::vector<std::pair<int, int>> expert_layouts(const Config& config, const ParallelConfig& shape) {
  if (!config.model.has_experts()) return {{shape.ep, shape.etp}};
  const int ranks = shape.tp * shape.cp * shape.dp;
  const int own = config.parallel.etp > 0 ? config.parallel.etp : shape.tp;
  std::vector<std::pair<int, int>> out;
  for (const int ep : with_first(config.parallel.ep, divisors(config.model.num_experts)))
    for (const int etp : with_first(own, std::vector{shape.tp, 1}))
      if (ranks % (ep * etp) == 0 && config.model.expert_ffn_hidden() % etp == 0)
        out.push_back({ep, etp == own ? config.parallel.etp : etp});
  return out;
}

/// (pp, tp, dp, cp) with pp × tp × dp × cp = gpus, tp dividing the heads and staying inside a node
/// (the config's own tp is always tried), pp at most the layers; sequence parallelism on and off
/// where tp > 1; and for each, every microbatch count m that splits dp's share of the global batch
/// (global_batch_size, in sequences) into microbatches of a whole number of sequences, smallest
/// micro_batch_size first: microbatches_for, the formula training.global_batch_size goes through. Explicit costs are times of the config's pp, tp, cp and
/// micro-batch, which they do not scale with: those stay fixed.
std::vector<Shape> shapes(const Config& config, int gpus) {
  const ParallelConfig& given = config.parallel;
  const int given_batch = config.model.micro_batch_size;
  const std::int64_t global = global_batch_size(config);
  const bool fixed = config.costs.has_value();
  std::vector<Shape> out;
  for (int cp : context_sizes(config, gpus)) {
    if (gpus % cp != 0) continue;
    const int replicas = gpus / cp;
    for (int tp : divisors(config.model.heads)) {
      if ((tp > config.hardware.gpus_per_node && tp != given.tp) || replicas % tp != 0 || (fixed && tp != given.tp))
        continue;
      // Sequence parallelism changes nothing at tp 1: the config's setting stays.
      const std::vector<bool> sequence_parallel =
          tp > 1 && !fixed ? with_first(given.sequence_parallel, std::vector{true, false})
                           : std::vector{given.sequence_parallel};
      for (int dp : divisors(replicas / tp)) {
        const int pp = replicas / tp / dp;
        if (global % dp != 0 || global / dp > INT_MAX || pp > config.model.layers || pp > limits::kPp ||
            (fixed && pp != given.pp))
          continue;
        const auto sequences = int(global / dp);  // per replica
        for (int micro_batch_size : divisors(sequences)) {
          if (fixed && micro_batch_size != given_batch) continue;
          const int m = *microbatches_for(global, micro_batch_size, dp);  // a divisor of the share: it splits
          const std::int64_t tokens = std::int64_t(micro_batch_size) * config.model.seq_len;
          if (m > limits::kMicrobatches || tokens > limits::kTokensPerMicrobatch) continue;
          for (const bool sp : sequence_parallel) {
            if (config.model.has_experts() && tp > 1 && !sp) continue;  // Megatron-Core's rule (check_config)
            ParallelConfig parallel = given;
            parallel.pp = pp, parallel.tp = tp, parallel.dp = dp, parallel.cp = cp, parallel.microbatches = m;
            parallel.chunks = 1, parallel.sequence_parallel = sp;
            for (const auto& [ep, etp] : expert_layouts(config, parallel)) {
              parallel.ep = ep, parallel.etp = etp;
              out.push_back({parallel, micro_batch_size});
            }
          }
        }
      }
    }
  }
  return out;
}

/// One recomputation setting: Megatron-LM's granularity, method and layer count.
struct RecomputeChoice {
  Recompute granularity = Recompute::None;
  RecomputeMethod method = RecomputeMethod::Uniform;
  int layers = 1;
  bool operator==(const RecomputeChoice&) const = default;
};

/// The config's recomputation, none, full (uniform, one layer a group), full of half of each virtual
/// stage's layers (block), and, without flash attention, selective (with it, selective is none).
/// A costs block refuses recomputation: it keeps the config's.
std::vector<RecomputeChoice> recompute_choices(const Config& config, int stages) {
  const TrainingConfig& t = config.training;
  const RecomputeChoice own = t.recompute_granularity == Recompute::Full
                                  ? RecomputeChoice{Recompute::Full, t.recompute_method, t.recompute_num_layers}
                                  : RecomputeChoice{t.recompute_granularity, RecomputeMethod::Uniform, 1};
  if (config.costs) return {own};
  std::vector<RecomputeChoice> choices{{Recompute::None, RecomputeMethod::Uniform, 1},
                                       {Recompute::Full, RecomputeMethod::Uniform, 1}};
  if (const int half = config.model.layers / stages / 2; half >= 1)
    choices.push_back({Recompute::Full, RecomputeMethod::Block, half});
  if (!config.precision.flash_attention) choices.push_back({Recompute::Selective, RecomputeMethod::Uniform, 1});
  return with_first(own, choices);
}

/// The chunk counts a schedule runs at `pp`: its fixed count, or for a schedule that takes
/// parallel.chunks, every v >= 2 that divides the layers evenly over pp × v stages (as Megatron
/// requires) and the config's own.
std::vector<int> chunk_counts(const ScheduleInfo& schedule, const Config& config, int pp) {
  const int layers = config.model.layers;
  if (schedule.chunks > 0) return pp * schedule.chunks <= layers ? std::vector{schedule.chunks} : std::vector<int>{};
  std::vector<int> counts;
  for (int v = 2; pp * v <= layers; ++v)
    if (layers % (pp * v) == 0 || v == config.parallel.chunks) counts.push_back(v);
  return counts;
}

struct Split {
  std::vector<int> layers;  ///< empty: auto
  std::string change;
  std::vector<int> auto_split;  ///< with auto: the split it comes to
};

/// The balanced split of every stage count and weights the search asks for. balanced_split sorts every
/// (stage, layer count) limit, about a second at 4096 layers and 4096 stages, and a search asks for the
/// same few thousands of times (the weights depend on tp and the micro-batch only, and stage counts
/// repeat over pp × chunks): each is balanced once, all of them on the worker pool.
class BalancedSplits {
 public:
  using Key = std::tuple<int, double, double, double>;  ///< stages, then StageWeights' fields
  static Key key(int stages, const StageWeights& w) { return {stages, w.layer, w.embedding, w.head}; }

  BalancedSplits(int layers, std::set<Key> wanted) {
    std::vector<Key> keys(wanted.begin(), wanted.end());
    std::vector<std::vector<int>> splits(keys.size());
    parallel_for(keys.size(), [&](std::size_t i) {
      const auto& [stages, layer, embedding, head] = keys[i];
      splits[i] = balanced_split(layers, stages, {layer, embedding, head});
    });
    for (std::size_t i = 0; i < keys.size(); ++i) splits_.emplace(keys[i], std::move(splits[i]));
  }
  const std::vector<int>& get(int stages, const StageWeights& w) const { return splits_.at(key(stages, w)); }

 private:
  std::map<Key, std::vector<int>> splits_;
};

/// `redistribute`'s splits: the config's own (when it has one count per device or per virtual stage of
/// the candidate's), auto, and auto with one layer moved off its slowest stage onto each neighbour (the
/// stage costs are the ones auto balances, so the simulator decides whether the move pays: it can,
/// through memory and bubbles).
std::vector<Split> layer_splits(const Config& config, const Config& candidate, Placement placement,
                                const BalancedSplits& splits) {
  const int stages = candidate.parallel.pp * candidate.parallel.chunks;
  const std::vector<int> given =
      split_per_stage(config.schedule.layers_per_stage, candidate.parallel.pp, candidate.parallel.chunks, placement)
          .value_or(std::vector<int>{});
  const StageWeights w = stage_weights(candidate);
  const std::vector<int>& balanced = splits.get(stages, w);
  std::vector<Split> out;
  if (!given.empty()) out.push_back({given, "", {}});
  if (given != balanced) out.push_back({{}, config.schedule.layers_per_stage.empty() ? "" : "split auto", balanced});
  const auto cost = [&](int s) {
    return balanced[std::size_t(s)] * w.layer + (s == 0 ? w.embedding : 0) + (s == stages - 1 ? w.head : 0);
  };
  int slowest = 0;
  for (int s = 1; s < stages; ++s)
    if (cost(s) > cost(slowest)) slowest = s;
  if (balanced[std::size_t(slowest)] < 2) return out;  // every stage keeps a layer
  for (int neighbour : {slowest - 1, slowest + 1}) {
    if (neighbour < 0 || neighbour >= stages) continue;
    std::vector<int> moved = balanced;
    --moved[std::size_t(slowest)];
    ++moved[std::size_t(neighbour)];
    if (moved != given) out.push_back({moved, fmt::format("1 layer s{}→s{}", slowest, neighbour), {}});
  }
  return out;
}

}  // namespace

std::vector<Candidate> tune_space(const Config& config, int gpus) {
  // Every shape, schedule, chunk count, recomputation and FP8 choice (which changes a layer's cost, and so the
  // balanced split), then the candidates of each: one per vocabulary mode, and redistribute's splits,
  // balanced first for all of them at once; then each at every ZeRO stage (with replicas to shard
  // over). The config's own settings first.
  // FP8 on and off where the GPU has it (the config's format, or Megatron-LM's usual hybrid): it
  // changes a layer's cost against the vocabulary layers', and so the balanced split.
  const Fp8Format fp8_on = config.precision.fp8 != Fp8Format::None ? config.precision.fp8 : Fp8Format::Hybrid;
  const std::vector<Fp8Format> fp8s = config.hardware.peak_fp8_tflops > 0
                                          ? with_first(config.precision.fp8, std::vector{Fp8Format::None, fp8_on})
                                          : std::vector{config.precision.fp8};
  std::vector<Candidate> groups;
  std::set<BalancedSplits::Key> wanted;
  for (const Shape& shape : shapes(config, gpus))
    for (const ScheduleInfo& schedule : schedules())
      for (int chunks : chunk_counts(schedule, config, shape.parallel.pp))
        for (const RecomputeChoice& recompute : recompute_choices(config, shape.parallel.pp * chunks))
          for (const Fp8Format fp8 : fp8s) {
            Candidate c{shape.parallel, shape.micro_batch_size, schedule.name, VocabMode::Redistribute, {}, "", {},
                        recompute.granularity, recompute.method, recompute.layers, config.training.zero_stage, fp8};
            c.parallel.chunks = chunks;
            wanted.insert(BalancedSplits::key(shape.parallel.pp * chunks, stage_weights(apply_candidate(config, c))));
            groups.push_back(std::move(c));
          }
  const BalancedSplits balanced(config.model.layers, std::move(wanted));
  std::vector<Candidate> layouts;
  for (const Candidate& group : groups)
    for (const VocabModeInfo& vocab : vocab_modes()) {
      Candidate c = group;
      c.vocab = vocab.mode;
      if (vocab.mode != VocabMode::Redistribute) {
        layouts.push_back(std::move(c));
        continue;
      }
      const Placement placement = find_schedule(c.schedule)->placement;
      for (Split& split : layer_splits(config, apply_candidate(config, c), placement, balanced)) {
        c.layers_per_stage = std::move(split.layers);
        c.auto_split = std::move(split.auto_split);
        c.split_change = std::move(split.change);
        layouts.push_back(c);
      }
    }
  std::vector<Candidate> space;
  for (const Candidate& layout : layouts)
    for (const int zero : layout.parallel.dp > 1 ? with_first(config.training.zero_stage, std::vector{0, 1, 3})
                                                 : std::vector{config.training.zero_stage}) {
      Candidate c = layout;
      c.zero_stage = zero;
      space.push_back(std::move(c));
    }
  return space;
}

Config apply_candidate(const Config& config, const Candidate& candidate) {
  Config c = config;
  c.parallel = candidate.parallel;
  c.model.micro_batch_size = candidate.micro_batch_size;
  c.schedule.name = candidate.schedule;
  c.schedule.vocab = candidate.vocab;
  c.schedule.layers_per_stage = candidate.layers_per_stage.empty() ? candidate.auto_split : candidate.layers_per_stage;
  c.training.recompute_granularity = candidate.recompute;
  if (candidate.recompute == Recompute::Full)
    c.training.recompute_method = candidate.recompute_method, c.training.recompute_num_layers = candidate.recompute_num_layers;
  c.training.zero_stage = candidate.zero_stage;
  c.precision.fp8 = candidate.fp8;
  // Gathering ahead needs a sharded optimizer: on a candidate without one, nothing is gathered.
  if (candidate.zero_stage == 0) c.training.overlap_param_gather = false;
  if (candidate.parallel.tp == 1) c.training.tp_comm_overlap = false;  // nothing to overlap
  return c;
}

std::string describe_changes(const Config& config, const Candidate& candidate) {
  const ParallelConfig &from = config.parallel, &to = candidate.parallel;
  std::vector<std::string> parts;
  const auto number = [&](const char* name, int before, int after) {
    if (before != after) parts.push_back(fmt::format("{} {}→{}", name, before, after));
  };
  number("pp", from.pp, to.pp);
  number("tp", from.tp, to.tp);
  number("dp", from.dp, to.dp);
  number("cp", from.cp, to.cp);
  if (config.model.has_experts()) {  // a dense model has no experts to place: etp follows tp unseen
    number("ep", from.ep, to.ep);
    number("etp", from.expert_tp(), to.expert_tp());
  }
  if (from.sequence_parallel != to.sequence_parallel) parts.push_back(to.sequence_parallel ? "sp on" : "sp off");
  number("m", from.microbatches, to.microbatches);
  number("mbs", config.model.micro_batch_size, candidate.micro_batch_size);
  // Other schedules run a fixed chunk count, whatever parallel.chunks says.
  if (const ScheduleInfo* s = find_schedule(candidate.schedule); s && s->chunks == 0)
    number("chunks", from.chunks, to.chunks);
  if (candidate.schedule != config.schedule.name) {
    const std::optional<ActivationLimit> limit = automatic_limit(candidate.schedule, config.schedule.memory_limit);
    parts.push_back("schedule " + candidate.schedule +
                    (limit ? fmt::format(" (memory limit {})", activation_limit_text(*limit)) : std::string()));
  }
  if (candidate.vocab != config.schedule.vocab) parts.push_back(fmt::format("vocab {}", vocab_mode_name(candidate.vocab)));
  if (!candidate.split_change.empty()) parts.push_back(candidate.split_change);
  if (const std::string recompute = recompute_text(apply_candidate(config, candidate).training);
      recompute != recompute_text(config.training))
    parts.push_back("recompute " + recompute);
  number("zero", config.training.zero_stage, candidate.zero_stage);
  if (candidate.fp8 != config.precision.fp8) parts.push_back(fmt::format("fp8 {}", fp8_format_name(candidate.fp8)));
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace pipesim
