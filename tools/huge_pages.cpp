// Blocks of 1 MiB or more of the pipesim executable on transparent huge pages. A graph of 400k ops
// and the arrays around it take ~80 MiB, touched once each: on 4 KiB pages that is ~20k page
// faults, over half the time `simulate` needs at that size (docs/benchmark.md). Whole huge pages
// (madvise, honoured where THP is in "madvise" or "always" mode) turn them into under 2k, for ~25 %
// more resident memory. Replacing the global allocation functions is the standard hook: every
// std::vector goes through them, and the arrays need no allocator of their own. Sanitizer builds
// keep their own.
#if !defined(__SANITIZE_ADDRESS__)
#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace {

constexpr std::size_t kHugePage = std::size_t(2) << 20;
constexpr std::size_t kLarge = std::size_t(1) << 20;  // smaller blocks stay on the ordinary heap

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
