// rdma_cm conformance over IPv6: each device's IPv6 address is found as a
// program finds it on a kernel RoCE device, in the GID table (a RoCE v2 GID that
// is neither IPv4-mapped nor link-local), and is then bound, resolved, routed,
// listened on and connected to like the IPv4 one. What the kernel's rdma_cm does
// with a netdev's IPv6 address is the reference: the route's GIDs are the IPv6
// ones and the ids' addresses are sockaddr_in6. Public API only.
#include <netdb.h>

#include <cstring>

#include "tests/conformance/cm/cm_connect.hpp"

namespace cmtest {
namespace {

// The first RoCE v2 GID of the device at `addr` that is an IPv6 address of its
// own (not ::ffff:a.b.c.d, not fe80::/10), with its index; false if none.
bool ipv6_gid_of_device(in_addr addr, ibv_gid* out, int* index) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  bool found = false;
  for (int i = 0; list && i < n && !found; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) continue;
    ibv_port_attr pa{};
    bool mine = false;
    if (ibv_query_port(ctx, 1, &pa) == 0 && pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
      static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
      for (int idx = 0; idx < pa.gid_tbl_len && idx < 16; ++idx) {
        ibv_gid g{};
        if (ibv_query_gid(ctx, 1, idx, &g) != 0) break;
        if (std::memcmp(g.raw, kMapped, 12) == 0 && std::memcmp(g.raw + 12, &addr.s_addr, 4) == 0) mine = true;
      }
      for (int idx = 0; mine && idx < pa.gid_tbl_len && idx < 16 && !found; ++idx) {
        ibv_gid_entry e{};
        if (ibv_query_gid_ex(ctx, 1, static_cast<uint32_t>(idx), &e, 0) != 0) continue;  // an empty slot
        const ibv_gid& g = e.gid;
        bool v4mapped = std::memcmp(g.raw, kMapped, 12) == 0;
        bool link_local = g.raw[0] == 0xfe && (g.raw[1] & 0xc0) == 0x80;
        if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && !v4mapped && !link_local) {
          *out = g;
          *index = idx;
          found = true;
        }
      }
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  return found;
}

sockaddr_in6 v6(const ibv_gid& g, uint16_t port) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(port);
  std::memcpy(a.sin6_addr.s6_addr, g.raw, 16);
  return a;
}

bool same_gid(const void* a, const ibv_gid& b) { return std::memcmp(a, b.raw, 16) == 0; }

// A listener on b's IPv6 address and an active id on a's whose route is resolved.
class CmIpv6 : public CmConnect {
 protected:
  void SetUp() override {
    CmTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!ipv6_gid_of_device(a_, &ga_, &index_a_) || !ipv6_gid_of_device(b_, &gb_, &index_b_))
      GTEST_SKIP() << "the devices have no IPv6 GID";
    port_ = next_port();
    ASSERT_EQ(rdma_create_id(passive_, &listen_.id, nullptr, RDMA_PS_TCP), 0);
    auto addr = v6(gb_, port_);
    ASSERT_EQ(rdma_bind_addr(listen_, sa(addr)), 0);
    ASSERT_EQ(rdma_listen(listen_, 8), 0);
    ASSERT_EQ(rdma_create_id(active_, &client_.id, nullptr, RDMA_PS_TCP), 0);
    auto src = v6(ga_, 0);
    auto dst = v6(gb_, port_);
    ASSERT_EQ(rdma_resolve_addr(client_, sa(src), sa(dst), 2000), 0);
    ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
    ASSERT_EQ(rdma_resolve_route(client_, 2000), 0);
    ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ROUTE_RESOLVED));
  }

  ibv_gid ga_{}, gb_{};
  int index_a_ = -1, index_b_ = -1;
};

// The IPv6 GID is listed beside the IPv4-mapped one, which keeps its index.
TEST_F(CmTest, EachDeviceHasAnIpv6GidBesideTheIpv4MappedOne) {
  ibv_gid g{};
  int index = -1;
  ASSERT_TRUE(ipv6_gid_of_device(a_, &g, &index));
  EXPECT_GT(index, 1) << "after the link-local and the IPv4-mapped GIDs";
  ibv_gid other{};
  int other_index = -1;
  ASSERT_TRUE(ipv6_gid_of_device(b_, &other, &other_index));
  EXPECT_FALSE(same_gid(other.raw, g)) << "each device has its own";
}

TEST_F(CmIpv6, BindGivesTheDeviceAndASockaddrIn6) {
  Id id(active_);
  auto addr = v6(ga_, next_port());
  ASSERT_EQ(rdma_bind_addr(id, sa(addr)), 0);
  EXPECT_NE(id->verbs, nullptr) << "the address names its device";
  EXPECT_EQ(id->verbs, client_->verbs) << "the device of a's IPv4 address";
  auto* local = reinterpret_cast<sockaddr_in6*>(rdma_get_local_addr(id));
  ASSERT_EQ(local->sin6_family, AF_INET6);
  EXPECT_EQ(std::memcmp(&local->sin6_addr, &addr.sin6_addr, 16), 0);
  EXPECT_EQ(rdma_get_src_port(id), addr.sin6_port);

  // The IPv4 and the IPv6 address are two addresses: the same port on each is free.
  Id on_v4(active_);
  auto same_port_v4 = v4(a_, ntohs(addr.sin6_port));
  EXPECT_EQ(rdma_bind_addr(on_v4, sa(same_port_v4)), 0);
  Id again(active_);
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(again, sa(addr)), -1);
  EXPECT_EQ(errno, EADDRINUSE);
}

TEST_F(CmTest, AnIpv6AddressNoDeviceHasIsStillRefused) {
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_port = htons(next_port());
  inet_pton(AF_INET6, "2001:db8::1", &addr.sin6_addr);  // documentation prefix: no device
  Id id(active_);
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(id, sa(addr)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  errno = 0;
  EXPECT_EQ(rdma_resolve_addr(id, nullptr, sa(addr), 2000), -1);
  EXPECT_EQ(errno, EINVAL);
}

// The resolved address and the route carry the IPv6 GIDs, not the IPv4-mapped ones.
TEST_F(CmIpv6, ResolveAndRouteUseTheIpv6Gids) {
  EXPECT_TRUE(same_gid(client_->route.addr.addr.ibaddr.sgid.raw, ga_));
  EXPECT_TRUE(same_gid(client_->route.addr.addr.ibaddr.dgid.raw, gb_));
  ASSERT_EQ(client_->route.num_paths, 1);
  EXPECT_TRUE(same_gid(client_->route.path_rec->sgid.raw, ga_));
  EXPECT_TRUE(same_gid(client_->route.path_rec->dgid.raw, gb_));
  auto* peer = reinterpret_cast<sockaddr_in6*>(rdma_get_peer_addr(client_));
  ASSERT_EQ(peer->sin6_family, AF_INET6);
  EXPECT_TRUE(same_gid(peer->sin6_addr.s6_addr, gb_));
  EXPECT_EQ(ntohs(rdma_get_dst_port(client_)), port_);
}

// A wildcard source takes the source device's IPv6 address for an IPv6 destination.
TEST_F(CmIpv6, AWildcardSourceBecomesTheDevicesIpv6Address) {
  Id id(active_);
  auto dst = v6(gb_, port_);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
  auto* local = reinterpret_cast<sockaddr_in6*>(rdma_get_local_addr(id));
  ASSERT_EQ(local->sin6_family, AF_INET6);
  EXPECT_TRUE(same_gid(local->sin6_addr.s6_addr, gb_)) << "the destination's own device is the source";
  EXPECT_TRUE(same_gid(id->route.addr.addr.ibaddr.sgid.raw, gb_));
}

// Connect and accept over IPv6; the QPs address each other with the IPv6 GIDs
// and a SEND goes through.
TEST_F(CmIpv6, ConnectAcceptAndSend) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto* local = reinterpret_cast<sockaddr_in6*>(rdma_get_local_addr(server_));
  auto* peer = reinterpret_cast<sockaddr_in6*>(rdma_get_peer_addr(server_));
  ASSERT_EQ(local->sin6_family, AF_INET6);
  ASSERT_EQ(peer->sin6_family, AF_INET6);
  EXPECT_TRUE(same_gid(local->sin6_addr.s6_addr, gb_));
  EXPECT_TRUE(same_gid(peer->sin6_addr.s6_addr, ga_));
  EXPECT_EQ(peer->sin6_port, rdma_get_src_port(client_));
  EXPECT_TRUE(same_gid(server_->route.path_rec->sgid.raw, gb_));
  EXPECT_TRUE(same_gid(server_->route.path_rec->dgid.raw, ga_));

  for (auto [id, gid, index] : {std::tuple{client_.id, gb_, index_a_}, std::tuple{server_.id, ga_, index_b_}}) {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    ASSERT_EQ(ibv_query_qp(id->qp, &attr, IBV_QP_AV | IBV_QP_STATE, &init), 0);
    EXPECT_EQ(attr.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(attr.ah_attr.is_global, 1);
    EXPECT_EQ(attr.ah_attr.grh.sgid_index, index) << "the device's IPv6 GID";
    EXPECT_TRUE(same_gid(attr.ah_attr.grh.dgid.raw, gid)) << "the peer's IPv6 GID";
  }

  char out[32] = "over ipv6", in[32] = {};
  ibv_mr* smr = ibv_reg_mr(client_->pd, out, sizeof out, 0);
  ibv_mr* rmr = ibv_reg_mr(server_->pd, in, sizeof in, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(smr, nullptr);
  ASSERT_NE(rmr, nullptr);
  ibv_sge rsge{reinterpret_cast<uintptr_t>(in), sizeof in, rmr->lkey};
  ibv_recv_wr rwr{}, *bad_r = nullptr;
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ASSERT_EQ(ibv_post_recv(server_->qp, &rwr, &bad_r), 0);
  ibv_sge ssge{reinterpret_cast<uintptr_t>(out), sizeof out, smr->lkey};
  ibv_send_wr swr{}, *bad_s = nullptr;
  swr.sg_list = &ssge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  ASSERT_EQ(ibv_post_send(client_->qp, &swr, &bad_s), 0);
  auto poll_one = [](ibv_cq* cq, ibv_wc* wc) {
    for (int i = 0; i < 5000; ++i) {  // bounded: 5 s of 1 ms polls
      int n = ibv_poll_cq(cq, 1, wc);
      if (n) return n;
      pollfd none{};
      poll(&none, 0, 1);
    }
    return 0;
  };
  ibv_wc wc{};
  ASSERT_EQ(poll_one(server_->recv_cq, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(in, "over ipv6");
  ASSERT_EQ(poll_one(client_->send_cq, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ibv_dereg_mr(smr);
  ibv_dereg_mr(rmr);
}

// A listener on b's IPv4 address does not take requests to b's IPv6 address
// (two addresses): the request is rejected as for a port nobody listens on.
TEST_F(CmIpv6, AnIpv4ListenerDoesNotTakeIpv6Requests) {
  Id v4_listener(passive_);
  uint16_t port = next_port();
  auto addr = v4(b_, port);
  ASSERT_EQ(rdma_bind_addr(v4_listener, sa(addr)), 0);
  ASSERT_EQ(rdma_listen(v4_listener, 8), 0);
  Id id(active_);
  auto dst = v6(gb_, port);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ROUTE_RESOLVED));
  auto attr = rc_attr();
  ASSERT_EQ(rdma_create_qp(id, nullptr, &attr), 0);
  rdma_conn_param p{};
  ASSERT_EQ(rdma_connect(id, &p), 0);
  rdma_cm_event* ev = expect_event(active_, RDMA_CM_EVENT_REJECTED, 8);  // IBTA: invalid service ID
  if (ev) rdma_ack_cm_event(ev);
  pollfd pf{passive_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&pf, 1, 0), 0) << "no CONNECT_REQUEST for the IPv4 listener";
}

// SIDR over IPv6: the ESTABLISHED event's address vector uses the IPv6 GIDs, and
// a datagram sent with it arrives. Its GRH area holds the IPv4 header the
// datagram travelled with (docs/wire.md §1.1, §1.5).
TEST_F(CmIpv6, UdSidrGivesAnIpv6AddressVector) {
  Id listener(passive_, RDMA_PS_UDP);
  uint16_t port = next_port();
  auto addr = v6(gb_, port);
  ASSERT_EQ(rdma_bind_addr(listener, sa(addr)), 0);
  ASSERT_EQ(rdma_listen(listener, 4), 0);
  Id client(active_, RDMA_PS_UDP);
  auto dst = v6(gb_, port);
  ASSERT_EQ(rdma_resolve_addr(client, nullptr, sa(dst), 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
  ASSERT_EQ(rdma_resolve_route(client, 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ROUTE_RESOLVED));
  auto ud_attr = [] {
    ibv_qp_init_attr a{};
    a.qp_type = IBV_QPT_UD;
    a.cap.max_send_wr = a.cap.max_recv_wr = 4;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.sq_sig_all = 1;
    return a;
  };
  auto attr = ud_attr();
  ASSERT_EQ(rdma_create_qp(client, nullptr, &attr), 0);
  rdma_conn_param p{};
  ASSERT_EQ(rdma_connect(client, &p), 0);
  rdma_cm_event* req = expect_event(passive_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req, nullptr);
  Id server;
  server.reset(req->id);
  rdma_ack_cm_event(req);
  auto* peer = reinterpret_cast<sockaddr_in6*>(rdma_get_peer_addr(server));
  ASSERT_EQ(peer->sin6_family, AF_INET6);
  EXPECT_TRUE(same_gid(peer->sin6_addr.s6_addr, gb_)) << "a wildcard source: the destination's device";
  attr = ud_attr();  // rdma_create_qp filled in the client's CQs
  ASSERT_EQ(rdma_create_qp(server, nullptr, &attr), 0);
  ASSERT_EQ(rdma_accept(server, nullptr), 0);
  rdma_cm_event* est = expect_event(active_, RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_NE(est, nullptr);
  rdma_ud_param ud = est->param.ud;
  rdma_ack_cm_event(est);
  EXPECT_EQ(ud.ah_attr.is_global, 1);
  EXPECT_EQ(ud.ah_attr.grh.sgid_index, index_b_) << "the source device's IPv6 GID";
  EXPECT_TRUE(same_gid(ud.ah_attr.grh.dgid.raw, gb_));
  ibv_ah* ah = ibv_create_ah(client->pd, &ud.ah_attr);
  ASSERT_NE(ah, nullptr) << strerror(errno);

  char rbuf[40 + 32] = {}, sbuf[32] = "ud over ipv6";
  ibv_mr* rmr = ibv_reg_mr(server->pd, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* smr = ibv_reg_mr(client->pd, sbuf, sizeof sbuf, 0);
  ASSERT_NE(rmr, nullptr);
  ASSERT_NE(smr, nullptr);
  ibv_sge rsge{reinterpret_cast<uintptr_t>(rbuf), sizeof rbuf, rmr->lkey};
  ibv_recv_wr rwr{}, *rbad = nullptr;
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ASSERT_EQ(ibv_post_recv(server->qp, &rwr, &rbad), 0);
  ibv_sge ssge{reinterpret_cast<uintptr_t>(sbuf), sizeof sbuf, smr->lkey};
  ibv_send_wr swr{}, *sbad = nullptr;
  swr.sg_list = &ssge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.wr.ud.ah = ah;
  swr.wr.ud.remote_qpn = ud.qp_num;
  swr.wr.ud.remote_qkey = ud.qkey;
  ASSERT_EQ(ibv_post_send(client->qp, &swr, &sbad), 0);
  ibv_wc wc{};
  int got = 0;
  for (int i = 0; i < 5000 && got == 0; ++i) {  // bounded: 5 s of 1 ms polls
    got = ibv_poll_cq(server->recv_cq, 1, &wc);
    pollfd none{};
    if (!got) poll(&none, 0, 1);
  }
  ASSERT_EQ(got, 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(rbuf + 40, "ud over ipv6");
  EXPECT_EQ(static_cast<uint8_t>(rbuf[20]) >> 4, 4) << "the GRH area holds an IPv4 header";
  ibv_destroy_ah(ah);
  ibv_dereg_mr(rmr);
  ibv_dereg_mr(smr);
}

// rdma_getaddrinfo takes the address as text and gives a sockaddr_in6 that
// rdma_resolve_addr accepts.
TEST_F(CmIpv6, GetaddrinfoGivesTheIpv6Address) {
  char text[INET6_ADDRSTRLEN];
  ASSERT_NE(inet_ntop(AF_INET6, gb_.raw, text, sizeof text), nullptr);
  rdma_addrinfo hints{}, *res = nullptr;
  hints.ai_port_space = RDMA_PS_TCP;
  hints.ai_flags = RAI_NUMERICHOST;
  ASSERT_EQ(rdma_getaddrinfo(text, std::to_string(port_).c_str(), &hints, &res), 0);
  ASSERT_NE(res, nullptr);
  EXPECT_EQ(res->ai_family, AF_INET6);
  ASSERT_NE(res->ai_dst_addr, nullptr);
  auto* dst = reinterpret_cast<sockaddr_in6*>(res->ai_dst_addr);
  EXPECT_TRUE(same_gid(dst->sin6_addr.s6_addr, gb_));
  Id id(active_);
  EXPECT_EQ(rdma_resolve_addr(id, nullptr, res->ai_dst_addr, 2000), 0);
  EXPECT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
  rdma_freeaddrinfo(res);
}

}  // namespace
}  // namespace cmtest
