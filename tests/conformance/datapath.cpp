#include "datapath.hpp"

#include <arpa/inet.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "tests/support/connect.hpp"

namespace conformance {

// ---------------------------------------------------------------------------
// Buffers

Buffer::Buffer(size_t size) : size_(size) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  mapped_ = std::max(page, (size + page - 1) / page * page);
  void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    ADD_FAILURE() << "mmap(" << mapped_ << "): " << std::strerror(errno);
    mapped_ = 0;
    size_ = 0;
    return;
  }
  p_ = static_cast<uint8_t*>(p);
}

Buffer::Buffer(Buffer&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)), size_(std::exchange(o.size_, 0)), mapped_(std::exchange(o.mapped_, 0)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (p_) ::munmap(p_, mapped_);
    p_ = std::exchange(o.p_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

Buffer::~Buffer() {
  if (p_) ::munmap(p_, mapped_);
}

uint8_t pattern_byte(size_t i, uint32_t seed) {
  // Not periodic in any power of two up to 2^16, so misplaced MTU-sized chunks
  // or SGEs are caught.
  const uint64_t x = (static_cast<uint64_t>(i) + 1) * 0x9e3779b97f4a7c15ull + seed * 0x632be59bd9b4e019ull;
  return static_cast<uint8_t>((x >> 29) ^ (x >> 47) ^ (i >> 16));
}

void fill_pattern(uint8_t* p, size_t len, uint32_t seed) {
  for (size_t i = 0; i < len; ++i) p[i] = pattern_byte(i, seed);
}

long long first_pattern_mismatch(const uint8_t* p, size_t len, uint32_t seed) {
  for (size_t i = 0; i < len; ++i)
    if (p[i] != pattern_byte(i, seed)) return static_cast<long long>(i);
  return -1;
}

long long first_byte_not(const uint8_t* p, size_t len, uint8_t value) {
  for (size_t i = 0; i < len; ++i)
    if (p[i] != value) return static_cast<long long>(i);
  return -1;
}

ibv_sge Region::sge(size_t offset, uint32_t length) const {
  ibv_sge s{};
  s.addr = addr(offset);
  s.length = length;
  s.lkey = lkey();
  return s;
}

ibv_send_wr send_wr(uint64_t wr_id, ibv_wr_opcode opcode, ibv_sge* sge, int num_sge, unsigned flags) {
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = opcode;
  wr.sg_list = sge;
  wr.num_sge = num_sge;
  wr.send_flags = flags;
  return wr;
}

// ---------------------------------------------------------------------------
// Completions

using softverbs::testkit::wc_opcode_name;

std::string describe(const ibv_wc& wc) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "{wr_id=%llu status=%s(%d) opcode=%s(%d) byte_len=%u wc_flags=0x%x imm_data=0x%08x qp_num=0x%x}",
                static_cast<unsigned long long>(wc.wr_id), ibv_wc_status_str(wc.status), wc.status,
                wc_opcode_name(wc.opcode), wc.opcode, wc.byte_len, wc.wc_flags, ntohl(wc.imm_data), wc.qp_num);
  return buf;
}

void check_wc(const ibv_wc& wc, const WcExpect& e) {
  SCOPED_TRACE("completion " + describe(wc));
  EXPECT_EQ(wc.wr_id, e.wr_id) << "wr_id";
  EXPECT_EQ(wc.status, e.status) << "status: got " << ibv_wc_status_str(wc.status) << ", expected "
                                 << ibv_wc_status_str(e.status);
  EXPECT_EQ(wc.qp_num, e.qp_num) << "qp_num";
  if (e.status != IBV_WC_SUCCESS || wc.status != IBV_WC_SUCCESS) return;
  EXPECT_EQ(wc.opcode, e.opcode) << "opcode: got " << wc_opcode_name(wc.opcode) << ", expected "
                                 << wc_opcode_name(e.opcode);
  if (e.byte_len) {
    EXPECT_EQ(wc.byte_len, *e.byte_len) << "byte_len";
  }
  const bool recv = (wc.opcode & IBV_WC_RECV) != 0;
  if (recv) observe("recv.IBV_WC_GRH", (wc.wc_flags & IBV_WC_GRH) ? "set" : "clear");
  const unsigned flags = recv ? (wc.wc_flags & ~static_cast<unsigned>(IBV_WC_GRH)) : wc.wc_flags;
  if (e.wc_flags) {
    EXPECT_EQ(flags, *e.wc_flags) << "wc_flags";
  }
  if (e.imm_data) {
    EXPECT_EQ(ntohl(wc.imm_data), ntohl(*e.imm_data)) << "imm_data (host order shown)";
  }
}

// ---------------------------------------------------------------------------
// Fixture

void DataPathTest::SetUp() {
  VerbsTest::SetUp();
  if (HasFatalFailure()) return;
  ASSERT_EQ(pattr_.state, IBV_PORT_ACTIVE) << "the port must be active for traffic";
  if (is_ethernet()) {
    ASSERT_GE(sgid_index_, 0) << "no GID to address the port itself";
  }
}

void DataPathTest::make_region(size_t size, unsigned access, Region* out, ibv_pd* pd) {
  out->mr.reset();
  out->buf = Buffer(size);
  ASSERT_NE(out->buf.data(), nullptr);
  ibv_mr* mr = ibv_reg_mr(pd ? pd : pd_, out->buf.data(), std::max<size_t>(size, 1), static_cast<int>(access));
  ASSERT_NE(mr, nullptr) << "ibv_reg_mr(" << size << ", 0x" << std::hex << access << "): " << std::strerror(errno);
  out->mr.reset(mr);
}

void DataPathTest::make_endpoint(const PairOptions& o, Endpoint* out) {
  out->qp.reset();
  out->scq = make_cq(o.cqe, o.channel);
  out->rcq = make_cq(o.cqe, o.channel);
  ASSERT_TRUE(out->scq && out->rcq);
  const softverbs::testkit::QpShape shape{o.type,         o.max_send_wr,     o.max_recv_wr, o.max_send_sge,
                                          o.max_recv_sge, o.max_inline_data, o.sq_sig_all};
  ibv_qp_init_attr init = softverbs::testkit::qp_init_attr(shape, out->scq.get(), out->rcq.get());
  ibv_qp* qp = nullptr;
  if (o.extended) {
    ibv_qp_init_attr_ex ex{};
    std::memcpy(&ex, &init, sizeof init);  // ibv_qp_init_attr_ex starts with ibv_qp_init_attr's fields
    ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ex.pd = pd_;
    ex.send_ops_flags = o.send_ops_flags;
    qp = ibv_create_qp_ex(ctx_, &ex);
    ASSERT_NE(qp, nullptr) << "ibv_create_qp_ex(" << qp_type_name(o.type) << "): " << std::strerror(errno);
    init.cap = ex.cap;
  } else {
    qp = ibv_create_qp(pd_, &init);
    ASSERT_NE(qp, nullptr) << "ibv_create_qp(" << qp_type_name(o.type) << "): " << std::strerror(errno);
  }
  out->qp.reset(qp);
  out->cap = init.cap;
  if (o.extended) {
    out->qpx = ibv_qp_to_qp_ex(qp);
    ASSERT_NE(out->qpx, nullptr);
  }
  ASSERT_GE(out->cap.max_send_wr, o.max_send_wr);
  ASSERT_GE(out->cap.max_recv_wr, o.max_recv_wr);
  ASSERT_GE(out->cap.max_send_sge, o.max_send_sge);
  ASSERT_GE(out->cap.max_recv_sge, o.max_recv_sge);
  ASSERT_GE(out->cap.max_inline_data, o.max_inline_data);
}

void DataPathTest::connect(Endpoint& ep, uint32_t remote_qpn, const PairOptions& o, bool is_a) {
  const bool rc = o.type == IBV_QPT_RC;
  int access = is_a ? o.access_a : o.access_b;
  softverbs::testkit::QpPath p;
  p.port = kPort;
  p.access = access >= 0 ? static_cast<unsigned>(access)
                         : (rc ? softverbs::testkit::kRemoteAll : unsigned{IBV_ACCESS_REMOTE_WRITE});
  p.path_mtu = o.path_mtu ? o.path_mtu : active_mtu();
  p.rq_psn = is_a ? o.psn_b : o.psn_a;
  p.sq_psn = is_a ? o.psn_a : o.psn_b;
  p.max_dest_rd_atomic = static_cast<uint8_t>(std::clamp(dattr_.max_qp_rd_atom, 1, 16));
  p.min_rnr_timer = o.min_rnr_timer;
  p.timeout = o.timeout;
  p.retry_cnt = o.retry_cnt;
  p.rnr_retry = o.rnr_retry;
  p.max_rd_atomic = static_cast<uint8_t>(std::clamp(dattr_.max_qp_init_rd_atom, 1, 16));
  const softverbs::testkit::Connected r =
      softverbs::testkit::connect_qp(ep.qp.get(), remote_qpn, loopback_ah_attr(), p);
  ASSERT_EQ(r.rc, 0) << r.step;
}

void DataPathTest::make_pair(const PairOptions& o, Pair* out) {
  ASSERT_NO_FATAL_FAILURE(make_endpoint(o, &out->a));
  ASSERT_NO_FATAL_FAILURE(make_endpoint(o, &out->b));
  ASSERT_NO_FATAL_FAILURE(connect(out->a, out->b.qpn(), o, true));
  ASSERT_NO_FATAL_FAILURE(connect(out->b, out->a.qpn(), o, false));
}

void DataPathTest::post_send_ok(ibv_qp* qp, ibv_send_wr* wr) {
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(qp, wr, &bad);
  ASSERT_EQ(rc, 0) << "ibv_post_send: " << std::strerror(rc) << " (wr_id " << (bad ? bad->wr_id : 0) << ")";
}

void DataPathTest::post_recv_ok(ibv_qp* qp, ibv_recv_wr* wr) {
  ibv_recv_wr* bad = nullptr;
  const int rc = ibv_post_recv(qp, wr, &bad);
  ASSERT_EQ(rc, 0) << "ibv_post_recv: " << std::strerror(rc) << " (wr_id " << (bad ? bad->wr_id : 0) << ")";
}

void DataPathTest::post_recv_ok(ibv_qp* qp, uint64_t wr_id, const ibv_sge* sges, int num_sge) {
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = const_cast<ibv_sge*>(sges);
  wr.num_sge = num_sge;
  post_recv_ok(qp, &wr);
}

std::vector<ibv_wc> DataPathTest::expect_wcs(ibv_cq* cq, int n, int timeout_ms) {
  std::vector<ibv_wc> wc = poll_completions(cq, n, timeout_ms);
  EXPECT_EQ(static_cast<int>(wc.size()), n) << "completions within " << timeout_ms << " ms";
  for (size_t i = 0; i < wc.size() && static_cast<int>(wc.size()) != n; ++i) ADD_FAILURE() << "got " << describe(wc[i]);
  return wc;
}

void DataPathTest::expect_no_wc(ibv_cq* cq, int quiet_ms) {
  std::vector<ibv_wc> wc = poll_completions(cq, 1, quiet_ms);
  for (const ibv_wc& w : wc) ADD_FAILURE() << "unexpected completion " << describe(w);
}

ibv_qp_state DataPathTest::query_state(ibv_qp* qp) {
  const ibv_qp_state st = softverbs::testkit::query_state(qp);
  EXPECT_NE(static_cast<int>(st), -1) << "ibv_query_qp";
  return st;
}

std::optional<ibv_async_event> DataPathTest::next_async_event(int timeout_ms) {
  if (!wait_readable(ctx_->async_fd, timeout_ms)) return std::nullopt;
  ibv_async_event ev{};
  if (ibv_get_async_event(ctx_, &ev) != 0) {
    ADD_FAILURE() << "ibv_get_async_event: " << std::strerror(errno);
    return std::nullopt;
  }
  ibv_async_event copy = ev;
  ibv_ack_async_event(&ev);
  return copy;
}

namespace {

std::string event_list(std::initializer_list<ibv_event_type> types) {
  std::string s;
  for (ibv_event_type t : types) {
    if (!s.empty()) s += " or ";
    s += ibv_event_type_str(t);
  }
  return s;
}

bool is_qp_event(ibv_event_type t) {
  switch (t) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return true;
    default:
      return false;
  }
}

}  // namespace

void DataPathTest::expect_qp_async_event(ibv_qp* qp, std::initializer_list<ibv_event_type> types) {
  std::optional<ibv_async_event> ev = next_async_event();
  observe("async_event", ev ? ibv_event_type_str(ev->event_type) : "none");
  ASSERT_TRUE(ev.has_value()) << "no async event within " << kEventTimeoutMs << " ms; expected " << event_list(types)
                              << " for QP 0x" << std::hex << qp->qp_num;
  EXPECT_NE(std::find(types.begin(), types.end(), ev->event_type), types.end())
      << "async event " << ibv_event_type_str(ev->event_type) << ", expected " << event_list(types);
  if (is_qp_event(ev->event_type)) {
    EXPECT_EQ(ev->element.qp, qp) << "the event names another QP";
  }
  expect_no_async_event(0);
}

void DataPathTest::allow_qp_async_event(ibv_qp* qp, std::initializer_list<ibv_event_type> types) {
  std::optional<ibv_async_event> ev = next_async_event(kQuietMs);
  observe("async_event", ev ? ibv_event_type_str(ev->event_type) : "none");
  if (!ev) return;
  EXPECT_NE(std::find(types.begin(), types.end(), ev->event_type), types.end())
      << "async event " << ibv_event_type_str(ev->event_type) << ", expected none or " << event_list(types);
  if (is_qp_event(ev->event_type)) {
    EXPECT_EQ(ev->element.qp, qp) << "the event names another QP";
  }
  expect_no_async_event(0);
}

void DataPathTest::expect_no_async_event(int quiet_ms) {
  std::optional<ibv_async_event> ev = next_async_event(quiet_ms);
  if (ev) {
    ADD_FAILURE() << "unexpected async event " << ibv_event_type_str(ev->event_type);
  }
}

uint32_t DataPathTest::usable_sges(ibv_qp_type type, bool send, uint32_t want) {
  Cq cq = make_cq(4);
  if (!cq) return 1;
  for (uint32_t n = want; n > 1; --n) {
    ibv_qp_init_attr init{};
    init.qp_type = type;
    init.send_cq = cq.get();
    init.recv_cq = cq.get();
    init.cap.max_send_wr = 4;
    init.cap.max_recv_wr = 4;
    init.cap.max_send_sge = send ? n : 1;
    init.cap.max_recv_sge = send ? 1 : n;
    ibv_qp* qp = ibv_create_qp(pd_, &init);
    if (qp) {
      EXPECT_EQ(ibv_destroy_qp(qp), 0);
      return n;
    }
  }
  return 1;
}

}  // namespace conformance
