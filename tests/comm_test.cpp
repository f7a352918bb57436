// The in-process communicator keeps MPI's rules: messages between two ranks arrive in order,
// collectives on one lane match by their order there, lanes are independent, and reductions run in
// rank order whatever the threads' timing; an abort reaches every rank. (Catch2's assertions are not
// thread-safe: the ranks record what they saw, and the checks run after they join.)
#include <catch2/catch.hpp>

#include <latch>
#include <numeric>
#include <thread>

#include "inprocess_comm.h"

using namespace pipesim::runtime;

namespace {

void wait(Transport& comm, Request& request) {
  while (!request.done()) comm.wait_for_progress(0.001);
}

/// Runs `body(comm)` on one thread per rank; returns what each rank recorded.
std::vector<std::vector<float>> on_ranks(World& world, const std::function<std::vector<float>(Transport&)>& body) {
  std::vector<std::vector<float>> seen(static_cast<std::size_t>(world.ranks()));
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < world.ranks(); ++r) threads.emplace_back([&, r] { seen[std::size_t(r)] = body(world.rank(r)); });
  }
  return seen;
}

/// What `wait` threw, or "" when it did not.
std::string error_of(Transport& comm, Request& request) {
  try {
    wait(comm, request);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("messages between two ranks arrive in the order they were sent") {
  World world(2);
  const auto seen = on_ranks(world, [](Transport& comm) {
    std::vector<float> got;
    std::vector<std::vector<float>> data;
    for (int i = 0; i < 5; ++i) data.push_back({float(i), float(i * i)});
    if (comm.rank() == 0) {
      std::vector<std::unique_ptr<Request>> sends;
      for (auto& d : data) sends.push_back(comm.p2p().send(host_buffer(std::span(d)), 1));
      for (auto& s : sends) wait(comm, *s);
    } else {
      for (auto& d : data) {
        auto r = comm.p2p().recv(host_buffer(std::span(d)), 0);
        wait(comm, *r);
        got.insert(got.end(), d.begin(), d.end());
      }
    }
    return got;
  });
  CHECK(seen[1] == std::vector<float>{0, 0, 1, 1, 2, 4, 3, 9, 4, 16});
}

TEST_CASE("all-reduce, broadcast and reduce give every rank what MPI would") {
  World world(4);
  const auto seen = on_ranks(world, [](Transport& comm) {
    const float r = float(comm.rank());
    std::vector<float> sum{r, 10 * r}, max{r, -r}, bcast{r, r}, reduced{r + 1, 0};
    auto a = comm.lane(0).all_reduce(host_buffer(std::span(sum)), ReduceOp::Sum);
    auto b = comm.lane(0).all_reduce(host_buffer(std::span(max)), ReduceOp::Max);
    auto c = comm.lane(1).broadcast(host_buffer(std::span(bcast)), 2);  // another lane: completes independently of lane 0
    auto d = comm.lane(1).reduce(host_buffer(std::span(reduced)), ReduceOp::Sum, 3);
    for (Request* q : {a.get(), b.get(), c.get(), d.get()}) wait(comm, *q);
    return std::vector<float>{sum[0], sum[1], max[0], max[1], bcast[0], bcast[1], reduced[0], reduced[1]};
  });
  for (int r = 0; r < 4; ++r) {
    // Only the reduce's root gets the sum (1 + 2 + 3 + 4); the others keep their input.
    const float reduced = r == 3 ? 10.0f : float(r + 1);
    CHECK(seen[std::size_t(r)] == std::vector<float>{6, 60, 3, 0, 2, 2, reduced, 0});
  }
}

TEST_CASE("sums are taken in rank order, so they do not depend on thread timing") {
  // In fp32 (1e8 + 1) - 1e8 = 0 but 1e8 + (1 - 1e8) = 1 - 1: only rank order gives 0 every time.
  for (int repeat = 0; repeat < 20; ++repeat) {
    World world(3);
    const auto seen = on_ranks(world, [&](Transport& comm) {
      const float values[] = {1e8f, 1.0f, -1e8f};
      std::vector<float> v{values[comm.rank()]};
      if (comm.rank() == repeat % 3) std::this_thread::sleep_for(std::chrono::microseconds(repeat * 50));
      auto q = comm.lane(0).all_reduce(host_buffer(std::span(v)), ReduceOp::Sum);
      wait(comm, *q);
      return v;
    });
    for (const auto& v : seen) CHECK(v[0] == 0.0f);
  }
}

TEST_CASE("an abort reaches every rank's pending requests with the first rank's reason") {
  World world(3);
  std::vector<std::string> errors(3);
  on_ranks(world, [&](Transport& comm) {
    if (comm.rank() == 1) {
      comm.abort("rank 1 failed at F(d1,s1,m0): test");
      return std::vector<float>{};
    }
    std::vector<float> v{1};
    try {
      auto q = comm.lane(0).all_reduce(host_buffer(std::span(v)), ReduceOp::Sum);  // rank 1 never joins
      errors[std::size_t(comm.rank())] = error_of(comm, *q);
    } catch (const CommError& e) {  // or the abort came first, and posting says so
      errors[std::size_t(comm.rank())] = e.what();
    }
    return v;
  });
  CHECK(errors[0] == "rank 1 failed at F(d1,s1,m0): test");
  CHECK(errors[2] == "rank 1 failed at F(d1,s1,m0): test");
  CHECK(world.abort_reason() == "rank 1 failed at F(d1,s1,m0): test");
}

TEST_CASE("ranks that disagree on a message's size get an error, not a silent truncation") {
  World world(2);
  std::string error;
  on_ranks(world, [&](Transport& comm) {
    std::vector<float> data(comm.rank() == 0 ? 3 : 2);
    if (comm.rank() == 0) {
      try {
        auto s = comm.p2p().send(host_buffer(std::span(data)), 1);
        error_of(comm, *s);  // ends when the receiver aborts
      } catch (const CommError&) {
      }
    } else {
      auto r = comm.p2p().recv(host_buffer(std::span(data)), 0);
      error = error_of(comm, *r);
      comm.abort(error);
    }
    return data;
  });
  CHECK(error == "rank 1 expected 8 bytes from rank 0, got 12");
}

TEST_CASE("all-gather lays every rank's block side by side; reduce-scatter gives each rank its block of the sum") {
  World world(3);
  const auto seen = on_ranks(world, [](Transport& comm) {
    const float r = float(comm.rank());
    std::vector<float> mine{r, 10 + r}, gathered(6), whole{r, 2 * r, 3 * r, 4 * r, 5 * r, 6 * r}, block(2);
    auto gather = comm.lane(0).all_gather(host_buffer(std::span(mine)), host_buffer(std::span(gathered)));
    auto scatter = comm.lane(0).reduce_scatter(host_buffer(std::span(whole)), host_buffer(std::span(block)), ReduceOp::Sum);
    wait(comm, *gather), wait(comm, *scatter);
    gathered.insert(gathered.end(), block.begin(), block.end());
    return gathered;
  });
  // Σ_r r·k over ranks 0, 1, 2 is 3k; rank i gets elements 2i and 2i + 1 (k = 2i + 1, 2i + 2).
  for (int i = 0; i < 3; ++i)
    CHECK(seen[std::size_t(i)] == std::vector<float>{0, 10, 1, 11, 2, 12, float(3 * (2 * i + 1)), float(3 * (2 * i + 2))});
}

TEST_CASE("a collective whose blocks do not tile the buffer is refused") {
  World world(2);
  Transport& comm = world.rank(0);
  std::vector<float> in(3), out(5);
  CHECK_THROWS_WITH(comm.lane(0).all_gather(host_buffer(std::span(in)), host_buffer(std::span(out))),
                    Catch::Contains("are not 2 blocks of 3"));
  const std::vector<std::size_t> two_and_one{2, 1}, three_and_two{3, 2};
  CHECK_THROWS_WITH(comm.lane(0).all_to_all(host_buffer(std::span(in)), two_and_one, host_buffer(std::span(out)),
                                            two_and_one),
                    Catch::Contains("counts add up to 3 and 3 values, its buffers hold 3 and 5"));
  CHECK_THROWS_WITH(comm.lane(0).all_to_all(host_buffer(std::span(in)), std::vector<std::size_t>{3},
                                            host_buffer(std::span(out)), three_and_two),
                    Catch::Contains("an all-to-all of 2 ranks given 1 send and 2 receive counts"));
}

TEST_CASE("all-to-all sends each rank its block, however uneven, and gives every rank's in rank order") {
  // Rank r sends rank d (r + 2d) mod 3 values, 100r + 10d + k: blocks of 0, 1 and 2 values (rank 0
  // sends itself nothing, rank 3 gets nothing from rank 0).
  const auto count = [](int from, int to) { return std::size_t((from + 2 * to) % 3); };
  World world(4);
  const auto seen = on_ranks(world, [&](Transport& comm) {
    const int me = comm.rank();
    std::vector<std::size_t> send_counts, recv_counts;
    std::vector<float> in;
    for (int d = 0; d < 4; ++d) {
      send_counts.push_back(count(me, d)), recv_counts.push_back(count(d, me));
      for (std::size_t k = 0; k < count(me, d); ++k) in.push_back(float(100 * me + 10 * d + int(k)));
    }
    std::vector<float> out(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}), -1.0f);
    Communicator& lane = comm.lane(0);
    wait(comm, *lane.all_to_all(host_buffer(std::span(in)), send_counts, host_buffer(std::span(out)), recv_counts));
    // Back again with the counts swapped, as a MoE layer's combine returns what its dispatch sent.
    std::vector<float> back(in.size(), -1.0f);
    wait(comm, *lane.all_to_all(host_buffer(std::span(out)), recv_counts, host_buffer(std::span(back)), send_counts));
    out.push_back(float(back == in));
    return out;
  });
  for (int me = 0; me < 4; ++me) {
    std::vector<float> expected;
    for (int r = 0; r < 4; ++r)
      for (std::size_t k = 0; k < count(r, me); ++k) expected.push_back(float(100 * r + 10 * me + int(k)));
    expected.push_back(1.0f);  // the round trip gave back what the rank sent
    CAPTURE(me);
    CHECK(seen[std::size_t(me)] == expected);
  }
}

TEST_CASE("an all-to-all whose ranks disagree on a block's size fails on both, not truncates") {
  World world(2);
  std::vector<std::string> errors(2);
  on_ranks(world, [&](Transport& comm) {
    // Rank 0 sends rank 1 one value; rank 1 expects two.
    const std::vector<std::size_t> sends{1, 1}, receives{std::size_t(comm.rank() + 1), 1};
    std::vector<float> in(2), out(comm.rank() == 0 ? 2 : 3);
    std::string& error = errors[std::size_t(comm.rank())];
    try {
      auto q = comm.lane(0).all_to_all(host_buffer(std::span(in)), sends, host_buffer(std::span(out)), receives);
      error = error_of(comm, *q);  // the other rank arrived last, found the disagreement and aborted
    } catch (const std::logic_error& e) {  // this rank arrived last
      error = e.what();
      comm.abort(error);
    }
    return out;
  });
  for (const std::string& error : errors)
    CHECK(error == "all-to-all on lane 0: rank 0 sends 1 values to rank 1, which expects 2");
}

TEST_CASE("subgroups reduce among their members only, and an abort reaches every rank of the world") {
  World world(4);
  std::latch subgroups_done(4);  // rank 3 aborts only once every rank is through with its subgroup
  const auto seen = on_ranks(world, [&](Transport& comm) {
    // Ranks {0, 2} and {1, 3}: the data-parallel groups of two devices with two replicas, say.
    const int parity = comm.rank() % 2;
    std::unique_ptr<Transport> group = comm.subgroup({parity, parity + 2}, GroupUse::Pipeline);
    std::vector<float> value{float(comm.rank() + 1)};
    auto sum = group->lane(0).all_reduce(host_buffer(std::span(value)), ReduceOp::Sum);
    wait(*group, *sum);
    // Point-to-point in the subgroup: its rank 1 sends to its rank 0.
    std::vector<float> message{float(comm.rank())};
    if (group->rank() == 1) wait(*group, *group->p2p().send(host_buffer(std::span(message)), 0));
    else wait(*group, *group->p2p().recv(host_buffer(std::span(message)), 1));
    // Rank 3 aborts through its subgroup; the others wait in a world collective it never joins.
    std::string error;
    std::vector<float> never{0};
    subgroups_done.count_down();
    if (comm.rank() == 3) subgroups_done.wait(), group->abort("rank 3 gave up");
    else try {
        wait(comm, *comm.lane(1).all_reduce(host_buffer(std::span(never)), ReduceOp::Sum));
      } catch (const CommError& e) {
        error = e.what();
      }
    return std::vector<float>{float(group->rank()), value[0], message[0], float(error.find("rank 3 gave up") != std::string::npos)};
  });
  // Sums 1 + 3 and 2 + 4; each group's rank 0 got its rank 1's world rank (2 or 3).
  CHECK(seen[0] == std::vector<float>{0, 4, 2, 1});
  CHECK(seen[1] == std::vector<float>{0, 6, 3, 1});
  CHECK(seen[2] == std::vector<float>{1, 4, 2, 1});
}
