// rdma_cm multicast on RoCE through the public API: rdma_join_multicast(_ex)
// completes locally with MULTICAST_JOIN (the group's address handle, QPN
// 0xFFFFFF, RDMA_UDP_QKEY, the join's context), librdmacm's attach of the id's
// QP, rdma_leave_multicast, the errors, and MULTICAST_ERROR when the port is
// down or the device fails. Groups are 239.201.1.x, used by no other test.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <softverbs/faults.h>

#include <cerrno>
#include <cstring>

namespace {

sockaddr_in v4(const char* ip) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

ibv_gid mapped(const char* ip) {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  inet_pton(AF_INET, ip, g.raw + 12);
  return g;
}

class CmMcast : public ::testing::Test {
 protected:
  void SetUp() override {
    ch_ = rdma_create_event_channel();
    ASSERT_NE(ch_, nullptr) << std::strerror(errno);
    ASSERT_EQ(rdma_create_id(ch_, &id_, this, RDMA_PS_UDP), 0) << std::strerror(errno);
    // The first device's address, from its IPv4-mapped RoCEv2 GID.
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ASSERT_GE(n, 1);
    name_ = ibv_get_device_name(list[0]);
    ibv_context* ctx = ibv_open_device(list[0]);
    ibv_gid g{};
    ASSERT_EQ(ibv_query_gid(ctx, 1, 1, &g), 0);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    local_.sin_family = AF_INET;
    std::memcpy(&local_.sin_addr, g.raw + 12, 4);
  }
  void TearDown() override {
    if (id_) {
      if (id_->qp) rdma_destroy_qp(id_);
      rdma_destroy_id(id_);
    }
    if (ch_) rdma_destroy_event_channel(ch_);
  }

  void bind_and_create_qp() {
    ASSERT_EQ(rdma_bind_addr(id_, reinterpret_cast<sockaddr*>(&local_)), 0) << std::strerror(errno);
    ibv_qp_init_attr ia{};
    ia.qp_type = IBV_QPT_UD;
    ia.cap = {4, 4, 1, 1, 0};
    ASSERT_EQ(rdma_create_qp(id_, nullptr, &ia), 0) << std::strerror(errno);
  }

  // The next event of the channel within 5 s.
  rdma_cm_event* next_event() {
    pollfd p{ch_->fd, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) return nullptr;
    rdma_cm_event* ev = nullptr;
    return rdma_get_cm_event(ch_, &ev) == 0 ? ev : nullptr;
  }

  rdma_event_channel* ch_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  sockaddr_in local_{};
  std::string name_;
  int ctx_tag_ = 0;
};

TEST_F(CmMcast, JoinReportsTheGroupAndAttachesTheQp) {
  ASSERT_NO_FATAL_FAILURE(bind_and_create_qp());
  sockaddr_in group = v4("239.201.1.1");
  ASSERT_EQ(rdma_join_multicast(id_, reinterpret_cast<sockaddr*>(&group), &ctx_tag_), 0) << std::strerror(errno);
  rdma_cm_event* ev = next_event();
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_MULTICAST_JOIN) << rdma_event_str(ev->event);
  EXPECT_EQ(ev->status, 0);
  EXPECT_EQ(ev->id, id_);
  const rdma_ud_param& ud = ev->param.ud;
  EXPECT_EQ(ud.private_data, &ctx_tag_) << "the join's context";
  EXPECT_EQ(ud.qp_num, 0xFFFFFFu);
  EXPECT_EQ(ud.qkey, static_cast<uint32_t>(RDMA_UDP_QKEY));
  EXPECT_EQ(ud.ah_attr.is_global, 1);
  const ibv_gid want = mapped("239.201.1.1");
  EXPECT_EQ(std::memcmp(ud.ah_attr.grh.dgid.raw, want.raw, 16), 0);
  EXPECT_EQ(ud.ah_attr.grh.sgid_index, 1);
  EXPECT_EQ(ud.ah_attr.port_num, 1);
  // The application can send to the group with this address handle.
  ibv_ah* ah = ibv_create_ah(id_->pd, const_cast<ibv_ah_attr*>(&ud.ah_attr));
  EXPECT_NE(ah, nullptr);
  if (ah) ibv_destroy_ah(ah);
  EXPECT_EQ(rdma_ack_cm_event(ev), 0);
  // librdmacm attached the QP when the event was taken: attaching again is the
  // kernel's no-op, and destroying the QP is refused while attached.
  EXPECT_EQ(ibv_attach_mcast(id_->qp, &want, 0), 0);
  EXPECT_EQ(ibv_destroy_qp(id_->qp), EBUSY);

  EXPECT_EQ(rdma_leave_multicast(id_, reinterpret_cast<sockaddr*>(&group)), 0) << std::strerror(errno);
  EXPECT_EQ(ibv_detach_mcast(id_->qp, &want, 0), EINVAL) << "the leave detached the QP";
  errno = 0;
  EXPECT_EQ(rdma_leave_multicast(id_, reinterpret_cast<sockaddr*>(&group)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
}

TEST_F(CmMcast, SendOnlyJoinDoesNotAttach) {
  ASSERT_NO_FATAL_FAILURE(bind_and_create_qp());
  sockaddr_in group = v4("239.201.1.2");
  rdma_cm_join_mc_attr_ex attr{};
  attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  attr.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
  attr.addr = reinterpret_cast<sockaddr*>(&group);
  ASSERT_EQ(rdma_join_multicast_ex(id_, &attr, nullptr), 0) << std::strerror(errno);
  rdma_cm_event* ev = next_event();
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_MULTICAST_JOIN) << rdma_event_str(ev->event);
  EXPECT_EQ(rdma_ack_cm_event(ev), 0);
  const ibv_gid g = mapped("239.201.1.2");
  EXPECT_EQ(ibv_detach_mcast(id_->qp, &g, 0), EINVAL) << "a send-only member's QP is not attached";
  EXPECT_EQ(rdma_leave_multicast(id_, reinterpret_cast<sockaddr*>(&group)), 0);
}

TEST_F(CmMcast, JoinErrors) {
  sockaddr_in group = v4("239.201.1.3");
  errno = 0;
  EXPECT_EQ(rdma_join_multicast(id_, reinterpret_cast<sockaddr*>(&group), nullptr), -1) << "no device yet";
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(rdma_leave_multicast(id_, reinterpret_cast<sockaddr*>(&group)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL) << "leaving a group never joined";
  ASSERT_EQ(rdma_bind_addr(id_, reinterpret_cast<sockaddr*>(&local_)), 0);
  rdma_cm_join_mc_attr_ex attr{};
  attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  attr.join_flags = RDMA_MC_JOIN_FLAG_RESERVED;
  attr.addr = reinterpret_cast<sockaddr*>(&group);
  errno = 0;
  EXPECT_EQ(rdma_join_multicast_ex(id_, &attr, nullptr), -1);
  EXPECT_EQ(errno, EINVAL) << "reserved join flags";
  attr.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
  attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS;
  errno = 0;
  EXPECT_EQ(rdma_join_multicast_ex(id_, &attr, nullptr), -1);
  EXPECT_EQ(errno, EINVAL) << "no join flags";
}

// A join on a port that is down fails with MULTICAST_ERROR.
TEST_F(CmMcast, JoinOnAPortThatIsDownIsAnError) {
  ASSERT_NO_FATAL_FAILURE(bind_and_create_qp());
  ASSERT_EQ(softverbs_port_set_state(name_.c_str(), 1, 0), 0);
  sockaddr_in group = v4("239.201.1.4");
  ASSERT_EQ(rdma_join_multicast(id_, reinterpret_cast<sockaddr*>(&group), &ctx_tag_), 0);
  rdma_cm_event* ev = next_event();
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_MULTICAST_ERROR) << rdma_event_str(ev->event);
  EXPECT_EQ(ev->status, -ENETUNREACH);
  EXPECT_EQ(ev->param.ud.private_data, &ctx_tag_);
  EXPECT_EQ(rdma_ack_cm_event(ev), 0);
  EXPECT_EQ(rdma_leave_multicast(id_, reinterpret_cast<sockaddr*>(&group)), 0);
  ASSERT_EQ(softverbs_port_set_state(name_.c_str(), 1, 1), 0);
}

// The device fails while the id is joined: MULTICAST_ERROR, then DEVICE_REMOVAL.
TEST_F(CmMcast, DeviceFailureWhileJoinedIsAMulticastError) {
  ASSERT_NO_FATAL_FAILURE(bind_and_create_qp());
  sockaddr_in group = v4("239.201.1.5");
  ASSERT_EQ(rdma_join_multicast(id_, reinterpret_cast<sockaddr*>(&group), &ctx_tag_), 0);
  rdma_cm_event* ev = next_event();
  ASSERT_NE(ev, nullptr);
  ASSERT_EQ(ev->event, RDMA_CM_EVENT_MULTICAST_JOIN);
  rdma_ack_cm_event(ev);
  ASSERT_EQ(softverbs_device_fatal(name_.c_str()), 0);
  ev = next_event();
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_MULTICAST_ERROR) << rdma_event_str(ev->event);
  EXPECT_EQ(ev->status, -ENETRESET);
  EXPECT_EQ(ev->param.ud.private_data, &ctx_tag_);
  rdma_ack_cm_event(ev);
  ev = next_event();
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_DEVICE_REMOVAL) << rdma_event_str(ev->event);
  rdma_ack_cm_event(ev);
  EXPECT_EQ(rdma_leave_multicast(id_, reinterpret_cast<sockaddr*>(&group)), 0);
}

}  // namespace
