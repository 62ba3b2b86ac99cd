#include "conformance.hpp"

#include <arpa/inet.h>
#include <fcntl.h>

#include <algorithm>
#include <climits>
#include <iterator>

namespace conformance {

const std::vector<std::string>& device_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    const softverbs::testkit::DeviceList list;
    for (int i = 0; i < list.size() && list[i]; ++i) out.push_back(list.name(i));
    return out;
  }();
  return names;
}

std::string device_param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string out = info.param;
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!ok) c = '_';
  }
  return out.empty() ? "unnamed" : out;
}

void observe(const std::string& key, const std::string& value) {
  const int saved_errno = errno;
  const std::string name = "observed." + key;
  std::string merged = value;
  if (const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
    const ::testing::TestResult* result = info->result();
    for (int i = 0; i < result->test_property_count(); ++i) {
      const ::testing::TestProperty& p = result->GetTestProperty(i);
      if (name != p.key()) continue;
      // The values seen so far, ", "-separated; add this one if it is new.
      const std::string old = p.value();
      bool seen = false;
      for (size_t start = 0; start <= old.size();) {
        size_t end = old.find(", ", start);
        if (end == std::string::npos) end = old.size();
        if (old.compare(start, end - start, value) == 0) seen = true;
        start = end + 2;
      }
      merged = seen ? old : old + ", " + value;
    }
  }
  ::testing::Test::RecordProperty(name, merged);
  errno = saved_errno;
}

std::string errno_name(int e) {
  if (e == 0) return "0";
  if (e < 0 && e != INT_MIN) return "-" + errno_name(-e);
  const char* name = strerrorname_np(e);
  return name ? name : std::to_string(e);
}

std::string outcome(const void* object) {
  const int e = errno;
  return object ? "ok" : errno_name(e);
}

int set_nonblocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return -1;
  int next = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, next) < 0) return -1;
  return flags;
}

bool gid_is_ipv4_mapped(const ibv_gid& gid) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, prefix, sizeof prefix) == 0;
}

bool gid_is_zero(const ibv_gid& gid) {
  return std::all_of(std::begin(gid.raw), std::end(gid.raw), [](uint8_t b) { return b == 0; });
}

std::string qp_mask_names(uint32_t mask) {
  static const char* const names[] = {"STATE",
                                      "CUR_STATE",
                                      "EN_SQD_ASYNC_NOTIFY",
                                      "ACCESS_FLAGS",
                                      "PKEY_INDEX",
                                      "PORT",
                                      "QKEY",
                                      "AV",
                                      "PATH_MTU",
                                      "TIMEOUT",
                                      "RETRY_CNT",
                                      "RNR_RETRY",
                                      "RQ_PSN",
                                      "MAX_QP_RD_ATOMIC",
                                      "ALT_PATH",
                                      "MIN_RNR_TIMER",
                                      "SQ_PSN",
                                      "MAX_DEST_RD_ATOMIC",
                                      "PATH_MIG_STATE",
                                      "CAP",
                                      "DEST_QPN"};
  std::string out;
  for (unsigned bit = 0; bit < 32; ++bit) {
    if (!(mask & (1u << bit))) continue;
    if (!out.empty()) out += '|';
    out += bit < std::size(names) ? names[bit] : "bit" + std::to_string(bit);
  }
  return out.empty() ? "0" : out;
}

// ---------------------------------------------------------------------------
// The IBTA modify-QP table (IBTA Vol 1 11.2.5.2; Linux qp_state_table).

TransitionRule transition_rule(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next) {
  const bool rc = type == IBV_QPT_RC;
  const bool uc = type == IBV_QPT_UC;
  const bool ud = type == IBV_QPT_UD;
  TransitionRule r;
  auto valid = [&r](uint32_t req, uint32_t opt) {
    r.valid = true;
    r.required = req;
    r.optional = opt;
    return r;
  };
  // Any state -> RESET and any state but RESET -> ERR need no attribute. RESET
  // -> ERR is not a transition of the table.
  if (next == IBV_QPS_RESET) return valid(0, 0);
  if (next == IBV_QPS_ERR) return cur == IBV_QPS_RESET ? r : valid(0, 0);

  constexpr uint32_t kConnInit = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  constexpr uint32_t kUdInit = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
  switch (cur) {
    case IBV_QPS_RESET:
      if (next == IBV_QPS_INIT) return valid(ud ? kUdInit : kConnInit, 0);
      return r;
    case IBV_QPS_INIT:
      if (next == IBV_QPS_INIT) return valid(0, ud ? kUdInit : kConnInit);
      if (next == IBV_QPS_RTR) {
        if (ud) return valid(0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY);
        uint32_t req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
        if (rc) req |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        return valid(req, IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX);
      }
      return r;
    case IBV_QPS_RTR:
      if (next == IBV_QPS_RTS) {
        if (ud) return valid(IBV_QP_SQ_PSN, IBV_QP_CUR_STATE | IBV_QP_QKEY);
        const uint32_t opt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE;
        if (uc) return valid(IBV_QP_SQ_PSN, opt);
        return valid(IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
                     opt | IBV_QP_MIN_RNR_TIMER);
      }
      return r;
    case IBV_QPS_RTS:
    case IBV_QPS_SQD:
      if (next == IBV_QPS_RTS) {
        if (ud) return valid(0, IBV_QP_CUR_STATE | IBV_QP_QKEY);
        const uint32_t opt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE;
        return valid(0, rc ? opt | IBV_QP_MIN_RNR_TIMER : opt);
      }
      if (next == IBV_QPS_SQD) {
        if (cur == IBV_QPS_RTS) return valid(0, IBV_QP_EN_SQD_ASYNC_NOTIFY);
        // SQD -> SQD: the path may be changed while drained.
        if (ud) return valid(0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY);
        if (uc)
          return valid(0,
                       IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PATH_MIG_STATE);
        return valid(0, IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                            IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ALT_PATH |
                            IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE);
      }
      return r;
    case IBV_QPS_SQE:
      // SQE is entered only on a send error of an unreliable service; its row
      // back to RTS lists attributes for UC and UD only.
      if (next == IBV_QPS_RTS) {
        if (ud) return valid(0, IBV_QP_CUR_STATE | IBV_QP_QKEY);
        if (uc) return valid(0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS);
        return valid(0, 0);
      }
      return r;
    default:
      return r;
  }
}

// ---------------------------------------------------------------------------
// Fixture

void VerbsTest::SetUp() {
  int num = 0;
  list_ = ibv_get_device_list(&num);
  ASSERT_NE(list_, nullptr) << "ibv_get_device_list: " << std::strerror(errno);
  for (int i = 0; i < num; ++i)
    if (GetParam() == ibv_get_device_name(list_[i])) device_ = list_[i];
  ASSERT_NE(device_, nullptr) << "device " << GetParam() << " is no longer listed";
  ctx_ = ibv_open_device(device_);
  ASSERT_NE(ctx_, nullptr) << "ibv_open_device: " << std::strerror(errno);
  ASSERT_EQ(ibv_query_device(ctx_, &dattr_), 0);
  ASSERT_EQ(ibv_query_port(ctx_, kPort, &pattr_), 0);
  pd_ = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd_, nullptr) << "ibv_alloc_pd: " << std::strerror(errno);

  for (int i = 0; i < pattr_.gid_tbl_len; ++i) {
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(ctx_, kPort, static_cast<uint32_t>(i), &e, 0) != 0) continue;
    if (sgid_index_ < 0) {
      sgid_index_ = i;
      sgid_ = e.gid;
    }
    if (ipv4_gid_index_ < 0 && e.gid_type == IBV_GID_TYPE_ROCE_V2 && gid_is_ipv4_mapped(e.gid)) {
      ipv4_gid_index_ = i;
      ipv4_gid_ = e.gid;
    }
  }
  if (ipv4_gid_index_ >= 0) {
    sgid_index_ = ipv4_gid_index_;
    sgid_ = ipv4_gid_;
  }
}

void VerbsTest::TearDown() {
  if (pd_) {
    int rc = ibv_dealloc_pd(pd_);
    // A test that failed half-way may have left objects on the PD.
    if (!HasFailure()) {
      EXPECT_EQ(rc, 0) << "a test left objects on the fixture's PD";
    }
  }
  if (ctx_) {
    EXPECT_EQ(ibv_close_device(ctx_), 0);
  }
  if (list_) ibv_free_device_list(list_);
}

Cq VerbsTest::make_cq(int cqe, ibv_comp_channel* channel, void* cq_context) {
  ibv_cq* cq = ibv_create_cq(ctx_, cqe, cq_context, channel, 0);
  if (!cq) {
    ADD_FAILURE() << "ibv_create_cq(" << cqe << "): " << std::strerror(errno);
  }
  return Cq(cq);
}

ibv_qp_init_attr VerbsTest::qp_init_attr(ibv_qp_type type, ibv_cq* cq, ibv_srq* srq) const {
  ibv_qp_init_attr a{};
  a.qp_type = type;
  a.send_cq = cq;
  a.recv_cq = cq;
  a.srq = srq;
  a.cap.max_send_wr = 4;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_wr = srq ? 0 : 4;
  a.cap.max_recv_sge = srq ? 0 : 1;
  a.cap.max_inline_data = 0;
  a.sq_sig_all = 0;
  return a;
}

Qp VerbsTest::make_qp(ibv_qp_type type, ibv_cq* cq, ibv_srq* srq) { return make_qp(qp_init_attr(type, cq, srq)); }

Qp VerbsTest::make_qp(ibv_qp_init_attr attr) {
  ibv_qp* qp = ibv_create_qp(pd_, &attr);
  if (!qp) {
    ADD_FAILURE() << "ibv_create_qp(" << qp_type_name(attr.qp_type) << "): " << std::strerror(errno);
  }
  return Qp(qp);
}

ibv_ah_attr VerbsTest::loopback_ah_attr() const {
  ibv_ah_attr a{};
  a.port_num = kPort;
  a.sl = 0;
  a.static_rate = 0;
  a.src_path_bits = 0;
  if (is_ethernet()) {
    a.is_global = 1;
    a.grh.dgid = sgid_;
    a.grh.sgid_index = static_cast<uint8_t>(sgid_index_ < 0 ? 0 : sgid_index_);
    a.grh.hop_limit = 64;
    a.grh.traffic_class = 0;
    a.grh.flow_label = 0;
  } else {
    a.is_global = 0;
    a.dlid = pattr_.lid;
  }
  return a;
}

ibv_qp_attr VerbsTest::valid_attr(const ibv_qp* qp, ibv_qp_state cur, ibv_qp_state next) const {
  ibv_qp_attr a{};
  a.qp_state = next;
  a.cur_qp_state = cur;
  a.path_mtu = pattr_.active_mtu;
  a.path_mig_state = IBV_MIG_MIGRATED;
  a.qkey = 0x11111111;
  a.rq_psn = 0x123456;
  a.sq_psn = 0x654321;
  a.dest_qp_num = qp->qp_num;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  a.ah_attr = loopback_ah_attr();
  a.alt_ah_attr = loopback_ah_attr();
  a.pkey_index = 0;
  a.alt_pkey_index = 0;
  a.en_sqd_async_notify = 0;
  a.max_rd_atomic = static_cast<uint8_t>(std::min(dattr_.max_qp_init_rd_atom, 1));
  a.max_dest_rd_atomic = static_cast<uint8_t>(std::min(dattr_.max_qp_rd_atom, 1));
  a.min_rnr_timer = 12;
  a.port_num = kPort;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.alt_port_num = kPort;
  a.alt_timeout = 14;
  return a;
}

int VerbsTest::modify_min(ibv_qp* qp, ibv_qp_state next) {
  const ibv_qp_state cur = qp->state;
  ibv_qp_attr a = valid_attr(qp, cur, next);
  const uint32_t mask = IBV_QP_STATE | transition_rule(qp->qp_type, cur, next).required;
  return ibv_modify_qp(qp, &a, static_cast<int>(mask));
}

int VerbsTest::move_to(ibv_qp* qp, ibv_qp_state target) {
  static const ibv_qp_state path[] = {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD};
  if (target == IBV_QPS_RESET) return 0;
  if (target == IBV_QPS_SQE) {
    ADD_FAILURE() << "SQE cannot be entered through ibv_modify_qp";
    return EINVAL;
  }
  if (target == IBV_QPS_ERR) {
    if (int rc = modify_min(qp, IBV_QPS_INIT)) return rc;
    return modify_min(qp, IBV_QPS_ERR);
  }
  for (ibv_qp_state s : path) {
    if (int rc = modify_min(qp, s)) return rc;
    if (s == target) break;
  }
  return 0;
}

void VerbsTest::expect_state(ibv_qp* qp, ibv_qp_state expected) {
  EXPECT_EQ(qp->state, expected) << "qp->state is " << qp_state_name(qp->state) << ", expected "
                                 << qp_state_name(expected);
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(qp, &a, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(a.qp_state, expected) << "ibv_query_qp reports " << qp_state_name(a.qp_state) << ", expected "
                                  << qp_state_name(expected);
}

void VerbsCqTest::SetUp() {
  VerbsTest::SetUp();
  if (IsSkipped() || HasFatalFailure()) return;
  cq_ = make_cq(64);
  ASSERT_TRUE(cq_);
}

void VerbsCqTest::TearDown() {
  cq_.reset();
  VerbsTest::TearDown();
}

}  // namespace conformance
