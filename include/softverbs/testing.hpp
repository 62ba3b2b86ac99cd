// softverbs for GoogleTest suites of your own RDMA code: emulated devices asked
// for in the test, a fault scenario for one scope, a connected RC or UD pair in
// one call, and completion expectations that wait with a deadline.
//
//   softverbs::testing::Devices devices(2, "eth");
//   auto pair = softverbs::testing::connect_rc(devices[0], devices[1]);
//   softverbs::testing::post_write(pair.a, 64);   // to pair.b's buffer
//   EXPECT_COMPLETION(pair.a.cq, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE);
//
// Header-only, on the public verbs API, <softverbs/faults.hpp> and GoogleTest; a
// test links softverbs' libibverbs.so.1 (softverbs::softverbs) and runs through
// the launcher (softverbs_add_test). docs/testing-your-code.md is the guide.
#pragma once

#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <softverbs/faults.hpp>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace softverbs::testing {

// A fault scenario for one scope: loaded by the constructor (a malformed one
// throws softverbs::ScenarioError with the reason), every rule cleared by the
// destructor (docs/faults.md).
using Scenario = ::softverbs::Scenario;

// How long EXPECT_COMPLETION and ASSERT_COMPLETION wait when not told.
inline constexpr std::chrono::milliseconds kCompletionTimeout{5000};

// Destroys a verbs object with its destroy verb; owners are std::unique_ptr.
template <auto Destroy>
struct Destroyer {
  template <class T>
  void operator()(T* p) const {
    Destroy(p);
  }
};
using ContextPtr = std::unique_ptr<ibv_context, Destroyer<&ibv_close_device>>;
using PdPtr = std::unique_ptr<ibv_pd, Destroyer<&ibv_dealloc_pd>>;
using CqPtr = std::unique_ptr<ibv_cq, Destroyer<&ibv_destroy_cq>>;
using MrPtr = std::unique_ptr<ibv_mr, Destroyer<&ibv_dereg_mr>>;
using QpPtr = std::unique_ptr<ibv_qp, Destroyer<&ibv_destroy_qp>>;
using AhPtr = std::unique_ptr<ibv_ah, Destroyer<&ibv_destroy_ah>>;

// The devices of this process are not the ones a Devices object asked for.
class DevicesError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One opened device.
struct Device {
  std::string name;
  ContextPtr context;
  bool ethernet = true;  // RoCEv2 (GID index 1 addresses it) or InfiniBand (its LID does)
  ibv_context* get() const { return context.get(); }
};

// N emulated devices emu0..emu{N-1} with one link layer ("eth" or "ib"), opened.
//
// softverbs reads SOFTVERBS_DEVICES once per process, at the first
// ibv_get_device_list (docs/configuration.md). The constructor sets it and then
// lists the devices; if the process had listed them before with another value,
// the devices asked for are not there and it throws DevicesError saying so.
// Several Devices objects asking for the same devices, one after the other or at
// once, all work: the second finds what the first made.
class Devices {
 public:
  explicit Devices(int count, const std::string& link = "eth") {
    if (count < 1 || count > 64) throw std::invalid_argument("softverbs::testing::Devices: count must be 1..64");
    if (link != "eth" && link != "ib")
      throw std::invalid_argument("softverbs::testing::Devices: link must be \"eth\" or \"ib\", not \"" + link + "\"");
    std::string spec;
    for (int i = 0; i < count; ++i) spec += (i ? ",emu" : "emu") + std::to_string(i) + "/" + link;
    // Without effect once the process has listed its devices: checked below.
    ::setenv("SOFTVERBS_DEVICES", spec.c_str(), 1);
    open(count, link);
  }

  int size() const { return static_cast<int>(devices_.size()); }
  Device& operator[](int i) { return devices_.at(static_cast<size_t>(i)); }

 private:
  void open(int count, const std::string& link) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    std::unique_ptr<ibv_device*, Destroyer<&ibv_free_device_list>> owner(list);
    std::string found;
    for (int i = 0; list && i < n; ++i) found += std::string(found.empty() ? "" : ", ") + ibv_get_device_name(list[i]);
    for (int want = 0; want < count; ++want) {
      const std::string name = "emu" + std::to_string(want);
      ibv_device* dev = nullptr;
      for (int i = 0; list && i < n; ++i)
        if (name == ibv_get_device_name(list[i])) dev = list[i];
      Device d{name, ContextPtr(dev ? ibv_open_device(dev) : nullptr)};
      ibv_port_attr port{};
      if (d.context && ibv_query_port(d.get(), 1, &port) == 0) d.ethernet = port.link_layer == IBV_LINK_LAYER_ETHERNET;
      if (!d.context || d.ethernet != (link == "eth"))
        throw DevicesError("softverbs::testing::Devices(" + std::to_string(count) + ", \"" + link +
                           "\"): this process listed its devices before ([" + found + "]) and " + name +
                           (dev ? " is not an \"" + link + "\" device" : " is not among them") +
                           ": softverbs reads SOFTVERBS_DEVICES once per process, at the first verbs call. Create "
                           "the Devices before any verbs call, or set the devices with "
                           "softverbs_add_test(... DEVICES ...)");
      devices_.push_back(std::move(d));
    }
  }

  std::vector<Device> devices_;
};

// The attributes of a pair's queue pairs and buffers.
struct PairOptions {
  size_t buffer_size = 4096;  // registered memory of each side
  uint32_t max_wr = 16;       // send and receive queue depth, and half the CQ's
  ibv_mtu path_mtu = IBV_MTU_1024;
  uint8_t timeout = 14;    // RC local ACK timeout: 4.096 us * 2^timeout (14: 67 ms)
  uint8_t retry_cnt = 7;   // RC retries after a timeout or a NAK
  uint8_t rnr_retry = 7;   // RC retries after an RNR NAK (7: for ever)
  uint32_t qkey = 0x11111111;  // UD
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
};

// One side of a pair. Members are declared in creation order, so they are
// destroyed in the order the verbs require (AH and QP before MR and CQ, PD last).
struct Side {
  ibv_context* context = nullptr;  // not owned: the Device owns it
  PdPtr pd;
  CqPtr cq;  // send and receive completions
  std::vector<unsigned char> buffer;
  MrPtr mr;  // the whole buffer
  QpPtr qp;
  AhPtr ah;  // UD: the address of the other side
  uint32_t remote_qpn = 0;
  uint64_t remote_addr = 0;  // the other side's buffer
  uint32_t rkey = 0;         // and its key
  uint32_t qkey = 0;         // UD

  unsigned char* data() { return buffer.data(); }
};

// Two connected queue pairs: a on the first device, b on the second.
struct Pair {
  Side a;
  Side b;
};

namespace detail {

[[noreturn]] inline void fail(const std::string& what, int err) {
  throw std::system_error(err ? err : EIO, std::generic_category(), "softverbs::testing: " + what);
}

inline Side make_side(Device& dev, ibv_qp_type type, const PairOptions& o) {
  Side s;
  s.context = dev.get();
  s.pd.reset(ibv_alloc_pd(s.context));
  if (!s.pd) fail("ibv_alloc_pd on " + dev.name, errno);
  s.cq.reset(ibv_create_cq(s.context, static_cast<int>(2 * o.max_wr), nullptr, nullptr, 0));
  if (!s.cq) fail("ibv_create_cq on " + dev.name, errno);
  s.buffer.assign(o.buffer_size, 0);
  s.mr.reset(ibv_reg_mr(s.pd.get(), s.buffer.data(), s.buffer.size(), o.access));
  if (!s.mr) fail("ibv_reg_mr on " + dev.name, errno);
  ibv_qp_init_attr init{};
  init.qp_type = type;
  init.send_cq = s.cq.get();
  init.recv_cq = s.cq.get();
  init.cap.max_send_wr = o.max_wr;
  init.cap.max_recv_wr = o.max_wr;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  s.qp.reset(ibv_create_qp(s.pd.get(), &init));
  if (!s.qp) fail("ibv_create_qp on " + dev.name, errno);
  return s;
}

// The address of dev's port 1: its RoCEv2 GID (index 1, the IPv4-mapped one of an
// emulated port) on Ethernet, its LID on InfiniBand.
inline ibv_ah_attr address_of(Device& dev) {
  ibv_ah_attr ah{};
  ah.port_num = 1;
  if (dev.ethernet) {
    ah.is_global = 1;
    if (int rc = ibv_query_gid(dev.get(), 1, 1, &ah.grh.dgid)) fail("ibv_query_gid on " + dev.name, rc < 0 ? errno : rc);
    ah.grh.sgid_index = 1;
    ah.grh.hop_limit = 64;
  } else {
    ibv_port_attr port{};
    if (int rc = ibv_query_port(dev.get(), 1, &port)) fail("ibv_query_port on " + dev.name, rc);
    ah.dlid = port.lid;
  }
  return ah;
}

// RESET -> INIT -> RTR -> RTS (IBTA Vol 1 11.2.5.2: the attributes each
// transition requires), towards dest_qpn at ah for RC.
inline void bring_up(Side& s, uint32_t dest_qpn, const ibv_ah_attr& ah, const PairOptions& o) {
  const bool rc = s.qp->qp_type == IBV_QPT_RC;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (rc) {
    a.qp_access_flags = o.access & ~IBV_ACCESS_LOCAL_WRITE;
    mask |= IBV_QP_ACCESS_FLAGS;
  } else {
    a.qkey = o.qkey;
    mask |= IBV_QP_QKEY;
  }
  if (int e = ibv_modify_qp(s.qp.get(), &a, mask)) fail("RESET->INIT", e);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  mask = IBV_QP_STATE;
  if (rc) {
    a.path_mtu = o.path_mtu;
    a.dest_qp_num = dest_qpn;
    a.ah_attr = ah;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
            IBV_QP_MIN_RNR_TIMER;
  }
  if (int e = ibv_modify_qp(s.qp.get(), &a, mask)) fail("INIT->RTR", e);
  a = {};
  a.qp_state = IBV_QPS_RTS;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (rc) {
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = 4;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  if (int e = ibv_modify_qp(s.qp.get(), &a, mask)) fail("RTR->RTS", e);
}

inline Pair make_pair(Device& da, Device& db, ibv_qp_type type, const PairOptions& o) {
  Pair p{make_side(da, type, o), make_side(db, type, o)};
  const ibv_ah_attr to_a = address_of(da), to_b = address_of(db);
  bring_up(p.a, p.b.qp->qp_num, to_b, o);
  bring_up(p.b, p.a.qp->qp_num, to_a, o);
  for (auto [self, peer, to_peer] : {std::tuple{&p.a, &p.b, to_b}, std::tuple{&p.b, &p.a, to_a}}) {
    self->remote_qpn = peer->qp->qp_num;
    self->remote_addr = reinterpret_cast<uintptr_t>(peer->buffer.data());
    self->rkey = peer->mr->rkey;
    self->qkey = o.qkey;
    if (type == IBV_QPT_UD) {
      self->ah.reset(ibv_create_ah(self->pd.get(), &to_peer));
      if (!self->ah) fail("ibv_create_ah", errno);
    }
  }
  return p;
}

}  // namespace detail

// An RC queue pair on a connected to one on b, both in RTS with their own PD, CQ
// and registered buffer; each side knows the other's QPN, buffer and rkey.
inline Pair connect_rc(Device& a, Device& b, const PairOptions& options = {}) {
  return detail::make_pair(a, b, IBV_QPT_RC, options);
}

// Two UD queue pairs in RTS with one Q_Key; each side holds an address handle
// to the other. A UD receive needs 40 bytes for the GRH before the message.
inline Pair connect_ud(Device& a, Device& b, const PairOptions& options = {}) {
  return detail::make_pair(a, b, IBV_QPT_UD, options);
}

// Posting, from and to the sides' buffers. Each returns ibv_post_*'s result.

// An RDMA WRITE of length bytes of from's buffer at offset to the same offset of
// to's, signaled.
inline int post_write(Side& from, size_t length, uint64_t wr_id = 0, size_t offset = 0) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(from.data() + offset), static_cast<uint32_t>(length), from.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = from.remote_addr + offset;
  wr.wr.rdma.rkey = from.rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(from.qp.get(), &wr, &bad);
}

// A SEND of length bytes of from's buffer at offset, signaled (UD: to the other side).
inline int post_send(Side& from, size_t length, uint64_t wr_id = 0, size_t offset = 0) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(from.data() + offset), static_cast<uint32_t>(length), from.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (from.ah) {
    wr.wr.ud.ah = from.ah.get();
    wr.wr.ud.remote_qpn = from.remote_qpn;
    wr.wr.ud.remote_qkey = from.qkey;
  }
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(from.qp.get(), &wr, &bad);
}

// A receive into length bytes of to's buffer at offset.
inline int post_recv(Side& to, size_t length, uint64_t wr_id = 0, size_t offset = 0) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(to.data() + offset), static_cast<uint32_t>(length), to.mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(to.qp.get(), &wr, &bad);
}

// Completions.

inline ibv_cq* cq_of(ibv_cq* cq) { return cq; }
inline ibv_cq* cq_of(const CqPtr& cq) { return cq.get(); }
inline ibv_cq* cq_of(const Side& side) { return side.cq.get(); }

// The next completion of cq, polling until timeout; nothing if none came (or the
// poll failed). Devices complete work on their own threads, so this only polls.
template <class Cq>
std::optional<ibv_wc> poll_completion(const Cq& cq, std::chrono::milliseconds timeout = kCompletionTimeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ibv_wc wc{};
    const int n = ibv_poll_cq(cq_of(cq), 1, &wc);
    if (n == 1) return wc;
    if (n < 0 || std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::yield();
  }
}

inline std::string opcode_name(ibv_wc_opcode op) {
  switch (op) {
    case IBV_WC_SEND: return "IBV_WC_SEND";
    case IBV_WC_RDMA_WRITE: return "IBV_WC_RDMA_WRITE";
    case IBV_WC_RDMA_READ: return "IBV_WC_RDMA_READ";
    case IBV_WC_COMP_SWAP: return "IBV_WC_COMP_SWAP";
    case IBV_WC_FETCH_ADD: return "IBV_WC_FETCH_ADD";
    case IBV_WC_BIND_MW: return "IBV_WC_BIND_MW";
    case IBV_WC_LOCAL_INV: return "IBV_WC_LOCAL_INV";
    case IBV_WC_RECV: return "IBV_WC_RECV";
    case IBV_WC_RECV_RDMA_WITH_IMM: return "IBV_WC_RECV_RDMA_WITH_IMM";
    default: return "opcode " + std::to_string(static_cast<int>(op));
  }
}

// Whether the next completion of cq (within timeout) has this status and, for a
// successful one, this opcode (the opcode of an error completion is undefined,
// ibv_poll_cq(3)). The message names what came instead.
template <class Cq>
::testing::AssertionResult completion(const char* cq_text, const Cq& cq, ibv_wc_status status, ibv_wc_opcode opcode,
                                      std::chrono::milliseconds timeout = kCompletionTimeout) {
  const std::string wanted = std::string(ibv_wc_status_str(status)) +
                             (status == IBV_WC_SUCCESS ? " " + opcode_name(opcode) : std::string());
  const std::optional<ibv_wc> wc = poll_completion(cq, timeout);
  if (!wc)
    return ::testing::AssertionFailure() << "no completion on " << cq_text << " within " << timeout.count()
                                         << " ms (expected " << wanted << ")";
  if (wc->status != status || (status == IBV_WC_SUCCESS && wc->opcode != opcode))
    return ::testing::AssertionFailure()
           << "completion on " << cq_text << ": " << ibv_wc_status_str(wc->status) << " (status " << wc->status
           << ")" << (wc->status == IBV_WC_SUCCESS ? " " + opcode_name(wc->opcode) : std::string())
           << ", wr_id " << wc->wr_id << ", qp_num " << wc->qp_num << ", vendor_err " << wc->vendor_err
           << "; expected " << wanted;
  return ::testing::AssertionSuccess();
}

}  // namespace softverbs::testing

// EXPECT_COMPLETION(cq, status, opcode [, timeout]): the next completion of cq
// (an ibv_cq*, a CqPtr or a Side), within timeout (default kCompletionTimeout,
// 5 s), has this status and, if it is IBV_WC_SUCCESS, this opcode.
// ASSERT_COMPLETION ends the test when it does not.
#define EXPECT_COMPLETION(cq, ...) \
  GTEST_ASSERT_(::softverbs::testing::completion(#cq, (cq), __VA_ARGS__), GTEST_NONFATAL_FAILURE_)
#define ASSERT_COMPLETION(cq, ...) \
  GTEST_ASSERT_(::softverbs::testing::completion(#cq, (cq), __VA_ARGS__), GTEST_FATAL_FAILURE_)
