#include <fmt/format.h>
#include <unistd.h>

#include <cmath>

#include "cpu/hash.h"
#include "measure.h"
#include "op_interpreter.h"
#include "partition.h"
#include "walker.h"

namespace pipesim::runtime {
namespace {

Batch make_batch(std::uint64_t seed, int step, int microbatch, int n, int vocab) {
  Batch b;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t key = cpu::splitmix64(seed ^ 0x5eedull) + (std::uint64_t(step) << 40) +
                              (std::uint64_t(microbatch) << 20) + std::uint64_t(i);
    const int token = int(cpu::splitmix64(key) % std::uint64_t(vocab));
    b.tokens.push_back(token);
    b.targets.push_back(int((std::int64_t(token) * 31 + 7) % vocab));
  }
  return b;
}

/// One rank's run: each step's batches, the walk over its ops, the loss and step time agreed by every
/// rank; then the check and the measurements.
Result<RunResult> run_steps(Transport& comm, Backend& backend, const Job& job, const RunOptions& options) {
  const int rank = comm.rank();
  OpInterpreter interpreter(job, rank, comm, backend, options.optimizer);
  StreamWalker walker(job.graph, rank, comm, backend, options);
  StepRecorder recorder(job.graph.size(), interpreter.buffers());
  const auto all_reduce = [&](std::span<float> values, ReduceOp op, const std::string& what) {
    wait_for(comm, comm.control().all_reduce(host_buffer(values), op), options.timeout_s, what);
  };
  RunResult result;
  try {
    for (int step = 0; step < options.steps; ++step) {
      std::vector<Batch> batches;
      for (int mb = 0; mb < job.microbatches; ++mb)
        batches.push_back(make_batch(options.seed, step, mb, job.shape.tokens(), job.shape.vocab));
      const bool checking = options.check && step == 0;
      std::optional<GradientCheck> check;
      if (checking) check.emplace(job.shape, options.seed, batches);
      interpreter.begin_step(batches, checking);
      recorder.clear(job.graph.size());
      std::vector<float> token{1.0f};
      all_reduce(token, ReduceOp::Sum, "the start-of-step barrier");
      const Clock::time_point epoch = Clock::now();
      walker.run_step(step, epoch, interpreter, recorder);
      const auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - epoch).count();
      std::vector<float> loss{float(interpreter.loss_part())}, time{float(elapsed)};
      all_reduce(loss, ReduceOp::Sum, "the loss all-reduce");
      all_reduce(time, ReduceOp::Max, "the step-time all-reduce");
      result.losses.push_back(loss[0]);
      result.step_ns.push_back(TimeNs(time[0]));
      if (checking) {
        std::vector<float> terms = check->error_terms(interpreter.take_gradients());
        all_reduce(terms, ReduceOp::Sum, "the gradient-check all-reduce");
        result.check = check->result(terms, loss[0], options);
      }
      if (rank == 0 && options.on_step) options.on_step(step, loss[0], TimeNs(time[0]));
    }
    recorder.move_into(result);
    gather_measurements(comm, job.graph, options.timeout_s, interpreter.buffers().peak(), interpreter.buffers().peak_op(),
                        backend.static_bytes(), result);
    return result;
  } catch (const CommError& e) {
    return Error{e.what()};
  } catch (const RankFailure& e) {
    comm.abort(e.what());
    return Error{e.what()};
  } catch (const std::exception& e) {  // e.g. out of memory: still end every rank, never hang them
    const std::string why = fmt::format("rank {} failed: {}", rank, e.what());
    comm.abort(why);
    return Error{why};
  }
}

}  // namespace

bool CheckResult::passed() const {
  const bool loss_ok = std::abs(loss - reference_loss) <= loss_tolerance * std::abs(reference_loss);
  return loss_ok && (grad_tolerance == 0 || max_grad_rel_err <= grad_tolerance);
}

Bytes machine_memory_bytes() { return Bytes(sysconf(_SC_PHYS_PAGES)) * Bytes(sysconf(_SC_PAGE_SIZE)); }

Status check_runnable(const Config& c, const RunOptions& options) {
  if (c.parallel.tp != 1)
    return Error{fmt::format("{}: parallel.tp: the runtime runs each stage on one device; set parallel.tp to 1", c.source)};
  if (c.parallel.dp != 1)
    return Error{fmt::format("{}: parallel.dp: the runtime runs one pipeline replica; set parallel.dp to 1", c.source)};
  if (c.parallel.cp != 1)
    return Error{fmt::format("{}: parallel.cp: the runtime runs each stage on one device; set parallel.cp to 1", c.source)};
  // Selective recomputation rebuilds attention scores, which fused attention never keeps (the graph
  // then has no R) and the runtime's unfused CPU attention always keeps.
  if (c.training.recompute_granularity == Recompute::Selective && !c.precision.flash_attention)
    return Error{fmt::format("{}: training.recompute_granularity: selective recomputation without flash attention "
                             "recomputes attention scores, which the runtime keeps; use \"full\" or \"none\", or set "
                             "precision.flash_attention to true (then selective recomputation has no R op)",
                             c.source)};
  const bool llama = c.model.mlp == MlpKind::SwiGlu, grouped = c.model.key_value_heads() != c.model.heads;
  if (options.backend == BackendKind::Cuda && (llama || grouped))
    return Error{fmt::format("{}: model: the CUDA backend runs GPT layers with multi-head attention only; run Llama-family "
                             "layers (model.mlp \"swiglu\") or grouped-query attention (model.kv_heads < model.heads) "
                             "with --backend cpu, or set model.mlp to \"gelu\" and model.kv_heads to {}",
                             c.source, c.model.heads)};
  if (llama && (c.model.hidden / c.model.heads) % 2 != 0)
    return Error{fmt::format("{}: model.hidden: rotary embeddings turn pairs of a head's {} dimensions; make "
                             "model.hidden / model.heads even",
                             c.source, c.model.hidden / c.model.heads)};
  // Weights and gradients of every rank plus the activations of every microbatch in flight, fp32.
  const cpu::ModelShape s = model_shape(c);
  const double n = double(s.tokens()), h = s.hidden;
  const double qkv = s.qkv_width(), fc1 = s.fc1_width();
  const double params = 2.0 * s.vocab * h + double(s.layers) * (h * qkv + h * h + h * fc1 + s.ffn * h + 6.0 * h + qkv + fc1);
  const double activations = double(c.parallel.microbatches) * s.layers *
                             (n * (8.0 * h + qkv + fc1 + s.ffn) + double(s.batch) * s.heads * s.seq * s.seq);
  const bool cpu_math = options.backend == BackendKind::Cpu || options.check;
  // On a GPU the host holds each rank's fp32 weights and gradients only (to upload, and to check).
  const double needed = cpu_math ? 4.0 * (2.0 * params + activations + 2.0 * n * s.vocab * c.parallel.microbatches)
                                 : 4.0 * 2.0 * params;
  const double available = double(machine_memory_bytes());
  if (needed > 0.5 * available && !cpu_math)
    return Error{fmt::format("{}: model: the host would need about {:.1f} GiB for this model's fp32 weights and "
                             "gradients, more than half of this machine's {:.1f} GiB; shrink model.*",
                             c.source, needed / double(1ull << 30), available / double(1ull << 30))};
  if (needed > 0.5 * available)
    return Error{fmt::format("{}: model: the CPU runtime would need about {:.1f} GiB for this model (fp32 weights, "
                             "gradients and activations), more than half of this machine's {:.1f} GiB; shrink model.* "
                             "(configs/tiny.json is sized for it) or parallel.microbatches{}",
                             c.source, needed / double(1ull << 30), available / double(1ull << 30),
                             options.backend == BackendKind::Cuda ? "; or drop --check, whose reference runs on the CPU" : "")};
  return Status::Ok();
}

Result<RunResult> run_rank(Transport& comm, const Job& job, const RunOptions& options, const BackendFactory& backend_for) {
  if (comm.size() != job.layout.devices)
    return Error{fmt::format("{} ranks cannot run a pipeline of {} devices", comm.size(), job.layout.devices)};
  std::unique_ptr<Backend> backend;
  try {
    backend = backend_for ? backend_for(comm.rank()) : make_backend(options, job, comm.rank());
  } catch (const std::exception& e) {  // e.g. out of device memory: end every rank, never hang them
    const std::string why = fmt::format("rank {} could not set up its {} backend: {}", comm.rank(),
                                        options.backend == BackendKind::Cuda ? "CUDA" : "CPU", e.what());
    comm.abort(why);
    return Error{why};
  }
  return run_steps(comm, *backend, job, options);
}

}  // namespace pipesim::runtime
