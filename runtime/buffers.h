#pragma once
/// A rank's live tensors between ops, keyed by (kind, stage, microbatch) as docs/runtime.md ("What
/// runs", the op interpreter) has it, with the bytes they hold counted, so the runtime reports the
/// memory it really used. A missing buffer is an error that names it, never a crash.
#include <fmt/format.h>

#include <compare>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"
#include "task_graph.h"
#include "units.h"

namespace pipesim::runtime {

enum class Buf {
  StageInput,   ///< activation entering a stage (received, or from the stage before on this device)
  StageOutput,  ///< activation leaving a stage, to send
  GradInput,    ///< gradient of a stage's output (received, or from the stage after)
  GradOutput,   ///< gradient of a stage's input, to send
  VocabInput,   ///< IF: this shard's embedding rows of the microbatch
  VocabX,       ///< the last stage's output X, broadcast to every device
  VocabLogits,  ///< S: this shard's logits
  VocabLocal,   ///< S: local max | sum-exp | target logit
  VocabTerms,   ///< S, Algorithm 2: A | Y
  VocabStats,   ///< after C0: global max | global sum-exp
  VocabDxPart,  ///< T, Algorithm 1: this shard's dX
  VocabDx,      ///< dX summed, for the last stage's backward
  VocabDy,      ///< the first stage's input gradient, broadcast for IB
};

struct Key {
  Buf buf;
  int stage;  ///< -1 for vocabulary buffers
  int microbatch;
  auto operator<=>(const Key&) const = default;
};

/// An op that cannot run: a buffer that should exist and does not (or the reverse) -- a bug in a
/// schedule or the executor -- or an op kind this runtime does not execute. Reported with the op.
struct OpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline std::string describe(const Key& k) {
  static const char* const kNames[] = {"stage input",  "stage output",  "output gradient", "input gradient",
                                       "IF output",    "X",             "logits",          "local softmax stats",
                                       "A and Y",      "global softmax stats", "dX share",  "dX",
                                       "dY"};
  return k.stage >= 0 ? fmt::format("{} of stage {}, microbatch {}", kNames[int(k.buf)], k.stage, k.microbatch)
                      : fmt::format("{} of microbatch {}", kNames[int(k.buf)], k.microbatch);
}

/// What a stage keeps from its F for its B and W: each layer's activations and, on the last stage,
/// the final norm's and the LM head's. Under full recomputation F keeps only the input of each group
/// of recomputed layers (their activations are null) and R rebuilds the activations from them.
struct StageCache {
  std::vector<std::unique_ptr<Activations>> layers;
  std::unique_ptr<Activations> head;
  std::vector<Tensor> kept_inputs;
  Bytes bytes() const {
    Bytes total = head ? head->bytes() : 0;
    for (const auto& layer : layers) total += layer ? layer->bytes() : 0;
    for (const Tensor& input : kept_inputs) total += Bytes(input.bytes());
    return total;
  }
};

/// Safe to use from a rank's compute and communication threads at once: the maps are locked, and
/// the IR's dependencies keep two threads from using the same entry at the same time. Entries keep
/// their address until removed (std::map), so a reference from get() stays valid meanwhile.
class BufferStore {
 public:
  Tensor& put(const Key& key, Tensor data) {
    std::lock_guard lock(mutex_);
    const auto [it, added] = tensors_.try_emplace(key, std::move(data));
    if (!added) throw OpError(describe(key) + " exists already");
    live_ += Bytes(it->second.bytes());
    return it->second;
  }
  Tensor& get(const Key& key) {
    std::lock_guard lock(mutex_);
    return find(key)->second;
  }
  Tensor take(const Key& key) {
    std::lock_guard lock(mutex_);
    const auto it = find(key);
    Tensor data = std::move(it->second);
    tensors_.erase(it);
    live_ -= Bytes(data.bytes());
    return data;
  }

  using CacheKey = std::pair<int, int>;  ///< (stage, microbatch)
  using Cache = StageCache;
  void put_cache(CacheKey key, Cache cache) {
    std::lock_guard lock(mutex_);
    const Bytes size = cache.bytes();
    if (!caches_.try_emplace(key, std::move(cache), size).second)
      throw OpError(fmt::format("the forward cache of stage {}, microbatch {} exists already", key.first, key.second));
    live_ += size;
  }
  StageCache& cache(CacheKey key) {
    std::lock_guard lock(mutex_);
    return find(key).first;
  }
  /// Call after shrinking a cache in place.
  void recount_cache(CacheKey key) {
    std::lock_guard lock(mutex_);
    auto& [cache, counted] = find(key);
    live_ += cache.bytes() - counted;
    counted = cache.bytes();
  }
  void drop_cache(CacheKey key) {
    std::lock_guard lock(mutex_);
    live_ -= find(key).second;
    caches_.erase(key);
  }

  /// Records the bytes held now if they are the most so far, with the op that just completed;
  /// returns them.
  Bytes note_peak(TaskId op) {
    std::lock_guard lock(mutex_);
    if (live_ > peak_) peak_ = live_, peak_op_ = op;
    return live_;
  }
  void reset_peak() {
    std::lock_guard lock(mutex_);
    peak_ = 0, peak_op_ = kNoTask;
  }
  Bytes peak() const { return peak_; }
  TaskId peak_op() const { return peak_op_; }

 private:
  std::map<Key, Tensor>::iterator find(const Key& key) {
    const auto it = tensors_.find(key);
    if (it == tensors_.end()) throw OpError(describe(key) + " is missing: no earlier op produced it");
    return it;
  }
  std::pair<Cache, Bytes>& find(CacheKey key) {
    const auto it = caches_.find(key);
    if (it == caches_.end())
      throw OpError(fmt::format("the forward cache of stage {}, microbatch {} is missing: its F has not run",
                                key.first, key.second));
    return it->second;
  }

  std::mutex mutex_;
  std::map<Key, Tensor> tensors_;
  std::map<CacheKey, std::pair<Cache, Bytes>> caches_;
  Bytes live_ = 0, peak_ = 0;
  TaskId peak_op_ = kNoTask;
};

}  // namespace pipesim::runtime
