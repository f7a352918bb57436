// `pipesim run`: the schedule executed for real on the CPU runtime, reported like a simulation.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>

#include "chrome_trace.h"
#include "config_files.h"
#include "commands.h"
#include "files.h"
#include "json_text.h"
#include "cuda/cuda_backend.h"
#include "launch.h"
#include "measured.h"
#include "options.h"
#include "plan.h"
#include "simulate_config.h"
#include "simulator.h"

namespace pipesim {
namespace {

using json = nlohmann::ordered_json;

/// `pipesim run`'s flags: what the runtime takes, bound to its own options, and what the command
/// reads itself (the selection, the files to write, the names of backend, dtype and fault).
struct RunFlags {
  std::string config;
  std::string backend = "cpu";  ///< cpu or cuda
  std::string dtype = "fp32";   ///< fp32 or bf16
  std::string schedule;  ///< empty: the config's
  std::string vocab;     ///< empty: the config's
  std::vector<std::string> overrides;
  int ranks = 0;         ///< pipeline devices, one rank each; 0: parallel.pp
  std::string schedule_file;  ///< a PyTorch compute-only CSV to run instead of a generated schedule
  std::string trace;     ///< measured Chrome trace; empty: none
  std::string profile;   ///< measured per-op costs for `simulate --profile`; empty: none
  Format format = Format::Text;
  std::string optimizer = "adam";  ///< adam or sgd
  double learning_rate = 0;  ///< 0: the optimizer's default (--lr takes only values above 0)
  double effective_learning_rate() const { return learning_rate > 0 ? learning_rate : optimizer == "sgd" ? 0.1 : 1e-3; }
  std::string inject_fault;  ///< RANK:KIND:MICROBATCH[:hang|:kill] or RANK:setup[:hang|:kill], for testing fault handling
  bool ranks_share_gpu = false;  ///< several MPI processes on one GPU, NCCL over sockets (testing)
  runtime::RunOptions runtime;  ///< steps, seed, --check and its bounds, timeout
};

/// RANK:KIND:MICROBATCH[:hang|:kill], e.g. 1:B:2, 2:F:0:hang or 1:F:3:kill; or RANK:setup[:hang|:kill]:
/// the rank fails while it connects to the others (under MPI, before its NCCL communicators).
Result<runtime::InjectedFault> parse_fault(const std::string& text) {
  const std::string usage = fmt::format(
      "--inject-fault '{}': expected RANK:KIND:MICROBATCH[:hang|:kill], e.g. 1:B:2 (rank 1 fails at its backward of "
      "microbatch 2), 2:F:0:hang or 1:F:3:kill; or RANK:setup[:hang|:kill] (under mpirun: fails while connecting)",
      text);
  std::vector<std::string> parts;
  for (std::size_t begin = 0;;) {
    const std::size_t colon = text.find(':', begin);
    parts.push_back(text.substr(begin, colon == std::string::npos ? std::string::npos : colon - begin));
    if (colon == std::string::npos) break;
    begin = colon + 1;
  }
  runtime::InjectedFault fault;
  if (parts.size() >= 2 && parts[1] == "setup") {  // no microbatch: RANK:setup[:hang|:kill]
    fault.at_setup = true;
    parts.insert(parts.begin() + 2, "-1");
  }
  if (parts.size() < 3 || parts.size() > 4 || (parts.size() == 4 && parts[3] != "hang" && parts[3] != "kill"))
    return Error{usage};
  try {
    fault.rank = std::stoi(parts[0]), fault.microbatch = std::stoi(parts[2]);
  } catch (const std::exception&) {
    return Error{usage};
  }
  bool known = false;
  for (int k = 0; k < kOpKindCount; ++k)
    if (op_kind_name(OpKind(k)) == parts[1]) fault.kind = OpKind(k), known = true;
  known |= fault.at_setup;
  if (!known) return Error{usage};
  fault.hang = parts.size() == 4 && parts[3] == "hang";
  fault.kill = parts.size() == 4 && parts[3] == "kill";
  return fault;
}

/// An injected fault must name an op that exists, or it would silently never fire.
Status check_fault(const std::optional<runtime::InjectedFault>& fault, const Plan& plan, const std::string& text) {
  if (!fault) return Status::Ok();
  if (fault->at_setup && fault->rank >= 0 && fault->rank < plan.layout.devices) return Status::Ok();
  if (fault->at_setup)
    return Error{fmt::format("--inject-fault '{}': there is no rank {} (ranks 0..{})", text, fault->rank, plan.layout.devices - 1)};
  for (const Task& t : plan.graph.tasks())
    if (t.device == fault->rank && t.kind == fault->kind && t.microbatch == fault->microbatch) return Status::Ok();
  return Error{fmt::format("--inject-fault '{}': rank {} has no {} op of microbatch {} (ranks 0..{}, microbatches "
                           "0..{}; OPTIMIZER and other per-iteration ops have microbatch -1)",
                           text, fault->rank, op_kind_name(fault->kind), fault->microbatch, plan.layout.devices - 1,
                           plan.config.parallel.microbatches - 1)};
}

/// The plan for `ranks` pipeline devices (from a schedule file when `schedule_file` is given),
/// checked for this runtime.
Result<Plan> runnable_plan(Config config, int ranks, const std::string& schedule_file, const runtime::RunOptions& options) {
  config.parallel.pp = ranks;
  Result<std::optional<CustomSchedule>> custom = load_schedule_file(schedule_file, config);
  if (!custom.ok()) return custom.error();
  Result<Plan> plan = make_plan(config, custom.value() ? &*custom.value() : nullptr);
  if (!plan.ok()) return Error{fmt::format("{}: {}", config.source, plan.error().message)};
  if (Status s = runtime::check_runnable(plan.value().config, options); !s.ok()) return s.error();
  return plan;
}

/// Progress on multi-step runs, on a terminal, in text mode only.
std::function<void(int, double, TimeNs)> progress_bar(const RunFlags& o) {
  if (o.runtime.steps < 2 || o.format != Format::Text || !isatty(fileno(stderr))) return {};
  return [steps = o.runtime.steps](int step, double loss, TimeNs ns) {
    const int width = 30, filled = (step + 1) * width / steps;
    fmt::print(stderr, "\r[{:=<{}}{:<{}}] step {}/{}  loss {:.4f}  {:.1f} ms/step\033[K", "", filled, "", width - filled,
               step + 1, steps, loss, double(ns) / 1e6);
    if (step + 1 == steps) fmt::print(stderr, "\r\033[K");
  };
}

/// The simulator on the graph just executed, with the op times just measured (the profile): how far
/// its prediction is from the measurement.
std::optional<TimeNs> predicted_iteration(const Plan& plan, const json& profile) {
  Result<Config> profiled = apply_profile(plan.config, json_text(profile), "the measured profile");
  if (!profiled.ok()) return std::nullopt;
  const std::unique_ptr<CostModel> costs = make_cost_model(profiled.value(), plan.layout);
  Result<Timeline> sim = simulate(plan.graph, op_durations(*costs, plan.graph));
  if (!sim.ok()) return std::nullopt;
  return *std::max_element(sim.value().end.begin(), sim.value().end.end());
}

/// The flags as the runtime takes them (the backend, precision and optimizer; steps, seed, --check and
/// the timeout as given).
runtime::RunOptions options_of(const RunFlags& o) {
  runtime::RunOptions options = o.runtime;
  options.backend = o.backend == "cuda" ? runtime::BackendKind::Cuda : runtime::BackendKind::Cpu;
  options.dtype = o.dtype == "bf16" ? runtime::DType::BF16 : runtime::DType::F32;
  options.optimizer.kind = o.optimizer == "sgd" ? runtime::OptimizerKind::Sgd : runtime::OptimizerKind::Adam;
  options.optimizer.learning_rate = float(o.effective_learning_rate());
  return options;
}

/// The simulator's memory for this run: the plan's config as the runtime holds it in memory
/// (runtime::memory_as_run). Empty for a schedule file's run (the plan is not the config's) or where
/// the simulator refuses the config.
std::optional<RunReport> simulated_memory(const RunFlags& o, const Plan& plan) {
  if (!o.schedule_file.empty()) return std::nullopt;
  const Config c = runtime::memory_as_run(plan.config, options_of(o));
  Result<SimulatedRun> sim = simulate_config(c);
  if (!sim.ok()) return std::nullopt;
  return std::move(sim.value().report);
}

/// The measured memory of each rank beside the simulator's (simulated_memory).
void print_memory_comparison(const RunReport& measured, const RunReport& simulated) {
  fmt::print("\nmemory per rank, measured vs the simulator's model of this run (MiB):\n");
  fmt::print("{:<6}{:>12}{:>12}{:>16}{:>16}\n", "rank", "static", "simulated", "activations", "simulated");
  const auto mib = [](Bytes b) { return double(b) / double(1 << 20); };
  for (std::size_t d = 0; d < measured.metrics.devices.size() && d < simulated.metrics.devices.size(); ++d) {
    const DeviceMetrics &m = measured.metrics.devices[d], &s = simulated.metrics.devices[d];
    fmt::print("{:<6}{:>12.3f}{:>12.3f}{:>16.3f}{:>16.3f}\n", m.rank, mib(m.static_bytes), mib(s.static_bytes),
               mib(m.peak_activation_bytes), mib(s.peak_activation_bytes));
  }
}

/// `simulate`'s JSON object with the measured values, plus the run's own fields.
json run_result_json(const RunFlags& o, const RunReport& measured, const runtime::RunResult& r,
                     const std::string& backend, std::optional<TimeNs> predicted,
                     const std::optional<RunReport>& simulated) {
  json out = run_json(measured);
  json memory = nullptr;  // the simulator's static and peak activation bytes per rank (simulated_memory)
  if (simulated) {
    memory = json::array();
    for (const DeviceMetrics& d : simulated->metrics.devices)
      memory.push_back({{"rank", d.rank}, {"static_bytes", d.static_bytes}, {"peak_activation_bytes", d.peak_activation_bytes}});
  }
  out["simulated_memory"] = memory;
  out["runtime"] = backend;
  out["steps"] = o.runtime.steps;
  out["loss"] = r.losses.back();
  out["losses"] = r.losses;
  json times = json::array();
  for (TimeNs ns : r.step_ns) times.push_back(seconds(ns));
  out["step_times_s"] = times;
  out["simulated_iteration_time_s"] = predicted ? json(seconds(*predicted)) : json(nullptr);
  if (r.check) {
    out["reference_loss"] = r.check->reference_loss;
    out["max_grad_rel_err"] = r.check->max_grad_rel_err;
    out["worst_tensor"] = r.check->worst_tensor;
    out["check_passed"] = r.check->passed();
  }
  return out;
}

/// `arg` as a POSIX shell reads it back: as is when it holds only characters no shell treats
/// specially, else single-quoted.
std::string shell_word(const std::string& arg) {
  const bool plain = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("_@%+=:,./-").find(c) != std::string_view::npos;
  });
  if (plain) return arg;
  std::string quoted = "'";
  for (const char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

/// The `pipesim simulate` command that times this run's plan with its profile: the same config, flags
/// and pipeline size, so that the simulator is given the model that was measured.
std::string simulate_command(const RunFlags& o, int pp) {
  std::vector<std::string> args{"pipesim", "simulate", o.config};
  if (!o.schedule.empty()) args.insert(args.end(), {"--schedule", o.schedule});
  if (!o.schedule_file.empty()) args.insert(args.end(), {"--schedule-file", o.schedule_file});
  if (!o.vocab.empty()) args.insert(args.end(), {"--vocab", o.vocab});
  for (const std::string& s : o.overrides) args.insert(args.end(), {"--set", s});
  args.insert(args.end(), {"--set", fmt::format("parallel.pp={}", pp), "--profile", o.profile});
  std::string command;
  for (const std::string& a : args) command += (command.empty() ? "" : " ") + shell_word(a);
  return command;
}

void print_text(const RunReport& measured, const runtime::RunResult& r,
                std::optional<TimeNs> predicted, const std::optional<RunReport>& simulated) {
  fmt::print("{}", format_run(measured, Format::Text));
  if (simulated) print_memory_comparison(measured, *simulated);
  fmt::print("\nloss per step:");
  for (std::size_t i = 0; i < r.losses.size(); ++i) fmt::print("{}{:.6f}", i % 10 ? " " : "\n  ", r.losses[i]);
  fmt::print("\nstep time: {:.3f} ms (last), {:.3f} ms (first)\n", r.step_ns.back() / 1e6, r.step_ns.front() / 1e6);
  if (predicted)
    fmt::print("simulated with the measured op times: {:.3f} ms ({:+.1f}% against the measured last step)\n",
               *predicted / 1e6, 100.0 * (double(*predicted) - double(r.step_ns.back())) / double(r.step_ns.back()));
  if (r.check)
    fmt::print("check against a single-device reference: loss {:.9g} vs {:.9g} (relative difference {:.2e}), "
               "max gradient relative error {:.2e} ({})\n",
               r.check->loss, r.check->reference_loss,
               std::abs(r.check->loss - r.check->reference_loss) / std::abs(r.check->reference_loss),
               r.check->max_grad_rel_err, r.check->worst_tensor);
  if (r.check)
    fmt::print("check {}: bounds {:g} on the loss{}\n", r.check->passed() ? "passed" : "FAILED", r.check->loss_tolerance,
               r.check->grad_tolerance > 0 ? fmt::format(", {:g} on every gradient", r.check->grad_tolerance) : "");
}

/// A diverged run trained nothing: its report would be NaN with exit status 0.
Status check_losses(const RunFlags& o, const runtime::RunResult& r) {
  for (std::size_t step = 0; step < r.losses.size(); ++step)
    if (!std::isfinite(r.losses[step]))
      return Error{fmt::format("the loss is {} at step {}: training diverged; use a smaller --lr (it is {})",
                               std::isnan(r.losses[step]) ? "NaN" : "infinite", step + 1, o.effective_learning_rate())};
  return Status::Ok();
}

/// The report of a finished run and the files it asked for; on rank 0 only.
ExitStatus report(const RunFlags& o, const Plan& plan, const runtime::RunResult& r, const std::string& backend) {
  if (Status s = check_losses(o, r); !s.ok()) return fail(s.error().message);
  const RunReport measured = measured_report(plan, r, backend);
  const json profile = measured_profile(plan, r);
  if (!o.trace.empty()) {
    const std::string title = fmt::format("{} {} {} (measured, {})", o.config, measured.schedule, measured.vocab, backend);
    std::vector<InnerSlice> tensor_parallel;
    for (const runtime::InnerCollective& c : r.tensor_parallel)
      tensor_parallel.push_back({.device = c.device, .start = c.start, .end = c.end,
                                 .name = runtime::inner_collective_name(c.kind)});
    if (Status s = write_chrome_trace_file(o.trace, plan.graph, r.timeline, r.static_bytes, title, r.live_after,
                                           tensor_parallel);
        !s.ok())
      return fail(s.error().message);
    note_written(o.trace, "open it in ui.perfetto.dev");
  }
  if (!o.profile.empty()) {
    if (Status s = write_output_file(o.profile, json_text(profile, 2) + "\n", kProfileGenerator); !s.ok())
      return fail(s.error().message);
    note_written(o.profile, "use: " + simulate_command(o, measured.parallel.pp));
  }
  const std::optional<TimeNs> predicted = predicted_iteration(plan, profile);
  const std::optional<RunReport> simulated = simulated_memory(o, plan);
  if (o.format == Format::Json)
    fmt::print("{}\n", json_text(run_result_json(o, measured, r, backend, predicted, simulated), 2));
  else
    print_text(measured, r, predicted, simulated);
  if (r.check && !r.check->passed())
    return fail(fmt::format("--check: the run does not match the single-device reference (loss {:.9g} vs {:.9g}, max "
                            "gradient relative error {:.2e} in {})",
                            r.check->loss, r.check->reference_loss, r.check->max_grad_rel_err, r.check->worst_tensor));
  return ExitStatus::Success;
}

ExitStatus run_run(const RunFlags& o) {
  if (Status s = check_distinct_outputs({{"--trace", o.trace}, {"--profile", o.profile}}); !s.ok())
    return fail(s.error().message);
  Result<Config> config = load_selected_config(o.config, o.overrides, o.schedule, o.vocab);
  if (!config.ok()) return fail(config.error().message);
  runtime::RunOptions options = options_of(o);
  options.on_step = progress_bar(o);
  if (!o.inject_fault.empty()) {
    Result<runtime::InjectedFault> fault = parse_fault(o.inject_fault);
    if (!fault.ok()) return fail(fault.error().message);
    if (fault.value().kill && !runtime::launched_by_mpi())
      return fail(fmt::format("--inject-fault '{}': kill needs one process per rank (mpirun): here every rank is a thread "
                              "of this process and would end with it; use :hang, or run under mpirun",
                              o.inject_fault));
    if (fault.value().at_setup && !runtime::launched_by_mpi())
      return fail(fmt::format("--inject-fault '{}': setup faults are for MPI runs (the ranks connect under mpirun); "
                              "in one process name an op instead, e.g. 1:F:0",
                              o.inject_fault));
    options.fault = fault.value();
  }
  options.ranks_share_gpu = o.ranks_share_gpu;
  if (o.ranks_share_gpu && (!runtime::launched_by_mpi() || options.backend != runtime::BackendKind::Cuda))
    return fail("--ranks-share-gpu: only for --backend cuda under mpirun (one process per rank, NCCL); in one process "
                "the ranks share the GPUs already: drop --ranks-share-gpu");

  if (Status s = runtime::check_backend(options); !s.ok()) return fail(s.error().message);

  if (runtime::launched_by_mpi()) {
    std::optional<Plan> plan;
    const runtime::MpiRun run = runtime::run_mpi(
        [&](int processes) -> Result<runtime::Job> {
          // One process per rank: pipeline devices × tensor-parallel × context-parallel × data-parallel
          // ranks. The layout is the config's (or --ranks'): a job of another size is refused, never run as
          // another pipeline.
          const ParallelConfig& layout = config.value().parallel;
          const int ranks = o.ranks != 0 ? o.ranks : layout.pp;
          const int per_stage = layout.tp * layout.cp * layout.dp, expected = ranks * per_stage;
          if (processes != expected) {
            const std::string pp = o.ranks != 0 ? fmt::format("--ranks {}", ranks) : fmt::format("pp {}", ranks);
            const std::string instead =
                processes % per_stage == 0
                    ? fmt::format(", or {} to run {} pipeline stages", o.ranks != 0 ? fmt::format("--ranks {}", processes / per_stage)
                                                                                  : fmt::format("--set parallel.pp={}", processes / per_stage),
                                  processes / per_stage)
                    : fmt::format(" (or a multiple of tp × cp × dp = {} with parallel.pp to match)", per_stage);
            return Error{fmt::format("{}: this MPI job has {} processes but the layout has {} ranks (tp {} × cp {} × dp "
                                     "{} × {}); give mpirun -np {}{}",
                                     o.config, processes, expected, layout.tp, layout.cp, layout.dp, pp, expected, instead)};
          }
          Result<Plan> p = runnable_plan(config.value(), ranks, o.schedule_file, options);
          if (!p.ok()) return p.error();
          if (Status s = check_fault(options.fault, p.value(), o.inject_fault); !s.ok()) return s.error();
          plan = std::move(p).value();
          return job_of(*plan);
        },
        options);
    if (run.rank != 0) return run.result.ok() || run.failed_alike ? ExitStatus::Success : ExitStatus::Failure;
    if (!run.result.ok()) return fail(run.result.error().message);
    return report(o, *plan, run.result.value(),
                  options.backend == runtime::BackendKind::Cuda ? fmt::format("cuda {}, nccl, {} processes", o.dtype, run.size)
                                                                : fmt::format("mpi, {} processes", run.size));
  }

  Result<Plan> plan = runnable_plan(config.value(), o.ranks != 0 ? o.ranks : config.value().parallel.pp, o.schedule_file, options);
  if (!plan.ok()) return fail(plan.error().message);
  if (Status s = check_fault(options.fault, plan.value(), o.inject_fault); !s.ok()) return fail(s.error().message);
  Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan.value()), options);
  if (!run.ok()) return fail(run.error().message);
  const int ranks = job_of(plan.value()).ranks();
  return report(o, plan.value(), run.value(),
                options.backend == runtime::BackendKind::Cuda
                    ? fmt::format("cuda {}, {} threads on {} GPU(s)", o.dtype, ranks, std::min(ranks, runtime::cuda::device_count()))
                    : fmt::format("cpu, {} threads", ranks));
}

}  // namespace

void define_run(CLI::App& rn, ExitStatus& status) {
  auto o = std::make_shared<RunFlags>();
  add_selection_options(rn, o->config, o->schedule, o->vocab, o->overrides);
  add_format_option(rn, o->format, {"text", "json"});
  rn.add_option("--ranks", o->ranks, "pipeline devices, each parallel.tp × parallel.dp ranks (default: parallel.pp; under MPI, "
                "-np must be this × tp × cp × dp)")
      ->check(whole_from(1, 64));
  rn.add_option("--schedule-file", o->schedule_file,
                "run per-rank orders from a PyTorch compute-only CSV (0F0,0I0,0W0,...) instead of a schedule")
      ->excludes("--schedule")
      ->check(kNonEmpty);
  rn.add_option("--backend", o->backend, "cpu (threads or MPI processes) or cuda (GPUs: in-process ranks share "
                "the GPUs present; under mpirun, one process per GPU over NCCL) (default cpu)")
      ->check(one_of({"cpu", "cuda"}));
  rn.add_option("--dtype", o->dtype, "fp32 or bf16 weights and activations (bf16: cuda only; default fp32)")
      ->check(one_of({"fp32", "bf16"}));
  rn.add_option("--steps", o->runtime.steps, "training steps (default 1)")->check(whole_from(1, 1000000));
  rn.add_flag("--check", o->runtime.check,
              "compare the first step with a single-device reference: loss and max gradient relative error");
  rn.add_option("--loss-tol", o->runtime.loss_tolerance,
                "--check fails when the loss's relative error exceeds this (default 1e-5; bf16: 1e-2)")
      ->check(finite_from(0, 1e6));
  rn.add_option("--grad-tol", o->runtime.grad_tolerance,
                "--check fails when a gradient's relative error exceeds this (default 1e-4; bf16: 0, not checked)")
      ->check(finite_from(0, 1e6));
  rn.add_option("--trace", o->trace, "write the measured Chrome trace of the last step (open in ui.perfetto.dev)")
      ->check(kNonEmpty);
  rn.add_option("--profile", o->profile, "write measured op times for `pipesim simulate --profile`")->check(kNonEmpty);
  rn.add_option("--seed", o->runtime.seed, "seed of the weights and the data (default 1234)")->check(kUint64);
  // Larger steps only diverge; NaN would train nothing and still exit 0.
  rn.add_option("--optimizer", o->optimizer, "adam (the default: PyTorch's betas and epsilon, no weight decay) or sgd")
      ->check(one_of({"adam", "sgd"}));
  rn.add_option("--lr", o->learning_rate, "learning rate (default 1e-3 with Adam, 0.1 with SGD)")->check(finite_in(0, 100));
  rn.add_option("--timeout", o->runtime.timeout_s, "seconds without progress after which a rank ends the run (default 60)")
      ->check(finite_in(0, 1e6));  // NaN would never time out
  rn.add_option("--inject-fault", o->inject_fault,
                "make a rank fail (RANK:KIND:MICROBATCH, e.g. 1:B:2), hang (2:F:0:hang) or, under mpirun, die "
                "(1:F:3:kill: SIGKILL) in the first step, or under mpirun while it connects (1:setup:hang), to test "
                "fault handling")
      ->check(kNonEmpty);
  rn.add_flag("--ranks-share-gpu", o->ranks_share_gpu,
              "--backend cuda under mpirun: let several processes share a GPU (each rank its own NCCL host "
              "identity, NCCL over TCP on loopback): to test the NCCL path on one GPU; slow, not for timings");
  rn.callback([o, &status] { status = run_run(*o); });
}

}  // namespace pipesim
