// rdma_cm conformance: event channels, ids per port space, binding, listening,
// address and route resolution, and the library-level calls (rdma_getaddrinfo,
// rdma_get_devices, rdma_event_str, options, migrate). What librdmacm 44 over
// the kernel's rdma_cm does is the reference (rdma/rdma_cma.h, rdma_cm(7)).
#include <cstring>
#include <chrono>

#include "tests/support/cm.hpp"

namespace cmtest {
namespace {

using Steady = std::chrono::steady_clock;

// The channel's fd polls readable only while an event is queued, and with
// O_NONBLOCK rdma_get_cm_event says EAGAIN instead of waiting.
TEST_F(CmTest, ChannelFdIsReadableOnlyWithAnEventQueued) {
  pollfd p{active_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);
  Id id(active_);
  auto dst = v4(b_, next_port());
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
  rdma_cm_event* ev = expect_event(active_, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->id, id.id);
  EXPECT_EQ(poll(&p, 1, 0), 0) << "readable with nothing queued";
  rdma_ack_cm_event(ev);

  int flags = fcntl(active_->fd, F_GETFL);
  ASSERT_EQ(fcntl(active_->fd, F_SETFL, flags | O_NONBLOCK), 0);
  errno = 0;
  EXPECT_EQ(rdma_get_cm_event(active_, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  ASSERT_EQ(poll(&p, 1, kEventTimeoutMs), 1);
  ASSERT_EQ(rdma_get_cm_event(active_, &ev), 0);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_ROUTE_RESOLVED);
  rdma_ack_cm_event(ev);
  fcntl(active_->fd, F_SETFL, flags);
}

TEST_F(CmTest, CreateIdInEachPortSpace) {
  for (rdma_port_space ps : {RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB, RDMA_PS_IPOIB}) {
    rdma_cm_id* id = nullptr;
    ASSERT_EQ(rdma_create_id(active_, &id, this, ps), 0) << ps;
    EXPECT_EQ(id->ps, ps);
    EXPECT_EQ(id->context, this);
    EXPECT_EQ(id->channel, active_.ch);
    EXPECT_EQ(id->verbs, nullptr);
    EXPECT_EQ(id->qp_type, ps == RDMA_PS_TCP || ps == RDMA_PS_IB ? IBV_QPT_RC : IBV_QPT_UD);
    EXPECT_EQ(rdma_destroy_id(id), 0);
  }
  rdma_cm_id* id = nullptr;
  errno = 0;
  EXPECT_EQ(rdma_create_id(active_, &id, nullptr, static_cast<rdma_port_space>(0x0099)), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(CmTest, BindSpecificWildcardAndEphemeral) {
  uint16_t port = next_port();
  Id specific(active_);
  auto addr = v4(a_, port);
  ASSERT_EQ(rdma_bind_addr(specific, sa(addr)), 0);
  EXPECT_NE(specific->verbs, nullptr) << "a bound address names its device";
  EXPECT_EQ(ntohs(rdma_get_src_port(specific)), port);
  auto* src = reinterpret_cast<sockaddr_in*>(rdma_get_local_addr(specific));
  EXPECT_EQ(src->sin_addr.s_addr, a_.s_addr);

  // The same port on the same address: EADDRINUSE; in another port space it is free.
  Id again(active_);
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(again, sa(addr)), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  Id udp(active_, RDMA_PS_UDP);
  EXPECT_EQ(rdma_bind_addr(udp, sa(addr)), 0);

  Id any4(active_);
  auto wild = v4("0.0.0.0", next_port());
  ASSERT_EQ(rdma_bind_addr(any4, sa(wild)), 0);
  EXPECT_EQ(any4->verbs, nullptr) << "a wildcard names no device";

  Id any6(active_);
  sockaddr_in6 w6{};
  w6.sin6_family = AF_INET6;
  w6.sin6_addr = in6addr_any;
  w6.sin6_port = htons(next_port());
  EXPECT_EQ(rdma_bind_addr(any6, sa(w6)), 0);

  Id eph(active_);
  auto zero = v4(a_, 0);
  ASSERT_EQ(rdma_bind_addr(eph, sa(zero)), 0);
  EXPECT_NE(rdma_get_src_port(eph), 0) << "port 0 takes an ephemeral port";
}

// An address no device owns: a 127/8 address is local (the kernel finds the
// loopback netdev) but no RDMA device has it: ENODEV (cma_acquire_dev_by_src_ip);
// an address of no interface: EADDRNOTAVAIL (rdma_translate_ip).
TEST_F(CmTest, BindToAnAddressNoDeviceHas) {
  Id id(active_);
  auto loop = v4("127.200.1.1", next_port());
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(id, sa(loop)), -1);
  EXPECT_EQ(errno, ENODEV);
  auto remote = v4("192.0.2.1", next_port());  // TEST-NET-1: no interface has it
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(id, sa(remote)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
}

TEST_F(CmTest, ListenWithBacklogAndASecondListenerOnThePort) {
  uint16_t port = next_port();
  Id l(passive_);
  auto addr = v4(b_, port);
  ASSERT_EQ(rdma_bind_addr(l, sa(addr)), 0);
  EXPECT_EQ(rdma_listen(l, 4), 0);
  Id wild(passive_);
  auto any = v4("0.0.0.0", port);
  errno = 0;
  EXPECT_EQ(rdma_bind_addr(wild, sa(any)), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  Id unbound(passive_);
  EXPECT_EQ(rdma_listen(unbound, 0), 0) << "listen binds a wildcard ephemeral port";
  EXPECT_NE(rdma_get_src_port(unbound), 0);
}

TEST_F(CmTest, ResolveAddrAndRouteFillTheId) {
  Id id(active_);
  auto src = v4(a_, 0);
  auto dst = v4(b_, next_port());
  ASSERT_EQ(rdma_resolve_addr(id, sa(src), sa(dst), 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
  ASSERT_NE(id->verbs, nullptr);
  EXPECT_EQ(id->port_num, 1);
  ibv_device_attr da{};
  EXPECT_EQ(ibv_query_device(id->verbs, &da), 0);
  const auto& ib = id->route.addr.addr.ibaddr;
  auto mapped = [](const ibv_gid& g, in_addr a) {
    static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return std::memcmp(g.raw, kPrefix, 12) == 0 && std::memcmp(g.raw + 12, &a.s_addr, 4) == 0;
  };
  EXPECT_TRUE(mapped(ib.sgid, a_));
  EXPECT_TRUE(mapped(ib.dgid, b_));
  EXPECT_EQ(reinterpret_cast<sockaddr_in*>(rdma_get_peer_addr(id))->sin_addr.s_addr, b_.s_addr);

  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ROUTE_RESOLVED));
  ASSERT_EQ(id->route.num_paths, 1);
  ASSERT_NE(id->route.path_rec, nullptr);
  const ibv_sa_path_rec& p = *id->route.path_rec;
  EXPECT_TRUE(mapped(p.sgid, a_));
  EXPECT_TRUE(mapped(p.dgid, b_));
  EXPECT_EQ(be16toh(p.pkey), 0xffff);
  EXPECT_NE(p.mtu, 0);
  EXPECT_NE(p.rate, 0);
  EXPECT_GT(p.hop_limit, 0);
  EXPECT_EQ(p.numb_path, 1);
}

// A 127/8 address where no device listens: no emulated ARP answer, so
// ADDR_ERROR with -ETIMEDOUT once the given timeout has passed.
TEST_F(CmTest, AddrErrorWhenNothingAnswersWithinTheTimeout) {
  Id id(active_);
  auto src = v4(a_, 0);
  auto dst = v4("127.200.7.7", next_port());
  auto start = Steady::now();
  ASSERT_EQ(rdma_resolve_addr(id, sa(src), sa(dst), 300), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_ERROR, -ETIMEDOUT, 3000));
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - start).count();
  EXPECT_GE(took, 250);
  EXPECT_LT(took, 3000);
}

TEST_F(CmTest, GetaddrinfoPassiveAndActive) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* res = nullptr;
  char host[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &b_, host, sizeof host);
  ASSERT_EQ(rdma_getaddrinfo(host, "7471", &hints, &res), 0);
  ASSERT_NE(res, nullptr);
  EXPECT_TRUE(res->ai_flags & RAI_PASSIVE);
  ASSERT_NE(res->ai_src_addr, nullptr);
  auto* s = reinterpret_cast<sockaddr_in*>(res->ai_src_addr);
  EXPECT_EQ(s->sin_addr.s_addr, b_.s_addr);
  EXPECT_EQ(ntohs(s->sin_port), 7471);
  EXPECT_EQ(res->ai_port_space, RDMA_PS_TCP);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_RC);
  rdma_freeaddrinfo(res);

  hints.ai_flags = RAI_NUMERICHOST;
  ASSERT_EQ(rdma_getaddrinfo(host, "7471", &hints, &res), 0);
  ASSERT_NE(res->ai_dst_addr, nullptr);
  auto* d = reinterpret_cast<sockaddr_in*>(res->ai_dst_addr);
  EXPECT_EQ(d->sin_addr.s_addr, b_.s_addr);
  EXPECT_EQ(ntohs(d->sin_port), 7471);
  EXPECT_EQ(res->ai_family, AF_INET);
  rdma_freeaddrinfo(res);

  errno = 0;
  EXPECT_EQ(rdma_getaddrinfo(nullptr, nullptr, nullptr, &res), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(CmTest, GetDevicesListsUsableContexts) {
  int n = -1;
  ibv_context** list = rdma_get_devices(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_GE(n, 2);
  for (int i = 0; i < n; ++i) {
    ASSERT_NE(list[i], nullptr);
    ibv_device_attr attr{};
    EXPECT_EQ(ibv_query_device(list[i], &attr), 0) << i;
  }
  EXPECT_EQ(list[n], nullptr) << "the array ends with NULL";
  rdma_free_devices(list);
}

TEST_F(CmTest, EventStrNamesEveryEvent) {
  const char* names[] = {
      "RDMA_CM_EVENT_ADDR_RESOLVED",  "RDMA_CM_EVENT_ADDR_ERROR",      "RDMA_CM_EVENT_ROUTE_RESOLVED",
      "RDMA_CM_EVENT_ROUTE_ERROR",    "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
      "RDMA_CM_EVENT_CONNECT_ERROR",  "RDMA_CM_EVENT_UNREACHABLE",     "RDMA_CM_EVENT_REJECTED",
      "RDMA_CM_EVENT_ESTABLISHED",    "RDMA_CM_EVENT_DISCONNECTED",    "RDMA_CM_EVENT_DEVICE_REMOVAL",
      "RDMA_CM_EVENT_MULTICAST_JOIN", "RDMA_CM_EVENT_MULTICAST_ERROR", "RDMA_CM_EVENT_ADDR_CHANGE",
      "RDMA_CM_EVENT_TIMEWAIT_EXIT"};
  for (int e = 0; e < 16; ++e) EXPECT_STREQ(rdma_event_str(static_cast<rdma_cm_event_type>(e)), names[e]);
  EXPECT_STREQ(rdma_event_str(static_cast<rdma_cm_event_type>(99)), "UNKNOWN EVENT");
}

TEST_F(CmTest, SetOptionChecksLevelNameAndLength) {
  Id id(active_);
  uint8_t tos = 32;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos), 0);
  int one = 1;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one), 0);
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof one), 0);
  uint8_t timeout = 14;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof timeout), 0);
  errno = 0;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &one, sizeof one), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &tos, sizeof tos), -1);
  EXPECT_EQ(errno, EINVAL);

  // The TOS reaches the route's traffic class.
  auto dst = v4(b_, next_port());
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ROUTE_RESOLVED));
  EXPECT_EQ(id->route.path_rec->traffic_class, 32);
  // REUSEADDR and AFONLY only before the id is bound.
  errno = 0;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(CmTest, MigrateIdMovesItsEventsToAnotherChannel) {
  Channel other;
  Id id(active_);
  ASSERT_EQ(rdma_migrate_id(id, other), 0);
  EXPECT_EQ(id->channel, other.ch);
  auto dst = v4(b_, next_port());
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
  ASSERT_TRUE(ack_expected(other, RDMA_CM_EVENT_ADDR_RESOLVED));
  pollfd p{active_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0) << "the old channel got the event";
}

// rdma_join_multicast on a bound UDP id without a QP: MULTICAST_JOIN with the
// group's address vector (the join is local on RoCE), then a leave; a second
// leave of the same group is EADDRNOTAVAIL, as librdmacm answers.
TEST_F(CmTest, JoinAndLeaveMulticast) {
  Id id(active_, RDMA_PS_UDP);
  auto src = v4(a_, 0);
  ASSERT_EQ(rdma_bind_addr(id, sa(src)), 0);
  auto group = v4("239.1.2.3", 0);
  int context = 7;
  ASSERT_EQ(rdma_join_multicast(id, sa(group), &context), 0);
  rdma_cm_event* ev = expect_event(active_, RDMA_CM_EVENT_MULTICAST_JOIN);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->param.ud.qp_num, 0xFFFFFFu);
  EXPECT_EQ(ev->param.ud.qkey, static_cast<uint32_t>(RDMA_UDP_QKEY));
  EXPECT_EQ(ev->param.ud.private_data, &context);
  EXPECT_EQ(ev->param.ud.ah_attr.is_global, 1);
  const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3};
  EXPECT_EQ(std::memcmp(ev->param.ud.ah_attr.grh.dgid.raw, want, 16), 0);
  rdma_ack_cm_event(ev);
  EXPECT_EQ(rdma_leave_multicast(id, sa(group)), 0);
  errno = 0;
  EXPECT_EQ(rdma_leave_multicast(id, sa(group)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
}

}  // namespace
}  // namespace cmtest
