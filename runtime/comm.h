#pragma once
/// The communicator the executor talks to: point-to-point and collective operations, each
/// asynchronous, returning a Request that is polled for completion. Backends: in-process (one thread
/// per rank, inprocess_comm.h), MPI (one process per rank, mpi_comm.h); a NCCL backend implements the
/// same interface. Buffers passed in must stay alive and untouched until their request is done.
///
/// Ordering follows MPI/NCCL: messages from one rank to another arrive in the order they were sent;
/// collectives on one lane are matched across ranks by their order on that lane, so every rank must
/// issue a lane's collectives in the same order. Lanes are independent of each other.
#include <cstddef>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

namespace pipesim::runtime {

/// A peer failed or the run was aborted: what the failing rank said.
struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ReduceOp { Sum, Max };

class Request {
 public:
  virtual ~Request() = default;
  /// True once the operation has completed (its buffer may be reused). Throws CommError when the
  /// run was aborted by another rank, std::logic_error when the peers disagree on the sizes.
  virtual bool done() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual std::unique_ptr<Request> send(std::span<const std::byte> data, int peer) = 0;
  virtual std::unique_ptr<Request> recv(std::span<std::byte> data, int peer) = 0;
  virtual std::unique_ptr<Request> all_reduce(std::span<float> data, ReduceOp op, int lane) = 0;
  virtual std::unique_ptr<Request> broadcast(std::span<float> data, int root, int lane) = 0;
  /// The reduced values land in `data` on `root`; other ranks' `data` is left as it was.
  virtual std::unique_ptr<Request> reduce(std::span<float> data, ReduceOp op, int root, int lane) = 0;

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

/// Byte views of float data, for send and recv.
inline std::span<const std::byte> bytes_of(std::span<const float> data) { return std::as_bytes(data); }
inline std::span<std::byte> bytes_of(std::span<float> data) { return std::as_writable_bytes(data); }

}  // namespace pipesim::runtime
