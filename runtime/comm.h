#pragma once
/// How ranks talk. A Transport joins one rank to the others; it holds one Communicator per lane (as
/// NCCL holds one communicator per lane): the collective lanes of the IR plus one lane for
/// point-to-point messages. Every call is asynchronous and returns a Request that is polled for
/// completion; buffers are untyped (pointer, count, dtype) and may live in host or device memory,
/// as the backend that made them decides. They must stay alive and untouched until their request is
/// done. Backends: in-process (threads, inprocess_comm.h), MPI (processes, mpi/mpi_plugin.cpp).
///
/// Ordering follows MPI/NCCL: messages from one rank to another arrive in the order they were sent;
/// collectives on one lane are matched across ranks by their order on that lane, so every rank must
/// issue a lane's collectives in the same order. Lanes are independent of each other.
#include <memory>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "task_graph.h"
#include "tensor.h"

namespace pipesim::runtime {

using pipesim::ReduceOp;  ///< Sum and Max here; the IR's MaxThenSum is run as rounds of those

/// A peer failed or the run was aborted: what the failing rank said.
struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Request {
 public:
  virtual ~Request() = default;
  /// True once the operation has completed (its buffer may be reused). Throws CommError when the
  /// run was aborted by another rank, std::logic_error when the peers disagree on the sizes.
  virtual bool done() = 0;
};

/// One lane between all ranks.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::unique_ptr<Request> send(Buffer data, int peer) = 0;
  virtual std::unique_ptr<Request> recv(Buffer data, int peer) = 0;
  virtual std::unique_ptr<Request> all_reduce(Buffer data, ReduceOp op) = 0;
  virtual std::unique_ptr<Request> broadcast(Buffer data, int root) = 0;
  /// The reduced values land in `data` on `root`; other ranks' `data` is left as it was.
  virtual std::unique_ptr<Request> reduce(Buffer data, ReduceOp op, int root) = 0;
  /// `out` (size() × in.count values) gets every rank's `in`, in rank order.
  virtual std::unique_ptr<Request> all_gather(Buffer in, Buffer out) = 0;
  /// `out` gets block rank() (out.count values) of every rank's `in` (size() × out.count) reduced.
  virtual std::unique_ptr<Request> reduce_scatter(Buffer in, Buffer out, ReduceOp op) = 0;
  /// Variable all-to-all (MPI_Alltoallv): `in` holds one block per rank, in rank order, block d
  /// (send_counts[d] values) for rank d; `out` gets the block every rank sent this one, in rank order,
  /// block r recv_counts[r] values. Each rank's send_counts[d] must be rank d's recv_counts[rank()].
  /// The counts are copied: unlike the buffers, they need not outlive the call.
  virtual std::unique_ptr<Request> all_to_all(Buffer in, std::span<const std::size_t> send_counts, Buffer out,
                                              std::span<const std::size_t> recv_counts) = 0;
};

/// Throws std::logic_error unless an all_to_all's arguments agree on a group of `ranks`: one count
/// per rank each way, `in` and `out` as long as their counts add up to, one dtype. (Whether the
/// peers' counts agree with this rank's, only the transport can tell.)
inline void check_all_to_all(Buffer in, std::span<const std::size_t> send_counts, Buffer out,
                             std::span<const std::size_t> recv_counts, int ranks) {
  const auto total = [](std::span<const std::size_t> counts) {
    return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  };
  if (send_counts.size() != std::size_t(ranks) || recv_counts.size() != std::size_t(ranks))
    throw std::logic_error("an all-to-all of " + std::to_string(ranks) + " ranks given " +
                           std::to_string(send_counts.size()) + " send and " + std::to_string(recv_counts.size()) +
                           " receive counts");
  if (total(send_counts) != in.count || total(recv_counts) != out.count)
    throw std::logic_error("an all-to-all's counts add up to " + std::to_string(total(send_counts)) + " and " +
                           std::to_string(total(recv_counts)) + " values, its buffers hold " +
                           std::to_string(in.count) + " and " + std::to_string(out.count));
  if (in.dtype != out.dtype) throw std::logic_error("an all-to-all between buffers of different dtypes");
}

/// After the IR's collective lanes: the point-to-point lane, and the control lane, which carries the
/// executor's own messages (step barriers, the loss, reports) in host memory whatever the backend.
constexpr int kPointToPointLane = kCollectiveLanes;
constexpr int kControlLane = kCollectiveLanes + 1;
constexpr int kLanes = kCollectiveLanes + 2;

/// What a group of ranks carries: a pipeline, the graph's point-to-point messages between its ranks
/// (which are the graph's devices) besides collectives; any other group (data-parallel replicas,
/// tensor-parallel ranks), collectives only. Transports that connect each point-to-point channel
/// ahead (NCCL) connect a pipeline's only.
enum class GroupUse { Pipeline, Collectives };

/// One rank's connection to the others: its lanes, progress and failure.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Lane 0 .. kCollectiveLanes - 1 for collectives, kPointToPointLane for send and recv,
  /// kControlLane for host buffers.
  virtual Communicator& lane(int lane) = 0;
  Communicator& p2p() { return lane(kPointToPointLane); }
  Communicator& control() { return lane(kControlLane); }
  /// A transport over some of this one's ranks: `members` (this rank among them) become ranks 0, 1,
  /// ... of the new one, which has lanes of its own (MPI_Comm_create_group; NCCL communicators among
  /// the members). Every member asks for the same list; the call waits for the members only. Aborts
  /// reach every rank.
  virtual std::unique_ptr<Transport> subgroup(const std::vector<int>& members, GroupUse use) = 0;

  /// Sleeps until communication may have progressed or wake() was called, at most `seconds`: a
  /// rank's communication thread waits here when it has nothing to do. Call from one thread only.
  virtual void wait_for_progress(double seconds) = 0;
  /// Ends a wait_for_progress early; callable from any thread (the rank's compute thread calls it
  /// when an op completes that communication may be waiting for).
  virtual void wake() = 0;
  /// True once any rank has aborted the run.
  virtual bool aborted() = 0;
  /// Ends the run on every rank: their pending and later requests throw CommError(`why`). Never
  /// returns for backends that must kill processes (MPI).
  virtual void abort(const std::string& why) = 0;
};

/// A host buffer of plain values, for the control lane.
template <class T>
Buffer host_buffer(std::span<T> values) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  return {const_cast<std::remove_const_t<T>*>(values.data()), values.size(), sizeof(T) == 4 ? DType::F32 : DType::F64};
}

}  // namespace pipesim::runtime
