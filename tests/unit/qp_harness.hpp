// Two emulated devices on virtual time with a wire the test operates by hand,
// and an RC QP pair connected across it: the transport roles (emu/qp/) run as
// in a process, but every packet waits on the wire until the test delivers,
// drops or reorders it, and every timer waits until the test moves the clock.
//
// The devices are built as the device registry builds them (emu Device on a
// Clock, a Scheduler and fault filters, then connect() to a link), with a
// manual clock and scheduler (tests/unit/fake_time.hpp), a fault engine
// without rules, and a FakeWire link each instead of the UDP chain. The verbs
// objects are created through EmuProvider, the data path goes through the
// inline verbs of <infiniband/verbs.h> on the contexts it returns.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "emu/objects/objects.hpp"
#include "emu/provider.hpp"
#include "fabric/link.hpp"
#include "faults/engine.hpp"
#include "tests/unit/fake_time.hpp"
#include "wire/packet.hpp"

namespace softverbs::emu::harness {

using Bytes = std::vector<uint8_t>;

// One packet on the wire, with its headers decoded for the test to look at.
struct Packet {
  in_addr src{}, dst{};
  Bytes bytes;
  wire::Bth bth;
  wire::Aeth aeth;
  const wire::OpcodeInfo* op = nullptr;
  size_t payload = 0;
  uint8_t tos = 0;  // the IPv4 TOS byte it was sent with
  bool gathered = false;  // sent in pieces, without its ICRC (FakeWire::take_gathered)

  uint32_t psn() const { return bth.psn; }
  bool is_request() const { return op->is_request; }
  bool is_ack() const { return !op->is_request && op->has(wire::ext::aeth) && aeth.is_ack(); }
  bool is_rnr_nak() const { return !op->is_request && op->has(wire::ext::aeth) && aeth.is_rnr_nak(); }
  bool is_nak(wire::NakCode code) const {
    return !op->is_request && op->has(wire::ext::aeth) && aeth.is_nak() && aeth.nak_code() == code;
  }
};

inline Packet decode(in_addr src, in_addr dst, std::span<const uint8_t> bytes) {
  Packet p;
  p.src = src;
  p.dst = dst;
  p.bytes.assign(bytes.begin(), bytes.end());
  wire::PacketView v;
  EXPECT_EQ(wire::parse(p.bytes, v), wire::ParseError::ok);
  p.bth = v.bth;
  p.aeth = v.aeth;
  p.op = v.op;
  p.payload = v.payload.size();
  return p;
}

// A device's link in the test's hands. What the device sends is recorded in
// `sent` and waits in `outbox`; the test moves it to the peer's `inbox`, which
// the peer's receive path drains as it drains a socket. With take_gathered it
// also takes packets in pieces (fabric::Link::send_gathered), as a same-host
// ring does: put together, without their ICRC, and received marked so.
class FakeWire final : public fabric::Link {
 public:
  explicit FakeWire(in_addr self) : self_(self) {}
  void attach(fabric::Receiver& receiver) override { up_ = &receiver; }
  void send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos = 0, bool = true) override {
    sent.push_back(decode(self_, dst, packet));
    sent.back().tos = tos;
    outbox.push_back(sent.back());
  }
  bool send_gathered(in_addr dst, const wire::GatheredPacket& packet, uint8_t tos) override {
    if (!take_gathered) return false;
    Bytes bytes(packet.headers.begin(), packet.headers.end());
    for (const auto& piece : packet.payload) bytes.insert(bytes.end(), piece.begin(), piece.end());
    bytes.insert(bytes.end(), packet.tail.begin(), packet.tail.end());
    EXPECT_EQ(bytes.size(), packet.size);
    sent.push_back(decode(self_, dst, bytes));
    sent.back().tos = tos;
    sent.back().gathered = true;
    outbox.push_back(sent.back());
    return true;
  }
  bool drain() override {
    std::deque<Packet> now;
    now.swap(inbox);  // receiving may send, never into the inbox
    for (const Packet& p : now) {
      wire::IpFields ip;
      ip.icrc_skipped = p.gathered;
      up_->receive(p.src, wire::kRoceV2UdpPort, p.bytes, ip);
    }
    return !now.empty();
  }
  void watch() override {}  // nothing arrives on its own: the test delivers
  void inject(in_addr src, uint16_t sport, std::span<const uint8_t> packet) override {
    up_->receive(src, sport, packet);
  }
  std::string rx_state() override { return "fake wire, " + std::to_string(inbox.size()) + " waiting"; }

  std::vector<Packet> sent;   // everything the device sent, in order
  std::deque<Packet> outbox;  // sent, not yet delivered or dropped
  std::deque<Packet> inbox;   // delivered, not yet received
  bool take_gathered = false;

 private:
  in_addr self_;
  fabric::Receiver* up_ = nullptr;
};

inline in_addr ipv4(const char* dotted) {
  in_addr a{};
  inet_pton(AF_INET, dotted, &a);
  return a;
}

// Devices 0 and 1, RoCEv2 with a 1024-byte MTU, each behind a FakeWire.
class TwoDevices {
 public:
  TwoDevices() {
    const char* addrs[2] = {"127.0.1.1", "127.0.1.2"};
    for (int i = 0; i < 2; ++i) {
      DeviceConfig config;
      config.name = "fake" + std::to_string(i);
      config.addr = ipv4(addrs[i]);
      config.active_mtu = IBV_MTU_1024;
      wire_[i] = std::make_unique<FakeWire>(*config.addr);
      dev_[i] = std::make_unique<Device>(config, i, *config.addr, clock, scheduler, no_faults, no_faults);
      dev_[i]->connect(*wire_[i]);
    }
  }

  Device& dev(int i) { return *dev_[i]; }
  FakeWire& wire(int i) { return *wire_[i]; }
  // What device `from` sent and nobody moved yet.
  size_t waiting(int from) { return wire(from).outbox.size(); }

  // Moves the packet at `index` of from's outbox (0: the oldest) to its peer,
  // which receives it at once; returns it.
  Packet deliver(int from, size_t index = 0) {
    Packet p = take(from, index);
    wire(1 - from).inbox.push_back(p);
    dev(1 - from).progress(true);
    return p;
  }
  Packet drop(int from, size_t index = 0) { return take(from, index); }
  void drop_all(int from) { wire(from).outbox.clear(); }
  // Delivers both ways until the wire is empty.
  void settle() {
    while (waiting(0) || waiting(1)) {
      if (waiting(0)) deliver(0);
      if (waiting(1)) deliver(1);
    }
  }
  // Moves virtual time, running the timers that come due on the way.
  void advance(Clock::duration d) { scheduler.advance(d); }

  fake::ManualClock clock;
  fake::ManualScheduler scheduler{clock};
  faults::FaultEngine no_faults{clock, scheduler};  // no rules loaded

 private:
  Packet take(int from, size_t index) {
    auto& box = wire(from).outbox;
    EXPECT_LT(index, box.size());
    Packet p = box.at(index);
    box.erase(box.begin() + static_cast<std::ptrdiff_t>(index));
    return p;
  }

  std::array<std::unique_ptr<FakeWire>, 2> wire_;
  std::array<std::unique_ptr<Device>, 2> dev_;
};

// The connection's attributes (modify_qp to RTR and RTS).
struct RcParams {
  uint8_t timeout = 14;        // local ACK timeout: 4.096 us * 2^14, 67 ms
  uint8_t retry_cnt = 7;       // transport retries
  uint8_t rnr_retry = 7;       // RNR retries (7: forever)
  uint8_t min_rnr_timer = 14;  // the RNR NAK timer code the responder sends: 1.28 ms
  uint32_t sq_psn[2] = {100, 5000};
  uint8_t traffic_class = 0;  // of both QPs' paths
};

// One end of the pair: context, PD, one CQ for both queues, a registered
// buffer, an RC QP.
struct Endpoint {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  Bytes buf = Bytes(64 * 1024);
};

class RcPair : public TwoDevices {
 public:
  explicit RcPair(const RcParams& params = {}) : params_(params) {
    EmuProvider& p = EmuProvider::instance();
    for (int i = 0; i < 2; ++i) {
      Endpoint& e = end_[i];
      e.ctx = p.open_device(dev(i).ibv());
      e.pd = p.alloc_pd(e.ctx);
      e.cq = p.create_cq(e.ctx, 256, nullptr, nullptr, 0);
      e.mr = p.reg_mr_iova2(e.pd, e.buf.data(), e.buf.size(), reinterpret_cast<uintptr_t>(e.buf.data()),
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
      ibv_qp_init_attr init{};
      init.send_cq = init.recv_cq = e.cq;
      init.qp_type = IBV_QPT_RC;
      init.cap.max_send_wr = init.cap.max_recv_wr = 64;
      init.cap.max_send_sge = init.cap.max_recv_sge = 1;
      e.qp = p.create_qp(e.pd, &init);
      EXPECT_TRUE(e.ctx && e.pd && e.cq && e.mr && e.qp);
    }
    for (int i = 0; i < 2; ++i) connect(i);
  }
  ~RcPair() {
    EmuProvider& p = EmuProvider::instance();
    for (Endpoint& e : end_) {
      p.destroy_qp(e.qp);
      p.dereg_mr(e.mr);
      p.destroy_cq(e.cq);
      p.dealloc_pd(e.pd);
      p.close_device(e.ctx);
    }
  }

  const RcParams& params() const { return params_; }
  Endpoint& end(int i) { return end_[i]; }
  ibv_qp* qp(int i) { return end_[i].qp; }

  // A signaled SEND of `len` bytes from the start of the buffer.
  int post_send(int side, uint32_t len, uint64_t wr_id) {
    Endpoint& e = end_[side];
    ibv_sge sge{reinterpret_cast<uintptr_t>(e.buf.data()), len, e.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(e.qp, &wr, &bad);
  }
  // A receive of up to `len` bytes into the second half of the buffer.
  int post_recv(int side, uint32_t len, uint64_t wr_id) {
    Endpoint& e = end_[side];
    ibv_sge sge{reinterpret_cast<uintptr_t>(e.buf.data() + e.buf.size() / 2), len, e.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(e.qp, &wr, &bad);
  }
  // Every completion waiting on the side's CQ.
  std::vector<ibv_wc> poll(int side) {
    std::vector<ibv_wc> out;
    ibv_wc wc[16];
    for (int n; (n = ibv_poll_cq(end_[side].cq, 16, wc)) > 0;) out.insert(out.end(), wc, wc + n);
    return out;
  }
  ibv_qp_state state(int side) {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    EmuProvider::instance().query_qp(qp(side), &attr, IBV_QP_STATE, &init);
    return attr.qp_state;
  }
  // The local ACK timeout of the connection (IBTA 9.7.6.1.3).
  std::chrono::nanoseconds ack_timeout() const { return std::chrono::nanoseconds(int64_t{4096} << params_.timeout); }

 private:
  // INIT, then RTR and RTS towards the peer's QPN and IPv4-mapped GID.
  void connect(int i) {
    EmuProvider& p = EmuProvider::instance();
    const int peer = 1 - i;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    ASSERT_EQ(p.modify_qp(qp(i), &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);

    ibv_gid_entry gid{};
    ASSERT_TRUE(dev(peer).gid_entry(1, &gid));  // index 1: the IPv4-mapped GID
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = qp(peer)->qp_num;
    a.rq_psn = params_.sq_psn[peer];
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = params_.min_rnr_timer;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid.gid;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.traffic_class = params_.traffic_class;
    a.ah_attr.port_num = 1;
    ASSERT_EQ(p.modify_qp(qp(i), &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);

    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = params_.timeout;
    a.retry_cnt = params_.retry_cnt;
    a.rnr_retry = params_.rnr_retry;
    a.sq_psn = params_.sq_psn[i];
    a.max_rd_atomic = 1;
    ASSERT_EQ(p.modify_qp(qp(i), &a,
                          IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                              IBV_QP_MAX_QP_RD_ATOMIC),
              0);
  }

  RcParams params_;
  std::array<Endpoint, 2> end_;
};

}  // namespace softverbs::emu::harness
