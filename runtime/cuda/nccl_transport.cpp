// NCCL under MPI: one process per GPU. Every NCCL call is enqueued on its communicator's own stream
// and completes when the event recorded after it has fired; a communicator that reports an error
// fails the request, and an abort (a failing rank, or the executor's --timeout) calls ncclCommAbort
// on every communicator of this rank before the MPI job is ended.
#include <fmt/format.h>
#include <nccl.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "cuda/check.h"
#include "cuda/cuda_backend.h"

namespace pipesim::runtime::cuda {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F64: return ncclFloat64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  if (op == ReduceOp::Max) return ncclMax;
  if (op == ReduceOp::Sum) return ncclSum;
  throw std::logic_error("NCCL reductions here are Sum or Max");
}

/// A communicator and the stream its calls run on.
struct NcclComm {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

class NcclRequest final : public Request {
 public:
  NcclRequest(const NcclComm& c, const bool& aborted) : comm_(c.comm), aborted_(aborted) {
    CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(event_, c.stream));
  }
  ~NcclRequest() override { static_cast<void>(cudaEventDestroy(event_)); }
  bool done() override {
    if (aborted_) throw CommError("the run was aborted");
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) CUDA_CHECK(status);
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress)
      throw CommError(fmt::format("NCCL reports {} ({}); a peer may have failed", int(async), ncclGetErrorString(async)));
    return false;
  }

 private:
  ncclComm_t comm_;
  const bool& aborted_;
  cudaEvent_t event_ = nullptr;
};

/// A collective lane: one communicator over all ranks.
class CollectiveLane final : public Communicator {
 public:
  CollectiveLane(NcclComm c, const bool& aborted) : c_(c), aborted_(aborted) {}
  std::unique_ptr<Request> send(Buffer, int) override { throw std::logic_error("send on a collective lane"); }
  std::unique_ptr<Request> recv(Buffer, int) override { throw std::logic_error("recv on a collective lane"); }
  std::unique_ptr<Request> all_reduce(Buffer b, ReduceOp op) override {
    NCCL_CHECK(ncclAllReduce(b.data, b.data, b.count, nccl_type(b.dtype), nccl_op(op), c_.comm, c_.stream));
    return std::make_unique<NcclRequest>(c_, aborted_);
  }
  std::unique_ptr<Request> broadcast(Buffer b, int root) override {
    NCCL_CHECK(ncclBroadcast(b.data, b.data, b.count, nccl_type(b.dtype), root, c_.comm, c_.stream));
    return std::make_unique<NcclRequest>(c_, aborted_);
  }
  std::unique_ptr<Request> reduce(Buffer b, ReduceOp op, int root) override {
    NCCL_CHECK(ncclReduce(b.data, b.data, b.count, nccl_type(b.dtype), nccl_op(op), root, c_.comm, c_.stream));
    return std::make_unique<NcclRequest>(c_, aborted_);
  }

 private:
  NcclComm c_;
  const bool& aborted_;
};

/// The point-to-point lane: a 2-rank communicator per channel (sender, receiver), rank 0 the sender,
/// each on its own stream. A send never queues behind a receive from the same peer, so calls need no
/// ncclGroupStart/End around them (and are not grouped: a request's event is recorded right after
/// its call, which inside a group would fire before the transfer is launched).
class ChannelLane final : public Communicator {
 public:
  ChannelLane(int rank, std::map<std::pair<int, int>, NcclComm> channels, const bool& aborted)
      : rank_(rank), channels_(std::move(channels)), aborted_(aborted) {}
  std::unique_ptr<Request> send(Buffer b, int peer) override {
    const NcclComm& c = channel(rank_, peer);
    NCCL_CHECK(ncclSend(b.data, b.count, nccl_type(b.dtype), 1, c.comm, c.stream));
    return std::make_unique<NcclRequest>(c, aborted_);
  }
  std::unique_ptr<Request> recv(Buffer b, int peer) override {
    const NcclComm& c = channel(peer, rank_);
    NCCL_CHECK(ncclRecv(b.data, b.count, nccl_type(b.dtype), 0, c.comm, c.stream));
    return std::make_unique<NcclRequest>(c, aborted_);
  }
  std::unique_ptr<Request> all_reduce(Buffer, ReduceOp) override { throw std::logic_error("all-reduce on the p2p lane"); }
  std::unique_ptr<Request> broadcast(Buffer, int) override { throw std::logic_error("broadcast on the p2p lane"); }
  std::unique_ptr<Request> reduce(Buffer, ReduceOp, int) override { throw std::logic_error("reduce on the p2p lane"); }

 private:
  const NcclComm& channel(int from, int to) const {
    const auto it = channels_.find({from, to});
    if (it == channels_.end()) throw std::logic_error(fmt::format("no channel from rank {} to rank {} in this graph", from, to));
    return it->second;
  }
  int rank_;
  std::map<std::pair<int, int>, NcclComm> channels_;
  const bool& aborted_;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(std::unique_ptr<Transport> control, const TaskGraph& graph, int device)
      : control_(std::move(control)), rank_(control_->rank()), size_(control_->size()) {
    CUDA_CHECK(cudaSetDevice(device));
    refuse_shared_gpus(device);
    const NcclComm world = make(init_world());
    for (int lane = 0; lane < kCollectiveLanes; ++lane) lanes_.push_back(std::make_unique<CollectiveLane>(split(world, 0), aborted_));
    std::map<std::pair<int, int>, NcclComm> channels;
    for (const auto& [from, to] : used_channels(graph)) {  // every rank splits every channel, in the same order
      const bool member = rank_ == from || rank_ == to;
      const NcclComm c = split(world, member ? 0 : NCCL_SPLIT_NOCOLOR, rank_ == from ? 0 : 1);
      if (member) channels[{from, to}] = c;
    }
    lanes_.push_back(std::make_unique<ChannelLane>(rank_, std::move(channels), aborted_));
    all_.push_back(world);
  }
  ~NcclTransport() override {
    for (const NcclComm& c : all_) {
      if (!aborted_) static_cast<void>(ncclCommDestroy(c.comm));
      static_cast<void>(cudaStreamDestroy(c.stream));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Communicator& lane(int lane) override {
    return lane == kControlLane ? control_->control() : *lanes_.at(std::size_t(lane));
  }
  void wait_for_progress(double seconds) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(seconds, 50e-6)));
  }
  void wake() override {}
  bool aborted() override { return aborted_; }
  void abort(const std::string& why) override {
    aborted_ = true;
    for (const NcclComm& c : all_) static_cast<void>(ncclCommAbort(c.comm));
    control_->abort(why);  // MPI: prints the reason and ends every process
  }

 private:
  /// Each rank's (host, GPU) in turn, over the control lane: NCCL refuses two ranks on one GPU.
  void refuse_shared_gpus(int device) {
    char bus[32] = {};
    CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, device));
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    const double mine = double(std::hash<std::string>{}(std::string(host) + "/" + bus) >> 12);  // exact in a double
    std::vector<double> ids(std::size_t(size_), 0.0);
    ids[std::size_t(rank_)] = mine;
    wait(control_->control().all_reduce(host_buffer(std::span(ids)), ReduceOp::Sum));
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && ids[std::size_t(r)] == mine)
        throw std::runtime_error(fmt::format(
            "ranks {} and {} are on the same GPU ({} on {}): NCCL needs one GPU per rank; start at most as many "
            "processes per node as it has GPUs, or run every rank in one process, sharing the GPU: pipesim run "
            "--backend cuda without mpirun",
            std::min(r, rank_), std::max(r, rank_), bus, host));
  }
  ncclComm_t init_world() {
    ncclUniqueId id{};
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    std::vector<double> words(sizeof id / sizeof(double) + 1, 0.0);  // the id's bytes, carried as doubles
    std::memcpy(words.data(), &id, sizeof id);
    wait(control_->control().broadcast(host_buffer(std::span(words)), 0));
    std::memcpy(&id, words.data(), sizeof id);
    ncclComm_t comm = nullptr;
    NCCL_CHECK(ncclCommInitRank(&comm, size_, id, rank_));
    return comm;
  }
  NcclComm make(ncclComm_t comm) {
    NcclComm c{comm, nullptr};
    CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
    return c;
  }
  NcclComm split(const NcclComm& parent, int color, int key = -1) {
    ncclComm_t comm = nullptr;
    NCCL_CHECK(ncclCommSplit(parent.comm, color, key < 0 ? rank_ : key, &comm, nullptr));
    if (comm == nullptr) return {};  // not a member
    const NcclComm c = make(comm);
    all_.push_back(c);
    return c;
  }
  static std::set<std::pair<int, int>> used_channels(const TaskGraph& graph) {
    std::set<std::pair<int, int>> pairs;
    for (const Task& t : graph.tasks())
      if (t.kind == OpKind::Send) pairs.insert({t.device, t.peer});
    return pairs;
  }
  void wait(std::unique_ptr<Request> request) {
    while (!request->done()) control_->wait_for_progress(0.001);
  }

  std::unique_ptr<Transport> control_;
  int rank_, size_;
  bool aborted_ = false;
  std::vector<std::unique_ptr<Communicator>> lanes_;
  std::vector<NcclComm> all_;  ///< every communicator this rank holds, for destroy and abort
};

}  // namespace

int local_device(int rank) {
  int local = rank;
  for (const char* variable : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"})
    if (const char* value = std::getenv(variable)) {
      local = std::atoi(value);
      break;
    }
  const int gpus = device_count();
  return gpus > 0 ? local % gpus : 0;
}

std::unique_ptr<Transport> make_nccl_transport(std::unique_ptr<Transport> control, const TaskGraph& graph, int device) {
  return std::make_unique<NcclTransport>(std::move(control), graph, device);
}

}  // namespace pipesim::runtime::cuda
