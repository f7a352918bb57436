#pragma once
/// The CPU backend: fp32 kernels (cpu/kernels.h, cpu/vocab.h) on host memory, one rank's part of the
/// model (partition.h). The reference every other backend is checked against.
#include <memory>

#include "backend.h"
#include "cpu/model.h"
#include "layout.h"
#include "partition.h"

namespace pipesim::runtime {

/// Makes the process keep the host memory it frees for its next allocations (glibc: no heap trimming,
/// blocks up to 32 MiB from the heap rather than mmap). Otherwise freed activations go back to the
/// kernel and whichever op allocates them next pays a page fault per 4 KiB page in its measured
/// time -- how many depends on the schedule's order of allocations and frees, not on the op's work,
/// so two schedules' profiles would disagree about the same layer. A CUDA run's device pool is kept
/// between steps for the same reason. make_cpu_backend calls it; once per process. (The pipesim
/// executable already keeps every block in the heap from start-up, tools/huge_pages.cpp; this is
/// for other hosts of the runtime, such as the tests.)
void keep_freed_host_memory();

/// A rank's part of the model (partition.h); `tp` its tensor-parallel group when part.tp > 1, which
/// must outlive the backend (its buffers are host memory, the CPU layers' spans). `microbatch_weight`:
/// a microbatch's share of the step's loss (1 / (microbatches · replicas)), by which the backward
/// weighs each mixture-of-experts layer's load-balancing loss, as the LM head weighs the loss. `ep`:
/// its expert-parallel group when part.ep > 1, which must outlive the backend likewise.
std::unique_ptr<Backend> make_cpu_backend(const ModelShape& shape, const Layout& layout, const RankPart& part,
                                          std::uint64_t seed, TensorParallel* tp = nullptr,
                                          float microbatch_weight = 1.0f, ExpertParallel* ep = nullptr);

}  // namespace pipesim::runtime
