#include "distca/comm/trace.h"

#include <cstring>
#include <nlohmann/json.hpp>

namespace distca::comm {

double TraceRecorder::to_us(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - epoch_).count();
}

double TraceRecorder::now_us() const { return to_us(Clock::now()); }

void TraceRecorder::record(TraceEvent e) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

std::vector<TraceEvent> TraceRecorder::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

std::string chrome_trace_json(std::span<const TraceEvent> events) {
  nlohmann::json list = nlohmann::json::array();
  for (const TraceEvent& e : events) {
    list.push_back({{"name", e.name},
                    {"cat", e.category},
                    {"ph", "X"},
                    {"ts", e.start_us},
                    {"dur", e.end_us - e.start_us},
                    {"pid", e.pid},
                    {"tid", e.tid}});
  }
  nlohmann::json doc = {{"traceEvents", list}, {"displayTimeUnit", "ms"}};
  return doc.dump() + "\n";
}

// Encoding: per event, name and category as (uint32 length, bytes), then pid, tid (int32)
// and start, end (double), all in host byte order: gathering is within one job, whose ranks
// share the architecture.
namespace {

template <class T>
void put(std::vector<std::byte>& out, const T& v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

void put_string(std::vector<std::byte>& out, const std::string& s) {
  put(out, static_cast<uint32_t>(s.size()));
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out.insert(out.end(), p, p + s.size());
}

class Reader {
 public:
  explicit Reader(std::span<const std::byte> b) : b_(b) {}
  bool done() const { return pos_ == b_.size(); }
  template <class T>
  bool get(T& v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_string(std::string& s) {
    uint32_t n = 0;
    if (!get(n) || b_.size() - pos_ < n) return false;
    s.assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }

 private:
  std::span<const std::byte> b_;
  std::size_t pos_ = 0;
};

}  // namespace

std::vector<std::byte> pack_trace_events(std::span<const TraceEvent> events) {
  std::vector<std::byte> out;
  for (const TraceEvent& e : events) {
    put_string(out, e.name);
    put_string(out, e.category);
    put(out, static_cast<int32_t>(e.pid));
    put(out, static_cast<int32_t>(e.tid));
    put(out, e.start_us);
    put(out, e.end_us);
  }
  return out;
}

Result<std::vector<TraceEvent>> unpack_trace_events(std::span<const std::byte> bytes) {
  std::vector<TraceEvent> events;
  Reader r(bytes);
  while (!r.done()) {
    TraceEvent e;
    int32_t pid = 0;
    int32_t tid = 0;
    if (!r.get_string(e.name) || !r.get_string(e.category) || !r.get(pid) || !r.get(tid) ||
        !r.get(e.start_us) || !r.get(e.end_us)) {
      return Status::corrupt("trace events: truncated record " + std::to_string(events.size()));
    }
    e.pid = pid;
    e.tid = tid;
    events.push_back(std::move(e));
  }
  return events;
}

}  // namespace distca::comm
