// rdma_cm under faults, through the public rdma_cm API and softverbs' control
// API (include/softverbs/faults.h): a port that is down (ROUTE_ERROR), a
// device that fails (DEVICE_REMOVAL), a REQ that never arrives (UNREACHABLE
// once the CM's retries are spent) and a lost REP (the active side resends its
// REQ, the passive side answers it again and the connection is made).
#include "tests/support/cm.hpp"

#include <softverbs/faults.h>

#include <string>

namespace cmtest {
namespace {

class CmFaults : public CmTest {
 protected:
  void TearDown() override {
    softverbs_faults_clear();
    for (auto& d : devices_) softverbs_port_set_state(d.name.c_str(), 1, 1);
  }

  void load(const std::string& toml) {
    char err[256] = {};
    ASSERT_EQ(softverbs_faults_load(toml.c_str(), err, sizeof err), 0) << err;
  }

  // A listener on b; an RC id on a resolved to it, with a QP.
  void prepare(Id& listen, Id& client, uint16_t port) {
    ASSERT_EQ(rdma_create_id(passive_, &listen.id, nullptr, RDMA_PS_TCP), 0);
    auto addr = v4(b_, port);
    ASSERT_EQ(rdma_bind_addr(listen, sa(addr)), 0);
    ASSERT_EQ(rdma_listen(listen, 4), 0);
    ASSERT_EQ(rdma_create_id(active_, &client.id, nullptr, RDMA_PS_TCP), 0);
    auto src = v4(a_, 0);
    ASSERT_EQ(rdma_resolve_addr(client, sa(src), sa(addr), 2000), 0);
    ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
    ASSERT_EQ(rdma_resolve_route(client, 2000), 0);
    ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ROUTE_RESOLVED));
    ibv_qp_init_attr qa{};
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    ASSERT_EQ(rdma_create_qp(client, nullptr, &qa), 0);
  }
};

// The source device's port is down: no route leaves it.
TEST_F(CmFaults, RouteErrorWhenThePortIsDown) {
  Id id(active_);
  auto src = v4(a_, 0);
  auto dst = v4(b_, next_port());
  ASSERT_EQ(rdma_resolve_addr(id, sa(src), sa(dst), 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
  ASSERT_EQ(softverbs_port_set_state(devices_[0].name.c_str(), 1, 0), 0);
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ROUTE_ERROR, -ENETUNREACH));
  ASSERT_EQ(softverbs_port_set_state(devices_[0].name.c_str(), 1, 1), 0);
}

// A device fails: every id on it gets DEVICE_REMOVAL, and can still be destroyed.
TEST_F(CmFaults, DeviceRemovalWhenTheDeviceFails) {
  if (devices_.size() < 3) GTEST_SKIP() << "a third RoCE device is needed (it is failed)";
  Id id(active_);
  auto src = v4(devices_[2].addr, 0);
  auto dst = v4(b_, next_port());
  ASSERT_EQ(rdma_resolve_addr(id, sa(src), sa(dst), 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
  ASSERT_EQ(softverbs_device_fatal(devices_[2].name.c_str()), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_DEVICE_REMOVAL));
  errno = 0;
  EXPECT_EQ(rdma_resolve_route(id, 2000), -1) << "a removed device has no route";
}

// Every REQ is lost: the active side retries (SOFTVERBS_CM_MAX_RETRIES) and
// then reports UNREACHABLE with -ETIMEDOUT; the passive side never hears of it.
TEST_F(CmFaults, LostReqEndsUnreachable) {
  Id listen, client;
  prepare(listen, client, next_port());
  if (HasFatalFailure()) return;
  load("[[rule]]\nname = \"req\"\ncm = \"REQ\"\ndirection = \"tx\"\naction = \"drop\"\n");
  rdma_conn_param p{};
  p.responder_resources = p.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client, &p), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT, 20000));
  EXPECT_GE(softverbs_fault_hits("req"), 2u) << "the REQ was sent again";
  pollfd pf{passive_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&pf, 1, 0), 0) << "the listener saw a request";
}

// The first REP is lost: the active side resends its REQ, the passive side
// recognises the duplicate and answers it (REP again, or MRA then REP), and
// both sides reach ESTABLISHED once.
TEST_F(CmFaults, LostRepIsRecoveredByTheDuplicateReq) {
  Id listen, client;
  prepare(listen, client, next_port());
  if (HasFatalFailure()) return;
  load("[[rule]]\nname = \"rep\"\ncm = \"REP\"\ndirection = \"tx\"\ncount = 1\naction = \"drop\"\n");
  rdma_conn_param p{};
  p.responder_resources = p.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client, &p), 0);
  rdma_cm_event* req = expect_event(passive_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req, nullptr);
  Id server;
  server.reset(req->id);
  rdma_ack_cm_event(req);
  ibv_qp_init_attr qa{};
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  ASSERT_EQ(rdma_create_qp(server, nullptr, &qa), 0);
  ASSERT_EQ(rdma_accept(server, &p), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ESTABLISHED, 0, 10000));
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_ESTABLISHED, 0, 10000));
  EXPECT_EQ(softverbs_fault_hits("rep"), 1u);
  // No second CONNECT_REQUEST for the duplicate.
  pollfd pf{passive_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&pf, 1, 0), 0);
  ASSERT_EQ(rdma_disconnect(client), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_DISCONNECTED));
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_DISCONNECTED));
}

}  // namespace
}  // namespace cmtest
