// The emulated CM against hostile input on QP1 (emu/cm/protocol.cpp): packets
// injected into a device's receive path (Device::inject) that are garbage,
// truncated, carry the wrong Q_Key, or are well-formed CM MADs naming comm IDs
// nobody handed out. None may crash the CM or change its state: each is
// dropped and counted (EmuCm::Stats), a listener sees no event, and the only
// answer is the DREP Linux also sends for an unknown DREQ (cm_issue_drep).
// The process has the default one emulated device.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include "emu/cm/cm.hpp"
#include "emu/objects/objects.hpp"
#include "wire/cm_mad.hpp"
#include "wire/packet.hpp"

namespace softverbs::emu {
namespace {

namespace w = wire::cm;

class CmHostile : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ibv_context** list = cm_.get_devices(&n);
    if (!list || n == 0) GTEST_SKIP() << "no emulated device";
    cm_.free_devices(list);
    dev_ = DeviceRegistry::instance().devices().front();
    // A stranger's address in 127/8 (no device of this process has it).
    inet_pton(AF_INET, "127.201.0.9", &src_);
    ch_ = cm_.create_event_channel();
    ASSERT_NE(ch_, nullptr);
    ASSERT_EQ(cm_.create_id(ch_, &listen_, nullptr, RDMA_PS_TCP), 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr = dev_->addr();
    a.sin_port = htons(18515);
    ASSERT_EQ(cm_.bind_addr(listen_, reinterpret_cast<sockaddr*>(&a)), 0);
    ASSERT_EQ(cm_.listen(listen_, 4), 0);
  }
  void TearDown() override {
    if (listen_) cm_.destroy_id(listen_);
    if (ch_) cm_.destroy_event_channel(ch_);
  }

  // A GMP (UD SEND ONLY to QP1) with the given payload and Q_Key and a valid ICRC.
  void inject(std::span<const uint8_t> payload, uint32_t qkey = w::kGsiQkey) {
    wire::PacketHeaders h;
    h.bth.opcode = 0x64;  // UD SEND ONLY
    h.bth.dest_qp = w::kGsiQpn;
    h.bth.psn = psn_++;
    h.deth.qkey = qkey;
    h.deth.src_qp = w::kGsiQpn;
    std::vector<uint8_t> pkt(64 + payload.size());
    wire::IcrcFlow flow{dev_->flow(src_, dev_->addr())};
    size_t n = wire::build(h, payload, pkt, &flow);
    ASSERT_NE(n, 0u);
    dev_->inject(src_, std::span<const uint8_t>(pkt.data(), n));
  }
  void inject(const w::Message& msg, uint64_t tid = 0x1234) {
    std::array<uint8_t, w::kMadSize> mad{};
    w::MadHeader hdr;
    hdr.tid = tid;
    w::encode(hdr, msg, mad);
    inject(mad);
  }

  bool event_queued() {
    pollfd p{ch_->fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
  }

  EmuCm& cm_ = EmuCm::instance();
  Device* dev_ = nullptr;
  in_addr src_{};
  rdma_event_channel* ch_ = nullptr;
  rdma_cm_id* listen_ = nullptr;
  uint32_t psn_ = 0;
};

TEST_F(CmHostile, GarbageTruncatedAndWrongQkeyAreDropped) {
  const auto& s = cm_.stats();
  uint64_t dropped = s.rx_dropped, tx = s.tx;
  std::mt19937 rng(7);
  std::array<uint8_t, w::kMadSize> junk{};
  for (int i = 0; i < 200; ++i) {
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    junk[1] = i % 2 ? w::kMgmtClassCm : junk[1];  // half of them claim the CM class
    inject(junk);
  }
  EXPECT_EQ(s.rx_dropped - dropped, 200u);

  // A valid REQ's MAD cut short, and a whole one with another Q_Key.
  std::array<uint8_t, w::kMadSize> mad{};
  w::MadHeader hdr;
  w::Req req;
  req.local_comm_id = 77;
  w::encode(hdr, w::Message{req}, mad);
  for (size_t len : {0ul, 1ul, 24ul, 100ul, 255ul}) inject(std::span<const uint8_t>(mad.data(), len));
  inject(mad, 0x12345678);
  EXPECT_EQ(s.rx_dropped - dropped, 206u);
  EXPECT_EQ(s.tx, tx) << "nothing is answered";
  EXPECT_FALSE(event_queued());
}

TEST_F(CmHostile, MessagesForUnknownConnectionsChangeNothing) {
  const auto& s = cm_.stats();
  uint64_t unmatched = s.rx_unmatched, tx = s.tx;
  w::Rep rep;
  rep.local_comm_id = 0x1111;
  rep.remote_comm_id = 0xdeadbeef;
  inject(w::Message{rep});
  w::Rtu rtu;
  rtu.local_comm_id = 0x2222;
  rtu.remote_comm_id = 0xdeadbeef;
  inject(w::Message{rtu});
  w::Mra mra;
  mra.local_comm_id = 0x3333;
  mra.remote_comm_id = 0xdeadbeef;
  inject(w::Message{mra});
  w::Rej rej;
  rej.local_comm_id = 0x4444;
  rej.remote_comm_id = 0xdeadbeef;
  inject(w::Message{rej});
  w::Drep drep;
  drep.local_comm_id = 0x5555;
  drep.remote_comm_id = 0xdeadbeef;
  inject(w::Message{drep});
  w::SidrRep sidr;
  sidr.request_id = 0xdeadbeef;
  inject(w::Message{sidr});
  EXPECT_GE(s.rx_unmatched - unmatched, 5u);
  EXPECT_EQ(s.tx, tx) << "only a DREQ is answered";
  EXPECT_FALSE(event_queued());

  // An unknown DREQ gets a DREP (so that its sender stops), nothing else.
  w::Dreq dreq;
  dreq.local_comm_id = 0x6666;
  dreq.remote_comm_id = 0xdeadbeef;
  inject(w::Message{dreq});
  EXPECT_EQ(s.tx, tx + 1);
  EXPECT_FALSE(event_queued());
}

// Well-formed CM MADs of every kind with random fields: whatever they claim,
// the CM survives, and its listener can still be destroyed afterwards.
TEST_F(CmHostile, RandomFieldsInEveryMessageKind) {
  std::mt19937 rng(11);
  for (int i = 0; i < 2000; ++i) {
    std::array<uint8_t, w::kMadSize> mad{};
    w::MadHeader hdr;
    w::Message msgs[] = {w::Req{},  w::Mra{},  w::Rej{},     w::Rep{},    w::Rtu{},
                         w::Dreq{}, w::Drep{}, w::SidrReq{}, w::SidrRep{}};
    w::encode(hdr, msgs[i % 9], mad);
    for (size_t b = 24; b < mad.size(); ++b)
      if (rng() % 4 == 0) mad[b] = static_cast<uint8_t>(rng());
    inject(mad);
  }
  // Requests that decoded may have reached the listener: take and reject them.
  for (int guard = 0; guard < 4096 && event_queued(); ++guard) {
    rdma_cm_event* ev = nullptr;
    ASSERT_EQ(cm_.get_cm_event(ch_, &ev), 0);
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_cm_id* child = ev->id;
      cm_.ack_cm_event(ev);
      cm_.reject(child, nullptr, 0);
      cm_.destroy_id(child);
    } else {
      cm_.ack_cm_event(ev);
    }
  }
  EXPECT_EQ(cm_.destroy_id(listen_), 0);
  listen_ = nullptr;
}

// REQs that reach the listener (its service ID, a valid CMA header) with
// random values everywhere else, each sent twice: a request is reported once
// per connection, and the consumer can reject and destroy each.
TEST_F(CmHostile, RandomRequestsToAListener) {
  std::mt19937 rng(5);
  int requests = 0;
  for (int i = 0; i < 300; ++i) {
    w::Req req;
    req.local_comm_id = 0x70000000u + static_cast<uint32_t>(i);
    req.service_id = w::kIpServicePrefix | w::service_id(RDMA_PS_TCP, 18515);
    req.local_qpn = rng() & 0xFFFFFF;
    req.starting_psn = rng() & 0xFFFFFF;
    req.responder_resources = static_cast<uint8_t>(rng());
    req.initiator_depth = static_cast<uint8_t>(rng());
    req.path_mtu = rng() & 0xF;
    req.transport = static_cast<w::Transport>(rng() & 3);
    req.remote_cm_response_timeout = rng() & 0x1F;
    req.local_cm_response_timeout = rng() & 0x1F;
    req.max_cm_retries = rng() & 0xF;
    req.srq = rng() & 1;
    req.primary.hop_limit = static_cast<uint8_t>(rng());
    req.primary.local_ack_timeout = rng() & 0x1F;
    for (auto& b : req.primary.local_gid) b = static_cast<uint8_t>(rng());
    w::CmaHeader h;
    h.ip_version = i % 5 == 0 ? static_cast<uint8_t>(rng() & 0xF) : 4;
    h.src_port = static_cast<uint16_t>(rng());
    for (auto& b : h.src_addr) b = static_cast<uint8_t>(rng());
    in_addr mine = dev_->addr();
    if (i % 2) std::memcpy(h.dst_addr.data() + 12, &mine.s_addr, 4);
    w::encode(h, std::span<uint8_t, w::CmaHeader::kSize>(req.private_data.data(), w::CmaHeader::kSize));
    inject(w::Message{req}, 0x9000 + i);
    inject(w::Message{req}, 0x9000 + i);  // a duplicate
    while (event_queued()) {
      rdma_cm_event* ev = nullptr;
      ASSERT_EQ(cm_.get_cm_event(ch_, &ev), 0);
      rdma_cm_id* child = ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? ev->id : nullptr;
      cm_.ack_cm_event(ev);
      if (!child) continue;
      ++requests;
      EXPECT_EQ(cm_.reject(child, nullptr, 0), 0);
      EXPECT_EQ(cm_.destroy_id(child), 0);
    }
  }
  EXPECT_GT(requests, 0) << "no REQ reached the listener";
  EXPECT_LE(requests, 300) << "a duplicate REQ was reported as a new request";
}

// rdma_listen's backlog: requests the application has not yet taken. With a
// backlog of 1, a second REQ is dropped unanswered (the requester will resend
// it) until the first is taken; then a REQ gets through again.
TEST_F(CmHostile, BacklogDropsRequestsBeyondIt) {
  ASSERT_EQ(cm_.listen(listen_, 1), 0);
  const auto& s = cm_.stats();
  auto req_from = [&](uint32_t comm_id) {
    w::Req req;
    req.local_comm_id = comm_id;
    req.service_id = w::kIpServicePrefix | w::service_id(RDMA_PS_TCP, 18515);
    w::CmaHeader h;
    in_addr mine = dev_->addr();
    std::memcpy(h.dst_addr.data() + 12, &mine.s_addr, 4);
    w::encode(h, std::span<uint8_t, w::CmaHeader::kSize>(req.private_data.data(), w::CmaHeader::kSize));
    return req;
  };
  auto take = [&] {
    rdma_cm_event* ev = nullptr;
    EXPECT_EQ(cm_.get_cm_event(ch_, &ev), 0);
    if (!ev) return;
    EXPECT_EQ(ev->event, RDMA_CM_EVENT_CONNECT_REQUEST);
    rdma_cm_id* child = ev->id;
    cm_.ack_cm_event(ev);
    cm_.reject(child, nullptr, 0);
    cm_.destroy_id(child);
  };
  uint64_t dropped = s.rx_dropped, tx = s.tx;
  inject(w::Message{req_from(0x51000001)});
  inject(w::Message{req_from(0x51000002)});
  EXPECT_EQ(s.rx_dropped - dropped, 1u) << "the second REQ is beyond the backlog";
  EXPECT_EQ(s.tx, tx) << "and is not answered";
  ASSERT_TRUE(event_queued());
  take();
  EXPECT_FALSE(event_queued()) << "only one request was reported";
  inject(w::Message{req_from(0x51000002)});  // the resend
  ASSERT_TRUE(event_queued());
  take();
}

// A peer of ours is a UDP socket on 127.201.0.9:4791 (so the emulated ARP
// answers for it): it reads the REQ the CM sends and answers with a REP. A REP
// naming the right comm IDs but coming from another address belongs to no
// connection of ours and changes nothing; the peer's own REP is taken.
TEST_F(CmHostile, AnswersFromAnotherAddressAreNotTheConnections) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(4791);
  peer.sin_addr = src_;
  if (bind(fd, reinterpret_cast<sockaddr*>(&peer), sizeof peer) != 0) {
    close(fd);
    GTEST_SKIP() << "cannot bind 127.201.0.9:4791";
  }
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(cm_.create_id(ch_, &id, nullptr, RDMA_PS_TCP), 0);
  peer.sin_port = htons(18516);
  ASSERT_EQ(cm_.resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&peer), 2000), 0);
  auto expect_event = [&](rdma_cm_event_type type) {
    pollfd p{ch_->fd, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 2000), 1) << "no " << type;
    rdma_cm_event* ev = nullptr;
    ASSERT_EQ(cm_.get_cm_event(ch_, &ev), 0);
    EXPECT_EQ(ev->event, type);
    cm_.ack_cm_event(ev);
  };
  expect_event(RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_EQ(cm_.resolve_route(id, 2000), 0);
  expect_event(RDMA_CM_EVENT_ROUTE_RESOLVED);
  rdma_conn_param param{};
  param.qp_num = 0x123;
  ASSERT_EQ(cm_.connect(id, &param), 0);

  // The REQ, as the peer receives it.
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 2000), 1);
  std::array<uint8_t, 512> buf{};
  ssize_t n = recv(fd, buf.data(), buf.size(), 0);
  close(fd);
  wire::PacketView pkt;
  ASSERT_EQ(wire::parse(std::span<const uint8_t>(buf.data(), static_cast<size_t>(n)), pkt), wire::ParseError::ok);
  w::MadHeader hdr;
  w::Message msg;
  ASSERT_EQ(w::decode(pkt.payload.first(w::kMadSize), hdr, msg), w::MadError::ok);
  auto* req = std::get_if<w::Req>(&msg);
  ASSERT_NE(req, nullptr);

  w::Rep rep;
  rep.local_comm_id = 0x600d;
  rep.remote_comm_id = req->local_comm_id;
  rep.local_qpn = 0x456;
  const auto& s = cm_.stats();
  uint64_t unmatched = s.rx_unmatched;
  in_addr real = src_;
  inet_pton(AF_INET, "127.201.0.10", &src_);  // a stranger who guessed the comm ID
  inject(w::Message{rep}, hdr.tid);
  EXPECT_EQ(s.rx_unmatched - unmatched, 1u);
  EXPECT_FALSE(event_queued()) << "a stranger's REP was taken";
  src_ = real;
  inject(w::Message{rep}, hdr.tid);
  expect_event(RDMA_CM_EVENT_CONNECT_RESPONSE);
  cm_.destroy_id(id);
}

}  // namespace
}  // namespace softverbs::emu
