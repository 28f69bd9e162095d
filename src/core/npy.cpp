#include "distca/core/npy.h"

#include <cstring>
#include <limits>

#include "distca/core/io.h"

namespace distca {

const char* npy_dtype_name(NpyDtype dtype) { return dtype == NpyDtype::kFloat32 ? "float32" : "int32"; }

int64_t NpyArray::size() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

namespace {

static_assert(sizeof(float) == 4 && sizeof(int32_t) == 4);
constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

bool host_little_endian() {
  const uint16_t one = 1;
  unsigned char b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

// For messages: header bytes come from the file, so control and non-ASCII bytes become '?'
// (an error stays one printable line).
std::string printable(std::string_view s) {
  std::string r(s);
  for (char& c : r) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return r;
}

// A minimal reader of the Python dict literal numpy writes:
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view s) : s_(s) {}

  Status parse(std::string* descr, bool* fortran, std::vector<int64_t>* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_ws();
    if (!eat('{')) return err("header is not a dict");
    while (true) {
      skip_ws();
      if (eat('}')) break;
      std::string key;
      DISTCA_RETURN_IF_ERROR(parse_string(&key));
      skip_ws();
      if (!eat(':')) return err("expected ':' after key '" + printable(key) + "'");
      skip_ws();
      if (key == "descr") {
        DISTCA_RETURN_IF_ERROR(parse_string(descr));
        have_descr = true;
      } else if (key == "fortran_order") {
        if (match("True")) {
          *fortran = true;
        } else if (match("False")) {
          *fortran = false;
        } else {
          return err("fortran_order must be True or False");
        }
        have_fortran = true;
      } else if (key == "shape") {
        DISTCA_RETURN_IF_ERROR(parse_shape(shape));
        have_shape = true;
      } else {
        return err("unexpected header key '" + printable(key) + "'");
      }
      skip_ws();
      if (eat(',')) continue;
      skip_ws();
      if (eat('}')) break;
      return err("expected ',' or '}' in header");
    }
    if (!have_descr || !have_fortran || !have_shape) return err("header lacks descr, fortran_order or shape");
    return {};
  }

 private:
  Status err(const std::string& m) { return Status::invalid_argument(m); }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool match(std::string_view word) {
    if (s_.substr(pos_, word.size()) == word) {
      pos_ += word.size();
      return true;
    }
    return false;
  }
  Status parse_string(std::string* out) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return err("expected a quoted string in header");
    const char q = s_[pos_++];
    const size_t end = s_.find(q, pos_);
    if (end == std::string_view::npos || end - pos_ > 64) return err("unterminated or overlong string in header");
    *out = std::string(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return {};
  }
  Status parse_shape(std::vector<int64_t>* shape) {
    shape->clear();
    if (!eat('(')) return err("shape must be a tuple");
    while (true) {
      skip_ws();
      if (eat(')')) return {};
      if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') return err("shape must hold non-negative integers");
      int64_t v = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return err("shape entry too large");
        v = v * 10 + (s_[pos_++] - '0');
      }
      if (shape->size() >= 32) return err("shape has too many dimensions");
      shape->push_back(v);
      skip_ws();
      if (eat(',')) continue;
      skip_ws();
      if (eat(')')) return {};
      return err("malformed shape tuple");
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

uint32_t read_le(const unsigned char* p, int n) {
  uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

template <class T>
std::string make_npy(const T* data, const std::vector<int64_t>& shape, const char* descr) {
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dict += ",";
    if (i + 1 < shape.size()) dict += " ";
    n *= shape[i];
  }
  dict += "), }";
  // Pad with spaces so that magic + version + length + header is a multiple of 64; end '\n'.
  const size_t fixed = kMagicLen + 2 + 2;
  size_t total = fixed + dict.size() + 1;
  const size_t pad = (64 - total % 64) % 64;
  dict.append(pad, ' ');
  dict += '\n';
  std::string out(kMagic, kMagicLen);
  out += static_cast<char>(1);
  out += static_cast<char>(0);
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>((dict.size() >> 8) & 0xff);
  out += dict;
  DISTCA_CHECK_MSG(host_little_endian(), ".npy writing assumes a little-endian host");
  out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n) * sizeof(T));
  return out;
}

}  // namespace

Result<NpyArray> parse_npy(std::string_view bytes, const std::string& name) {
  auto bad = [&](const std::string& m) { return Status::invalid_argument(name + ": " + m); };
  if (bytes.size() < kMagicLen + 4 || std::memcmp(bytes.data(), kMagic, kMagicLen) != 0) {
    return bad("not a .npy file (bad magic)");
  }
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  const int major = u[kMagicLen];
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = read_le(u + kMagicLen + 2, 2);
    header_start = kMagicLen + 4;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < kMagicLen + 6) return bad("truncated .npy header");
    header_len = read_le(u + kMagicLen + 2, 4);
    header_start = kMagicLen + 6;
  } else {
    return bad("unsupported .npy format version " + std::to_string(major));
  }
  if (header_len > bytes.size() - header_start) return bad("truncated .npy header");
  std::string descr;
  bool fortran = false;
  NpyArray a;
  const Status st = HeaderParser(bytes.substr(header_start, header_len)).parse(&descr, &fortran, &a.shape);
  if (!st.ok()) return bad(st.message());
  if (fortran) return bad("Fortran-order arrays are not supported (save with C order)");
  if (descr == "<f4") {
    a.dtype = NpyDtype::kFloat32;
  } else if (descr == "<i4") {
    a.dtype = NpyDtype::kInt32;
  } else {
    return bad("dtype '" + printable(descr) + "' is not supported (need little-endian float32 '<f4' or int32 '<i4')");
  }
  const size_t data_bytes = bytes.size() - header_start - header_len;
  // Element count, guarding against overflow.
  uint64_t n = 1;
  for (int64_t s : a.shape) {
    if (s != 0 && n > std::numeric_limits<uint64_t>::max() / 4 / static_cast<uint64_t>(s)) return bad("shape too large");
    n *= static_cast<uint64_t>(s);
  }
  if (n * 4 != data_bytes) {
    return bad("payload holds " + std::to_string(data_bytes) + " bytes but the shape needs " + std::to_string(n * 4));
  }
  if (!host_little_endian()) return bad("reading .npy needs a little-endian host");
  const char* payload = bytes.data() + header_start + header_len;
  if (a.dtype == NpyDtype::kFloat32) {
    a.f32.resize(n);
    if (n) std::memcpy(a.f32.data(), payload, data_bytes);
  } else {
    a.i32.resize(n);
    if (n) std::memcpy(a.i32.data(), payload, data_bytes);
  }
  return a;
}

Result<NpyArray> read_npy(const std::string& path) {
  DISTCA_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  return parse_npy(bytes, "'" + path + "'");
}

std::string npy_bytes(const float* data, const std::vector<int64_t>& shape) { return make_npy(data, shape, "<f4"); }
std::string npy_bytes(const int32_t* data, const std::vector<int64_t>& shape) { return make_npy(data, shape, "<i4"); }

Status write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  return write_file_atomic(path, npy_bytes(data, shape));
}
Status write_npy(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape) {
  return write_file_atomic(path, npy_bytes(data, shape));
}

}  // namespace distca
