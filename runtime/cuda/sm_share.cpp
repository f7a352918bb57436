// Green contexts are driver-API calls. They are looked up through the runtime
// (cudaGetDriverEntryPointByVersion) rather than linked, so pipesim does not need libcuda to start:
// on a machine without a GPU driver it still runs, and says "no CUDA device" when asked for one.
#include "cuda/sm_share.h"

#include <cuda.h>
#include <fmt/format.h>

#include <utility>
#include <vector>

#include "cuda/check.h"

namespace pipesim::runtime::cuda {
namespace {

constexpr unsigned kGreenContextsSince = 12050;  // CUDA 12.5: cuGreenCtxStreamCreate's first version

template <class F>
F driver_function(const char* name) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &function, kGreenContextsSince, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<F>(function);
}

void check(CUresult status, const char* call) {
  if (status == CUDA_SUCCESS) return;
  throw_cuda_error(__FILE__, __LINE__, call, fmt::format("CUresult {}", int(status)));
}

struct Driver {
  decltype(&cuDeviceGetDevResource) get_resource = driver_function<decltype(&cuDeviceGetDevResource)>("cuDeviceGetDevResource");
  decltype(&cuDevSmResourceSplitByCount) split = driver_function<decltype(&cuDevSmResourceSplitByCount)>("cuDevSmResourceSplitByCount");
  decltype(&cuDevResourceGenerateDesc) describe = driver_function<decltype(&cuDevResourceGenerateDesc)>("cuDevResourceGenerateDesc");
  decltype(&cuGreenCtxCreate) create = driver_function<decltype(&cuGreenCtxCreate)>("cuGreenCtxCreate");
  decltype(&cuGreenCtxDestroy) destroy = driver_function<decltype(&cuGreenCtxDestroy)>("cuGreenCtxDestroy");
  decltype(&cuGreenCtxStreamCreate) stream = driver_function<decltype(&cuGreenCtxStreamCreate)>("cuGreenCtxStreamCreate");
  bool complete() const { return get_resource && split && describe && create && destroy && stream; }
};

const Driver& driver() {
  static const Driver d;
  return d;
}

}  // namespace

SmShare::SmShare(int device, int ranks, int index) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  description_ = fmt::format("{} SMs (whole GPU)", sms);
  if (ranks <= 1) return;
  const Driver& d = driver();
  if (!d.complete()) {
    description_ = fmt::format("{} SMs shared by {} ranks (this driver has no green contexts)", sms, ranks);
    return;
  }
  CUdevResource all{};
  check(d.get_resource(CUdevice(device), &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource");
  // Equal groups, each a multiple of the co-scheduling alignment (8 SMs on Hopper).
  const unsigned align = std::max(1u, all.sm.smCoscheduledAlignment);
  const unsigned per_rank = std::max(all.sm.minSmPartitionSize, all.sm.smCount / unsigned(ranks) / align * align);
  std::vector<CUdevResource> groups(static_cast<std::size_t>(ranks));
  unsigned made = unsigned(ranks);
  CUdevResource remaining{};
  check(d.split(groups.data(), &made, &all, &remaining, 0, per_rank), "cuDevSmResourceSplitByCount");
  if (made < unsigned(ranks))  // running them unsplit would silently measure something else
    throw CudaError(fmt::format("{} ranks cannot share GPU {}: an equal share of its {} SMs is a group of at least {} "
                                "SMs, so at most {} ranks fit on it; run fewer ranks per GPU (fewer pipeline devices, "
                                "or more GPUs)",
                                ranks, device, all.sm.smCount, per_rank, made));
  CUdevResourceDesc desc = nullptr;
  check(d.describe(&desc, &groups[std::size_t(index)], 1), "cuDevResourceGenerateDesc");
  CUgreenCtx context = nullptr;
  check(d.create(&context, desc, CUdevice(device), CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
  context_ = context;
  sm_count_ = int(groups[std::size_t(index)].sm.smCount);
  description_ = fmt::format("{} of {} SMs (green context {} of {})", groups[std::size_t(index)].sm.smCount, sms, index + 1, ranks);
}

SmShare::~SmShare() {
  if (context_) static_cast<void>(driver().destroy(static_cast<CUgreenCtx>(context_)));
}

SmShare::SmShare(SmShare&& other) noexcept
    : context_(std::exchange(other.context_, nullptr)),
      sm_count_(std::exchange(other.sm_count_, 0)),
      description_(std::move(other.description_)) {}

cudaStream_t SmShare::make_stream() {
  cudaStream_t stream = nullptr;
  if (!context_) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return stream;
  }
  CUstream s = nullptr;
  check(driver().stream(&s, static_cast<CUgreenCtx>(context_), CU_STREAM_NON_BLOCKING, 0), "cuGreenCtxStreamCreate");
  return s;
}

}  // namespace pipesim::runtime::cuda
