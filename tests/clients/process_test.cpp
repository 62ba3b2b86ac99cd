// The process runner the client tests are built on.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace softverbs::test {
namespace {

constexpr const char* kSh = "/bin/sh";

TEST(Process, CapturesStdoutAndStderrSeparately) {
  ProcessResult r = run({kSh, "-c", "echo to-out; echo to-err >&2; exit 3"}, Env::inherit(), milliseconds(10000));
  EXPECT_TRUE(r.exited_with(3)) << r.describe();
  EXPECT_EQ(r.out, "to-out\n");
  EXPECT_EQ(r.err, "to-err\n");
  EXPECT_FALSE(r.timed_out);
}

TEST(Process, PassesTheGivenEnvironmentOnly) {
  Env env = Env::inherit().set("SV_PROCESS_TEST", "a b").unset("HOME");
  ProcessResult r = run({kSh, "-c", "printf '%s|%s' \"$SV_PROCESS_TEST\" \"${HOME-unset}\""}, env, milliseconds(10000));
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out, "a b|unset");
}

TEST(Process, StdinIsEmpty) {
  ProcessResult r = run({"cat"}, Env::inherit(), milliseconds(10000));
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out, "");
}

TEST(Process, TimeoutKillsTheWholeGroup) {
  // The shell's child keeps the pipes open; both must be gone after the timeout.
  auto t0 = Clock::now();
  ProcessResult r = run({kSh, "-c", "sleep 30 & sleep 30; echo never"}, Env::inherit(), milliseconds(300));
  auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
  EXPECT_TRUE(r.timed_out) << r.describe();
  EXPECT_EQ(r.term_signal, SIGKILL) << r.describe();
  EXPECT_FALSE(r.exited_with(0));
  EXPECT_LT(took.count(), 5000) << r.describe();
}

TEST(Process, MissingProgramDoesNotStart) {
  ProcessResult r = run({"/nonexistent/program"}, Env::inherit(), milliseconds(1000));
  EXPECT_FALSE(r.started);
  EXPECT_NE(r.start_error.find("/nonexistent/program"), std::string::npos) << r.start_error;
  EXPECT_NE(r.describe().find("did not start"), std::string::npos);
}

TEST(Process, WaitsForOutputWhileRunning) {
  Process p({kSh, "-c", "echo ready; sleep 30"}, Env::inherit());
  ASSERT_TRUE(p.started());
  EXPECT_TRUE(p.wait_for_output("ready", milliseconds(10000))) << p.snapshot().describe();
  EXPECT_TRUE(p.running());
  p.signal(SIGTERM);
  ProcessResult r = p.wait(milliseconds(10000));
  EXPECT_EQ(r.term_signal, SIGTERM) << r.describe();
  EXPECT_FALSE(r.timed_out);
}

TEST(Process, WaitForOutputGivesUpWhenTheProgramExits) {
  Process p({kSh, "-c", "echo other"}, Env::inherit());
  EXPECT_FALSE(p.wait_for_output("ready", milliseconds(10000)));
  ProcessResult r = p.wait(milliseconds(10000));
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out, "other\n");
}

TEST(Process, WaitsForAListeningSocket) {
  // A port nobody listens on: bind to port 0, read it back, release it; then let the
  // child listen on it. python3 is the portable way to listen from a shell here.
  ASSERT_EQ(::access("/usr/bin/python3", X_OK), 0) << "install the Debian package python3";
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  socklen_t len = sizeof sa;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  uint16_t port = ntohs(sa.sin_port);
  ::close(fd);
  EXPECT_FALSE(Process::is_listening(::getpid(), port));

  std::string script =
      "import socket, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, "
      "socket.SO_REUSEADDR, 1)\ns.bind(('127.0.0.1', " +
      std::to_string(port) + "))\ntime.sleep(0.2)\ns.listen()\ntime.sleep(30)\n";
  Process p({"/usr/bin/python3", "-c", script}, Env::inherit().unset("PYTHONPATH").unset("PYTHONHOME"));
  ASSERT_TRUE(p.started()) << p.snapshot().describe();
  EXPECT_TRUE(p.wait_for_listen(port, milliseconds(10000))) << p.snapshot().describe();
  EXPECT_TRUE(Process::is_listening(p.pid(), port));
  EXPECT_FALSE(Process::is_listening(::getpid(), port));
}

}  // namespace
}  // namespace softverbs::test
