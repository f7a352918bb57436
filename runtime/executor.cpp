#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <thread>

#include "cpu/hash.h"
#include "rank_executor.h"

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

/// The single-device reference of one iteration: mean loss over all microbatches and its gradients.
double reference_iteration(const cpu::ModelShape& shape, const cpu::Model& model, const std::vector<Batch>& batches,
                           cpu::Model& grad) {
  double loss = 0;
  for (const Batch& b : batches) loss += cpu::reference_step(shape, model, b.tokens, b.targets, grad);
  const float scale = 1.0f / float(batches.size());
  const auto rescale = [scale](std::vector<float>& t) {
    for (float& v : t) v *= scale;
  };
  rescale(grad.embedding), rescale(grad.head), rescale(grad.final_gain), rescale(grad.final_bias);
  for (cpu::Layer& l : grad.layers)
    for (std::vector<float>* t : l.tensors()) rescale(*t);
  return loss / double(batches.size());
}

}  // namespace

RankExecutor::RankExecutor(Transport& comm, std::unique_ptr<Backend> backend, const Job& job, const RunOptions& options)
    : comm_(comm), graph_(job.graph), layout_(job.layout), options_(options), rank_(comm.rank()),
      shape_(job.shape), microbatches_(job.microbatches), n_(shape_.tokens()), h_(shape_.hidden), backend_(std::move(backend)),
      first_device_(layout_.stages.front().device), last_device_(layout_.stages.back().device),
      last_stage_(layout_.stage_count() - 1), split_weight_(graph_.has(OpKind::W)), done_(graph_.size()) {
  for (std::size_t s = graph_.first_stream(rank_); s < graph_.first_stream(rank_ + 1); ++s)
    if (!graph_.stream(s).empty()) streams_.push_back(s);
  for (const Task& t : graph_.tasks()) own_tasks_ += t.device == rank_;
}

Result<RunResult> RankExecutor::run() {
  RunResult result;
  result.timeline.start.assign(graph_.size(), 0), result.timeline.end.assign(graph_.size(), 0);
  result.vocab_layer_ns.assign(graph_.size(), 0), result.live_after.assign(graph_.size(), 0);
  timeline_ = &result.timeline, vocab_layer_ns_ = &result.vocab_layer_ns, live_after_ = result.live_after.data();
  try {
    double reference_loss = 0;
    for (int step = 0; step < options_.steps; ++step) {
      step_ = step;
      batches_.clear();
      for (int mb = 0; mb < microbatches_; ++mb)
        batches_.push_back(make_batch(options_.seed, step, mb, n_, shape_.vocab));
      backend_->set_batches(batches_);
      if (options_.check && step == 0) {
        reference_grad_ = cpu::zero_model(shape_);
        reference_loss = reference_iteration(shape_, cpu::make_model(shape_, options_.seed), batches_, *reference_grad_);
      }
      barrier();
      epoch_ = Clock::now();
      loss_part_ = 0;
      // Like the timeline, the last step's: an op adds its embedding and LM-head parts as it runs them.
      std::fill(result.vocab_layer_ns.begin(), result.vocab_layer_ns.end(), TimeNs(0));
      run_graph();
      const TimeNs elapsed = now();
      std::vector<float> loss{float(loss_part_)}, time{float(elapsed)};
      wait(comm_.control().all_reduce(host_buffer(std::span(loss)), ReduceOp::Sum), "the loss all-reduce");
      wait(comm_.control().all_reduce(host_buffer(std::span(time)), ReduceOp::Max), "the step-time all-reduce");
      result.losses.push_back(loss[0]);
      result.step_ns.push_back(TimeNs(time[0]));
      if (step == 0 && options_.check) result.check = finish_check(reference_loss, loss[0]);
      if (rank_ == 0 && options_.on_step) options_.on_step(step, loss[0], TimeNs(time[0]));
    }
    gather(result);
    return result;
  } catch (const CommError& e) {
    return Error{e.what()};
  } catch (const RankFailure& e) {
    comm_.abort(e.what());
    return Error{e.what()};
  } catch (const std::exception& e) {  // e.g. out of memory: still end every rank, never hang them
    const std::string why = failure(e);
    comm_.abort(why);
    return Error{why};
  }
}

std::string RankExecutor::failure(const std::exception& e) const {
  return fmt::format("rank {} failed: {}", rank_, e.what());
}

void RankExecutor::wait(std::unique_ptr<Request> request, const std::string& what) {
  const auto start = Clock::now();
  while (!request->done()) {
    if (std::chrono::duration<double>(Clock::now() - start).count() > options_.timeout_s)
      throw RankFailure(fmt::format("rank {}: no progress for {:g} s waiting for {}", rank_, options_.timeout_s, what));
    comm_.wait_for_progress(0.001);
  }
}

void RankExecutor::barrier() {
  std::vector<float> token{1.0f};
  wait(comm_.control().all_reduce(host_buffer(std::span(token)), ReduceOp::Sum), "the start-of-step barrier");
}

void RankExecutor::run_graph() {
  for (std::atomic<char>& done : done_) done.store(0);
  std::vector<std::size_t> cursor(streams_.size(), 0);
  std::vector<InFlight> in_flight(streams_.size());
  buffers_.reset_peak();
  try {
    walk(cursor, in_flight);
  } catch (const CommError&) {
    // Another rank ended the run; say where this one stood.
    throw CommError(fmt::format("rank {} stopped waiting on {}", rank_, waiting_on(cursor, in_flight)));
  } catch (const RankFailure& e) {
    // This rank failed: end the run before `in_flight` frees the buffers it lent to transfers and
    // collectives, which the other ranks may read until they see the abort. (run() aborts again,
    // for failures outside the graph; the first reason stays.)
    comm_.abort(e.what());
    throw;
  } catch (const std::exception& e) {
    comm_.abort(failure(e));
    throw;
  }
}

// The compute stream runs on a thread of its own while this one drives the communication streams,
// as a GPU's compute stream runs while NCCL progresses on its own: a transfer never waits for the
// compute op in progress to end, so what is measured is the schedule, not the polling.
void RankExecutor::walk(std::vector<std::size_t>& cursor, std::vector<InFlight>& in_flight) {
  compute_cursor_ = 0, computed_ = 0, compute_failed_ = false;
  std::jthread worker([this](std::stop_token stop) { run_compute_stream(stop); });
  const std::size_t compute_ops = graph_.stream(streams_[0]).size();
  std::size_t remaining = own_tasks_ - compute_ops;  // communication ops
  std::size_t seen_computed = 0;
  auto last_progress = Clock::now();
  while (remaining > 0 || computed_ < compute_ops) {
    if (compute_failed_) std::rethrow_exception(compute_error_);
    bool progressed = false;
    for (std::size_t i = 1; i < streams_.size(); ++i) {
      const auto ops = graph_.stream(streams_[i]);
      if (cursor[i] == ops.size()) continue;
      try {
        progressed |= step(ops[cursor[i]], in_flight[i], cursor[i], remaining);
      } catch (const CommError&) {
        throw;  // another rank failed; run_graph says where this one stood
      } catch (const RankFailure&) {
        throw;
      } catch (const std::exception& e) {  // a missing buffer, a size mismatch, a CUDA or NCCL error
        throw RankFailure(fmt::format("rank {} failed at {}: {}", rank_, graph_.describe(ops[cursor[i]]), e.what()));
      }
    }
    if (progressed || computed_ != seen_computed || compute_busy_) {
      seen_computed = computed_;
      last_progress = Clock::now();
      if (progressed) continue;
    }
    if (std::chrono::duration<double>(Clock::now() - last_progress).count() > options_.timeout_s) timed_out(cursor, in_flight);
    comm_.wait_for_progress(0.001);
  }
  if (compute_failed_) std::rethrow_exception(compute_error_);
}

void RankExecutor::run_compute_stream(const std::stop_token& stop) {
  try {
    const std::unique_ptr<DeviceClock> clock = backend_->device_clock();
    device_clock_ = clock.get();
    // The device clock's zero on the host timeline: the device passes a mark on an idle stream as
    // soon as it is recorded.
    const TimeNs origin_ns = now();
    const DeviceClock::Mark origin = clock ? clock->mark() : 0;
    const auto ops = graph_.stream(streams_[0]);
    for (; compute_cursor_ < ops.size(); ++compute_cursor_) {
      const TaskId id = ops[compute_cursor_];
      {
        std::unique_lock lock(wake_mutex_);
        if (!wake_.wait(lock, stop, [&] { return ready(id); })) return;  // stopped
      }
      inject_fault(id, stop);
      compute_busy_ = true;
      const TimeNs host_start = now();
      TimeNs end = 0;
      try {
        const DeviceClock::Mark begin = clock ? clock->mark() : 0;
        compute(id);
        const DeviceClock::Mark finish = clock ? clock->mark() : 0;
        backend_->synchronize();
        if (clock) {
          timeline_->start[std::size_t(id)] = origin_ns + clock->elapsed(origin, begin);
          end = origin_ns + clock->elapsed(origin, finish);
          for (const auto& [from, to] : vocab_marks_) (*vocab_layer_ns_)[std::size_t(id)] += clock->elapsed(from, to);
          vocab_marks_.clear();
        } else {
          timeline_->start[std::size_t(id)] = host_start;
          end = now();
        }
      } catch (const RankFailure&) {
        throw;
      } catch (const std::exception& e) {  // a missing buffer, a CUDA or cuBLAS error, out of memory
        throw RankFailure(fmt::format("rank {} failed at {}: {}", rank_, graph_.describe(id), e.what()));
      }
      compute_busy_ = false;
      complete(id, end);
      ++computed_;
    }
    device_clock_ = nullptr;
    backend_->release_thread();
  } catch (...) {
    device_clock_ = nullptr;
    compute_error_ = std::current_exception();
    compute_failed_ = true;
    comm_.wake();
  }
}

bool RankExecutor::step(TaskId id, InFlight& flight, std::size_t& cursor, std::size_t& remaining) {
  if (flight.id != kNoTask) {  // in flight: poll it
    if (!advance(flight)) return false;
    complete(id, now());
    flight = InFlight{};
    ++cursor, --remaining;
    return true;
  }
  if (!ready(id)) return false;
  inject_fault(id, {});
  timeline_->start[std::size_t(id)] = now();
  flight.id = id;
  start_comm(flight);
  return true;
}

bool RankExecutor::ready(TaskId id) const {
  for (TaskId dep : graph_.deps(id))
    if (!done_[std::size_t(dep)].load(std::memory_order_acquire)) return false;
  return true;
}

void RankExecutor::complete(TaskId id, TimeNs end) {
  timeline_->end[std::size_t(id)] = end;
  live_after_[std::size_t(id)] = buffers_.note_peak(id);
  done_[std::size_t(id)].store(1, std::memory_order_release);
  { std::lock_guard lock(wake_mutex_); }  // a waiter between its check and its wait sees the flag
  wake_.notify_all();
  comm_.wake();
}

void RankExecutor::inject_fault(TaskId id, const std::stop_token& stop) {
  const Task& t = graph_.task(id);
  if (!options_.fault || options_.fault->at_setup || options_.fault->rank != rank_ || options_.fault->kind != t.kind ||
      options_.fault->microbatch != t.microbatch || step_ != 0)
    return;
  if (options_.fault->kill) {  // no message, no abort: the other ranks must find out for themselves
    std::fflush(nullptr);
    std::raise(SIGKILL);
  }
  if (!options_.fault->hang) throw RankFailure(fmt::format("rank {} failed at {}: injected fault", rank_, graph_.describe(id)));
  // A hung rank answers nothing until the run is ended around it.
  while (!comm_.aborted() && !stop.stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  throw RankFailure(fmt::format("rank {} hung at {} (injected fault)", rank_, graph_.describe(id)));
}

std::string RankExecutor::waiting_on(const std::vector<std::size_t>& cursor, const std::vector<InFlight>& in_flight) const {
  std::vector<std::string> waiting;
  for (std::size_t i = 0; i < streams_.size(); ++i) {
    const auto ops = graph_.stream(streams_[i]);
    const std::size_t next = i == 0 ? compute_cursor_.load() : cursor[i];
    if (next == ops.size()) continue;
    const TaskId id = ops[next];
    const Task& t = graph_.task(id);
    if (in_flight[i].id == kNoTask && !ready(id)) continue;  // waits on this rank's own ops
    if (i == 0)
      waiting.push_back(fmt::format("its own {} (started, not finished)", graph_.describe(id)));
    else if (t.kind == OpKind::Send || t.kind == OpKind::Recv)
      waiting.push_back(fmt::format("{} (rank {})", graph_.describe(id), t.peer));
    else
      waiting.push_back(graph_.describe(id));
  }
  return waiting.empty() ? std::string("nothing it can name") : fmt::format("{}", fmt::join(waiting, ", "));
}

void RankExecutor::timed_out(const std::vector<std::size_t>& cursor, const std::vector<InFlight>& in_flight) {
  throw RankFailure(
      fmt::format("rank {}: no progress for {:g} s; waiting on {}", rank_, options_.timeout_s, waiting_on(cursor, in_flight)));
}

CheckResult RankExecutor::finish_check(double reference_loss, double loss) {
  wait(comm_.control().all_reduce(host_buffer(std::span(grad_terms_)), ReduceOp::Sum), "the gradient-check all-reduce");
  const bool fp32 = options_.dtype == DType::F32;
  CheckResult check{.loss = loss, .reference_loss = reference_loss, .max_grad_rel_err = 0, .worst_tensor = "",
                    .loss_tolerance = options_.loss_tolerance >= 0 ? options_.loss_tolerance : fp32 ? 1e-5 : 1e-2,
                    .grad_tolerance = options_.grad_tolerance >= 0 ? options_.grad_tolerance : fp32 ? 1e-4 : 0};
  const std::vector<std::string> names = tensor_names(shape_);
  for (std::size_t t = 0; t < names.size(); ++t) {
    const double diff = grad_terms_[2 * t], ref = grad_terms_[2 * t + 1];
    const double err = ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
    if (err >= check.max_grad_rel_err) check.max_grad_rel_err = err, check.worst_tensor = names[t];
  }
  return check;
}

void RankExecutor::gather(RunResult& result) {
  const int ranks = comm_.size();
  result.peak_activation_bytes.assign(std::size_t(ranks), 0);
  result.peak_op.assign(std::size_t(ranks), kNoTask);
  result.static_bytes.assign(std::size_t(ranks), 0);
  const auto pack = [&](int rank, std::vector<double>& record, bool write) {
    std::size_t i = 0;
    const auto field = [&](auto& value) {
      if (write) value = static_cast<std::remove_reference_t<decltype(value)>>(record[i]);
      else record.push_back(double(value));
      ++i;
    };
    for (TaskId id = 0; id < TaskId(graph_.size()); ++id)
      if (graph_.task(id).device == rank)
        field(result.timeline.start[std::size_t(id)]), field(result.timeline.end[std::size_t(id)]),
            field(result.vocab_layer_ns[std::size_t(id)]), field(result.live_after[std::size_t(id)]);
    field(result.peak_activation_bytes[std::size_t(rank)]), field(result.peak_op[std::size_t(rank)]),
        field(result.static_bytes[std::size_t(rank)]);
  };
  result.peak_activation_bytes[std::size_t(rank_)] = buffers_.peak(), result.peak_op[std::size_t(rank_)] = buffers_.peak_op();
  result.static_bytes[std::size_t(rank_)] = backend_->static_bytes();
  std::vector<double> record;
  if (rank_ != 0) {
    pack(rank_, record, false);
    wait(comm_.control().send(host_buffer(std::span(record)), 0), "rank 0 to take this rank's measurements");
    return;
  }
  for (int r = 1; r < ranks; ++r) {
    std::vector<double> theirs;
    pack(r, theirs, false);  // sizes the record
    wait(comm_.control().recv(host_buffer(std::span(theirs)), r), fmt::format("rank {}'s measurements", r));
    pack(r, theirs, true);
  }
}


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
  if (c.training.recompute_granularity != Recompute::None)
    return Error{fmt::format("{}: training.recompute_granularity: the runtime does not recompute activations (the "
                             "simulator does); set it to \"none\" to run this config",
                             c.source)};
  if (c.model.mlp != MlpKind::Gelu || c.model.key_value_heads() != c.model.heads)
    return Error{fmt::format("{}: model: the runtime's model is a GPT (multi-head attention, GELU MLP); set model.mlp to "
                             "\"gelu\" and model.kv_heads to model.heads ({}) to run this shape",
                             c.source, c.model.heads)};
  // Weights and gradients of every rank plus the activations of every microbatch in flight, fp32.
  const cpu::ModelShape s = model_shape(c);
  const double n = double(s.tokens()), h = s.hidden;
  const double params = 2.0 * s.vocab * h + double(s.layers) * (4.0 * h * h + 2.0 * h * s.ffn + 9.0 * h + s.ffn);
  const double activations = double(c.parallel.microbatches) * s.layers *
                             (n * (10.0 * h + 2.0 * s.ffn) + double(s.batch) * s.heads * s.seq * s.seq);
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

Result<RunResult> run_rank(Transport& comm, const Job& job, const RunOptions& options) {
  if (comm.size() != job.layout.devices)
    return Error{fmt::format("{} ranks cannot run a pipeline of {} devices", comm.size(), job.layout.devices)};
  std::unique_ptr<Backend> backend;
  try {
    backend = make_backend(options, job, comm.rank());
  } catch (const std::exception& e) {  // e.g. out of device memory: end every rank, never hang them
    const std::string why = fmt::format("rank {} could not set up its {} backend: {}", comm.rank(),
                                        options.backend == BackendKind::Cuda ? "CUDA" : "CPU", e.what());
    comm.abort(why);
    return Error{why};
  }
  RankExecutor executor(comm, std::move(backend), job, options);
  return executor.run();
}

}  // namespace pipesim::runtime
