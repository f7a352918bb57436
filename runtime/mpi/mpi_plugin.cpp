// The MPI backend: one process per rank, host buffers. Every lane is its own duplicate of
// MPI_COMM_WORLD: point-to-point messages between two ranks stay in order, as the IR's channels
// need, and lanes never wait for each other, while ranks issue each lane's collectives in the same
// order as MPI requires.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "mpi_plugin.h"

namespace pipesim::runtime::mpi {
namespace {

class MpiRequest final : public Request {
 public:
  MPI_Request* handle() { return &request_; }
  bool done() override {
    if (done_) return true;
    int flag = 0;
    MPI_Test(&request_, &flag, MPI_STATUS_IGNORE);
    done_ = flag != 0;
    return done_;
  }

 private:
  MPI_Request request_ = MPI_REQUEST_NULL;
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
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

/// One lane: a duplicate of MPI_COMM_WORLD, so lanes never match each other's messages.
class MpiLane final : public Communicator {
 public:
  explicit MpiLane(int rank) : rank_(rank) { MPI_Comm_dup(MPI_COMM_WORLD, &comm_); }
  ~MpiLane() override { MPI_Comm_free(&comm_); }

  std::unique_ptr<Request> send(Buffer data, int peer) override {
    auto r = std::make_unique<MpiRequest>();
    MPI_Isend(data.data, int(data.count), mpi_type(data.dtype), peer, 0, comm_, r->handle());
    return r;
  }
  std::unique_ptr<Request> recv(Buffer data, int peer) override {
    auto r = std::make_unique<MpiRequest>();
    MPI_Irecv(data.data, int(data.count), mpi_type(data.dtype), peer, 0, comm_, r->handle());
    return r;
  }
  std::unique_ptr<Request> all_reduce(Buffer data, ReduceOp op) override {
    auto r = std::make_unique<MpiRequest>();
    MPI_Iallreduce(MPI_IN_PLACE, data.data, int(data.count), mpi_type(data.dtype), mpi_op(op), comm_, r->handle());
    return r;
  }
  std::unique_ptr<Request> broadcast(Buffer data, int root) override {
    auto r = std::make_unique<MpiRequest>();
    MPI_Ibcast(data.data, int(data.count), mpi_type(data.dtype), root, comm_, r->handle());
    return r;
  }
  std::unique_ptr<Request> reduce(Buffer data, ReduceOp op, int root) override {
    auto r = std::make_unique<MpiRequest>();
    if (rank_ == root)
      MPI_Ireduce(MPI_IN_PLACE, data.data, int(data.count), mpi_type(data.dtype), mpi_op(op), root, comm_, r->handle());
    else
      MPI_Ireduce(data.data, nullptr, int(data.count), mpi_type(data.dtype), mpi_op(op), root, comm_, r->handle());
    return r;
  }

 private:
  int rank_;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

class MpiTransport final : public Transport {
 public:
  MpiTransport() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    for (int lane = 0; lane < kLanes; ++lane) lanes_.push_back(std::make_unique<MpiLane>(rank_));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Communicator& lane(int lane) override { return *lanes_.at(std::size_t(lane)); }
  void wait_for_progress(double seconds) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(seconds, 50e-6)));
  }
  void wake() override {}  // waits are 50 µs at most
  bool aborted() override { return false; }  // an aborted job is killed, not told
  [[noreturn]] void abort(const std::string& why) override { abort_job(why.c_str()); }

 private:
  int rank_ = 0, size_ = 1;
  std::vector<std::unique_ptr<Communicator>> lanes_;
};

void init(int* rank, int* size) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);  // only the launching thread calls MPI
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
}

std::unique_ptr<Transport> make_transport() { return std::make_unique<MpiTransport>(); }

void finalize() { MPI_Finalize(); }

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
