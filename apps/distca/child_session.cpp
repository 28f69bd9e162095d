// A child program in a session of its own, ended with its caller (child_session.h).
#include "child_session.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "distca/core/clock.h"

extern char** environ;

namespace distca::cli {
namespace {

void sleep_ms(long ms) {
  struct timespec t {0, ms * 1000000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

// The session id and state of process `pid` from /proc/<pid>/stat (fields 3 and 6; the command
// name in parentheses may hold spaces, so parsing starts after its last ')'). False when the
// process is gone or the file unreadable.
bool read_stat(const char* pid, int* session, char* state) {
  char path[64] = "/proc/";
  size_t n = 6;
  for (const char* c = pid; *c != '\0' && n < sizeof(path) - 6; ++c) path[n++] = *c;
  std::memcpy(path + n, "/stat", 6);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];
  const ssize_t got = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (got <= 0) return false;
  buf[got] = '\0';
  const char* p = nullptr;
  for (ssize_t i = got - 1; i >= 0; --i) {
    if (buf[i] == ')') {
      p = buf + i + 1;
      break;
    }
  }
  if (p == nullptr) return false;
  // " S ppid pgrp session ..."
  long fields[3] = {0, 0, 0};
  while (*p == ' ') ++p;
  *state = *p++;
  for (long& f : fields) {
    while (*p == ' ') ++p;
    if (*p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9') f = f * 10 + (*p++ - '0');
  }
  *session = static_cast<int>(fields[2]);
  return true;
}

// Sends `sig` (0: none) to every process of session `sid` that is not a zombie; how many there
// were. Raw getdents64 on /proc: no allocation, safe between fork and exit.
int signal_session(int sid, int sig) {
  const int dir = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return 0;
  struct Dirent64 {
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[1];
  };
  alignas(8) char buf[8192];
  int count = 0;
  for (;;) {
    const long n = syscall(SYS_getdents64, dir, buf, sizeof(buf));
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      const auto* e = reinterpret_cast<const Dirent64*>(buf + off);
      off += e->reclen;
      if (e->name[0] < '1' || e->name[0] > '9') continue;
      int session = 0;
      char state = 0;
      if (!read_stat(e->name, &session, &state) || session != sid || state == 'Z') continue;
      long pid = 0;
      for (const char* c = e->name; *c >= '0' && *c <= '9'; ++c) pid = pid * 10 + (*c - '0');
      ++count;
      if (sig != 0) kill(static_cast<pid_t>(pid), sig);
    }
  }
  close(dir);
  return count;
}

// The watchdog's life (child_session.h): wait for the child's pid, then for the caller's
// "released" byte or end of file; on end of file end the child's session and remove its log.
[[noreturn]] void watchdog(int sock, const char* log) {
  setsid();  // out of the caller's process group: a ^C meant for the caller does not reach it
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0) {
    for (int fd = 0; fd < 3; ++fd) dup2(null_fd, fd);
  }
  // Messages: the child's 'P' and its pid (before exec), the caller's 'R' (released).
  unsigned char msg[64];
  size_t have = 0;
  int32_t pid = 0;
  bool released = false;
  for (;;) {
    const ssize_t n = read(sock, msg + have, sizeof(msg) - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<size_t>(n);
    size_t used = 0;
    while (used < have) {
      if (msg[used] == 'R') {
        released = true;
        ++used;
      } else if (msg[used] == 'P' && have - used >= 1 + sizeof(pid)) {
        std::memcpy(&pid, msg + used + 1, sizeof(pid));
        used += 1 + sizeof(pid);
      } else if (msg[used] == 'P') {
        break;  // the rest of the pid is still on its way
      } else {
        ++used;  // not a message of this protocol
      }
    }
    std::memmove(msg, msg + used, have - used);
    have -= used;
    if (released) break;
  }
  if (!released) {
    if (pid > 0) end_session(pid, 5.0);
    unlink(log);
  }
  _exit(0);
}

// The child between fork and exec: its own session, killed with its parent, its pid to the
// watchdog, the standard streams, default signals; only async-signal-safe calls.
[[noreturn]] void exec_child(pid_t parent, int sock, int null_fd, int log_fd, const char* path, char* const* argv,
                             char* const* envp, const char* exec_failed) {
  setsid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the caller died before the line above
  const int32_t me = static_cast<int32_t>(getpid());
  unsigned char msg[1 + sizeof(me)] = {'P'};
  std::memcpy(msg + 1, &me, sizeof(me));
  if (send(sock, msg, sizeof(msg), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(msg))) _exit(127);
  dup2(null_fd, 0);
  dup2(log_fd, 1);
  dup2(log_fd, 2);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGHUP}) sigaction(s, &dfl, nullptr);
  execve(path, argv, envp);
  const ssize_t ignored = write(2, exec_failed, std::strlen(exec_failed));
  (void)ignored;
  _exit(127);
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

void end_session(int sid, double grace_s) {
  if (signal_session(sid, SIGTERM) == 0) return;
  for (double waited = 0; waited < grace_s; waited += 0.05) {
    sleep_ms(50);
    if (signal_session(sid, 0) == 0) return;
  }
  // Repeated: a process forked while the list was read is caught by the next pass.
  for (int pass = 0; pass < 20 && signal_session(sid, SIGKILL) > 0; ++pass) sleep_ms(50);
}

Result<ChildEnd> run_in_session(const std::vector<std::string>& argv, const std::string& log, double timeout_s,
                                const volatile int* stop) {
  // Everything the two forks use is made first: no allocation after fork.
  std::vector<std::string> env_s;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::string(*e).rfind("OMP_NUM_THREADS=", 0) != 0) env_s.emplace_back(*e);
  }
  env_s.emplace_back("OMP_NUM_THREADS=1");
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : env_s) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string exec_failed = "distca: error: cannot execute " + argv[0] + "\n";
  Fd null_fd{open("/dev/null", O_RDWR | O_CLOEXEC)};
  Fd log_fd{open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (null_fd.fd < 0 || log_fd.fd < 0) return Status::io_error("cannot open " + log + ": " + std::strerror(errno));
  int socks[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, socks) != 0) {
    unlink(log.c_str());
    return Status::internal(std::string("cannot make the watchdog's socket: ") + std::strerror(errno));
  }
  Fd ours{socks[0]}, theirs{socks[1]};
  const pid_t self = getpid();
  const pid_t dog = fork();
  if (dog == 0) {
    close(ours.fd);
    watchdog(theirs.fd, log.c_str());
  }
  close(theirs.fd);
  theirs.fd = -1;
  if (dog < 0) {
    unlink(log.c_str());
    return Status::internal(std::string("cannot start the watchdog: ") + std::strerror(errno));
  }
  const pid_t pid = fork();
  if (pid == 0) exec_child(self, ours.fd, null_fd.fd, log_fd.fd, args[0], args.data(), envp.data(), exec_failed.c_str());
  auto release = [&] {
    const unsigned char done = 'R';
    [[maybe_unused]] const ssize_t sent = send(ours.fd, &done, 1, MSG_NOSIGNAL);  // fails only if it is gone
    close(ours.fd);
    ours.fd = -1;
    while (waitpid(dog, nullptr, 0) < 0 && errno == EINTR) {
    }
  };
  if (pid < 0) {
    const int err = errno;
    release();
    unlink(log.c_str());
    return Status::internal("cannot start " + argv[0] + ": " + std::strerror(err));
  }
  ChildEnd c;
  const double start = monotonic_seconds();
  auto elapsed = [&] { return monotonic_seconds() - start; };
  bool ended = false;
  int wait_errno = 0;
  for (;;) {
    const pid_t w = waitpid(pid, &c.status, WNOHANG);
    if (w == pid) {
      ended = true;
      break;
    }
    if (w < 0 && errno != EINTR) {
      wait_errno = errno;
      break;
    }
    if (elapsed() > timeout_s || *stop != 0) break;
    sleep_ms(50);
  }
  if (wait_errno != 0) {
    end_session(pid, 5.0);
    release();
    return Status::internal("waiting for " + argv[0] + ": " + std::strerror(wait_errno));
  }
  if (!ended) {
    c.interrupted = *stop != 0;
    c.timed_out = !c.interrupted;
    end_session(pid, 5.0);
    while (waitpid(pid, &c.status, 0) < 0 && errno == EINTR) {
    }
  }
  end_session(pid, 0.0);  // whatever of the session outlived its leader
  release();
  return c;
}

}  // namespace distca::cli
