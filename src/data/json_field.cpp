// JSON parsing that names the failing field (json_field.h).
#include "distca/data/json_field.h"

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "distca/core/io.h"

namespace distca {
namespace {

// Tracks where the parser is: one frame per open object or array.
class PathSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::string failed_at;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    stack_.push_back({false, 0, ""});
    return true;
  }
  bool key(string_t& k) override {
    stack_.back().key = k;
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    return value();
  }
  bool start_array(std::size_t) override {
    stack_.push_back({true, 0, ""});
    return true;
  }
  bool end_array() override {
    stack_.pop_back();
    return value();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    failed_at = path();
    return false;
  }

 private:
  struct Frame {
    bool array;
    int64_t index;
    std::string key;
  };

  // A value just ended: the enclosing array moves to its next element.
  bool value() {
    if (!stack_.empty() && stack_.back().array) ++stack_.back().index;
    return true;
  }

  std::string path() const {
    std::string out;
    for (const Frame& f : stack_) {
      // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "[" + s + "]".
      if (f.array) {
        out.push_back('[');
        out.append(std::to_string(f.index));
        out.push_back(']');
      } else {
        if (!out.empty()) out.push_back('.');
        out.append(f.key);
      }
    }
    return out;
  }

  std::vector<Frame> stack_;
};

}  // namespace

std::string json_failure_path(const std::string& text) {
  PathSax sax;
  try {
    nlohmann::json::sax_parse(text, &sax);
  } catch (const nlohmann::json::exception&) {
    // The SAX parser reports through parse_error; anything thrown besides has no position.
  }
  return sax.failed_at;
}

Result<nlohmann::json> parse_json_fields(const std::string& text, const std::string& name) {
  auto j = parse_json_text(text, name);
  if (j.ok()) return j;
  const std::string field = json_failure_path(text);
  if (field.empty()) return j;
  return Status(j.status().code(), j.status().message() + ": field " + field);
}

Result<nlohmann::json> read_json_fields(const std::string& path) {
  DISTCA_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse_json_fields(text, path);
}

}  // namespace distca
