// Data path on connected QPs (RC and UC) with no error: every operation, every
// message size class and path MTU, scatter/gather, inline data, signaling,
// fences, and a long run of completions.
#include "datapath.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <thread>

namespace conformance {
namespace {

constexpr size_t kGuard = 64;    // bytes after a target that must stay untouched
constexpr uint8_t kFill = 0xee;  // what untouched memory holds
constexpr size_t kMiB = 1u << 20;

enum class Op { kSend, kSendImm, kWrite, kWriteImm, kRead };

const char* op_name(Op op) {
  switch (op) {
    case Op::kSend:
      return "SEND";
    case Op::kSendImm:
      return "SEND_WITH_IMM";
    case Op::kWrite:
      return "RDMA_WRITE";
    case Op::kWriteImm:
      return "RDMA_WRITE_WITH_IMM";
    case Op::kRead:
      return "RDMA_READ";
  }
  return "?";
}

class OpsTest : public DataPathTest {
 protected:
  void SetUp() override {
    DataPathTest::SetUp();
    if (HasFatalFailure()) return;
    // Shared buffers: src on A's side, dst on B's side, both fully accessible.
    ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &src_));
    ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &dst_));
  }
  void TearDown() override {
    src_ = Region{};
    dst_ = Region{};
    DataPathTest::TearDown();
  }

  // One message of `len` bytes from A (src_) to B (dst_) with `op`, checked
  // completion by completion and byte by byte. For a READ the roles of the
  // buffers swap: A reads B's dst_ into its src_.
  void transfer(Pair& p, Op op, Region& src, Region& dst, size_t len, uint32_t seed);

  // Checks that no completion is left anywhere.
  void expect_idle(Pair& p) {
    for (ibv_cq* cq : {p.a.scq.get(), p.a.rcq.get(), p.b.scq.get(), p.b.rcq.get()}) {
      ibv_wc wc;
      const int n = ibv_poll_cq(cq, 1, &wc);
      EXPECT_EQ(n, 0) << "left-over completion " << (n > 0 ? describe(wc) : std::string("(poll error)"));
    }
  }

  void sizes_test(ibv_qp_type type, Op op);

  // Sends a zero-length message A -> B and waits for both completions.
  void sync_after_uc_write(Pair& p, uint64_t tag) {
    ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 7000 + tag, nullptr, 0));
    ibv_send_wr w = send_wr(8000 + tag, IBV_WR_SEND, nullptr, 0);
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
    std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    check_wc(wc[0], WcExpect(8000 + tag, IBV_WC_SEND, p.a.qpn()));
    wc = expect_wcs(p.b.rcq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    check_wc(wc[0], WcExpect(7000 + tag, IBV_WC_RECV, p.b.qpn()).len(0));
  }

  Region src_;
  Region dst_;
};
CONFORMANCE_INSTANTIATE(OpsTest);

// A zero-length region (the kernel accepts one that lies in a page: addr not
// page-aligned) has keys that serve zero-length operations: an RDMA WRITE and an
// RDMA READ of 0 bytes through its rkey complete. At a page boundary it spans no
// page, and the kernel refuses it (EINVAL). The local side posts no SGE: a
// zero-length SGE means 2 GiB to ConnectX.
TEST_P(OpsTest, ZeroLengthRegionServesZeroLengthOperations) {
  Buffer buf(4096);
  errno = 0;
  ibv_mr* aligned = ibv_reg_mr(pd_, buf.data(), 0, static_cast<int>(kAllAccess));
  EXPECT_EQ(aligned, nullptr);
  EXPECT_EQ(errno, EINVAL);
  if (aligned) ibv_dereg_mr(aligned);
  Mr zero(ibv_reg_mr(pd_, buf.data() + 64, 0, static_cast<int>(kAllAccess)));
  ASSERT_TRUE(zero) << std::strerror(errno);
  EXPECT_EQ(zero->length, 0u);
  EXPECT_EQ(zero->addr, buf.data() + 64);
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(PairOptions{}, &p));
  uint64_t id = 100;
  for (ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ}) {
    ibv_send_wr wr = send_wr(++id, op, nullptr, 0);
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf.data() + 64);
    wr.wr.rdma.rkey = zero->rkey;
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &wr));
    std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    check_wc(wc[0], WcExpect(id, op == IBV_WR_RDMA_WRITE ? IBV_WC_RDMA_WRITE : IBV_WC_RDMA_READ, p.a.qpn()));
  }
  ASSERT_NO_FATAL_FAILURE(sync_after_uc_write(p, 1));
  expect_idle(p);
  p.reset();
}

// GID index 0 of a RoCE port is its link-local GID (fe80::/64, listed as RoCE
// v2): programs that take the first GID of the port (ibv_rc_pingpong -g 0)
// connect RC with it as SGID and the peer's as DGID, and traffic flows.
TEST_P(OpsTest, RcOverTheLinkLocalGid) {
  if (!is_ethernet()) GTEST_SKIP() << "InfiniBand port";
  ibv_gid_entry e{};
  ASSERT_EQ(ibv_query_gid_ex(ctx_, kPort, 0, &e, 0), 0);
  if (e.gid.raw[0] != 0xfe || (e.gid.raw[1] & 0xc0) != 0x80) GTEST_SKIP() << "GID 0 is not link-local";
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  sgid_index_ = 0;  // loopback_ah_attr() addresses the port through it
  sgid_ = e.gid;
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(PairOptions{}, &p));
  ASSERT_NO_FATAL_FAILURE(transfer(p, Op::kSend, src_, dst_, 3000, 1));
  ASSERT_NO_FATAL_FAILURE(transfer(p, Op::kWrite, src_, dst_, 5000, 2));
  ASSERT_NO_FATAL_FAILURE(transfer(p, Op::kRead, src_, dst_, 700, 3));
  expect_idle(p);
  p.reset();
}

void OpsTest::transfer(Pair& p, Op op, Region& src, Region& dst, size_t len, uint32_t seed) {
  SCOPED_TRACE(std::string(op_name(op)) + " of " + std::to_string(len) + " bytes");
  ASSERT_LE(len + kGuard, std::min(src.size(), dst.size()));
  const uint32_t imm = htonl(0xc0de0000u | (seed & 0xffff));
  // The data goes from `from` to `to`.
  Region& from = op == Op::kRead ? dst : src;
  Region& to = op == Op::kRead ? src : dst;
  fill_pattern(from.data(), len, seed);
  std::memset(to.data(), kFill, len + kGuard);
  const bool needs_recv = op == Op::kSend || op == Op::kSendImm || op == Op::kWriteImm;
  // A receive for the write with immediate points at memory the write must
  // not touch.
  Region sentinel;
  if (op == Op::kWriteImm) {
    ASSERT_NO_FATAL_FAILURE(make_region(4096, IBV_ACCESS_LOCAL_WRITE, &sentinel));
    std::memset(sentinel.data(), kFill, 4096);
  }
  if (needs_recv) {
    ibv_sge rs = op == Op::kWriteImm ? sentinel.sge(0, 4096) : to.sge(0, static_cast<uint32_t>(len + kGuard));
    ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 500 + seed, &rs, 1));
  }
  ibv_sge ls = op == Op::kRead ? to.sge(0, static_cast<uint32_t>(len)) : from.sge(0, static_cast<uint32_t>(len));
  static constexpr ibv_wr_opcode kOpcodes[] = {IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE,
                                               IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ};
  ibv_send_wr wr = send_wr(900 + seed, kOpcodes[static_cast<int>(op)], len ? &ls : nullptr, len ? 1 : 0);
  if (op == Op::kSendImm || op == Op::kWriteImm) wr.imm_data = imm;
  if (op == Op::kWrite || op == Op::kWriteImm) {
    wr.wr.rdma.remote_addr = to.addr();
    wr.wr.rdma.rkey = to.rkey();
  } else if (op == Op::kRead) {
    wr.wr.rdma.remote_addr = from.addr();
    wr.wr.rdma.rkey = from.rkey();
  }
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &wr));

  const int timeout = kCompletionTimeoutMs + static_cast<int>(len / kMiB) * 500;
  std::vector<ibv_wc> swc = expect_wcs(p.a.scq.get(), 1, timeout);
  ASSERT_EQ(swc.size(), 1u);
  WcExpect se(900 + seed, IBV_WC_SEND, p.a.qpn());
  switch (op) {
    case Op::kSend:
      se.wc_flags = 0u;
      break;
    case Op::kSendImm:
      break;  // IBV_WC_WITH_IMM: see RequesterCompletionOfImmediateOperations
    case Op::kWrite:
      se.opcode = IBV_WC_RDMA_WRITE;
      se.wc_flags = 0u;
      break;
    case Op::kWriteImm:
      se.opcode = IBV_WC_RDMA_WRITE;
      break;
    case Op::kRead:
      se.opcode = IBV_WC_RDMA_READ;
      se.byte_len = static_cast<uint32_t>(len);
      se.wc_flags = 0u;
      break;
  }
  check_wc(swc[0], se);
  if (swc[0].status == IBV_WC_SUCCESS && (op == Op::kSendImm || op == Op::kWriteImm)) {
    EXPECT_EQ(swc[0].wc_flags & ~static_cast<unsigned>(IBV_WC_WITH_IMM), 0u) << "wc_flags";
  }

  if (needs_recv) {
    std::vector<ibv_wc> rwc = expect_wcs(p.b.rcq.get(), 1, timeout);
    ASSERT_EQ(rwc.size(), 1u);
    WcExpect re = WcExpect(500 + seed, op == Op::kWriteImm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV, p.b.qpn())
                      .len(static_cast<uint32_t>(len))
                      .flags(op == Op::kSend ? 0u : static_cast<unsigned>(IBV_WC_WITH_IMM));
    if (op != Op::kSend) re.imm_data = imm;
    check_wc(rwc[0], re);
  }
  if (op == Op::kWrite && p.a.qp->qp_type == IBV_QPT_UC) {
    // An unreliable write completes at the requester once sent; a SEND behind
    // it on the same QP is placed after it, so its arrival shows the write has
    // landed.
    ASSERT_NO_FATAL_FAILURE(sync_after_uc_write(p, seed));
  }
  EXPECT_EQ(first_pattern_mismatch(to.data(), len, seed), -1) << "data differs at this offset";
  EXPECT_EQ(first_byte_not(to.data() + len, kGuard, kFill), -1) << "bytes after the message were written";
  if (op == Op::kWriteImm) {
    EXPECT_EQ(first_byte_not(sentinel.data(), 4096, kFill), -1) << "the receive buffer of a write with immediate "
                                                                   "was written";
  }
  expect_idle(p);
}

// ---- every operation ---------------------------------------------------

TEST_P(OpsTest, SendRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
  transfer(p, Op::kSend, src_, dst_, 100, 1);
}

TEST_P(OpsTest, SendUc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_UC}, &p));
  transfer(p, Op::kSend, src_, dst_, 100, 1);
}

TEST_P(OpsTest, SendWithImmRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
  transfer(p, Op::kSendImm, src_, dst_, 100, 2);
}

TEST_P(OpsTest, SendWithImmUc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_UC}, &p));
  transfer(p, Op::kSendImm, src_, dst_, 100, 2);
}

TEST_P(OpsTest, RdmaWriteRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
  transfer(p, Op::kWrite, src_, dst_, 3000, 3);
}

TEST_P(OpsTest, RdmaWriteUc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_UC}, &p));
  transfer(p, Op::kWrite, src_, dst_, 3000, 3);
}

TEST_P(OpsTest, RdmaWriteWithImmRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
  transfer(p, Op::kWriteImm, src_, dst_, 3000, 4);
}

TEST_P(OpsTest, RdmaWriteWithImmUc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_UC}, &p));
  transfer(p, Op::kWriteImm, src_, dst_, 3000, 4);
}

TEST_P(OpsTest, RdmaReadRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
  transfer(p, Op::kRead, src_, dst_, 3000, 5);
}

// An RDMA WRITE consumes no receive WQE: the receive posted before it is still
// the one the next SEND lands in.
TEST_P(OpsTest, RdmaWriteConsumesNoReceive) {
  for (ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UC}) {
    SCOPED_TRACE(qp_type_name(type));
    Pair p;
    ASSERT_NO_FATAL_FAILURE(make_pair({.type = type}, &p));
    ibv_sge rs = dst_.sge(32 * 1024, 256);
    ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 77, &rs, 1));
    fill_pattern(src_.data(), 512, 9);
    ibv_sge ws = src_.sge(0, 256);
    ibv_send_wr w = send_wr(1, IBV_WR_RDMA_WRITE, &ws, 1);
    w.wr.rdma.remote_addr = dst_.addr();
    w.wr.rdma.rkey = dst_.rkey();
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
    std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    check_wc(wc[0], WcExpect(1, IBV_WC_RDMA_WRITE, p.a.qpn()));
    expect_no_wc(p.b.rcq.get(), 0);
    ibv_sge ss = src_.sge(256, 16);
    ibv_send_wr s = send_wr(2, IBV_WR_SEND, &ss, 1);
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &s));
    wc = expect_wcs(p.b.rcq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    check_wc(wc[0], WcExpect(77, IBV_WC_RECV, p.b.qpn()).len(16u));
    EXPECT_EQ(std::memcmp(dst_.data() + 32 * 1024, src_.data() + 256, 16), 0);
    EXPECT_EQ(std::memcmp(dst_.data(), src_.data(), 256), 0);
    ASSERT_EQ(expect_wcs(p.a.scq.get(), 1).size(), 1u);
  }
}

// Requester completions of SEND_WITH_IMM and RDMA_WRITE_WITH_IMM carry
// IBV_WC_WITH_IMM: ConnectX (mlx5 handle_good_req) and the kernel's software
// RoCE (rxe make_send_cqe) both report it; the verbs man page only defines the
// flag for receive completions.
TEST_P(OpsTest, RequesterCompletionOfImmediateOperations) {
  for (ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UC}) {
    for (ibv_wr_opcode opcode : {IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM}) {
      SCOPED_TRACE(std::string(qp_type_name(type)) + (opcode == IBV_WR_SEND_WITH_IMM ? " SEND" : " WRITE") +
                   "_WITH_IMM");
      Pair p;
      ASSERT_NO_FATAL_FAILURE(make_pair({.type = type}, &p));
      ibv_sge rs = dst_.sge(0, 64);
      ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 1, &rs, 1));
      ibv_sge ss = src_.sge(0, 8);
      ibv_send_wr w = send_wr(2, opcode, &ss, 1);
      w.imm_data = htonl(0x01020304);
      w.wr.rdma.remote_addr = dst_.addr(1024);
      w.wr.rdma.rkey = dst_.rkey();
      ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
      std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
      ASSERT_EQ(wc.size(), 1u);
      check_wc(wc[0], WcExpect(2, opcode == IBV_WR_SEND_WITH_IMM ? IBV_WC_SEND : IBV_WC_RDMA_WRITE, p.a.qpn())
                          .flags(static_cast<unsigned>(IBV_WC_WITH_IMM)));
      ASSERT_EQ(expect_wcs(p.b.rcq.get(), 1).size(), 1u);
    }
  }
}

// ---- atomics --------------------------------------------------------------

class AtomicTest : public OpsTest {
 protected:
  void SetUp() override {
    OpsTest::SetUp();
    if (HasFatalFailure()) return;
    if (dattr_.atomic_cap == IBV_ATOMIC_NONE) GTEST_SKIP() << "the device has no atomics";
    ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p_));
    std::memset(src_.data(), kFill, 4096);
    std::memset(dst_.data(), kFill, 4096);
  }
  void TearDown() override {
    p_.reset();
    OpsTest::TearDown();
  }

  uint64_t& remote(size_t offset) { return *reinterpret_cast<uint64_t*>(dst_.data() + offset); }
  uint64_t& local(size_t offset) { return *reinterpret_cast<uint64_t*>(src_.data() + offset); }

  ibv_send_wr atomic_wr(uint64_t wr_id, ibv_wr_opcode op, ibv_sge* sge, size_t remote_offset, uint64_t compare_add,
                        uint64_t swap = 0) {
    ibv_send_wr w = send_wr(wr_id, op, sge, 1);
    w.wr.atomic.remote_addr = dst_.addr(remote_offset);
    w.wr.atomic.rkey = dst_.rkey();
    w.wr.atomic.compare_add = compare_add;
    w.wr.atomic.swap = swap;
    return w;
  }

  // Runs one atomic and checks its completion.
  void run(ibv_send_wr& w) {
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p_.a.qp.get(), &w));
    std::vector<ibv_wc> wc = expect_wcs(p_.a.scq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    check_wc(wc[0],
             WcExpect(w.wr_id, w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? IBV_WC_COMP_SWAP : IBV_WC_FETCH_ADD, p_.a.qpn())
                 .len(8u)
                 .flags(0u));
  }

  // The 8 bytes around a target must stay as they were.
  void expect_neighbours_untouched(size_t remote_offset, size_t local_offset) {
    EXPECT_EQ(first_byte_not(dst_.data() + remote_offset - 8, 8, kFill), -1) << "bytes before the target";
    EXPECT_EQ(first_byte_not(dst_.data() + remote_offset + 8, 8, kFill), -1) << "bytes after the target";
    EXPECT_EQ(first_byte_not(src_.data() + local_offset - 8, 8, kFill), -1) << "bytes before the result";
    EXPECT_EQ(first_byte_not(src_.data() + local_offset + 8, 8, kFill), -1) << "bytes after the result";
  }

  Pair p_;
};
CONFORMANCE_INSTANTIATE(AtomicTest);

// Atomic operands, targets and returned values are 64-bit values in host byte
// order, as rxe and current ConnectX adapters handle them. Vendor dependent:
// older adapters returned the original value big-endian (vendor stacks
// flagged this as IBV_EXP_ATOMIC_HCA_REPLY_BE).

TEST_P(AtomicTest, CompareAndSwapSucceeds) {
  remote(64) = 0x1111222233334444ull;
  ibv_sge s = src_.sge(128, 8);
  ibv_send_wr w = atomic_wr(1, IBV_WR_ATOMIC_CMP_AND_SWP, &s, 64, 0x1111222233334444ull, 0xaaaabbbbccccddddull);
  ASSERT_NO_FATAL_FAILURE(run(w));
  EXPECT_EQ(remote(64), 0xaaaabbbbccccddddull) << "the swap was not applied";
  EXPECT_EQ(local(128), 0x1111222233334444ull) << "the original value was not returned";
  expect_neighbours_untouched(64, 128);
}

TEST_P(AtomicTest, CompareAndSwapWithFailedCompare) {
  remote(64) = 0x1111222233334444ull;
  ibv_sge s = src_.sge(128, 8);
  ibv_send_wr w = atomic_wr(2, IBV_WR_ATOMIC_CMP_AND_SWP, &s, 64, 0x1111222233334445ull, 0xaaaabbbbccccddddull);
  ASSERT_NO_FATAL_FAILURE(run(w));
  EXPECT_EQ(remote(64), 0x1111222233334444ull) << "a failed compare must leave the target";
  EXPECT_EQ(local(128), 0x1111222233334444ull) << "the original value was not returned";
  expect_neighbours_untouched(64, 128);
}

TEST_P(AtomicTest, FetchAndAdd) {
  remote(64) = 0x00000001ffffffffull;
  ibv_sge s = src_.sge(128, 8);
  ibv_send_wr w = atomic_wr(3, IBV_WR_ATOMIC_FETCH_AND_ADD, &s, 64, 0x0000000100000001ull);
  ASSERT_NO_FATAL_FAILURE(run(w));
  EXPECT_EQ(remote(64), 0x0000000300000000ull) << "carry across the 32-bit halves";
  EXPECT_EQ(local(128), 0x00000001ffffffffull);
  expect_neighbours_untouched(64, 128);
}

TEST_P(AtomicTest, FetchAndAddWrapsAround) {
  remote(64) = 0xffffffffffffffffull;
  ibv_sge s = src_.sge(128, 8);
  ibv_send_wr w = atomic_wr(4, IBV_WR_ATOMIC_FETCH_AND_ADD, &s, 64, 2);
  ASSERT_NO_FATAL_FAILURE(run(w));
  EXPECT_EQ(remote(64), 1ull);
  EXPECT_EQ(local(128), 0xffffffffffffffffull);
  expect_neighbours_untouched(64, 128);
}

TEST_P(AtomicTest, ChainOfAtomicsIsExecutedInOrder) {
  // 12 fetch-and-adds and compare-and-swaps in one post list, more than
  // max_rd_atomic may allow at once: each sees the result of the one before.
  constexpr int kN = 12;
  remote(64) = 1000;
  std::array<ibv_sge, kN> s{};
  std::array<ibv_send_wr, kN> w{};
  for (int i = 0; i < kN; ++i) {
    s[i] = src_.sge(256 + 16 * static_cast<size_t>(i), 8);
    if (i % 3 == 2) {
      // Swap in 2000 + i only if the previous operations left their sum.
      w[i] = atomic_wr(10 + i, IBV_WR_ATOMIC_CMP_AND_SWP, &s[i], 64, 0, 2000 + i);
    } else {
      w[i] = atomic_wr(10 + i, IBV_WR_ATOMIC_FETCH_AND_ADD, &s[i], 64, static_cast<uint64_t>(i + 1));
    }
    if (i) w[i - 1].next = &w[i];
  }
  // Expected values, computed the same way.
  std::array<uint64_t, kN> orig{};
  uint64_t v = 1000;
  for (int i = 0; i < kN; ++i) {
    orig[i] = v;
    if (i % 3 == 2) {
      w[i].wr.atomic.compare_add = v;  // succeeds
      v = 2000 + i;
    } else {
      v += static_cast<uint64_t>(i + 1);
    }
  }
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p_.a.qp.get(), &w[0]));
  std::vector<ibv_wc> wc = expect_wcs(p_.a.scq.get(), kN);
  ASSERT_EQ(wc.size(), static_cast<size_t>(kN));
  for (int i = 0; i < kN; ++i) {
    SCOPED_TRACE("atomic " + std::to_string(i));
    check_wc(wc[i], WcExpect(10u + i, i % 3 == 2 ? IBV_WC_COMP_SWAP : IBV_WC_FETCH_ADD, p_.a.qpn()).len(8u));
    EXPECT_EQ(local(256 + 16 * static_cast<size_t>(i)), orig[i]);
  }
  EXPECT_EQ(remote(64), v);
}

// ---- SEND with invalidate -------------------------------------------------

// Only memory windows and fast-registration keys can be invalidated remotely;
// an rkey of an ordinary registration cannot (IBTA 10.6.7.2.4), so the
// responder rejects the request: the requester sees IBV_WC_REM_INV_REQ_ERR.
// Vendor dependent: an adapter given an invalidatable key (MW type 2 / FRMR)
// completes the SEND instead, and what an adapter does with an ordinary MR's
// rkey is not specified beyond "invalid request"; the receiver's status for the
// consumed receive is not specified either (any error is accepted).
TEST_P(OpsTest, SendWithInvalidateOfAnOrdinaryRkeyRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
  ibv_sge rs = dst_.sge(0, 256);
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 1, &rs, 1));
  ibv_sge ss = src_.sge(0, 64);
  ibv_send_wr w = send_wr(2, IBV_WR_SEND_WITH_INV, &ss, 1);
  w.invalidate_rkey = dst_.rkey();
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(2, IBV_WC_REM_INV_REQ_ERR, p.a.qpn()));
  wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  observe("responder.status", ibv_wc_status_str(wc[0].status));
  EXPECT_NE(wc[0].status, IBV_WC_SUCCESS) << describe(wc[0]);
  EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_ERR);
  EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_ERR);
  allow_qp_async_event(p.b.qp.get(), {IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR});
}

// ---- sizes and path MTUs ----------------------------------------------------

void OpsTest::sizes_test(ibv_qp_type type, Op op) {
  Region src, dst;
  ASSERT_NO_FATAL_FAILURE(make_region(kMiB + kGuard, kAllAccess, &src));
  ASSERT_NO_FATAL_FAILURE(make_region(kMiB + kGuard, kAllAccess, &dst));
  uint32_t seed = 100;
  for (int m = IBV_MTU_256; m <= active_mtu(); ++m) {
    const auto mtu = static_cast<ibv_mtu>(m);
    const size_t bytes = mtu_bytes(mtu);
    SCOPED_TRACE("path MTU " + std::to_string(bytes));
    Pair p;
    ASSERT_NO_FATAL_FAILURE(make_pair({.type = type, .path_mtu = mtu}, &p));
    for (size_t len : {size_t{0}, size_t{1}, bytes - 1, bytes, bytes + 1, 3 * bytes, 3 * bytes + 7, kMiB}) {
      ASSERT_NO_FATAL_FAILURE(transfer(p, op, src, dst, len, ++seed));
    }
  }
}

TEST_P(OpsTest, SendSizesAtEveryPathMtuRc) { sizes_test(IBV_QPT_RC, Op::kSend); }
TEST_P(OpsTest, SendSizesAtEveryPathMtuUc) { sizes_test(IBV_QPT_UC, Op::kSend); }
TEST_P(OpsTest, SendWithImmSizesAtEveryPathMtuRc) { sizes_test(IBV_QPT_RC, Op::kSendImm); }
TEST_P(OpsTest, RdmaWriteSizesAtEveryPathMtuRc) { sizes_test(IBV_QPT_RC, Op::kWrite); }
TEST_P(OpsTest, RdmaWriteSizesAtEveryPathMtuUc) { sizes_test(IBV_QPT_UC, Op::kWrite); }
TEST_P(OpsTest, RdmaWriteWithImmSizesAtEveryPathMtuRc) { sizes_test(IBV_QPT_RC, Op::kWriteImm); }
TEST_P(OpsTest, RdmaWriteWithImmSizesAtEveryPathMtuUc) { sizes_test(IBV_QPT_UC, Op::kWriteImm); }
TEST_P(OpsTest, RdmaReadSizesAtEveryPathMtuRc) { sizes_test(IBV_QPT_RC, Op::kRead); }

// A 16 MiB message each way (max_msg_sz itself is 1 GiB on ConnectX-class
// devices: too much to move in a unit test).
TEST_P(OpsTest, SixteenMiBMessagesRc) {
  // Or max_msg_sz, on a device whose messages are shorter (rxe: 8 MiB).
  const size_t kLen = std::min<size_t>(16 * kMiB, pattr_.max_msg_sz);
  observe("port.max_msg_sz", pattr_.max_msg_sz);
  Region src, dst;
  ASSERT_NO_FATAL_FAILURE(make_region(kLen + kGuard, kAllAccess, &src));
  ASSERT_NO_FATAL_FAILURE(make_region(kLen + kGuard, kAllAccess, &dst));
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
  ASSERT_NO_FATAL_FAILURE(transfer(p, Op::kSend, src, dst, kLen, 1));
  ASSERT_NO_FATAL_FAILURE(transfer(p, Op::kWrite, src, dst, kLen, 2));
  ASSERT_NO_FATAL_FAILURE(transfer(p, Op::kRead, src, dst, kLen, 3));
}

TEST_P(OpsTest, SixteenMiBMessagesUc) {
  const size_t kLen = std::min<size_t>(16 * kMiB, pattr_.max_msg_sz);
  Region src, dst;
  ASSERT_NO_FATAL_FAILURE(make_region(kLen + kGuard, kAllAccess, &src));
  ASSERT_NO_FATAL_FAILURE(make_region(kLen + kGuard, kAllAccess, &dst));
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_UC}, &p));
  ASSERT_NO_FATAL_FAILURE(transfer(p, Op::kSend, src, dst, kLen, 1));
  ASSERT_NO_FATAL_FAILURE(transfer(p, Op::kWriteImm, src, dst, kLen, 2));
}

// ---- scatter/gather ---------------------------------------------------------

class SgeTest : public OpsTest {
 protected:
  // Lengths that put SGE boundaries everywhere relative to MTU boundaries.
  static uint32_t piece(uint32_t i, uint32_t salt) { return 1 + (i * 397 + salt * 131) % 700; }

  void gather_scatter_send(ibv_qp_type type);
};
CONFORMANCE_INSTANTIATE(SgeTest);

void SgeTest::gather_scatter_send(ibv_qp_type type) {
  const uint32_t ns = usable_sges(type, true, static_cast<uint32_t>(dattr_.max_sge));
  const uint32_t nr = usable_sges(type, false, static_cast<uint32_t>(dattr_.max_sge));
  ASSERT_GE(ns, 2u);
  ASSERT_GE(nr, 2u);
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = type, .max_send_sge = ns, .max_recv_sge = nr}, &p));
  std::memset(dst_.data(), kFill, dst_.size());
  fill_pattern(src_.data(), src_.size(), 7);

  // Gather: piece i from src_ at a gap of 13 bytes after piece i-1.
  std::vector<ibv_sge> g(ns);
  std::vector<uint8_t> expected;
  size_t at = 0;
  for (uint32_t i = 0; i < ns; ++i) {
    g[i] = src_.sge(at, piece(i, 1));
    expected.insert(expected.end(), src_.data() + at, src_.data() + at + g[i].length);
    at += g[i].length + 13;
  }
  // Scatter: nr pieces of other lengths, also with gaps, the last one large
  // enough for whatever is left.
  std::vector<ibv_sge> s(nr);
  size_t total = 0;
  at = 0;
  for (uint32_t i = 0; i < nr; ++i) {
    uint32_t len = piece(i, 2);
    if (i + 1 == nr) len = static_cast<uint32_t>(std::max<size_t>(expected.size(), total) - total + 100);
    s[i] = dst_.sge(at, len);
    total += len;
    at += len + 29;
  }
  ASSERT_LE(at, dst_.size());
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 1, s.data(), static_cast<int>(nr)));
  ibv_send_wr w = send_wr(2, IBV_WR_SEND, g.data(), static_cast<int>(ns));
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(2, IBV_WC_SEND, p.a.qpn()).flags(0u));
  wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(1, IBV_WC_RECV, p.b.qpn()).len(static_cast<uint32_t>(expected.size())).flags(0u));
  // Walk the scatter list: message bytes in order, gaps and tails untouched.
  size_t done = 0;
  at = 0;
  for (uint32_t i = 0; i < nr; ++i) {
    SCOPED_TRACE("receive SGE " + std::to_string(i));
    const size_t take = std::min<size_t>(s[i].length, expected.size() - done);
    EXPECT_EQ(std::memcmp(dst_.data() + at, expected.data() + done, take), 0);
    EXPECT_EQ(first_byte_not(dst_.data() + at + take, s[i].length - take + 29, kFill), -1);
    done += take;
    at += s[i].length + 29;
  }
}

TEST_P(SgeTest, GatherAndScatterUpToMaxSgeRc) { gather_scatter_send(IBV_QPT_RC); }
TEST_P(SgeTest, GatherAndScatterUpToMaxSgeUc) { gather_scatter_send(IBV_QPT_UC); }

TEST_P(SgeTest, RdmaWriteGathersAndRdmaReadScatters) {
  const uint32_t ns = usable_sges(IBV_QPT_RC, true, static_cast<uint32_t>(dattr_.max_sge));
  const uint32_t nread = std::min<uint32_t>(ns, static_cast<uint32_t>(dattr_.max_sge_rd));
  ASSERT_GE(nread, 2u);
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC, .max_send_sge = ns}, &p));
  fill_pattern(src_.data(), 32 * 1024, 8);
  std::memset(dst_.data(), kFill, dst_.size());
  // WRITE: ns pieces of src_ (with gaps) to one contiguous range of dst_.
  std::vector<ibv_sge> g(ns);
  std::vector<uint8_t> expected;
  size_t at = 0;
  for (uint32_t i = 0; i < ns; ++i) {
    g[i] = src_.sge(at, piece(i, 3));
    expected.insert(expected.end(), src_.data() + at, src_.data() + at + g[i].length);
    at += g[i].length + 5;
  }
  ibv_send_wr w = send_wr(1, IBV_WR_RDMA_WRITE, g.data(), static_cast<int>(ns));
  w.wr.rdma.remote_addr = dst_.addr(100);
  w.wr.rdma.rkey = dst_.rkey();
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(1, IBV_WC_RDMA_WRITE, p.a.qpn()).flags(0u));
  EXPECT_EQ(std::memcmp(dst_.data() + 100, expected.data(), expected.size()), 0);
  EXPECT_EQ(first_byte_not(dst_.data(), 100, kFill), -1);
  EXPECT_EQ(first_byte_not(dst_.data() + 100 + expected.size(), kGuard, kFill), -1);

  // READ it back, scattered over nread pieces of the upper half of src_.
  const size_t base = 40 * 1024;
  std::memset(src_.data() + base, kFill, src_.size() - base);
  std::vector<ibv_sge> s(nread);
  size_t total = 0;
  at = base;
  uint64_t raw_sum = 0;
  for (uint32_t i = 0; i < nread; ++i) raw_sum += piece(i, 4);
  for (uint32_t i = 0; i < nread; ++i) {
    // Other boundaries than the write's gather list, scaled to the data.
    uint32_t len = static_cast<uint32_t>(std::max<uint64_t>(1, piece(i, 4) * (expected.size() - nread) / raw_sum));
    if (i + 1 == nread) len = static_cast<uint32_t>(expected.size() - total);
    ASSERT_LE(total + len, expected.size()) << "the scatter list is longer than the data";
    s[i] = src_.sge(at, len);
    total += len;
    at += len + 11;
  }
  ibv_send_wr r = send_wr(2, IBV_WR_RDMA_READ, s.data(), static_cast<int>(nread));
  r.wr.rdma.remote_addr = dst_.addr(100);
  r.wr.rdma.rkey = dst_.rkey();
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &r));
  wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(2, IBV_WC_RDMA_READ, p.a.qpn()).len(static_cast<uint32_t>(expected.size())).flags(0u));
  size_t done = 0;
  at = base;
  for (uint32_t i = 0; i < nread; ++i) {
    SCOPED_TRACE("read SGE " + std::to_string(i));
    EXPECT_EQ(std::memcmp(src_.data() + at, expected.data() + done, s[i].length), 0);
    EXPECT_EQ(first_byte_not(src_.data() + at + s[i].length, 11, kFill), -1);
    done += s[i].length;
    at += s[i].length + 11;
  }
}

TEST_P(SgeTest, ShortMessageFillsOnlyTheFirstReceiveSges) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC, .max_recv_sge = 3}, &p));
  std::memset(dst_.data(), kFill, 4096);
  fill_pattern(src_.data(), 150, 9);
  ibv_sge s[3] = {dst_.sge(0, 100), dst_.sge(1000, 100), dst_.sge(2000, 100)};
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 1, s, 3));
  ibv_sge g = src_.sge(0, 150);
  ibv_send_wr w = send_wr(2, IBV_WR_SEND, &g, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(1, IBV_WC_RECV, p.b.qpn()).len(150u).flags(0u));
  EXPECT_EQ(std::memcmp(dst_.data(), src_.data(), 100), 0);
  EXPECT_EQ(std::memcmp(dst_.data() + 1000, src_.data() + 100, 50), 0);
  EXPECT_EQ(first_byte_not(dst_.data() + 1050, 50, kFill), -1);
  EXPECT_EQ(first_byte_not(dst_.data() + 2000, 100, kFill), -1);
  ASSERT_EQ(expect_wcs(p.a.scq.get(), 1).size(), 1u);
}

// ---- inline data ------------------------------------------------------------

class InlineTest : public OpsTest {
 protected:
  void inline_test(ibv_qp_type type);
};
CONFORMANCE_INSTANTIATE(InlineTest);

// Inline data is copied at post time: the gather list needs no registration
// (its lkey is ignored) and the buffer may be reused as soon as
// ibv_post_send returns.
void InlineTest::inline_test(ibv_qp_type type) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = type, .max_send_sge = 2, .max_inline_data = 128}, &p));
  const uint32_t max_inline = p.a.cap.max_inline_data;
  ASSERT_GE(max_inline, 128u);
  std::vector<uint8_t> scratch(max_inline + 16);
  uint32_t seed = 40;
  for (uint32_t len : {1u, 64u, max_inline - 1, max_inline}) {
    for (bool write : {false, true}) {
      SCOPED_TRACE(std::string(write ? "RDMA_WRITE" : "SEND") + " inline of " + std::to_string(len) + " bytes");
      ++seed;
      fill_pattern(scratch.data(), len, seed);
      std::memset(dst_.data(), kFill, len + kGuard);
      // Two gather entries of unregistered memory.
      ibv_sge g[2];
      g[0].addr = reinterpret_cast<uintptr_t>(scratch.data());
      g[0].length = len / 2;
      g[0].lkey = 0xbadbad;
      g[1].addr = reinterpret_cast<uintptr_t>(scratch.data() + len / 2);
      g[1].length = len - len / 2;
      g[1].lkey = 0;
      if (!write) {
        ibv_sge rs = dst_.sge(0, len + static_cast<uint32_t>(kGuard));
        ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), seed, &rs, 1));
      }
      ibv_send_wr w = send_wr(seed, write ? IBV_WR_RDMA_WRITE : IBV_WR_SEND, g, 2, IBV_SEND_INLINE | IBV_SEND_SIGNALED);
      w.wr.rdma.remote_addr = dst_.addr();
      w.wr.rdma.rkey = dst_.rkey();
      ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
      std::memset(scratch.data(), 0, scratch.size());  // reused at once
      std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
      ASSERT_EQ(wc.size(), 1u);
      check_wc(wc[0], WcExpect(seed, write ? IBV_WC_RDMA_WRITE : IBV_WC_SEND, p.a.qpn()).flags(0u));
      if (write && type == IBV_QPT_UC) {
        ASSERT_NO_FATAL_FAILURE(sync_after_uc_write(p, seed));
      }
      if (!write) {
        wc = expect_wcs(p.b.rcq.get(), 1);
        ASSERT_EQ(wc.size(), 1u);
        check_wc(wc[0], WcExpect(seed, IBV_WC_RECV, p.b.qpn()).len(len).flags(0u));
      }
      EXPECT_EQ(first_pattern_mismatch(dst_.data(), len, seed), -1);
      EXPECT_EQ(first_byte_not(dst_.data() + len, kGuard, kFill), -1);
    }
  }
}

TEST_P(InlineTest, InlineSendAndWriteUpToMaxInlineRc) { inline_test(IBV_QPT_RC); }
TEST_P(InlineTest, InlineSendAndWriteUpToMaxInlineUc) { inline_test(IBV_QPT_UC); }

// ---- signaling --------------------------------------------------------------

class SignalTest : public OpsTest {
 protected:
  void selective(ibv_qp_type type);
  void all_signaled(ibv_qp_type type);
};
CONFORMANCE_INSTANTIATE(SignalTest);

// sq_sig_all=0: only work requests with IBV_SEND_SIGNALED complete; unsignaled
// ones still go out, and their send queue slots are freed by the next
// signaled completion (the queue is cycled several times over).
void SignalTest::selective(ibv_qp_type type) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = type, .max_send_wr = 8, .max_recv_wr = 64}, &p));
  const int kTotal = static_cast<int>(p.a.cap.max_send_wr) * 6;
  fill_pattern(src_.data(), 4096, 3);
  int posted_recv = 0;
  int received = 0;
  for (int i = 0; i < kTotal; ++i) {
    SCOPED_TRACE("work request " + std::to_string(i));
    if (posted_recv - received < 8) {
      for (int k = 0; k < 8; ++k, ++posted_recv) {
        ibv_sge rs = dst_.sge(64 * static_cast<size_t>(posted_recv % 512), 64);
        ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 10000 + posted_recv, &rs, 1));
      }
    }
    const bool signaled = i % 4 == 3;
    ibv_sge ss = src_.sge(static_cast<size_t>(i % 64), 16);
    ibv_send_wr w = send_wr(i, IBV_WR_SEND, &ss, 1, signaled ? IBV_SEND_SIGNALED : 0);
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
    // Every message arrives, signaled or not.
    std::vector<ibv_wc> rwc = expect_wcs(p.b.rcq.get(), 1);
    ASSERT_EQ(rwc.size(), 1u);
    check_wc(rwc[0], WcExpect(10000u + received, IBV_WC_RECV, p.b.qpn()).len(16u));
    ++received;
    if (signaled) {
      std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
      ASSERT_EQ(wc.size(), 1u);
      check_wc(wc[0], WcExpect(static_cast<uint64_t>(i), IBV_WC_SEND, p.a.qpn()));
    } else {
      // No completion for an unsignaled one, now or later.
      ibv_wc wc;
      ASSERT_EQ(ibv_poll_cq(p.a.scq.get(), 1, &wc), 0) << "completion for an unsignaled send: " << describe(wc);
    }
  }
  expect_no_wc(p.a.scq.get());
}

TEST_P(SignalTest, OnlySignaledSendsCompleteRc) { selective(IBV_QPT_RC); }
TEST_P(SignalTest, OnlySignaledSendsCompleteUc) { selective(IBV_QPT_UC); }

// sq_sig_all=1: every work request completes, whatever its flags.
void SignalTest::all_signaled(ibv_qp_type type) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = type, .sq_sig_all = 1}, &p));
  for (int i = 0; i < 4; ++i) {
    ibv_sge rs = dst_.sge(64 * static_cast<size_t>(i), 64);
    ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 100 + i, &rs, 1));
  }
  ibv_sge ss = src_.sge(0, 32);
  std::array<ibv_send_wr, 5> w{};
  for (int i = 0; i < 5; ++i) {
    w[i] = send_wr(i, i == 2 ? IBV_WR_RDMA_WRITE : IBV_WR_SEND, &ss, 1, i % 2 ? IBV_SEND_SIGNALED : 0);
    w[i].wr.rdma.remote_addr = dst_.addr(8192);
    w[i].wr.rdma.rkey = dst_.rkey();
    if (i) w[i - 1].next = &w[i];
  }
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w[0]));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 5);
  ASSERT_EQ(wc.size(), 5u);
  for (int i = 0; i < 5; ++i)
    check_wc(wc[i], WcExpect(static_cast<uint64_t>(i), i == 2 ? IBV_WC_RDMA_WRITE : IBV_WC_SEND, p.a.qpn()).flags(0u));
  ASSERT_EQ(expect_wcs(p.b.rcq.get(), 4).size(), 4u);
  expect_no_wc(p.a.scq.get(), 0);
}

TEST_P(SignalTest, SqSigAllSignalsEveryWorkRequestRc) { all_signaled(IBV_QPT_RC); }
TEST_P(SignalTest, SqSigAllSignalsEveryWorkRequestUc) { all_signaled(IBV_QPT_UC); }

// ---- mixed work ----------------------------------------------------------------

// One post list of every RC operation, some signaled and some not: signaled
// completions come back in posting order, receive completions in message
// order, and once the last one has completed every earlier operation (the
// unsignaled READs and atomics included) has taken effect.
TEST_P(OpsTest, MixedOperationsInOnePostListRc) {
  constexpr int kN = 40;
  Region lsrc, ldst, rtarget, rsource, rrecv;
  ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &lsrc));
  ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &ldst));
  ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &rtarget));
  ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &rsource));
  ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &rrecv));
  fill_pattern(lsrc.data(), lsrc.size(), 21);
  fill_pattern(rsource.data(), rsource.size(), 22);
  std::memset(ldst.data(), kFill, ldst.size());
  std::memset(rtarget.data(), kFill, rtarget.size());
  std::memset(rrecv.data(), kFill, rrecv.size());
  uint64_t& counter = *reinterpret_cast<uint64_t*>(rtarget.data() + 60 * 1024);
  counter = 0;
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC, .max_send_wr = kN, .max_recv_wr = kN}, &p));

  std::array<ibv_sge, kN> sge{};
  std::array<ibv_send_wr, kN> w{};
  std::vector<int> receives;  // indexes of the messages that consume a receive
  for (int i = 0; i < kN; ++i) {
    const size_t slot = 1200 * static_cast<size_t>(i / 5);
    const unsigned flags = (i % 2 == 0 || i == kN - 1) ? IBV_SEND_SIGNALED : 0;
    switch (i % 5) {
      case 0:  // SEND
        sge[i] = lsrc.sge(slot, 100 + i);
        w[i] = send_wr(i, IBV_WR_SEND, &sge[i], 1, flags);
        receives.push_back(i);
        break;
      case 1:  // RDMA WRITE, several packets
        sge[i] = lsrc.sge(slot + 10000, 1100 + i);
        w[i] = send_wr(i, IBV_WR_RDMA_WRITE, &sge[i], 1, flags);
        w[i].wr.rdma.remote_addr = rtarget.addr(slot);
        w[i].wr.rdma.rkey = rtarget.rkey();
        break;
      case 2:  // RDMA READ, several packets
        sge[i] = ldst.sge(slot, 1150 + i);
        w[i] = send_wr(i, IBV_WR_RDMA_READ, &sge[i], 1, flags);
        w[i].wr.rdma.remote_addr = rsource.addr(slot + 7);
        w[i].wr.rdma.rkey = rsource.rkey();
        break;
      case 3:  // FETCH_AND_ADD of i
        sge[i] = ldst.sge(40 * 1024 + 8 * static_cast<size_t>(i), 8);
        w[i] = send_wr(i, IBV_WR_ATOMIC_FETCH_AND_ADD, &sge[i], 1, flags);
        w[i].wr.atomic.remote_addr = rtarget.addr(60 * 1024);
        w[i].wr.atomic.rkey = rtarget.rkey();
        w[i].wr.atomic.compare_add = static_cast<uint64_t>(i);
        break;
      case 4:  // RDMA WRITE with immediate
        sge[i] = lsrc.sge(slot + 20000, 50 + i);
        w[i] = send_wr(i, IBV_WR_RDMA_WRITE_WITH_IMM, &sge[i], 1, flags);
        w[i].wr.rdma.remote_addr = rtarget.addr(slot + 20000);
        w[i].wr.rdma.rkey = rtarget.rkey();
        w[i].imm_data = htonl(static_cast<uint32_t>(i));
        receives.push_back(i);
        break;
    }
    if (i) w[i - 1].next = &w[i];
  }
  for (size_t r = 0; r < receives.size(); ++r) {
    ibv_sge rs = rrecv.sge(256 * r, 256);
    ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 5000 + r, &rs, 1));
  }
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w[0]));

  std::vector<int> signaled;
  for (int i = 0; i < kN; ++i)
    if (w[i].send_flags & IBV_SEND_SIGNALED) signaled.push_back(i);
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), static_cast<int>(signaled.size()));
  ASSERT_EQ(wc.size(), signaled.size());
  static constexpr ibv_wc_opcode kWcOp[] = {IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD,
                                            IBV_WC_RDMA_WRITE};
  for (size_t k = 0; k < wc.size(); ++k) {
    const int i = signaled[k];
    SCOPED_TRACE("work request " + std::to_string(i));
    WcExpect e(static_cast<uint64_t>(i), kWcOp[i % 5], p.a.qpn());
    if (i % 5 == 2) e.len(1150 + i);
    if (i % 5 == 3) e.len(8);
    check_wc(wc[k], e);
  }
  wc = expect_wcs(p.b.rcq.get(), static_cast<int>(receives.size()));
  ASSERT_EQ(wc.size(), receives.size());
  for (size_t r = 0; r < wc.size(); ++r) {
    const int i = receives[r];
    SCOPED_TRACE("message of work request " + std::to_string(i));
    if (i % 5 == 0) {
      check_wc(wc[r], WcExpect(5000 + r, IBV_WC_RECV, p.b.qpn()).len(100 + i).flags(0));
      EXPECT_EQ(std::memcmp(rrecv.data() + 256 * r, lsrc.data() + 1200 * static_cast<size_t>(i / 5), 100 + i), 0);
    } else {
      check_wc(wc[r], WcExpect(5000 + r, IBV_WC_RECV_RDMA_WITH_IMM, p.b.qpn())
                          .len(50 + i)
                          .flags(IBV_WC_WITH_IMM)
                          .imm(htonl(static_cast<uint32_t>(i))));
    }
  }
  // Every operation's effect.
  uint64_t sum = 0;
  for (int i = 0; i < kN; ++i) {
    SCOPED_TRACE("work request " + std::to_string(i));
    const size_t slot = 1200 * static_cast<size_t>(i / 5);
    switch (i % 5) {
      case 1:
        EXPECT_EQ(std::memcmp(rtarget.data() + slot, lsrc.data() + slot + 10000, 1100 + i), 0);
        break;
      case 2:
        EXPECT_EQ(std::memcmp(ldst.data() + slot, rsource.data() + slot + 7, 1150 + i), 0);
        break;
      case 3: {
        uint64_t orig = 0;
        std::memcpy(&orig, ldst.data() + 40 * 1024 + 8 * static_cast<size_t>(i), 8);
        EXPECT_EQ(orig, sum);
        sum += static_cast<uint64_t>(i);
        break;
      }
      case 4:
        EXPECT_EQ(std::memcmp(rtarget.data() + slot + 20000, lsrc.data() + slot + 20000, 50 + i), 0);
        break;
      default:
        break;
    }
  }
  EXPECT_EQ(counter, sum);
  expect_idle(p);
}

// A send queue holds max_send_wr outstanding work requests: one more is
// refused with ENOMEM (mlx5 and rxe) and bad_wr pointing at it; once the
// queue drains, posting works again.
TEST_P(OpsTest, SendQueueFullRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC, .max_send_wr = 8, .min_rnr_timer = 1}, &p));
  const uint32_t depth = p.a.cap.max_send_wr;
  ASSERT_LE(depth, 200u) << "the CQ of this test is too small for the queue";
  // No receive at B: every send waits in RNR retries.
  ibv_sge s = src_.sge(0, 16);
  for (uint32_t i = 0; i < depth; ++i) {
    ibv_send_wr w = send_wr(i, IBV_WR_SEND, &s, 1);
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  }
  ibv_send_wr extra = send_wr(depth, IBV_WR_SEND, &s, 1);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(p.a.qp.get(), &extra, &bad), ENOMEM);
  EXPECT_EQ(bad, &extra);
  expect_no_wc(p.a.scq.get(), 0);
  for (uint32_t i = 0; i < depth + 1; ++i) {
    ibv_sge rs = dst_.sge(64 * i, 64);
    ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 100 + i, &rs, 1));
  }
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), static_cast<int>(depth));
  ASSERT_EQ(wc.size(), depth);
  for (uint32_t i = 0; i < depth; ++i) check_wc(wc[i], WcExpect(i, IBV_WC_SEND, p.a.qpn()));
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &extra));
  ASSERT_EQ(expect_wcs(p.a.scq.get(), 1).size(), 1u);
  ASSERT_EQ(expect_wcs(p.b.rcq.get(), static_cast<int>(depth) + 1).size(), depth + 1);
}

// UC has no receiver-not-ready: a SEND that finds no receive WQE is dropped
// silently (IBTA 9.8.3), the requester completes it, and the next message
// lands in the receive posted afterwards.
TEST_P(OpsTest, UcSendWithoutReceiveIsDropped) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_UC}, &p));
  fill_pattern(src_.data(), 1024, 31);
  std::memset(dst_.data(), kFill, 4096);
  ibv_sge s1 = src_.sge(0, 200);
  ibv_send_wr w1 = send_wr(1, IBV_WR_SEND, &s1, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w1));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(1, IBV_WC_SEND, p.a.qpn()));
  // The message must have reached B (and been dropped) before B posts its
  // receive: an RDMA WRITE behind it is placed after it, so once the write's
  // marker is visible in B's memory the SEND has been dealt with.
  const uint64_t marker = 0x6d61726b65722121ull;
  std::memcpy(src_.data() + 2048, &marker, 8);
  ibv_sge ms = src_.sge(2048, 8);
  ibv_send_wr mw = send_wr(3, IBV_WR_RDMA_WRITE, &ms, 1, 0);
  mw.wr.rdma.remote_addr = dst_.addr(8192);
  mw.wr.rdma.rkey = dst_.rkey();
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &mw));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kCompletionTimeoutMs);
  for (;;) {
    uint64_t seen = __atomic_load_n(reinterpret_cast<const uint64_t*>(dst_.data() + 8192), __ATOMIC_ACQUIRE);
    if (seen == marker) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the RDMA WRITE behind the SEND never landed";
    std::this_thread::yield();
  }
  expect_no_wc(p.b.rcq.get(), 0);
  EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_RTS);
  ibv_sge rs = dst_.sge(0, 1024);
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 7, &rs, 1));
  ibv_sge s2 = src_.sge(512, 300);
  ibv_send_wr w2 = send_wr(2, IBV_WR_SEND, &s2, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w2));
  wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(7, IBV_WC_RECV, p.b.qpn()).len(300).flags(0));
  EXPECT_EQ(std::memcmp(dst_.data(), src_.data() + 512, 300), 0);
  ASSERT_EQ(expect_wcs(p.a.scq.get(), 1).size(), 1u);
  expect_idle(p);
}

// ---- fences -----------------------------------------------------------------

// IBV_SEND_FENCE holds a work request until every earlier RDMA READ and atomic
// of the send queue has completed. A fenced SEND and a fenced RDMA WRITE that
// gather from the buffer an earlier READ fills must carry the read data.
TEST_P(OpsTest, FenceOrdersAfterAnRdmaRead) {
  constexpr uint32_t kLen = 48 * 1024;  // many packets at any MTU
  Region local, remote, sink;
  ASSERT_NO_FATAL_FAILURE(make_region(kLen, kAllAccess, &local));
  ASSERT_NO_FATAL_FAILURE(make_region(kLen, kAllAccess, &remote));
  ASSERT_NO_FATAL_FAILURE(make_region(2 * kLen, kAllAccess, &sink));
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
  fill_pattern(remote.data(), kLen, 77);
  std::memset(local.data(), 0, kLen);
  std::memset(sink.data(), 0, 2 * kLen);
  ibv_sge rs = sink.sge(0, kLen);
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 1, &rs, 1));

  ibv_sge l = local.sge(0, kLen);
  ibv_send_wr read = send_wr(10, IBV_WR_RDMA_READ, &l, 1);
  read.wr.rdma.remote_addr = remote.addr();
  read.wr.rdma.rkey = remote.rkey();
  ibv_send_wr send = send_wr(11, IBV_WR_SEND, &l, 1, IBV_SEND_SIGNALED | IBV_SEND_FENCE);
  ibv_send_wr write = send_wr(12, IBV_WR_RDMA_WRITE, &l, 1, IBV_SEND_SIGNALED | IBV_SEND_FENCE);
  write.wr.rdma.remote_addr = sink.addr(kLen);
  write.wr.rdma.rkey = sink.rkey();
  read.next = &send;
  send.next = &write;
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &read));

  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 3);
  ASSERT_EQ(wc.size(), 3u);
  check_wc(wc[0], WcExpect(10, IBV_WC_RDMA_READ, p.a.qpn()).len(kLen));
  check_wc(wc[1], WcExpect(11, IBV_WC_SEND, p.a.qpn()));
  check_wc(wc[2], WcExpect(12, IBV_WC_RDMA_WRITE, p.a.qpn()));
  wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(1, IBV_WC_RECV, p.b.qpn()).len(kLen));
  EXPECT_EQ(first_pattern_mismatch(local.data(), kLen, 77), -1) << "the READ itself";
  EXPECT_EQ(first_pattern_mismatch(sink.data(), kLen, 77), -1) << "the fenced SEND overtook the READ";
  EXPECT_EQ(first_pattern_mismatch(sink.data() + kLen, kLen, 77), -1) << "the fenced WRITE overtook the READ";
}

TEST_P(AtomicTest, FenceOrdersAfterAnAtomic) {
  // The fenced SEND carries the value the fetch-and-add returned.
  remote(64) = 0x0102030405060708ull;
  local(128) = 0;
  ibv_sge rs = dst_.sge(1024, 64);
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p_.b.qp.get(), 1, &rs, 1));
  ibv_sge l = src_.sge(128, 8);
  ibv_send_wr faa = atomic_wr(20, IBV_WR_ATOMIC_FETCH_AND_ADD, &l, 64, 1);
  ibv_send_wr send = send_wr(21, IBV_WR_SEND, &l, 1, IBV_SEND_SIGNALED | IBV_SEND_FENCE);
  faa.next = &send;
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p_.a.qp.get(), &faa));
  std::vector<ibv_wc> wc = expect_wcs(p_.a.scq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  check_wc(wc[0], WcExpect(20, IBV_WC_FETCH_ADD, p_.a.qpn()).len(8u));
  check_wc(wc[1], WcExpect(21, IBV_WC_SEND, p_.a.qpn()));
  wc = expect_wcs(p_.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(1, IBV_WC_RECV, p_.b.qpn()).len(8u));
  uint64_t got = 0;
  std::memcpy(&got, dst_.data() + 1024, 8);
  EXPECT_EQ(got, 0x0102030405060708ull) << "the fenced SEND overtook the atomic";
  EXPECT_EQ(remote(64), 0x0102030405060709ull);
}

// ---- many completions ---------------------------------------------------------

class LoadTest : public OpsTest {
 protected:
  void many_sends(ibv_qp_type type);
};
CONFORMANCE_INSTANTIATE(LoadTest);

// 10,000 small signaled sends with up to kWindow outstanding: one completion
// per send on each side, in order, each receive holding its own message.
void LoadTest::many_sends(ibv_qp_type type) {
  constexpr int kTotal = 10000;
  constexpr int kWindow = 64;
  constexpr uint32_t kMsg = 32;
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = type, .max_send_wr = kWindow, .max_recv_wr = kWindow, .cqe = 256}, &p));
  // Message i carries i in its first 4 bytes.
  int posted = 0, recv_posted = 0, sent_done = 0, received = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::vector<ibv_wc> wc(32);
  while (received < kTotal || sent_done < kTotal) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "stalled: posted " << posted << " sends, " << sent_done << " completed, " << received << " received";
    // Keep the receive queue full (each receive has its own slot in dst_).
    while (recv_posted < kTotal && recv_posted - received < kWindow) {
      ibv_sge rs = dst_.sge(kMsg * static_cast<size_t>(recv_posted % kWindow), kMsg);
      ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), static_cast<uint64_t>(recv_posted), &rs, 1));
      ++recv_posted;
    }
    // Outstanding = posted but not yet received, bounded by the window (this
    // also keeps an unreliable sender from overrunning the receive queue).
    while (posted < kTotal && posted - received < kWindow && posted - sent_done < kWindow) {
      uint8_t* msg = src_.data() + kMsg * static_cast<size_t>(posted % kWindow);
      std::memcpy(msg, &posted, 4);
      ibv_sge ss = src_.sge(kMsg * static_cast<size_t>(posted % kWindow), kMsg);
      ibv_send_wr w = send_wr(static_cast<uint64_t>(posted), IBV_WR_SEND, &ss, 1);
      ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
      ++posted;
    }
    int n = ibv_poll_cq(p.a.scq.get(), static_cast<int>(wc.size()), wc.data());
    ASSERT_GE(n, 0);
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS) << describe(wc[i]);
      ASSERT_EQ(wc[i].wr_id, static_cast<uint64_t>(sent_done)) << "send completions out of order";
      ASSERT_EQ(wc[i].opcode, IBV_WC_SEND);
      ASSERT_EQ(wc[i].qp_num, p.a.qpn());
      ++sent_done;
    }
    n = ibv_poll_cq(p.b.rcq.get(), static_cast<int>(wc.size()), wc.data());
    ASSERT_GE(n, 0);
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS) << describe(wc[i]);
      ASSERT_EQ(wc[i].wr_id, static_cast<uint64_t>(received)) << "receive completions out of order";
      ASSERT_EQ(wc[i].opcode, IBV_WC_RECV);
      ASSERT_EQ(wc[i].byte_len, kMsg);
      ASSERT_EQ(wc[i].qp_num, p.b.qpn());
      int seq = -1;
      std::memcpy(&seq, dst_.data() + kMsg * (wc[i].wr_id % kWindow), 4);
      ASSERT_EQ(seq, received) << "receive " << received << " holds another message";
      ++received;
    }
  }
  expect_no_wc(p.a.scq.get(), 0);
  expect_no_wc(p.b.rcq.get(), 0);
}

TEST_P(LoadTest, TenThousandSendsCompleteOneToOneInOrderRc) { many_sends(IBV_QPT_RC); }
TEST_P(LoadTest, TenThousandSendsCompleteOneToOneInOrderUc) { many_sends(IBV_QPT_UC); }

// Both QPs send to each other at the same time: each side is requester and
// responder at once. Every message arrives once, in order, on each side.
TEST_P(LoadTest, BidirectionalSendsRc) {
  constexpr int kTotal = 2000;
  constexpr int kWindow = 32;
  constexpr uint32_t kMsg = 64;
  Pair p;
  ASSERT_NO_FATAL_FAILURE(
      make_pair({.type = IBV_QPT_RC, .max_send_wr = kWindow, .max_recv_wr = kWindow, .cqe = 128}, &p));
  struct Side {
    Endpoint* self;
    Endpoint* peer;
    uint8_t* out;
    Region* in;
    int posted = 0, recv_posted = 0, done = 0, received = 0;
  };
  // A sends from the lower half of src_ and receives into the lower half of
  // dst_; B uses the upper halves.
  Side sides[2] = {{&p.a, &p.b, src_.data(), &dst_}, {&p.b, &p.a, src_.data() + 32 * 1024, &dst_}};
  const size_t in_base[2] = {0, 32 * 1024};
  const size_t out_base[2] = {0, 32 * 1024};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::vector<ibv_wc> wc(32);
  auto finished = [&] {
    for (const Side& s : sides)
      if (s.done < kTotal || s.received < kTotal) return false;
    return true;
  };
  while (!finished()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "stalled";
    for (int k = 0; k < 2; ++k) {
      Side& s = sides[k];
      Side& o = sides[1 - k];
      while (s.recv_posted < kTotal && s.recv_posted - s.received < kWindow) {
        ibv_sge rs = s.in->sge(in_base[k] + kMsg * static_cast<size_t>(s.recv_posted % kWindow), kMsg);
        ASSERT_NO_FATAL_FAILURE(post_recv_ok(s.self->qp.get(), static_cast<uint64_t>(s.recv_posted), &rs, 1));
        ++s.recv_posted;
      }
      while (s.posted < kTotal && s.posted - o.received < kWindow && s.posted - s.done < kWindow) {
        const size_t off = out_base[k] + kMsg * static_cast<size_t>(s.posted % kWindow);
        const int tag = k * 1000000 + s.posted;
        std::memcpy(src_.data() + off, &tag, 4);
        ibv_sge ss = src_.sge(off, kMsg);
        ibv_send_wr w = send_wr(static_cast<uint64_t>(s.posted), IBV_WR_SEND, &ss, 1);
        ASSERT_NO_FATAL_FAILURE(post_send_ok(s.self->qp.get(), &w));
        ++s.posted;
      }
    }
    for (int k = 0; k < 2; ++k) {
      Side& s = sides[k];
      Side& o = sides[1 - k];
      int n = ibv_poll_cq(s.self->scq.get(), static_cast<int>(wc.size()), wc.data());
      ASSERT_GE(n, 0);
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS) << describe(wc[i]);
        ASSERT_EQ(wc[i].wr_id, static_cast<uint64_t>(s.done)) << "send completions out of order";
        ASSERT_EQ(wc[i].qp_num, s.self->qpn());
        ++s.done;
      }
      n = ibv_poll_cq(s.self->rcq.get(), static_cast<int>(wc.size()), wc.data());
      ASSERT_GE(n, 0);
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS) << describe(wc[i]);
        ASSERT_EQ(wc[i].wr_id, static_cast<uint64_t>(s.received)) << "receive completions out of order";
        ASSERT_EQ(wc[i].opcode, IBV_WC_RECV);
        ASSERT_EQ(wc[i].byte_len, kMsg);
        ASSERT_EQ(wc[i].qp_num, s.self->qpn());
        int tag = -1;
        std::memcpy(&tag, s.in->data() + in_base[k] + kMsg * (wc[i].wr_id % kWindow), 4);
        ASSERT_EQ(tag, (1 - k) * 1000000 + s.received) << "receive holds another message";
        ++s.received;
      }
      (void)o;
    }
  }
}

}  // namespace
}  // namespace conformance
