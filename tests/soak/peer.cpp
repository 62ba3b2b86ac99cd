// One side of the two-process RC tests in soak_test.cpp: a plain program, run twice
// by the test, each time with its own emulated device (SOFTVERBS_DEVICES). The two
// processes exchange their queue pair numbers, PSNs, GIDs, addresses and rkeys
// through a socketpair the test hands them (--fd); data only ever travels over RDMA.
//
//   soak_peer --role=soak --side=0|1 --fd=N --ops=N [--limit-s=S] [--stall-s=S]
//             [--drop=P --dup=P --reorder=P --fault-seed=N] [--timeout=T] [--credits=0]
//     Both sides run the same mix of RC operations against each other (SEND, RDMA
//     WRITE, RDMA WRITE with immediate, RDMA READ, FETCH_AND_ADD, CMP_AND_SWAP) with
//     the fault layer of this process dropping, duplicating and reordering the
//     packets its device sends. Checks every completion (status, order, opcode),
//     every received message (order, length, immediate, contents), every READ's
//     data, every atomic's returned value and the final atomic words. --credits=0
//     lets a side send without knowing that the peer has a receive posted.
//
//   soak_peer --role=victim --fd=N
//     Connects, posts receives and waits: the survivor kills it with SIGKILL.
//
//   soak_peer --role=survivor --fd=N --peer-pid=PID
//     Connects with timeout 12 and retry_cnt 3, starts large transfers, kills the
//     victim once the first of them completed, posts more, and checks that the
//     oldest unacknowledged request fails with IBV_WC_RETRY_EXC_ERR, everything
//     after it is flushed, the QP is in the error state, and the time this took.
//
//   soak_peer --role=rnr-sender --fd=N / --role=rnr-receiver --fd=N
//     Two SENDs to a receiver that posts its receives late (see run_rnr_sender).
//
//   soak_peer --role=lost-requester --fd=N / --role=lost-responder --fd=N
//     A FETCH_AND_ADD whose response is lost twice, during go-back-N rounds that each
//     end in a PSN sequence NAK (see run_lost_requester).
//
// Exit status 0 when every check passed; otherwise a line starting with "FAIL" on
// stderr says what went wrong. The last line on stdout is a summary of key=value
// pairs that the test reads.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <softverbs/faults.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---------------------------------------------------------------------------
// Failure reporting and arguments

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char* fmt, ...) {
  std::fflush(stdout);
  std::fputs("FAIL: ", stderr);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::_Exit(1);
}

#define CHECK(cond, ...)            \
  do {                              \
    if (!(cond)) fail(__VA_ARGS__); \
  } while (0)

std::map<std::string, std::string> g_args;

std::string arg(const std::string& name, const std::string& def = "") {
  auto it = g_args.find(name);
  return it == g_args.end() ? def : it->second;
}
uint64_t arg_u64(const std::string& name, uint64_t def) {
  auto it = g_args.find(name);
  return it == g_args.end() ? def : std::strtoull(it->second.c_str(), nullptr, 0);
}
double arg_double(const std::string& name, double def) {
  auto it = g_args.find(name);
  return it == g_args.end() ? def : std::strtod(it->second.c_str(), nullptr);
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// ---------------------------------------------------------------------------
// The control socket: bounded reads and writes of whole messages

void write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    CHECK(w > 0, "control socket: send: %s", std::strerror(errno));
    b += w;
    n -= static_cast<size_t>(w);
  }
}

// Reads exactly n bytes before the deadline. False on end of file (the peer is gone);
// fails on timeout.
bool read_all(int fd, void* p, size_t n, Clock::time_point deadline, const char* what) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    CHECK(left > 0, "control socket: no %s from the peer in time", what);
    pollfd pfd{fd, POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (rc < 0 && errno == EINTR) continue;
    CHECK(rc >= 0, "control socket: poll: %s", std::strerror(errno));
    if (rc == 0) continue;
    ssize_t r = ::recv(fd, b, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return false;  // the peer's end is closed
    CHECK(r > 0, "control socket: recv: %s", std::strerror(errno));
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// ---------------------------------------------------------------------------
// Deterministic contents

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// n bytes that are a function of key only.
void fill(uint8_t* p, size_t n, uint64_t key) {
  uint64_t s = mix(key);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s = mix(s);
    std::memcpy(p + i, &s, 8);
  }
  if (i < n) {
    s = mix(s);
    std::memcpy(p + i, &s, n - i);
  }
}

// The first byte where p differs from fill(key), or n.
size_t first_difference(const uint8_t* p, size_t n, uint64_t key, std::vector<uint8_t>& scratch) {
  scratch.resize(std::max<size_t>(scratch.size(), n));
  fill(scratch.data(), n, key);
  if (std::memcmp(p, scratch.data(), n) == 0) return n;
  size_t i = 0;
  while (p[i] == scratch[i]) ++i;
  return i;
}

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

struct Endpoint {
  ibv_device** list = nullptr;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  ibv_qp* qp = nullptr;
  std::string device;
  ibv_gid gid{};
};

// This side's part of the handshake that every role sends: which side it is, its
// QPN, its first PSN and its GID.
void identify(Hello& h, const Endpoint& e, uint32_t side, uint32_t psn) {
  h.side = side;
  h.qpn = e.qp->qp_num;
  h.psn = psn;
  std::memcpy(h.gid, e.gid.raw, 16);
}

void open_endpoint(Endpoint& e, int sq_depth, int rq_depth, int cqe) {
  int n = 0;
  e.list = ibv_get_device_list(&n);
  CHECK(e.list && n >= 1, "no emulated device (SOFTVERBS_DEVICES=%s)",
        std::getenv("SOFTVERBS_DEVICES") ? std::getenv("SOFTVERBS_DEVICES") : "<unset>");
  e.device = ibv_get_device_name(e.list[0]);
  e.ctx = ibv_open_device(e.list[0]);
  CHECK(e.ctx, "ibv_open_device(%s): %s", e.device.c_str(), std::strerror(errno));
  e.pd = ibv_alloc_pd(e.ctx);
  CHECK(e.pd, "ibv_alloc_pd: %s", std::strerror(errno));
  e.channel = ibv_create_comp_channel(e.ctx);
  CHECK(e.channel, "ibv_create_comp_channel: %s", std::strerror(errno));
  ::fcntl(e.channel->fd, F_SETFL, ::fcntl(e.channel->fd, F_GETFL) | O_NONBLOCK);
  e.scq = ibv_create_cq(e.ctx, cqe, nullptr, e.channel, 0);
  e.rcq = ibv_create_cq(e.ctx, cqe, nullptr, e.channel, 0);
  CHECK(e.scq && e.rcq, "ibv_create_cq: %s", std::strerror(errno));
  ibv_qp_init_attr a{};
  a.send_cq = e.scq;
  a.recv_cq = e.rcq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = static_cast<uint32_t>(sq_depth);
  a.cap.max_recv_wr = static_cast<uint32_t>(rq_depth);
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  e.qp = ibv_create_qp(e.pd, &a);
  CHECK(e.qp, "ibv_create_qp: %s", std::strerror(errno));
  // GID index 1: the IPv4-mapped RoCEv2 GID of the device's address.
  CHECK(ibv_query_gid(e.ctx, 1, 1, &e.gid) == 0, "ibv_query_gid: %s", std::strerror(errno));
}

void close_endpoint(Endpoint& e) {
  if (e.qp) ibv_destroy_qp(e.qp);
  if (e.scq) ibv_destroy_cq(e.scq);
  if (e.rcq) ibv_destroy_cq(e.rcq);
  if (e.channel) ibv_destroy_comp_channel(e.channel);
}

ibv_mr* reg(Endpoint& e, void* p, size_t n, int access) {
  ibv_mr* mr = ibv_reg_mr(e.pd, p, n, access);
  CHECK(mr, "ibv_reg_mr(%zu bytes): %s", n, std::strerror(errno));
  return mr;
}

struct QpParams {
  ibv_mtu mtu = IBV_MTU_1024;
  uint8_t timeout = 8;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t rd_atomic = 16;
};

void connect_qp(Endpoint& e, const Hello& mine, const Hello& peer, const QpParams& p) {
  ibv_qp_attr x{};
  x.qp_state = IBV_QPS_INIT;
  x.port_num = 1;
  x.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  CHECK(ibv_modify_qp(e.qp, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
        "modify to INIT: %s", std::strerror(errno));
  x = {};
  x.qp_state = IBV_QPS_RTR;
  x.path_mtu = p.mtu;
  x.dest_qp_num = peer.qpn;
  x.rq_psn = peer.psn;
  x.max_dest_rd_atomic = p.rd_atomic;
  x.min_rnr_timer = 1;
  x.ah_attr.is_global = 1;
  std::memcpy(x.ah_attr.grh.dgid.raw, peer.gid, 16);
  x.ah_attr.grh.sgid_index = 1;
  x.ah_attr.grh.hop_limit = 64;
  x.ah_attr.port_num = 1;
  CHECK(ibv_modify_qp(e.qp, &x,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0,
        "modify to RTR: %s", std::strerror(errno));
  x = {};
  x.qp_state = IBV_QPS_RTS;
  x.timeout = p.timeout;
  x.retry_cnt = p.retry_cnt;
  x.rnr_retry = p.rnr_retry;
  x.sq_psn = mine.psn;
  x.max_rd_atomic = p.rd_atomic;
  CHECK(ibv_modify_qp(e.qp, &x,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC) == 0,
        "modify to RTS: %s", std::strerror(errno));
}

// Sends our Hello, reads the peer's.
Hello exchange(int fd, const Hello& mine) {
  write_all(fd, &mine, sizeof mine);
  Hello peer;
  CHECK(read_all(fd, &peer, sizeof peer, Clock::now() + std::chrono::seconds(30), "hello"),
        "the peer closed the control socket before its hello");
  CHECK(peer.magic == mine.magic, "bad hello magic 0x%08x", peer.magic);
  return peer;
}

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
void wait_for_events(Endpoint& e, int ctl_fd, int timeout_ms) {
  pollfd pfd[2] = {{e.channel->fd, POLLIN, 0}, {ctl_fd, POLLIN, 0}};
  int rc = ::poll(pfd, ctl_fd >= 0 ? 2 : 1, timeout_ms);
  CHECK(rc >= 0 || errno == EINTR, "poll: %s", std::strerror(errno));
  if (rc > 0 && (pfd[0].revents & POLLIN)) {
    ibv_cq* cq = nullptr;
    void* cq_ctx = nullptr;
    while (ibv_get_cq_event(e.channel, &cq, &cq_ctx) == 0) ibv_ack_cq_events(cq, 1);
  }
}

void arm(Endpoint& e) {
  CHECK(ibv_req_notify_cq(e.scq, 0) == 0 && ibv_req_notify_cq(e.rcq, 0) == 0, "ibv_req_notify_cq: %s",
        std::strerror(errno));
}

std::string counters_string(const std::string& device) {
  softverbs_counters c{};
  if (softverbs_device_counters(device.c_str(), &c, sizeof c) != 0) return "counters=unavailable";
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "tx=%" PRIu64 " rx=%" PRIu64 " retransmits=%" PRIu64 " timeouts=%" PRIu64 " naks_sent=%" PRIu64
                " naks_rcvd=%" PRIu64 " rnr_sent=%" PRIu64 " rnr_rcvd=%" PRIu64 " duplicates=%" PRIu64
                " icrc_err=%" PRIu64 " malformed=%" PRIu64 " unknown_qp=%" PRIu64 " faults_dropped=%" PRIu64
                " faults_duplicated=%" PRIu64 " faults_reordered=%" PRIu64,
                c.tx_packets, c.rx_packets, c.retransmits, c.timeouts, c.naks_sent, c.naks_received, c.rnr_naks_sent,
                c.rnr_naks_received, c.duplicates, c.rx_icrc_errors, c.rx_malformed, c.rx_unknown_qp, c.faults_dropped,
                c.faults_duplicated, c.faults_reordered);
  return buf;
}

const char* state_name(ibv_qp_state s) {
  switch (s) {
    case IBV_QPS_RESET:
      return "RESET";
    case IBV_QPS_INIT:
      return "INIT";
    case IBV_QPS_RTR:
      return "RTR";
    case IBV_QPS_RTS:
      return "RTS";
    case IBV_QPS_SQD:
      return "SQD";
    case IBV_QPS_SQE:
      return "SQE";
    case IBV_QPS_ERR:
      return "ERR";
    default:
      return "?";
  }
}

ibv_qp_state qp_state(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  CHECK(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) == 0, "ibv_query_qp: %s", std::strerror(errno));
  return a.qp_state;
}

// ---------------------------------------------------------------------------
// The soak

constexpr uint32_t kMaxMsg = 4500;    // up to five packets at MTU 1024
constexpr uint32_t kWindow = 16;      // outstanding requests per side
constexpr uint32_t kRecv = 32;        // receives posted per side
constexpr uint32_t kWriteSlots = 32;  // target slots per kind of WRITE, in cycles: > (kRecv + 1) / 2
constexpr uint32_t kReadRegion = 65536;
constexpr uint64_t kCycle = 6;  // ops per cycle: the kinds below in turn

enum Kind : uint64_t { kSend = 0, kWrite = 1, kWriteImm = 2, kRead = 3, kFetchAdd = 4, kCompSwap = 5 };

uint64_t op_key(uint32_t side, uint64_t op) { return (uint64_t{side + 1} << 56) ^ (op * 0x100000001b3ull); }
// Payload length of op (SEND and WRITEs: 0..kMaxMsg; READs 1..kMaxMsg).
uint32_t op_len(uint32_t side, uint64_t op) {
  uint32_t n = static_cast<uint32_t>(mix(op_key(side, op) ^ 0x51) % (kMaxMsg + 1));
  return op % kCycle == kRead && n == 0 ? 1 : n;
}
uint64_t read_offset(uint32_t side, uint64_t op, uint32_t len) {
  return mix(op_key(side, op) ^ 0x77) % (kReadRegion - len + 1);
}
uint64_t fetch_add_value(uint32_t side, uint64_t op) { return (mix(op_key(side, op) ^ 0xfa) & 0xffffff) + 1; }
// Every third CMP_AND_SWAP compares against a wrong value and must not swap.
bool cas_should_match(uint64_t op) { return (op / kCycle) % 3 != 2; }
uint64_t cas_swap_value(uint32_t side, uint64_t op) { return mix(op_key(side, op) ^ 0xc5); }

// The receive-consuming messages among the first `ops` operations of a side: SENDs
// and WRITEs with immediate.
uint64_t messages_in(uint64_t ops) { return (ops + 5) / 6 + (ops + 3) / 6; }
// The operation number of the side's m-th receive-consuming message.
uint64_t op_of_message(uint64_t m) { return (m / 2) * kCycle + (m % 2 ? kWriteImm : kSend); }

// The atomic words of the responder after the requester's first `ops` operations.
void final_atomics(uint32_t requester_side, uint64_t ops, uint64_t counter_init, uint64_t cas_init, uint64_t* counter,
                   uint64_t* cas) {
  *counter = counter_init;
  *cas = cas_init;
  for (uint64_t op = 0; op < ops; ++op) {
    if (op % kCycle == kFetchAdd) *counter += fetch_add_value(requester_side, op);
    if (op % kCycle == kCompSwap && cas_should_match(op)) *cas = cas_swap_value(requester_side, op);
  }
}

int run_soak(int fd) {
  const uint32_t side = static_cast<uint32_t>(arg_u64("side", 0));
  const uint64_t ops = arg_u64("ops", 10000);
  const auto limit = std::chrono::seconds(arg_u64("limit-s", 600));
  const auto stall_limit = std::chrono::seconds(arg_u64("stall-s", 30));
  const bool use_credits = arg_u64("credits", 1) != 0;
  const Clock::time_point start = Clock::now();

  // The fault scenario: on the packets this process sends, so that every packet on
  // the wire meets the rules exactly once (the peer applies its own to its packets).
  const double drop = arg_double("drop", 0), dup = arg_double("dup", 0), reorder = arg_double("reorder", 0);
  if (drop > 0 || dup > 0 || reorder > 0) {
    char scenario[512];
    std::snprintf(scenario, sizeof scenario,
                  "seed = %" PRIu64
                  "\n"
                  "[[rule]]\nname = \"drop\"\ndirection = \"tx\"\nprobability = %g\naction = \"drop\"\n"
                  "[[rule]]\nname = \"dup\"\ndirection = \"tx\"\nprobability = %g\naction = \"duplicate\"\n"
                  "[[rule]]\nname = \"reorder\"\ndirection = \"tx\"\nprobability = %g\naction = \"reorder\"\n",
                  arg_u64("fault-seed", 1), drop, dup, reorder);
    char err[256] = {};
    CHECK(softverbs_faults_load(scenario, err, sizeof err) == 0, "softverbs_faults_load: %s", err);
  }

  Endpoint e;
  open_endpoint(e, kWindow, kRecv, 4 * (kWindow + kRecv));

  // Memory: what this side sends and reads into, and what the peer writes, reads and
  // updates atomically.
  std::vector<uint8_t> send_buf(size_t{kWindow} * kMaxMsg), read_dst(size_t{kWindow} * kMaxMsg);
  std::vector<uint8_t> recv_buf(size_t{kRecv} * kMaxMsg);
  std::vector<uint8_t> write_target(size_t{kWriteSlots} * kMaxMsg), write_imm_target(size_t{kWriteSlots} * kMaxMsg);
  std::vector<uint8_t> read_src(kReadRegion);
  std::vector<uint64_t> atomic_words(2), atomic_results(kWindow);
  fill(read_src.data(), read_src.size(), op_key(side, 0) ^ 0x7ead);
  Hello mine;
  mine.ops = ops;
  mine.counter_init = atomic_words[0] = mix(side + 100) >> 8;
  mine.cas_init = atomic_words[1] = mix(side + 200);

  const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* send_mr = reg(e, send_buf.data(), send_buf.size(), 0);
  ibv_mr* read_dst_mr = reg(e, read_dst.data(), read_dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* recv_mr = reg(e, recv_buf.data(), recv_buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* write_mr = reg(e, write_target.data(), write_target.size(), remote);
  ibv_mr* write_imm_mr = reg(e, write_imm_target.data(), write_imm_target.size(), remote);
  ibv_mr* read_src_mr = reg(e, read_src.data(), read_src.size(), remote);
  ibv_mr* atomic_mr = reg(e, atomic_words.data(), 16, remote | IBV_ACCESS_REMOTE_ATOMIC);
  ibv_mr* result_mr = reg(e, atomic_results.data(), atomic_results.size() * 8, IBV_ACCESS_LOCAL_WRITE);

  identify(mine, e, side, side == 0 ? 0xfffc00 : 0x000123);  // one side crosses the 24-bit wrap early
  mine.write_addr = reinterpret_cast<uintptr_t>(write_target.data());
  mine.write_imm_addr = reinterpret_cast<uintptr_t>(write_imm_target.data());
  mine.read_addr = reinterpret_cast<uintptr_t>(read_src.data());
  mine.atomic_addr = reinterpret_cast<uintptr_t>(atomic_words.data());
  mine.write_rkey = write_mr->rkey;
  mine.write_imm_rkey = write_imm_mr->rkey;
  mine.read_rkey = read_src_mr->rkey;
  mine.atomic_rkey = atomic_mr->rkey;
  const Hello peer = exchange(fd, mine);
  CHECK(peer.side != side, "both processes are side %u", side);
  // The local ACK timeout: every lost tail of a message costs one; and retry_cnt + 1
  // of them without a packet from the peer fail the QP. 13 (34 ms) tolerates a
  // peer descheduled for a quarter of a second on a loaded host.
  QpParams params;
  params.timeout = static_cast<uint8_t>(arg_u64("timeout", 13));
  connect_qp(e, mine, peer, params);

  // A copy of the peer's READ source, to check READs against.
  std::vector<uint8_t> peer_read_src(kReadRegion);
  fill(peer_read_src.data(), peer_read_src.size(), op_key(peer.side, 0) ^ 0x7ead);

  uint64_t recv_posted = 0;
  auto post_recv = [&] {
    ibv_sge sge{reinterpret_cast<uintptr_t>(recv_buf.data()) + (recv_posted % kRecv) * kMaxMsg, kMaxMsg, recv_mr->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = recv_posted;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    CHECK(ibv_post_recv(e.qp, &wr, &bad) == 0, "ibv_post_recv: %s", std::strerror(errno));
    ++recv_posted;
  };
  for (uint32_t i = 0; i < kRecv; ++i) post_recv();
  Control ctl(fd);
  ctl.barrier('R');
  arm(e);

  // The requester's view of the peer's atomic words: the value each atomic must return.
  uint64_t expect_counter = peer.counter_init, expect_cas = peer.cas_init;
  std::vector<uint64_t> expect_old(kWindow);
  uint64_t posted = 0, completed = 0, received = 0;
  const uint64_t expected_messages = messages_in(peer.ops);
  std::vector<uint8_t> scratch;

  auto post_op = [&] {
    const uint64_t op = posted;
    const uint32_t slot = static_cast<uint32_t>(op % kWindow);
    const uint32_t len = op_len(side, op);
    ibv_sge sge{};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = op;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    const uint64_t cycle_slot = (op / kCycle) % kWriteSlots;
    switch (op % kCycle) {
      case kSend:
      case kWrite:
      case kWriteImm: {
        uint8_t* p = send_buf.data() + size_t{slot} * kMaxMsg;
        fill(p, len, op_key(side, op));
        sge = {reinterpret_cast<uintptr_t>(p), len, send_mr->lkey};
        if (op % kCycle == kSend) {
          wr.opcode = IBV_WR_SEND;
        } else if (op % kCycle == kWrite) {
          wr.opcode = IBV_WR_RDMA_WRITE;
          wr.wr.rdma.remote_addr = peer.write_addr + cycle_slot * kMaxMsg;
          wr.wr.rdma.rkey = peer.write_rkey;
        } else {
          wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
          wr.imm_data = htonl(static_cast<uint32_t>(op));
          wr.wr.rdma.remote_addr = peer.write_imm_addr + cycle_slot * kMaxMsg;
          wr.wr.rdma.rkey = peer.write_imm_rkey;
        }
        break;
      }
      case kRead: {
        uint8_t* p = read_dst.data() + size_t{slot} * kMaxMsg;
        std::memset(p, 0, len);
        sge = {reinterpret_cast<uintptr_t>(p), len, read_dst_mr->lkey};
        wr.opcode = IBV_WR_RDMA_READ;
        wr.wr.rdma.remote_addr = peer.read_addr + read_offset(side, op, len);
        wr.wr.rdma.rkey = peer.read_rkey;
        break;
      }
      case kFetchAdd: {
        atomic_results[slot] = 0;
        sge = {reinterpret_cast<uintptr_t>(&atomic_results[slot]), 8, result_mr->lkey};
        wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        wr.wr.atomic.remote_addr = peer.atomic_addr;
        wr.wr.atomic.rkey = peer.atomic_rkey;
        wr.wr.atomic.compare_add = fetch_add_value(side, op);
        expect_old[slot] = expect_counter;
        expect_counter += fetch_add_value(side, op);
        break;
      }
      default: {
        atomic_results[slot] = 0;
        sge = {reinterpret_cast<uintptr_t>(&atomic_results[slot]), 8, result_mr->lkey};
        wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
        wr.wr.atomic.remote_addr = peer.atomic_addr + 8;
        wr.wr.atomic.rkey = peer.atomic_rkey;
        wr.wr.atomic.compare_add = cas_should_match(op) ? expect_cas : expect_cas ^ 0x5a5a;
        wr.wr.atomic.swap = cas_swap_value(side, op);
        expect_old[slot] = expect_cas;
        if (cas_should_match(op)) expect_cas = cas_swap_value(side, op);
        break;
      }
    }
    int rc = ibv_post_send(e.qp, &wr, &bad);
    CHECK(rc == 0, "ibv_post_send op %" PRIu64 ": %s", op, std::strerror(rc));
    ++posted;
  };

  auto on_send_completion = [&](const ibv_wc& wc) {
    CHECK(wc.status == IBV_WC_SUCCESS,
          "op %" PRIu64 " completed with %s (vendor_err 0x%x) after %" PRIu64 " completions; %s", wc.wr_id,
          ibv_wc_status_str(wc.status), wc.vendor_err, completed, counters_string(e.device).c_str());
    CHECK(wc.wr_id == completed, "send completion for op %" PRIu64 ", expected op %" PRIu64 " (out of order or twice)",
          wc.wr_id, completed);
    const uint64_t op = completed;
    const uint32_t slot = static_cast<uint32_t>(op % kWindow);
    static const ibv_wc_opcode kExpected[kCycle] = {IBV_WC_SEND,      IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE,
                                                    IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD,  IBV_WC_COMP_SWAP};
    CHECK(wc.opcode == kExpected[op % kCycle], "op %" PRIu64 ": completion opcode %d, expected %d", op, wc.opcode,
          kExpected[op % kCycle]);
    switch (op % kCycle) {
      case kRead: {
        const uint32_t len = op_len(side, op);
        const uint8_t* got = read_dst.data() + size_t{slot} * kMaxMsg;
        const uint8_t* want = peer_read_src.data() + read_offset(side, op, len);
        CHECK(std::memcmp(got, want, len) == 0, "READ op %" PRIu64 " (%u bytes at offset %" PRIu64 "): wrong data", op,
              len, read_offset(side, op, len));
        break;
      }
      case kFetchAdd:
      case kCompSwap:
        CHECK(atomic_results[slot] == expect_old[slot],
              "%s op %" PRIu64 " returned 0x%016" PRIx64 ", expected 0x%016" PRIx64,
              op % kCycle == kFetchAdd ? "FETCH_AND_ADD" : "CMP_AND_SWAP", op, atomic_results[slot], expect_old[slot]);
        break;
      default:
        break;
    }
    ++completed;
  };

  auto on_recv_completion = [&](const ibv_wc& wc) {
    CHECK(wc.status == IBV_WC_SUCCESS, "receive %" PRIu64 " completed with %s after %" PRIu64 " receives; %s", wc.wr_id,
          ibv_wc_status_str(wc.status), received, counters_string(e.device).c_str());
    CHECK(received < expected_messages, "receive completion %" PRIu64 " beyond the %" PRIu64 " messages the peer sends",
          received, expected_messages);
    CHECK(wc.wr_id == received, "receive completion for WQE %" PRIu64 ", expected %" PRIu64 " (out of order or twice)",
          wc.wr_id, received);
    const uint64_t op = op_of_message(received);  // the peer's operation number
    const uint32_t len = op_len(peer.side, op);
    CHECK(wc.byte_len == len, "message %" PRIu64 " (peer op %" PRIu64 "): byte_len %u, expected %u", received, op,
          wc.byte_len, len);
    const uint64_t cycle_slot = (op / kCycle) % kWriteSlots;
    if (op % kCycle == kSend) {
      CHECK(wc.opcode == IBV_WC_RECV, "message %" PRIu64 " (peer op %" PRIu64 ", a SEND): opcode %d", received, op,
            wc.opcode);
      CHECK(!(wc.wc_flags & IBV_WC_WITH_IMM), "SEND op %" PRIu64 " arrived with an immediate", op);
      const uint8_t* got = recv_buf.data() + (wc.wr_id % kRecv) * kMaxMsg;
      size_t at = first_difference(got, len, op_key(peer.side, op), scratch);
      CHECK(at == len, "SEND op %" PRIu64 " (%u bytes): wrong byte at %zu", op, len, at);
    } else {
      CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM,
            "message %" PRIu64 " (peer op %" PRIu64 ", a WRITE with immediate): opcode %d", received, op, wc.opcode);
      CHECK(wc.wc_flags & IBV_WC_WITH_IMM, "WRITE op %" PRIu64 " without IBV_WC_WITH_IMM", op);
      CHECK(ntohl(wc.imm_data) == static_cast<uint32_t>(op), "WRITE op %" PRIu64 ": immediate %u", op,
            ntohl(wc.imm_data));
      const uint8_t* got = write_imm_target.data() + cycle_slot * kMaxMsg;
      size_t at = first_difference(got, len, op_key(peer.side, op), scratch);
      CHECK(at == len, "WRITE with immediate op %" PRIu64 " (%u bytes): wrong byte at %zu", op, len, at);
      // The plain WRITE of the same cycle came before this message: RC placed it first.
      const uint64_t plain = op - kWriteImm + kWrite;
      const uint32_t plain_len = op_len(peer.side, plain);
      got = write_target.data() + cycle_slot * kMaxMsg;
      at = first_difference(got, plain_len, op_key(peer.side, plain), scratch);
      CHECK(at == plain_len, "WRITE op %" PRIu64 " (%u bytes): wrong byte at %zu", plain, plain_len, at);
    }
    ++received;
    post_recv();
  };

  // Flow control: a SEND or WRITE with immediate goes out only when the peer is known
  // to have a receive posted for it (credits over the control socket), so that the
  // peer never answers with an RNR NAK (see the RNR test for why this matters).
  uint64_t credit = 0, credit_sent = 0;
  auto may_post = [&](uint64_t op) {
    if (!use_credits) return true;
    const uint64_t k = op % kCycle;
    if (k != kSend && k != kWriteImm) return true;
    return (op / kCycle) * 2 + (k == kWriteImm ? 1 : 0) < credit + kRecv;
  };
  bool peer_done = false;
  auto on_frame = [&](char tag, uint64_t value) {
    if (tag == 'C') {
      credit = std::max(credit, value);
    } else {
      CHECK(tag == 'D' && !peer_done, "unexpected control message '%c'", tag);
      peer_done = true;
    }
  };
  auto check_control = [&] {
    const bool open = ctl.take_in();
    char tag = 0;
    uint64_t value = 0;
    while (ctl.next(&tag, &value)) on_frame(tag, value);
    CHECK(open || peer_done,
          "the peer process went away (control socket closed) before it finished; here: posted %" PRIu64
          " completed %" PRIu64 " received %" PRIu64 "/%" PRIu64,
          posted, completed, received, expected_messages);
  };

  Clock::time_point last_progress = Clock::now();
  const Clock::time_point deadline = start + limit;
  ibv_wc wc[32];
  // Polls both CQs once; how many completions there were.
  auto drain = [&] {
    int total = 0;
    for (ibv_cq* cq : {e.scq, e.rcq}) {
      int n = ibv_poll_cq(cq, 32, wc);
      CHECK(n >= 0, "ibv_poll_cq: %d", n);
      for (int k = 0; k < n; ++k) {
        if (cq == e.scq)
          on_send_completion(wc[k]);
        else
          on_recv_completion(wc[k]);
      }
      total += n;
    }
    return total;
  };
  while (completed < ops || received < expected_messages) {
    check_control();
    while (posted < ops && posted - completed < kWindow && may_post(posted)) post_op();
    int progress = drain();
    if (received - credit_sent >= kRecv / 8 || (received == expected_messages && credit_sent < received)) {
      ctl.send('C', received);
      credit_sent = received;
    }
    const Clock::time_point now = Clock::now();
    if (progress) {
      last_progress = now;
      continue;
    }
    CHECK(now < deadline,
          "time limit of %" PRId64 " s: posted %" PRIu64 " completed %" PRIu64 "/%" PRIu64 " received %" PRIu64
          "/%" PRIu64 "; qp %s; %s",
          static_cast<int64_t>(limit.count()), posted, completed, ops, received, expected_messages,
          state_name(qp_state(e.qp)), counters_string(e.device).c_str());
    CHECK(now - last_progress < stall_limit,
          "stalled: nothing completed for %" PRId64 " s: posted %" PRIu64 " completed %" PRIu64 "/%" PRIu64
          " received %" PRIu64 "/%" PRIu64 " credit %" PRIu64 " (peer done: %s); qp 0x%06x %s; %s",
          static_cast<int64_t>(stall_limit.count()), posted, completed, ops, received, expected_messages, credit,
          peer_done ? "yes" : "no", e.qp->qp_num, state_name(qp_state(e.qp)), counters_string(e.device).c_str());
    // Nothing now: re-arm, look once more (a completion may have come in between),
    // then sleep until the channel or the control socket has something.
    arm(e);
    int n = drain();
    if (n) {
      last_progress = Clock::now();
      continue;
    }
    wait_for_events(e, fd, 200);
  }
  const double elapsed_ms = ms_since(start);

  // Done here: tell the peer, and wait until it is done too (its last operations
  // still need this side's responder).
  ctl.send('D');
  if (!peer_done) ctl.wait_for('D', deadline, on_frame);
  // Nothing more may arrive: every message was delivered exactly once.
  for (ibv_cq* cq : {e.scq, e.rcq}) {
    int n = ibv_poll_cq(cq, 32, wc);
    CHECK(n == 0, "%d unexpected completion(s) after the end, the first for wr_id %" PRIu64 " with %s", n,
          n > 0 ? wc[0].wr_id : 0, n > 0 ? ibv_wc_status_str(wc[0].status) : "-");
  }
  // The peer's atomics are all complete: this side's atomic words are final.
  uint64_t want_counter = 0, want_cas = 0;
  final_atomics(peer.side, peer.ops, mine.counter_init, mine.cas_init, &want_counter, &want_cas);
  CHECK(atomic_words[0] == want_counter, "fetch-and-add word 0x%016" PRIx64 ", expected 0x%016" PRIx64, atomic_words[0],
        want_counter);
  CHECK(atomic_words[1] == want_cas, "compare-and-swap word 0x%016" PRIx64 ", expected 0x%016" PRIx64, atomic_words[1],
        want_cas);
  CHECK(qp_state(e.qp) == IBV_QPS_RTS, "QP in state %s at the end", state_name(qp_state(e.qp)));

  std::printf("soak side=%u ops=%" PRIu64 " completed=%" PRIu64 " received=%" PRIu64
              " elapsed_ms=%.0f hits_drop=%" PRIu64 " hits_dup=%" PRIu64 " hits_reorder=%" PRIu64 " %s\n",
              side, ops, completed, received, elapsed_ms, softverbs_fault_hits("drop"), softverbs_fault_hits("dup"),
              softverbs_fault_hits("reorder"), counters_string(e.device).c_str());
  std::fflush(stdout);
  // Both sides leave together: the peer may not be torn down while this one still
  // acknowledges its last packets.
  ctl.send('E');
  ctl.wait_for('E', Clock::now() + std::chrono::seconds(60), on_frame);

  close_endpoint(e);
  for (ibv_mr* m : {send_mr, read_dst_mr, recv_mr, write_mr, write_imm_mr, read_src_mr, atomic_mr, result_mr})
    ibv_dereg_mr(m);
  ibv_dealloc_pd(e.pd);
  ibv_close_device(e.ctx);
  ibv_free_device_list(e.list);
  return 0;
}

// ---------------------------------------------------------------------------
// Peer killed mid-transfer

constexpr uint32_t kBig = 1u << 20;         // RDMA WRITE size
constexpr uint32_t kSendSize = 65536;       // SEND size
constexpr uint32_t kReadSize = 256u << 10;  // RDMA READ size
constexpr uint32_t kVictimRecvs = 32;
constexpr uint32_t kSurvivorRecvs = 8;
constexpr uint8_t kKillTimeout = 12;  // 4.096 us * 2^12 = 16.8 ms
constexpr uint8_t kKillRetries = 3;

int run_victim(int fd) {
  Endpoint e;
  open_endpoint(e, 16, kVictimRecvs, 128);
  std::vector<uint8_t> target(kBig), read_src(kReadSize), recv_buf(size_t{kVictimRecvs} * kSendSize);
  fill(read_src.data(), read_src.size(), 0x7ead);
  const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* target_mr = reg(e, target.data(), target.size(), remote);
  ibv_mr* read_mr = reg(e, read_src.data(), read_src.size(), remote);
  ibv_mr* recv_mr = reg(e, recv_buf.data(), recv_buf.size(), IBV_ACCESS_LOCAL_WRITE);
  Hello mine;
  identify(mine, e, 1, 0x00abcd);
  mine.write_addr = reinterpret_cast<uintptr_t>(target.data());
  mine.write_rkey = target_mr->rkey;
  mine.read_addr = reinterpret_cast<uintptr_t>(read_src.data());
  mine.read_rkey = read_mr->rkey;
  const Hello peer = exchange(fd, mine);
  QpParams p;
  p.mtu = IBV_MTU_4096;
  p.timeout = kKillTimeout;
  p.retry_cnt = kKillRetries;
  p.rd_atomic = 4;
  connect_qp(e, mine, peer, p);
  for (uint32_t i = 0; i < kVictimRecvs; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(recv_buf.data()) + size_t{i} * kSendSize, kSendSize, recv_mr->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    CHECK(ibv_post_recv(e.qp, &wr, &bad) == 0, "ibv_post_recv: %s", std::strerror(errno));
  }
  Control(fd).barrier('R');
  // Serve the survivor's requests (the progress thread does) until killed. Nothing
  // else ends this but the survivor giving up: a bounded wait, in case it never kills.
  char tag = 0;
  if (!read_all(fd, &tag, 1, Clock::now() + std::chrono::seconds(120), "kill"))
    fail("victim: the survivor went away without killing this process");
  fail("victim: unexpected control message '%c'", tag);
}

int run_survivor(int fd) {
  const pid_t victim = static_cast<pid_t>(arg_u64("peer-pid", 0));
  CHECK(victim > 1, "--peer-pid is required");
  constexpr uint32_t kSq = 64;
  Endpoint e;
  open_endpoint(e, kSq, kSurvivorRecvs, 256);
  std::vector<uint8_t> src(kBig), read_dst(kReadSize);
  fill(src.data(), src.size(), 0x5e4d);
  ibv_mr* src_mr = reg(e, src.data(), src.size(), 0);
  ibv_mr* read_mr = reg(e, read_dst.data(), read_dst.size(), IBV_ACCESS_LOCAL_WRITE);
  std::vector<uint8_t> recv_buf(64);
  ibv_mr* recv_mr = reg(e, recv_buf.data(), recv_buf.size(), IBV_ACCESS_LOCAL_WRITE);
  Hello mine;
  identify(mine, e, 0, 0x00f00d);
  const Hello peer = exchange(fd, mine);
  QpParams p;
  p.mtu = IBV_MTU_4096;
  p.timeout = kKillTimeout;
  p.retry_cnt = kKillRetries;
  p.rd_atomic = 4;
  connect_qp(e, mine, peer, p);
  // Receives of this side: the error flushes them too.
  for (uint32_t i = 0; i < kSurvivorRecvs; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(recv_buf.data()), 64, recv_mr->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = 1000 + i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    CHECK(ibv_post_recv(e.qp, &wr, &bad) == 0, "ibv_post_recv: %s", std::strerror(errno));
  }
  Control(fd).barrier('R');
  arm(e);

  // Work requests: RDMA WRITE of 1 MiB, SEND of 64 KiB, RDMA READ of 256 KiB in turn.
  uint64_t posted = 0;
  auto post = [&](uint64_t n) {
    for (uint64_t k = 0; k < n; ++k) {
      const uint64_t id = posted;
      ibv_sge sge{};
      ibv_send_wr wr{};
      ibv_send_wr* bad = nullptr;
      wr.wr_id = id;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_SIGNALED;
      switch (id % 3) {
        case 0:
          sge = {reinterpret_cast<uintptr_t>(src.data()), kBig, src_mr->lkey};
          wr.opcode = IBV_WR_RDMA_WRITE;
          wr.wr.rdma.remote_addr = peer.write_addr;
          wr.wr.rdma.rkey = peer.write_rkey;
          break;
        case 1:
          sge = {reinterpret_cast<uintptr_t>(src.data()), kSendSize, src_mr->lkey};
          wr.opcode = IBV_WR_SEND;
          break;
        default:
          sge = {reinterpret_cast<uintptr_t>(read_dst.data()), kReadSize, read_mr->lkey};
          wr.opcode = IBV_WR_RDMA_READ;
          wr.wr.rdma.remote_addr = peer.read_addr;
          wr.wr.rdma.rkey = peer.read_rkey;
          break;
      }
      int rc = ibv_post_send(e.qp, &wr, &bad);
      CHECK(rc == 0, "ibv_post_send %" PRIu64 ": %s", id, std::strerror(rc));
      ++posted;
    }
  };

  struct Seen {
    uint64_t wr_id;
    ibv_wc_status status;
    double at_ms;  // since the kill
  };
  std::vector<Seen> sends, recvs;
  Clock::time_point kill_time{};
  auto poll_all = [&] {
    ibv_wc wc[32];
    int total = 0;
    for (ibv_cq* cq : {e.scq, e.rcq}) {
      int n = ibv_poll_cq(cq, 32, wc);
      CHECK(n >= 0, "ibv_poll_cq: %d", n);
      for (int k = 0; k < n; ++k)
        (cq == e.scq ? sends : recvs)
            .push_back({wc[k].wr_id, wc[k].status, kill_time == Clock::time_point{} ? -1.0 : ms_since(kill_time)});
      total += n;
    }
    return total;
  };
  // Waits (bounded) until cond() holds, sleeping on the completion channel.
  auto wait_until = [&](auto cond, milliseconds limit, const char* what) {
    const auto deadline = Clock::now() + limit;
    while (!cond()) {
      if (poll_all()) continue;
      CHECK(Clock::now() < deadline,
            "survivor: %s did not happen within %lld ms: posted %" PRIu64
            ", %zu send and %zu receive completions; "
            "qp %s; %s",
            what, static_cast<long long>(limit.count()), posted, sends.size(), recvs.size(), state_name(qp_state(e.qp)),
            counters_string(e.device).c_str());
      arm(e);
      if (poll_all()) continue;
      wait_for_events(e, -1, 50);
    }
  };

  // Warm-up: the connection works, in both directions of the wire.
  post(3);
  wait_until([&] { return sends.size() == 3; }, milliseconds(20000), "the first three completions");
  for (const Seen& s : sends)
    CHECK(s.status == IBV_WC_SUCCESS, "warm-up request %" PRIu64 ": %s", s.wr_id, ibv_wc_status_str(s.status));
  std::vector<uint8_t> scratch;
  const size_t at = first_difference(read_dst.data(), kReadSize, 0x7ead, scratch);
  CHECK(at == kReadSize, "warm-up READ: wrong byte at %zu", at);

  // Batch A: large transfers (about 11 MB); once the first of them completed (the
  // peer is answering, data is flowing) the peer is killed while the rest is in
  // flight. Batch B is posted after the peer is gone: outstanding work even if this
  // process was descheduled long enough for all of batch A to complete.
  constexpr uint64_t kBatchA = 24, kBatchB = 6;
  const size_t before_a = sends.size();
  post(kBatchA);
  wait_until([&] { return sends.size() > before_a; }, milliseconds(20000), "the first completion of batch A");
  kill_time = Clock::now();
  CHECK(::kill(victim, SIGKILL) == 0, "kill(%d, SIGKILL): %s", victim, std::strerror(errno));
  const size_t done_at_kill = sends.size() - before_a;
  // The victim is gone once its end of the control socket is closed.
  char tag = 0;
  CHECK(!read_all(fd, &tag, 1, Clock::now() + std::chrono::seconds(10), "end of file after the kill"),
        "unexpected control message '%c' from the killed peer", tag);
  const double dead_ms = ms_since(kill_time);
  // Batch B: posted after the peer died; none of it can be acknowledged.
  post(kBatchB);
  const ibv_qp_state state_after_b = qp_state(e.qp);

  // Everything completes, bounded: retry_cnt + 1 local ACK timeouts after the peer
  // went silent, generously.
  wait_until([&] { return sends.size() == posted && recvs.size() == kSurvivorRecvs; }, milliseconds(20000),
             "the completion of every outstanding work request");

  // In posting order; successes, then exactly one RETRY_EXC_ERR (the oldest request
  // not acknowledged), then flushes.
  size_t i = 0;
  for (; i < sends.size(); ++i) {
    CHECK(sends[i].wr_id == i, "send completion %zu is for wr_id %" PRIu64 " (out of order)", i, sends[i].wr_id);
    if (sends[i].status != IBV_WC_SUCCESS) break;
  }
  CHECK(i < sends.size(), "every request succeeded although the peer was killed");
  const size_t failed = i;
  CHECK(failed >= 3 + done_at_kill, "request %zu failed although it completed successfully before", failed);
  // How many requests of batch A were still unacknowledged when the peer died.
  const size_t in_flight_at_kill = failed < 3 + kBatchA ? 3 + kBatchA - failed : 0;
  CHECK(sends[failed].status == IBV_WC_RETRY_EXC_ERR, "the first failed request (%zu) has %s, expected %s", failed,
        ibv_wc_status_str(sends[failed].status), ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR));
  for (size_t k = failed + 1; k < sends.size(); ++k) {
    CHECK(sends[k].wr_id == k, "send completion %zu is for wr_id %" PRIu64 " (out of order)", k, sends[k].wr_id);
    CHECK(sends[k].status == IBV_WC_WR_FLUSH_ERR, "request %zu after the failed one has %s, expected %s", k,
          ibv_wc_status_str(sends[k].status), ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR));
  }
  for (size_t k = 0; k < recvs.size(); ++k) {
    CHECK(recvs[k].wr_id == 1000 + k, "receive completion %zu is for wr_id %" PRIu64, k, recvs[k].wr_id);
    CHECK(recvs[k].status == IBV_WC_WR_FLUSH_ERR, "receive %zu has %s, expected %s", k,
          ibv_wc_status_str(recvs[k].status), ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR));
  }
  CHECK(qp_state(e.qp) == IBV_QPS_ERR, "QP in state %s after the error, expected ERR", state_name(qp_state(e.qp)));

  // A request posted to the QP in the error state is flushed at once.
  post(1);
  wait_until([&] { return sends.size() == posted; }, milliseconds(5000), "the flush of a request posted in ERR");
  CHECK(sends.back().wr_id == posted - 1 && sends.back().status == IBV_WC_WR_FLUSH_ERR,
        "request posted in ERR: wr_id %" PRIu64 " %s", sends.back().wr_id, ibv_wc_status_str(sends.back().status));

  softverbs_counters c{};
  softverbs_device_counters(e.device.c_str(), &c, sizeof c);
  std::printf("survivor timeout=%u retry_cnt=%u posted=%" PRIu64
              " succeeded=%zu done_at_kill=%zu in_flight_at_kill=%zu failed_wr=%zu "
              "dead_ms=%.1f state_after_b=%s error_ms=%.1f last_flush_ms=%.1f timeouts=%" PRIu64 " retransmits=%" PRIu64
              "\n",
              kKillTimeout, kKillRetries, posted, failed, done_at_kill, in_flight_at_kill, failed, dead_ms,
              state_name(state_after_b), sends[failed].at_ms, sends[sends.size() - 2].at_ms, c.timeouts, c.retransmits);
  std::fflush(stdout);

  close_endpoint(e);
  for (ibv_mr* m : {src_mr, read_mr, recv_mr}) ibv_dereg_mr(m);
  ibv_dealloc_pd(e.pd);
  ibv_close_device(e.ctx);
  ibv_free_device_list(e.list);
  return 0;
}

// ---------------------------------------------------------------------------
// A receiver slow to post receives

constexpr uint32_t kRnrPsn = 0x000200;  // the sender's first PSN
constexpr uint64_t kRnrRounds = 200;    // RNR NAKs the receiver sends before it posts
constexpr uint32_t kRnrMsg = 64;

// Posts no receive until it has answered kRnrRounds requests with an RNR NAK (or the
// sender reports that its requests completed), then posts them and checks the two
// messages.
int run_rnr_receiver(int fd) {
  Endpoint e;
  open_endpoint(e, 4, 4, 16);
  std::vector<uint8_t> buf(2 * kRnrMsg);
  ibv_mr* mr = reg(e, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  Hello mine;
  identify(mine, e, 1, 0x000100);
  const Hello peer = exchange(fd, mine);
  QpParams p;
  p.timeout = 14;
  connect_qp(e, mine, peer, p);  // min_rnr_timer 1: 10 us
  Control ctl(fd);
  ctl.barrier('R');
  // Busy elsewhere: the sender's requests find no receive (a bounded wait on the
  // device's counter, or on the sender giving up).
  bool sender_done = false;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  for (;;) {
    softverbs_counters c{};
    softverbs_device_counters(e.device.c_str(), &c, sizeof c);
    if (c.rnr_naks_sent >= kRnrRounds) break;
    CHECK(Clock::now() < deadline, "receiver: only %" PRIu64 " RNR NAKs sent in 20 s", c.rnr_naks_sent);
    pollfd pfd{fd, POLLIN, 0};
    ::poll(&pfd, 1, 1);
    CHECK(ctl.take_in(), "receiver: the sender went away");
    char tag = 0;
    uint64_t value = 0;
    if (ctl.next(&tag, &value)) {
      CHECK(tag == 'F', "receiver: unexpected control message '%c'", tag);
      sender_done = true;
      break;
    }
  }
  for (uint32_t i = 0; i < 2; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()) + i * kRnrMsg, kRnrMsg, mr->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    CHECK(ibv_post_recv(e.qp, &wr, &bad) == 0, "ibv_post_recv: %s", std::strerror(errno));
  }
  ctl.send('P');
  if (!sender_done)
    ctl.wait_for('F', Clock::now() + std::chrono::seconds(20),
                 [](char t, uint64_t) { fail("receiver: unexpected control message '%c'", t); });
  // The sender's view decides; the receiver reports what it got.
  ibv_wc wc[4];
  int n = ibv_poll_cq(e.rcq, 4, wc);
  std::printf("rnr-receiver received=%d\n", std::max(n, 0));
  std::fflush(stdout);
  ctl.barrier('E');
  close_endpoint(e);
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(e.pd);
  ibv_close_device(e.ctx);
  ibv_free_device_list(e.list);
  return 0;
}

// Sends two one-packet messages with rnr_retry 7 (retry for ever) to a receiver that
// posts its receives late. The fault layer holds back every transmission of the
// second message by 300 us, so that it reaches the responder well after the first
// was answered with an RNR NAK: the order a busy host produces on its own. Both
// messages must complete successfully once the receiver posts: a receiver that is
// not ready is not a transport error.
int run_rnr_sender(int fd) {
  char scenario[256];
  std::snprintf(scenario, sizeof scenario,
                "[[rule]]\nname = \"hold-second\"\ndirection = \"tx\"\npsn = [%u, %u]\naction = \"delay\"\n"
                "delay_us = 300\n",
                kRnrPsn + 1, kRnrPsn + 1);
  char err[256] = {};
  CHECK(softverbs_faults_load(scenario, err, sizeof err) == 0, "softverbs_faults_load: %s", err);
  Endpoint e;
  open_endpoint(e, 4, 4, 16);
  std::vector<uint8_t> buf(2 * kRnrMsg);
  fill(buf.data(), buf.size(), 0x4e4e);
  ibv_mr* mr = reg(e, buf.data(), buf.size(), 0);
  Hello mine;
  identify(mine, e, 0, kRnrPsn);
  const Hello peer = exchange(fd, mine);
  QpParams p;
  p.timeout = 14;  // 67 ms: no local ACK timeout while the receiver answers
  p.retry_cnt = 7;
  p.rnr_retry = 7;
  connect_qp(e, mine, peer, p);
  Control ctl(fd);
  ctl.barrier('R');
  for (uint32_t i = 0; i < 2; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()) + i * kRnrMsg, kRnrMsg, mr->lkey};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    CHECK(ibv_post_send(e.qp, &wr, &bad) == 0, "ibv_post_send: %s", std::strerror(errno));
  }
  std::vector<ibv_wc> done;
  bool posted = false;
  double first_ms = -1;
  const Clock::time_point start = Clock::now();
  const auto deadline = start + std::chrono::seconds(30);
  // Until both completed and the receiver's 'P' has been read (it may arrive after
  // the completions: the barrier below must not meet it).
  while (done.size() < 2 || !posted) {
    CHECK(Clock::now() < deadline, "sender: %zu of 2 completions in 30 s", done.size());
    ibv_wc wc[2];
    int n = ibv_poll_cq(e.scq, 2, wc);
    CHECK(n >= 0, "ibv_poll_cq: %d", n);
    for (int k = 0; k < n; ++k) {
      if (done.empty()) first_ms = ms_since(start);
      done.push_back(wc[k]);
    }
    if (n) continue;
    ctl.take_in();
    char tag = 0;
    uint64_t value = 0;
    while (ctl.next(&tag, &value)) {
      CHECK(tag == 'P', "sender: unexpected control message '%c'", tag);
      posted = true;
    }
    arm(e);
    if (ibv_poll_cq(e.scq, 0, wc) == 0) wait_for_events(e, fd, 50);
  }
  ctl.send('F');
  softverbs_counters c{};
  softverbs_device_counters(e.device.c_str(), &c, sizeof c);
  std::printf("rnr-sender first=%s second=%s receiver_had_posted=%d first_ms=%.1f rnr_rcvd=%" PRIu64
              " naks_rcvd=%" PRIu64 " retransmits=%" PRIu64 " timeouts=%" PRIu64 " delayed=%" PRIu64 "\n",
              ibv_wc_status_str(done[0].status), ibv_wc_status_str(done[1].status), posted ? 1 : 0, first_ms,
              c.rnr_naks_received, c.naks_received, c.retransmits, c.timeouts, c.faults_delayed);
  std::fflush(stdout);
  CHECK(done[0].wr_id == 0 && done[1].wr_id == 1, "completions out of order");
  CHECK(done[0].status == IBV_WC_SUCCESS && done[1].status == IBV_WC_SUCCESS,
        "the SENDs completed with %s and %s (receiver had posted its receives: %s) after %" PRIu64
        " RNR NAKs and %" PRIu64 " PSN sequence NAKs: a receiver that is not ready must not exhaust retry_cnt",
        ibv_wc_status_str(done[0].status), ibv_wc_status_str(done[1].status), posted ? "yes" : "no",
        c.rnr_naks_received, c.naks_received);
  ctl.barrier('E');
  close_endpoint(e);
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(e.pd);
  ibv_close_device(e.ctx);
  ibv_free_device_list(e.list);
  return 0;
}

// ---------------------------------------------------------------------------
// A lost atomic response during go-back-N rounds

constexpr uint32_t kLostPsn = 0x000300;  // the requester's first PSN: its FETCH_AND_ADD
constexpr uint32_t kLostWrites = 12;     // one-packet RDMA WRITEs after it
constexpr uint64_t kLostInit = 1000;     // the responder's atomic word before

// The responder: an atomic word and a write target; its fault layer loses its first
// two atomic responses (the original and the first replay of the FETCH_AND_ADD's).
int run_lost_responder(int fd) {
  char err[256] = {};
  CHECK(softverbs_faults_load("[[rule]]\nname = \"lose-atomic-ack\"\ndirection = \"tx\"\nclass = \"atomic_ack\"\n"
                              "count = 2\naction = \"drop\"\n",
                              err, sizeof err) == 0,
        "softverbs_faults_load: %s", err);
  Endpoint e;
  open_endpoint(e, 4, 4, 16);
  std::vector<uint64_t> word(1, kLostInit);
  std::vector<uint8_t> target(4096);
  ibv_mr* word_mr = reg(e, word.data(), 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  ibv_mr* target_mr = reg(e, target.data(), target.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  Hello mine;
  identify(mine, e, 1, 0x000100);
  mine.atomic_addr = reinterpret_cast<uintptr_t>(word.data());
  mine.atomic_rkey = word_mr->rkey;
  mine.write_addr = reinterpret_cast<uintptr_t>(target.data());
  mine.write_rkey = target_mr->rkey;
  const Hello peer = exchange(fd, mine);
  QpParams p;
  p.timeout = 14;
  connect_qp(e, mine, peer, p);
  Control ctl(fd);
  ctl.barrier('R');
  ctl.barrier('E', std::chrono::seconds(60));
  std::printf("lost-responder word=%" PRIu64 " atomic_acks_lost=%" PRIu64 "\n", word[0],
              softverbs_fault_hits("lose-atomic-ack"));
  std::fflush(stdout);
  close_endpoint(e);
  ibv_dereg_mr(word_mr);
  ibv_dereg_mr(target_mr);
  ibv_dealloc_pd(e.pd);
  ibv_close_device(e.ctx);
  ibv_free_device_list(e.list);
  return 0;
}

// The requester: a FETCH_AND_ADD followed by kLostWrites one-packet WRITEs, with
// timeout 14 (67 ms) and retry_cnt 7. Its fault layer loses write k (k = 2..9) on
// its (k-1)th transmission: go-back-N round r loses write r + 1 only, so that every
// round ends in one PSN sequence NAK, each for a later PSN: the responder makes
// progress every round. Meanwhile the
// FETCH_AND_ADD's response is lost twice (the responder's rules). A requester that
// asks for the missing response again as it goes back gets the third copy; every
// request must complete successfully, the FETCH_AND_ADD returning the initial value.
int run_lost_requester(int fd) {
  std::string scenario;
  for (uint32_t k = 2; k <= 9; ++k) {
    char rule[160];
    std::snprintf(rule, sizeof rule,
                  "[[rule]]\nname = \"lose-%u\"\ndirection = \"tx\"\npsn = [%u, %u]\nnth = %u\naction = \"drop\"\n", k,
                  kLostPsn + k, kLostPsn + k, k - 1);
    scenario += rule;
  }
  char err[256] = {};
  CHECK(softverbs_faults_load(scenario.c_str(), err, sizeof err) == 0, "softverbs_faults_load: %s", err);
  Endpoint e;
  open_endpoint(e, 32, 4, 64);
  std::vector<uint64_t> result(1, 0);
  std::vector<uint8_t> src(64);
  ibv_mr* result_mr = reg(e, result.data(), 8, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* src_mr = reg(e, src.data(), src.size(), 0);
  Hello mine;
  identify(mine, e, 0, kLostPsn);
  const Hello peer = exchange(fd, mine);
  QpParams p;
  p.timeout = 14;
  p.retry_cnt = 7;
  p.rd_atomic = 4;
  connect_qp(e, mine, peer, p);
  Control ctl(fd);
  ctl.barrier('R');
  for (uint32_t i = 0; i <= kLostWrites; ++i) {
    ibv_sge sge{};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (i == 0) {
      sge = {reinterpret_cast<uintptr_t>(result.data()), 8, result_mr->lkey};
      wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
      wr.wr.atomic.remote_addr = peer.atomic_addr;
      wr.wr.atomic.rkey = peer.atomic_rkey;
      wr.wr.atomic.compare_add = 1;
    } else {
      sge = {reinterpret_cast<uintptr_t>(src.data()), static_cast<uint32_t>(src.size()), src_mr->lkey};
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.wr.rdma.remote_addr = peer.write_addr + i * 64;
      wr.wr.rdma.rkey = peer.write_rkey;
    }
    CHECK(ibv_post_send(e.qp, &wr, &bad) == 0, "ibv_post_send: %s", std::strerror(errno));
  }
  std::vector<ibv_wc> done;
  const Clock::time_point start = Clock::now();
  while (done.size() <= kLostWrites) {
    CHECK(Clock::now() < start + std::chrono::seconds(30), "requester: %zu of %u completions in 30 s", done.size(),
          kLostWrites + 1);
    ibv_wc wc[16];
    int n = ibv_poll_cq(e.scq, 16, wc);
    CHECK(n >= 0, "ibv_poll_cq: %d", n);
    for (int k = 0; k < n; ++k) done.push_back(wc[k]);
    if (n) continue;
    arm(e);
    if (ibv_poll_cq(e.scq, 0, wc) == 0) wait_for_events(e, -1, 50);
  }
  const double ms = ms_since(start);
  softverbs_counters c{};
  softverbs_device_counters(e.device.c_str(), &c, sizeof c);
  uint64_t lost = 0;
  for (uint32_t k = 2; k <= 9; ++k) lost += softverbs_fault_hits(("lose-" + std::to_string(k)).c_str());
  std::printf("lost-requester fetch_add=%s returned=%" PRIu64 " ms=%.1f naks_rcvd=%" PRIu64 " retransmits=%" PRIu64
              " timeouts=%" PRIu64 " writes_lost=%" PRIu64 "\n",
              ibv_wc_status_str(done[0].status), result[0], ms, c.naks_received, c.retransmits, c.timeouts, lost);
  std::fflush(stdout);
  for (size_t k = 0; k < done.size(); ++k) {
    CHECK(done[k].wr_id == k, "completion %zu is for wr_id %" PRIu64, k, done[k].wr_id);
    CHECK(done[k].status == IBV_WC_SUCCESS,
          "request %zu (%s) completed with %s after %" PRIu64 " PSN sequence NAKs and %" PRIu64
          " local ACK timeouts: the responder answered every round, only the FETCH_AND_ADD's response was lost "
          "twice",
          k, k == 0 ? "FETCH_AND_ADD" : "RDMA WRITE", ibv_wc_status_str(done[k].status), c.naks_received, c.timeouts);
  }
  CHECK(result[0] == kLostInit, "FETCH_AND_ADD returned %" PRIu64 ", expected %" PRIu64, result[0], kLostInit);
  ctl.barrier('E');
  close_endpoint(e);
  ibv_dereg_mr(result_mr);
  ibv_dereg_mr(src_mr);
  ibv_dealloc_pd(e.pd);
  ibv_close_device(e.ctx);
  ibv_free_device_list(e.list);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) fail("unexpected argument '%s'", argv[i]);
    size_t eq = a.find('=');
    g_args[a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] =
        eq == std::string::npos ? "1" : a.substr(eq + 1);
  }
  const int fd = static_cast<int>(arg_u64("fd", 3));
  CHECK(::fcntl(fd, F_GETFD) >= 0, "--fd=%d is not an open file descriptor", fd);
  const std::string role = arg("role");
  if (role == "soak") return run_soak(fd);
  if (role == "victim") return run_victim(fd);
  if (role == "survivor") return run_survivor(fd);
  if (role == "rnr-sender") return run_rnr_sender(fd);
  if (role == "rnr-receiver") return run_rnr_receiver(fd);
  if (role == "lost-requester") return run_lost_requester(fd);
  if (role == "lost-responder") return run_lost_responder(fd);
  fail("--role=soak|victim|survivor|rnr-sender|rnr-receiver|lost-requester|lost-responder is required (got '%s')",
       role.c_str());
}
