#pragma once
/// Runs a job's task graph with real math: each rank walks its own streams of the IR, op by op in
/// program order, calling the CPU kernels for compute ops and the communicator for SEND/RECV and the
/// collectives. The same function runs under every backend (threads or MPI processes), so what the
/// in-process tests check is what `mpirun` runs.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend.h"
#include "comm.h"
#include "config.h"
#include "job.h"
#include "status.h"
#include "timeline.h"

namespace pipesim::runtime {

/// A deliberate failure, to show that a failing or hung rank ends the run instead of hanging it.
struct InjectedFault {
  int rank = 0;
  OpKind kind = OpKind::F;
  int microbatch = 0;
  bool hang = false;  ///< stop responding instead of failing
  bool kill = false;  ///< end the process with SIGKILL, as a crash would (one process per rank: MPI)
  /// Not at an op but while the rank connects to the others (MPI: before its NCCL communicators), so
  /// that the others time out creating theirs. `kind` and `microbatch` are then unused.
  bool at_setup = false;
};

/// Where each rank computes.
enum class BackendKind { Cpu, Cuda };

struct RunOptions {
  BackendKind backend = BackendKind::Cpu;
  DType dtype = DType::F32;  ///< weights and activations (the CPU backend runs fp32 only)
  int device = -1;  ///< CUDA: this process's GPU (one rank per process, under MPI); -1: ranks of one process share the GPUs
  /// CUDA under MPI: several processes may share a GPU, NCCL over sockets (cuda::NcclOptions::share_gpu).
  bool ranks_share_gpu = false;
  int steps = 1;
  std::uint64_t seed = 1234;
  OptimizerSettings optimizer;
  bool check = false;      ///< compare the first step with a single-device reference
  /// The check's bounds (relative loss error; max gradient relative error, 0: not checked); negative:
  /// the dtype's default (fp32: 1e-5 and 1e-4; bf16: 1e-2 and not checked).
  double loss_tolerance = -1, grad_tolerance = -1;
  double timeout_s = 60;   ///< a rank that sees no progress for this long ends the run
  /// Each rank issues its communication one call at a time (the next once the last has completed), in
  /// one order of the graph's ops that every rank shares (issue_order.h), its tensor-parallel
  /// collectives at their compute op's place in it: what an NCCL run must do, since an NCCL kernel
  /// holds the GPU until its peers arrive (docs/runtime.md, "One order of NCCL calls"), and what
  /// run_mpi sets for one. Elsewhere (threads, MPI on the CPU) a waiting call holds nothing, and each
  /// stream of the graph issues as soon as its op is ready; set it there to test the order.
  bool ordered_issue = false;
  std::optional<InjectedFault> fault;
  /// Called on rank 0 after each step with (step, loss, step time).
  std::function<void(int, double, TimeNs)> on_step;
};

struct CheckResult {
  double loss = 0, reference_loss = 0;
  double max_grad_rel_err = 0;  ///< max over tensors of ‖g − g_ref‖ / ‖g_ref‖
  std::string worst_tensor;
  /// The bounds the run is held to: fp32 must match the fp32 reference to rounding; bf16 only in
  /// its loss, since bf16 weights and activations round every value to 8 bits of mantissa.
  double loss_tolerance = 0, grad_tolerance = 0;  ///< grad_tolerance 0: not checked
  bool passed() const;
};

/// A collective a compute op ran inside it: tensor parallelism's, which the graph does not carry as
/// ops of their own (the simulator charges them inside F, B and R).
struct InnerCollective {
  enum class Kind : std::uint8_t { AllReduce, AllGather, ReduceScatter };
  int device = 0;
  TimeNs start = 0, end = 0;  ///< ns since the step began, as the timeline's
  Kind kind = Kind::AllReduce;
};
std::string_view inner_collective_name(InnerCollective::Kind kind);

/// What a run measured; complete on rank 0 (other ranks hold their own part). Its ranks are the
/// pipeline devices of the first replica and tensor-parallel rank 0.
struct RunResult {
  std::vector<double> losses;           ///< per step: mean loss over every token of the iteration
  std::vector<TimeNs> step_ns;          ///< per step: wall time of the slowest rank
  Timeline timeline;                    ///< the last step, every op
  std::vector<TimeNs> vocab_layer_ns;   ///< per op: time an F or B spent in the embedding or LM head
  std::vector<Bytes> live_after;        ///< per op: activation bytes its rank held when it completed
  std::vector<Bytes> peak_activation_bytes;  ///< per rank, the last step
  std::vector<TaskId> peak_op;
  std::vector<Bytes> static_bytes;      ///< per rank: weights, gradients and optimizer state
  std::vector<InnerCollective> tensor_parallel;  ///< the last step's tensor-parallel collectives, every rank's
  std::optional<CheckResult> check;
};

/// `config` as this runtime holds it in memory with `options`, for the simulator to compute the same
/// memory: fp32 weights and gradients, Adam's two fp32 moments (none with SGD), fp32 activations
/// (bf16 in a bf16 run, whose GEMM weights also have a bf16 copy: 2 more bytes a parameter, a slight
/// overcount), attention scores kept (the CPU's unfused attention) or not (the CUDA backend's fused
/// kernels). The optimizer's state is sharded over the replicas (ZeRO 1); under ZeRO 2 the gradients
/// are held whole until their reduce-scatter, and under ZeRO 3 the weights are gathered into
/// full-size buffers that stay: both hold memory as ZeRO 1 does. Under tensor parallelism the runtime
/// keeps the embedding and the LM head (or the vocabulary shard) whole on every tensor-parallel rank,
/// where the simulator splits them as Megatron does: its static bytes are then the higher.
Config memory_as_run(const Config& config, const RunOptions& options);

/// Whether this runtime can execute a job of this config with these options (tied embeddings on the
/// CPU backend only, no context parallelism, a model whose CPU math -- the CPU backend, or --check's
/// reference -- fits in this machine's memory); the error names the config field to change.
Status check_runnable(const Config& config, const RunOptions& options);
/// Whether the backend the options name can run here ("no CUDA device", a CPU run in bf16).
Status check_backend(const RunOptions& options);
/// The backend of `rank`: its part of the model, on the CPU or on GPU `rank` mod the GPUs present;
/// `tp`: its tensor-parallel group (null when its layers are whole), `ep` its expert-parallel group
/// (null when each MoE layer holds every expert), which must outlive the backend.
std::unique_ptr<Backend> make_backend(const RunOptions& options, const Job& job, int rank,
                                      TensorParallel* tp = nullptr, ExpertParallel* ep = nullptr);

/// Makes rank `rank`'s backend, given its tensor-parallel group (null when its layers are whole):
/// make_backend's by default; a test's fake (tests/runtime_fake_test.cpp).
using BackendFactory = std::function<std::unique_ptr<Backend>(int rank, TensorParallel* tp)>;

/// Runs `options.steps` training steps of the job as rank comm.rank().
Result<RunResult> run_rank(Transport& comm, const Job& job, const RunOptions& options,
                           const BackendFactory& backend_for = {});

}  // namespace pipesim::runtime
