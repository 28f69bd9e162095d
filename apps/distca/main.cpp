// distca: the command-line tool. Parses arguments, dispatches to one registered command, and
// is the only place that prints for people and chooses exit codes.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <system_error>

#include "command.h"
#include "launcher.h"
#include "distca/comm/mpi.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"

namespace distca::cli {
namespace {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace

bool register_command(Command command) {
  registry().push_back(std::move(command));
  return true;
}

const std::vector<Command>& registered_commands() { return registry(); }

int exit_code(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorrupt:
    case StatusCode::kOutOfMemory:  // a refused memory estimate: the flags ask for too much
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

int fail(const Status& status) {
  std::fprintf(stderr, "distca: error: %s\n", status.message().c_str());
  return exit_code(status);
}

int launch_failed(const comm::Launched& launched) {
  return launched.speaks ? fail(launched.status) : exit_code(launched.status);
}

int fail_input(const std::string& message) {
  std::fprintf(stderr, "distca: error: %s\n", message.c_str());
  return kExitBadInput;
}

Status check_output_flag(const std::string& flag, const std::string& path) {
  if (path.empty() || path == "-") return Status::ok_status();
  return check_output_path(path).with_context(flag);
}

Status check_outputs(const std::vector<NamedOutput>& outputs) {
  DISTCA_RETURN_IF_ERROR(check_distinct_outputs(outputs));
  for (const NamedOutput& o : outputs) {
    if (o.path.empty() || (o.dash_is_stdout && o.path == "-")) continue;
    DISTCA_RETURN_IF_ERROR(check_output_path(o.path).with_context(o.flag));
  }
  return Status::ok_status();
}

Status write_output_flag(const std::string& path, const std::string& text) {
  if (path == "-") return write_stdout(text);
  return path.empty() ? Status::ok_status() : write_file_atomic(path, text);
}

Result<ModelSpec> model_flag(const std::string& name) {
  auto m = model_preset(name);
  if (!m.ok()) return m.status().with_context("--model");
  return m;
}

void appendf(std::string& out, const char* fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  if (n > 0) {
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(n) + 1);
    std::vsnprintf(out.data() + at, static_cast<size_t>(n) + 1, fmt, ap2);
    out.resize(at + static_cast<size_t>(n));
  }
  va_end(ap2);
}

std::string mib(double bytes, int decimals) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.*f", decimals, bytes / (1024.0 * 1024.0));
  return s;
}

std::string human_bytes(double bytes, int base) {
  const char* iec[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  const char* si[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  const char* const* units = base == 1024 ? iec : si;
  const int last = base == 1024 ? 4 : 5;
  int u = 0;
  while (std::fabs(bytes) >= base && u < last) {
    bytes /= base;
    ++u;
  }
  char s[32];
  std::snprintf(s, sizeof s, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return s;
}

const char* heap_pages() { return distca::malloc_on_huge_pages() ? "heap on 2 MiB pages" : "heap on 4 KiB pages"; }

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

}  // namespace distca::cli

namespace {

// Keeps freed buffers of up to 32 MiB in the heap for reuse instead of handing them back to
// the OS. The runtime's per-step buffers (fused Q/K/V, gradients, wire rows) are allocated
// and freed every layer; glibc would otherwise mmap each one afresh, and page-faulting tens of
// megabytes per step cost 5-10 ms of a 0.8 s layer step on this machine (docs/runtime.md).
// The price is that the process keeps its peak heap. A process-wide allocator policy, so the
// application sets it, not a library.
void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

// Backs the first kHugeHeapBytes of the heap with transparent huge pages. On a virtual machine
// the first touch of every 4 KiB page costs a trap and a page-table update by the hypervisor
// (8-30 us each on the development VM), so a process's first plan, which writes tens of MB of
// fresh heap (ProLong 512K at 512 servers: 6K pages), spent about 90% of its time in page
// faults, and every later plan reused those pages: the first `distca plan` took 10x a warm
// one (docs/scheduler.md, "Performance"). Huge pages take one fault per 2 MiB. The heap is
// grown by that much now (address space only: pages become resident when first touched, as
// before) and advised MADV_HUGEPAGE, which THP's default "madvise" mode honours; elsewhere
// ("never", no THP, no brk heap) the advice fails or is skipped and nothing changes. Only the
// main thread's arena is covered; threads that allocate from arenas of their own (the trainer's
// planning threads) are not. Below M_TRIM_THRESHOLD, so the freed block is never handed back.
// The fallback for a process whose malloc does not advise huge pages itself (glibc.malloc.hugetlb,
// reexec_with_process_settings below).
void back_heap_with_huge_pages() {
#if defined(__GLIBC__) && defined(MADV_HUGEPAGE)
  constexpr size_t kHugeHeapBytes = size_t{512} << 20;
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  constexpr int kDefaultTopPad = 128 << 10;  // mallopt(3)
  mallopt(M_TOP_PAD, static_cast<int>(kHugeHeapBytes));
  void* block = std::malloc(kHugePage);  // grows the heap by the block and the pad
  mallopt(M_TOP_PAD, kDefaultTopPad);
  if (block == nullptr) return;
  const uintptr_t start = (reinterpret_cast<uintptr_t>(block) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(::sbrk(0)) & ~(kHugePage - 1);
  // The block came from the brk heap and the heap did grow (not a mapping of its own).
  if (start < end && end - start <= kHugeHeapBytes + kHugePage) {
    ::madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
  }
  std::free(block);
#endif
}

// Two settings a library reads once, when the process starts, so this process sets them in
// its environment and re-executes the same binary with the same arguments (exec keeps the pid,
// so mpirun and its daemons see the same process; what this process starts inherits them):
//   OPENBLAS_CORETYPE: Debian's OpenBLAS 0.3.21 does not recognise some current CPUs and falls
//     back to its SSE3 kernels, 3-8x slower (docs/benchmarks.md); it reads the variable when
//     the library is loaded, before main(). Set as scripts/blas-env.sh does (same CPU test:
//     the first "flags" line of /proc/cpuinfo).
//   GLIBC_TUNABLES' glibc.malloc.hugetlb=1: malloc on transparent huge pages (core/memory.h,
//     docs/runtime.md "Page faults"); added only where THP can be advised.
// A value the user set (or blas-env.sh) is left alone; kReexecMarker stops a second re-exec
// should a variable not survive the first.
constexpr const char* kReexecMarker = "DISTCA_SETTINGS_REEXEC";

const char* openblas_core_for_this_cpu() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.compare(0, 5, "flags") != 0) continue;
    std::istringstream words(line);
    bool avx512f = false, avx2 = false;
    for (std::string w; words >> w;) {
      avx512f = avx512f || w == "avx512f";
      avx2 = avx2 || w == "avx2";
    }
    return avx512f ? "SkylakeX" : avx2 ? "Haswell" : nullptr;
  }
  return nullptr;
}

void reexec_with_process_settings(char** argv) {
  if (std::getenv(kReexecMarker) != nullptr) {
    ::unsetenv(kReexecMarker);  // not inherited by what this process starts
    return;
  }
  const char* core = std::getenv("OPENBLAS_CORETYPE") == nullptr ? openblas_core_for_this_cpu() : nullptr;
  std::optional<std::string> old_tunables;
  if (const char* t = std::getenv("GLIBC_TUNABLES")) old_tunables = t;
  std::optional<std::string> tunables;
  if (distca::transparent_huge_pages_available()) tunables = distca::with_malloc_hugetlb(old_tunables.value_or(""));
  if (core == nullptr && !tunables) return;
  if (core != nullptr) ::setenv("OPENBLAS_CORETYPE", core, 1);
  if (tunables) ::setenv("GLIBC_TUNABLES", tunables->c_str(), 1);
  ::setenv(kReexecMarker, "1", 1);
  ::execv("/proc/self/exe", argv);
  // exec failed (no /proc): run on as started.
  if (core != nullptr) ::unsetenv("OPENBLAS_CORETYPE");
  if (tunables && old_tunables) ::setenv("GLIBC_TUNABLES", old_tunables->c_str(), 1);
  if (tunables && !old_tunables) ::unsetenv("GLIBC_TUNABLES");
  ::unsetenv(kReexecMarker);
}

// A closed standard descriptor would be reused by the next open(): a temporary output file
// would become "stdout" and receive the tables. Occupy it with /dev/null opened read-only, so
// that writes to a closed stdout still fail (EBADF) and are reported as failed writes.
void occupy_closed_std_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int got = ::open("/dev/null", O_RDONLY);
    if (got >= 0 && got != fd) {
      ::dup2(got, fd);
      ::close(got);
    }
  }
}

int report(const char* what) {
  std::fprintf(stderr, "distca: error: %s\n", what);
  return distca::cli::kExitFailure;
}

int parse_and_run(int argc, char** argv) {
  using namespace distca::cli;
  std::unique_ptr<CliApp> cli = build_cli(registered_commands());
  CLI::App& app = cli->app;
  const std::string unknown = find_unknown_command(app, argc, argv);
  if (!unknown.empty()) {
    std::fprintf(stderr, "distca: error: %s (see --help)\n", unknown.c_str());
    return kExitBadInput;
  }
  try {
    parse_strict(app, argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    if (msg.empty()) msg = e.get_name();
    // CLI11's words for `distca` or `distca bench` alone.
    if (msg.rfind("A subcommand is required", 0) == 0) msg = "no command given";
    std::fprintf(stderr, "distca: error: %s (see --help)\n", msg.c_str());
    return kExitBadInput;
  }
  // The mpi backend's wait policy (docs/runtime.md): refused before any work, on every command.
  if (const auto wait = distca::comm::wait_policy_from_env(); !wait.ok()) return fail_input(wait.status().message());
  if (!cli->max_memory.empty()) {
    const distca::Result<uint64_t> limit = distca::parse_byte_size(cli->max_memory);
    if (!limit.ok()) return fail_input(limit.status().message());
    distca::set_memory_limit(*limit);
  }
  for (auto& [sub, runner] : cli->leaves) {
    if (sub->parsed()) return runner();
  }
  std::fprintf(stderr, "distca: error: no command given (see --help)\n");
  return kExitBadInput;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace distca::cli;
  reexec_with_process_settings(argv);
  occupy_closed_std_fds();
  distca::install_temp_file_cleanup();
  keep_freed_memory();
  // The fallback where the tunable is not in effect (the re-exec did not happen) and the user
  // did not choose: with it set to anything, malloc's own advice or the user's choice stands.
  if (distca::malloc_hugetlb_tunable().empty()) back_heap_with_huge_pages();
  int code;
  // The CLI boundary: whatever a lower layer throws becomes one line, never an abort.
  try {
    code = parse_and_run(argc, argv);
  } catch (const std::bad_alloc&) {
    return report("out of memory (an allocation failed; --max-memory and the flags that size the run "
                  "decide what is attempted)");
  } catch (const std::system_error& e) {
    return report(e.what());
  } catch (const std::exception& e) {
    return report(e.what());
  }
  // Output buffered in stdout is written only now: a full device or a closed stdout shows up
  // here, and a run that could not deliver its output has failed.
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if ((!flushed || std::ferror(stdout)) && code == kExitOk) {
    const std::string why = err != 0 ? std::strerror(err) : "write error";
    std::fprintf(stderr, "distca: error: cannot write to standard output: %s\n", why.c_str());
    return kExitFailure;
  }
  return code;
}
