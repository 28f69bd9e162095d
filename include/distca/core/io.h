// File helpers with the guarantees the CLI promises (docs/development.md, "Input and output").
//
// Inputs. Only regular files are read. A directory, FIFO, socket or device given as an input
// is refused with one line before anything is read (a FIFO without a writer would block
// forever; /dev/zero would be read without end). Every read is bounded: a file larger than
// `max_bytes` is refused, naming its size.
//
// Outputs. What a path names decides how it is written:
//   * nothing yet, or a regular file: atomically. The content goes to a temporary file
//     (temp_file_path: "<path>.tmp.<host>.<pid>.distca") in the same directory, is flushed
//     and fsync'ed, then renamed over the target, so a reader never sees a half-written
//     output and a failed run leaves no partial file behind. The temporary file is
//     registered for removal on SIGINT/SIGTERM (install_temp_file_cleanup) while it exists.
//   * a character device (/dev/null, a terminal) or a FIFO: written through, every byte
//     checked (a full device is an error). The node itself is never replaced.
//   * a symbolic link: followed; what it points to is written by the rules above (the link
//     stays a link). A dangling link is refused.
//   * anything else (a directory, a socket, a block device): refused.
// A write that cannot complete is an error naming the path; nothing is left half-written.
//
// Thread safety: the functions may be called from several threads on distinct paths. The
// temporary-file registry is lock-free and async-signal-safe to read.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/status.h"

namespace distca {

// Upper bound on what one input file may hold unless a caller asks for another (1 GiB).
inline constexpr uint64_t kMaxInputFileBytes = uint64_t{1} << 30;

// Refuses what read_file would refuse (missing, not regular, larger than max_bytes) without
// reading: for checking every input path before any work starts.
[[nodiscard]] Status check_input_file(const std::string& path, uint64_t max_bytes = kMaxInputFileBytes);
[[nodiscard]] Result<std::string> read_file(const std::string& path, uint64_t max_bytes = kMaxInputFileBytes);

// Parses a whole file as JSON. A syntax error names the file and the byte offset; a number out
// of double range (1e999) or any other parser exception is a one-line error naming the file.
[[nodiscard]] Result<nlohmann::json> read_json_file(const std::string& path,
                                                    uint64_t max_bytes = kMaxInputFileBytes);
// The same for text already in memory; `name` is what errors call it.
[[nodiscard]] Result<nlohmann::json> parse_json_text(const std::string& text, const std::string& name);

// Checks, before any work, that `path` can be written by write_file_atomic: its directory
// exists and is writable, and the path is not a directory, socket, block device or dangling
// link. Writes nothing.
[[nodiscard]] Status check_output_path(const std::string& path);
// Checks that `dir` exists (or can be created, when `create` is true: then it is created,
// parents included) and is a writable directory.
[[nodiscard]] Status check_output_dir(const std::string& dir, bool create);

// One output of a command, for check_distinct_outputs.
struct NamedOutput {
  std::string flag;             // what messages call it: "--json"
  std::string path;             // empty: not given (skipped)
  bool dash_is_stdout = false;  // "-" means standard output (else a file named "-")
};
// Refuses, before any work, two outputs of one command that would land in the same file, so
// that neither silently replaces the other: the same path, two spellings of it ("./x" and "x",
// "d/../x"), a symbolic or hard link to it, "-" twice, or "-" and the file standard output is
// redirected to. Files compare by device and inode when they exist, by their absolute path
// with links resolved when not. /dev/null may take any number of outputs. The message names
// both flags: "--json 'y.json' and --trace 'y.json' name the same file".
[[nodiscard]] Status check_distinct_outputs(const std::vector<NamedOutput>& outputs);

// Writes `content` to `path` by the rules above.
[[nodiscard]] Status write_file_atomic(const std::string& path, const std::string& content);
// Writes several outputs all or none: every regular target is first written to its temporary
// file, then the write-through targets (devices, FIFOs) are written; only when all of that
// succeeded are the temporary files renamed into place. On any failure every temporary file is
// removed and no regular target changed (a device already written to cannot be taken back).
[[nodiscard]] Status write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files);

// Writes `content` to standard output and flushes it; a failed or short write (closed stdout,
// /dev/full) is an io_error.
[[nodiscard]] Status write_stdout(const std::string& content);

// Installs SIGINT/SIGTERM/SIGHUP handlers that remove every registered temporary file and then
// re-raise the signal with its default action (so the exit status still says "killed by
// SIGINT"). Call once, from the CLI's main thread, before any work.
void install_temp_file_cleanup();

// Registers a temporary file for removal on a signal while the guard lives; the guard's
// destructor unregisters it (it does not remove the file). For writers that stream large files
// themselves. At most 64 registrations at once; more are silently not covered.
class TempFileGuard {
 public:
  explicit TempFileGuard(const std::string& path);
  ~TempFileGuard();
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;

 private:
  int slot_ = -1;
};

// The temporary file write_file_atomic writes `path` through: "<path>.tmp.<host>.<pid>.distca",
// with this host's name (letters, digits and '-'; any other byte '_') and this process's pid,
// so that no other program's file, and no file of this program on another host sharing the
// directory, has a name of the same shape with this host and a pid of this host's.
std::string temp_file_path(const std::string& path);
// Splits a file name made by temp_file_path back into the target's name, the host tag and the
// pid; false for any other name (a user's "notes.tmp.999999" included).
bool parse_temp_file_name(const std::string& name, std::string* target, std::string* host, long* pid);

// Removes the temporary files of `dir` that a process of this program on this host left when it
// was killed with SIGKILL: names made by temp_file_path with this host's tag, a pid that names
// no live process, and a target name for which `is_own_output` is true (the caller's own
// outputs, e.g. its checkpoint names). Everything else is kept. Returns how many were removed;
// errors are ignored (best effort).
int remove_stale_temp_files(const std::string& dir, const std::function<bool(const std::string&)>& is_own_output);

}  // namespace distca
