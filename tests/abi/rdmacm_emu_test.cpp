// softverbs' librdmacm.so.1 with SOFTVERBS_BACKEND=emu, the emulator's CM
// behind it (emu/cm/). That CM grows call by call, so this suite pins down only
// what must hold at every stage and never depends on how far it has got:
//   - an entry call either works or fails with ENODEV (no CM here) or ENOSYS
//     (not implemented), never crashes, and what it made can be released;
//   - the argument checks librdmacm 44 makes in the library itself come first;
//   - ids, channels and events this library never handed out get EINVAL
//     (rdma-core would follow the pointer), without reaching the provider;
//   - rsockets with a family, type or protocol rdma-core refuses fail (ENOTSUP).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

bool not_offered(int err) { return err == ENODEV || err == ENOSYS; }

void expect_einval(int rc) {
  EXPECT_EQ(rc, -1);
  EXPECT_EQ(errno, EINVAL) << std::strerror(errno);
}

class RdmacmEmu : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* backend = std::getenv("SOFTVERBS_BACKEND");
    if (!backend || std::string(backend) != "emu") GTEST_SKIP() << "needs SOFTVERBS_BACKEND=emu (run it through ctest)";
  }
};

TEST_F(RdmacmEmu, EntryCallsWorkOrFailWithEnodevOrEnosys) {
  errno = 0;
  rdma_event_channel* ch = rdma_create_event_channel();
  if (!ch) {
    EXPECT_TRUE(not_offered(errno)) << std::strerror(errno);
  }

  rdma_cm_id* id = nullptr;
  errno = 0;
  int rc = rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP);
  if (rc == 0) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    errno = 0;
    rc = rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&addr));
    if (rc) {
      EXPECT_NE(errno, 0);
    }
    EXPECT_EQ(rdma_destroy_id(id), 0);
  } else {
    EXPECT_TRUE(not_offered(errno)) << std::strerror(errno);
  }
  if (ch) rdma_destroy_event_channel(ch);

  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* res = nullptr;
  errno = 0;
  rc = rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res);
  if (rc == 0)
    rdma_freeaddrinfo(res);
  else
    EXPECT_NE(errno, 0);

  int num = -1;
  errno = 0;
  ibv_context** list = rdma_get_devices(&num);
  if (list) {
    EXPECT_GE(num, 0);
    EXPECT_EQ(list[num], nullptr);
    rdma_free_devices(list);
  } else {
    EXPECT_TRUE(not_offered(errno)) << std::strerror(errno);
    EXPECT_EQ(num, 0);
  }
}

TEST_F(RdmacmEmu, LibraryArgumentChecksComeFirst) {
  errno = 0;
  EXPECT_EQ(rdma_getaddrinfo(nullptr, nullptr, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  expect_einval(rdma_ack_cm_event(nullptr));
  rdma_cm_join_mc_attr_ex attr{};
  attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
  errno = 0;
  EXPECT_EQ(rdma_join_multicast_ex(nullptr, &attr, nullptr), -1);
  EXPECT_EQ(errno, ENOTSUP);
  sockaddr unknown{};
  unknown.sa_family = AF_UNIX;
  expect_einval(rdma_bind_addr(nullptr, &unknown));
  expect_einval(rdma_resolve_addr(nullptr, nullptr, &unknown, 100));
  expect_einval(rdma_set_local_ece(nullptr, nullptr));
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_CONNECT_REQUEST), "RDMA_CM_EVENT_CONNECT_REQUEST");
  EXPECT_STREQ(rdma_event_str(static_cast<rdma_cm_event_type>(42)), "UNKNOWN EVENT");
}

TEST_F(RdmacmEmu, ObjectsThisLibraryNeverMadeGetEinval) {
  rdma_cm_id foreign{};
  rdma_event_channel channel{};
  channel.fd = -1;
  rdma_cm_event event{};
  rdma_cm_event* out = nullptr;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  expect_einval(rdma_destroy_id(&foreign));
  expect_einval(rdma_bind_addr(&foreign, reinterpret_cast<sockaddr*>(&addr)));
  expect_einval(rdma_resolve_route(&foreign, 100));
  expect_einval(rdma_listen(&foreign, 1));
  expect_einval(rdma_connect(&foreign, nullptr));
  expect_einval(rdma_accept(&foreign, nullptr));
  expect_einval(rdma_disconnect(&foreign));
  ibv_qp_init_attr qp_attr{};
  expect_einval(rdma_create_qp(&foreign, nullptr, &qp_attr));
  expect_einval(rdma_ack_cm_event(&event));
  expect_einval(rdma_get_cm_event(&channel, &out));
  rdma_cm_id* id = nullptr;
  expect_einval(rdma_create_id(&channel, &id, nullptr, RDMA_PS_TCP));
  // The void calls ignore them.
  rdma_destroy_qp(&foreign);
  rdma_destroy_ep(&foreign);
  rdma_destroy_event_channel(&channel);
}

// Stream and datagram rsockets exist (tests/rsocket); a protocol that does not
// fit the type and descriptors that are not rsockets fail as rdma-core's do.
TEST_F(RdmacmEmu, RsocketRefusalsAreRdmaCores) {
  errno = 0;
  EXPECT_EQ(rsocket(AF_INET, SOCK_DGRAM, IPPROTO_TCP), -1);
  EXPECT_EQ(errno, ENOTSUP);
  const int fd = rsocket(AF_INET, SOCK_DGRAM, 0);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  if (fd >= 0) {
    EXPECT_EQ(rclose(fd), 0);
  }
  errno = 0;
  EXPECT_EQ(rclose(0), -1);
  EXPECT_EQ(errno, EBADF);
}

}  // namespace
