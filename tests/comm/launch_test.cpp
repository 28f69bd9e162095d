// Settings agreement and the launcher (comm/launch.h) on the local backend: every rank of a
// group gets the same verdict, naming the first setting that differs with both values; the
// launcher runs prepare once and the rank function on every rank, and stops before running
// when the settings or the preparation fail.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "distca/comm/launch.h"
#include "distca/comm/local.h"

namespace distca::comm {
namespace {

// Runs agree_on_settings on n local ranks, rank r with make(r); every rank's Status.
std::vector<Status> agree_all(int n, const std::function<Settings(int)>& make) {
  std::vector<Status> out(static_cast<std::size_t>(n));
  Status st = run_local(n, [&](Communicator& comm) {
    out[static_cast<std::size_t>(comm.rank())] = agree_on_settings(comm, make(comm.rank()));
    return Status::ok_status();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

Settings base() {
  Settings s;
  s.add("command", "train").add("--steps", int64_t{3}).add("--overlap", "pingpong").add("--lr", 3e-3);
  return s;
}

TEST(Settings, HashSeesEveryNameValueAndTheirBoundaries) {
  EXPECT_EQ(base().hash(), base().hash());
  Settings a, b, c;
  a.add("ab", "c");
  b.add("a", "bc");
  c.add("ab", "c").add("", "");
  EXPECT_NE(a.hash(), b.hash());
  EXPECT_NE(a.hash(), c.hash());
  Settings d;
  d.add("--lr", 0.1 + 0.2);
  EXPECT_EQ(d.items()[0].second, "0.30000000000000004");  // round-trip exact
  Settings e;
  e.add("x", true).add("y", int64_t{-5}).add("z", uint64_t{7});
  EXPECT_EQ(e.items()[0].second, "true");
  EXPECT_EQ(e.items()[1].second, "-5");
  EXPECT_EQ(e.items()[2].second, "7");
}

TEST(AgreeOnSettings, EqualSettingsAgreeOnEveryGroupSize) {
  for (int n : {1, 2, 3, 5}) {
    for (const Status& st : agree_all(n, [](int) { return base(); })) EXPECT_TRUE(st.ok()) << st.to_string();
  }
}

TEST(AgreeOnSettings, ADifferentValueIsNamedWithBothValuesOnEveryRank) {
  const auto statuses = agree_all(3, [](int r) {
    Settings s;
    s.add("command", "train").add("--steps", int64_t{3}).add("--overlap", r == 2 ? "signal" : "pingpong");
    return s;
  });
  for (const Status& st : statuses) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(), "ranks disagree on --overlap: rank 0 has 'pingpong', rank 2 has 'signal'");
  }
}

TEST(AgreeOnSettings, TheFirstDifferingSettingInListOrderIsNamed) {
  const auto statuses = agree_all(2, [](int r) {
    Settings s;
    s.add("--width", int64_t{r == 0 ? 64 : 128}).add("--steps", int64_t{r == 0 ? 3 : 4});
    return s;
  });
  for (const Status& st : statuses) {
    EXPECT_EQ(st.message(), "ranks disagree on --width: rank 0 has '64', rank 1 has '128'");
  }
}

TEST(AgreeOnSettings, ListsOfDifferentNamesOrLengthsAreNamed) {
  auto names = agree_all(2, [](int r) {
    Settings s;
    s.add("command", "bench train").add(r == 0 ? "--rounds" : "--reps", int64_t{3});
    return s;
  });
  for (const Status& st : names) {
    EXPECT_EQ(st.message(), "ranks disagree on their settings: rank 0 has --rounds, rank 1 has --reps");
  }
  auto shorter = agree_all(2, [](int r) {
    Settings s = base();
    if (r == 1) s.add("--extra", "1");
    return s;
  });
  for (const Status& st : shorter) {
    EXPECT_EQ(st.message(), "ranks disagree on their settings: rank 0 has no setting there, rank 1 has --extra");
  }
}

TEST(AgreeOnSettings, LongValuesAreShortened) {
  const std::string long_a(500, 'a');
  const auto statuses = agree_all(2, [&](int r) {
    Settings s;
    s.add("--dist", r == 0 ? long_a : std::string("b"));
    return s;
  });
  const std::string& m = statuses[0].message();
  EXPECT_NE(m.find("'" + std::string(164, 'a') + "...'"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 1 has 'b'"), std::string::npos) << m;
  EXPECT_EQ(statuses[1].message(), m);
}

TEST(Launch, LocalRunsPrepareOnceAndEveryRank) {
  std::atomic<int> prepared{0};
  std::mutex mu;
  std::vector<int> slots;
  const Launched out = launch({Backend::kLocal, 3, {}}, base(),
                              [&](const GroupInfo& g) {
                                EXPECT_EQ(g.size, 3);
                                EXPECT_EQ(g.here, 3);
                                ++prepared;
                                return Status::ok_status();
                              },
                              [&](Communicator& comm, int slot) {
                                EXPECT_EQ(slot, comm.rank());
                                {
                                  std::lock_guard<std::mutex> lock(mu);
                                  slots.push_back(slot);
                                }
                                return comm.barrier();
                              });
  ASSERT_TRUE(out.status.ok()) << out.status.to_string();
  EXPECT_TRUE(out.speaks);
  EXPECT_EQ(out.group.size, 3);
  EXPECT_EQ(prepared.load(), 1);
  EXPECT_EQ(slots.size(), 3u);
}

TEST(Launch, LocalStopsBeforeRunningWhenPrepareFails) {
  bool ran = false;
  const Launched out = launch({Backend::kLocal, 2, {}}, base(),
                              [](const GroupInfo&) { return Status::out_of_memory("needs about 9 GiB"); },
                              [&](Communicator&, int) {
                                ran = true;
                                return Status::ok_status();
                              });
  EXPECT_EQ(out.status.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(out.status.message(), "needs about 9 GiB");
  EXPECT_TRUE(out.speaks);
  EXPECT_FALSE(ran);
}

TEST(Launch, LocalRankFailureIsReported) {
  const Launched out = launch({Backend::kLocal, 2, {}}, base(), nullptr, [](Communicator& comm, int) {
    return comm.rank() == 1 ? Status::internal("boom") : comm.barrier();
  });
  EXPECT_EQ(out.status.code(), StatusCode::kInternal);
  EXPECT_NE(out.status.message().find("rank 1 failed: boom"), std::string::npos) << out.status.message();
  const Launched none = launch({Backend::kLocal, 0, {}}, base(), nullptr, [](Communicator&, int) { return Status::ok_status(); });
  EXPECT_EQ(none.status.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace distca::comm
