// rdma_cm on two InfiniBand-link-layer devices of one subnet (docs/rdma-cm.md,
// "InfiniBand link layer"): what the kernel's rdma_cm over IPoIB gives.
// Address resolution yields the port GIDs (fe80::/64 + GUID), the route a
// path record with the ports' LIDs, P_Key 0xFFFF and hop limit 0, and the
// QP's address vector is LID-routed (no GRH). A pair of different link
// layers shares no fabric: its REQ is rejected with "invalid GID" (12).
// Public API only; the IPv4 address of an IB device is read from its port
// GID, whose GUID carries it on emulated devices (docs/configuration.md,
// "Identifiers"), so with other devices these tests are skipped.
#include <arpa/inet.h>
#include <rdma/rdma_verbs.h>

#include <cstring>

#include "tests/conformance/cm/cm_connect.hpp"

namespace cmtest {
namespace {

struct IbPort {
  in_addr addr{};
  ibv_gid gid{};
  uint16_t lid = 0;
};

// The InfiniBand devices whose port GID has the emulated GUID form
// fe80::00:00:a:ff:fe:b:c:d (the device at a.b.c.d), in list order.
std::vector<IbPort> ib_ports() {
  std::vector<IbPort> out;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  for (int i = 0; list && i < n; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) continue;
    ibv_port_attr pa{};
    IbPort p;
    if (ibv_query_port(ctx, 1, &pa) == 0 && pa.link_layer == IBV_LINK_LAYER_INFINIBAND &&
        ibv_query_gid(ctx, 1, 0, &p.gid) == 0) {
      const uint8_t* g = p.gid.raw;
      static const uint8_t kHead[10] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0};
      if (std::memcmp(g, kHead, 10) == 0 && g[11] == 0xff && g[12] == 0xfe) {
        const uint8_t b[4] = {g[10], g[13], g[14], g[15]};
        std::memcpy(&p.addr.s_addr, b, 4);
        p.lid = pa.lid;
        out.push_back(p);
      }
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  return out;
}

// A listener on the second IB device, an active id on the first, route resolved.
class IbConnect : public CmConnect {
 protected:
  void SetUp() override {
    CmTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ib_ = ib_ports();
    if (ib_.size() < 2) GTEST_SKIP() << "two emulated InfiniBand devices needed";
    a_ = ib_[0].addr;
    b_ = ib_[1].addr;
    port_ = next_port();
    ASSERT_EQ(rdma_create_id(passive_, &listen_.id, nullptr, RDMA_PS_TCP), 0);
    auto addr = v4(b_, port_);
    ASSERT_EQ(rdma_bind_addr(listen_, sa(addr)), 0);
    ASSERT_EQ(rdma_listen(listen_, 8), 0);
    ASSERT_EQ(rdma_create_id(active_, &client_.id, nullptr, RDMA_PS_TCP), 0);
  }

  std::vector<IbPort> ib_;
};

bool same_gid(const ibv_gid& x, const ibv_gid& y) { return std::memcmp(x.raw, y.raw, 16) == 0; }

TEST_F(IbConnect, AddressAndRouteAreThePortsGidsAndLids) {
  auto src = v4(a_, 0);
  auto dst = v4(b_, port_);
  ASSERT_EQ(rdma_resolve_addr(client_, sa(src), sa(dst), 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
  const auto& ib = client_->route.addr.addr.ibaddr;
  EXPECT_TRUE(same_gid(ib.sgid, ib_[0].gid));
  EXPECT_TRUE(same_gid(ib.dgid, ib_[1].gid));
  EXPECT_EQ(ntohs(ib.pkey), 0xffff);
  ASSERT_EQ(rdma_resolve_route(client_, 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ROUTE_RESOLVED));
  ASSERT_EQ(client_->route.num_paths, 1);
  const ibv_sa_path_rec* p = client_->route.path_rec;
  ASSERT_NE(p, nullptr);
  EXPECT_NE(ib_[0].lid, 0);
  EXPECT_EQ(ntohs(p->slid), ib_[0].lid);
  EXPECT_EQ(ntohs(p->dlid), ib_[1].lid);
  EXPECT_TRUE(same_gid(p->sgid, ib_[0].gid));
  EXPECT_TRUE(same_gid(p->dgid, ib_[1].gid));
  EXPECT_EQ(ntohs(p->pkey), 0xffff);
  EXPECT_EQ(p->hop_limit, 0) << "one subnet: no GRH";
  EXPECT_EQ(p->sl, 0);
  EXPECT_GE(p->mtu, IBV_MTU_256);
  EXPECT_LE(p->mtu, IBV_MTU_4096);
}

TEST_F(IbConnect, RcConnectionIsLidRoutedAndCarriesData) {
  resolve(client_, port_);
  connect_pair();
  if (HasFatalFailure()) return;
  for (auto [id, peer] : {std::pair{client_.id, ib_[1].lid}, std::pair{server_.id, ib_[0].lid}}) {
    ibv_qp_attr attr{};
    int mask = 0;
    attr.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(rdma_init_qp_attr(id, &attr, &mask), 0);
    ASSERT_TRUE(mask & IBV_QP_AV);
    EXPECT_EQ(attr.ah_attr.is_global, 0);
    EXPECT_EQ(attr.ah_attr.dlid, peer);
    EXPECT_EQ(attr.ah_attr.sl, 0);
    EXPECT_EQ(attr.ah_attr.src_path_bits, 0);
    EXPECT_EQ(attr.ah_attr.port_num, 1);
    // What the CM moved the QP with.
    ibv_qp_attr q{};
    ibv_qp_init_attr qi{};
    ASSERT_EQ(ibv_query_qp(id->qp, &q, IBV_QP_AV | IBV_QP_STATE, &qi), 0);
    EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(q.ah_attr.is_global, 0);
    EXPECT_EQ(q.ah_attr.dlid, peer);
  }
  // The passive side's view of the addresses and route.
  EXPECT_TRUE(same_gid(server_->route.addr.addr.ibaddr.sgid, ib_[1].gid));
  EXPECT_TRUE(same_gid(server_->route.addr.addr.ibaddr.dgid, ib_[0].gid));
  ASSERT_NE(server_->route.path_rec, nullptr);
  EXPECT_EQ(ntohs(server_->route.path_rec->slid), ib_[1].lid);
  EXPECT_EQ(ntohs(server_->route.path_rec->dlid), ib_[0].lid);

  char cbuf[64] = "hello over ib", sbuf[64] = {};
  ibv_mr* cmr = rdma_reg_msgs(client_, cbuf, sizeof cbuf);
  ibv_mr* smr = ibv_reg_mr(server_->pd, sbuf, sizeof sbuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(cmr, nullptr);
  ASSERT_NE(smr, nullptr);
  ASSERT_EQ(rdma_post_recv(server_, nullptr, sbuf, sizeof sbuf, smr), 0);
  ASSERT_EQ(rdma_post_send(client_, nullptr, cbuf, sizeof cbuf, cmr, 0), 0);
  ibv_wc wc{};
  ASSERT_EQ(rdma_get_send_comp(client_, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(rdma_get_recv_comp(server_, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.slid, ib_[0].lid);
  EXPECT_STREQ(sbuf, "hello over ib");
  std::strcpy(cbuf, "written over ib");
  ASSERT_EQ(rdma_post_write(client_, nullptr, cbuf, sizeof cbuf, cmr, 0, reinterpret_cast<uint64_t>(sbuf), smr->rkey),
            0);
  ASSERT_EQ(rdma_get_send_comp(client_, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(sbuf, "written over ib");

  ASSERT_EQ(rdma_disconnect(client_), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_DISCONNECTED));
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_DISCONNECTED));
  rdma_dereg_mr(cmr);
  ibv_dereg_mr(smr);
}

// From `from` to a listener at `to` (devices of different link layers):
// the REQ finds no GID of the port for its path, REJECTED with reason 12.
void expect_invalid_gid(Channel& active, Channel& passive, in_addr from, in_addr to) {
  uint16_t port = next_port();
  Id listen(passive);
  auto addr = v4(to, port);
  ASSERT_EQ(rdma_bind_addr(listen, sa(addr)), 0);
  ASSERT_EQ(rdma_listen(listen, 4), 0);
  Id client(active);
  auto src = v4(from, 0);
  ASSERT_EQ(rdma_resolve_addr(client, sa(src), sa(addr), 2000), 0);
  ASSERT_TRUE(ack_expected(active, RDMA_CM_EVENT_ADDR_RESOLVED));
  ASSERT_EQ(rdma_resolve_route(client, 2000), 0);
  ASSERT_TRUE(ack_expected(active, RDMA_CM_EVENT_ROUTE_RESOLVED));
  rdma_conn_param p{};
  p.qp_num = 0x2222;
  ASSERT_EQ(rdma_connect(client, &p), 0);
  ASSERT_TRUE(ack_expected(active, RDMA_CM_EVENT_REJECTED, 12));
  // The REJ answered the REQ: had it reached the listener, its event would be queued.
  EXPECT_EQ(next_event(passive, 0), nullptr) << "no request reaches the listener";
}

TEST_F(IbConnect, MixedLinkLayersAreRejectedWithInvalidGid) {
  // devices_ are the RoCE ones (CmTest); ib_ the InfiniBand ones.
  expect_invalid_gid(active_, passive_, ib_[0].addr, devices_[0].addr);
  if (HasFatalFailure()) return;
  expect_invalid_gid(active_, passive_, devices_[0].addr, ib_[0].addr);
}

}  // namespace
}  // namespace cmtest
