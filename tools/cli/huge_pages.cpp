// The pipesim executable's heap on transparent huge pages, and kept for reuse. A graph of 400k ops
// and the arrays around it take ~80 MiB, touched once each: on 4 KiB pages that is ~20k page
// faults, over half the time `simulate` needs at that size (docs/history/benchmark-rounds.md); huge
// pages (madvise, honoured where THP is in "madvise" or "always" mode) turn them into under 2k.
// Replacing the global allocation functions is the standard hook: every std::vector goes through
// them, and the arrays need no allocator of their own. Sanitizer builds keep their own.
//
// Every block comes from glibc's heap, which grows with brk in steps of 256 MiB, each marked for huge
// pages as soon as the break moves, before most of it is touched. glibc would otherwise map each
// block of 128 KiB or more apart and unmap it when freed, so that every phase of planning (the V
// schedules' candidate orders, the graph, the simulator's state) faulted in fresh pages; kept in
// the heap, what one phase frees the next reuses, already faulted in.
//
// Why steps that large: each is a memory region of its own (the marked region before it cannot grow
// into it), and the huge page that straddles two regions is faulted in as 512 small pages. With
// 32 MiB steps that made 3.6k of the 4.5k faults of a 1.4 M-op run and ~8 % of its time. A step costs
// only address space; its pages are faulted in when first touched.
#if !defined(__SANITIZE_ADDRESS__)
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <new>

namespace {

constexpr std::size_t kHugePage = std::size_t(2) << 20;
constexpr std::size_t kHeapStep = std::size_t(256) << 20;

std::atomic<std::uintptr_t> heap_advised{0};  ///< the break up to which the heap is marked; 0: not yet
std::mutex heap_advice_mutex;

/// No block is mapped apart (M_MMAP_MAX 0; glibc still maps one that no heap can hold, e.g. a
/// worker thread's block over 64 MiB), freed memory stays (no trim), and the heap grows by
/// kHeapStep at least. `pipesim run` needs the same of its CPU backend: measured op times must not
/// include faults (keep_freed_host_memory, runtime/cpu_backend.h, says so again for other hosts).
const bool heap_configured = [] {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  mallopt(M_TOP_PAD, int(kHeapStep));
  heap_advised = reinterpret_cast<std::uintptr_t>(sbrk(0));
  return true;
}();

/// Marks the heap's growth since the last call for huge pages. sbrk(0) only reads the break.
void advise_heap_growth() {
  const auto end = reinterpret_cast<std::uintptr_t>(sbrk(0));
  const std::uintptr_t seen = heap_advised.load(std::memory_order_relaxed);
  if (seen == 0 || end <= seen) return;
  std::lock_guard lock(heap_advice_mutex);
  const std::uintptr_t from = heap_advised.load(std::memory_order_relaxed);
  if (end <= from) return;
  // Whole huge pages only: the one the old break falls in is already partly in use.
  const std::uintptr_t begin = (from + kHugePage - 1) / kHugePage * kHugePage;
#ifdef MADV_HUGEPAGE
  if (begin < end) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
  heap_advised.store(end, std::memory_order_relaxed);
}

void* allocate(std::size_t bytes) {
  void* block = std::malloc(bytes ? bytes : 1);
  if (!block) throw std::bad_alloc();
  advise_heap_growth();
  return block;
}

}  // namespace

void* operator new(std::size_t bytes) { return allocate(bytes); }
void* operator new[](std::size_t bytes) { return allocate(bytes); }
void operator delete(void* block) noexcept { std::free(block); }
void operator delete[](void* block) noexcept { std::free(block); }
void operator delete(void* block, std::size_t) noexcept { std::free(block); }
void operator delete[](void* block, std::size_t) noexcept { std::free(block); }
#endif
