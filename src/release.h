#pragma once
/// Frees what a container holds. Assigning `{}` to a std::vector does not: it picks the
/// initializer-list assignment, which clears the vector and keeps its memory.
#include <utility>

namespace pipesim {

template <class Container>
void release(Container& c) {
  Container().swap(c);
}

}  // namespace pipesim
