#pragma once
// What the CPU runtime's tests share: tiny.json's plans for a schedule and vocabulary mode, and the
// options of an in-process run.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "helpers.h"
#include "launch.h"
#include "plan.h"

namespace pipesim::testing::runs {

inline Config tiny_config(const std::vector<std::string>& overrides = {}) {
  return testing::shipped_config("tiny.json", overrides);
}

inline Plan plan_for(Config config, const std::string& schedule, const std::string& vocab) {
  config.schedule.name = schedule, config.schedule.vocab = *vocab_mode_named(vocab);
  Result<Plan> plan = make_plan(config);
  INFO((plan.ok() ? "" : plan.error().message));
  REQUIRE(plan.ok());
  return std::move(plan).value();
}

inline runtime::RunOptions options(int steps = 1, double timeout_s = 60) {
  runtime::RunOptions o;
  o.steps = steps, o.timeout_s = timeout_s;
  return o;
}

}  // namespace pipesim::testing::runs
