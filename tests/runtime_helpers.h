#pragma once
// What the CPU runtime's tests share: tiny.json's plans for a schedule and vocabulary mode, the
// options of an in-process run, and a transport that wraps another.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "comm.h"
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

namespace pipesim::testing {

/// A transport over another one, which it owns when it is a subgroup's: rank, size and progress go
/// to the inner one. Tests override lane() and subgroup() to watch or break the calls.
class ForwardingTransport : public runtime::Transport {
 public:
  ForwardingTransport(runtime::Transport& inner, std::unique_ptr<runtime::Transport> owned)
      : owned_(std::move(owned)), inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void wait_for_progress(double seconds) override { inner_.wait_for_progress(seconds); }
  void wake() override { inner_.wake(); }
  bool aborted() override { return inner_.aborted(); }
  void abort(const std::string& why) override { inner_.abort(why); }

 protected:
  runtime::Transport& inner() const { return inner_; }

 private:
  std::unique_ptr<runtime::Transport> owned_;
  runtime::Transport& inner_;
};

}  // namespace pipesim::testing
