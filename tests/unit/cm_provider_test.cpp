// The CmProvider defaults (core/cm_provider.hpp): what librdmacm 44 answers on
// a machine without an RDMA CM (measured: no /dev/infiniband/rdma_cm, no RDMA
// device), for a provider that implements nothing. tests/hw/cm_test.cpp checks
// the same answers against the real library where it has no CM either.
#include "core/cm_provider.hpp"

#include <gtest/gtest.h>

#include <cerrno>

namespace {

struct Bare final : softverbs::CmProvider {
  const char* name() const noexcept override { return "bare"; }
};

TEST(CmProviderDefaults, EntriesThatNeedTheCmFailWithEnodev) {
  Bare cm;
  errno = 0;
  EXPECT_EQ(cm.create_event_channel(), nullptr);
  EXPECT_EQ(errno, ENODEV);

  rdma_cm_id* id = nullptr;
  errno = 0;
  EXPECT_EQ(cm.create_id(nullptr, &id, nullptr, RDMA_PS_TCP), -1);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(id, nullptr);

  rdma_addrinfo* res = nullptr;
  errno = 0;
  EXPECT_EQ(cm.getaddrinfo("127.0.0.1", nullptr, nullptr, &res), -1);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(res, nullptr);

  errno = 0;
  EXPECT_EQ(cm.create_ep(&id, nullptr, nullptr, nullptr), -1);
  EXPECT_EQ(errno, ENODEV);

  rdma_cm_event* event = nullptr;
  errno = 0;
  EXPECT_EQ(cm.get_cm_event(nullptr, &event), -1);
  EXPECT_EQ(errno, ENODEV);

  int num = -1;
  errno = 0;
  EXPECT_EQ(cm.get_devices(&num), nullptr);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(num, 0);
  EXPECT_EQ(cm.get_devices(nullptr), nullptr);
}

TEST(CmProviderDefaults, OperationsOnObjectsFailWithEnosys) {
  Bare cm;
  rdma_cm_id id{};
  auto expect_enosys = [](int rc) {
    EXPECT_EQ(rc, -1);
    EXPECT_EQ(errno, ENOSYS);
    errno = 0;
  };
  expect_enosys(cm.destroy_id(&id));
  expect_enosys(cm.bind_addr(&id, nullptr));
  expect_enosys(cm.resolve_addr(&id, nullptr, nullptr, 100));
  expect_enosys(cm.resolve_route(&id, 100));
  expect_enosys(cm.listen(&id, 1));
  expect_enosys(cm.connect(&id, nullptr));
  expect_enosys(cm.accept(&id, nullptr));
  expect_enosys(cm.reject(&id, nullptr, 0));
  expect_enosys(cm.reject_ece(&id, nullptr, 0));
  expect_enosys(cm.establish(&id));
  expect_enosys(cm.notify(&id, IBV_EVENT_COMM_EST));
  expect_enosys(cm.disconnect(&id));
  expect_enosys(cm.init_qp_attr(&id, nullptr, nullptr));
  expect_enosys(cm.create_qp_ex(&id, nullptr));
  expect_enosys(cm.create_srq_ex(&id, nullptr));
  expect_enosys(cm.join_multicast_ex(&id, nullptr, nullptr));
  expect_enosys(cm.leave_multicast(&id, nullptr));
  expect_enosys(cm.set_option(&id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, nullptr, 0));
  expect_enosys(cm.migrate_id(&id, nullptr));
  expect_enosys(cm.set_local_ece(&id, nullptr));
  expect_enosys(cm.get_remote_ece(&id, nullptr));
  rdma_cm_id* out = nullptr;
  expect_enosys(cm.get_request(&id, &out));
  rdma_cm_event event{};
  expect_enosys(cm.ack_cm_event(&event));

  // The void ones do nothing, and leave errno alone.
  errno = ERANGE;
  cm.destroy_event_channel(nullptr);
  cm.destroy_ep(&id);
  cm.destroy_qp(&id);
  cm.destroy_srq(&id);
  cm.freeaddrinfo(nullptr);
  cm.free_devices(nullptr);
  EXPECT_EQ(errno, ERANGE);
}

}  // namespace
