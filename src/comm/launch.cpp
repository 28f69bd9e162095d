// Settings agreement and the launcher (launch.h).
#include "distca/comm/launch.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>

#include "distca/comm/local.h"

namespace distca::comm {
namespace {

constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t fnv(uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

// Length, then bytes: no two different texts hash the same stream.
uint64_t fnv_text(uint64_t h, const std::string& s) {
  const uint64_t len = s.size();
  return fnv(fnv(h, &len, sizeof(len)), s.data(), s.size());
}

uint64_t setting_hash(const std::pair<std::string, std::string>& s) {
  return fnv_text(fnv_text(kFnvOffset, s.first), s.second);
}

// What every rank tells the others first.
struct Summary {
  uint64_t hash = 0;
  uint64_t count = 0;
};

// One setting as a fixed-size record, for the all-gather that names a mismatch. `present`
// is 0 when the rank's list is shorter than the index asked for.
struct Record {
  char name[64];
  char value[168];
  uint8_t present;
};

void copy_text(char* out, std::size_t cap, const std::string& s) {
  std::string t = s.size() < cap ? s : s.substr(0, cap - 4) + "...";
  std::memcpy(out, t.c_str(), t.size() + 1);
}

std::string describe_name(const Record& r) { return r.present ? std::string(r.name) : std::string("no setting there"); }

// The message for the first differing setting, comparing rank 0's record with rank q's.
Status disagreement(const Record& first, const Record& other, int q) {
  const std::string rq = "rank " + std::to_string(q);
  if (first.present && other.present && std::strcmp(first.name, other.name) == 0) {
    return Status::invalid_argument("ranks disagree on " + std::string(first.name) + ": rank 0 has '" +
                                    first.value + "', " + rq + " has '" + other.value + "'");
  }
  return Status::invalid_argument("ranks disagree on their settings: rank 0 has " + describe_name(first) + ", " +
                                  rq + " has " + describe_name(other));
}

}  // namespace

Settings& Settings::add(std::string name, std::string value) {
  items_.emplace_back(std::move(name), std::move(value));
  return *this;
}

Settings& Settings::add(std::string name, double value) {
  char b[40];
  std::snprintf(b, sizeof(b), "%.17g", value);
  return add(std::move(name), std::string(b));
}

uint64_t Settings::hash() const {
  uint64_t h = kFnvOffset;
  for (const auto& s : items_) {
    const uint64_t one = setting_hash(s);
    h = fnv(h, &one, sizeof(one));
  }
  return h;
}

Status agree_on_settings(Communicator& comm, const Settings& settings) {
  const auto& items = settings.items();
  const Summary mine{settings.hash(), items.size()};
  DISTCA_ASSIGN_OR_RETURN(std::vector<Summary> all, comm.all_gather_value(mine));
  const bool same = std::all_of(all.begin(), all.end(), [&](const Summary& s) {
    return s.hash == all[0].hash && s.count == all[0].count;
  });
  if (same) return Status::ok_status();
  // Every rank computes the same k from the same summaries, so the next all-gather has one size.
  uint64_t k = 0;
  for (const Summary& s : all) k = std::max(k, s.count);
  std::vector<uint64_t> hashes(k, 0);
  for (std::size_t i = 0; i < items.size(); ++i) hashes[i] = setting_hash(items[i]);
  const auto n = static_cast<std::size_t>(comm.size());
  std::vector<uint64_t> every(n * k, 0);
  DISTCA_RETURN_IF_ERROR(comm.all_gather(std::as_bytes(std::span<const uint64_t>(hashes)),
                                         std::as_writable_bytes(std::span<uint64_t>(every))));
  // The first index where some rank differs from rank 0 (a shorter list differs by absence).
  std::size_t index = k;
  int other = 0;
  for (std::size_t i = 0; i < k && index == k; ++i) {
    for (std::size_t q = 1; q < n; ++q) {
      const bool present0 = i < all[0].count, present_q = i < all[q].count;
      if (present0 != present_q || every[q * k + i] != every[i]) {
        index = i;
        other = static_cast<int>(q);
        break;
      }
    }
  }
  // The hashes of the whole lists differed but no entry does: only a hash collision, in which
  // case the lists are equal after all.
  if (index == k) return Status::ok_status();
  Record r{};
  if (index < items.size()) {
    r.present = 1;
    copy_text(r.name, sizeof(r.name), items[index].first);
    copy_text(r.value, sizeof(r.value), items[index].second);
  }
  DISTCA_ASSIGN_OR_RETURN(std::vector<Record> records, comm.all_gather_value(r));
  return disagreement(records[0], records[static_cast<std::size_t>(other)], other);
}

namespace {

// The MPI side of launch(): this process is one rank.
Launched launch_mpi(const LaunchOptions& options, const Settings& settings, const PrepareFn& prepare,
                    const RankFn& run) {
  Launched out;
  auto made = make_mpi_communicator(nullptr, nullptr, options.mpi);
  if (!made.ok()) {
    out.status = made.status();
    return out;
  }
  MpiCommunicator& comm = **made;
  out.group = {comm.rank(), comm.size(), 1};
  out.speaks = comm.rank() == 0;
  if (Status agreed = agree_on_settings(comm, settings); !agreed.ok()) {
    out.status = agreed;
    return out;
  }
  Status prepared = prepare ? prepare(out.group) : Status::ok_status();
  auto codes = comm.all_gather_value(static_cast<int>(prepared.code()));
  if (!codes.ok()) comm.fail(codes.status());
  const auto bad = std::find_if(codes->begin(), codes->end(), [](int c) { return c != 0; });
  if (bad != codes->end()) {
    const int first = static_cast<int>(bad - codes->begin());
    out.speaks = first == comm.rank();
    out.status = out.speaks ? prepared
                            : Status(static_cast<StatusCode>(*bad), "rank " + std::to_string(first) + " refused");
    return out;
  }
  if (Status st = run(comm, 0); !st.ok()) comm.fail(st);
  return out;
}

// The local side: every rank is a thread of this process.
Launched launch_local(const LaunchOptions& options, const Settings& settings, const PrepareFn& prepare,
                      const RankFn& run) {
  Launched out;
  out.group = {0, options.ranks, options.ranks};
  if (options.ranks < 1) {
    out.status = Status::invalid_argument("--ranks must be at least 1 (got " + std::to_string(options.ranks) + ")");
    return out;
  }
  if (prepare) {
    out.status = prepare(out.group);
    if (!out.status.ok()) return out;
  }
  // The agreement's own error (every rank has it) rather than run_local's "rank R failed".
  std::mutex mu;
  std::optional<Status> disagreed;
  out.status = run_local(options.ranks, [&](Communicator& comm) {
    if (Status agreed = agree_on_settings(comm, settings); !agreed.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (!disagreed && agreed.code() == StatusCode::kInvalidArgument) disagreed = agreed;
      return agreed;
    }
    return run(comm, comm.rank());
  });
  if (disagreed) out.status = *disagreed;
  return out;
}

}  // namespace

Launched launch(const LaunchOptions& options, const Settings& settings, const PrepareFn& prepare,
                const RankFn& run) {
  return options.backend == Backend::kMpi ? launch_mpi(options, settings, prepare, run)
                                          : launch_local(options, settings, prepare, run);
}

}  // namespace distca::comm
