// The MPI backend: one process per rank, host buffers. Every lane is its own duplicate of
// MPI_COMM_WORLD, or of a subgroup's communicator: point-to-point messages between two ranks stay in
// order, as the IR's channels need, and lanes never wait for each other, while ranks issue each
// lane's collectives in the same order as MPI requires.
//
// Every MPI call's return code is checked: MPI_COMM_WORLD and its duplicates return errors
// (MPI_ERRORS_RETURN) instead of aborting inside MPI, so that a failing call becomes an error that
// names the call and the rank, which the executor reports like any other failure.
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mpi_plugin.h"

namespace pipesim::runtime::mpi {
namespace {

/// "MPI_Isend to rank 2 failed: <MPI's own message>".
std::string describe_failure(int code, const std::string& call) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return call + " failed: MPI error " + std::to_string(code);
  return call + " failed: " + std::string(text, std::size_t(length));
}

void check(int code, const std::string& call) {
  if (code != MPI_SUCCESS) throw std::runtime_error(describe_failure(code, call));
}

class MpiRequest final : public Request {
 public:
  MPI_Request* handle() { return &request_; }
  /// What MPI reads until the request completes besides the buffers (an MPI_Ialltoallv's counts and
  /// displacements): kept with the request, so that they live as long as it.
  std::vector<int>& arrays() { return arrays_; }
  bool done() override {
    if (done_) return true;
    int flag = 0;
    check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    done_ = flag != 0;
    return done_;
  }

 private:
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::vector<int> arrays_;
  bool done_ = false;
};

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::BF16: break;
  }
  throw std::logic_error("the MPI communicator moves host fp32 and fp64 buffers, not bf16");
}

[[noreturn]] void abort_job(const char* why) {
  std::fprintf(stderr, "pipesim: error: %s\n", why);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);  // returns only if MPI could not end the job: end this process at least
  std::abort();
}

/// One lane: a duplicate of its transport's communicator, so lanes never match each other's messages.
class MpiLane final : public Communicator {
 public:
  MpiLane(MPI_Comm base, int rank, int size) : rank_(rank), size_(size) {
    check(MPI_Comm_dup(base, &comm_), "MPI_Comm_dup");
  }
  ~MpiLane() override {
    if (const int code = MPI_Comm_free(&comm_); code != MPI_SUCCESS)  // a destructor cannot throw: say so
      std::fprintf(stderr, "pipesim: warning: rank %d: %s\n", rank_, describe_failure(code, "MPI_Comm_free").c_str());
  }

  std::unique_ptr<Request> send(Buffer data, int peer) override {
    auto r = std::make_unique<MpiRequest>();
    check(MPI_Isend(data.data, int(data.count), mpi_type(data.dtype), peer, 0, comm_, r->handle()),
          "MPI_Isend to rank " + std::to_string(peer));
    return r;
  }
  std::unique_ptr<Request> recv(Buffer data, int peer) override {
    auto r = std::make_unique<MpiRequest>();
    check(MPI_Irecv(data.data, int(data.count), mpi_type(data.dtype), peer, 0, comm_, r->handle()),
          "MPI_Irecv from rank " + std::to_string(peer));
    return r;
  }
  std::unique_ptr<Request> all_reduce(Buffer data, ReduceOp op) override {
    auto r = std::make_unique<MpiRequest>();
    check(MPI_Iallreduce(MPI_IN_PLACE, data.data, int(data.count), mpi_type(data.dtype), mpi_op(op), comm_, r->handle()),
          "MPI_Iallreduce");
    return r;
  }
  std::unique_ptr<Request> broadcast(Buffer data, int root) override {
    auto r = std::make_unique<MpiRequest>();
    check(MPI_Ibcast(data.data, int(data.count), mpi_type(data.dtype), root, comm_, r->handle()),
          "MPI_Ibcast from rank " + std::to_string(root));
    return r;
  }
  std::unique_ptr<Request> reduce(Buffer data, ReduceOp op, int root) override {
    auto r = std::make_unique<MpiRequest>();
    if (rank_ == root)
      check(MPI_Ireduce(MPI_IN_PLACE, data.data, int(data.count), mpi_type(data.dtype), mpi_op(op), root, comm_, r->handle()),
            "MPI_Ireduce");
    else
      check(MPI_Ireduce(data.data, nullptr, int(data.count), mpi_type(data.dtype), mpi_op(op), root, comm_, r->handle()),
            "MPI_Ireduce to rank " + std::to_string(root));
    return r;
  }
  std::unique_ptr<Request> all_gather(Buffer in, Buffer out) override {
    auto r = std::make_unique<MpiRequest>();
    check(MPI_Iallgather(in.data, int(in.count), mpi_type(in.dtype), out.data, int(in.count), mpi_type(out.dtype), comm_,
                         r->handle()),
          "MPI_Iallgather");
    return r;
  }
  std::unique_ptr<Request> reduce_scatter(Buffer in, Buffer out, ReduceOp op) override {
    auto r = std::make_unique<MpiRequest>();
    check(MPI_Ireduce_scatter_block(in.data, out.data, int(out.count), mpi_type(in.dtype), mpi_op(op), comm_, r->handle()),
          "MPI_Ireduce_scatter_block");
    return r;
  }
  /// MPI_Ialltoallv counts and places blocks in ints: buffers of more than INT_MAX values are refused,
  /// not wrapped (no count or displacement is then past INT_MAX).
  std::unique_ptr<Request> all_to_all(Buffer in, std::span<const std::size_t> send_counts, Buffer out,
                                      std::span<const std::size_t> recv_counts) override {
    check_all_to_all(in, send_counts, out, recv_counts, size_);
    if (in.count > std::size_t(INT_MAX) || out.count > std::size_t(INT_MAX))
      throw std::runtime_error("MPI_Ialltoallv: a buffer of more than INT_MAX values");
    auto r = std::make_unique<MpiRequest>();
    const auto n = std::size_t(size_);
    std::vector<int>& a = r->arrays();  // send counts, send displacements, receive counts, receive displacements
    a.assign(4 * n, 0);
    const auto place = [n](std::span<const std::size_t> counts, int* count, int* first) {
      int at = 0;
      for (std::size_t p = 0; p < n; ++p) count[p] = int(counts[p]), first[p] = at, at += count[p];
    };
    place(send_counts, &a[0], &a[n]), place(recv_counts, &a[2 * n], &a[3 * n]);
    check(MPI_Ialltoallv(in.data, &a[0], &a[n], mpi_type(in.dtype), out.data, &a[2 * n], &a[3 * n], mpi_type(out.dtype),
                         comm_, r->handle()),
          "MPI_Ialltoallv");
    return r;
  }

 private:
  int rank_, size_;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

/// The ranks of one MPI communicator (MPI_COMM_WORLD, or a subgroup made from it), a lane each.
class MpiTransport final : public Transport {
 public:
  /// Takes `comm` over (frees it unless it is MPI_COMM_WORLD).
  explicit MpiTransport(MPI_Comm comm) : comm_(comm) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    for (int lane = 0; lane < kLanes; ++lane) lanes_.push_back(std::make_unique<MpiLane>(comm_, rank_, size_));
  }
  ~MpiTransport() override {
    lanes_.clear();
    if (comm_ != MPI_COMM_WORLD)
      if (const int code = MPI_Comm_free(&comm_); code != MPI_SUCCESS)
        std::fprintf(stderr, "pipesim: warning: rank %d: %s\n", rank_, describe_failure(code, "MPI_Comm_free").c_str());
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Communicator& lane(int lane) override { return *lanes_.at(std::size_t(lane)); }
  /// MPI_Comm_create_group: collective over the members only, as the interface promises. Every lane
  /// carries any message, whatever the group's use.
  std::unique_ptr<Transport> subgroup(const std::vector<int>& members, GroupUse) override {
    MPI_Group all = MPI_GROUP_NULL, some = MPI_GROUP_NULL;
    check(MPI_Comm_group(comm_, &all), "MPI_Comm_group");
    check(MPI_Group_incl(all, int(members.size()), members.data(), &some), "MPI_Group_incl");
    MPI_Comm comm = MPI_COMM_NULL;
    const int code = MPI_Comm_create_group(comm_, some, 0, &comm);
    MPI_Group_free(&some), MPI_Group_free(&all);
    check(code, "MPI_Comm_create_group");
    check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    return std::make_unique<MpiTransport>(comm);
  }
  void wait_for_progress(double seconds) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(seconds, 50e-6)));
  }
  void wake() override {}  // waits are 50 µs at most
  bool aborted() override { return false; }  // an aborted job is killed, not told
  [[noreturn]] void abort(const std::string& why) override { abort_job(why.c_str()); }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<std::unique_ptr<Communicator>> lanes_;
};

void init(int* rank, int* size) {
  int provided = 0;
  // Only the launching thread calls MPI. A failing MPI_Init_thread ends the process inside MPI
  // (no error handler can be set before it); its code is checked for MPIs that return it.
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_FUNNELED)
    throw std::runtime_error("MPI_Init_thread: this MPI does not support MPI_THREAD_FUNNELED (one thread calling MPI)");
  check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");  // duplicates inherit it
  check(MPI_Comm_rank(MPI_COMM_WORLD, rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, size), "MPI_Comm_size");
}

std::unique_ptr<Transport> make_transport() { return std::make_unique<MpiTransport>(MPI_COMM_WORLD); }

void finalize() {
  if (const int code = MPI_Finalize(); code != MPI_SUCCESS)
    std::fprintf(stderr, "pipesim: warning: %s\n", describe_failure(code, "MPI_Finalize").c_str());
}

constexpr PluginApi kApi{
    .version = kPluginVersion,
    .init = init,
    .make_transport = make_transport,
    .abort = abort_job,
    .finalize = finalize,
};

}  // namespace
}  // namespace pipesim::runtime::mpi

extern "C" __attribute__((visibility("default"))) const pipesim::runtime::mpi::PluginApi* pipesim_mpi_plugin() {
  return &pipesim::runtime::mpi::kApi;
}
