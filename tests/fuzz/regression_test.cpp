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
#include <string>
#include <vector>

#include "emu/objects.hpp"
#include "tests/fuzz/harness.hpp"

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

}  // namespace
}  // namespace softverbs::fuzz
