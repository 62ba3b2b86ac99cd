// The shared parts of soak_peer (peer.hpp): failure reporting, arguments, the
// control socket, deterministic contents and the endpoint.
#include <fcntl.h>
#include <inttypes.h>
#include <softverbs/faults.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdlib>
#include <map>

#include "tests/soak/peer.hpp"

namespace soak_peer {
namespace {
std::map<std::string, std::string> g_args;
}  // namespace

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

void parse_args(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) fail("unexpected argument '%s'", argv[i]);
    size_t eq = a.find('=');
    g_args[a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] =
        eq == std::string::npos ? "1" : a.substr(eq + 1);
  }
}

std::string arg(const std::string& name, const std::string& def) {
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

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

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

size_t first_difference(const uint8_t* p, size_t n, uint64_t key, std::vector<uint8_t>& scratch) {
  scratch.resize(std::max<size_t>(scratch.size(), n));
  fill(scratch.data(), n, key);
  if (std::memcmp(p, scratch.data(), n) == 0) return n;
  size_t i = 0;
  while (p[i] == scratch[i]) ++i;
  return i;
}

// ---------------------------------------------------------------------------
// The endpoint

void Endpoint::close() {
  qp.reset();
  scq.reset();
  rcq.reset();
  channel.reset();
  mrs.clear();
  pd.reset();
  ctx.reset();
}

void identify(Hello& h, const Endpoint& e, uint32_t side, uint32_t psn) {
  h.side = side;
  h.qpn = e.qp->qp_num;
  h.psn = psn;
  std::memcpy(h.gid, e.gid.raw, 16);
}

void open_endpoint(Endpoint& e, int sq_depth, int rq_depth, int cqe) {
  CHECK(e.list && e.list.size() >= 1, "no emulated device (SOFTVERBS_DEVICES=%s)",
        std::getenv("SOFTVERBS_DEVICES") ? std::getenv("SOFTVERBS_DEVICES") : "<unset>");
  e.device = e.list.name(0);
  e.ctx.reset(ibv_open_device(e.list[0]));
  CHECK(e.ctx, "ibv_open_device(%s): %s", e.device.c_str(), std::strerror(errno));
  e.pd.reset(ibv_alloc_pd(e.ctx.get()));
  CHECK(e.pd, "ibv_alloc_pd: %s", std::strerror(errno));
  e.channel.reset(ibv_create_comp_channel(e.ctx.get()));
  CHECK(e.channel, "ibv_create_comp_channel: %s", std::strerror(errno));
  ::fcntl(e.channel->fd, F_SETFL, ::fcntl(e.channel->fd, F_GETFL) | O_NONBLOCK);
  e.scq.reset(ibv_create_cq(e.ctx.get(), cqe, nullptr, e.channel.get(), 0));
  e.rcq.reset(ibv_create_cq(e.ctx.get(), cqe, nullptr, e.channel.get(), 0));
  CHECK(e.scq && e.rcq, "ibv_create_cq: %s", std::strerror(errno));
  softverbs::testkit::QpShape shape;
  shape.max_send_wr = static_cast<uint32_t>(sq_depth);
  shape.max_recv_wr = static_cast<uint32_t>(rq_depth);
  ibv_qp_init_attr a = softverbs::testkit::qp_init_attr(shape, e.scq.get(), e.rcq.get());
  e.qp.reset(ibv_create_qp(e.pd.get(), &a));
  CHECK(e.qp, "ibv_create_qp: %s", std::strerror(errno));
  // GID index 1: the IPv4-mapped RoCEv2 GID of the device's address.
  CHECK(ibv_query_gid(e.ctx.get(), 1, 1, &e.gid) == 0, "ibv_query_gid: %s", std::strerror(errno));
}

ibv_mr* reg(Endpoint& e, void* p, size_t n, int access) {
  ibv_mr* mr = ibv_reg_mr(e.pd.get(), p, n, access);
  CHECK(mr, "ibv_reg_mr(%zu bytes): %s", n, std::strerror(errno));
  e.mrs.emplace_back(mr);
  return mr;
}

softverbs::testkit::QpPath rc_path(uint8_t timeout) {
  softverbs::testkit::QpPath p;
  p.timeout = timeout;
  p.max_rd_atomic = p.max_dest_rd_atomic = 16;
  return p;
}

void connect_qp(Endpoint& e, const Hello& mine, const Hello& peer, softverbs::testkit::QpPath p) {
  p.rq_psn = peer.psn;
  p.sq_psn = mine.psn;
  ibv_gid dgid{};
  std::memcpy(dgid.raw, peer.gid, 16);
  const softverbs::testkit::Connected r =
      softverbs::testkit::connect_qp(e.qp.get(), peer.qpn, softverbs::testkit::ah_to_gid(dgid), p);
  CHECK(r, "modify %s: %s", r.step, std::strerror(r.rc));
}

void post_receive(Endpoint& e, uint64_t wr_id, uintptr_t addr, uint32_t len, uint32_t lkey) {
  ibv_sge sge{addr, len, lkey};
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  CHECK(ibv_post_recv(e.qp.get(), &wr, &bad) == 0, "ibv_post_recv: %s", std::strerror(errno));
}

Hello exchange(int fd, const Hello& mine) {
  write_all(fd, &mine, sizeof mine);
  Hello peer;
  CHECK(read_all(fd, &peer, sizeof peer, Clock::now() + std::chrono::seconds(30), "hello"),
        "the peer closed the control socket before its hello");
  CHECK(peer.magic == mine.magic, "bad hello magic 0x%08x", peer.magic);
  return peer;
}

void wait_for_events(Endpoint& e, int ctl_fd, int timeout_ms) {
  pollfd pfd[2] = {{e.channel->fd, POLLIN, 0}, {ctl_fd, POLLIN, 0}};
  int rc = ::poll(pfd, ctl_fd >= 0 ? 2 : 1, timeout_ms);
  CHECK(rc >= 0 || errno == EINTR, "poll: %s", std::strerror(errno));
  if (rc > 0 && (pfd[0].revents & POLLIN)) {
    ibv_cq* cq = nullptr;
    void* cq_ctx = nullptr;
    while (ibv_get_cq_event(e.channel.get(), &cq, &cq_ctx) == 0) ibv_ack_cq_events(cq, 1);
  }
}

void arm(Endpoint& e) {
  CHECK(ibv_req_notify_cq(e.scq.get(), 0) == 0 && ibv_req_notify_cq(e.rcq.get(), 0) == 0, "ibv_req_notify_cq: %s",
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

ibv_qp_state qp_state(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  CHECK(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) == 0, "ibv_query_qp: %s", std::strerror(errno));
  return a.qp_state;
}

}  // namespace soak_peer
