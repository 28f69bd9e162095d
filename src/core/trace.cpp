#include "distca/core/trace.h"

#include <cstring>
#include <nlohmann/json.hpp>

namespace distca {

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

namespace {

nlohmann::json metadata_event(const char* what, int64_t pid, int64_t tid, nlohmann::json args) {
  return {{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

nlohmann::json span_event(const TraceEvent& e) {
  nlohmann::json j = {{"name", e.name},
                      {"cat", e.category},
                      {"ph", "X"},
                      {"ts", e.start_us},
                      {"dur", e.end_us - e.start_us},
                      {"pid", e.pid},
                      {"tid", e.tid}};
  if (!e.args.empty()) {
    nlohmann::json args = nlohmann::json::object();
    for (const TraceArg& a : e.args) args[a.key] = a.value;
    j["args"] = std::move(args);
  }
  return j;
}

}  // namespace

// The document is what nlohmann's dump() of the whole object would print (its objects are
// key-ordered: displayTimeUnit < otherData < traceEvents), assembled event by event so that a
// trace of millions of events never exists as a JSON tree.
TraceMetadata rank_trace_metadata(const std::string& name, int64_t ranks,
                                  std::vector<std::pair<std::string, TraceValue>> other_data) {
  TraceProcess proc{0, name, 0, {}};
  for (int64_t r = 0; r < ranks; ++r) proc.threads.emplace_back(r, "rank " + std::to_string(r));
  return {{std::move(proc)}, std::move(other_data)};
}

std::string chrome_trace_json(std::span<const TraceEvent> events, const TraceMetadata& metadata) {
  std::string out = "{\"displayTimeUnit\":\"ms\",";
  if (!metadata.other_data.empty()) {
    nlohmann::json other = nlohmann::json::object();
    for (const auto& [key, value] : metadata.other_data) {
      std::visit([&other, &key](const auto& v) { other[key] = v; }, value);
    }
    out += "\"otherData\":" + other.dump() + ",";
  }
  out += "\"traceEvents\":[";
  bool first = true;
  auto append = [&out, &first](const nlohmann::json& j) {
    if (!first) out += ',';
    first = false;
    out += j.dump();
  };
  for (const TraceProcess& p : metadata.processes) {
    append(metadata_event("process_name", p.pid, 0, {{"name", p.name}}));
    append(metadata_event("process_sort_index", p.pid, 0, {{"sort_index", p.sort_index}}));
    for (const auto& [tid, name] : p.threads) append(metadata_event("thread_name", p.pid, tid, {{"name", name}}));
  }
  for (const TraceEvent& e : events) append(span_event(e));
  out += "]}\n";
  return out;
}

// Encoding: per event, name and category as (uint32 length, bytes), then pid, tid (int64),
// start, end (double), the argument count (uint32) and each argument as (key, int64 value).
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
    put(out, e.pid);
    put(out, e.tid);
    put(out, e.start_us);
    put(out, e.end_us);
    put(out, static_cast<uint32_t>(e.args.size()));
    for (const TraceArg& a : e.args) {
      put_string(out, a.key);
      put(out, a.value);
    }
  }
  return out;
}

Result<std::vector<TraceEvent>> unpack_trace_events(std::span<const std::byte> bytes) {
  std::vector<TraceEvent> events;
  Reader r(bytes);
  while (!r.done()) {
    TraceEvent e;
    uint32_t nargs = 0;
    bool ok = r.get_string(e.name) && r.get_string(e.category) && r.get(e.pid) && r.get(e.tid) &&
              r.get(e.start_us) && r.get(e.end_us) && r.get(nargs);
    for (uint32_t i = 0; ok && i < nargs; ++i) {
      TraceArg a;
      ok = r.get_string(a.key) && r.get(a.value);
      if (ok) e.args.push_back(std::move(a));
    }
    if (!ok) return Status::corrupt("trace events: truncated record " + std::to_string(events.size()));
    events.push_back(std::move(e));
  }
  return events;
}

}  // namespace distca
