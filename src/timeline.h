#pragma once
/// When each op of a graph ran: the one record that the simulator and the runtime both produce, and
/// from which metrics and traces are derived, so simulated and measured runs line up.
#include <vector>

#include "units.h"

namespace pipesim {

struct Timeline {
  std::vector<TimeNs> start;  ///< indexed by TaskId; the iteration starts at 0
  std::vector<TimeNs> end;
};

}  // namespace pipesim
