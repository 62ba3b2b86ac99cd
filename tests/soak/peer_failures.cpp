// The failure roles of soak_peer (peer.cpp): a peer killed mid-transfer (victim,
// survivor), a receiver slow to post receives (rnr-sender, rnr-receiver), and an
// atomic response lost during go-back-N rounds (lost-requester, lost-responder).
#include <arpa/inet.h>
#include <inttypes.h>
#include <signal.h>
#include <softverbs/faults.h>

#include "tests/soak/peer.hpp"

namespace soak_peer {

// ---------------------------------------------------------------------------
// Peer killed mid-transfer

constexpr uint32_t kBig = 1u << 20;         // RDMA WRITE size
constexpr uint32_t kSendSize = 65536;       // SEND size
constexpr uint32_t kReadSize = 256u << 10;  // RDMA READ size
constexpr uint32_t kVictimRecvs = 32;
constexpr uint32_t kSurvivorRecvs = 8;
constexpr uint8_t kKillTimeout = 12;  // 4.096 us * 2^12 = 16.8 ms
constexpr uint8_t kKillRetries = 3;

namespace {

// Both processes' connection: path MTU 4096, kKillTimeout, kKillRetries, 4 RDMA
// READs in flight each way.
softverbs::testkit::QpPath kill_path() {
  softverbs::testkit::QpPath p = rc_path(kKillTimeout);
  p.path_mtu = IBV_MTU_4096;
  p.retry_cnt = kKillRetries;
  p.max_rd_atomic = p.max_dest_rd_atomic = 4;
  return p;
}

}  // namespace

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
  connect_qp(e, mine, peer, kill_path());
  for (uint32_t i = 0; i < kVictimRecvs; ++i)
    post_receive(e, i, reinterpret_cast<uintptr_t>(recv_buf.data()) + size_t{i} * kSendSize, kSendSize, recv_mr->lkey);
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
  connect_qp(e, mine, peer, kill_path());
  // Receives of this side: the error flushes them too.
  for (uint32_t i = 0; i < kSurvivorRecvs; ++i)
    post_receive(e, 1000 + i, reinterpret_cast<uintptr_t>(recv_buf.data()), 64, recv_mr->lkey);
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
      int rc = ibv_post_send(e.qp.get(), &wr, &bad);
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
    for (ibv_cq* cq : {e.scq.get(), e.rcq.get()}) {
      int n = ibv_poll_cq(cq, 32, wc);
      CHECK(n >= 0, "ibv_poll_cq: %d", n);
      for (int k = 0; k < n; ++k)
        (cq == e.scq.get() ? sends : recvs)
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
            what, static_cast<long long>(limit.count()), posted, sends.size(), recvs.size(),
            qp_state_name(qp_state(e.qp.get())), counters_string(e.device).c_str());
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
  const ibv_qp_state state_after_b = qp_state(e.qp.get());

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
  CHECK(qp_state(e.qp.get()) == IBV_QPS_ERR, "QP in state %s after the error, expected ERR",
        qp_state_name(qp_state(e.qp.get())));

  // A request posted to the QP in the error state is flushed at once.
  post(1);
  wait_until([&] { return sends.size() == posted; }, milliseconds(5000), "the flush of a request posted in ERR");
  CHECK(sends.back().wr_id == posted - 1 && sends.back().status == IBV_WC_WR_FLUSH_ERR,
        "request posted in ERR: wr_id %" PRIu64 " %s", sends.back().wr_id, ibv_wc_status_str(sends.back().status));

  softverbs_counters c{};
  softverbs_device_counters(e.device.c_str(), &c, sizeof c);
  std::printf(
      "survivor timeout=%u retry_cnt=%u posted=%" PRIu64
      " succeeded=%zu done_at_kill=%zu in_flight_at_kill=%zu failed_wr=%zu "
      "dead_ms=%.1f state_after_b=%s error_ms=%.1f last_flush_ms=%.1f timeouts=%" PRIu64 " retransmits=%" PRIu64 "\n",
      kKillTimeout, kKillRetries, posted, failed, done_at_kill, in_flight_at_kill, failed, dead_ms,
      qp_state_name(state_after_b), sends[failed].at_ms, sends[sends.size() - 2].at_ms, c.timeouts, c.retransmits);
  std::fflush(stdout);

  e.close();
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
  connect_qp(e, mine, peer, rc_path(14));  // min_rnr_timer 1: 10 us
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
  for (uint32_t i = 0; i < 2; ++i)
    post_receive(e, i, reinterpret_cast<uintptr_t>(buf.data()) + i * kRnrMsg, kRnrMsg, mr->lkey);
  ctl.send('P');
  if (!sender_done)
    ctl.wait_for('F', Clock::now() + std::chrono::seconds(20),
                 [](char t, uint64_t) { fail("receiver: unexpected control message '%c'", t); });
  // The sender's view decides; the receiver reports what it got.
  ibv_wc wc[4];
  int n = ibv_poll_cq(e.rcq.get(), 4, wc);
  std::printf("rnr-receiver received=%d\n", std::max(n, 0));
  std::fflush(stdout);
  ctl.barrier('E');
  e.close();
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
  // 67 ms: no local ACK timeout while the receiver answers; retry_cnt and
  // rnr_retry 7.
  connect_qp(e, mine, peer, rc_path(14));
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
    CHECK(ibv_post_send(e.qp.get(), &wr, &bad) == 0, "ibv_post_send: %s", std::strerror(errno));
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
    int n = ibv_poll_cq(e.scq.get(), 2, wc);
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
    if (ibv_poll_cq(e.scq.get(), 0, wc) == 0) wait_for_events(e, fd, 50);
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
  e.close();
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
  connect_qp(e, mine, peer, rc_path(14));
  Control ctl(fd);
  ctl.barrier('R');
  ctl.barrier('E', std::chrono::seconds(60));
  std::printf("lost-responder word=%" PRIu64 " atomic_acks_lost=%" PRIu64 "\n", word[0],
              softverbs_fault_hits("lose-atomic-ack"));
  std::fflush(stdout);
  e.close();
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
  softverbs::testkit::QpPath p = rc_path(14);  // retry_cnt 7
  p.max_rd_atomic = p.max_dest_rd_atomic = 4;
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
    CHECK(ibv_post_send(e.qp.get(), &wr, &bad) == 0, "ibv_post_send: %s", std::strerror(errno));
  }
  std::vector<ibv_wc> done;
  const Clock::time_point start = Clock::now();
  while (done.size() <= kLostWrites) {
    CHECK(Clock::now() < start + std::chrono::seconds(30), "requester: %zu of %u completions in 30 s", done.size(),
          kLostWrites + 1);
    ibv_wc wc[16];
    int n = ibv_poll_cq(e.scq.get(), 16, wc);
    CHECK(n >= 0, "ibv_poll_cq: %d", n);
    for (int k = 0; k < n; ++k) done.push_back(wc[k]);
    if (n) continue;
    arm(e);
    if (ibv_poll_cq(e.scq.get(), 0, wc) == 0) wait_for_events(e, -1, 50);
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
  e.close();
  return 0;
}

}  // namespace soak_peer
