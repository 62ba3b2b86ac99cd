// What the roles of soak_peer (peer.cpp) share: failure reporting and
// arguments, the control socket between the two processes (bounded reads and
// whole frames), deterministic contents, the handshake (Hello) and one endpoint:
// a device, a PD, a completion channel, a send and a receive CQ and an RC QP,
// brought up and connected with the test kit (tests/support/).
#pragma once

#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/support/connect.hpp"
#include "tests/support/names.hpp"
#include "tests/support/verbs.hpp"

namespace soak_peer {

using Clock = std::chrono::steady_clock;
using softverbs::testkit::qp_state_name;
using std::chrono::milliseconds;

// ---------------------------------------------------------------------------
// Failure reporting and arguments

// Prints "FAIL: ..." on stderr and exits with status 1.
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

#define CHECK(cond, ...)                         \
  do {                                           \
    if (!(cond)) ::soak_peer::fail(__VA_ARGS__); \
  } while (0)

// Takes --name=value arguments (a bare --name is "1").
void parse_args(int argc, char** argv);
std::string arg(const std::string& name, const std::string& def = "");
uint64_t arg_u64(const std::string& name, uint64_t def);
double arg_double(const std::string& name, double def);

double ms_since(Clock::time_point t);

// ---------------------------------------------------------------------------
// The control socket: bounded reads and writes of whole messages

void write_all(int fd, const void* p, size_t n);
// Reads exactly n bytes before the deadline. False on end of file (the peer is gone);
// fails on timeout.
bool read_all(int fd, void* p, size_t n, Clock::time_point deadline, const char* what);

// ---------------------------------------------------------------------------
// Deterministic contents

uint64_t mix(uint64_t x);  // splitmix64's finalizer
// n bytes that are a function of key only.
void fill(uint8_t* p, size_t n, uint64_t key);
// The first byte where p differs from fill(key), or n.
size_t first_difference(const uint8_t* p, size_t n, uint64_t key, std::vector<uint8_t>& scratch);

// ---------------------------------------------------------------------------
// What the two sides tell each other

struct Hello {
  uint32_t magic = 0x53764b31;  // "SvK1"
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint32_t side = 0;
  uint8_t gid[16] = {};
  uint64_t ops = 0;  // operations this side will post
  uint64_t write_addr = 0, write_imm_addr = 0, read_addr = 0, atomic_addr = 0;
  uint32_t write_rkey = 0, write_imm_rkey = 0, read_rkey = 0, atomic_rkey = 0;
  uint64_t counter_init = 0, cas_init = 0;  // initial values of the atomic words
};

// The first device of this process with one RC QP. Owners destroy what close()
// or the end of the process does not.
struct Endpoint {
  softverbs::testkit::DeviceList list;
  softverbs::testkit::Context ctx;
  softverbs::testkit::Pd pd;
  softverbs::testkit::Channel channel;
  softverbs::testkit::Cq scq, rcq;
  softverbs::testkit::Qp qp;
  std::vector<softverbs::testkit::Mr> mrs;  // reg()
  std::string device;
  ibv_gid gid{};

  // Tears down in the order of the verbs' dependencies: QP, CQs, channel, MRs,
  // PD, device.
  void close();
};

// This side's part of the handshake that every role sends: which side it is, its
// QPN, its first PSN and its GID.
void identify(Hello& h, const Endpoint& e, uint32_t side, uint32_t psn);
void open_endpoint(Endpoint& e, int sq_depth, int rq_depth, int cqe);
// Registers [p, p + n) with the endpoint's PD; the endpoint owns the MR.
ibv_mr* reg(Endpoint& e, void* p, size_t n, int access);
// The connection attributes every role starts from: path MTU 1024, the given
// local ACK timeout, retry_cnt and rnr_retry 7, 16 RDMA READs or atomics in
// flight each way.
softverbs::testkit::QpPath rc_path(uint8_t timeout);
// RESET to RTS towards the peer of the handshake, PSNs from both hellos.
void connect_qp(Endpoint& e, const Hello& mine, const Hello& peer, softverbs::testkit::QpPath p);
void post_receive(Endpoint& e, uint64_t wr_id, uintptr_t addr, uint32_t len, uint32_t lkey);

// Sends our Hello, reads the peer's.
Hello exchange(int fd, const Hello& mine);

// After the hellos, the processes exchange frames: a tag and a 64-bit value. 'R' and
// 'E': barriers (ready, exit); 'C': receive credit (how many of the peer's messages
// this side has taken in and posted a new receive for); 'D': done.
class Control {
 public:
  explicit Control(int fd) : fd_(fd) {}
  int fd() const { return fd_; }

  void send(char tag, uint64_t value = 0) {
    uint8_t b[9];
    b[0] = static_cast<uint8_t>(tag);
    std::memcpy(b + 1, &value, 8);
    write_all(fd_, b, sizeof b);
  }

  // Takes in what has arrived, without blocking. False once the peer closed its end.
  bool take_in() {
    for (;;) {
      uint8_t tmp[512];
      ssize_t r = ::recv(fd_, tmp, sizeof tmp, MSG_DONTWAIT);
      if (r > 0) {
        buf_.insert(buf_.end(), tmp, tmp + r);
        continue;
      }
      if (r == 0 || (r < 0 && errno == ECONNRESET)) {  // the peer's end is closed
        eof_ = true;
        break;
      }
      if (errno == EINTR) continue;
      CHECK(errno == EAGAIN || errno == EWOULDBLOCK, "control socket: recv: %s", std::strerror(errno));
      break;
    }
    return !eof_;
  }

  // The next complete frame, if any.
  bool next(char* tag, uint64_t* value) {
    if (buf_.size() - pos_ < 9) return false;
    *tag = static_cast<char>(buf_[pos_]);
    std::memcpy(value, &buf_[pos_ + 1], 8);
    pos_ += 9;
    if (pos_ == buf_.size()) buf_.clear(), pos_ = 0;
    return true;
  }

  // Waits (bounded) for a frame with this tag; frames of other tags go to other(),
  // which fails on what it does not expect.
  template <class Other>
  void wait_for(char want, Clock::time_point deadline, Other other) {
    for (;;) {
      char tag = 0;
      uint64_t value = 0;
      while (next(&tag, &value)) {
        if (tag == want) return;
        other(tag, value);
      }
      CHECK(!eof_, "the peer process went away (control socket closed) while waiting for '%c'", want);
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      CHECK(left > 0, "control socket: no '%c' from the peer in time", want);
      pollfd pfd{fd_, POLLIN, 0};
      ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      take_in();
    }
  }

  void barrier(char tag, std::chrono::seconds limit = std::chrono::seconds(30)) {
    send(tag);
    wait_for(tag, Clock::now() + limit,
             [&](char t, uint64_t) { fail("barrier '%c': unexpected control message '%c'", tag, t); });
  }

 private:
  int fd_;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;
  bool eof_ = false;
};

// Waits until one of the CQs may have something: a completion event on the channel,
// or the timeout. Also wakes up when the control socket has something to read.
void wait_for_events(Endpoint& e, int ctl_fd, int timeout_ms);
// Requests a completion event from both CQs.
void arm(Endpoint& e);
// The device's softverbs counters, as key=value pairs.
std::string counters_string(const std::string& device);
ibv_qp_state qp_state(ibv_qp* qp);

// The roles (peer.cpp).
int run_soak(int fd);
int run_victim(int fd);
int run_survivor(int fd);
int run_rnr_receiver(int fd);
int run_rnr_sender(int fd);
int run_lost_responder(int fd);
int run_lost_requester(int fd);

}  // namespace soak_peer
