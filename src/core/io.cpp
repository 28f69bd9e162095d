#include "distca/core/io.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

namespace distca {
namespace {

std::string errno_text(int e) { return std::strerror(e); }

const char* kind_name(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

// ---- temporary-file registry (read by the signal handler) --------------------------------

constexpr int kSlots = 64;
constexpr size_t kPathMax = 4096;
// 0: free, 1: being filled by a writer, 2: holds a path the handler may unlink.
std::atomic<int> slot_state[kSlots];
char slot_path[kSlots][kPathMax];

int register_temp(const std::string& path) {
  if (path.size() + 1 > kPathMax) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (!slot_state[i].compare_exchange_strong(expected, 1)) continue;
    std::memcpy(slot_path[i], path.c_str(), path.size() + 1);
    slot_state[i].store(2, std::memory_order_release);
    return i;
  }
  return -1;
}

void unregister_temp(int slot) {
  if (slot >= 0) slot_state[slot].store(0, std::memory_order_release);
}

extern "C" void cleanup_and_reraise(int sig) {
  for (int i = 0; i < kSlots; ++i) {
    if (slot_state[i].load(std::memory_order_acquire) == 2) ::unlink(slot_path[i]);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// This host's name as it appears in temporary file names: letters, digits and '-' kept, every
// other byte (a '.', a '/') '_', so the name splits back unambiguously; at most 64 bytes.
std::string host_tag() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') std::strcpy(buf, "unknown-host");
  std::string tag;
  for (const char* c = buf; *c != '\0' && tag.size() < 64; ++c) {
    const bool keep = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-';
    tag += keep ? *c : '_';
  }
  return tag;
}

constexpr const char* kTempMarker = ".tmp.";
constexpr const char* kTempSuffix = ".distca";

Status write_all_fd(int fd, const std::string& content, const std::string& path) {
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::io_error("cannot write '" + path + "': " + errno_text(errno));
    }
    if (n == 0) return Status::io_error("cannot write '" + path + "': short write");
    done += static_cast<size_t>(n);
  }
  return {};
}

enum class Target { kAtomic, kThrough };

// Resolves symlinks and classifies the output target. `resolved` receives the path to write.
Status classify_output(const std::string& path, std::string* resolved, Target* how) {
  if (path.empty()) return Status::invalid_argument("an output path is empty");
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) != 0) {
    if (errno != ENOENT) return Status::io_error("cannot write '" + path + "': " + errno_text(errno));
    *resolved = path;
    *how = Target::kAtomic;
  } else if (S_ISLNK(lst.st_mode)) {
    char buf[PATH_MAX];
    if (::realpath(path.c_str(), buf) == nullptr) {
      if (errno == ENOENT) {
        return Status::invalid_argument("cannot write '" + path + "': a dangling symbolic link");
      }
      return Status::io_error("cannot write '" + path + "': " + errno_text(errno));
    }
    return classify_output(buf, resolved, how);
  } else if (S_ISREG(lst.st_mode)) {
    *resolved = path;
    *how = Target::kAtomic;
  } else if (S_ISCHR(lst.st_mode) || S_ISFIFO(lst.st_mode)) {
    *resolved = path;
    *how = Target::kThrough;
    return {};
  } else {
    return Status::invalid_argument("cannot write '" + path + "': it is " + kind_name(lst.st_mode));
  }
  // Atomic: the directory must exist and be writable.
  std::string dir = std::filesystem::path(*resolved).parent_path().string();
  if (dir.empty()) dir = ".";
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0) {
    return Status::invalid_argument("cannot write '" + path + "': directory '" + dir + "' " +
                                    (errno == ENOENT ? "does not exist" : errno_text(errno)));
  }
  if (!S_ISDIR(dst.st_mode)) {
    return Status::invalid_argument("cannot write '" + path + "': '" + dir + "' is not a directory");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return Status::invalid_argument("cannot write '" + path + "': directory '" + dir + "' is not writable");
  }
  // access() says yes to root everywhere; kernel file systems still refuse new files.
  struct statfs fs {};
  constexpr long kProcMagic = 0x9fa0, kSysfsMagic = 0x62656572;
  if (::statfs(dir.c_str(), &fs) == 0 && (fs.f_type == kProcMagic || fs.f_type == kSysfsMagic)) {
    return Status::invalid_argument("cannot write '" + path + "': directory '" + dir +
                                    "' is on a kernel file system (proc or sysfs)");
  }
  return {};
}

// Writes the temporary file of an atomic target; on success *tmp names it (registered in
// *slot until renamed or removed).
Status write_temp(const std::string& target, const std::string& shown, const std::string& content,
                  std::string* tmp, int* slot) {
  *tmp = temp_file_path(target);
  *slot = register_temp(*tmp);
  const int fd = ::open(tmp->c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    const int e = errno;
    unregister_temp(*slot);
    return Status::io_error("cannot create '" + shown + "': " + errno_text(e));
  }
  Status st = write_all_fd(fd, content, shown);
  if (st.ok() && ::fsync(fd) != 0) st = Status::io_error("cannot write '" + shown + "': " + errno_text(errno));
  if (::close(fd) != 0 && st.ok()) st = Status::io_error("cannot write '" + shown + "': " + errno_text(errno));
  if (!st.ok()) {
    ::unlink(tmp->c_str());
    unregister_temp(*slot);
  }
  return st;
}

Status write_through(const std::string& target, const std::string& shown, const std::string& content) {
  // O_NONBLOCK on open only: a FIFO without a reader fails at once (ENXIO) instead of blocking.
  const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENXIO) return Status::io_error("cannot write '" + shown + "': a FIFO with no reader");
    return Status::io_error("cannot write '" + shown + "': " + errno_text(errno));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  Status st = write_all_fd(fd, content, shown);
  if (::close(fd) != 0 && st.ok()) st = Status::io_error("cannot write '" + shown + "': " + errno_text(errno));
  return st;
}

}  // namespace

Status check_input_file(const std::string& path, uint64_t max_bytes) {
  if (path.empty()) return Status::invalid_argument("an input path is empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status::not_found("cannot open '" + path + "': " + errno_text(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::invalid_argument("cannot read '" + path + "': it is " + kind_name(st.st_mode) +
                                    ", not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Status::invalid_argument("cannot read '" + path + "': " + std::to_string(st.st_size) +
                                    " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  return {};
}

Result<std::string> read_file(const std::string& path, uint64_t max_bytes) {
  DISTCA_RETURN_IF_ERROR(check_input_file(path, max_bytes));
  // O_NONBLOCK: if the path was swapped for a FIFO since the check, open does not block.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Status::not_found("cannot open '" + path + "': " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::invalid_argument("cannot read '" + path + "': not a regular file");
  }
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  for (;;) {
    if (done == out.size()) {
      // Every byte fstat announced is in; one probe byte tells whether the file grew since
      // (read on, still bounded) or ends here, without growing the buffer for nothing.
      char probe;
      ssize_t n;
      do {
        n = ::read(fd, &probe, 1);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) break;
      if (out.size() >= max_bytes) {
        ::close(fd);
        return Status::invalid_argument("cannot read '" + path + "': more than the limit of " +
                                        std::to_string(max_bytes) + " bytes");
      }
      out.resize(std::min<uint64_t>(max_bytes, out.size() + 65536));
      out[done++] = probe;
      continue;
    }
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      return Status::io_error("cannot read '" + path + "': " + errno_text(e));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

Result<nlohmann::json> parse_json_text(const std::string& text, const std::string& name) {
  // nlohmann's lexer takes a NUL byte for the end of the input: "{} \0junk" would parse as {}
  // while "{} junk" is refused. JSON text never holds a raw NUL (not even inside a string).
  if (const size_t nul = text.find('\0'); nul != std::string::npos) {
    return Status::invalid_argument("'" + name + "' is not valid JSON (a NUL byte at byte " + std::to_string(nul) + ")");
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::invalid_argument("'" + name + "' is not valid JSON (byte " + std::to_string(e.byte) + ")");
  } catch (const nlohmann::json::out_of_range&) {
    return Status::invalid_argument("'" + name + "' holds a number out of range (beyond double precision)");
  } catch (const nlohmann::json::exception& e) {
    return Status::invalid_argument("'" + name + "' is not valid JSON (" + std::string(e.what()) + ")");
  }
}

Result<nlohmann::json> read_json_file(const std::string& path, uint64_t max_bytes) {
  DISTCA_ASSIGN_OR_RETURN(std::string text, read_file(path, max_bytes));
  return parse_json_text(text, path);
}

Status check_output_path(const std::string& path) {
  std::string resolved;
  Target how;
  return classify_output(path, &resolved, &how);
}

Status check_output_dir(const std::string& dir, bool create) {
  if (dir.empty()) return Status::invalid_argument("an output directory is empty");
  std::error_code ec;
  if (create && !std::filesystem::exists(dir, ec)) {
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::invalid_argument("cannot create directory '" + dir + "': " + ec.message());
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return Status::invalid_argument("directory '" + dir + "': " + errno_text(errno));
  }
  if (!S_ISDIR(st.st_mode)) return Status::invalid_argument("'" + dir + "' is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return Status::invalid_argument("directory '" + dir + "' is not writable");
  }
  return {};
}

namespace {

// What an output path writes to: a file's device and inode when it exists, else its absolute
// path with the links of its existing part resolved.
struct OutputIdentity {
  bool inode = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string name;
  bool operator==(const OutputIdentity& o) const {
    return inode == o.inode && (inode ? dev == o.dev && ino == o.ino : name == o.name);
  }
};

OutputIdentity output_identity(const NamedOutput& o) {
  OutputIdentity id;
  struct stat st {};
  const bool is_stdout = o.dash_is_stdout && o.path == "-";
  if (is_stdout ? ::fstat(STDOUT_FILENO, &st) == 0 : ::stat(o.path.c_str(), &st) == 0) {
    id.inode = true;
    id.dev = st.st_dev;
    id.ino = st.st_ino;
    return id;
  }
  if (is_stdout) {
    id.name = "\n<standard output>";  // closed: not a path any other output can spell
    return id;
  }
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(o.path, ec);
  const std::filesystem::path canon = ec ? abs : std::filesystem::weakly_canonical(abs, ec);
  id.name = (ec ? std::filesystem::path(o.path) : canon).lexically_normal().string();
  return id;
}

std::string shown_output(const NamedOutput& o) {
  return o.dash_is_stdout && o.path == "-" ? o.flag + " - (standard output)" : o.flag + " '" + o.path + "'";
}

}  // namespace

Status check_distinct_outputs(const std::vector<NamedOutput>& outputs) {
  struct stat null_st {};
  const bool have_null = ::stat("/dev/null", &null_st) == 0;
  std::vector<std::pair<const NamedOutput*, OutputIdentity>> seen;
  for (const NamedOutput& o : outputs) {
    if (o.path.empty()) continue;
    OutputIdentity id = output_identity(o);
    const bool is_stdout = o.dash_is_stdout && o.path == "-";  // "-" twice is refused even into /dev/null
    if (!is_stdout && have_null && id.inode && id.dev == null_st.st_dev && id.ino == null_st.st_ino) continue;
    for (const auto& [other, other_id] : seen) {
      if (other_id == id) {
        return Status::invalid_argument(shown_output(*other) + " and " + shown_output(o) +
                                        " name the same file: one output would replace the other");
      }
    }
    seen.emplace_back(&o, std::move(id));
  }
  return {};
}

namespace {
// Outputs by reference: a checkpoint of hundreds of MB is never copied to be written.
using OutputRefs = std::vector<std::pair<const std::string*, const std::string*>>;
Status write_outputs(const OutputRefs& files);
}  // namespace

Status write_file_atomic(const std::string& path, const std::string& content) {
  return write_outputs({{&path, &content}});
}

Status write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files) {
  OutputRefs refs;
  refs.reserve(files.size());
  for (const auto& f : files) refs.emplace_back(&f.first, &f.second);
  return write_outputs(refs);
}

namespace {
Status write_outputs(const OutputRefs& files) {
  struct Pending {
    std::string shown, target, tmp;
    int slot = -1;
    Target how = Target::kAtomic;
    const std::string* content = nullptr;
  };
  std::vector<Pending> pending(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    pending[i].shown = *files[i].first;
    pending[i].content = files[i].second;
    DISTCA_RETURN_IF_ERROR(classify_output(*files[i].first, &pending[i].target, &pending[i].how));
  }
  auto discard = [&](size_t upto) {
    for (size_t j = 0; j < upto; ++j) {
      if (pending[j].how != Target::kAtomic || pending[j].tmp.empty()) continue;
      ::unlink(pending[j].tmp.c_str());
      unregister_temp(pending[j].slot);
    }
  };
  for (size_t i = 0; i < pending.size(); ++i) {
    Pending& p = pending[i];
    if (p.how != Target::kAtomic) continue;
    Status st = write_temp(p.target, p.shown, *p.content, &p.tmp, &p.slot);
    if (!st.ok()) {
      p.tmp.clear();
      discard(i);
      return st;
    }
  }
  // Write-through targets before any rename: one that fails (a full device, a FIFO without a
  // reader) must leave every regular target unchanged.
  for (const Pending& p : pending) {
    if (p.how != Target::kThrough) continue;
    Status st = write_through(p.target, p.shown, *p.content);
    if (!st.ok()) {
      discard(pending.size());
      return st;
    }
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    Pending& p = pending[i];
    if (p.how != Target::kAtomic) continue;
    if (std::rename(p.tmp.c_str(), p.target.c_str()) != 0) {
      const std::string err = errno_text(errno);
      discard(pending.size());
      return Status::io_error("cannot write '" + p.shown + "': " + err);
    }
    unregister_temp(p.slot);
    p.tmp.clear();
  }
  return {};
}
}  // namespace

Status write_stdout(const std::string& content) {
  std::fflush(stdout);
  if (content.empty()) return {};
  if (std::fwrite(content.data(), 1, content.size(), stdout) != content.size() || std::fflush(stdout) != 0) {
    const int e = errno;
    std::clearerr(stdout);
    return Status::io_error(std::string("cannot write to standard output: ") + errno_text(e));
  }
  return {};
}

void install_temp_file_cleanup() {
  struct sigaction sa {};
  sa.sa_handler = cleanup_and_reraise;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

TempFileGuard::TempFileGuard(const std::string& path) : slot_(register_temp(path)) {}
TempFileGuard::~TempFileGuard() { unregister_temp(slot_); }

std::string temp_file_path(const std::string& path) {
  return path + kTempMarker + host_tag() + "." + std::to_string(::getpid()) + kTempSuffix;
}

bool parse_temp_file_name(const std::string& name, std::string* target, std::string* host, long* pid) {
  const std::string suffix = kTempSuffix;
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  const std::string rest = name.substr(0, name.size() - suffix.size());  // <target>.tmp.<host>.<pid>
  const size_t dot_pid = rest.rfind('.');
  if (dot_pid == std::string::npos) return false;
  const std::string pid_text = rest.substr(dot_pid + 1);
  if (pid_text.empty() || pid_text.size() > 9 || pid_text.find_first_not_of("0123456789") != std::string::npos ||
      (pid_text.size() > 1 && pid_text[0] == '0')) {
    return false;
  }
  const size_t marker = rest.rfind(kTempMarker, dot_pid);
  if (marker == std::string::npos || marker == 0) return false;
  const size_t host_at = marker + std::strlen(kTempMarker);
  if (host_at >= dot_pid) return false;  // "<target>.tmp.<pid>": no host
  const std::string host_text = rest.substr(host_at, dot_pid - host_at);
  if (host_text.empty() || host_text.find('.') != std::string::npos) return false;
  *target = rest.substr(0, marker);
  *host = host_text;
  *pid = std::atol(pid_text.c_str());
  return true;
}

int remove_stale_temp_files(const std::string& dir, const std::function<bool(const std::string&)>& is_own_output) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  const std::string here = host_tag();
  int removed = 0;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    std::string target, host;
    long pid = 0;
    // Only names this program makes, on this host (a pid of another host says nothing here),
    // for an output the caller writes.
    if (!parse_temp_file_name(name, &target, &host, &pid) || host != here || !is_own_output(target)) continue;
    if (pid == ::getpid()) continue;
    if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) continue;  // still alive
    const std::string full = dir + "/" + name;
    struct stat st {};
    if (::lstat(full.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::unlink(full.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

}  // namespace distca
