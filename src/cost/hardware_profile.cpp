#include "distca/cost/hardware_profile.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "distca/core/check.h"
#include "distca/core/io.h"

namespace distca {

const char* gemm_pass_name(GemmPass pass) {
  switch (pass) {
    case GemmPass::kForward: return "forward";
    case GemmPass::kBackwardData: return "backward_data";
    case GemmPass::kBackwardWeight: return "backward_weight";
  }
  return "?";
}

std::pair<int64_t, int64_t> ProfileShape::in_out(const std::string& layer) const {
  const int64_t qd = n_heads * head_dim, kvd = n_kv_heads * head_dim;
  if (layer == "wq") return {hidden, qd};
  if (layer == "wk" || layer == "wv") return {hidden, kvd};
  if (layer == "wo") return {qd, hidden};
  if (layer == "w1" || layer == "w3") return {hidden, ffn};
  if (layer == "w2") return {ffn, hidden};
  if (layer == "lm_head") return {hidden, vocab};
  DISTCA_CHECK_MSG(false, "unknown layer " + layer);
  return {0, 0};
}

Status ProfileShape::validate(const std::string& pre) const {
  auto bad = [&](const std::string& what) { return Status::invalid_argument(pre + what); };
  for (auto [name, v] : {std::pair{"model.hidden", hidden}, {"model.n_heads", n_heads}, {"model.n_kv_heads", n_kv_heads},
                         {"model.head_dim", head_dim}, {"model.ffn", ffn}, {"model.vocab", vocab},
                         {"model.tokens", tokens}}) {
    if (v < 1 || v > kMaxProfileDim) return bad(std::string(name) + " must be in 1..2^24 (got " + std::to_string(v) + ")");
  }
  if (n_heads % n_kv_heads != 0) return bad("model.n_kv_heads must divide model.n_heads");
  if (n_heads * head_dim > kMaxProfileDim) return bad("model.n_heads x model.head_dim must be at most 2^24");
  return {};
}

namespace {

// The "elementwise" object's keys, in file order, and their fields.
struct ElementwiseKey {
  const char* key;
  ElementwiseTerm ElementwiseProfile::*term;
};
constexpr ElementwiseKey kElementwiseKeys[] = {
    {"layer_forward_seconds_per_token", &ElementwiseProfile::layer_forward},
    {"layer_backward_seconds_per_token", &ElementwiseProfile::layer_backward},
    {"loss_forward_seconds_per_token", &ElementwiseProfile::loss_forward},
    {"loss_backward_seconds_per_token", &ElementwiseProfile::loss_backward},
    {"optimizer_seconds_per_param", &ElementwiseProfile::optimizer},
};

constexpr GemmPass kPasses[] = {GemmPass::kForward, GemmPass::kBackwardData, GemmPass::kBackwardWeight};

// (m, n, k) of (layer, pass) at `shape` (hardware_profile.h, GemmPass).
void gemm_dims(const ProfileShape& s, const std::string& layer, GemmPass pass, int64_t* m, int64_t* n, int64_t* k) {
  const auto [in, out] = s.in_out(layer);
  switch (pass) {
    case GemmPass::kForward: *m = s.tokens, *n = out, *k = in; return;
    case GemmPass::kBackwardData: *m = s.tokens, *n = in, *k = out; return;
    case GemmPass::kBackwardWeight: *m = out, *n = in, *k = s.tokens; return;
  }
}

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

bool sane_seconds(double s) { return std::isnormal(s) && s >= kMinTaskSeconds && s <= kMaxTaskSeconds; }

Status check_link(const LinkProfile& l, const std::string& pre) {
  if (!std::isfinite(l.latency_seconds) || l.latency_seconds < 0 || l.latency_seconds > kMaxLinkLatency) {
    return Status::invalid_argument(pre + ".latency_seconds must be in [0, 1] (got " + num(l.latency_seconds) + ")");
  }
  if (!std::isfinite(l.bytes_per_second) || l.bytes_per_second < kMinLinkBandwidth ||
      l.bytes_per_second > kMaxLinkBandwidth) {
    return Status::invalid_argument(pre + ".bytes_per_second must be in [1, 1e15] (got " + num(l.bytes_per_second) + ")");
  }
  if (l.points.empty() || l.points.size() > kMaxLinkPoints) {
    return Status::invalid_argument(pre + ".points must hold 1 to " + std::to_string(kMaxLinkPoints) + " points");
  }
  for (size_t i = 0; i < l.points.size(); ++i) {
    const std::string at = pre + ".points[" + std::to_string(i) + "]";
    if (l.points[i].bytes < 0 || l.points[i].bytes > kMaxLinkBytes) {
      return Status::invalid_argument(at + ".bytes must be in 0..2^40");
    }
    if (i > 0 && l.points[i].bytes <= l.points[i - 1].bytes) {
      return Status::invalid_argument(at + ".bytes must be larger than the previous point's");
    }
    if (!sane_seconds(l.points[i].seconds)) {
      return Status::invalid_argument(at + ".seconds must be a time in [1e-09, 1e+06] (got " + num(l.points[i].seconds) + ")");
    }
  }
  return {};
}

Status check_tp_wait(const TpWaitProfile& w, const std::string& pre) {
  const double b = w.seconds_per_compute_second;
  if (!std::isfinite(b) || b < 0 || b > kMaxTpWaitSlope) {
    return Status::invalid_argument(pre + ".seconds_per_compute_second must be in [0, 1] (got " + num(b) + ")");
  }
  if (w.points.size() < 2 || w.points.size() > kMaxTpWaitPoints) {
    return Status::invalid_argument(pre + ".points must hold 2 to " + std::to_string(kMaxTpWaitPoints) + " points");
  }
  for (size_t i = 0; i < w.points.size(); ++i) {
    const std::string at = pre + ".points[" + std::to_string(i) + "]";
    if (!sane_seconds(w.points[i].compute_seconds)) {
      return Status::invalid_argument(at + ".compute_seconds must be a time in [1e-09, 1e+06] (got " +
                                      num(w.points[i].compute_seconds) + ")");
    }
    if (i > 0 && !(w.points[i].compute_seconds > w.points[i - 1].compute_seconds)) {
      return Status::invalid_argument(at + ".compute_seconds must be larger than the previous point's");
    }
    if (!sane_seconds(w.points[i].seconds)) {
      return Status::invalid_argument(at + ".seconds must be a time in [1e-09, 1e+06] (got " + num(w.points[i].seconds) + ")");
    }
  }
  return {};
}

}  // namespace

std::vector<GemmRecord> profile_gemm_list(const ProfileShape& shape) {
  std::vector<GemmRecord> out;
  for (const char* layer : kProfileLayers) {
    for (GemmPass pass : kPasses) {
      GemmRecord g;
      g.layer = layer;
      g.pass = pass;
      gemm_dims(shape, layer, pass, &g.m, &g.n, &g.k);
      out.push_back(std::move(g));
    }
  }
  return out;
}

LinkProfile fit_link(std::vector<LinkPoint> points, double wire_factor) {
  LinkProfile l;
  l.points = std::move(points);
  const auto wire = [&](const LinkPoint& p) { return static_cast<double>(p.bytes) * wire_factor; };
  // The rate from the largest sizes only: a link that passes a burst at a higher speed (a
  // token bucket, a NIC's queue, eager buffers) makes the small sizes' slope meaningless, and
  // the transfers the model prices are megabytes. Plain least squares there; sums in point
  // order (deterministic).
  int64_t from = l.points.back().bytes / kLinkRateSizes;
  if (std::count_if(l.points.begin(), l.points.end(), [&](const LinkPoint& p) { return p.bytes >= from; }) < 2) from = 0;
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const LinkPoint& p : l.points) {
    if (p.bytes < from) continue;
    const double x = wire(p);
    n += 1, sx += x, sy += p.seconds, sxx += x * x, sxy += x * p.seconds;
  }
  const double det = n * sxx - sx * sx;
  const double slope = det > 0 ? (n * sxy - sx * sy) / det : 0.0;
  l.bytes_per_second = slope > 0 ? std::clamp(1.0 / slope, kMinLinkBandwidth, kMaxLinkBandwidth) : kMaxLinkBandwidth;
  // The latency at the smallest size, what one message costs beyond its bytes; a negative one
  // is noise, 0.
  const LinkPoint& smallest = l.points.front();
  l.latency_seconds = std::clamp(smallest.seconds - wire(smallest) / l.bytes_per_second, 0.0, kMaxLinkLatency);
  return l;
}

TpWaitProfile fit_tp_wait(std::vector<TpWaitPoint> points) {
  TpWaitProfile w;
  w.points = std::move(points);
  // Through the origin: the wait is what compute adds (the collective's own cost is priced
  // apart), sums in point order (deterministic).
  double sxx = 0, sxy = 0;
  for (const TpWaitPoint& p : w.points) {
    sxx += p.compute_seconds * p.compute_seconds;
    sxy += p.compute_seconds * p.seconds;
  }
  const double slope = sxx > 0 ? sxy / sxx : 0.0;
  w.seconds_per_compute_second = std::isfinite(slope) ? std::clamp(slope, 0.0, kMaxTpWaitSlope) : 0.0;
  return w;
}

const GemmRecord& HardwareProfile::gemm(const std::string& layer, GemmPass pass) const {
  for (const GemmRecord& g : gemms) {
    if (g.layer == layer && g.pass == pass) return g;
  }
  DISTCA_CHECK_MSG(false, "hardware profile without " + layer + " " + gemm_pass_name(pass));
  return gemms.front();
}

double HardwareProfile::gemm_rate(const std::string& layer, GemmPass pass, bool concurrent) const {
  const GemmRecord& g = gemm(layer, pass);
  return g.flops() / (concurrent ? g.seconds_concurrent : g.seconds_alone);
}

CostTable HardwareProfile::attention_total() const {
  CostTable t = attention_forward;
  for (size_t i = 0; i < t.seconds.size(); ++i) {
    for (size_t j = 0; j < t.seconds[i].size(); ++j) t.seconds[i][j] += attention_backward.seconds[i][j];
  }
  return t;
}

double HardwareProfile::attention_backward_ratio() const {
  std::vector<double> r;
  const CostTable& f = attention_forward;
  for (size_t i = 0; i < f.q_lens.size(); ++i) {
    for (size_t j = 0; j < f.kv_lens.size(); ++j) {
      if (f.q_lens[i] <= f.kv_lens[j]) r.push_back(attention_backward.seconds[i][j] / f.seconds[i][j]);
    }
  }
  std::sort(r.begin(), r.end());
  const size_t n = r.size();
  return n == 0 ? 0.0 : (n % 2 ? r[n / 2] : 0.5 * (r[n / 2 - 1] + r[n / 2]));
}

Status HardwareProfile::validate(const std::string& source) const {
  const std::string pre = source.empty() ? "" : source + ": ";
  auto bad = [&](const std::string& what) { return Status::invalid_argument(pre + what); };
  for (auto [name, v] : {std::pair{"machine.cores", cores}, {"machine.ranks", ranks},
                         {"machine.threads_per_rank", threads_per_rank}}) {
    if (v < 1 || v > kMaxProfileCount) return bad(std::string(name) + " must be in 1..65536 (got " + std::to_string(v) + ")");
  }
  if (!std::isfinite(cpu_quota) || cpu_quota < 0 || cpu_quota > static_cast<double>(cores)) {
    return bad("machine.cpu_quota must be in 0..machine.cores (got " + num(cpu_quota) + ")");
  }
  const ProfileShape& s = shape;
  DISTCA_RETURN_IF_ERROR(s.validate(pre));
  if (gemms.size() != kProfileLayerCount * 3) {
    return bad("gemm must hold " + std::to_string(kProfileLayerCount * 3) + " products (8 layers x 3 passes), got " +
               std::to_string(gemms.size()));
  }
  for (size_t i = 0; i < gemms.size(); ++i) {
    const GemmRecord& g = gemms[i];
    const std::string at = "gemm[" + std::to_string(i) + "]";
    const auto* it = std::find(std::begin(kProfileLayers), std::end(kProfileLayers), g.layer);
    if (it == std::end(kProfileLayers)) return bad(at + ".layer '" + g.layer + "' is not one of wq, wk, wv, wo, w1, w3, w2, lm_head");
    for (size_t j = 0; j < i; ++j) {
      if (gemms[j].layer == g.layer && gemms[j].pass == g.pass) {
        return bad(at + ": " + g.layer + " " + gemm_pass_name(g.pass) + " appears twice");
      }
    }
    int64_t m = 0, n = 0, k = 0;
    gemm_dims(s, g.layer, g.pass, &m, &n, &k);
    if (g.m != m || g.n != n || g.k != k) {
      return bad(at + ": " + g.layer + " " + gemm_pass_name(g.pass) + " must be (m, n, k) = (" + std::to_string(m) +
                 ", " + std::to_string(n) + ", " + std::to_string(k) + ") at the model's shapes");
    }
    if (!sane_seconds(g.seconds_alone)) return bad(at + ".seconds_alone must be a time in [1e-09, 1e+06] (got " + num(g.seconds_alone) + ")");
    if (!sane_seconds(g.seconds_concurrent)) {
      return bad(at + ".seconds_concurrent must be a time in [1e-09, 1e+06] (got " + num(g.seconds_concurrent) + ")");
    }
  }
  DISTCA_RETURN_IF_ERROR(attention_forward.validate(pre + "attention.forward_seconds"));
  DISTCA_RETURN_IF_ERROR(attention_backward.validate(pre + "attention.backward_seconds"));
  if (attention_forward.q_lens != attention_backward.q_lens || attention_forward.kv_lens != attention_backward.kv_lens ||
      attention_forward.n_heads != attention_backward.n_heads || attention_forward.head_dim != attention_backward.head_dim ||
      attention_forward.n_kv_heads != attention_backward.n_kv_heads) {
    return bad("attention: forward_seconds and backward_seconds must share the grid and heads");
  }
  // Sums of two in-range times stay below 2 x kMaxTaskSeconds: the total table must load too.
  DISTCA_RETURN_IF_ERROR(attention_total().validate(pre + "attention (forward + backward)"));
  if (elementwise) {
    for (const ElementwiseKey& e : kElementwiseKeys) {
      const ElementwiseTerm& t = (*elementwise).*(e.term);
      for (auto [which, v] : {std::pair{".alone", t.alone}, {".concurrent", t.concurrent}}) {
        if (!std::isfinite(v) || v < 0 || v > kMaxElementwiseSeconds) {
          return bad(std::string("elementwise.") + e.key + which + " must be in [0, 1] seconds (got " + num(v) + ")");
        }
      }
    }
  }
  if ((ranks > 1) != all_to_all.has_value() || (ranks > 1) != p2p.has_value()) {
    return bad(ranks > 1 ? "links.all_to_all and links.p2p are required when machine.ranks > 1"
                         : "links must be absent when machine.ranks is 1 (nothing was exchanged)");
  }
  if (all_to_all) DISTCA_RETURN_IF_ERROR(check_link(*all_to_all, pre + "links.all_to_all"));
  if (p2p) DISTCA_RETURN_IF_ERROR(check_link(*p2p, pre + "links.p2p"));
  if (tp_collective && ranks < kTpProfileGroup) {
    return bad("links.tp_collective needs machine.ranks >= " + std::to_string(kTpProfileGroup));
  }
  if (tp_collective) DISTCA_RETURN_IF_ERROR(check_link(*tp_collective, pre + "links.tp_collective"));
  if (tp_wait && !tp_collective) return bad("links.tp_wait needs links.tp_collective");
  if (comm_cpu && ranks < 2) return bad("links.comm_cpu needs machine.ranks >= 2");
  if (comm_cpu && (!std::isfinite(comm_cpu->seconds_per_byte) || comm_cpu->seconds_per_byte < 0 ||
                   comm_cpu->seconds_per_byte > kMaxCommCpuSecondsPerByte || comm_cpu->bytes <= 0)) {
    return bad("links.comm_cpu.seconds_per_byte must be in [0, 1e-6] and links.comm_cpu.bytes positive (got " +
               num(comm_cpu->seconds_per_byte) + ", " + std::to_string(comm_cpu->bytes) + ")");
  }
  if (tp_wait) DISTCA_RETURN_IF_ERROR(check_tp_wait(*tp_wait, pre + "links.tp_wait"));
  return {};
}

namespace {

nlohmann::json link_json(const LinkProfile& l) {
  nlohmann::json pts = nlohmann::json::array();
  for (const LinkPoint& p : l.points) pts.push_back({{"bytes", p.bytes}, {"seconds", p.seconds}});
  return {{"latency_seconds", l.latency_seconds}, {"bytes_per_second", l.bytes_per_second}, {"points", pts}};
}

}  // namespace

nlohmann::json to_json(const HardwareProfile& p) {
  nlohmann::json j;
  j["format"] = kHardwareProfileFormat;
  j["version"] = kHardwareProfileVersion;
  j["machine"] = {{"cpu", p.cpu}, {"cores", p.cores}, {"ranks", p.ranks}, {"threads_per_rank", p.threads_per_rank},
                  {"blas", p.blas}, {"alone_waiters", p.alone_waiters_sleep ? "sleep" : "spin"}};
  if (p.cpu_quota > 0) j["machine"]["cpu_quota"] = p.cpu_quota;
  const ProfileShape& s = p.shape;
  j["model"] = {{"hidden", s.hidden}, {"n_heads", s.n_heads}, {"n_kv_heads", s.n_kv_heads}, {"head_dim", s.head_dim},
                {"ffn", s.ffn},       {"vocab", s.vocab},     {"tokens", s.tokens}};
  nlohmann::json g = nlohmann::json::array();
  for (const GemmRecord& r : p.gemms) {
    g.push_back({{"layer", r.layer},
                 {"pass", gemm_pass_name(r.pass)},
                 {"m", r.m},
                 {"n", r.n},
                 {"k", r.k},
                 {"seconds_alone", r.seconds_alone},
                 {"seconds_concurrent", r.seconds_concurrent}});
  }
  j["gemm"] = g;
  const CostTable& f = p.attention_forward;
  j["attention"] = {{"n_heads", f.n_heads},
                    {"n_kv_heads", f.n_kv_heads},
                    {"head_dim", f.head_dim},
                    {"concurrent", p.attention_concurrent},
                    {"q_lens", f.q_lens},
                    {"kv_lens", f.kv_lens},
                    {"forward_seconds", seconds_grid_json(f)},
                    {"backward_seconds", seconds_grid_json(p.attention_backward)}};
  if (p.elementwise) {
    nlohmann::json e = nlohmann::json::object();
    for (const ElementwiseKey& k : kElementwiseKeys) {
      const ElementwiseTerm& t = (*p.elementwise).*(k.term);
      e[k.key] = {{"alone", t.alone}, {"concurrent", t.concurrent}};
    }
    j["elementwise"] = e;
  }
  if (p.all_to_all || p.p2p || p.tp_collective || p.tp_wait || p.comm_cpu) {
    nlohmann::json links = nlohmann::json::object();
    if (p.all_to_all) links["all_to_all"] = link_json(*p.all_to_all);
    if (p.p2p) links["p2p"] = link_json(*p.p2p);
    if (p.tp_collective) links["tp_collective"] = link_json(*p.tp_collective);
    if (p.comm_cpu) links["comm_cpu"] = {{"seconds_per_byte", p.comm_cpu->seconds_per_byte}, {"bytes", p.comm_cpu->bytes}};
    if (p.tp_wait) {
      nlohmann::json pts = nlohmann::json::array();
      for (const TpWaitPoint& w : p.tp_wait->points) {
        pts.push_back({{"compute_seconds", w.compute_seconds}, {"seconds", w.seconds}});
      }
      links["tp_wait"] = {{"seconds_per_compute_second", p.tp_wait->seconds_per_compute_second}, {"points", pts}};
    }
    j["links"] = links;
  }
  return j;
}

namespace {

// Typed field access: every read checks the JSON type first (nlohmann's get<> throws on a
// mismatch) and names the field by its path.
class Reader {
 public:
  explicit Reader(std::string source) : pre_(std::move(source) + ": ") {}
  Status bad(const std::string& path, const std::string& what) const {
    return Status::invalid_argument(pre_ + path + " " + what);
  }
  Result<const nlohmann::json*> field(const nlohmann::json& obj, const std::string& path, const char* key) const {
    const auto it = obj.find(key);
    if (it == obj.end()) return bad(path, "is missing");
    return &*it;
  }
  Result<const nlohmann::json*> object(const nlohmann::json& obj, const std::string& path, const char* key) const {
    DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* v, field(obj, path, key));
    if (!v->is_object()) return bad(path, "must be an object");
    return v;
  }
  Result<int64_t> integer(const nlohmann::json& v, const std::string& path) const {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
      return bad(path, "must be an integer");
    }
    return v.get<int64_t>();
  }
  Result<int64_t> integer(const nlohmann::json& obj, const std::string& path, const char* key) const {
    DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* v, field(obj, path, key));
    return integer(*v, path);
  }
  Result<double> number(const nlohmann::json& v, const std::string& path) const {
    if (!v.is_number()) return bad(path, "must be a number");
    const double d = v.get<double>();
    if (!std::isfinite(d)) return bad(path, "must be finite");
    return d;
  }
  Result<double> number(const nlohmann::json& obj, const std::string& path, const char* key) const {
    DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* v, field(obj, path, key));
    return number(*v, path);
  }
  Result<std::string> string(const nlohmann::json& obj, const std::string& path, const char* key) const {
    DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* v, field(obj, path, key));
    if (!v->is_string()) return bad(path, "must be a string");
    return v->get<std::string>();
  }
  Result<bool> boolean(const nlohmann::json& obj, const std::string& path, const char* key) const {
    DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* v, field(obj, path, key));
    if (!v->is_boolean()) return bad(path, "must be true or false");
    return v->get<bool>();
  }
  Result<const nlohmann::json*> array(const nlohmann::json& obj, const std::string& path, const char* key,
                                      size_t max_size) const {
    DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* v, field(obj, path, key));
    if (!v->is_array()) return bad(path, "must be an array");
    if (v->size() > max_size) return bad(path, "has more than " + std::to_string(max_size) + " entries");
    return v;
  }

 private:
  std::string pre_;
};

Result<std::vector<int64_t>> read_lengths(const Reader& r, const nlohmann::json& obj, const std::string& path,
                                          const char* key) {
  DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* a, r.array(obj, path, key, kMaxCostTableGrid));
  std::vector<int64_t> out;
  for (size_t i = 0; i < a->size(); ++i) {
    DISTCA_ASSIGN_OR_RETURN(int64_t v, r.integer((*a)[i], path + "[" + std::to_string(i) + "]"));
    out.push_back(v);
  }
  return out;
}

// A (q_lens x kv_lens) grid of seconds, null where q > kv (read as 0; validate checks the rest).
Result<std::vector<std::vector<double>>> read_grid(const Reader& r, const nlohmann::json& obj, const std::string& path,
                                                   const char* key, size_t rows, size_t cols) {
  DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* a, r.array(obj, path, key, kMaxCostTableGrid));
  if (a->size() != rows) return r.bad(path, "must have one row per q_lens entry");
  std::vector<std::vector<double>> out;
  for (size_t i = 0; i < rows; ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    const nlohmann::json& row = (*a)[i];
    if (!row.is_array() || row.size() != cols) return r.bad(at, "must be an array with one entry per kv_lens entry");
    std::vector<double> v;
    for (size_t j = 0; j < cols; ++j) {
      if (row[j].is_null()) {
        v.push_back(0.0);
        continue;
      }
      DISTCA_ASSIGN_OR_RETURN(double x, r.number(row[j], at + "[" + std::to_string(j) + "]"));
      v.push_back(x);
    }
    out.push_back(std::move(v));
  }
  return out;
}

// The array `path`.points of `o` (at most `max`), each element an object read by
// read_one(element, its path).
template <class Point, class ReadOne>
Result<std::vector<Point>> read_points(const Reader& r, const nlohmann::json& o, const std::string& path, size_t max,
                                       ReadOne read_one) {
  DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* pts, r.array(o, path + ".points", "points", max));
  std::vector<Point> out;
  for (size_t i = 0; i < pts->size(); ++i) {
    const std::string at = path + ".points[" + std::to_string(i) + "]";
    const nlohmann::json& p = (*pts)[i];
    if (!p.is_object()) return r.bad(at, "must be an object");
    DISTCA_ASSIGN_OR_RETURN(Point x, read_one(p, at));
    out.push_back(x);
  }
  return out;
}

Result<LinkProfile> read_link(const Reader& r, const nlohmann::json& links, const std::string& path, const char* key) {
  DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* o, r.object(links, path, key));
  LinkProfile l;
  DISTCA_ASSIGN_OR_RETURN(l.latency_seconds, r.number(*o, path + ".latency_seconds", "latency_seconds"));
  DISTCA_ASSIGN_OR_RETURN(l.bytes_per_second, r.number(*o, path + ".bytes_per_second", "bytes_per_second"));
  auto one = [&](const nlohmann::json& p, const std::string& at) -> Result<LinkPoint> {
    LinkPoint lp;
    DISTCA_ASSIGN_OR_RETURN(lp.bytes, r.integer(p, at + ".bytes", "bytes"));
    DISTCA_ASSIGN_OR_RETURN(lp.seconds, r.number(p, at + ".seconds", "seconds"));
    return lp;
  };
  DISTCA_ASSIGN_OR_RETURN(l.points, read_points<LinkPoint>(r, *o, path, kMaxLinkPoints, one));
  return l;
}

Result<TpWaitProfile> read_tp_wait(const Reader& r, const nlohmann::json& links) {
  const std::string path = "links.tp_wait";
  DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* o, r.object(links, path, "tp_wait"));
  TpWaitProfile w;
  DISTCA_ASSIGN_OR_RETURN(w.seconds_per_compute_second,
                          r.number(*o, path + ".seconds_per_compute_second", "seconds_per_compute_second"));
  auto one = [&](const nlohmann::json& p, const std::string& at) -> Result<TpWaitPoint> {
    TpWaitPoint tp;
    DISTCA_ASSIGN_OR_RETURN(tp.compute_seconds, r.number(p, at + ".compute_seconds", "compute_seconds"));
    DISTCA_ASSIGN_OR_RETURN(tp.seconds, r.number(p, at + ".seconds", "seconds"));
    return tp;
  };
  DISTCA_ASSIGN_OR_RETURN(w.points, read_points<TpWaitPoint>(r, *o, path, kMaxTpWaitPoints, one));
  return w;
}

// The profile's "machine" object into p's machine fields.
Status read_machine(const Reader& r, const nlohmann::json& j, HardwareProfile& p) {
  DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* machine, r.object(j, "machine", "machine"));
  DISTCA_ASSIGN_OR_RETURN(p.cpu, r.string(*machine, "machine.cpu", "cpu"));
  DISTCA_ASSIGN_OR_RETURN(p.cores, r.integer(*machine, "machine.cores", "cores"));
  DISTCA_ASSIGN_OR_RETURN(p.ranks, r.integer(*machine, "machine.ranks", "ranks"));
  DISTCA_ASSIGN_OR_RETURN(p.threads_per_rank, r.integer(*machine, "machine.threads_per_rank", "threads_per_rank"));
  DISTCA_ASSIGN_OR_RETURN(p.blas, r.string(*machine, "machine.blas", "blas"));
  if (machine->contains("alone_waiters")) {  // optional: absent in files written before it
    DISTCA_ASSIGN_OR_RETURN(std::string w, r.string(*machine, "machine.alone_waiters", "alone_waiters"));
    if (w != "sleep" && w != "spin") {
      return r.bad("machine.alone_waiters", "must be \"sleep\" or \"spin\" (got \"" + w + "\")");
    }
    p.alone_waiters_sleep = w == "sleep";
  }
  if (machine->contains("cpu_quota")) {  // optional: absent when uncapped, and in older files
    DISTCA_ASSIGN_OR_RETURN(p.cpu_quota, r.number(*machine, "machine.cpu_quota", "cpu_quota"));
  }
  return Status::ok_status();
}

}  // namespace

Result<HardwareProfile> hardware_profile_from_json(const nlohmann::json& j, const std::string& source) {
  const Reader r(source);
  if (!j.is_object()) return Status::invalid_argument(source + ": not a JSON object");
  DISTCA_ASSIGN_OR_RETURN(std::string format, r.string(j, "format", "format"));
  if (format != kHardwareProfileFormat) {
    return r.bad("format", "must be \"" + std::string(kHardwareProfileFormat) + "\" (got \"" + format + "\")");
  }
  const auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() ||
      (version->is_number_unsigned() && version->get<uint64_t>() > INT64_MAX) ||
      version->get<int64_t>() != kHardwareProfileVersion) {
    return r.bad("version", "must be " + std::to_string(kHardwareProfileVersion) +
                                " (the only hardware-profile version this build reads)");
  }
  HardwareProfile p;
  DISTCA_RETURN_IF_ERROR(read_machine(r, j, p));

  DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* model, r.object(j, "model", "model"));
  ProfileShape& s = p.shape;
  for (auto [key, dst] : {std::pair{"hidden", &s.hidden}, {"n_heads", &s.n_heads}, {"n_kv_heads", &s.n_kv_heads},
                          {"head_dim", &s.head_dim}, {"ffn", &s.ffn}, {"vocab", &s.vocab}, {"tokens", &s.tokens}}) {
    DISTCA_ASSIGN_OR_RETURN(*dst, r.integer(*model, std::string("model.") + key, key));
  }

  DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* gemm, r.array(j, "gemm", "gemm", 256));
  for (size_t i = 0; i < gemm->size(); ++i) {
    const std::string at = "gemm[" + std::to_string(i) + "]";
    const nlohmann::json& g = (*gemm)[i];
    if (!g.is_object()) return r.bad(at, "must be an object");
    GemmRecord rec;
    DISTCA_ASSIGN_OR_RETURN(rec.layer, r.string(g, at + ".layer", "layer"));
    DISTCA_ASSIGN_OR_RETURN(std::string pass, r.string(g, at + ".pass", "pass"));
    bool known = false;
    for (GemmPass ps : kPasses) {
      if (pass == gemm_pass_name(ps)) rec.pass = ps, known = true;
    }
    if (!known) return r.bad(at + ".pass", "must be forward, backward_data or backward_weight (got '" + pass + "')");
    DISTCA_ASSIGN_OR_RETURN(rec.m, r.integer(g, at + ".m", "m"));
    DISTCA_ASSIGN_OR_RETURN(rec.n, r.integer(g, at + ".n", "n"));
    DISTCA_ASSIGN_OR_RETURN(rec.k, r.integer(g, at + ".k", "k"));
    DISTCA_ASSIGN_OR_RETURN(rec.seconds_alone, r.number(g, at + ".seconds_alone", "seconds_alone"));
    DISTCA_ASSIGN_OR_RETURN(rec.seconds_concurrent, r.number(g, at + ".seconds_concurrent", "seconds_concurrent"));
    p.gemms.push_back(std::move(rec));
  }

  DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* att, r.object(j, "attention", "attention"));
  CostTable& f = p.attention_forward;
  DISTCA_ASSIGN_OR_RETURN(f.n_heads, r.integer(*att, "attention.n_heads", "n_heads"));
  DISTCA_ASSIGN_OR_RETURN(f.n_kv_heads, r.integer(*att, "attention.n_kv_heads", "n_kv_heads"));
  DISTCA_ASSIGN_OR_RETURN(f.head_dim, r.integer(*att, "attention.head_dim", "head_dim"));
  DISTCA_ASSIGN_OR_RETURN(p.attention_concurrent, r.boolean(*att, "attention.concurrent", "concurrent"));
  DISTCA_ASSIGN_OR_RETURN(f.q_lens, read_lengths(r, *att, "attention.q_lens", "q_lens"));
  DISTCA_ASSIGN_OR_RETURN(f.kv_lens, read_lengths(r, *att, "attention.kv_lens", "kv_lens"));
  f.hardware = {{"cpu", p.cpu}, {"threads", p.threads_per_rank}};
  CostTable& b = p.attention_backward;
  b = f;
  DISTCA_ASSIGN_OR_RETURN(f.seconds, read_grid(r, *att, "attention.forward_seconds", "forward_seconds",
                                               f.q_lens.size(), f.kv_lens.size()));
  DISTCA_ASSIGN_OR_RETURN(b.seconds, read_grid(r, *att, "attention.backward_seconds", "backward_seconds",
                                               f.q_lens.size(), f.kv_lens.size()));

  if (j.contains("elementwise")) {  // optional: absent in files written before it
    DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* e, r.object(j, "elementwise", "elementwise"));
    ElementwiseProfile ep;
    for (const ElementwiseKey& k : kElementwiseKeys) {
      const std::string at = std::string("elementwise.") + k.key;
      DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* o, r.object(*e, at, k.key));
      ElementwiseTerm& t = ep.*(k.term);
      DISTCA_ASSIGN_OR_RETURN(t.alone, r.number(*o, at + ".alone", "alone"));
      DISTCA_ASSIGN_OR_RETURN(t.concurrent, r.number(*o, at + ".concurrent", "concurrent"));
    }
    p.elementwise = ep;
  }
  if (const auto links = j.find("links"); links != j.end()) {
    if (!links->is_object()) return r.bad("links", "must be an object");
    DISTCA_ASSIGN_OR_RETURN(p.all_to_all, read_link(r, *links, "links.all_to_all", "all_to_all"));
    DISTCA_ASSIGN_OR_RETURN(p.p2p, read_link(r, *links, "links.p2p", "p2p"));
    if (links->contains("tp_collective")) {  // optional: absent in files written before it
      DISTCA_ASSIGN_OR_RETURN(p.tp_collective, read_link(r, *links, "links.tp_collective", "tp_collective"));
    }
    if (links->contains("tp_wait")) {  // optional: absent in files written before it
      DISTCA_ASSIGN_OR_RETURN(p.tp_wait, read_tp_wait(r, *links));
    }
    if (links->contains("comm_cpu")) {  // optional: absent in files written before it
      DISTCA_ASSIGN_OR_RETURN(const nlohmann::json* cc, r.object(*links, "links.comm_cpu", "comm_cpu"));
      CommCpuProfile cp;
      DISTCA_ASSIGN_OR_RETURN(cp.seconds_per_byte, r.number(*cc, "links.comm_cpu.seconds_per_byte", "seconds_per_byte"));
      DISTCA_ASSIGN_OR_RETURN(cp.bytes, r.integer(*cc, "links.comm_cpu.bytes", "bytes"));
      p.comm_cpu = cp;
    }
  }
  DISTCA_RETURN_IF_ERROR(p.validate(source));
  return p;
}

Result<HardwareProfile> load_hardware_profile(const std::string& path) {
  DISTCA_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(path));
  return hardware_profile_from_json(j, path);
}

HardwareSpec profile_hardware_spec(const HardwareProfile& p, const std::string& path) {
  HardwareSpec h = *hardware_preset("local-cpu");
  h.name = "profile " + path;
  h.gpus_per_node = 1;
  h.peak_flops = 0;
  for (const GemmRecord& g : p.gemms) h.peak_flops = std::max(h.peak_flops, g.flops() / std::min(g.seconds_alone, g.seconds_concurrent));
  if (p.all_to_all) {
    h.inter_node_bw = p.all_to_all->bytes_per_second;
    h.inter_node_latency = p.all_to_all->latency_seconds;
  }
  return h;
}

Result<ResolvedHardware> resolve_hardware(const std::string& name_or_path) {
  if (auto preset = hardware_preset(name_or_path); preset.ok()) return ResolvedHardware{*preset, nullptr};
  if (Status in = check_input_file(name_or_path); !in.ok()) {
    return Status::invalid_argument("--hardware: '" + name_or_path + "' is neither a preset (h200, local-cpu) nor a " +
                                    "readable hardware profile file (" + in.message() + ")");
  }
  auto hp = load_hardware_profile(name_or_path);
  if (!hp.ok()) return Status(hp.status().code(), "--hardware: " + hp.status().message());
  auto profile = std::make_shared<const HardwareProfile>(std::move(hp).value());
  return ResolvedHardware{profile_hardware_spec(*profile, name_or_path), profile};
}

}  // namespace distca
