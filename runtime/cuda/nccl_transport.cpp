// NCCL under MPI: one process per GPU, or, for testing, several processes on one GPU over sockets
// (NcclOptions::share_gpu). Every NCCL call is enqueued on its communicator's own stream and completes
// when the event recorded after it has fired; a communicator that reports an error fails the request,
// and an abort (a failing rank, or the executor's --timeout) calls ncclCommAbort on every
// communicator of this rank before the MPI job is ended.
//
// Groups (the pipelines and the data-parallel groups of a run with replicas) are transports of
// their own: an MPI subgroup for their control lane and for handing out the group's NCCL unique ids,
// and NCCL communicators made from those ids by the members only.
//
// Communicators are non-blocking (ncclConfig_t::blocking = 0): creating one, and the first call on a
// lane (NCCL connects peers on first use), return at once and finish in NCCL's own threads, so a
// rank whose peer died or hangs is never stuck inside NCCL: creation is polled against the run's
// --timeout, and a call still being enqueued is polled by its request like the transfer itself.
#include <fmt/format.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <deque>
#include <set>
#include <shared_mutex>
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

/// One NCCL call waiting to be made, being enqueued, or enqueued on its communicator's stream.
struct NcclCall {
  std::function<ncclResult_t()> issue;  ///< the call itself, made once
  enum class State : std::uint8_t { Queued, InProgress, Enqueued, Failed } state = State::Queued;
  ncclResult_t error = ncclSuccess;  ///< when Failed
  cudaEvent_t event = nullptr;       ///< recorded on the stream once the call has reached it
  NcclCall() { CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
  NcclCall(const NcclCall&) = delete;
  NcclCall& operator=(const NcclCall&) = delete;
  ~NcclCall() { static_cast<void>(cudaEventDestroy(event)); }
};

/// A non-blocking communicator, its stream, and the calls asked of it in order. NCCL's non-blocking
/// protocol: a call that returns ncclInProgress is still being enqueued (or the communicator still
/// connecting), and no other call may be made on the communicator until ncclCommGetAsyncError says
/// it is no longer in progress. So calls are made here one at a time, in the order they were asked
/// for; a later one waits in the queue, and whichever request is polled moves the queue on (the
/// requests of one op are polled in any order, and never block).
struct NcclComm {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::mutex mutex;  ///< guards the queue: the compute thread (tensor parallelism) and the communication thread both call
  std::deque<std::shared_ptr<NcclCall>> queued;
  std::shared_ptr<NcclCall> in_progress;

  /// Settles the call in progress and makes queued calls while the communicator takes them. The
  /// caller holds Communicators::lock shared and has checked that the run was not aborted.
  void pump() {
    std::lock_guard guard(mutex);
    if (in_progress) {
      ncclResult_t state = ncclSuccess;
      if (const ncclResult_t polled = ncclCommGetAsyncError(comm, &state); polled != ncclSuccess) state = polled;
      if (state == ncclInProgress) return;
      settle(*in_progress, state);
      in_progress.reset();
    }
    while (!queued.empty()) {
      std::shared_ptr<NcclCall> call = std::move(queued.front());
      queued.pop_front();
      const ncclResult_t issued = call->issue();
      if (issued == ncclInProgress) {
        call->state = NcclCall::State::InProgress;
        in_progress = std::move(call);
        return;
      }
      settle(*call, issued);
    }
  }

 private:
  void settle(NcclCall& call, ncclResult_t result) const {
    if (result != ncclSuccess) {
      call.state = NcclCall::State::Failed, call.error = result;
      return;
    }
    // Recorded only now: recorded while the call was in progress, it would fire before the
    // transfer was launched.
    CUDA_CHECK(cudaEventRecord(call.event, stream));
    call.state = NcclCall::State::Enqueued;
  }
};

/// What a process's transports share: the world's and its groups' communicators, so that an abort
/// through any of them (the executor aborts the world) reaches every communicator of the rank and
/// every request sees it.
///
/// `lock` keeps an abort from freeing a communicator under a call: every NCCL call on a
/// communicator after its creation (issuing, polling, finalizing) holds it shared and first checks
/// `aborted`; abort() takes it exclusively, so it waits for the calls in flight (none of which
/// blocks: they are non-blocking calls and polls) and no call starts after it.
struct Communicators {
  std::atomic<bool> aborted{false};
  std::shared_mutex lock;
  std::vector<ncclComm_t> all;  ///< guarded by `lock`: groups are made and dropped on the launching thread
  void add(ncclComm_t comm) {
    std::unique_lock guard(lock);
    all.push_back(comm);
  }
  void remove(ncclComm_t comm) {
    std::unique_lock guard(lock);
    all.erase(std::remove(all.begin(), all.end(), comm), all.end());
  }
  /// ncclCommAbort on every communicator, once. ncclCommAbort stops the communicator's kernels, so
  /// after it returns no NCCL operation of this rank reads or writes the buffers it was given.
  void abort() {
    std::unique_lock guard(lock);
    if (aborted.exchange(true)) return;
    for (const ncclComm_t comm : all) static_cast<void>(ncclCommAbort(comm));
  }
};

class NcclRequest final : public Request {
 public:
  /// Queues `issue` on the communicator and makes it at once if the communicator takes it.
  /// An error NCCL returns for this very call is this rank's: a CudaError, which the executor
  /// reports with the op.
  NcclRequest(std::shared_ptr<NcclComm> c, std::function<ncclResult_t()> issue, Communicators& shared)
      : c_(std::move(c)), shared_(shared), call_(std::make_shared<NcclCall>()) {
    call_->issue = std::move(issue);
    std::shared_lock guard(shared_.lock);
    if (shared_.aborted.load()) throw CommError("the run was aborted");
    {
      std::lock_guard queue(c_->mutex);
      c_->queued.push_back(call_);
    }
    c_->pump();
    if (call_->state == NcclCall::State::Failed)
      throw CudaError(fmt::format("the NCCL call failed: NCCL error {} ({}): {}", int(call_->error),
                                  ncclGetErrorString(call_->error), ncclGetLastError(c_->comm)));
  }
  bool done() override {
    std::shared_lock guard(shared_.lock);  // the communicator stays alive until this poll returns
    if (shared_.aborted.load()) throw CommError("the run was aborted");
    c_->pump();
    if (call_->state == NcclCall::State::Failed) fail(call_->error);
    ncclResult_t async = ncclSuccess;
    if (call_->state == NcclCall::State::Enqueued) {
      const cudaError_t status = cudaEventQuery(call_->event);
      if (status == cudaSuccess) return true;
      if (status != cudaErrorNotReady) CUDA_CHECK(status);
    }
    NCCL_CHECK(ncclCommGetAsyncError(c_->comm, &async));
    if (async != ncclSuccess && async != ncclInProgress) fail(async);
    return false;
  }

 private:
  [[noreturn]] static void fail(ncclResult_t result) {
    throw CommError(fmt::format("NCCL reports {} ({}); a peer may have failed", int(result), ncclGetErrorString(result)));
  }
  std::shared_ptr<NcclComm> c_;
  Communicators& shared_;  ///< outlives every request: the transports hold it, and they outlive the run
  std::shared_ptr<NcclCall> call_;
};

/// A collective lane: one communicator over all ranks.
class CollectiveLane final : public Communicator {
 public:
  CollectiveLane(std::shared_ptr<NcclComm> c, int ranks, Communicators& shared)
      : c_(std::move(c)), ranks_(ranks), shared_(shared) {}
  std::unique_ptr<Request> send(Buffer, int) override { throw std::logic_error("send on a collective lane"); }
  std::unique_ptr<Request> recv(Buffer, int) override { throw std::logic_error("recv on a collective lane"); }
  std::unique_ptr<Request> all_reduce(Buffer b, ReduceOp op) override {
    return call([=, c = c_.get()] {
      return ncclAllReduce(b.data, b.data, b.count, nccl_type(b.dtype), nccl_op(op), c->comm, c->stream);
    });
  }
  std::unique_ptr<Request> broadcast(Buffer b, int root) override {
    return call([=, c = c_.get()] { return ncclBroadcast(b.data, b.data, b.count, nccl_type(b.dtype), root, c->comm, c->stream); });
  }
  std::unique_ptr<Request> reduce(Buffer b, ReduceOp op, int root) override {
    return call([=, c = c_.get()] {
      return ncclReduce(b.data, b.data, b.count, nccl_type(b.dtype), nccl_op(op), root, c->comm, c->stream);
    });
  }
  std::unique_ptr<Request> all_gather(Buffer in, Buffer out) override {
    return call([=, c = c_.get()] { return ncclAllGather(in.data, out.data, in.count, nccl_type(in.dtype), c->comm, c->stream); });
  }
  std::unique_ptr<Request> reduce_scatter(Buffer in, Buffer out, ReduceOp op) override {
    return call([=, c = c_.get()] {
      return ncclReduceScatter(in.data, out.data, out.count, nccl_type(in.dtype), nccl_op(op), c->comm, c->stream);
    });
  }
  /// NCCL has no all-to-all call: its documented pattern is a send and a receive per peer between
  /// ncclGroupStart and ncclGroupEnd, which NCCL launches as one operation. The group is one call
  /// here, so the request's event is recorded after all of it. Pairs with nothing to exchange are
  /// left out (both sides' counts are 0).
  std::unique_ptr<Request> all_to_all(Buffer in, std::span<const std::size_t> send_counts, Buffer out,
                                      std::span<const std::size_t> recv_counts) override {
    check_all_to_all(in, send_counts, out, recv_counts, ranks_);
    return call([=, c = c_.get(), ranks = ranks_, sends = std::vector(send_counts.begin(), send_counts.end()),
                 receives = std::vector(recv_counts.begin(), recv_counts.end())] {
      if (const ncclResult_t started = ncclGroupStart(); started != ncclSuccess) return started;
      const std::size_t width = size_of(in.dtype);
      std::size_t sent = 0, received = 0;  // values before the peer's block
      ncclResult_t result = ncclSuccess;
      for (int peer = 0; peer < ranks && result == ncclSuccess; ++peer) {
        const std::size_t to = sends[std::size_t(peer)], from = receives[std::size_t(peer)];
        const std::byte* const block = static_cast<const std::byte*>(in.data) + sent * width;
        std::byte* const into = static_cast<std::byte*>(out.data) + received * width;
        if (to) result = ncclSend(block, to, nccl_type(in.dtype), peer, c->comm, c->stream);
        if (from && result == ncclSuccess) result = ncclRecv(into, from, nccl_type(out.dtype), peer, c->comm, c->stream);
        sent += to, received += from;
      }
      const ncclResult_t ended = ncclGroupEnd();  // also after a failure: the group must be closed
      return result != ncclSuccess ? result : ended;
    });
  }

 private:
  std::unique_ptr<Request> call(std::function<ncclResult_t()> issue) {
    return std::make_unique<NcclRequest>(c_, std::move(issue), shared_);
  }
  std::shared_ptr<NcclComm> c_;
  int ranks_;
  Communicators& shared_;
};

/// The point-to-point lane: a 2-rank communicator per channel (sender, receiver), rank 0 the sender,
/// each on its own stream. A send never queues behind a receive from the same peer, so calls need no
/// ncclGroupStart/End around them (and are not grouped: a request's event is recorded right after
/// its call, which inside a group would fire before the transfer is launched).
class ChannelLane final : public Communicator {
 public:
  ChannelLane(int rank, std::map<std::pair<int, int>, std::shared_ptr<NcclComm>> channels, Communicators& shared)
      : rank_(rank), channels_(std::move(channels)), shared_(shared) {}
  std::unique_ptr<Request> send(Buffer b, int peer) override {
    const std::shared_ptr<NcclComm>& c = channel(rank_, peer);
    return std::make_unique<NcclRequest>(
        c, [=, c = c.get()] { return ncclSend(b.data, b.count, nccl_type(b.dtype), 1, c->comm, c->stream); }, shared_);
  }
  std::unique_ptr<Request> recv(Buffer b, int peer) override {
    const std::shared_ptr<NcclComm>& c = channel(peer, rank_);
    return std::make_unique<NcclRequest>(
        c, [=, c = c.get()] { return ncclRecv(b.data, b.count, nccl_type(b.dtype), 0, c->comm, c->stream); }, shared_);
  }
  std::unique_ptr<Request> all_reduce(Buffer, ReduceOp) override { throw std::logic_error("all-reduce on the p2p lane"); }
  std::unique_ptr<Request> broadcast(Buffer, int) override { throw std::logic_error("broadcast on the p2p lane"); }
  std::unique_ptr<Request> reduce(Buffer, ReduceOp, int) override { throw std::logic_error("reduce on the p2p lane"); }
  std::unique_ptr<Request> all_gather(Buffer, Buffer) override { throw std::logic_error("all-gather on the p2p lane"); }
  std::unique_ptr<Request> reduce_scatter(Buffer, Buffer, ReduceOp) override {
    throw std::logic_error("reduce-scatter on the p2p lane");
  }
  std::unique_ptr<Request> all_to_all(Buffer, std::span<const std::size_t>, Buffer,
                                      std::span<const std::size_t>) override {
    throw std::logic_error("all-to-all on the p2p lane");
  }

 private:
  const std::shared_ptr<NcclComm>& channel(int from, int to) const {
    const auto it = channels_.find({from, to});
    if (it == channels_.end()) throw std::logic_error(fmt::format("no channel from rank {} to rank {} in this graph", from, to));
    return it->second;
  }
  int rank_;
  std::map<std::pair<int, int>, std::shared_ptr<NcclComm>> channels_;
  Communicators& shared_;
};

/// --ranks-share-gpu: what lets NCCL accept several processes on one GPU. NCCL refuses two ranks of
/// a communicator on one (host, GPU) ("Duplicate GPU detected"); a host identity per rank makes
/// each rank a node of its own, and with CUDA IPC, shared memory and InfiniBand off they talk over
/// TCP on the loopback interface. Set before this process's first NCCL call, which reads them once.
/// For testing the NCCL path on one GPU: sockets through host memory are far slower than NVLink.
void share_gpu_environment(int rank) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::pair<const char*, std::string> settings[] = {
      {"NCCL_HOSTID", fmt::format("{}-pipesim-rank-{}", host, rank)},
      {"NCCL_P2P_DISABLE", "1"},
      {"NCCL_SHM_DISABLE", "1"},
      {"NCCL_IB_DISABLE", "1"},
      {"NCCL_NET", "Socket"},
      {"NCCL_SOCKET_IFNAME", "lo"},  // every rank is on this host
      {"NCCL_NVLS_ENABLE", "0"},
  };
  for (const auto& [name, value] : settings)
    if (setenv(name, value.c_str(), 1) != 0)
      throw std::runtime_error(fmt::format("--ranks-share-gpu: could not set {}={}: {}", name, value, std::strerror(errno)));
}

class NcclTransport final : public Transport {
 public:
  /// The world: every process of the MPI job. It makes the graph's point-to-point channels when it is
  /// the pipeline (one rank per graph device); with data-parallel replicas each pipeline is a group.
  NcclTransport(std::unique_ptr<Transport> control, const TaskGraph& graph, int device, const NcclOptions& options)
      : NcclTransport(std::move(control), graph, device, options, std::make_shared<Communicators>()) {
    if (options.share_gpu) share_gpu_environment(rank_);
    CUDA_CHECK(cudaSetDevice(device));
    if (!options.share_gpu) refuse_shared_gpus(device);
    connect(control_->size() == graph.devices());
  }
  ~NcclTransport() override {
    lanes_.clear();
    for (const std::shared_ptr<NcclComm>& c : all_) {
      destroy(c->comm);
      shared_->remove(c->comm);
      if (c->stream) static_cast<void>(cudaStreamDestroy(c->stream));
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Communicator& lane(int lane) override {
    return lane == kControlLane ? control_->control() : *lanes_.at(std::size_t(lane));
  }
  /// Communicators made from fresh unique ids among the members, over an MPI subgroup that hands the
  /// ids out: collective over the members only, as Transport::subgroup promises. (ncclCommSplit would
  /// share the parent's resources, but every rank of the parent must take part in each split, which
  /// the interface does not ask of the ranks outside the group.) A pipeline gets the graph's
  /// point-to-point channels, numbered by its ranks, which are the graph's devices.
  std::unique_ptr<Transport> subgroup(const std::vector<int>& members, GroupUse use) override {
    CUDA_CHECK(cudaSetDevice(device_));  // the group's communicators and streams are on this rank's GPU
    auto group = std::unique_ptr<NcclTransport>(
        new NcclTransport(control_->subgroup(members, use), graph_, device_, options_, shared_));
    group->connect(use == GroupUse::Pipeline);
    return group;
  }
  void wait_for_progress(double seconds) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(seconds, 50e-6)));
  }
  void wake() override {}
  bool aborted() override { return shared_->aborted.load(); }
  void abort(const std::string& why) override {
    shared_->abort();
    control_->abort(why);  // MPI: prints the reason and ends every process
  }

 private:
  using Clock = std::chrono::steady_clock;

  /// The world's and its groups' common part; the device is already current (the world set it).
  NcclTransport(std::unique_ptr<Transport> control, const TaskGraph& graph, int device, const NcclOptions& options,
                std::shared_ptr<Communicators> shared)
      : control_(std::move(control)), graph_(graph), device_(device), options_(options), rank_(control_->rank()),
        size_(control_->size()), timeout_s_(options.timeout_s), shared_(std::move(shared)) {}

  /// Makes the collective lanes and, with `channels` (a pipeline), the graph's point-to-point
  /// channels between this transport's ranks.
  void connect(bool channels) {
    const std::set<std::pair<int, int>> used = channels ? used_channels(graph_) : std::set<std::pair<int, int>>{};
    const std::vector<ncclUniqueId> ids = unique_ids(kCollectiveLanes + int(used.size()));
    try {
      // Every rank creates its communicators in the same order (lanes, then channels in order, each
      // rank skipping those it is not in): each waits only on peers that have created every
      // communicator before it, so creation never deadlocks.
      for (int lane = 0; lane < kCollectiveLanes; ++lane)
        lanes_.push_back(std::make_unique<CollectiveLane>(
            create(ids[std::size_t(lane)], size_, rank_, fmt::format("collective lane {}", lane)), size_, *shared_));
      std::map<std::pair<int, int>, std::shared_ptr<NcclComm>> made;
      std::size_t i = kCollectiveLanes;
      for (const auto& [from, to] : used) {
        const ncclUniqueId& id = ids[i++];
        if (rank_ == from || rank_ == to)  // rank 0 of the channel is the sender
          made[{from, to}] = create(id, 2, rank_ == from ? 0 : 1,
                                    fmt::format("the point-to-point channel from rank {} to rank {}", from, to));
      }
      lanes_.push_back(std::make_unique<ChannelLane>(rank_, std::move(made), *shared_));
    } catch (...) {
      shared_->abort();  // a communicator still connecting would keep NCCL's threads waiting
      throw;
    }
  }
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
            "--backend cuda without mpirun; or, to test the NCCL path on one GPU, add --ranks-share-gpu (NCCL "
            "over sockets: slow)",
            std::min(r, rank_), std::max(r, rank_), bus, host));
  }
  /// `count` NCCL unique ids made on rank 0, handed to every rank over the control lane.
  std::vector<ncclUniqueId> unique_ids(int count) {
    std::vector<ncclUniqueId> ids(static_cast<std::size_t>(count));
    if (rank_ == 0)
      for (ncclUniqueId& id : ids) NCCL_CHECK(ncclGetUniqueId(&id));
    constexpr std::size_t kWords = (sizeof(ncclUniqueId) + sizeof(double) - 1) / sizeof(double);
    std::vector<double> words(kWords * ids.size(), 0.0);  // the ids' bytes, carried as doubles
    for (std::size_t i = 0; i < ids.size(); ++i) std::memcpy(&words[i * kWords], &ids[i], sizeof(ncclUniqueId));
    wait(control_->control().broadcast(host_buffer(std::span(words)), 0));
    for (std::size_t i = 0; i < ids.size(); ++i) std::memcpy(&ids[i], &words[i * kWords], sizeof(ncclUniqueId));
    return ids;
  }
  /// One non-blocking communicator, polled until NCCL has connected it, for --timeout at most: a
  /// peer that died or hangs before creating its side fails this rank here, naming `what`.
  std::shared_ptr<NcclComm> create(const ncclUniqueId& id, int ranks, int rank, const std::string& what) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    // NCCL_COMM_BLOCKING in the environment is NCCL's own choice and wins (creation then waits
    // without the timeout); otherwise non-blocking, so a dead peer is found within --timeout.
    if (!std::getenv("NCCL_COMM_BLOCKING")) config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t state = ncclCommInitRankConfig(&comm, ranks, id, rank, &config);
    if (comm) {
      all_.push_back(std::make_shared<NcclComm>());
      all_.back()->comm = comm;
      shared_->add(comm);  // from here on, abort() reaches it
    }
    state = settle(comm, state);
    if (state == ncclInProgress)
      throw std::runtime_error(fmt::format(
          "no progress for {:g} s creating the NCCL communicator of {}: a peer died or hangs before creating its "
          "side (--timeout sets the limit)",
          timeout_s_, what));
    if (state != ncclSuccess)
      throw std::runtime_error(fmt::format("creating the NCCL communicator of {} failed: NCCL error {} ({}): {}{}", what,
                                           int(state), ncclGetErrorString(state), ncclGetLastError(comm),
                                           state == ncclInvalidUsage ? " (several ranks on one GPU need --ranks-share-gpu)" : ""));
    CUDA_CHECK(cudaStreamCreateWithFlags(&all_.back()->stream, cudaStreamNonBlocking));
    return all_.back();
  }
  /// ncclCommDestroy of a healthy communicator, after the non-blocking finalize has flushed it;
  /// under the shared lock, so that an abort from another thread waits for it or it sees the abort.
  void destroy(ncclComm_t comm) const {
    std::shared_lock guard(shared_->lock);
    if (shared_->aborted.load()) return;  // ncclCommAbort has freed it
    const ncclResult_t state = settle(comm, ncclCommFinalize(comm));
    static_cast<void>(state == ncclSuccess ? ncclCommDestroy(comm) : ncclCommAbort(comm));
  }
  /// A non-blocking call's outcome: `state` polled while NCCL reports it in progress, for --timeout
  /// at most (then still ncclInProgress). A failure to poll is returned as the outcome.
  ncclResult_t settle(ncclComm_t comm, ncclResult_t state) const {
    const auto start = Clock::now();
    while (state == ncclInProgress && std::chrono::duration<double>(Clock::now() - start).count() <= timeout_s_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (const ncclResult_t polled = ncclCommGetAsyncError(comm, &state); polled != ncclSuccess) return polled;
    }
    return state;
  }
  static std::set<std::pair<int, int>> used_channels(const TaskGraph& graph) {
    std::set<std::pair<int, int>> pairs;
    for (const Task& t : graph.tasks())
      if (t.kind == OpKind::Send) pairs.insert({t.device, t.peer});
    return pairs;
  }
  /// A control-lane request, for --timeout at most: a peer that died before it fails this rank.
  void wait(std::unique_ptr<Request> request) {
    const auto start = Clock::now();
    while (!request->done()) {
      if (std::chrono::duration<double>(Clock::now() - start).count() > timeout_s_)
        throw std::runtime_error(
            fmt::format("no progress for {:g} s exchanging NCCL set-up over MPI (--timeout sets the limit)", timeout_s_));
      control_->wait_for_progress(0.001);
    }
  }

  std::unique_ptr<Transport> control_;
  const TaskGraph& graph_;  ///< the caller keeps it alive for the run
  int device_;
  NcclOptions options_;
  int rank_, size_;
  double timeout_s_;
  std::shared_ptr<Communicators> shared_;
  std::vector<std::unique_ptr<Communicator>> lanes_;
  std::vector<std::shared_ptr<NcclComm>> all_;  ///< the communicators of this transport, for destroy
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

std::unique_ptr<Transport> make_nccl_transport(std::unique_ptr<Transport> control, const TaskGraph& graph, int device,
                                               const NcclOptions& options) {
  return std::make_unique<NcclTransport>(std::move(control), graph, device, options);
}

}  // namespace pipesim::runtime::cuda
