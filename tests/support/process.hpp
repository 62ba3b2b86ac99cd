// Running programs from tests (the client-program tests, and the two-process soak
// and failure tests): spawn with a chosen environment, capture stdout and
// stderr separately, bound every wait, and kill the whole process group on expiry.
//
//   Env env = Env::inherit().set("SOFTVERBS_DEVICES", "2");
//   ProcessResult r = run({"/usr/bin/ibv_devinfo", "-l"}, env, 10s);
//   EXPECT_EQ(r.exit_code, 0) << r.describe();
//
// Two programs talking to each other:
//
//   Process server({"/usr/bin/ib_write_bw", ...}, env);
//   ASSERT_TRUE(server.wait_for_listen(18515, 10s)) << server.snapshot().describe();
//   ProcessResult client = run({"/usr/bin/ib_write_bw", ..., "127.0.0.1"}, env, 20s);
//   ProcessResult s = server.wait(10s);
//
// or, when both run until they are done with each other, wait_both() below.
//
// Output is read only while a Process method runs; a child blocks once a pipe buffer
// (64 KiB) is full, so keep calling wait*/pump while it works.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

extern char** environ;

namespace softverbs::test {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// argv as one line a POSIX shell reads back as the same words.
inline std::string shell_words(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) {
    if (!s.empty()) s += ' ';
    bool plain = !a.empty() && a.find_first_not_of(
                                   "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   "0123456789-_./=:@,+%") == std::string::npos;
    if (plain) {
      s += a;
      continue;
    }
    s += '\'';
    for (char c : a) s += c == '\'' ? std::string("'\\''") : std::string(1, c);
    s += '\'';
  }
  return s;
}

// An environment for a child process, edited by variable name.
class Env {
 public:
  Env() = default;

  // A copy of this process's environment.
  static Env inherit() {
    Env e;
    for (char** p = environ; p && *p; ++p) {
      std::string_view kv(*p);
      size_t eq = kv.find('=');
      if (eq == std::string_view::npos || eq == 0) continue;
      e.vars_[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
    }
    return e;
  }

  Env& set(const std::string& name, const std::string& value) {
    vars_[name] = value;
    return *this;
  }
  Env& unset(const std::string& name) {
    vars_.erase(name);
    return *this;
  }
  Env& unset_prefix(std::string_view prefix) {
    for (auto it = vars_.begin(); it != vars_.end();) {
      if (it->first.compare(0, prefix.size(), prefix) == 0)
        it = vars_.erase(it);
      else
        ++it;
    }
    return *this;
  }
  std::optional<std::string> get(const std::string& name) const {
    auto it = vars_.find(name);
    if (it == vars_.end()) return std::nullopt;
    return it->second;
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> v;
    v.reserve(vars_.size());
    for (const auto& [k, val] : vars_) v.push_back(k + "=" + val);
    return v;
  }
  // The variables whose name starts with one of the prefixes, as "A=1 B=2", for messages.
  std::string describe(const std::vector<std::string_view>& prefixes) const {
    std::string s;
    for (const auto& [k, val] : vars_) {
      for (std::string_view p : prefixes) {
        if (k.compare(0, p.size(), p) == 0) {
          s += (s.empty() ? "" : " ") + k + "=" + shell_words({val});
          break;
        }
      }
    }
    return s;
  }

 private:
  std::map<std::string, std::string> vars_;
};

struct ProcessResult {
  std::string command;   // the argv, shell-quoted
  bool started = false;  // false: start_error says why
  std::string start_error;
  bool exited = false;  // exited normally: exit_code is valid
  int exit_code = -1;
  int term_signal = 0;     // killed by this signal
  bool timed_out = false;  // the deadline passed and the group was killed
  std::string out, err;
  milliseconds elapsed{0};

  // Normal exit with this code (not killed, not timed out).
  bool exited_with(int code) const { return started && exited && !timed_out && exit_code == code; }

  std::string status() const {
    if (!started) return "did not start: " + start_error;
    std::string s;
    if (exited)
      s = "exit code " + std::to_string(exit_code);
    else if (term_signal)
      s = std::string("killed by signal ") + std::to_string(term_signal) + " (" + ::strsignal(term_signal) + ")";
    else
      s = "still running";
    s += " after " + std::to_string(elapsed.count()) + " ms";
    if (timed_out) s += " (timed out: its process group was killed)";
    return s;
  }

  // The command, how it ended and everything it printed, for assertion messages.
  std::string describe() const {
    std::ostringstream o;
    o << "$ " << command << "\n" << status() << "\n--- stdout (" << out.size() << " bytes) ---\n" << out;
    if (!out.empty() && out.back() != '\n') o << "\n";
    o << "--- stderr (" << err.size() << " bytes) ---\n" << err;
    if (!err.empty() && err.back() != '\n') o << "\n";
    o << "---";
    return o.str();
  }
};

// A running child in its own process group, stdin from /dev/null.
class Process {
 public:
  // shown_env is put before the command in messages, e.g. "SOFTVERBS_DEVICES=2", so
  // that a failure can be reproduced from a shell by copying the line.
  Process(std::vector<std::string> argv, const Env& env, const std::string& shown_env = "") : start_(Clock::now()) {
    result_.command = (shown_env.empty() ? "" : shown_env + " ") + shell_words(argv);
    if (argv.empty()) {
      result_.start_error = "empty command";
      return;
    }
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
      result_.start_error = std::string("pipe2: ") + std::strerror(errno);
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]})
        if (fd >= 0) ::close(fd);
      return;
    }

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);

    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Own process group, so that a timeout kills the program and anything it started.
    posix_spawnattr_setpgroup(&attr, 0);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGALRM}) sigaddset(&defaults, sig);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    std::vector<std::string> env_strings = env.entries();
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    pid_t pid = -1;
    // A bare name is looked up in this process's PATH, not in env's.
    bool has_slash = argv[0].find('/') != std::string::npos;
    int rc = has_slash ? ::posix_spawn(&pid, args[0], &fa, &attr, args.data(), envp.data())
                       : ::posix_spawnp(&pid, args[0], &fa, &attr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    if (rc != 0) {
      result_.start_error = argv[0] + ": " + std::strerror(rc);
      ::close(out_pipe[0]);
      ::close(err_pipe[0]);
      return;
    }
    pid_ = pid;
    out_fd_ = out_pipe[0];
    err_fd_ = err_pipe[0];
    ::fcntl(out_fd_, F_SETFL, ::fcntl(out_fd_, F_GETFL) | O_NONBLOCK);
    ::fcntl(err_fd_, F_SETFL, ::fcntl(err_fd_, F_GETFL) | O_NONBLOCK);
    result_.started = true;
  }

  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  Process(Process&& o) noexcept { *this = std::move(o); }
  Process& operator=(Process&& o) noexcept {
    if (this != &o) {
      cleanup();
      result_ = std::move(o.result_);
      start_ = o.start_;
      pid_ = std::exchange(o.pid_, -1);
      out_fd_ = std::exchange(o.out_fd_, -1);
      err_fd_ = std::exchange(o.err_fd_, -1);
      reaped_ = std::exchange(o.reaped_, true);
    }
    return *this;
  }

  ~Process() { cleanup(); }

  bool started() const { return result_.started; }
  pid_t pid() const { return pid_; }
  const std::string& out() const { return result_.out; }
  const std::string& err() const { return result_.err; }

  // Whether the child has not exited yet (reaps it if it has).
  bool running() {
    reap(false);
    return result_.started && !reaped_;
  }

  // Sends sig to the child's process group.
  void signal(int sig) {
    if (result_.started && !reaped_) ::kill(-pid_, sig);
  }

  // Reads output for up to timeout (less if output arrives or the pipes close).
  void pump(milliseconds timeout) {
    pollfd fds[2];
    int n = 0;
    if (out_fd_ >= 0) fds[n++] = {out_fd_, POLLIN, 0};
    if (err_fd_ >= 0) fds[n++] = {err_fd_, POLLIN, 0};
    if (n == 0) {
      if (timeout.count() > 0) ::poll(nullptr, 0, static_cast<int>(timeout.count()));
      return;
    }
    int rc = ::poll(fds, n, static_cast<int>(timeout.count()));
    if (rc <= 0) return;
    drain(out_fd_, result_.out);
    drain(err_fd_, result_.err);
  }

  // Waits until cond() holds, reading output meanwhile. False if the timeout passes or
  // the child exits first (cond is evaluated once more after the exit).
  bool wait_until(const std::function<bool()>& cond, milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      if (cond()) return true;
      if (!running()) {
        pump(milliseconds(0));
        return cond();
      }
      auto now = Clock::now();
      if (now >= deadline) return false;
      auto left = std::chrono::duration_cast<milliseconds>(deadline - now);
      pump(std::min(left, milliseconds(10)));
    }
  }

  // Waits until stdout or stderr contains text.
  bool wait_for_output(std::string_view text, milliseconds timeout) {
    return wait_until(
        [&] { return result_.out.find(text) != std::string::npos || result_.err.find(text) != std::string::npos; },
        timeout);
  }

  // Waits until the child has a TCP socket listening on port. Works for programs whose
  // "waiting for a connection" banner never arrives in time: stdout to a pipe is block
  // buffered.
  bool wait_for_listen(uint16_t port, milliseconds timeout) {
    return wait_until([&] { return is_listening(pid_, port); }, timeout);
  }

  // Waits for the child to exit and for its output to end; on timeout kills the group.
  ProcessResult wait(milliseconds timeout) {
    if (!result_.started) return result_;
    auto deadline = Clock::now() + timeout;
    while ((out_fd_ >= 0 || err_fd_ >= 0 || !reaped_) && Clock::now() < deadline) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      pump(std::min(left, milliseconds(20)));
      reap(false);
      if (reaped_ && (out_fd_ >= 0 || err_fd_ >= 0)) {
        // Exited: collect what is left; a leftover process of the group holding the
        // pipes open is not waited for beyond a short grace period.
        auto grace = std::min(deadline, Clock::now() + milliseconds(200));
        while ((out_fd_ >= 0 || err_fd_ >= 0) && Clock::now() < grace) pump(milliseconds(10));
        break;
      }
    }
    if (!reaped_) {
      result_.timed_out = true;
      kill_now();
      reap(true);
    }
    pump(milliseconds(0));
    if (out_fd_ >= 0 || err_fd_ >= 0) {
      // Something of the child's group still holds the pipes: it goes too.
      ::kill(-pid_, SIGKILL);
      close_pipes();
    }
    return result_;
  }

  // The state so far (output read up to now), for messages while the child still runs.
  ProcessResult snapshot() {
    pump(milliseconds(0));
    reap(false);
    ProcessResult r = result_;
    r.elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start_);
    return r;
  }

  // Whether process pid has a TCP socket (IPv4 or IPv6) in LISTEN state on port.
  static bool is_listening(pid_t pid, uint16_t port) {
    std::set<unsigned long> inodes;
    for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
      std::ifstream in(table);
      std::string line;
      std::getline(in, line);  // header
      while (std::getline(in, line)) {
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
        std::istringstream f(line);
        std::string sl, local, remote, st, queues, timer, retr, uid, timeout;
        unsigned long inode = 0;
        if (!(f >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
        size_t colon = local.rfind(':');
        if (colon == std::string::npos || st != "0A") continue;
        if (std::stoul(local.substr(colon + 1), nullptr, 16) == port) inodes.insert(inode);
      }
    }
    if (inodes.empty()) return false;
    std::string dir = "/proc/" + std::to_string(pid) + "/fd";
    DIR* d = ::opendir(dir.c_str());
    if (!d) return false;
    bool found = false;
    while (dirent* e = ::readdir(d)) {
      char target[128];
      std::string link = dir + "/" + e->d_name;
      ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      unsigned long inode = 0;
      if (std::sscanf(target, "socket:[%lu]", &inode) == 1 && inodes.count(inode)) {
        found = true;
        break;
      }
    }
    ::closedir(d);
    return found;
  }

 private:
  static void drain(int& fd, std::string& into) {
    if (fd < 0) return;
    char buf[16384];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        into.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        ::close(fd);
        fd = -1;
      }
      return;
    }
  }

  void reap(bool block) {
    if (!result_.started || reaped_) return;
    int st = 0;
    pid_t r;
    do r = ::waitpid(pid_, &st, block ? 0 : WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r != pid_) return;
    reaped_ = true;
    result_.elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start_);
    if (WIFEXITED(st)) {
      result_.exited = true;
      result_.exit_code = WEXITSTATUS(st);
    } else if (WIFSIGNALED(st)) {
      result_.term_signal = WTERMSIG(st);
    }
  }

  void close_pipes() {
    for (int* fd : {&out_fd_, &err_fd_}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
  }

  // SIGKILL to the group, and to the child itself in case it left the group.
  void kill_now() {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
  }

  void cleanup() {
    if (result_.started && !reaped_) {
      kill_now();
      reap(true);
    }
    close_pipes();
  }

  ProcessResult result_;
  Clock::time_point start_;
  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  bool reaped_ = false;
};

// Runs argv to completion (or kills it after timeout) and returns what happened.
inline ProcessResult run(std::vector<std::string> argv, const Env& env, milliseconds timeout,
                         const std::string& shown_env = "") {
  Process p(std::move(argv), env, shown_env);
  return p.wait(timeout);
}

// What two processes that ran side by side did.
struct BothResult {
  ProcessResult a, b;

  std::string describe(const std::string& name_a = "process a", const std::string& name_b = "process b") const {
    return "=== " + name_a + " ===\n" + a.describe() + "\n=== " + name_b + " ===\n" + b.describe();
  }
};

// Reads both processes' output (so that neither blocks on a full pipe) until both
// have exited or one passes its deadline; a process still running then is killed.
// Once one side has failed, the other, which typically waits for it, gets `grace`
// more at the most.
inline BothResult wait_both(Process& a, Clock::time_point deadline_a, Process& b, Clock::time_point deadline_b,
                            milliseconds grace) {
  bool done_a = false, done_b = false;
  while (!(done_a && done_b)) {
    auto now = Clock::now();
    if ((!done_a && now >= deadline_a) || (!done_b && now >= deadline_b)) break;
    a.pump(milliseconds(5));
    b.pump(milliseconds(5));
    if (!done_a && !a.running()) {
      done_a = true;
      if (!a.snapshot().exited_with(0)) deadline_b = std::min(deadline_b, Clock::now() + grace);
    }
    if (!done_b && !b.running()) {
      done_b = true;
      if (!b.snapshot().exited_with(0)) deadline_a = std::min(deadline_a, Clock::now() + grace);
    }
  }
  auto left = [](Clock::time_point deadline) {
    auto now = Clock::now();
    return now >= deadline ? milliseconds(0) : std::chrono::duration_cast<milliseconds>(deadline - now);
  };
  BothResult r;
  r.a = a.wait(left(deadline_a));
  r.b = b.wait(left(deadline_b));
  return r;
}

}  // namespace softverbs::test
