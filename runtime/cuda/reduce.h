#pragma once
/// Element-wise kernels the communicators and the backend need beyond cuda/kernels.h: the reductions
/// of the in-process communicator's collectives, and scaling.
#include <cstddef>

#include <cuda_runtime_api.h>

#include "task_graph.h"
#include "tensor.h"

namespace pipesim::runtime::cuda {

/// into[i] = op(into[i], from[i]), fp32 math; Sum or Max.
void combine(void* into, const void* from, std::size_t count, DType dtype, ReduceOp op, cudaStream_t stream);
/// data[i] *= factor.
void scale(void* data, float factor, std::size_t count, DType dtype, cudaStream_t stream);

}  // namespace pipesim::runtime::cuda
