#include "gpu_layer_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench_util.h"
#include "cost_model.h"
#include "executor.h"
#include "layout.h"
#include "partition.h"

namespace pipesim {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// A one-layer, one-device model of the shape: what the backend is built for.
Config one_layer_config(const LayerBenchShape& s) {
  Config c;
  c.source = "gpu-bench";
  c.model = {.layers = 1, .hidden = s.hidden, .heads = s.heads, .kv_heads = s.heads, .ffn_hidden = s.ffn,
             .seq_len = s.seq, .vocab = 1024, .micro_batch_size = s.micro_batch, .mlp = MlpKind::Gelu,
             .tied_embeddings = false};
  c.parallel.microbatches = 1;
  c.hardware = *hardware_preset("h100-sxm");
  return c;
}

}  // namespace

int bench_layer(const LayerBenchShape& shape, const std::string& dtype, int iterations) {
  const Config config = one_layer_config(shape);
  if (std::optional<FieldError> e = check_config(config)) {
    fmt::print(stderr, "gpu-bench: error: {}: {}\n", e->path, e->message);
    return 1;
  }
  Result<Layout> layout =
      make_layout(config, Placement::Loop, LayerSplit::Even, stage_weights(config), VocabPlacement::OnStages);
  if (!layout.ok()) {
    fmt::print(stderr, "gpu-bench: error: {}\n", layout.error().message);
    return 1;
  }
  const TaskGraph no_graph;  // the backend is built from the layout and the shape alone
  const runtime::Job job{.graph = no_graph, .layout = layout.value(), .shape = runtime::model_shape(config),
                         .microbatches = config.parallel.microbatches, .training = config.training};
  runtime::RunOptions options;
  options.backend = runtime::BackendKind::Cuda;
  options.dtype = dtype == "fp32" ? runtime::DType::F32 : runtime::DType::BF16;
  try {
    std::unique_ptr<runtime::Backend> backend = runtime::make_backend(options, job, 0);
    const int n = shape.seq * shape.micro_batch;
    runtime::Batch batch;
    for (int i = 0; i < n; ++i) batch.tokens.push_back(i % 1024), batch.targets.push_back((i * 31 + 7) % 1024);
    backend->set_batches({&batch, 1});
    const runtime::Tensor input = backend->embed(0);
    std::vector<double> forward_ms, step_ms;
    for (int i = 0; i < iterations + 2; ++i) {
      runtime::Tensor x = backend->allocate(input.count(), input.dtype());
      backend->copy(input, 0, x, 0, input.count());
      backend->synchronize();
      const auto start = Clock::now();
      std::unique_ptr<runtime::Activations> cache = backend->layer_forward(0, x);
      backend->synchronize();
      const auto forwarded = Clock::now();
      backend->layer_backward(0, *cache, x, false);  // the output as its own gradient: any nonzero values do
      backend->synchronize();
      const auto end = Clock::now();
      if (i < 2) continue;
      forward_ms.push_back(std::chrono::duration<double, std::milli>(forwarded - start).count());
      step_ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    }
    fmt::print("one layer (h {}, {} heads, FFN {}, seq {}, micro-batch {}, {}): forward {:.3f} ms, forward + "
               "backward {:.3f} ms (medians of {}; {})\n",
               shape.hidden, shape.heads, shape.ffn, shape.seq, shape.micro_batch, dtype, median(forward_ms),
               median(step_ms), iterations, gemm_choice());
  } catch (const std::exception& e) {
    fmt::print(stderr, "gpu-bench: error: {}\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace pipesim
