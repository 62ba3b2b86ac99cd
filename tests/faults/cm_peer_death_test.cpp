// A peer process that dies in the middle of connection establishment, through
// the public rdma_cm API: the survivor's connection manager resends its last
// MAD on the CM response timeout and, out of retries, reports
// RDMA_CM_EVENT_UNREACHABLE with -ETIMEDOUT, as against a host that went away.
//
// The peer is this same program started again with --active or --passive (its
// own process, its own emulated device); CM timing is shortened through
// SOFTVERBS_CM_RESPONSE_TIMEOUT and SOFTVERBS_CM_MAX_RETRIES (set by CTest).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <spawn.h>
#include <sys/wait.h>
#include <csignal>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace {

constexpr const char* kSelfAddr = SV_CM_SELF_ADDR;  // outside the automatic range (tests/faults/CMakeLists.txt)
constexpr const char* kPeerAddr = SV_CM_PEER_ADDR;
std::string g_self;

sockaddr_in addr_of(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

// The next event on `ch` within `ms`, or nullptr.
rdma_cm_event* next_event(rdma_event_channel* ch, int ms) {
  pollfd p{ch->fd, POLLIN, 0};
  if (poll(&p, 1, ms) != 1) return nullptr;
  rdma_cm_event* ev = nullptr;
  return rdma_get_cm_event(ch, &ev) == 0 ? ev : nullptr;
}

// Waits for an event of `type` (acknowledging others); returns its status, or
// INT32_MIN when it does not come in time.
int wait_for(rdma_event_channel* ch, rdma_cm_event_type type, int ms, rdma_cm_id** id = nullptr) {
  for (;;) {
    rdma_cm_event* ev = next_event(ch, ms);
    if (!ev) return INT32_MIN;
    rdma_cm_event_type got = ev->event;
    int status = ev->status;
    if (id) *id = ev->id;
    rdma_ack_cm_event(ev);
    if (got == type) return status;
  }
}

// The peer started with `role` and `port`; its stdout is returned in *out_fd.
pid_t spawn_peer(const char* role, uint16_t port, int* out_fd) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  std::string devices = std::string("SOFTVERBS_DEVICES=peer@") + kPeerAddr;
  std::string port_text = std::to_string(port);
  std::vector<char*> env;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "SOFTVERBS_DEVICES=", 18) != 0) env.push_back(*e);
  env.push_back(devices.data());
  env.push_back(nullptr);
  char* argv[] = {g_self.data(), const_cast<char*>(role), port_text.data(), nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, g_self.c_str(), &fa, nullptr, argv, env.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  *out_fd = fds[0];
  return pid;
}

// Reads one line the peer prints ("ready 1234", "sent"), bounded.
std::string read_line(int fd, int ms) {
  std::string line;
  char c;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1 || read(fd, &c, 1) != 1) return line;
    if (c == '\n') return line;
    line += c;
  }
}

// --active PORT: connects to kSelfAddr:PORT and dies as soon as the REQ is out.
int run_active(uint16_t port) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return 2;
  sockaddr_in dst = addr_of(kSelfAddr, port);
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000)) return 3;
  if (wait_for(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 5000) != 0) return 4;
  if (rdma_resolve_route(id, 2000)) return 5;
  if (wait_for(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 5000) != 0) return 6;
  ibv_qp_init_attr qa{};
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, nullptr, &qa)) return 7;
  rdma_conn_param param{};
  if (rdma_connect(id, &param)) return 8;
  std::printf("sent\n");
  std::fflush(stdout);
  _exit(0);  // no DREQ, no REJ: the process is simply gone
}

// --passive PORT: listens on kPeerAddr:PORT, says so, and dies when a request comes.
int run_passive(uint16_t port) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return 2;
  sockaddr_in a = addr_of(kPeerAddr, port);
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)) || rdma_listen(id, 1)) return 3;
  std::printf("ready\n");
  std::fflush(stdout);
  if (wait_for(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 20000) == INT32_MIN) return 4;
  _exit(0);
}

TEST(CmPeerDeath, ActiveDiesAfterItsRequestPassiveAcceptIsUnreachable) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &listen, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in a = addr_of(kSelfAddr, 0);
  ASSERT_EQ(rdma_bind_addr(listen, reinterpret_cast<sockaddr*>(&a)), 0);
  ASSERT_EQ(rdma_listen(listen, 1), 0);
  int out = -1;
  pid_t pid = spawn_peer("--active", ntohs(rdma_get_src_port(listen)), &out);
  ASSERT_GT(pid, 0);
  rdma_cm_id* conn = nullptr;
  ASSERT_EQ(wait_for(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 30000, &conn), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);  // the requester is gone before we answer
  EXPECT_EQ(read_line(out, 1000), "sent");
  close(out);
  ibv_qp_init_attr qa{};
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  ASSERT_EQ(rdma_create_qp(conn, nullptr, &qa), 0);
  rdma_conn_param param{};
  ASSERT_EQ(rdma_accept(conn, &param), 0);
  // The REP is resent SOFTVERBS_CM_MAX_RETRIES times, then the CM gives up.
  EXPECT_EQ(wait_for(ch, RDMA_CM_EVENT_UNREACHABLE, 20000), -ETIMEDOUT);
  rdma_destroy_qp(conn);
  EXPECT_EQ(rdma_destroy_id(conn), 0);
  EXPECT_EQ(rdma_destroy_id(listen), 0);
  rdma_destroy_event_channel(ch);
}

TEST(CmPeerDeath, PassiveDiesOnTheRequestActiveIsUnreachable) {
  // The peer binds a fixed port of its own address; any free one will do.
  const uint16_t port = static_cast<uint16_t>(20000 + getpid() % 20000);
  int out = -1;
  pid_t pid = spawn_peer("--passive", port, &out);
  ASSERT_GT(pid, 0);
  std::string line = read_line(out, 30000);
  if (line != "ready") {
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    FAIL() << "the passive peer did not listen (said '" << line << "', exit status " << st << ")";
  }
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = addr_of(kPeerAddr, port);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  ASSERT_EQ(wait_for(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 5000), 0);
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  ASSERT_EQ(wait_for(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 5000), 0);
  ibv_qp_init_attr qa{};
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  ASSERT_EQ(rdma_create_qp(id, nullptr, &qa), 0);
  rdma_conn_param param{};
  ASSERT_EQ(rdma_connect(id, &param), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);  // it got the request and died without answering
  close(out);
  EXPECT_EQ(wait_for(ch, RDMA_CM_EVENT_UNREACHABLE, 20000), -ETIMEDOUT);
  rdma_destroy_qp(id);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
}

}  // namespace

int main(int argc, char** argv) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  g_self = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv[0]);
  if (argc == 3 && std::strcmp(argv[1], "--active") == 0) return run_active(static_cast<uint16_t>(std::atoi(argv[2])));
  if (argc == 3 && std::strcmp(argv[1], "--passive") == 0)
    return run_passive(static_cast<uint16_t>(std::atoi(argv[2])));
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
