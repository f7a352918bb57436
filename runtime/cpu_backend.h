#pragma once
/// The CPU backend: fp32 kernels (cpu/kernels.h, cpu/vocab.h) on host memory, one rank's part of the
/// model (partition.h). The reference every other backend is checked against.
#include <memory>

#include "backend.h"
#include "layout.h"

namespace pipesim::runtime {

std::unique_ptr<Backend> make_cpu_backend(const cpu::ModelShape& shape, const Layout& layout, int rank,
                                          std::uint64_t seed);

}  // namespace pipesim::runtime
