// Blocks of 1 MiB or more of the pipesim executable on transparent huge pages. A graph of 400k ops
// and the arrays around it take ~80 MiB, touched once each: on 4 KiB pages that is ~20k page
// faults, over half the time `simulate` needs at that size (docs/benchmark.md). Whole huge pages
// (madvise, honoured where THP is in "madvise" or "always" mode) turn them into under 2k, for ~25 %
// more resident memory. Replacing the global allocation functions is the standard hook: every
// std::vector goes through them, and the arrays need no allocator of their own. Sanitizer builds
// keep their own.
//
// Smaller blocks come from glibc's heap, which grows with brk -- and fresh 4 KiB pages there fault in
// ten times slower per byte than huge ones (the vectors of a V schedule's squeeze, a vocabulary
// pass's per-device lists). The heap is made to grow in steps of 32 MiB, and each step is marked
// for huge pages as soon as the break moves, before most of it is touched.
#if !defined(__SANITIZE_ADDRESS__)
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>

namespace {

constexpr std::size_t kHugePage = std::size_t(2) << 20;
constexpr std::size_t kLarge = std::size_t(1) << 20;  // smaller blocks stay on the ordinary heap
constexpr std::size_t kHeapStep = std::size_t(32) << 20;

std::atomic<std::uintptr_t> heap_advised{0};  ///< the break up to which the heap is marked; 0: not yet
std::mutex heap_advice_mutex;

/// The heap grows by kHeapStep at least, and blocks under kLarge stay in it (glibc would otherwise
/// map each block of 128 KiB or more apart, on small pages, and unmap it when freed). `pipesim run`
/// raises the threshold to 32 MiB and stops trimming when its CPU backend starts
/// (keep_freed_host_memory, runtime/cpu_backend.h): measured op times must not include faults.
/// Planning keeps 1 MiB: blocks above it are whole huge pages of their own (allocate below).
const bool heap_configured = [] {
  mallopt(M_TOP_PAD, int(kHeapStep));
  mallopt(M_MMAP_THRESHOLD, int(kLarge));
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
  void* block = nullptr;
  if (bytes >= kLarge) {
    // Whole, aligned huge pages (free() takes aligned_alloc's blocks), marked before anything
    // touches them. The rounding costs at most one huge page per block, on blocks of 1 MiB or more.
    const std::size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    block = std::aligned_alloc(kHugePage, rounded);
#ifdef MADV_HUGEPAGE
    if (block) madvise(block, rounded, MADV_HUGEPAGE);
#endif
  } else {
    block = std::malloc(bytes ? bytes : 1);
    advise_heap_growth();
  }
  if (!block) throw std::bad_alloc();
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
