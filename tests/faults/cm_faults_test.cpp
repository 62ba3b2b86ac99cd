// Fault rules that act on the connection manager, through the public rdma_cm
// API and softverbs' control API: a REQ answered with a REJ (`reject`), and a
// bonding failover of the device (`failover`) reported as ADDR_CHANGE.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <climits>
#include <cstring>

#include "softverbs/faults.h"

namespace {

constexpr const char* kSelfAddr = SV_CM_SELF_ADDR;  // the device of this program (CMake sets both)

sockaddr_in addr_of(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

struct Got {
  rdma_cm_event_type type = RDMA_CM_EVENT_ADDR_ERROR;
  int status = INT_MIN;
  std::string data;
};

// The next event of `type` on `ch` within `ms` (others are acknowledged and skipped).
bool wait_for(rdma_event_channel* ch, rdma_cm_event_type type, int ms, Got* got) {
  for (;;) {
    pollfd p{ch->fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return false;
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) != 0) return false;
    bool match = ev->event == type;
    if (match) {
      got->type = ev->event;
      got->status = ev->status;
      if (ev->param.conn.private_data && ev->param.conn.private_data_len)
        got->data.assign(static_cast<const char*>(ev->param.conn.private_data), ev->param.conn.private_data_len);
    }
    rdma_ack_cm_event(ev);
    if (match) return true;
  }
}

class CmFaultActions : public ::testing::Test {
 protected:
  void TearDown() override { softverbs_faults_clear(); }
  int load(const char* text) { return softverbs_faults_load(text, nullptr, 0); }
};

TEST_F(CmFaultActions, RejectActionAnswersTheRequestWithItsReason) {
  ASSERT_EQ(load("[[rule]]\nname = \"refuse\"\ncm = \"REQ\"\ndirection = \"rx\"\naction = \"reject\"\nreason = 28\n"), 0);
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* listen = nullptr;
  rdma_cm_id* client = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &listen, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_create_id(ch, &client, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in a = addr_of(kSelfAddr, 0);
  ASSERT_EQ(rdma_bind_addr(listen, reinterpret_cast<sockaddr*>(&a)), 0);
  ASSERT_EQ(rdma_listen(listen, 1), 0);
  sockaddr_in dst = addr_of(kSelfAddr, ntohs(rdma_get_src_port(listen)));
  Got got;
  ASSERT_EQ(rdma_resolve_addr(client, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  ASSERT_TRUE(wait_for(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 5000, &got));
  ASSERT_EQ(rdma_resolve_route(client, 2000), 0);
  ASSERT_TRUE(wait_for(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 5000, &got));
  rdma_conn_param param{};
  param.qp_num = 0x123;  // no QP: the request is all that matters
  ASSERT_EQ(rdma_connect(client, &param), 0);
  ASSERT_TRUE(wait_for(ch, RDMA_CM_EVENT_REJECTED, 5000, &got));
  EXPECT_EQ(got.status, 28);
  EXPECT_EQ(softverbs_fault_hits("refuse"), 1u);
  EXPECT_EQ(rdma_destroy_id(client), 0);
  EXPECT_EQ(rdma_destroy_id(listen), 0);
  rdma_destroy_event_channel(ch);
}

TEST_F(CmFaultActions, FailoverOfTheDeviceIsAnAddressChange) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in a = addr_of(kSelfAddr, 0);
  ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)), 0);
  ASSERT_EQ(rdma_listen(id, 1), 0);
  ASSERT_EQ(load("[[rule]]\nat_ms = 0\ndevice = \"self\"\naction = \"failover\"\n"), 0);
  Got got;
  ASSERT_TRUE(wait_for(ch, RDMA_CM_EVENT_ADDR_CHANGE, 5000, &got));
  EXPECT_EQ(got.status, 0);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
}

}  // namespace
