#pragma once
/// One transformer layer's forward and backward through the CUDA backend, as the runtime runs it:
/// the figure to set beside a framework's layer time.
#include <string>

namespace pipesim {

struct LayerBenchShape {
  int hidden = 4096, heads = 32, ffn = 16384, seq = 2048, micro_batch = 1;
};

/// Prints the median forward and forward + backward times over `iterations` (after 2 untimed);
/// returns the process exit status. `dtype` is "bf16" or "fp32".
int bench_layer(const LayerBenchShape& shape, const std::string& dtype, int iterations);

}  // namespace pipesim
