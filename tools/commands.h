#pragma once
/// The CLI's commands as plain functions over option structs; main only parses arguments.
#include <cstdint>
#include <string>
#include <vector>

#include "report.h"

namespace pipesim {

/// Process exit codes, chosen in one place.
enum class ExitStatus : int {
  Success = 0,
  Failure = 1,  ///< bad input (config, names, files) or a schedule that cannot run
};

struct SimulateOptions {
  std::string config;
  std::string schedule;  ///< empty: the config's
  std::string vocab;     ///< empty: the config's
  std::vector<std::string> overrides;
  Format format = Format::Text;
  std::string trace;          ///< empty: no trace
  std::string svg;            ///< empty: no picture
  std::string schedule_file;  ///< a PyTorch compute-only CSV to run instead of a generated schedule
  std::string profile;        ///< measured costs from `pipesim run --profile` to use instead of the config's
  bool replan = false;        ///< with a profile: plan with its costs too, not only time the config's plan
};

struct CompareOptions {
  std::vector<std::string> configs;
  std::vector<std::string> schedules;  ///< empty: every schedule that accepts the config
  std::vector<std::string> vocab;      ///< empty: every vocabulary mode
  std::vector<std::string> overrides;
  Format format = Format::Text;
};

/// `pipesim tune`: the fastest configurations that fit, at the config's GPU count and global batch.
struct TuneOptions {
  std::string config;
  std::vector<std::string> overrides;
  double memory_gib = 0;  ///< 0: the config's hardware.memory_gib
  int gpus = 0;           ///< 0: the config's pp x tp x dp
  int top = 10;
  Format format = Format::Text;
};

/// `pipesim sweep`: one row per point of the --grid product.
struct SweepOptions {
  std::string config;
  std::vector<std::string> grids;  ///< key.path=v1,v2,...
  std::vector<std::string> overrides;
  Format format = Format::Text;
};

struct ExportOptions {
  std::string config;
  std::string schedule;  ///< empty: the config's
  std::string vocab;     ///< empty: the config's
  std::vector<std::string> overrides;
  std::string output;    ///< empty: standard output
};

/// `pipesim run`: execute the schedule on the runtime (CPU or CUDA; threads, or MPI processes under
/// mpirun).
struct RunOptions {
  std::string config;
  std::string backend = "cpu";  ///< cpu or cuda
  std::string dtype = "fp32";   ///< fp32 or bf16
  std::string schedule;  ///< empty: the config's
  std::string vocab;     ///< empty: the config's
  std::vector<std::string> overrides;
  int ranks = 0;         ///< pipeline devices, one rank each; 0: parallel.pp (under MPI: the job's size)
  std::string schedule_file;  ///< a PyTorch compute-only CSV to run instead of a generated schedule
  int steps = 1;
  bool check = false;    ///< compare the first step with a single-device reference
  double loss_tolerance = -1, grad_tolerance = -1;  ///< the check's bounds; negative: the dtype's default
  std::string trace;     ///< measured Chrome trace; empty: none
  std::string profile;   ///< measured per-op costs for `simulate --profile`; empty: none
  Format format = Format::Text;
  std::uint64_t seed = 1234;
  double learning_rate = 0.1;
  double timeout_s = 60;
  std::string inject_fault;  ///< RANK:KIND:MICROBATCH[:hang], for testing fault handling
};

/// `pipesim calibrate`: hardware efficiencies fitted to measured op times.
struct CalibrateOptions {
  std::vector<std::string> profiles;  ///< `run --profile` files, measure-ops.py output, or {"ops": [{name, flops, bytes, ms}]}
  std::string output;                 ///< the hardware file to write; empty: print the errors only
  std::string preset = "h100-sxm";    ///< whose peak FLOP/s and bandwidth the efficiencies scale
};

struct BenchOptions {
  bool quick = false;  ///< smaller graphs, for a smoke test
};

ExitStatus run_simulate(const SimulateOptions& options);
ExitStatus run_compare(const CompareOptions& options);
ExitStatus run_tune(const TuneOptions& options);
ExitStatus run_sweep(const SweepOptions& options);
ExitStatus run_list();
ExitStatus run_export(const ExportOptions& options);
ExitStatus run_bench(const BenchOptions& options);
ExitStatus run_calibrate(const CalibrateOptions& options);
ExitStatus run_run(const RunOptions& options);

}  // namespace pipesim
