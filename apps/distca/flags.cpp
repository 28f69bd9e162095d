#include "flags.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <type_traits>

#include "command.h"
#include "distca/core/memory.h"

#ifndef DISTCA_VERSION
#define DISTCA_VERSION "unknown"  // compiled outside CMake (the flag-parsing fuzzer)
#endif

namespace distca::cli {
namespace {

// Where the current option's values are in CLI11's pipeline: the strict conversions throw
// (naming the flag) only while an option of strict_options() is being processed.
enum class Phase { kNone, kValidating, kConverting };
thread_local Phase g_phase = Phase::kNone;
thread_local std::string g_flag;

// A refused value, echoed back at most this long (a megabyte of digits stays one short line).
std::string shown(const std::string& text) {
  constexpr size_t kMax = 48;
  return text.size() <= kMax ? text : text.substr(0, kMax) + "...";
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

enum class Outcome { kOk, kSyntax, kRange };

// -?digits, without a leading zero: "010" is not octal here, it is refused.
bool integer_syntax(const std::string& s) {
  const size_t i = !s.empty() && s[0] == '-' ? 1 : 0;
  const size_t digits = s.size() - i;
  return digits > 0 && std::all_of(s.begin() + static_cast<std::ptrdiff_t>(i), s.end(), is_digit) &&
         (digits == 1 || s[i] != '0');
}

template <typename T>
Outcome parse_integer(const std::string& text, T& out, std::string* why) {
  if (!integer_syntax(text)) {
    *why = "expected a decimal integer, got '" + shown(text) + "'";
    return Outcome::kSyntax;
  }
  const bool negative = text[0] == '-';
  if constexpr (std::is_unsigned_v<T>) {
    if (negative) {
      *why = shown(text) + " is out of range (at least 0)";
      return Outcome::kRange;
    }
  }
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 10);
  if (ec == std::errc::result_out_of_range) {
    *why = shown(text) + " is out of range (" +
           (negative ? "at least " + std::to_string(std::numeric_limits<T>::min())
                     : "at most " + std::to_string(std::numeric_limits<T>::max())) +
           ")";
    return Outcome::kRange;
  }
  if (ec != std::errc() || end != text.data() + text.size()) {
    *why = "expected a decimal integer, got '" + shown(text) + "'";
    return Outcome::kSyntax;
  }
  out = value;
  return Outcome::kOk;
}

// -?(digits[.digits*] | .digits)([eE][+-]?digits)?
bool plain_decimal(const std::string& s) {
  size_t i = 0;
  if (i < s.size() && s[i] == '-') ++i;
  size_t mantissa = 0;
  while (i < s.size() && is_digit(s[i])) ++i, ++mantissa;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && is_digit(s[i])) ++i, ++mantissa;
  }
  if (mantissa == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    size_t exponent = 0;
    while (i < s.size() && is_digit(s[i])) ++i, ++exponent;
    if (exponent == 0) return false;
  }
  return i == s.size();
}

template <typename T>
Outcome parse_float(const std::string& text, T& out, std::string* why) {
  if (!plain_decimal(text)) {
    *why = "expected a finite decimal number, got '" + shown(text) + "'";
    return Outcome::kSyntax;
  }
  // strto* after the syntax check: no locale issue (the CLI never calls setlocale) and exact
  // rounding. Underflow is accepted (the value rounds to 0 or a denormal); overflow is not.
  char* end = nullptr;
  T value;
  if constexpr (std::is_same_v<T, float>) {
    value = std::strtof(text.c_str(), &end);
  } else if constexpr (std::is_same_v<T, double>) {
    value = std::strtod(text.c_str(), &end);
  } else {
    value = std::strtold(text.c_str(), &end);
  }
  if (!std::isfinite(value)) {
    char max[64];
    std::snprintf(max, sizeof max, "%.6Lg", static_cast<long double>(std::numeric_limits<T>::max()));
    *why = shown(text) + " is out of range (at most " + max + " in magnitude)";
    return Outcome::kRange;
  }
  out = value;
  return Outcome::kOk;
}

template <typename T>
Outcome parse_any(const std::string& text, T& out, std::string* why) {
  if constexpr (std::is_floating_point_v<T>) {
    return parse_float(text, out, why);
  } else {
    return parse_integer(text, out, why);
  }
}

// The body of every lexical_cast overload. While validators run (CLI::Range, PositiveNumber
// call lexical_cast too) a syntax error or a float overflow throws; an integer range error is
// left to that validator (Range(1, 1000) on an int64 flag), whose bounds are the ones the user
// should hear. During the conversion proper both throw,
// naming the flag. Outside strict_options()'s options it behaves as CLI11 does: false.
template <typename T>
bool strict_cast(const std::string& input, T& output) {
  std::string why;
  const Outcome r = parse_any(input, output, &why);
  if (r == Outcome::kOk) return true;
  if (g_phase == Phase::kConverting) throw CLI::ValidationError(g_flag, why);
  if (g_phase == Phase::kValidating && (r == Outcome::kSyntax || std::is_floating_point_v<T>)) {
    throw CLI::ValidationError(why);
  }
  return false;
}

enum class Kind { kOther, kInteger, kFloat };

Kind kind_of(const std::string& type_name) {
  const std::string base = type_name.substr(0, type_name.find(':'));
  if (base == "INT" || base == "UINT") return Kind::kInteger;
  if (base == "FLOAT") return Kind::kFloat;
  return Kind::kOther;
}

// The syntax check by the option's type name, before any other validator: so that a value
// given to an integer flag with a floating-point validator (PositiveNumber) is still told it
// should be a decimal integer.
std::string check_syntax(Kind kind, const std::string& value, bool value_optional) {
  if (kind == Kind::kOther) {
    return value.empty() && !value_optional ? "expected a value, got an empty one" : std::string();
  }
  if (value.empty()) return "expected a number, got an empty value";
  if (kind == Kind::kInteger) {
    return integer_syntax(value) ? std::string() : "expected a decimal integer, got '" + shown(value) + "'";
  }
  double d;
  std::string why;
  return parse_float(value, d, &why) == Outcome::kOk ? std::string() : why;
}

// CLI11's PositiveNumber / NonNegativeNumber print their double bounds in full ("not in range
// 0.000000 to 17976931348623157...000"): the same test, said plainly.
void plain_sign_validators(CLI::Option& opt) {
  for (int i = 0;; ++i) {
    CLI::Validator* v = nullptr;
    try {
      v = opt.get_validator(i);
    } catch (const CLI::OptionNotFound&) {
      return;
    }
    // CLI11 passes their names as the description.
    const bool positive = v->get_description() == "POSITIVE";
    if (!positive && v->get_description() != "NONNEGATIVE") continue;
    v->operation([positive](std::string& text) -> std::string {
      double d = 0;
      std::string why;
      if (parse_float(text, d, &why) != Outcome::kOk) return why;
      if (positive ? d > 0 : d >= 0) return {};
      return std::string(positive ? "must be positive" : "must not be negative") + " (got " + shown(text) + ")";
    });
  }
}

// Adds the validators that let the strict conversions name their flag to every option of `app`
// and of all its subcommands, recursively; an empty value is refused for every option that takes
// one (CLI11 would read it as 0 for a number; for a word, '' would pass as "not given" and take
// the default, or slip past a rule that applies only when the flag is set). Called after every
// option is declared, before parsing.
void strict_options(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_name();
    const Kind kind = kind_of(opt->get_type_name());
    // A flag (no value) or an option whose value may be left out (--json alone): CLI11 hands
    // its validators an empty string for the missing value.
    const bool value_optional = opt->get_expected_min() == 0;
    plain_sign_validators(*opt);
    // transform(): runs before every validator the command added.
    opt->transform(CLI::Validator(
        [name, kind, value_optional](std::string& value) -> std::string {
          g_flag = name;
          g_phase = Phase::kValidating;
          return check_syntax(kind, value, value_optional);
        },
        "", ""));
    // check(): runs after them, just before the conversion.
    opt->check(CLI::Validator(
        [](std::string&) -> std::string {
          g_phase = Phase::kConverting;
          return {};
        },
        "", ""));
  }
  for (CLI::App* sub : app.get_subcommands({})) strict_options(*sub);
}

}  // namespace

CLI::Option* add_mpi_timeout(CLI::App& app, double& seconds, const std::string& when) {
  return app
      .add_option("--mpi-timeout", seconds,
                  when + ": seconds without progress after which a silent rank ends the job, in (0, 1e6] (default 300)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            double d = 0;
            std::string why;
            if (parse_float(text, d, &why) != Outcome::kOk) return why;
            return d > 0 && d <= 1e6 ? std::string() : "must be in (0, 1e6] seconds (got " + shown(text) + ")";
          },
          "", ""));
}

std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  for (size_t pos = 0;;) {
    const size_t comma = list.find(',', pos);
    out.push_back(list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) return out;
    pos = comma + 1;
  }
}

void parse_strict(CLI::App& app, int argc, const char* const* argv) {
  struct Reset {
    ~Reset() {
      g_phase = Phase::kNone;
      g_flag.clear();
    }
  } reset;
  app.parse(argc, argv);
}

std::unique_ptr<CliApp> build_cli(std::vector<Command> commands) {
  auto cli = std::make_unique<CliApp>();
  CLI::App& app = cli->app;
  app.set_version_flag("--version", DISTCA_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  std::stable_sort(commands.begin(), commands.end(),
                   [](const Command& a, const Command& b) { return a.order < b.order; });
  std::map<std::string, CLI::App*> parents;
  for (const auto& c : commands) {
    CLI::App* owner = &app;
    if (!c.parent.empty()) {
      auto it = parents.find(c.parent);
      if (it == parents.end()) {
        CLI::App* p = app.add_subcommand(
            c.parent, "Benchmarks that print figures and ratios against a baseline measured in the same run");
        p->require_subcommand(1);
        it = parents.emplace(c.parent, p).first;
      }
      owner = it->second;
    }
    CLI::App* sub = owner->add_subcommand(c.name, c.description);
    cli->leaves.emplace_back(sub, c.setup(*sub));
    sub->add_option("--max-memory", cli->max_memory,
                    "Refuse, before any work, a run whose memory estimate exceeds SIZE (512M, 8G, 1.5GiB; "
                    "default: the machine's available memory)")
        ->type_name("SIZE")
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
              const Result<uint64_t> r = parse_byte_size(text);
              if (r.ok()) return {};
              // The message names the flag already; CLI11 adds the name again.
              const std::string prefix = "--max-memory: ";
              std::string m = r.status().message();
              if (m.compare(0, prefix.size(), prefix) == 0) m.erase(0, prefix.size());
              return m;
            },
            "", ""));
  }
  strict_options(app);
  return cli;
}

std::string find_unknown_command(CLI::App& app, int argc, const char* const* argv) {
  CLI::App* level = &app;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;
    if (word.size() > 1 && word[0] == '-') continue;
    const std::vector<CLI::App*> subs = level->get_subcommands({});
    auto it = std::find_if(subs.begin(), subs.end(), [&](CLI::App* s) { return s->check_name(word); });
    if (it == subs.end()) return "unknown command '" + path + shown(word) + "'";
    if ((*it)->get_subcommands({}).empty()) return {};  // a leaf: the rest are its own arguments
    level = *it;
    path += word + " ";
  }
  return {};
}

}  // namespace distca::cli

namespace CLI::detail {
bool lexical_cast(const std::string& input, short& output) { return distca::cli::strict_cast(input, output); }
bool lexical_cast(const std::string& input, unsigned short& output) { return distca::cli::strict_cast(input, output); }
bool lexical_cast(const std::string& input, int& output) { return distca::cli::strict_cast(input, output); }
bool lexical_cast(const std::string& input, unsigned int& output) { return distca::cli::strict_cast(input, output); }
bool lexical_cast(const std::string& input, long& output) { return distca::cli::strict_cast(input, output); }
bool lexical_cast(const std::string& input, unsigned long& output) { return distca::cli::strict_cast(input, output); }
bool lexical_cast(const std::string& input, long long& output) { return distca::cli::strict_cast(input, output); }
bool lexical_cast(const std::string& input, unsigned long long& output) {
  return distca::cli::strict_cast(input, output);
}
bool lexical_cast(const std::string& input, float& output) { return distca::cli::strict_cast(input, output); }
bool lexical_cast(const std::string& input, double& output) { return distca::cli::strict_cast(input, output); }
bool lexical_cast(const std::string& input, long double& output) { return distca::cli::strict_cast(input, output); }
}  // namespace CLI::detail
