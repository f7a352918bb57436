#pragma once
/// The ZB-V order PyTorch 2.11 runs (`ScheduleZBVZeroBubble`), per rank, for comparison: pipesim's
/// zb-v takes it as one candidate, so it is never slower than PyTorch's order at the same memory,
/// and tests check the port against the file PyTorch writes.
#include "schedule.h"

namespace pipesim {

/// Needs V placement with 2 chunks per device; B is the input gradient, W the weight gradient.
DeviceOrders zbv_reference_orders(const Layout& layout, int microbatches);

}  // namespace pipesim
