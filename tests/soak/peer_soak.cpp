// soak_peer --role=soak (peer.cpp): both sides run the same mix of RC operations
// against each other under packet loss, duplication and reordering, and check every
// completion, message, READ and atomic result.
#include <arpa/inet.h>
#include <inttypes.h>
#include <softverbs/faults.h>

#include "tests/soak/peer.hpp"

namespace soak_peer {
namespace {

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

}  // namespace

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
  connect_qp(e, mine, peer, rc_path(static_cast<uint8_t>(arg_u64("timeout", 13))));

  // A copy of the peer's READ source, to check READs against.
  std::vector<uint8_t> peer_read_src(kReadRegion);
  fill(peer_read_src.data(), peer_read_src.size(), op_key(peer.side, 0) ^ 0x7ead);

  uint64_t recv_posted = 0;
  auto post_recv = [&] {
    post_receive(e, recv_posted, reinterpret_cast<uintptr_t>(recv_buf.data()) + (recv_posted % kRecv) * kMaxMsg,
                 kMaxMsg, recv_mr->lkey);
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
    int rc = ibv_post_send(e.qp.get(), &wr, &bad);
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
    for (ibv_cq* cq : {e.scq.get(), e.rcq.get()}) {
      int n = ibv_poll_cq(cq, 32, wc);
      CHECK(n >= 0, "ibv_poll_cq: %d", n);
      for (int k = 0; k < n; ++k) {
        if (cq == e.scq.get())
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
          qp_state_name(qp_state(e.qp.get())), counters_string(e.device).c_str());
    CHECK(now - last_progress < stall_limit,
          "stalled: nothing completed for %" PRId64 " s: posted %" PRIu64 " completed %" PRIu64 "/%" PRIu64
          " received %" PRIu64 "/%" PRIu64 " credit %" PRIu64 " (peer done: %s); qp 0x%06x %s; %s",
          static_cast<int64_t>(stall_limit.count()), posted, completed, ops, received, expected_messages, credit,
          peer_done ? "yes" : "no", e.qp->qp_num, qp_state_name(qp_state(e.qp.get())),
          counters_string(e.device).c_str());
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
  for (ibv_cq* cq : {e.scq.get(), e.rcq.get()}) {
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
  CHECK(qp_state(e.qp.get()) == IBV_QPS_RTS, "QP in state %s at the end", qp_state_name(qp_state(e.qp.get())));

  std::printf("soak side=%u ops=%" PRIu64 " completed=%" PRIu64 " received=%" PRIu64
              " elapsed_ms=%.0f hits_drop=%" PRIu64 " hits_dup=%" PRIu64 " hits_reorder=%" PRIu64 " %s\n",
              side, ops, completed, received, elapsed_ms, softverbs_fault_hits("drop"), softverbs_fault_hits("dup"),
              softverbs_fault_hits("reorder"), counters_string(e.device).c_str());
  std::fflush(stdout);
  // Both sides leave together: the peer may not be torn down while this one still
  // acknowledges its last packets.
  ctl.send('E');
  ctl.wait_for('E', Clock::now() + std::chrono::seconds(60), on_frame);

  e.close();
  return 0;
}

}  // namespace soak_peer
