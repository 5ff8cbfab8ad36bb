// dist::ControlPlane under mpirun (np 1, 2, 4): agree runs its function on
// rank 0 only and raises rank 0's tprun::Error on every rank alike; broadcasts
// carry rank 0's value (empty, binary, multi-megabyte); the barrier orders a
// side effect; the record channel delivers each rank's Record and Finish
// messages to rank 0 in order; two planes never see each other's messages.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "dist/comm_watchdog.h"
#include "dist/control_plane.h"
#include "runtime/error.h"

namespace tprun::dist {
namespace {

namespace fs = std::filesystem;
using Tag = ControlPlane::Tag;

// Every rank's copy of rank 0's error: same kind, same message, raised on all ranks.
template <typename E>
void expect_agreed_error(ControlPlane& plane, const std::string& message, Error::Kind kind) {
  int ran = 0;
  try {
    plane.agree([&] {
      ++ran;
      throw E(message);
    });
    ADD_FAILURE() << "agree returned although rank 0's function threw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind);
    EXPECT_TRUE(std::string(e.what()) == message)
        << "rank " << plane.rank() << " got: " << std::string(e.what()).substr(0, 200);
    EXPECT_TRUE(e.all_ranks()) << "an agreed error is raised on every rank alike";
  }
  EXPECT_EQ(ran, plane.rank() == 0 ? 1 : 0);
}

TEST(ControlPlane, SpansTheWorld) {
  ControlPlane plane(CommWatchdog::global());
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(plane.rank(), rank);
  EXPECT_EQ(plane.size(), size);
}

TEST(ControlPlane, AgreeRunsOnRankZeroOnly) {
  ControlPlane plane(CommWatchdog::global());
  int ran = 0;
  plane.agree([&] { ++ran; });
  EXPECT_EQ(ran, plane.rank() == 0 ? 1 : 0);
}

TEST(ControlPlane, AgreeRaisesRankZerosErrorOnEveryRank) {
  ControlPlane plane(CommWatchdog::global());
  expect_agreed_error<ConfigError>(plane, "manifest.toml: batch_size must be positive", Error::Kind::Config);
  expect_agreed_error<CheckpointError>(plane, "model/transformer: tensor 'x' is missing", Error::Kind::Checkpoint);
  expect_agreed_error<IoError>(plane, "cannot write out/results.jsonl: No space left on device", Error::Kind::Io);
  // An empty message travels as well as a long one.
  expect_agreed_error<ConfigError>(plane, "", Error::Kind::Config);
  std::string long_message;
  for (int i = 0; long_message.size() < 100000; ++i) long_message += fmt::format("line {} of a long message\n", i);
  expect_agreed_error<RequestError>(plane, long_message, Error::Kind::Request);
  // The plane stays in step after errors: the next agreement succeeds everywhere.
  int ran = 0;
  plane.agree([&] { ++ran; });
  EXPECT_EQ(ran, plane.rank() == 0 ? 1 : 0);
}

TEST(ControlPlane, BroadcastCarriesRankZerosValue) {
  ControlPlane plane(CommWatchdog::global());
  const bool root = plane.rank() == 0;
  auto rank0_text = [](size_t n) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) % 256);
    return s;
  };
  // Other ranks start from values of another length, so a broadcast that
  // left them alone (or resized wrongly) shows.
  for (size_t n : {size_t{0}, size_t{1}, size_t{4096}, size_t{3} << 20}) {
    std::string v = root ? rank0_text(n) : std::string(n + 17 + static_cast<size_t>(plane.rank()), 'x');
    plane.broadcast(v);
    ASSERT_EQ(v.size(), n);
    EXPECT_TRUE(v == rank0_text(n)) << "rank " << plane.rank() << ", " << n << " bytes";
  }
  for (int64_t x : {int64_t{0}, int64_t{-1}, INT64_MIN, INT64_MAX, int64_t{1} << 40}) {
    int64_t v = root ? x : 12345 + plane.rank();
    plane.broadcast(v);
    EXPECT_EQ(v, x);
  }
}

TEST(ControlPlane, BarrierOrdersRankZerosWrite) {
  ControlPlane plane(CommWatchdog::global());
  std::string dir;
  if (plane.rank() == 0) dir = (fs::temp_directory_path() / fmt::format("tprun-control-{}", ::getpid())).string();
  plane.broadcast(dir);
  const fs::path flag = fs::path(dir) / "written";
  if (plane.rank() == 0) {
    fs::create_directories(dir);
    usleep(200 * 1000);  // late: the others are in the barrier by now
    std::ofstream(flag) << "done";
  }
  plane.barrier();
  EXPECT_TRUE(fs::exists(flag)) << "rank " << plane.rank() << " left the barrier before rank 0 arrived";
  plane.barrier();  // everyone looked before rank 0 removes it
  if (plane.rank() == 0) fs::remove_all(dir);
}

// Each rank but 0 sends kRecords records, one large, then Finish; rank 0
// waits for every Finish and checks what arrived, in order per rank.
TEST(ControlPlane, RecordChannelDeliversInOrderToRankZero) {
  constexpr int kRecords = 20;
  ControlPlane plane(CommWatchdog::global());
  auto record = [](int rank, int i) {
    return i == kRecords / 2 ? std::string(2 << 20, static_cast<char>('a' + rank % 26))
                             : fmt::format("{{\"rank\": {}, \"i\": {}}}", rank, i);
  };
  // Rank 0 looks at the fresh plane before anyone sends: without the barrier
  // a fast sender's records could already be there (a race, not a bug).
  if (plane.rank() == 0) {
    EXPECT_EQ(plane.poll([](Tag, int, const std::string&) {}), 0) << "a fresh plane has nothing to take";
  }
  plane.barrier();
  if (plane.rank() != 0) {
    for (int i = 0; i < kRecords; ++i) plane.send_to_root(Tag::Record, record(plane.rank(), i));
    plane.send_to_root(Tag::Finish, "finished");
    plane.flush();
  } else {
    std::map<int, std::vector<std::string>> records;
    std::map<int, int> finishes;
    auto handle = [&](Tag tag, int source, const std::string& payload) {
      if (tag == Tag::Record) {
        EXPECT_EQ(finishes[source], 0) << "a record of rank " << source << " after its Finish";
        records[source].push_back(payload);
      } else {
        EXPECT_EQ(tag, Tag::Finish);
        EXPECT_EQ(payload, "finished");
        ++finishes[source];
      }
    };
    int finished = 0;
    while (finished < plane.size() - 1) {
      if (plane.poll(handle) == 0) plane.wait(handle);
      finished = 0;
      for (const auto& [source, n] : finishes) finished += n;
    }
    for (int r = 1; r < plane.size(); ++r) {
      EXPECT_EQ(finishes[r], 1) << "rank " << r;
      ASSERT_EQ(records[r].size(), static_cast<size_t>(kRecords)) << "rank " << r;
      for (int i = 0; i < kRecords; ++i) EXPECT_TRUE(records[r][i] == record(r, i)) << "rank " << r << " record " << i;
    }
    EXPECT_EQ(plane.poll(handle), 0) << "nothing beyond what was sent";
  }
  plane.barrier();
}

// Rank 0 handles its own records directly; one it queued for itself would
// still reach its own wait (nothing is dropped).
TEST(ControlPlane, RankZerosOwnMessageReachesItsWait) {
  ControlPlane plane(CommWatchdog::global());
  if (plane.rank() == 0) {
    plane.send_to_root(Tag::Record, "to myself");
    int got = 0;
    plane.wait([&](Tag tag, int source, const std::string& payload) {
      ++got;
      EXPECT_EQ(tag, Tag::Record);
      EXPECT_EQ(source, 0);
      EXPECT_EQ(payload, "to myself");
    });
    EXPECT_EQ(got, 1);
    plane.flush();
  }
  plane.barrier();
}

// Each plane has its own communicator: a message sent on one is never taken
// from the other, even when it was sent first.
TEST(ControlPlane, PlanesDoNotShareMessages) {
  ControlPlane first(CommWatchdog::global());
  ControlPlane second(CommWatchdog::global());
  if (first.rank() != 0) {
    first.send_to_root(Tag::Record, fmt::format("first from {}", first.rank()));
    second.send_to_root(Tag::Record, fmt::format("second from {}", first.rank()));
    first.flush();
    second.flush();
  } else {
    for (int r = 1; r < first.size(); ++r) {
      second.wait([&](Tag, int source, const std::string& payload) {
        EXPECT_EQ(payload, fmt::format("second from {}", source));
      });
      first.wait([&](Tag, int source, const std::string& payload) {
        EXPECT_EQ(payload, fmt::format("first from {}", source));
      });
    }
  }
  first.barrier();
  second.barrier();
}

}  // namespace
}  // namespace tprun::dist
