#pragma once
/// What the runtime executes: a task graph, where its stages sit, and the model whose math its ops
/// do (the runtime's ModelShape, base/model_shape.h). The runtime needs nothing else of a plan, so it
/// depends on the IR alone (src/), never on the planner, the schedules or the simulator that made the
/// graph; tools/jobs makes a Job from a plan (job_of).
#include <algorithm>
#include <vector>

#include "backend.h"
#include "model_shape.h"
#include "layout.h"
#include "parallel_shape.h"
#include "task_graph.h"

namespace pipesim::runtime {

/// Where one rank of a run sits, in Megatron's order: tensor-parallel ranks adjacent, then the
/// data-parallel replicas, then the pipeline devices (rank = (device·dp + replica)·tp + tp_rank).
struct RankPlace {
  int device = 0;   ///< pipeline device: the graph's device whose ops the rank runs
  int replica = 0;  ///< data-parallel replica of the whole pipeline
  int tp_rank = 0;  ///< tensor-parallel rank inside the device's stages
};

/// Borrowed from the caller, which keeps the graph and the layout alive for the whole run.
struct Job {
  const TaskGraph& graph;
  const Layout& layout;
  ModelShape shape;
  int microbatches = 1;  ///< per iteration and replica: the loss is the mean over all of their tokens
  /// Its recompute_* fields, which put R ops in the graph: which layers' activations F drops, keeping
  /// only the inputs that R rebuilds them from; its zero_stage, which shards the optimizer's state.
  TrainingConfig training;
  int tp = 1;  ///< tensor-parallel ranks per pipeline device
  bool sequence_parallel = false;  ///< with tp > 1: layers' inputs and outputs split by tokens over the tp ranks
  int dp = 1;  ///< data-parallel replicas of the pipeline, each its own microbatches
  /// Expert-parallel ranks: Megatron-Core carves its expert grid out of the tp·dp ranks of a stage
  /// (cp = 1 here), enumerated tensor-parallel rank innermost (i = replica·tp + tp_rank): expert-
  /// tensor-parallel rank innermost (i mod etp), then the expert-parallel rank (i / etp mod ep), then
  /// the expert data-parallel index. The etp ranks of one expert rank split each of its experts'
  /// maps (column-parallel fc1, row-parallel fc2); the ep ranks of one etp rank split each MoE layer's
  /// routed experts, rank ep_rank holding the ep_rank-th share; the ranks that hold the same slice of
  /// the same experts (i mod ep·etp alike) are the expert data-parallel group, which sums their
  /// gradients. ep·etp divides tp·dp; the runtime also needs etp = 1 or tp, and at etp = 1 ep to
  /// divide tp or tp to divide ep (check_experts_runnable).
  int ep = 1;
  int etp = 1;  ///< expert-tensor-parallel ranks: 1 or tp (the tensor-parallel group then splits the experts)

  int ranks() const { return layout.devices * tp * dp; }
  RankPlace place(int rank) const { return {.device = rank / (tp * dp), .replica = rank / tp % dp, .tp_rank = rank % tp}; }
  int rank_of(const RankPlace& p) const { return (p.device * dp + p.replica) * tp + p.tp_rank; }
  /// What ZeRO shards over the replicas (parallel_shape.h).
  ZeroSharding zero() const { return {.stage = training.zero_stage, .dp = dp}; }
  /// Whether the optimizer's state is sharded over the replicas (ZeRO 1 to 3).
  bool sharded() const { return zero().any(); }
  /// What the optimizer of a rank at `p` updates of each tensor: its replica's block when sharded,
  /// all of it otherwise.
  OwnedPart owned_part(const RankPlace& p) const {
    return sharded() ? OwnedPart{.index = p.replica, .count = dp} : OwnedPart{};
  }
  /// How many distinct slices of the routed experts a stage holds: each of ep shares, split etp ways.
  int expert_slices() const { return ep * etp; }
  /// How many replicas hold distinct expert slices: expert_slices() / tp when they reach past a
  /// replica's tensor-parallel ranks, else 1 (a replica's tensor-parallel ranks hold them all).
  int expert_replicas() const { return std::max(1, expert_slices() / tp); }
  /// Of the routed experts' maps, under ZeRO: its block among the replicas that hold the same slice
  /// (Megatron-Core's expert_zero_sharding over the expert data-parallel group), all of them
  /// otherwise. Within one replica the expert data-parallel group's tensor-parallel ranks sum their
  /// gradients first (cpu::sum_partial_gradients): ZeRO shards over the replicas only. At ep = 1,
  /// owned_part's.
  OwnedPart expert_owned_part(const RankPlace& p) const {
    const int replicas = expert_replicas();
    return sharded() ? OwnedPart{.index = p.replica / replicas, .count = dp / replicas} : OwnedPart{};
  }
  /// Which share of each MoE layer's routed experts a rank at `p` holds.
  int expert_rank(const RankPlace& p) const { return (p.replica * tp + p.tp_rank) / etp % ep; }
  /// Which slice of each of those experts it holds.
  int expert_tp_rank(const RankPlace& p) const { return (p.replica * tp + p.tp_rank) % etp; }
  /// The groups of the expert grid: the ranks that split the routed experts (expert-parallel), that
  /// split each expert (expert-tensor-parallel), that hold the same slice (expert data-parallel).
  enum class ExpertGroup { Parallel, TensorParallel, DataParallel };
  /// The ranks of `rank`'s group `which` in Megatron-Core's order: expert-parallel, ep ranks etp
  /// apart; expert-tensor-parallel, etp consecutive ranks; expert data-parallel, the stage's ranks
  /// of its slice, ep·etp apart.
  std::vector<int> expert_group_of(int rank, ExpertGroup which) const {
    const RankPlace p = place(rank);
    const int i = p.replica * tp + p.tp_rank, slices = expert_slices();
    int first = 0, step = 1, count = 1;
    switch (which) {
      case ExpertGroup::Parallel: first = i / slices * slices + i % etp, step = etp, count = ep; break;
      case ExpertGroup::TensorParallel: first = i / etp * etp, step = 1, count = etp; break;
      case ExpertGroup::DataParallel: first = i % slices, step = slices, count = tp * dp / slices; break;
    }
    std::vector<int> ranks;
    for (int k = 0; k < count; ++k) {
      const int at = first + k * step;
      ranks.push_back(rank_of({.device = p.device, .replica = at / tp, .tp_rank = at % tp}));
    }
    return ranks;
  }
  /// The ranks that differ from `rank` in `varying` only, in its order: &RankPlace::device gives the
  /// rank's pipeline, ::replica its data-parallel group, ::tp_rank its tensor-parallel group.
  std::vector<int> group_of(int rank, int RankPlace::*varying) const {
    const int size = varying == &RankPlace::device ? layout.devices : varying == &RankPlace::replica ? dp : tp;
    std::vector<int> ranks;
    RankPlace p = place(rank);
    for (p.*varying = 0; p.*varying < size; ++(p.*varying)) ranks.push_back(rank_of(p));
    return ranks;
  }
};

}  // namespace pipesim::runtime
