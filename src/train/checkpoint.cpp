#include "distca/train/checkpoint.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

#include "distca/core/io.h"

namespace distca::train {
namespace {

constexpr char kMagic[8] = {'D', 'C', 'A', 'C', 'K', 'P', 'T', '\n'};
constexpr uint32_t kVersion = 1;

template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

class Reader {
 public:
  Reader(const std::string& b, size_t end) : b_(b), end_(end) {}
  template <class T>
  bool get(T& v) {
    if (end_ - pos_ < sizeof(T)) return false;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool floats(std::vector<float>& v, int64_t n) {
    // Compare counts, not bytes: n * 4 wraps for n >= 2^62 and would pass a byte check.
    if (n < 0 || static_cast<uint64_t>(n) > (end_ - pos_) / sizeof(float)) return false;
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    v.resize(static_cast<size_t>(n));
    if (bytes > 0) std::memcpy(v.data(), b_.data() + pos_, bytes);  // v.data() may be null
    pos_ += bytes;
    return true;
  }
  bool text(std::string& s, uint64_t n) {
    if (end_ - pos_ < n) return false;
    s.assign(b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  const std::string& b_;
  size_t end_;
  size_t pos_ = 0;
};

std::map<std::string, std::string> parse_pairs(const std::string& fp) {
  std::map<std::string, std::string> m;
  std::istringstream in(fp);
  std::string tok;
  while (in >> tok) {
    const auto eq = tok.find('=');
    if (eq != std::string::npos) m[tok.substr(0, eq)] = tok.substr(eq + 1);
  }
  return m;
}

// A key's value in a parsed fingerprint; keys fingerprint() writes only when set have their
// default when absent.
std::string fingerprint_value(const std::map<std::string, std::string>& pairs, const std::string& key) {
  if (auto it = pairs.find(key); it != pairs.end()) return it->second;
  if (key == "pp" || key == "micro_batches" || key == "tp") return "1";
  return "(absent)";
}

}  // namespace

std::string fingerprint(const TrainConfig& c, const ModelSpec& m) {
  std::ostringstream o;
  o.precision(17);
  o << "model=" << m.name << " n_layers=" << m.n_layers << " hidden=" << m.hidden
    << " n_heads=" << m.n_heads << " n_kv_heads=" << m.n_kv_heads << " head_dim=" << m.head_dim
    << " ffn=" << m.ffn << " vocab=" << m.vocab << " ranks=" << c.ranks << " seed=" << c.seed
    << " data=" << c.data << " copy_vocab=" << c.copy_vocab << " dist=" << c.dist << " tokens_per_rank=" << c.tokens_per_rank
    << " max_doc_len=" << c.max_doc_len << " steps=" << c.steps << " lr=" << c.lr
    << " min_lr=" << c.min_lr << " warmup=" << c.warmup << " weight_decay=" << c.weight_decay
    << " clip=" << c.clip;
  // Written only when set, so checkpoints of runs without pipelines keep their fingerprint.
  if (c.pp != 1) o << " pp=" << c.pp;
  if (c.micro_batches != 1) o << " micro_batches=" << c.micro_batches;
  // The parameters are the whole model whatever tp, but tp changes the data-parallel replicas
  // (ranks / tp), hence the batches: a resume with another tp is refused like one with other
  // ranks.
  if (c.tp != 1) o << " tp=" << c.tp;
  return o.str();
}

uint64_t fnv1a64(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::string serialize_checkpoint(const Checkpoint& c) {
  DISTCA_CHECK(c.adam_m.size() == c.params.size() && c.adam_v.size() == c.params.size());
  // Sized once: the parameters and moments are most of the bytes, and growing the string by
  // doubling would hold up to twice them at the peak.
  std::string out;
  out.reserve(sizeof(kMagic) + 4 + 8 + c.fingerprint.size() + 4 * 8 + 3 * c.params.size() * sizeof(float) + 8);
  out.append(kMagic, sizeof(kMagic));
  put(out, kVersion);
  put(out, static_cast<uint64_t>(c.fingerprint.size()));
  out += c.fingerprint;
  put(out, c.step);
  put(out, c.seed);
  put(out, c.adam_step);
  put(out, static_cast<int64_t>(c.params.size()));
  for (const auto* v : {&c.params, &c.adam_m, &c.adam_v}) {
    out.append(reinterpret_cast<const char*>(v->data()), v->size() * sizeof(float));
  }
  put(out, fnv1a64(out.data(), out.size()));
  return out;
}

Result<Checkpoint> parse_checkpoint(const std::string& b, const std::string& name) {
  auto corrupt = [&](const std::string& what) { return Status::corrupt(name + ": " + what); };
  if (b.size() < sizeof(kMagic) + 4 + 8 || std::memcmp(b.data(), kMagic, sizeof(kMagic)) != 0) {
    return corrupt("not a distca checkpoint (bad magic)");
  }
  uint64_t stored = 0;
  std::memcpy(&stored, b.data() + b.size() - 8, 8);
  if (fnv1a64(b.data(), b.size() - 8) != stored) return corrupt("checksum mismatch (file corrupt)");
  Reader r(b, b.size() - 8);
  char magic[8];
  uint32_t version = 0;
  uint64_t fp_len = 0;
  r.get(magic);
  if (!r.get(version)) return corrupt("truncated");
  if (version != kVersion) {
    return corrupt("version " + std::to_string(version) + " is not supported (expected " +
                   std::to_string(kVersion) + ")");
  }
  Checkpoint c;
  int64_t n = 0;
  if (!r.get(fp_len) || !r.text(c.fingerprint, fp_len) || !r.get(c.step) || !r.get(c.seed) ||
      !r.get(c.adam_step) || !r.get(n) || !r.floats(c.params, n) || !r.floats(c.adam_m, n) ||
      !r.floats(c.adam_v, n) || r.pos() != b.size() - 8) {
    return corrupt("truncated or malformed");
  }
  return c;
}

std::string checkpoint_name(int64_t steps) {
  char name[40];
  std::snprintf(name, sizeof(name), "step-%08lld.ckpt", static_cast<long long>(steps));
  return name;
}

bool is_checkpoint_name(const std::string& name) {
  const std::string prefix = "step-", suffix = ".ckpt";
  if (name.size() < prefix.size() + 8 + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  return digits.find_first_not_of("0123456789") == std::string::npos;
}

Status write_checkpoint(const std::string& path, const Checkpoint& c) {
  return write_file_atomic(path, serialize_checkpoint(c));
}

Result<Checkpoint> read_checkpoint(const std::string& path, const std::string& expected) {
  const std::string name = "--resume " + path;
  auto bytes = read_file(path);
  if (!bytes.ok()) return Status::not_found(name + ": " + bytes.status().message());
  DISTCA_ASSIGN_OR_RETURN(Checkpoint c, parse_checkpoint(*bytes, name));
  if (c.fingerprint != expected) {
    const auto have = parse_pairs(c.fingerprint), want = parse_pairs(expected);
    // Every key of either side: fingerprint() leaves out keys at their defaults, so a key may
    // be on one side only (a --pp 4 checkpoint resumed with --pp 1).
    std::map<std::string, std::string> keys = have;
    keys.insert(want.begin(), want.end());
    std::string was, is;
    for (const auto& [k, unused] : keys) {
      const std::string hv = fingerprint_value(have, k), wv = fingerprint_value(want, k);
      if (hv != wv) {
        if (!was.empty()) { was += ", "; is += ", "; }
        was += k + "=" + hv;
        is += k + "=" + wv;
      }
    }
    if (was.empty()) {  // differs in a way the pairs do not show (spacing, a repeated key)
      was = "'" + c.fingerprint + "'";
      is = "'" + expected + "'";
    }
    return Status::invalid_argument(name + ": was written for " + was + "; this run has " + is);
  }
  return c;
}

Status check_resume(const Checkpoint& c, const TrainConfig& config, int64_t n_params, const std::string& name) {
  auto bad = [&](const std::string& what) { return Status::invalid_argument(name + ": " + what); };
  if (c.step < 0) return bad("step " + std::to_string(c.step) + " is negative");
  if (c.step >= config.steps) {
    return bad("step " + std::to_string(c.step) + " is not before the run's end (--steps " +
               std::to_string(config.steps) + "): nothing left to resume");
  }
  if (c.adam_step != c.step) {
    return bad("optimizer step count " + std::to_string(c.adam_step) + " does not match step " +
               std::to_string(c.step) + " (one optimizer step per step)");
  }
  if (static_cast<int64_t>(c.params.size()) != n_params || c.adam_m.size() != c.params.size() ||
      c.adam_v.size() != c.params.size()) {
    return bad("holds " + std::to_string(c.params.size()) + " parameters; this model has " + std::to_string(n_params));
  }
  const std::pair<const char*, const std::vector<float>*> arrays[] = {
      {"parameter", &c.params}, {"AdamW first moment", &c.adam_m}, {"AdamW second moment", &c.adam_v}};
  for (const auto& [what, v] : arrays) {
    for (size_t i = 0; i < v->size(); ++i) {
      if (!std::isfinite((*v)[i])) return bad(std::string(what) + " " + std::to_string(i) + " is not finite");
    }
  }
  for (size_t i = 0; i < c.adam_v.size(); ++i) {
    if (c.adam_v[i] < 0) return bad("AdamW second moment " + std::to_string(i) + " is negative");
  }
  return {};
}

}  // namespace distca::train
