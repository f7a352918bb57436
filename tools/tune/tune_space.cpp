// What `tune` searches: the candidates, in the order that breaks ties, and how each differs from
// the config.
#include <fmt/format.h>

#include <climits>
#include <cstdint>

#include "cost_model.h"
#include "plan.h"
#include "sizes.h"
#include "tune.h"

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

/// (pp, tp, dp) with pp × tp × dp = gpus, tp dividing the heads and staying inside a node (the
/// config's own tp is always tried), pp at most the layers; and for each, every microbatch count m
/// that splits dp's share of the global batch (microbatches × micro_batch_size × dp, in sequences)
/// into microbatches of a whole number of sequences, smallest micro_batch_size first. Explicit costs
/// are times of the config's pp, tp and micro-batch, which they do not scale with: those stay fixed.
std::vector<Shape> shapes(const Config& config, int gpus) {
  const ParallelConfig& given = config.parallel;
  const int given_batch = config.model.micro_batch_size;
  const std::int64_t global = std::int64_t(given.microbatches) * given_batch * given.dp;
  const bool fixed = config.costs.has_value();
  std::vector<Shape> out;
  for (int tp : divisors(config.model.heads)) {
    if ((tp > config.hardware.gpus_per_node && tp != given.tp) || gpus % tp != 0 || (fixed && tp != given.tp)) continue;
    for (int dp : divisors(gpus / tp)) {
      const int pp = gpus / tp / dp;
      if (global % dp != 0 || global / dp > INT_MAX || pp > config.model.layers || pp > limits::kPp ||
          (fixed && pp != given.pp))
        continue;
      const auto sequences = int(global / dp);  // per replica
      for (int micro_batch_size : divisors(sequences)) {
        if (fixed && micro_batch_size != given_batch) continue;
        const int m = sequences / micro_batch_size;
        const std::int64_t tokens = std::int64_t(micro_batch_size) * config.model.seq_len;
        if (m > limits::kMicrobatches || tokens > limits::kTokensPerMicrobatch) continue;
        out.push_back({{.pp = pp, .tp = tp, .dp = dp, .microbatches = m, .chunks = 1}, micro_batch_size});
      }
    }
  }
  return out;
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
};

/// `redistribute`'s splits: the config's own (when it has one for this many stages), auto, and auto
/// with one layer moved off its slowest stage onto each neighbour (the stage costs are the ones auto
/// balances, so the simulator decides whether the move pays: it can, through memory and bubbles).
std::vector<Split> layer_splits(const Config& config, const Config& candidate, int stages) {
  const std::vector<int>& given = config.schedule.layers_per_stage;
  const StageWeights w = stage_weights(candidate);
  const std::vector<int> balanced = balanced_split(config.model.layers, stages, w);
  std::vector<Split> out;
  if (int(given.size()) == stages) out.push_back({given, ""});
  if (given != balanced) out.push_back({{}, given.empty() ? "" : "split auto"});
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
    if (moved != given) out.push_back({moved, fmt::format("1 layer s{}→s{}", slowest, neighbour)});
  }
  return out;
}

}  // namespace

std::vector<Candidate> tune_space(const Config& config, int gpus) {
  std::vector<Candidate> space;
  for (const Shape& shape : shapes(config, gpus))
    for (const ScheduleInfo& schedule : schedules())
      for (int chunks : chunk_counts(schedule, config, shape.parallel.pp))
        for (const std::string& vocab : vocab_mode_names()) {
          Candidate c{shape.parallel, shape.micro_batch_size, schedule.name, vocab, {}, ""};
          c.parallel.chunks = chunks;
          if (vocab != "redistribute") {
            space.push_back(std::move(c));
            continue;
          }
          for (Split& split : layer_splits(config, apply_candidate(config, c), shape.parallel.pp * chunks)) {
            c.layers_per_stage = std::move(split.layers);
            c.split_change = std::move(split.change);
            space.push_back(c);
          }
        }
  return space;
}

Config apply_candidate(const Config& config, const Candidate& candidate) {
  Config c = config;
  c.parallel = candidate.parallel;
  c.model.micro_batch_size = candidate.micro_batch_size;
  c.schedule.name = candidate.schedule;
  c.schedule.vocab = candidate.vocab;
  c.schedule.layers_per_stage = candidate.layers_per_stage;
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
  number("m", from.microbatches, to.microbatches);
  number("mbs", config.model.micro_batch_size, candidate.micro_batch_size);
  // Other schedules run a fixed chunk count, whatever parallel.chunks says.
  if (const ScheduleInfo* s = find_schedule(candidate.schedule); s && s->chunks == 0)
    number("chunks", from.chunks, to.chunks);
  if (candidate.schedule != config.schedule.name) parts.push_back("schedule " + candidate.schedule);
  if (candidate.vocab != config.schedule.vocab) parts.push_back("vocab " + candidate.vocab);
  if (!candidate.split_change.empty()) parts.push_back(candidate.split_change);
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace pipesim
