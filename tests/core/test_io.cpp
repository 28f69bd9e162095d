// Every rule of core/io.h, one test each: what each kind of output path gets (atomic replace,
// write-through, followed link, refusal), all-or-none multi-file writes, bounded regular-only
// reads, JSON numbers out of range, and temporary files removed on signals and at the next
// start.
#include "distca/core/io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace distca {
namespace {

namespace fs = std::filesystem;

class IoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("distca_io_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
    fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  int entries() const {
    int n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }
  static std::string contents(const std::string& p) {
    auto r = read_file(p);
    return r.ok() ? *r : "<unreadable: " + r.status().message() + ">";
  }
  static mode_t kind(const std::string& p) {
    struct stat st {};
    return ::lstat(p.c_str(), &st) == 0 ? (st.st_mode & S_IFMT) : 0;
  }
  fs::path dir_;
};

TEST_F(IoTest, AtomicWriteReplacesAndLeavesNoTemporary) {
  const std::string p = path("out.json");
  ASSERT_TRUE(write_file_atomic(p, "first").ok());
  ASSERT_TRUE(write_file_atomic(p, "second").ok());
  EXPECT_EQ(contents(p), "second");
  EXPECT_EQ(entries(), 1);
}

TEST_F(IoTest, WriteIntoMissingDirectoryFailsCleanly) {
  const std::string p = path("no/such/out.json");
  Status s = write_file_atomic(p, "x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(p), std::string::npos);
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(IoTest, CheckOutputPathRefusesMissingDirectoryWithoutWriting) {
  const Status s = check_output_path(path("no/out.json"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not exist"), std::string::npos) << s.message();
  EXPECT_TRUE(check_output_path(path("fine.json")).ok());
  EXPECT_EQ(entries(), 0);  // checking wrote nothing
}

TEST_F(IoTest, DevNullIsWrittenThroughAndStaysADevice) {
  ASSERT_EQ(kind("/dev/null"), S_IFCHR);
  EXPECT_TRUE(check_output_path("/dev/null").ok());
  EXPECT_TRUE(write_file_atomic("/dev/null", "discarded").ok());
  EXPECT_EQ(kind("/dev/null"), S_IFCHR);
  EXPECT_FALSE(fs::exists(temp_file_path("/dev/null")));
}

TEST_F(IoTest, FullDeviceIsAnErrorAndStaysADevice) {
  const Status s = write_file_atomic("/dev/full", "no room");
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("/dev/full"), std::string::npos) << s.message();
  EXPECT_EQ(kind("/dev/full"), S_IFCHR);
}

TEST_F(IoTest, FifoWithReaderReceivesTheBytes) {
  const std::string fifo = path("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // A reader that is already there (non-blocking open needs no writer).
  const int rd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(rd, 0);
  ASSERT_TRUE(write_file_atomic(fifo, "through the pipe").ok());
  char buf[64] = {};
  const ssize_t n = ::read(rd, buf, sizeof buf);
  ::close(rd);
  EXPECT_EQ(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0), "through the pipe");
  EXPECT_EQ(kind(fifo), S_IFIFO);
  EXPECT_EQ(entries(), 1);
}

TEST_F(IoTest, FifoWithoutReaderFailsAtOnce) {
  const std::string fifo = path("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const Status s = write_file_atomic(fifo, "nobody listens");  // would block forever if it waited
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("no reader"), std::string::npos) << s.message();
  EXPECT_EQ(kind(fifo), S_IFIFO);
}

TEST_F(IoTest, SymlinkIsFollowedAndStaysALink) {
  fs::create_directories(dir_ / "real");
  const std::string target = path("real/target.json");
  ASSERT_TRUE(write_file_atomic(target, "old").ok());
  const std::string link = path("link.json");
  fs::create_symlink("real/target.json", link);  // relative to the link's directory
  ASSERT_TRUE(write_file_atomic(link, "new").ok());
  EXPECT_EQ(kind(link), S_IFLNK);
  EXPECT_EQ(contents(target), "new");
  EXPECT_EQ(entries(), 2);  // real/ and the link: no temporary left
  int in_real = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_ / "real")) ++in_real;
  EXPECT_EQ(in_real, 1);
}

TEST_F(IoTest, DanglingSymlinkIsRefused) {
  const std::string link = path("dangling.json");
  fs::create_symlink("missing/target.json", link);
  EXPECT_EQ(check_output_path(link).code(), StatusCode::kInvalidArgument);
  const Status s = write_file_atomic(link, "x");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("dangling"), std::string::npos) << s.message();
  EXPECT_EQ(kind(link), S_IFLNK);
  EXPECT_FALSE(fs::exists(dir_ / "missing"));
}

TEST_F(IoTest, DirectoryIsRefusedAsOutput) {
  fs::create_directories(dir_ / "sub");
  const Status s = check_output_path(path("sub"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a directory"), std::string::npos) << s.message();
  EXPECT_FALSE(write_file_atomic(path("sub"), "x").ok());
  EXPECT_TRUE(fs::is_directory(dir_ / "sub"));
}

// Root passes access() in /proc; the check must still refuse before any work.
TEST_F(IoTest, KernelFileSystemDirectoryIsRefused) {
  if (!fs::exists("/proc/self")) GTEST_SKIP() << "no /proc";
  const Status s = check_output_path("/proc/distca_out.json");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kernel file system"), std::string::npos) << s.message();
}

TEST_F(IoTest, UnwritableDirectoryIsRefused) {
  fs::create_directories(dir_ / "ro");
  fs::permissions(dir_ / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  if (::access((dir_ / "ro").c_str(), W_OK) == 0) GTEST_SKIP() << "running as root: permissions do not bind";
  const Status s = check_output_path(path("ro/out.json"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not writable"), std::string::npos) << s.message();
  EXPECT_FALSE(check_output_dir(path("ro"), false).ok());
}

TEST_F(IoTest, CheckOutputDirCreatesOrRefuses) {
  EXPECT_TRUE(check_output_dir(path("made/here"), true).ok());
  EXPECT_TRUE(fs::is_directory(dir_ / "made/here"));
  EXPECT_FALSE(check_output_dir(path("absent"), false).ok());
  ASSERT_TRUE(write_file_atomic(path("file"), "x").ok());
  EXPECT_FALSE(check_output_dir(path("file"), false).ok());
}

TEST_F(IoTest, MultiFileWriteIsAllOrNoneWhenATemporaryCannotBeCreated) {
  const std::string a = path("a.json"), b = path("b.json");
  ASSERT_TRUE(write_file_atomic(a, "old a").ok());
  // b's temporary file name is taken by a directory: its creation fails after a's succeeded.
  fs::create_directories(temp_file_path(b));
  const Status s = write_files_atomic({{a, "new a"}, {b, "new b"}});
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(contents(a), "old a");
  EXPECT_FALSE(fs::exists(b));
  EXPECT_FALSE(fs::exists(temp_file_path(a)));
}

TEST_F(IoTest, MultiFileWriteIsAllOrNoneWhenADeviceFails) {
  const std::string a = path("a.json");
  ASSERT_TRUE(write_file_atomic(a, "old a").ok());
  const Status s = write_files_atomic({{a, "new a"}, {"/dev/full", "no room"}});
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(contents(a), "old a");  // the device failed before any rename
  EXPECT_EQ(entries(), 1);
}

TEST_F(IoTest, MultiFileWriteWritesEverything) {
  ASSERT_TRUE(write_files_atomic({{path("a"), "1"}, {path("b"), "2"}, {"/dev/null", "3"}}).ok());
  EXPECT_EQ(contents(path("a")), "1");
  EXPECT_EQ(contents(path("b")), "2");
  EXPECT_EQ(entries(), 2);
}

TEST_F(IoTest, ReadRefusesFifoWithoutBlocking) {
  const std::string fifo = path("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(check_input_file(fifo).code(), StatusCode::kInvalidArgument);
  auto r = read_file(fifo);  // a FIFO without a writer would block a plain open()
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("a FIFO"), std::string::npos) << r.status().message();
}

TEST_F(IoTest, ReadRefusesDirectoryAndDevices) {
  auto d = read_json_file(dir_.string());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("a directory"), std::string::npos) << d.status().message();
  EXPECT_EQ(d.status().message().find("JSON"), std::string::npos) << d.status().message();
  auto z = read_file("/dev/zero");  // would be read without end
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("character device"), std::string::npos) << z.status().message();
}

TEST_F(IoTest, ReadIsBounded) {
  const std::string p = path("big");
  ASSERT_TRUE(write_file_atomic(p, std::string(100, 'x')).ok());
  EXPECT_TRUE(read_file(p, 100).ok());
  auto r = read_file(p, 99);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("100 bytes"), std::string::npos) << r.status().message();
  EXPECT_FALSE(check_input_file(p, 99).ok());
}

TEST_F(IoTest, ReadFollowsSymlinkToRegularFile) {
  const std::string p = path("real");
  ASSERT_TRUE(write_file_atomic(p, "data").ok());
  fs::create_symlink(p, dir_ / "link");
  EXPECT_EQ(contents(path("link")), "data");
  fs::create_symlink("/dev/zero", dir_ / "zero");
  EXPECT_FALSE(read_file(path("zero")).ok());
}

TEST_F(IoTest, ReadJsonErrorsNameTheFile) {
  const std::string missing = path("missing.json");
  auto r = read_json_file(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos);

  const std::string bad = path("bad.json");
  ASSERT_TRUE(write_file_atomic(bad, "{\"a\": [1, 2,").ok());
  auto b = read_json_file(bad);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(bad), std::string::npos);

  const std::string good = path("good.json");
  ASSERT_TRUE(write_file_atomic(good, "{\"a\": [1, 2]}").ok());
  auto g = read_json_file(good);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)["a"][1], 2);
}

TEST_F(IoTest, JsonNumberBeyondDoubleIsOneLineError) {
  for (const std::string text : {"{\"a\": 1e999}", "[-1e999]", "{\"x\": {\"y\": [1, 2e400]}}"}) {
    auto r = parse_json_text(text, "input.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("input.json"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("out of range"), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << r.status().message();
  }
  const std::string p = path("huge.json");
  ASSERT_TRUE(write_file_atomic(p, "{\"len\": 1e999}").ok());
  EXPECT_FALSE(read_json_file(p).ok());
}

// nlohmann's lexer ends the input at a NUL byte: JSON followed by NUL and junk must be refused
// like JSON followed by a space and junk, and a NUL inside a value too.
TEST_F(IoTest, JsonWithANulByteIsRefusedNamingItsOffset) {
  for (const std::string& text : {std::string("{}\0junk", 7), std::string("{\"a\": 1}\0", 9),
                                  std::string("{\"a\": \"x\0y\"}", 13)}) {
    auto r = parse_json_text(text, "input.json");
    ASSERT_FALSE(r.ok()) << text.size();
    EXPECT_EQ(r.status().message(), "'input.json' is not valid JSON (a NUL byte at byte " +
                                        std::to_string(text.find('\0')) + ")");
  }
  EXPECT_FALSE(parse_json_text("{} junk", "input.json").ok());
  const std::string p = path("nul.json");
  ASSERT_TRUE(write_file_atomic(p, std::string("[1]\0[2]", 7)).ok());
  EXPECT_FALSE(read_json_file(p).ok());
}

TEST_F(IoTest, OutputsNamingOneFileAreRefused) {
  const std::string a = path("a.json");
  // Not existing yet: the same absolute path, however it is spelt.
  const std::string spelt = (dir_ / "sub" / ".." / "a.json").string();
  fs::create_directories(dir_ / "sub");
  Status st = check_distinct_outputs({{"--json", a}, {"--trace", spelt}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "--json '" + a + "' and --trace '" + spelt + "' name the same file: one output would replace the other");
  EXPECT_TRUE(check_distinct_outputs({{"--json", a}, {"--trace", path("b.json")}, {"--metrics", ""}}).ok());
  // Existing: links (symbolic and hard) to it.
  ASSERT_TRUE(write_file_atomic(a, "x").ok());
  fs::create_symlink(a, dir_ / "sym.json");
  fs::create_hard_link(a, dir_ / "hard.json");
  EXPECT_FALSE(check_distinct_outputs({{"--json", a}, {"--trace", path("sym.json")}}).ok());
  EXPECT_FALSE(check_distinct_outputs({{"--json", path("hard.json")}, {"--trace", path("sym.json")}}).ok());
  // "-" is standard output only where the flag says so; twice is refused.
  EXPECT_FALSE(check_distinct_outputs({{"--json", "-", true}, {"--out", "-", true}}).ok());
  EXPECT_TRUE(check_distinct_outputs({{"--json", "-", true}, {"--trace", "-"}}).ok());
  // A directory output counts like a file; /dev/null takes any number.
  EXPECT_FALSE(check_distinct_outputs({{"--metrics", dir_.string()}, {"--checkpoint-dir", (dir_ / ".").string()}}).ok());
  EXPECT_TRUE(check_distinct_outputs({{"--json", "/dev/null"}, {"--trace", "/dev/null"}}).ok());
}

TEST_F(IoTest, StdoutWriteFailureIsAnError) {
  // A child whose stdout is /dev/full: write_stdout must report it.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open("/dev/full", O_WRONLY);
    if (fd < 0 || ::dup2(fd, STDOUT_FILENO) < 0) ::_exit(3);
    const Status s = write_stdout("cannot land\n");
    ::_exit(s.ok() ? 0 : (s.code() == StatusCode::kIoError ? 1 : 2));
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1);
}

// The child registers `file` with a TempFileGuard (or not, after the guard is gone) and raises
// SIGTERM; returns the child's wait status.
int die_by_sigterm(const std::string& file, bool guarded) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    install_temp_file_cleanup();
    if (!write_file_atomic(file, "partial").ok()) ::_exit(3);
    if (guarded) {
      TempFileGuard guard(file);
      ::raise(SIGTERM);
    } else {
      { TempFileGuard gone(file); }
      ::raise(SIGTERM);
    }
    ::_exit(4);  // not reached: SIGTERM's default action ends the process
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return st;
}

TEST_F(IoTest, SigtermRemovesRegisteredTemporaryFiles) {
  const std::string tmp = path("ckpt.tmp.123");
  const int st = die_by_sigterm(tmp, true);
  ASSERT_TRUE(WIFSIGNALED(st)) << st;
  EXPECT_EQ(WTERMSIG(st), SIGTERM);  // re-raised: the exit status still says SIGTERM
  EXPECT_FALSE(fs::exists(tmp));
}

TEST_F(IoTest, SigtermLeavesUnregisteredFiles) {
  const std::string kept = path("kept.json");
  const int st = die_by_sigterm(kept, false);
  ASSERT_TRUE(WIFSIGNALED(st)) << st;
  EXPECT_TRUE(fs::exists(kept));  // a destroyed guard no longer covers the file
}

pid_t dead_pid() {
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);  // reaped: the pid names no process now
  return dead;
}

// A temporary file name as write_file_atomic makes it, with another pid or host.
std::string temp_name_with(const std::string& target, const std::string& host, long pid) {
  std::string t, h;
  long p = 0;
  EXPECT_TRUE(parse_temp_file_name(temp_file_path(target), &t, &h, &p));
  return target + ".tmp." + (host.empty() ? h : host) + "." + std::to_string(pid) + ".distca";
}

TEST_F(IoTest, TemporaryFileNamesSplitBackAndNothingElseDoes) {
  std::string target, host;
  long pid = 0;
  ASSERT_TRUE(parse_temp_file_name(fs::path(temp_file_path("step-00000001.ckpt")).filename().string(), &target,
                                   &host, &pid));
  EXPECT_EQ(target, "step-00000001.ckpt");
  EXPECT_EQ(pid, ::getpid());
  EXPECT_FALSE(host.empty());
  for (const char* other : {"step-important-notes.tmp.999999", "step-1.ckpt.tmp.123", "x.tmp.host.12.distca.bak",
                            "x.tmp.host.012.distca", "x.tmp.host.1x.distca", ".tmp.host.1.distca", "x.tmp..1.distca",
                            "x.tmp.a.b.1.distca", "a.tmp.1.distca"}) {
    EXPECT_FALSE(parse_temp_file_name(other, &target, &host, &pid)) << other;
  }
}

// Only this program's temporary files, of this host, of dead processes, for the caller's own
// outputs are removed: a user's "step-important-notes.tmp.999999" and a live writer's file
// on another host that shares the directory stay.
TEST_F(IoTest, StaleTemporaryFilesOfDeadProcessesAreRemoved) {
  const pid_t dead = dead_pid();
  ASSERT_GT(dead, 0);
  const long live = ::getppid();
  const std::string stale = path(temp_name_with("step-1.ckpt", "", dead));
  const std::string kept_live = path(temp_name_with("step-2.ckpt", "", live));
  const std::string kept_not_ours = path(temp_name_with("other", "", dead));
  const std::string kept_other_host = path(temp_name_with("step-3.ckpt", "another-host", dead));
  const std::string kept_user = path("step-important-notes.tmp.999999");
  const std::string kept_old_shape = path("step-4.ckpt.tmp." + std::to_string(dead));
  for (const auto& p : {stale, kept_live, kept_not_ours, kept_other_host, kept_user, kept_old_shape}) {
    std::ofstream(p) << "x";
  }
  const auto ours = [](const std::string& target) { return target.rfind("step-", 0) == 0; };
  EXPECT_EQ(remove_stale_temp_files(dir_.string(), ours), 1);
  EXPECT_FALSE(fs::exists(stale));
  for (const auto& p : {kept_live, kept_not_ours, kept_other_host, kept_user, kept_old_shape}) {
    EXPECT_TRUE(fs::exists(p)) << p;
  }
  EXPECT_EQ(remove_stale_temp_files(dir_.string(), [](const std::string&) { return true; }), 1);
  EXPECT_FALSE(fs::exists(kept_not_ours));
  EXPECT_TRUE(fs::exists(kept_user));
}

}  // namespace
}  // namespace distca
