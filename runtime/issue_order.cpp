#include "issue_order.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace pipesim::runtime {
namespace {

/// The elements of the order: sets of ops joined by their rendezvous (a SEND and its RECV, the
/// members of a collective), each named by its lowest op id.
class Elements {
 public:
  explicit Elements(const TaskGraph& graph) : root_(graph.size()) {
    std::iota(root_.begin(), root_.end(), TaskId(0));
    for (TaskId id = 0; id < TaskId(graph.size()); ++id)
      if (const Task& t = graph.task(id); t.kind == OpKind::Send && t.partner != kNoTask) join(id, t.partner);
    for (const CollectiveGroup& g : graph.groups())
      for (const TaskId member : g.members) join(g.members.front(), member);
    // Elements numbered in the order of their lowest op id, so that the number breaks ties as the id does.
    index_.assign(graph.size(), 0);
    for (TaskId id = 0; id < TaskId(graph.size()); ++id)
      index_[std::size_t(id)] = find(id) == id ? count_++ : index_[std::size_t(find(id))];
  }
  std::uint32_t of(TaskId id) const { return index_[std::size_t(id)]; }
  std::uint32_t count() const { return count_; }

 private:
  TaskId find(TaskId id) {
    while (root_[std::size_t(id)] != id) id = root_[std::size_t(id)] = root_[std::size_t(root_[std::size_t(id)])];
    return id;
  }
  void join(TaskId a, TaskId b) {
    a = find(a), b = find(b);
    if (a != b) root_[std::size_t(std::max(a, b))] = std::min(a, b);  // the lowest id stays the root
  }
  std::vector<TaskId> root_;
  std::vector<std::uint32_t> index_;
  std::uint32_t count_ = 0;
};

}  // namespace

IssueOrder::IssueOrder(const TaskGraph& graph) : graph_(graph), position_(graph.size(), 0) {
  const Elements elements(graph);
  const std::size_t count = elements.count();
  // Edges between elements: each op's dependencies and its stream predecessor, as CSR by source.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;
  const auto edge = [&](TaskId from, TaskId to) {
    if (elements.of(from) != elements.of(to)) edges.emplace_back(elements.of(from), elements.of(to));
  };
  for (TaskId id = 0; id < TaskId(graph.size()); ++id)
    for (const TaskId dep : graph.deps(id)) edge(dep, id);
  for (std::size_t s = 0; s < graph.stream_count(); ++s) {
    const auto ops = graph.stream(s);
    for (std::size_t i = 1; i < ops.size(); ++i) edge(ops[i - 1], ops[i]);
  }
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  std::vector<std::size_t> first(count + 1, 0);
  std::vector<std::uint32_t> waiting(count, 0);  // predecessors not yet placed
  for (const auto& [from, to] : edges) ++first[from + 1], ++waiting[to];
  std::partial_sum(first.begin(), first.end(), first.begin());

  // An element's time: a compute op takes its flops (at least 1), communication none.
  std::vector<double> duration(count, 0.0), start(count, 0.0);
  for (TaskId id = 0; id < TaskId(graph.size()); ++id)
    if (is_compute(graph.task(id).kind)) duration[elements.of(id)] = std::max(1.0, graph.work(id).flops);

  // Kahn's algorithm, placing next the element that can start first; at one start communication
  // before compute (a transfer then need not wait for a compute op it could precede), then the
  // lowest op id.
  using Ready = std::tuple<double, bool, std::uint32_t>;
  std::priority_queue<Ready, std::vector<Ready>, std::greater<>> ready;
  const auto push = [&](std::uint32_t e) { ready.emplace(start[e], duration[e] > 0, e); };
  for (std::uint32_t e = 0; e < count; ++e)
    if (waiting[e] == 0) push(e);
  std::vector<std::size_t> placed_at(count, 0);
  std::size_t placed = 0;
  while (!ready.empty()) {
    const std::uint32_t e = std::get<2>(ready.top());
    ready.pop();
    placed_at[e] = placed++;
    const double end = start[e] + duration[e];
    for (std::size_t i = first[e]; i < first[e + 1]; ++i) {
      const std::uint32_t next = edges[i].second;
      start[next] = std::max(start[next], end);
      if (--waiting[next] == 0) push(next);
    }
  }
  if (placed != count) {
    for (TaskId id = 0; id < TaskId(graph.size()); ++id)
      if (waiting[elements.of(id)] > 0)
        throw std::runtime_error(fmt::format(
            "the task graph's communication has no one order: {} waits, through its rendezvous, on itself",
            graph.describe(id)));
  }
  for (TaskId id = 0; id < TaskId(graph.size()); ++id) position_[std::size_t(id)] = placed_at[elements.of(id)];
}

std::vector<TaskId> IssueOrder::sequence(int device, bool compute) const {
  std::vector<TaskId> ops;
  for (TaskId id = 0; id < TaskId(graph_.size()); ++id)
    if (const Task& t = graph_.task(id); t.device == device && (compute || !is_compute(t.kind))) ops.push_back(id);
  std::sort(ops.begin(), ops.end(), [&](TaskId a, TaskId b) { return position(a) < position(b); });
  for (std::size_t i = 1; i < ops.size(); ++i)
    if (position(ops[i - 1]) == position(ops[i]))
      throw std::runtime_error(fmt::format("{} and {} are one rendezvous on one device", graph_.describe(ops[i - 1]),
                                           graph_.describe(ops[i])));
  return ops;
}

}  // namespace pipesim::runtime
