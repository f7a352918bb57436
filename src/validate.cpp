#include "validate.h"

#include <fmt/format.h>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/depth_first_search.hpp>
#include <array>
#include <span>
#include <vector>

namespace pipesim {
namespace {

/// With vocabulary passes, every device runs one S and one T (S first), and one IF and one IB
/// (IF first), for every microbatch.
Status check_vocab_passes(const TaskGraph& graph, int microbatches) {
  bool output = false, input = false;
  for (const Task& t : graph.tasks()) output |= t.kind == OpKind::S, input |= t.kind == OpKind::IF;
  const std::array<std::pair<OpKind, OpKind>, 2> pairs = {{{OpKind::S, OpKind::T}, {OpKind::IF, OpKind::IB}}};
  for (int d = 0; d < graph.devices(); ++d)
    for (const auto& [first, second] : pairs) {
      if (!(first == OpKind::S ? output : input)) continue;
      std::vector<std::int64_t> seen_first(std::size_t(microbatches), -1), seen_second(std::size_t(microbatches), -1);
      const auto order = graph.stream_order(d, Stream::Compute);
      for (std::size_t i = 0; i < order.size(); ++i) {
        const Task& t = graph.task(order[i]);
        if (t.kind != first && t.kind != second) continue;
        auto& seen = (t.kind == first ? seen_first : seen_second)[std::size_t(t.microbatch)];
        if (seen >= 0) return Error{fmt::format("{} appears twice", graph.describe(order[i]))};
        seen = std::int64_t(i);
      }
      for (int m = 0; m < microbatches; ++m) {
        const auto f = seen_first[std::size_t(m)], s = seen_second[std::size_t(m)];
        if (f < 0 || s < 0)
          return Error{fmt::format("device {} misses {}(m{})", d, op_kind_name(f < 0 ? first : second), m)};
        if (s < f)
          return Error{fmt::format("{}(d{},m{}) comes before {}(d{},m{}) in program order", op_kind_name(second), d, m,
                                   op_kind_name(first), d, m)};
      }
    }
  return Status::Ok();
}

Status check_ops(const TaskGraph& graph, const Layout& layout, int microbatches) {
  const int stages = layout.stage_count();
  const bool split_weight = graph.has(OpKind::W);
  // position of F/B/W of (stage, microbatch) in its device's compute stream; -1 = absent
  std::vector<std::array<std::int64_t, 3>> position(static_cast<std::size_t>(stages) * microbatches, {-1, -1, -1});
  std::vector<int> optimizers(static_cast<std::size_t>(graph.devices()), 0);
  for (int d = 0; d < graph.devices(); ++d) {
    const auto order = graph.stream_order(d, Stream::Compute);
    for (std::size_t i = 0; i < order.size(); ++i) {
      const Task& t = graph.task(order[i]);
      if (t.kind == OpKind::Optimizer) ++optimizers[static_cast<std::size_t>(d)];
      const int slot = pass_index(t.kind);
      if (slot < 0) continue;
      if (t.stage < 0 || t.stage >= stages || t.microbatch < 0 || t.microbatch >= microbatches)
        return Error{fmt::format("{} is outside {} stages x {} microbatches", graph.describe(order[i]), stages, microbatches)};
      if (layout.stages[static_cast<std::size_t>(t.stage)].device != d)
        return Error{fmt::format("{} runs on device {} but stage {} lives on device {}", graph.describe(order[i]), d,
                                 t.stage, layout.stages[static_cast<std::size_t>(t.stage)].device)};
      auto& pos = position[static_cast<std::size_t>(t.stage) * microbatches + t.microbatch][static_cast<std::size_t>(slot)];
      if (pos >= 0) return Error{fmt::format("{} appears twice", graph.describe(order[i]))};
      pos = static_cast<std::int64_t>(i);
    }
  }
  for (int s = 0; s < stages; ++s)
    for (int m = 0; m < microbatches; ++m) {
      const auto& [f, b, w] = position[static_cast<std::size_t>(s) * microbatches + m];
      if (f >= 0 && b >= f && (!split_weight || w >= b)) continue;
      const std::string op = fmt::format("(s{},m{})", s, m);
      if (f < 0) return Error{"missing F" + op};
      if (b < 0) return Error{"missing B" + op};
      if (split_weight && w < 0) return Error{"missing W" + op + " (the schedule splits W off other backwards)"};
      if (b < f) return Error{fmt::format("B{} comes before F{} in program order", op, op)};
      if (split_weight && w < b) return Error{fmt::format("W{} comes before B{} in program order", op, op)};
    }
  if (Status s = check_vocab_passes(graph, microbatches); !s.ok()) return s;
  for (int d = 0; d < graph.devices(); ++d)
    if (optimizers[static_cast<std::size_t>(d)] != 1)
      return Error{fmt::format("device {} has {} OPTIMIZER ops; every device needs exactly one", d,
                               optimizers[static_cast<std::size_t>(d)])};
  return Status::Ok();
}

/// Executors order ops across devices only through SEND/RECV pairs and collectives.
Status check_local_dependencies(const TaskGraph& graph) {
  // The devices in an array of their own: looked up at random, 4 bytes an op stay in cache where
  // the ops themselves do not.
  std::vector<std::int32_t> device(graph.size());
  for (std::size_t i = 0; i < graph.size(); ++i) device[i] = graph.task(TaskId(i)).device;
  for (std::size_t i = 0; i < graph.size(); ++i)
    for (TaskId dep : graph.deps(TaskId(i)))
      if (device[std::size_t(dep)] != device[i])
        return Error{fmt::format("{} depends on {} on another device; order across devices must go through a "
                                 "SEND/RECV pair",
                                 graph.describe(TaskId(i)), graph.describe(dep))};
  return Status::Ok();
}

/// Every SEND has its RECV, and on each channel (ordered device pair) the k-th SEND pairs with the
/// k-th RECV, as NCCL matches them.
Status check_p2p(const TaskGraph& graph) {
  for (std::size_t i = 0; i < graph.size(); ++i) {
    const Task& t = graph.task(TaskId(i));
    if (t.kind != OpKind::Send && t.kind != OpKind::Recv) continue;
    const OpKind other = t.kind == OpKind::Send ? OpKind::Recv : OpKind::Send;
    if (t.partner == kNoTask || graph.task(t.partner).kind != other || graph.task(t.partner).device != t.peer ||
        graph.task(t.partner).partner != TaskId(i))
      return Error{fmt::format("{} has no matching {} on device {}", graph.describe(TaskId(i)), op_kind_name(other), t.peer)};
  }
  for (int from = 0; from < graph.devices(); ++from)
    for (int to = 0; to < graph.devices(); ++to) {
      const auto sends = graph.stream_order(from, Stream::Send, to), recvs = graph.stream_order(to, Stream::Recv, from);
      for (std::size_t k = 0; k < std::max(sends.size(), recvs.size()); ++k)
        if (k >= sends.size() || k >= recvs.size() || graph.task(sends[k]).partner != recvs[k])
          return Error{fmt::format(
              "p2p order mismatch between device {} and device {}: SEND number {} on device {} is {}, but RECV number "
              "{} on device {} is {}; sends and receives between a pair must be issued in the same order",
              from, to, k + 1, from, k < sends.size() ? graph.describe(sends[k]) : "missing", k + 1, to,
              k < recvs.size() ? graph.describe(recvs[k]) : "missing")};
    }
  return Status::Ok();
}

enum class Wait { Dependency, StreamOrder };
using WaitGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS, boost::no_property, Wait>;
using Vertex = WaitGraph::vertex_descriptor;

struct CycleFound {
  Vertex from, to;
  Wait wait;
};

/// Records the DFS tree so that a back edge can be unwound into the full cycle.
struct CycleVisitor : boost::default_dfs_visitor {
  std::vector<Vertex>* parent;
  std::vector<Wait>* parent_wait;
  void tree_edge(WaitGraph::edge_descriptor e, const WaitGraph& g) const {
    (*parent)[boost::target(e, g)] = boost::source(e, g);
    (*parent_wait)[boost::target(e, g)] = g[e];
  }
  void back_edge(WaitGraph::edge_descriptor e, const WaitGraph& g) const {
    throw CycleFound{boost::source(e, g), boost::target(e, g), g[e]};
  }
};

/// Ops that must start together (a SEND and its RECV, all members of a collective) are one vertex.
std::vector<TaskId> rendezvous_representatives(const TaskGraph& graph) {
  std::vector<TaskId> rep(graph.size());
  for (std::size_t i = 0; i < rep.size(); ++i) {
    const Task& t = graph.task(static_cast<TaskId>(i));
    rep[i] = static_cast<TaskId>(i);
    if (t.partner != kNoTask) rep[i] = std::min(rep[i], t.partner);
    if (t.group >= 0) rep[i] = graph.groups()[static_cast<std::size_t>(t.group)].members.front();
  }
  return rep;
}

std::string describe_vertex(const TaskGraph& graph, TaskId id) {
  const Task& t = graph.task(id);
  if (t.partner != kNoTask) return graph.describe(id) + "+" + graph.describe(t.partner);
  return graph.describe(id);
}

/// Kahn's algorithm over the same wait graph, on the task graph's own arrays: whether every op can
/// be ordered. It is the fast path; the Boost.Graph search below runs only to name the cycle.
bool orderable(const TaskGraph& graph, const std::vector<TaskId>& rep) {
  const std::size_t n = graph.size();
  std::vector<TaskId> next_in_stream(n, kNoTask);
  for (std::size_t s = 0; s < graph.stream_count(); ++s) {
    const auto order = graph.stream(s);
    for (std::size_t k = 1; k < order.size(); ++k) next_in_stream[std::size_t(order[k - 1])] = order[k];
  }
  const auto waiters = [&](TaskId op, auto&& visit) {  // the ops that wait for `op`
    for (TaskId after : graph.successors(op)) visit(after);
    if (const TaskId after = next_in_stream[std::size_t(op)]; after != kNoTask) visit(after);
  };
  std::vector<std::int32_t> waiting(n, 0);  // per representative: unfinished edges into its vertex
  for (std::size_t i = 0; i < n; ++i)
    waiters(TaskId(i), [&](TaskId after) { waiting[std::size_t(rep[std::size_t(after)])] += rep[i] != rep[std::size_t(after)]; });
  std::vector<TaskId> ready;
  std::size_t vertices = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (rep[i] == TaskId(i)) {
      ++vertices;
      if (waiting[i] == 0) ready.push_back(TaskId(i));
    }
  // Per op, what it starts together with, in an array of its own (as the devices above): its
  // partner (>= 0), its collective group (-2 - group), or nothing (-1).
  std::vector<std::int32_t> together(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Task& t = graph.task(TaskId(i));
    together[i] = t.group >= 0 ? -2 - t.group : t.partner;
  }
  std::size_t ordered = 0;
  while (!ready.empty()) {
    const TaskId v = ready.back();
    ready.pop_back();
    ++ordered;
    const std::int32_t with = together[std::size_t(v)];
    const TaskId pair[2] = {v, with};
    const std::span<const TaskId> members = with <= -2 ? std::span<const TaskId>(graph.groups()[std::size_t(-2 - with)].members)
                                            : with >= 0 ? std::span<const TaskId>(pair)
                                                        : std::span<const TaskId>(pair, 1);
    for (TaskId member : members)
      waiters(member, [&](TaskId after) {
        const TaskId w = rep[std::size_t(after)];
        if (w != v && --waiting[std::size_t(w)] == 0) ready.push_back(w);
      });
  }
  return ordered == vertices;
}

}  // namespace

Status check_orderable(const TaskGraph& graph) {
  const std::vector<TaskId> rep = rendezvous_representatives(graph);
  if (orderable(graph, rep)) return Status::Ok();
  WaitGraph g(graph.size());
  const auto edge = [&](TaskId before, TaskId after, Wait wait) {
    const auto u = static_cast<Vertex>(rep[static_cast<std::size_t>(before)]);
    const auto v = static_cast<Vertex>(rep[static_cast<std::size_t>(after)]);
    if (u != v) boost::add_edge(u, v, wait, g);
  };
  for (std::size_t i = 0; i < graph.size(); ++i)
    for (TaskId dep : graph.deps(static_cast<TaskId>(i))) edge(dep, static_cast<TaskId>(i), Wait::Dependency);
  for (std::size_t s = 0; s < graph.stream_count(); ++s) {
    const auto order = graph.stream(s);
    for (std::size_t k = 1; k < order.size(); ++k) edge(order[k - 1], order[k], Wait::StreamOrder);
  }
  std::vector<Vertex> parent(graph.size());
  std::vector<Wait> parent_wait(graph.size(), Wait::Dependency);
  CycleVisitor visitor;
  visitor.parent = &parent;
  visitor.parent_wait = &parent_wait;
  try {
    boost::depth_first_search(g, boost::visitor(visitor));
  } catch (const CycleFound& cycle) {
    // The back edge from -> to closes the tree path to -> ... -> from.
    std::vector<Vertex> path{cycle.to};
    for (Vertex v = cycle.from; v != cycle.to; v = parent[v]) path.insert(path.begin() + 1, v);
    bool only_dependencies = true;
    std::string text = describe_vertex(graph, static_cast<TaskId>(path.front()));
    for (std::size_t k = 1; k <= path.size(); ++k) {
      const Vertex v = k < path.size() ? path[k] : path.front();
      const Wait wait = k < path.size() ? parent_wait[v] : cycle.wait;
      only_dependencies &= wait == Wait::Dependency;
      text += (wait == Wait::Dependency ? " -> " : " -[stream order]-> ") + describe_vertex(graph, static_cast<TaskId>(v));
    }
    if (only_dependencies) return Error{"dependency cycle: " + text};
    return Error{"deadlock: these ops wait on each other (a -> b: b needs a finished; a stream runs its ops in "
                 "program order; a SEND and its RECV start together): " + text};
  }
  return Status::Ok();
}

Status validate_structure(const TaskGraph& graph, const Layout& layout, int microbatches) {
  if (Status s = check_ops(graph, layout, microbatches); !s.ok()) return s;
  if (Status s = check_local_dependencies(graph); !s.ok()) return s;
  return check_p2p(graph);
}

Status validate(const TaskGraph& graph, const Layout& layout, int microbatches) {
  if (Status s = validate_structure(graph, layout, microbatches); !s.ok()) return s;
  return check_orderable(graph);
}

}  // namespace pipesim
