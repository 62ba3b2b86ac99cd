// Data-path conformance suite: shared fixture and helpers.
//
// Two QPs of the device under test are connected to each other (A <-> B) on
// the same port, addressing each other through the port's own GID (Ethernet)
// or LID (InfiniBand), as a loopback connection on a real adapter. Tests drive
// traffic between them and check every completion field the verbs API defines
// for the operation, and the memory the operation touched. Only the public
// verbs API is used; every wait is bounded.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "conformance.hpp"

namespace conformance {

// How long a completion that must come is waited for.
inline constexpr int kCompletionTimeoutMs = 5000;
// How long a test watches for something that must NOT happen (a completion, an
// event). Everything here is generated synchronously with the traffic that
// causes it, so the window only has to cover delivery latency.
inline constexpr int kQuietMs = 100;

// Page-aligned, zero-filled host memory (not registered).
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t size);
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  ~Buffer();

  uint8_t* data() const { return p_; }
  size_t size() const { return size_; }
  uintptr_t addr(size_t offset = 0) const { return reinterpret_cast<uintptr_t>(p_) + offset; }
  uint8_t& operator[](size_t i) const { return p_[i]; }

 private:
  uint8_t* p_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
};

// Fills [offset, offset+len) with a pattern that differs per seed and per byte.
void fill_pattern(uint8_t* p, size_t len, uint32_t seed);
uint8_t pattern_byte(size_t i, uint32_t seed);
// Index of the first byte of p[0..len) that differs from the pattern, or -1.
long long first_pattern_mismatch(const uint8_t* p, size_t len, uint32_t seed);
// Index of the first byte of p[0..len) that is not `value`, or -1.
long long first_byte_not(const uint8_t* p, size_t len, uint8_t value);

// A buffer and its registration.
struct Region {
  Buffer buf;
  Mr mr;

  uint8_t* data() const { return buf.data(); }
  size_t size() const { return buf.size(); }
  uintptr_t addr(size_t offset = 0) const { return buf.addr(offset); }
  uint32_t lkey() const { return mr->lkey; }
  uint32_t rkey() const { return mr->rkey; }
  ibv_sge sge(size_t offset, uint32_t length) const;
};

inline constexpr unsigned kAllAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// One side of a connection: a QP with its own send and receive CQs.
struct Endpoint {
  Cq scq;
  Cq rcq;
  Qp qp;
  ibv_qp_cap cap{};  // what the QP actually got
  ibv_qp_ex* qpx = nullptr;  // PairOptions::extended: ibv_qp_to_qp_ex(qp)

  uint32_t qpn() const { return qp->qp_num; }
  // Destroys the QP before its CQs.
  void reset() {
    qp.reset();
    rcq.reset();
    scq.reset();
  }
};

struct PairOptions {
  ibv_qp_type type = IBV_QPT_RC;
  uint32_t max_send_wr = 64;
  uint32_t max_recv_wr = 64;
  uint32_t max_send_sge = 1;
  uint32_t max_recv_sge = 1;
  uint32_t max_inline_data = 0;
  int sq_sig_all = 0;
  int cqe = 256;
  // 0: the port's active MTU.
  ibv_mtu path_mtu = static_cast<ibv_mtu>(0);
  // Remote access each QP grants its peer; -1: everything the service allows.
  int access_a = -1;
  int access_b = -1;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 12;  // 0.64 ms
  uint8_t retry_cnt = 7;
  uint8_t timeout = 14;
  uint32_t psn_a = 0x10000;  // A's first send PSN (B's expected receive PSN)
  uint32_t psn_b = 0x20000;
  // Completion channel for B's receive CQ (and A's, for symmetry), if any.
  ibv_comp_channel* channel = nullptr;
  // Create the QPs with ibv_create_qp_ex and these IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
  // (the ibv_wr_* API).
  bool extended = false;
  uint64_t send_ops_flags = 0;
};

struct Pair {
  Endpoint a;
  Endpoint b;

  void reset() {
    a.reset();
    b.reset();
  }
};

// The expected content of one completion. For an error status only the fields
// the verbs API defines for it are checked: wr_id, status and qp_num.
struct WcExpect {
  // A successful completion.
  WcExpect(uint64_t id, ibv_wc_opcode op, uint32_t qpn) : wr_id(id), opcode(op), qp_num(qpn) {}
  // A completion in error.
  static WcExpect error(uint64_t id, ibv_wc_status st, uint32_t qpn) {
    WcExpect e(id, IBV_WC_SEND, qpn);
    e.status = st;
    return e;
  }
  WcExpect& len(uint32_t n) {
    byte_len = n;
    return *this;
  }
  WcExpect& flags(unsigned f) {
    wc_flags = f;
    return *this;
  }
  WcExpect& imm(uint32_t network_order) {
    imm_data = network_order;
    return *this;
  }

  uint64_t wr_id = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;
  ibv_wc_opcode opcode = IBV_WC_SEND;
  uint32_t qp_num = 0;
  std::optional<uint32_t> byte_len;
  // Exact wc_flags, ignoring IBV_WC_GRH on receive completions of connected
  // services (on RoCE every packet carries a GRH; adapters differ in whether
  // they report it for RC/UC, and it means nothing there).
  std::optional<unsigned> wc_flags;
  std::optional<uint32_t> imm_data;  // network order, as posted
};

std::string describe(const ibv_wc& wc);
void check_wc(const ibv_wc& wc, const WcExpect& e);

class DataPathTest : public VerbsTest {
 protected:
  void SetUp() override;

  ibv_mtu active_mtu() const { return pattr_.active_mtu; }
  static uint32_t mtu_bytes(ibv_mtu m) { return 128u << static_cast<unsigned>(m); }

  // A page-aligned buffer of `size` bytes registered on `pd` (the fixture's by
  // default) with `access`.
  void make_region(size_t size, unsigned access, Region* out, ibv_pd* pd = nullptr);

  // Creates A and B and connects them RESET-INIT-RTR-RTS.
  void make_pair(const PairOptions& o, Pair* out);
  // Creates one endpoint (QP in RESET) with the given options.
  void make_endpoint(const PairOptions& o, Endpoint* out);
  // Connects an endpoint in RESET to a peer QP number.
  void connect(Endpoint& ep, uint32_t remote_qpn, const PairOptions& o, bool is_a);

  // Posts and checks that the post is accepted.
  void post_send_ok(ibv_qp* qp, ibv_send_wr* wr);
  void post_recv_ok(ibv_qp* qp, ibv_recv_wr* wr);
  void post_recv_ok(ibv_qp* qp, uint64_t wr_id, const ibv_sge* sges, int num_sge);

  // Collects exactly n completions within timeout_ms (fails the test otherwise).
  std::vector<ibv_wc> expect_wcs(ibv_cq* cq, int n, int timeout_ms = kCompletionTimeoutMs);
  // Expects no completion on cq within quiet_ms.
  void expect_no_wc(ibv_cq* cq, int quiet_ms = kQuietMs);

  ibv_qp_state query_state(ibv_qp* qp);

  // The next async event within timeout_ms (acknowledged), if any.
  std::optional<ibv_async_event> next_async_event(int timeout_ms = kEventTimeoutMs);
  // Expects one of `types` for qp within the timeout, and no second event
  // queued behind it.
  void expect_qp_async_event(ibv_qp* qp, std::initializer_list<ibv_event_type> types);
  // Accepts no event, or one event of `types` for qp (vendor dependent).
  void allow_qp_async_event(ibv_qp* qp, std::initializer_list<ibv_event_type> types);
  // Expects no async event within quiet_ms.
  void expect_no_async_event(int quiet_ms = kQuietMs);

  // Largest number of SGEs (<= want) the device accepts for this QP type on
  // the given queue, found by creating QPs.
  uint32_t usable_sges(ibv_qp_type type, bool send, uint32_t want);
};

// A send work request with one SGE (or none if sge is null).
ibv_send_wr send_wr(uint64_t wr_id, ibv_wr_opcode opcode, ibv_sge* sge, int num_sge,
                    unsigned flags = IBV_SEND_SIGNALED);

}  // namespace conformance
