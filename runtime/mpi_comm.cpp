// The MPI backend: one process per rank. Point-to-point messages use one duplicated communicator
// (MPI keeps messages between two ranks in order, as the IR's channels need); each collective lane
// has its own duplicate, so lanes never wait for each other, while ranks issue each lane's
// collectives in the same order as MPI requires.
#include <mpi.h>

#include <cstdio>
#include <thread>

#include "launch.h"

namespace pipesim::runtime {
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

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX; }

class MpiComm final : public Communicator {
 public:
  explicit MpiComm(int lanes) : lanes_(std::size_t(lanes)) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_dup(MPI_COMM_WORLD, &p2p_);
    for (MPI_Comm& lane : lanes_) MPI_Comm_dup(MPI_COMM_WORLD, &lane);
  }
  ~MpiComm() override {
    for (MPI_Comm& lane : lanes_) MPI_Comm_free(&lane);
    MPI_Comm_free(&p2p_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Request> send(std::span<const std::byte> data, int peer) override {
    auto r = std::make_unique<MpiRequest>();
    MPI_Isend(data.data(), int(data.size()), MPI_BYTE, peer, 0, p2p_, r->handle());
    return r;
  }
  std::unique_ptr<Request> recv(std::span<std::byte> data, int peer) override {
    auto r = std::make_unique<MpiRequest>();
    MPI_Irecv(data.data(), int(data.size()), MPI_BYTE, peer, 0, p2p_, r->handle());
    return r;
  }
  std::unique_ptr<Request> all_reduce(std::span<float> data, ReduceOp op, int lane) override {
    auto r = std::make_unique<MpiRequest>();
    MPI_Iallreduce(MPI_IN_PLACE, data.data(), int(data.size()), MPI_FLOAT, mpi_op(op), comm(lane), r->handle());
    return r;
  }
  std::unique_ptr<Request> broadcast(std::span<float> data, int root, int lane) override {
    auto r = std::make_unique<MpiRequest>();
    MPI_Ibcast(data.data(), int(data.size()), MPI_FLOAT, root, comm(lane), r->handle());
    return r;
  }
  std::unique_ptr<Request> reduce(std::span<float> data, ReduceOp op, int root, int lane) override {
    auto r = std::make_unique<MpiRequest>();
    if (rank_ == root)
      MPI_Ireduce(MPI_IN_PLACE, data.data(), int(data.size()), MPI_FLOAT, mpi_op(op), root, comm(lane), r->handle());
    else
      MPI_Ireduce(data.data(), nullptr, int(data.size()), MPI_FLOAT, mpi_op(op), root, comm(lane), r->handle());
    return r;
  }
  void wait_for_progress(double seconds) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(seconds, 50e-6)));
  }
  void wake() override {}  // waits are 50 µs at most
  bool aborted() override { return false; }  // an aborted job is killed, not told
  [[noreturn]] void abort(const std::string& why) override {
    std::fprintf(stderr, "pipesim: error: %s\n", why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
  }

 private:
  MPI_Comm comm(int lane) { return lanes_[std::size_t(lane)]; }
  int rank_ = 0, size_ = 1;
  MPI_Comm p2p_ = MPI_COMM_NULL;
  std::vector<MPI_Comm> lanes_;
};

}  // namespace

MpiRun run_mpi(const std::function<Result<Plan>(int ranks)>& plan_for, const RunOptions& options) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);  // only this thread calls MPI
  MpiRun run;
  {
    MpiComm comm(kCollectiveLanes);
    run.rank = comm.rank(), run.size = comm.size();
    Result<Plan> plan = plan_for(comm.size());
    if (!plan.ok()) {
      run.result = plan.error();  // every rank builds the same plan, so every rank fails alike
    } else if (Result<RunResult> result = run_rank(comm, plan.value(), options); !result.ok()) {
      comm.abort(result.error().message);
    } else {
      run.result = std::move(result).value();
    }
  }
  MPI_Finalize();
  return run;
}

}  // namespace pipesim::runtime
