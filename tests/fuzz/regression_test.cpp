// Deterministic replay of the fuzz targets' checks (harness.hpp): the seeds they
// start from, and every input saved under tests/fuzz/regressions/ (parse/ for
// the parse target, receive/ for the receive target). A saved input reproduces
// a finding; it must pass once the finding is fixed, and keep passing.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "emu/objects/objects.hpp"
#include "tests/fuzz/harness.hpp"
#include "wire/icrc.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softverbs::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> saved_inputs(const char* target) {
  std::vector<fs::path> files;
  const fs::path dir = fs::path(SV_FUZZ_REGRESSION_DIR) / target;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().filename().string()[0] != '.' && e.path().extension() != ".md")
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

Bytes read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string hex(const Bytes& b) {
  std::string s;
  char buf[4];
  for (std::uint8_t c : b) {
    std::snprintf(buf, sizeof buf, "%02x", c);
    s += buf;
  }
  return s;
}

template <class Check>
void expect_clean(const std::string& what, const Bytes& input, Check check) {
  const std::vector<std::string> violations = check(input);
  for (const std::string& v : violations) ADD_FAILURE() << what << " (input " << hex(input) << "): " << v;
}

TEST(FuzzParse, SeedsHoldEveryProperty) {
  const auto seeds = parse_seeds();
  ASSERT_FALSE(seeds.empty());
  for (std::size_t i = 0; i < seeds.size(); ++i) expect_clean("parse seed " + std::to_string(i), seeds[i], check_parse);
}

TEST(FuzzParse, SavedInputsHoldEveryProperty) {
  for (const fs::path& p : saved_inputs("parse")) expect_clean(p.filename().string(), read_file(p), check_parse);
}

TEST(FuzzReceive, SeedsHoldEveryProperty) {
  const auto seeds = receive_seeds();
  ASSERT_FALSE(seeds.empty());
  for (std::size_t i = 0; i < seeds.size(); ++i)
    expect_clean("receive seed " + std::to_string(i), seeds[i], check_receive);
}

TEST(FuzzReceive, SavedInputsHoldEveryProperty) {
  for (const fs::path& p : saved_inputs("receive")) expect_clean(p.filename().string(), read_file(p), check_receive);
}

// Inputs that are not even a record, and a second run of a seed, are clean too:
// every input starts from the same state.
TEST(FuzzReceive, DegenerateInputsAndRepeats) {
  const auto seeds = receive_seeds();
  for (int i = 0; i < 3; ++i) {
    expect_clean("empty input", Bytes{}, check_receive);
    expect_clean("one byte", Bytes{0xFF}, check_receive);
    expect_clean("cut record", Bytes{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}, check_receive);
    expect_clean("seed 0 again", seeds[0], check_receive);
  }
}

// ---------------------------------------------------------------------------
// Findings outside the harness' checks, reproduced directly.

// An RC QP is reset and reconnected while an RNR wait of its previous
// connection is pending. The timer still fires, finds no RNR wait, and takes
// the local ACK timeout path although the new connection has timeout 0 (no
// timeout, IBTA 9.7.6.1.3): with retry_cnt 0 its first request completes with
// IBV_WC_RETRY_EXC_ERR and the QP goes to the error state.
TEST(FuzzFindings, ResetQpIgnoresTimerOfItsPreviousConnection) {
  (void)check_receive({});  // two devices (SOFTVERBS_DEVICES=2)
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_GE(n, 2);
  struct End {
    ibv_context* ctx;
    ibv_pd* pd;
    ibv_cq* cq;
    ibv_qp* qp;
    in_addr addr;
  } e[2];
  for (int i = 0; i < 2; ++i) {
    e[i].ctx = ibv_open_device(list[i]);
    ASSERT_NE(e[i].ctx, nullptr);
    e[i].pd = ibv_alloc_pd(e[i].ctx);
    e[i].cq = ibv_create_cq(e[i].ctx, 16, nullptr, nullptr, 0);
    ibv_qp_init_attr a{};
    a.qp_type = IBV_QPT_RC;
    a.send_cq = a.recv_cq = e[i].cq;
    a.cap = {4, 4, 1, 1, 0};
    e[i].qp = ibv_create_qp(e[i].pd, &a);
    ASSERT_NE(e[i].qp, nullptr);
    e[i].addr = emu::DeviceRegistry::instance().find(list[i])->addr();
  }
  ibv_free_device_list(list);
  auto init = [](ibv_qp* q) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    return ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  };
  auto rtr = [](ibv_qp* q, uint32_t dqpn, in_addr peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dqpn;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xff;
    std::memcpy(&a.ah_attr.grh.dgid.raw[12], &peer.s_addr, 4);
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 22;  // 20.48 ms
    return ibv_modify_qp(q, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  };
  auto rts = [](ibv_qp* q) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 0;  // no local ACK timeout
    a.retry_cnt = 0;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(
        q, &a,
        IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  };
  auto state = [](ibv_qp* q, ibv_qp_state s) {
    ibv_qp_attr a{};
    a.qp_state = s;
    return ibv_modify_qp(q, &a, IBV_QP_STATE);
  };
  ASSERT_EQ(init(e[0].qp), 0);
  ASSERT_EQ(init(e[1].qp), 0);
  ASSERT_EQ(rtr(e[0].qp, e[1].qp->qp_num, e[1].addr), 0);
  ASSERT_EQ(rtr(e[1].qp, e[0].qp->qp_num, e[0].addr), 0);
  ASSERT_EQ(rts(e[0].qp), 0);
  ASSERT_EQ(rts(e[1].qp), 0);

  // A SEND to a peer without receive WQEs: RNR NAK, a 20 ms RNR wait starts.
  static std::uint8_t buf[64];
  ibv_mr* mr = ibv_reg_mr(e[0].pd, buf, sizeof buf, 0);
  ASSERT_NE(mr, nullptr);
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), 8, mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(e[0].qp, &wr, &bad), 0);
  auto& devices = emu::DeviceRegistry::instance().devices();
  const auto rnr_before = devices[0]->counters().rnr_naks_received.load();
  for (int i = 0; i < 1000 && devices[0]->counters().rnr_naks_received.load() == rnr_before; ++i) {
    for (emu::Device* d : devices) d->progress(true);
    ::usleep(100);
  }
  ASSERT_GT(devices[0]->counters().rnr_naks_received.load(), rnr_before) << "no RNR NAK";

  // Reset and reconnect at once; the peer stays in INIT and answers nothing.
  ASSERT_EQ(state(e[0].qp, IBV_QPS_RESET), 0);
  ASSERT_EQ(state(e[1].qp, IBV_QPS_RESET), 0);
  ASSERT_EQ(init(e[0].qp), 0);
  ASSERT_EQ(init(e[1].qp), 0);
  ASSERT_EQ(rtr(e[0].qp, e[1].qp->qp_num, e[1].addr), 0);
  ASSERT_EQ(rts(e[0].qp), 0);
  wr.wr_id = 2;
  ASSERT_EQ(ibv_post_send(e[0].qp, &wr, &bad), 0);
  ::usleep(150 * 1000);  // well past the old RNR wait

  ibv_wc wc{};
  const int got = ibv_poll_cq(e[0].cq, 1, &wc);
  EXPECT_EQ(got, 0) << "completion wr_id " << wc.wr_id << ": " << ibv_wc_status_str(wc.status)
                    << " on a QP with no local ACK timeout";
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(e[0].qp, &qa, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(qa.qp_state, IBV_QPS_RTS);

  for (int i = 0; i < 2; ++i) {
    ibv_destroy_qp(e[i].qp);
    ibv_destroy_cq(e[i].cq);
  }
  ibv_dereg_mr(mr);
  for (int i = 0; i < 2; ++i) {
    ibv_dealloc_pd(e[i].pd);
    ibv_close_device(e[i].ctx);
  }
}

// ---------------------------------------------------------------------------
// Hostile datagrams: UD SENDs of every size, Q_Key, immediate and pad, and
// truncated or random bytes, injected into a UD QP whose receive buffers sit in a
// guarded region. Whatever arrives, nothing outside the posted scatter lists
// changes, every completion names a posted receive and succeeds, and byte_len
// never exceeds it; a datagram too large for the next receive is dropped.
TEST(HostileDatagrams, UdReceivesStayInsideTheirBuffers) {
  (void)check_receive({});  // two devices (SOFTVERBS_DEVICES=2)
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_GE(n, 2);
  emu::Device* from = emu::DeviceRegistry::instance().find(list[0]);
  emu::Device* to = emu::DeviceRegistry::instance().find(list[1]);
  ibv_context* ctx = ibv_open_device(list[1]);
  ibv_free_device_list(list);
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 512, nullptr, nullptr, 0);
  ASSERT_TRUE(pd && cq);
  ibv_qp_init_attr ia{};
  ia.qp_type = IBV_QPT_UD;
  ia.send_cq = ia.recv_cq = cq;
  ia.cap = {4, 256, 1, 2, 0};
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = 0x1234;
  ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);

  constexpr std::size_t kArena = 1 << 16;
  std::vector<std::uint8_t> arena(kArena, 0xa5);
  ibv_mr* mr = ibv_reg_mr(pd, arena.data(), arena.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  // Receive WQEs: one or two SGEs at scattered places, sizes around 40 + payload.
  struct Posted {
    std::vector<std::pair<std::size_t, std::size_t>> sges;
    std::size_t total;
  };
  std::vector<Posted> posted;
  std::vector<bool> may_change(kArena, false);
  std::mt19937 rng(5);
  auto post_one = [&] {
    Posted p;
    const int nsge = 1 + static_cast<int>(rng() % 2);
    ibv_sge sge[2];
    p.total = 0;
    for (int i = 0; i < nsge; ++i) {
      const std::size_t len = rng() % 3 == 0 ? rng() % 48 : 40 + rng() % 2200;
      const std::size_t off = 64 + rng() % (kArena - len - 128);
      sge[i] = {reinterpret_cast<std::uintptr_t>(arena.data() + off), static_cast<std::uint32_t>(len), mr->lkey};
      p.sges.emplace_back(off, len);
      p.total += len;
      for (std::size_t b = off; b < off + len; ++b) may_change[b] = true;
    }
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = posted.size();
    wr.sg_list = sge;
    wr.num_sge = nsge;
    ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
    posted.push_back(p);
  };
  for (int i = 0; i < 200; ++i) ASSERT_NO_FATAL_FAILURE(post_one());

  const wire::IcrcFlow flow{to->flow(from->addr(), to->addr())};
  std::vector<std::uint8_t> pkt(wire::kMaxUdpPayload);
  std::vector<std::uint8_t> payload(4200);
  int received = 0;
  const std::uint64_t dropped_before = to->counters().rx_dropped.load();
  for (int i = 0; i < 3000; ++i) {
    wire::PacketHeaders h;
    h.bth.opcode = rng() % 2 ? wire::opcode::ud_send_only : wire::opcode::ud_send_only_with_immediate;
    h.bth.dest_qp = rng() % 8 ? qp->qp_num : static_cast<std::uint32_t>(rng() & 0xffffff);
    h.bth.psn = static_cast<std::uint32_t>(rng() & 0xffffff);
    h.bth.se = rng() % 2;
    h.deth.qkey = rng() % 4 ? 0x1234 : static_cast<std::uint32_t>(rng());
    h.deth.src_qp = static_cast<std::uint32_t>(rng() & 0xffffff);
    h.imm.data = static_cast<std::uint32_t>(rng());
    const std::size_t len = rng() % 4 ? rng() % 2300 : rng() % payload.size();
    for (std::size_t b = 0; b < len; ++b) payload[b] = static_cast<std::uint8_t>(rng());
    std::size_t size = wire::build(h, std::span<const std::uint8_t>(payload.data(), len), pkt, &flow);
    if (size == 0) continue;
    switch (rng() % 6) {
      case 0:  // truncated
        size = rng() % size;
        break;
      case 1:  // random bytes after the BTH, ICRC made good again
        for (std::size_t b = 12; b + 4 < size; ++b)
          if (rng() % 16 == 0) pkt[b] = static_cast<std::uint8_t>(rng());
        wire::write_icrc(flow, std::span<std::uint8_t>(pkt.data(), size));
        break;
      default:
        break;
    }
    to->inject(from->addr(), std::span<const std::uint8_t>(pkt.data(), size));
    ibv_wc wc[16];
    int got;
    while ((got = ibv_poll_cq(cq, 16, wc)) > 0) {
      for (int k = 0; k < got; ++k) {
        ASSERT_LT(wc[k].wr_id, posted.size()) << "a completion of nothing posted";
        if (wc[k].status == IBV_WC_SUCCESS) {
          ++received;
          EXPECT_LE(wc[k].byte_len, posted[wc[k].wr_id].total);
          EXPECT_GE(wc[k].byte_len, 40u);
        }
        // A datagram that does not fit is dropped, never completed in error.
        EXPECT_EQ(wc[k].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc[k].status);
      }
    }
    ASSERT_GE(got, 0);
    // Keep the QP stocked with receives. A receive too small for every datagram
    // that comes stays at the head of the queue, so now and then the queue is
    // emptied by a reset and stocked again.
    ibv_qp_attr q{};
    ibv_qp_init_attr qi{};
    ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_STATE, &qi), 0);
    if (q.qp_state == IBV_QPS_ERR || i % 32 == 31) {
      while ((got = ibv_poll_cq(cq, 16, wc)) > 0) {
      }
      a = {};
      a.qp_state = IBV_QPS_RESET;
      ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
      a.qp_state = IBV_QPS_INIT;
      a.port_num = 1;
      a.qkey = 0x1234;
      ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
      a = {};
      a.qp_state = IBV_QPS_RTR;
      ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
      for (int k = 0; k < 16; ++k) ASSERT_NO_FATAL_FAILURE(post_one());
    } else if (i % 16 == 0) {
      ASSERT_NO_FATAL_FAILURE(post_one());
    }
  }
  // The mix reached both outcomes.
  EXPECT_GT(received, 100);
  EXPECT_GT(to->counters().rx_dropped.load() - dropped_before, 10u);
  for (std::size_t b = 0; b < kArena; ++b) {
    if (!may_change[b]) {
      ASSERT_EQ(arena[b], 0xa5) << "byte " << b << " outside every receive buffer changed";
    }
  }
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

}  // namespace
}  // namespace softverbs::fuzz
