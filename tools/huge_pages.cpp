// Large allocations of the pipesim executable on transparent huge pages. A graph of 400k ops and
// the arrays around it take ~80 MiB, touched once each: on 4 KiB pages that is ~20k page faults,
// two thirds of the time `simulate` needs at that size (docs/benchmark.md). Asking for huge pages
// (madvise, honoured where THP is in "madvise" or "always" mode) turns them into a few hundred.
// Replacing the global allocation functions is the standard hook: every std::vector goes through
// them, and the arrays need no allocator of their own. Sanitizer builds keep their own.
#if !defined(__SANITIZE_ADDRESS__)
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <new>

namespace {

constexpr std::size_t kHugePage = std::size_t(2) << 20;
constexpr std::size_t kLarge = 2 * kHugePage;  // smaller blocks could not hold a whole huge page anyway

void* allocate(std::size_t bytes) {
  void* block = std::malloc(bytes ? bytes : 1);
  if (!block) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (bytes >= kLarge) {  // the whole huge pages inside the block, before anything touches them
    const auto begin = (reinterpret_cast<std::uintptr_t>(block) + kHugePage - 1) & ~(kHugePage - 1);
    const auto end = (reinterpret_cast<std::uintptr_t>(block) + bytes) & ~(kHugePage - 1);
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
#endif
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
