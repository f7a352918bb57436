#pragma once
#include <cstdint>

namespace pipesim::cpu {

/// splitmix64: a counter-based generator. Values keyed by a counter never depend on what else was
/// drawn, which is what makes weights and data independent of how the model is partitioned.
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace pipesim::cpu
