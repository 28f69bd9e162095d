#include "distca/cost/profiled.h"
#include "distca/cost/options.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <string_view>

#include <nlohmann/json.hpp>

#include "distca/core/io.h"
#include "distca/cost/analytic.h"

namespace distca {

namespace {
// task_pairs in doubles: a table's lengths go up to 2^40, where the integer product
// kv (kv + 1) of causal_pairs overflows int64 (found by fuzz_cost_csv:
// fuzz/corpus/fuzz_cost_csv/crash-f6b036fd50c537231f6575671bc1f75344e136fe).
double pairs_of(int64_t q_len, int64_t kv_len) {
  DISTCA_CHECK(0 <= q_len && q_len <= kv_len);
  const double q = static_cast<double>(q_len), kv = static_cast<double>(kv_len);
  return 0.5 * q * (2.0 * kv - q + 1.0);
}
}  // namespace

namespace {
std::unique_ptr<nlohmann::json> copy_of(const std::unique_ptr<nlohmann::json>& j) {
  return std::make_unique<nlohmann::json>(j ? *j : nlohmann::json::object());
}
}  // namespace

HardwareNote::HardwareNote() : json_(std::make_unique<nlohmann::json>(nlohmann::json::object())) {}
HardwareNote::HardwareNote(const nlohmann::json& j) : json_(std::make_unique<nlohmann::json>(j)) {}
HardwareNote::HardwareNote(const HardwareNote& other) : json_(copy_of(other.json_)) {}
HardwareNote::HardwareNote(HardwareNote&& other) noexcept = default;
HardwareNote& HardwareNote::operator=(const HardwareNote& other) {
  if (this != &other) json_ = copy_of(other.json_);
  return *this;
}
HardwareNote& HardwareNote::operator=(HardwareNote&& other) noexcept = default;
HardwareNote& HardwareNote::operator=(const nlohmann::json& j) {
  json() = j;
  return *this;
}
HardwareNote::~HardwareNote() = default;

const nlohmann::json& HardwareNote::json() const {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  return json_ ? *json_ : kEmpty;
}
nlohmann::json& HardwareNote::json() {
  if (!json_) json_ = std::make_unique<nlohmann::json>(nlohmann::json::object());
  return *json_;
}
nlohmann::json& HardwareNote::operator[](const std::string& key) { return json()[key]; }

double CostTable::task_flops(int64_t q_len, int64_t kv_len) const {
  return (1.0 + kAttentionBackwardFactor) * 4.0 * static_cast<double>(head_dim) *
         static_cast<double>(n_heads) * pairs_of(q_len, kv_len);
}

namespace {
Status check_lengths(const std::vector<int64_t>& v, const std::string& where) {
  if (v.empty()) return Status::invalid_argument(where + " is empty");
  if (v.size() > kMaxCostTableGrid) {
    return Status::invalid_argument(where + " has more than " + std::to_string(kMaxCostTableGrid) + " entries");
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] <= 0 || v[i] > kMaxCostTableLength) {
      return Status::invalid_argument(where + "[" + std::to_string(i) + "] must be in 1..2^40");
    }
    if (i > 0 && v[i] <= v[i - 1]) return Status::invalid_argument(where + " must be strictly increasing");
  }
  return {};
}

// "key" with its quotes, for messages. (Built by appending: GCC 12 reports a false -Wrestrict
// on "\"" + std::string(key).)
std::string quoted(const char* key) {
  std::string q(1, '"');
  q += key;
  q += '"';
  return q;
}

// A measured time: finite, normal and inside the documented bounds (profiled.h).
bool sane_seconds(double s) {
  return std::isnormal(s) && s >= kMinTaskSeconds && s <= kMaxTaskSeconds;
}
}  // namespace

Status CostTable::validate(const std::string& source) const {
  const std::string pre = source.empty() ? "" : source + ": ";
  if (n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || n_heads % n_kv_heads != 0) {
    return Status::invalid_argument(pre + "n_heads, n_kv_heads, head_dim must be positive with n_kv_heads dividing n_heads");
  }
  if (n_heads > kMaxCostTableHeads || head_dim > kMaxCostTableHeadDim) {
    return Status::invalid_argument(pre + "n_heads and head_dim must be at most " + std::to_string(kMaxCostTableHeads));
  }
  DISTCA_RETURN_IF_ERROR(check_lengths(q_lens, pre + "q_lens"));
  DISTCA_RETURN_IF_ERROR(check_lengths(kv_lens, pre + "kv_lens"));
  if (!(saturation_fraction > 0 && saturation_fraction <= 1)) {
    return Status::invalid_argument(pre + "saturation_fraction must be in (0, 1]");
  }
  if (seconds.size() != q_lens.size()) return Status::invalid_argument(pre + "seconds must have one row per q_lens entry");
  if (q_lens.front() > kv_lens.front()) {
    return Status::invalid_argument(pre + "q_lens[0] must not exceed kv_lens[0] (no measured point in the first column)");
  }
  for (size_t i = 0; i < q_lens.size(); ++i) {
    if (seconds[i].size() != kv_lens.size()) {
      return Status::invalid_argument(pre + "seconds[" + std::to_string(i) + "] must have one entry per kv_lens entry");
    }
    for (size_t j = 0; j < kv_lens.size(); ++j) {
      if (q_lens[i] <= kv_lens[j] && !sane_seconds(seconds[i][j])) {
        char why[96];
        std::snprintf(why, sizeof why, "] must be a time in [%g, %g] seconds (got %g)", kMinTaskSeconds,
                      kMaxTaskSeconds, seconds[i][j]);
        return Status::invalid_argument(pre + "seconds[" + std::to_string(i) + "][" + std::to_string(j) + why);
      }
    }
  }
  return {};
}

nlohmann::json to_json(const CostTable& t) {
  nlohmann::json j;
  j["format"] = "distca-cost-table";
  j["version"] = 1;
  j["hardware"] = t.hardware.json();
  j["n_heads"] = t.n_heads;
  j["n_kv_heads"] = t.n_kv_heads;
  j["head_dim"] = t.head_dim;
  j["saturation_fraction"] = t.saturation_fraction;
  j["q_lens"] = t.q_lens;
  j["kv_lens"] = t.kv_lens;
  j["seconds"] = seconds_grid_json(t);
  return j;
}

nlohmann::json seconds_grid_json(const CostTable& t) {
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < t.q_lens.size(); ++i) {
    nlohmann::json row = nlohmann::json::array();
    for (size_t j = 0; j < t.kv_lens.size(); ++j) {
      if (t.q_lens[i] > t.kv_lens[j]) {
        row.push_back(nullptr);
      } else {
        row.push_back(t.seconds[i][j]);
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

Result<CostTable> cost_table_from_json(const nlohmann::json& j, const std::string& source) {
  const std::string pre = source + ": ";
  auto bad = [&](const std::string& what) { return Status::invalid_argument(pre + what); };
  if (!j.is_object()) return bad("not a JSON object");
  // Every access below checks the JSON type first: nlohmann's get<> throws on a mismatch.
  const auto format = j.find("format");
  if (format == j.end() || !format->is_string() || format->get<std::string>() != "distca-cost-table") {
    return bad("\"format\" must be \"distca-cost-table\"");
  }
  const auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() != kCostTableVersion) {
    return bad("\"version\" must be " + std::to_string(kCostTableVersion) +
               " (the only cost-table version this build reads)");
  }
  CostTable t;
  auto get_int = [&](const char* key, int64_t* out) -> Status {
    const auto it = j.find(key);
    // An unsigned value above INT64_MAX would wrap in get<int64_t>.
    if (it == j.end() || !it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX)) {
      return bad(quoted(key) + " must be an integer");
    }
    *out = it->get<int64_t>();
    return {};
  };
  DISTCA_RETURN_IF_ERROR(get_int("n_heads", &t.n_heads));
  DISTCA_RETURN_IF_ERROR(get_int("n_kv_heads", &t.n_kv_heads));
  DISTCA_RETURN_IF_ERROR(get_int("head_dim", &t.head_dim));
  if (const auto it = j.find("hardware"); it != j.end()) t.hardware = *it;
  if (const auto it = j.find("saturation_fraction"); it != j.end()) {
    if (!it->is_number()) return bad("\"saturation_fraction\" must be a number");
    t.saturation_fraction = it->get<double>();
  }
  for (const char* key : {"q_lens", "kv_lens"}) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_array()) return bad(quoted(key) + " must be an array");
    if (it->size() > kMaxCostTableGrid) {
      return bad(quoted(key) + " has more than " + std::to_string(kMaxCostTableGrid) + " entries");
    }
    auto& dst = std::string(key) == "q_lens" ? t.q_lens : t.kv_lens;
    for (const auto& e : *it) {
      if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > INT64_MAX)) {
        return bad(quoted(key) + " must hold integers");
      }
      dst.push_back(e.get<int64_t>());
    }
  }
  const auto rows = j.find("seconds");
  if (rows == j.end() || !rows->is_array()) return bad("\"seconds\" must be an array of rows");
  if (rows->size() != t.q_lens.size()) return bad("seconds must have one row per q_lens entry");
  for (size_t i = 0; i < rows->size(); ++i) {
    const auto& row = (*rows)[i];
    if (!row.is_array()) return bad("\"seconds\" must be an array of rows");
    if (row.size() != t.kv_lens.size()) {
      return bad("seconds[" + std::to_string(i) + "] must have one entry per kv_lens entry");
    }
    std::vector<double> r;
    for (size_t k = 0; k < row.size(); ++k) {
      const auto& e = row[k];
      if (e.is_null()) {
        r.push_back(0.0);
      } else if (e.is_number()) {
        r.push_back(e.get<double>());
      } else {
        return bad("seconds[" + std::to_string(i) + "][" + std::to_string(k) + "] must be a number or null");
      }
    }
    t.seconds.push_back(std::move(r));
  }
  DISTCA_RETURN_IF_ERROR(t.validate(source));
  return t;
}

ProfiledCostModel::ProfiledCostModel(CostTable table) : table_(std::move(table)) {
  DISTCA_CHECK_MSG(table_.validate("").ok(), table_.validate("").message());
  const size_t nq = table_.q_lens.size(), nk = table_.kv_lens.size();
  tput_.assign(nq, std::vector<double>(nk, 0.0));
  for (size_t i = 0; i < nq; ++i) {
    for (size_t j = 0; j < nk; ++j) {
      if (table_.q_lens[i] > table_.kv_lens[j]) continue;
      tput_[i][j] = table_.task_flops(table_.q_lens[i], table_.kv_lens[j]) / table_.seconds[i][j];
      peak_ = std::max(peak_, tput_[i][j]);
    }
  }
}

double ProfiledCostModel::throughput_at(size_t i, size_t j) const {
  if (table_.q_lens[i] <= table_.kv_lens[j]) return tput_[i][j];
  // q > kv: not measured; use the largest measured q of this column (the diagonal, or the
  // closest point below it).
  size_t best = 0;
  for (size_t r = 0; r < table_.q_lens.size(); ++r) {
    if (table_.q_lens[r] <= table_.kv_lens[j]) best = r;
  }
  if (table_.q_lens[best] <= table_.kv_lens[j]) return tput_[best][j];
  return tput_[0][0];  // unreachable after validate (q_lens[0] <= kv_lens[0] <= kv_lens[j])
}

namespace {
// Bracketing index lo and weight w of x in grid g (clamped at both ends).
void bracket(const std::vector<int64_t>& g, double x, size_t* lo, double* w) {
  if (x <= static_cast<double>(g.front())) {
    *lo = 0;
    *w = 0;
    return;
  }
  if (x >= static_cast<double>(g.back())) {
    *lo = g.size() - 1;
    *w = 0;
    return;
  }
  size_t i = 0;
  while (static_cast<double>(g[i + 1]) < x) ++i;
  *lo = i;
  const double a = std::log2(static_cast<double>(g[i])), b = std::log2(static_cast<double>(g[i + 1]));
  *w = (std::log2(x) - a) / (b - a);
}
}  // namespace

double ProfiledCostModel::task_cost(int64_t q_len, int64_t kv_len) const {
  DISTCA_CHECK(q_len >= 0 && q_len <= kv_len);
  if (q_len == 0) return 0.0;
  const double flops = table_.task_flops(q_len, kv_len);
  if (q_len > table_.q_lens.back() || kv_len > table_.kv_lens.back()) return flops / peak_;
  size_t i, j;
  double wi, wj;
  bracket(table_.q_lens, static_cast<double>(q_len), &i, &wi);
  bracket(table_.kv_lens, static_cast<double>(kv_len), &j, &wj);
  const size_t i1 = std::min(i + 1, table_.q_lens.size() - 1), j1 = std::min(j + 1, table_.kv_lens.size() - 1);
  const double t00 = throughput_at(i, j), t01 = throughput_at(i, j1);
  const double t10 = throughput_at(i1, j), t11 = throughput_at(i1, j1);
  const double sat = table_.saturation_fraction * peak_;
  if (t00 >= sat && t01 >= sat && t10 >= sat && t11 >= sat) return flops / peak_;
  const double tput = (1 - wi) * ((1 - wj) * t00 + wj * t01) + wi * ((1 - wj) * t10 + wj * t11);
  return flops / tput;
}

namespace {

// A CSV field as a strict decimal integer in [lo, hi].
bool csv_int(std::string_view f, int64_t lo, int64_t hi, int64_t* out) {
  if (f.empty() || f.size() > 19) return false;
  for (char c : f) {
    if (c < '0' || c > '9') return false;
  }
  if (f.size() > 1 && f[0] == '0') return false;
  const auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), *out);
  return ec == std::errc() && p == f.data() + f.size() && *out >= lo && *out <= hi;
}

// A CSV field as a finite positive decimal number (no nan, inf, hex).
bool csv_double(std::string_view f, double* out) {
  if (f.empty() || f.size() > 64) return false;
  for (char c : f) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+')) return false;
  }
  const auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), *out);
  return ec == std::errc() && p == f.data() + f.size() && std::isfinite(*out) && *out > 0;
}

}  // namespace

Result<CostTable> cost_table_from_csv(const std::string& text, const std::string& source) {
  auto bad = [&](size_t line, const std::string& what) {
    return Status::invalid_argument(source + ": line " + std::to_string(line) + ": " + what);
  };
  struct Row {
    int64_t len, cp, tp;
    double ms;
  };
  std::vector<Row> rows;
  size_t line_no = 0, pos = 0;
  bool header = false;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (!header) {
      if (line != "L,cp,tp,duration_per_doc") return bad(line_no, "the header must be \"L,cp,tp,duration_per_doc\"");
      header = true;
      continue;
    }
    std::vector<std::string_view> f;
    size_t a = 0;
    while (f.size() < 5) {
      const size_t c = line.find(',', a);
      f.push_back(line.substr(a, c == std::string_view::npos ? std::string_view::npos : c - a));
      if (c == std::string_view::npos) break;
      a = c + 1;
    }
    if (f.size() != 4) return bad(line_no, "expected 4 fields (L,cp,tp,duration_per_doc)");
    Row r{};
    if (!csv_int(f[0], 1, kMaxCostTableLength, &r.len)) return bad(line_no, "L must be an integer in 1..2^40");
    if (!csv_int(f[1], 1, 65536, &r.cp)) return bad(line_no, "cp must be an integer in 1..65536");
    if (!csv_int(f[2], 1, 65536, &r.tp)) return bad(line_no, "tp must be an integer in 1..65536");
    if (!csv_double(f[3], &r.ms) || r.ms * 1e-3 < kMinTaskSeconds || r.ms * 1e-3 > kMaxTaskSeconds) {
      return bad(line_no, "duration_per_doc must be a time in milliseconds in [1e-06, 1e+09]");
    }
    for (const Row& o : rows) {
      if (o.len == r.len && o.cp == r.cp && o.tp == r.tp) {
        return bad(line_no, "duplicate row for L " + std::to_string(r.len) + ", cp " + std::to_string(r.cp) + ", tp " +
                                std::to_string(r.tp));
      }
    }
    if (rows.size() >= 65536) return bad(line_no, "more than 65536 rows");
    rows.push_back(r);
  }
  if (!header) return Status::invalid_argument(source + ": empty (expected the header \"L,cp,tp,duration_per_doc\")");
  std::vector<std::pair<int64_t, double>> diag;  // (L, forward seconds) of the cp = tp = 1 rows
  for (const Row& r : rows) {
    if (r.cp == 1 && r.tp == 1) diag.emplace_back(r.len, r.ms * 1e-3);
  }
  if (diag.empty()) return Status::invalid_argument(source + ": no row with cp = 1 and tp = 1 (one GPU, all heads)");
  if (diag.size() > kMaxCostTableGrid) {
    return Status::invalid_argument(source + ": more than " + std::to_string(kMaxCostTableGrid) + " cp = 1, tp = 1 rows");
  }
  std::sort(diag.begin(), diag.end());
  CostTable t;
  t.hardware = {{"source", source}, {"format", "csv L,cp,tp,duration_per_doc"}, {"rows", "cp = 1, tp = 1"}};
  t.n_heads = kCsvTableHeads;
  t.n_kv_heads = kCsvTableKvHeads;
  t.head_dim = kCsvTableHeadDim;
  const size_t n = diag.size();
  std::vector<double> tput(n), log_len(n);
  for (size_t i = 0; i < n; ++i) {
    t.q_lens.push_back(diag[i].first);
    const double total = diag[i].second * (1.0 + kAttentionBackwardFactor);
    tput[i] = t.task_flops(diag[i].first, diag[i].first) / total;
    log_len[i] = std::log2(static_cast<double>(diag[i].first));
  }
  t.kv_lens = t.q_lens;
  t.seconds.assign(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i; j < n; ++j) {
      const int64_t q = t.q_lens[i], kv = t.kv_lens[j];
      double tp = tput[i];
      if (i != j) {
        const double pairs = pairs_of(q, kv);
        const double l_eq = std::log2((std::sqrt(8.0 * pairs + 1.0) - 1.0) / 2.0);
        if (l_eq <= log_len.front()) {
          tp = tput.front();
        } else if (l_eq >= log_len.back()) {
          tp = tput.back();
        } else {
          size_t k = 0;
          while (log_len[k + 1] < l_eq) ++k;
          const double w = (l_eq - log_len[k]) / (log_len[k + 1] - log_len[k]);
          tp = (1 - w) * tput[k] + w * tput[k + 1];
        }
      }
      t.seconds[i][j] = std::clamp(t.task_flops(q, kv) / tp, kMinTaskSeconds, kMaxTaskSeconds);
    }
  }
  DISTCA_RETURN_IF_ERROR(t.validate(source));
  return t;
}

namespace {
Result<CostTable> read_cost_table(const std::string& path) {
  std::string ext = path.size() >= 4 ? path.substr(path.size() - 4) : "";
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".csv") {
    DISTCA_ASSIGN_OR_RETURN(std::string text, read_file(path));
    return cost_table_from_csv(text, path);
  }
  DISTCA_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(path));
  return cost_table_from_json(j, path);
}
}  // namespace

Result<std::unique_ptr<ProfiledCostModel>> load_cost_table_option(const std::string& path) {
  auto t = read_cost_table(path);
  if (!t.ok()) return Status(t.status().code(), "--cost-table: " + t.status().message());
  return std::make_unique<ProfiledCostModel>(std::move(t).value());
}

Result<int64_t> dtype_bytes_of(const std::string& dtype) {
  if (dtype == "bf16") return int64_t{2};
  if (dtype == "fp32") return int64_t{4};
  return Status::invalid_argument("--dtype: expected bf16 or fp32, got '" + dtype + "'");
}

}  // namespace distca
