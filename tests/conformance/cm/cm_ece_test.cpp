// rdma_cm conformance: enhanced connection establishment (ECE) between ids with
// and without QPs, as librdmacm 44 carries it. An id with a QP offers what
// ibv_query_ece answers for it, and the passive side reads it with
// rdma_get_remote_ece before it makes its own QP; a passive QP made for a REQ
// of another vendor is offered no options, and the REP answers with the vendor
// id the REQ came with.
#include "cm_connect.hpp"

namespace cmtest {
namespace {

TEST_F(CmConnect, EceOfTheActiveQpTravelsInTheReq) {
  auto attr = rc_attr();
  ASSERT_EQ(rdma_create_qp(client_, nullptr, &attr), 0);
  ibv_ece mine{};
  ASSERT_EQ(ibv_query_ece(client_->qp, &mine), 0);
  ASSERT_NE(mine.vendor_id, 0u);
  rdma_conn_param p{};
  p.responder_resources = p.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  rdma_cm_event* req = take_request();
  ASSERT_NE(req, nullptr);
  rdma_ack_cm_event(req);
  ibv_ece remote{};
  ASSERT_EQ(rdma_get_remote_ece(server_, &remote), 0);
  EXPECT_EQ(remote.vendor_id, mine.vendor_id);
  EXPECT_EQ(remote.options, mine.options);
  attr = rc_attr();
  ASSERT_EQ(rdma_create_qp(server_, nullptr, &attr), 0);
  ibv_ece theirs{};
  ASSERT_EQ(ibv_query_ece(server_->qp, &theirs), 0);
  EXPECT_EQ(theirs.vendor_id, mine.vendor_id);
  ASSERT_EQ(rdma_accept(server_, &p), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ESTABLISHED));
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_ESTABLISHED));
  // Both QPs settled on the options they share (none on an emulated device).
  ibv_ece settled{};
  ASSERT_EQ(ibv_query_ece(client_->qp, &settled), 0);
  EXPECT_EQ(settled.options, theirs.options);
}

TEST_F(CmConnect, EceOfAnotherVendorIsAnsweredWithoutOptions) {
  ibv_ece offer{};
  offer.vendor_id = 0x123456;
  offer.options = 0x5;
  ASSERT_EQ(rdma_set_local_ece(client_, &offer), 0);
  rdma_conn_param p{};
  p.qp_num = 0x4321;
  p.responder_resources = p.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  rdma_cm_event* req = take_request();
  ASSERT_NE(req, nullptr);
  rdma_ack_cm_event(req);
  ibv_ece remote{};
  ASSERT_EQ(rdma_get_remote_ece(server_, &remote), 0);
  EXPECT_EQ(remote.vendor_id, offer.vendor_id);
  EXPECT_EQ(remote.options, offer.options);
  auto attr = rc_attr();
  ASSERT_EQ(rdma_create_qp(server_, nullptr, &attr), 0);
  ASSERT_EQ(rdma_accept(server_, &p), 0);
  rdma_cm_event* resp = expect_event(active_, RDMA_CM_EVENT_CONNECT_RESPONSE);
  ASSERT_NE(resp, nullptr);
  rdma_ack_cm_event(resp);
  ibv_ece answer{};
  ASSERT_EQ(rdma_get_remote_ece(client_, &answer), 0);
  EXPECT_EQ(answer.vendor_id, offer.vendor_id);  // the vendor id the REQ came with
  EXPECT_EQ(answer.options, 0u);                 // another vendor's options are not taken
  ASSERT_EQ(rdma_establish(client_), 0);
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_ESTABLISHED));
}

}  // namespace
}  // namespace cmtest
