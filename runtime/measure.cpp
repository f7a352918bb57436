#include "measure.h"

#include <fmt/format.h>

#include <cmath>

#include "partition.h"

namespace pipesim::runtime {

void wait_for(Transport& comm, std::unique_ptr<Request> request, double timeout_s, const std::string& what) {
  wait_for(comm, *request, timeout_s, what);
}

void wait_for(Transport& comm, Request& request, double timeout_s, const std::string& what) {
  const auto start = Clock::now();
  while (!request.done()) {
    if (std::chrono::duration<double>(Clock::now() - start).count() > timeout_s)
      throw RankFailure(fmt::format("rank {}: no progress for {:g} s waiting for {}", comm.rank(), timeout_s, what));
    comm.wait_for_progress(0.001);
  }
}

void StepRecorder::finished(TaskId id, TimeNs at, TimeNs vocab_layer_ns) {
  timeline_.end[std::size_t(id)] = at;
  vocab_layer_ns_[std::size_t(id)] = vocab_layer_ns;
  live_after_[std::size_t(id)] = buffers_.note_peak(id);
}

void StepRecorder::clear(std::size_t ops) {
  timeline_.start.assign(ops, 0), timeline_.end.assign(ops, 0);
  vocab_layer_ns_.assign(ops, 0), live_after_.assign(ops, 0);
}

void StepRecorder::move_into(RunResult& result) {
  result.timeline = std::move(timeline_);
  result.vocab_layer_ns = std::move(vocab_layer_ns_);
  result.live_after = std::move(live_after_);
}

GradientCheck::GradientCheck(const ModelShape& shape, std::uint64_t seed, std::span<const Batch> batches)
    : shape_(shape), grad_(cpu::zero_model(shape)) {
  const cpu::Model model = cpu::make_model(shape, seed);
  for (const Batch& b : batches) loss_ += cpu::reference_step(shape, model, b.tokens, b.targets, grad_);
  // The loss is the mean over the iteration's microbatches, and so are its gradients.
  const float scale = 1.0f / float(batches.size());
  const auto rescale = [scale](std::vector<float>& t) {
    for (float& v : t) v *= scale;
  };
  rescale(grad_.embedding), rescale(grad_.head), rescale(grad_.final_gain), rescale(grad_.final_bias);
  // Tied, the one matrix's gradient is both uses' sum: what a rank holding both reports as the
  // embedding's, and two devices holding a copy each report as theirs.
  if (shape.tied_embeddings)
    for (std::size_t i = 0; i < grad_.embedding.size(); ++i) grad_.head[i] = grad_.embedding[i] += grad_.head[i];
  for (cpu::Layer& l : grad_.layers)
    for (std::vector<float>* t : l.tensors()) rescale(*t);
  loss_ /= double(batches.size());
}

std::vector<float> GradientCheck::error_terms(std::span<const HostGradient> gradients) const {
  std::vector<float> terms(2 * tensor_names(shape_).size(), 0.0f);
  for (const HostGradient& g : gradients) {
    const std::span<const float> tensor = model_tensor(grad_, g.tensor).subspan(g.offset);
    double diff = 0, ref = 0;
    for (std::size_t i = 0; i < g.values.size(); ++i) {
      const float reference = tensor[g.elements.empty() ? i : g.elements[i]];
      diff += double(g.values[i] - reference) * (g.values[i] - reference);
      ref += double(reference) * reference;
    }
    terms[2 * g.tensor] += float(diff), terms[2 * g.tensor + 1] += float(ref);
  }
  return terms;
}

CheckResult GradientCheck::result(std::span<const float> terms, double loss, const RunOptions& options) const {
  const bool fp32 = options.dtype == DType::F32;
  CheckResult check{.loss = loss, .reference_loss = loss_, .max_grad_rel_err = 0, .worst_tensor = "",
                    .loss_tolerance = options.loss_tolerance >= 0 ? options.loss_tolerance : fp32 ? 1e-5 : 1e-2,
                    .grad_tolerance = options.grad_tolerance >= 0 ? options.grad_tolerance : fp32 ? 1e-4 : 0};
  const std::vector<std::string> names = tensor_names(shape_);
  for (std::size_t t = 0; t < names.size(); ++t) {
    const double diff = terms[2 * t], ref = terms[2 * t + 1];
    const double err = ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
    if (err >= check.max_grad_rel_err) check.max_grad_rel_err = err, check.worst_tensor = names[t];
  }
  return check;
}

void gather_measurements(Transport& comm, const TaskGraph& graph, double timeout_s, Bytes peak, TaskId peak_op,
                         Bytes static_bytes, RunResult& result) {
  const int ranks = comm.size(), rank = comm.rank();
  result.peak_activation_bytes.assign(std::size_t(ranks), 0);
  result.peak_op.assign(std::size_t(ranks), kNoTask);
  result.static_bytes.assign(std::size_t(ranks), 0);
  // One rank's figures as one message of doubles: written by its owner, read back by rank 0.
  const auto pack = [&](int from, std::vector<double>& record, bool write) {
    std::size_t i = 0;
    const auto field = [&](auto& value) {
      if (write) value = static_cast<std::remove_reference_t<decltype(value)>>(record[i]);
      else record.push_back(double(value));
      ++i;
    };
    for (TaskId id = 0; id < TaskId(graph.size()); ++id)
      if (graph.task(id).device == from)
        field(result.timeline.start[std::size_t(id)]), field(result.timeline.end[std::size_t(id)]),
            field(result.vocab_layer_ns[std::size_t(id)]), field(result.live_after[std::size_t(id)]);
    field(result.peak_activation_bytes[std::size_t(from)]), field(result.peak_op[std::size_t(from)]),
        field(result.static_bytes[std::size_t(from)]);
  };
  result.peak_activation_bytes[std::size_t(rank)] = peak, result.peak_op[std::size_t(rank)] = peak_op;
  result.static_bytes[std::size_t(rank)] = static_bytes;
  std::vector<double> record;
  if (rank != 0) {
    pack(rank, record, false);
    // Then its tensor-parallel collectives, whose number rank 0 cannot know: a count first.
    std::vector<double> count{double(result.tensor_parallel.size())}, collectives;
    for (const InnerCollective& c : result.tensor_parallel)
      collectives.insert(collectives.end(), {double(c.start), double(c.end), double(int(c.kind))});
    for (std::vector<double>* message : {&record, &count, &collectives})
      wait_for(comm, comm.control().send(host_buffer(std::span(*message)), 0), timeout_s,
               "rank 0 to take this rank's measurements");
    return;
  }
  for (int r = 1; r < ranks; ++r) {
    std::vector<double> theirs;
    pack(r, theirs, false);  // sizes the record
    const std::string what = fmt::format("rank {}'s measurements", r);
    wait_for(comm, comm.control().recv(host_buffer(std::span(theirs)), r), timeout_s, what);
    pack(r, theirs, true);
    std::vector<double> count{0};
    wait_for(comm, comm.control().recv(host_buffer(std::span(count)), r), timeout_s, what);
    std::vector<double> collectives(3 * std::size_t(count[0]));
    wait_for(comm, comm.control().recv(host_buffer(std::span(collectives)), r), timeout_s, what);
    for (std::size_t i = 0; i < collectives.size(); i += 3)
      result.tensor_parallel.push_back({.device = r, .start = TimeNs(collectives[i]), .end = TimeNs(collectives[i + 1]),
                                        .kind = InnerCollective::Kind(int(collectives[i + 2]))});
  }
}

}  // namespace pipesim::runtime
