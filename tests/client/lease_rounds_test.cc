// LeaseRounds (client/mapped/lease_rounds.h): the lease thread's queue and the bounded waits of a
// mapped session's BeginStep, on their own.
#include "client/mapped/lease_rounds.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace stash::client {
namespace {

using std::chrono::milliseconds;

LeaseWork Lease() {
  LeaseWork w;
  w.lease = true;
  return w;
}

TEST(LeaseRounds, AsksMergeIntoOneTakeAndOnlyLeasesAndReconnectsAreRounds) {
  LeaseRounds rounds;
  LeaseWork back;
  back.give_back = {7};
  EXPECT_EQ(rounds.Ask(back), 0u) << "giving back is not a round";
  EXPECT_EQ(rounds.Ask(Lease()), 1u);
  LeaseWork again;
  again.reconnect = true;
  again.give_back = {8};
  again.orphans = {1, 2};
  again.orphans_of = "old";
  EXPECT_EQ(rounds.Ask(again), 2u);
  LeaseWork work;
  uint64_t round = 0;
  ASSERT_TRUE(rounds.Next(&work, &round));
  EXPECT_EQ(round, 2u) << "one take answers every round asked so far";
  EXPECT_TRUE(work.lease && work.reconnect);
  EXPECT_EQ(work.give_back, (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(work.orphans, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(work.orphans_of, "old");
  EXPECT_TRUE(rounds.TakeLeft().empty()) << "taken whole";

  // Orphans of two sessions are never sent as one batch: the newer session's win.
  LeaseWork older, newer;
  older.orphans = {5};
  older.orphans_of = "a";
  newer.orphans = {6};
  newer.orphans_of = "b";
  rounds.Ask(older);
  rounds.Ask(newer);
  const LeaseWork left = rounds.TakeLeft();
  EXPECT_EQ(left.orphans, (std::vector<uint64_t>{6}));
  EXPECT_EQ(left.orphans_of, "b");
}

TEST(LeaseRounds, AStepWaitsForItsRoundThenNotAtAllWhileRoundsComeLate) {
  LeaseRounds rounds;
  const uint64_t first = rounds.Ask(Lease());
  std::thread answer([&] {
    LeaseWork work;
    uint64_t round = 0;
    ASSERT_TRUE(rounds.Next(&work, &round));
    rounds.Answered(round);
  });
  rounds.WaitFor(first, milliseconds(10000));  // returns once answered, long before that
  answer.join();

  // Nobody answers the next one: the wait ends at its bound, and later waits do not wait.
  const uint64_t late = rounds.Ask(Lease());
  const auto t0 = std::chrono::steady_clock::now();
  rounds.WaitFor(late, milliseconds(50));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(50));
  const auto t1 = std::chrono::steady_clock::now();
  rounds.WaitFor(rounds.Ask(Lease()), milliseconds(10000));
  EXPECT_LT(std::chrono::steady_clock::now() - t1, milliseconds(5000)) << "slow: no wait";
  // An answer ends the slow spell: the next round is waited for again (and is answered).
  rounds.Answered(late);
  const uint64_t next = rounds.Ask(Lease());
  // Before the thread starts: it may sleep and answer before this thread runs again.
  const auto t2 = std::chrono::steady_clock::now();
  std::thread later([&] {
    LeaseWork work;
    uint64_t round = 0;
    ASSERT_TRUE(rounds.Next(&work, &round));
    std::this_thread::sleep_for(milliseconds(20));
    rounds.Answered(round);
  });
  rounds.WaitFor(next, milliseconds(10000));
  EXPECT_GE(std::chrono::steady_clock::now() - t2, milliseconds(20)) << "waited for it";
  later.join();
}

TEST(LeaseRounds, StopEndsTheThreadAndTheWaitsAndLeavesTheAsksToTake) {
  LeaseRounds rounds;
  std::thread thread([&] {
    LeaseWork work;
    uint64_t round = 0;
    while (rounds.Next(&work, &round)) {
    }
  });
  std::this_thread::sleep_for(milliseconds(10));
  rounds.Stop();
  thread.join();
  LeaseWork back;
  back.give_back = {3};
  rounds.Ask(back);
  rounds.WaitFor(rounds.Ask(Lease()), milliseconds(10000));  // stopped: returns at once
  EXPECT_EQ(rounds.TakeLeft().give_back, (std::vector<uint64_t>{3}));
}

}  // namespace
}  // namespace stash::client
