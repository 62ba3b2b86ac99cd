// librdmacm.so.1's own code (abi/rdmacm/) over fake CM providers: this test
// links the library's objects and supplies softverbs_private_cm_providers
// itself, so the exported rdma_* functions run against two fakes, "none" (no
// RDMA CM: the CmProvider defaults) and "cm" (makes objects, records calls).
//
// What it pins down: the library-level functions (rdma_event_str, the port
// getters, rdma_create_qp/_srq and rdma_join_multicast repacked into their _ex
// forms as librdmacm 44's cma.c does), the argument checks made before any
// provider is asked, and the routing rules of core/cm_provider.hpp (ENODEV asks
// the next provider, objects go back to their owner, ids from events included,
// foreign pointers get EINVAL). With SV_RDMACM_TEST_NO_CM set the list is empty
// (RdmacmWithoutCm.*): librdmacm 44's answers without an RDMA CM.
#include <endian.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/ib.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "core/cm_provider.hpp"

namespace {

struct Fake final : softverbs::CmProvider {
  Fake(const char* n, bool cm) : name_(n), has_cm(cm) {}
  const char* name() const noexcept override { return name_; }

  const char* name_;
  bool has_cm;
  int entry_errno = 0;      // when set, entries fail with it instead
  bool offer_devices = false;  // lists devices even without a CM
  std::vector<std::string> calls;
  std::deque<rdma_event_channel> channels;
  std::deque<rdma_cm_id> ids;
  std::deque<rdma_cm_event> events;
  std::deque<rdma_addrinfo> addrinfos;
  std::deque<std::vector<ibv_context*>> device_arrays;
  ibv_context contexts[2]{};
  ibv_qp_init_attr_ex last_qp_attr{};
  ibv_srq_init_attr_ex last_srq_attr{};
  rdma_cm_join_mc_attr_ex last_join{};
  rdma_cm_id* last_id = nullptr;

  void reset() {
    calls.clear();
    entry_errno = 0;
    offer_devices = false;
    last_id = nullptr;
  }
  int entry_failure() {
    errno = entry_errno ? entry_errno : ENODEV;
    return -1;
  }
  bool fails() const { return entry_errno || !has_cm; }
  rdma_cm_id* new_id(rdma_event_channel* channel) {
    rdma_cm_id& id = ids.emplace_back();
    id.channel = channel;
    return &id;
  }

  rdma_event_channel* create_event_channel() override {
    calls.push_back("create_event_channel");
    if (fails()) return entry_failure(), nullptr;
    return &channels.emplace_back();
  }
  void destroy_event_channel(rdma_event_channel*) override { calls.push_back("destroy_event_channel"); }
  int get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) override {
    calls.push_back("get_cm_event");
    rdma_cm_event& e = events.emplace_back();
    e.event = RDMA_CM_EVENT_CONNECT_REQUEST;
    e.listen_id = last_id;
    e.id = new_id(channel);  // the new connection's id
    *event = &e;
    return 0;
  }
  int ack_cm_event(rdma_cm_event*) override {
    calls.push_back("ack_cm_event");
    return 0;
  }
  int create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) override {
    calls.push_back("create_id");
    if (fails()) return entry_failure();
    *id = last_id = new_id(channel ? channel : &channels.emplace_back());
    (*id)->context = context;
    (*id)->ps = ps;
    return 0;
  }
  int destroy_id(rdma_cm_id*) override {
    calls.push_back("destroy_id");
    return 0;
  }
  int create_ep(rdma_cm_id** id, rdma_addrinfo*, ibv_pd*, ibv_qp_init_attr*) override {
    calls.push_back("create_ep");
    if (fails()) return entry_failure();
    *id = new_id(&channels.emplace_back());
    return 0;
  }
  void destroy_ep(rdma_cm_id*) override { calls.push_back("destroy_ep"); }
  int migrate_id(rdma_cm_id* id, rdma_event_channel* channel) override {
    calls.push_back("migrate_id");
    id->channel = channel ? channel : &channels.emplace_back();
    return 0;
  }
  int bind_addr(rdma_cm_id* id, sockaddr*) override {
    calls.push_back("bind_addr");
    last_id = id;
    return 0;
  }
  int getaddrinfo(const char*, const char*, const rdma_addrinfo*, rdma_addrinfo** res) override {
    calls.push_back("getaddrinfo");
    if (fails()) return entry_failure();
    *res = &addrinfos.emplace_back();
    return 0;
  }
  void freeaddrinfo(rdma_addrinfo*) override { calls.push_back("freeaddrinfo"); }
  int get_request(rdma_cm_id*, rdma_cm_id** id) override {
    calls.push_back("get_request");
    *id = new_id(nullptr);
    return 0;
  }
  int accept(rdma_cm_id* id, rdma_conn_param*) override {
    calls.push_back("accept");
    last_id = id;
    return 0;
  }
  int create_qp_ex(rdma_cm_id*, ibv_qp_init_attr_ex* attr) override {
    calls.push_back("create_qp_ex");
    last_qp_attr = *attr;
    attr->cap.max_inline_data = 64;  // what the device granted
    return 0;
  }
  int create_srq_ex(rdma_cm_id*, ibv_srq_init_attr_ex* attr) override {
    calls.push_back("create_srq_ex");
    last_srq_attr = *attr;
    attr->attr.max_wr = 128;
    return 0;
  }
  int join_multicast_ex(rdma_cm_id*, rdma_cm_join_mc_attr_ex* attr, void*) override {
    calls.push_back("join_multicast_ex");
    last_join = *attr;
    return 0;
  }
  ibv_context** get_devices(int* num) override {
    calls.push_back("get_devices");
    if (fails() && !offer_devices) {
      if (num) *num = 0;
      return entry_failure(), nullptr;
    }
    auto& list = device_arrays.emplace_back(std::vector<ibv_context*>{&contexts[0], &contexts[1], nullptr});
    if (num) *num = 2;
    return list.data();
  }
  void free_devices(ibv_context**) override { calls.push_back("free_devices"); }
};

Fake g_none("none", false);
Fake g_cm("cm", true);

using Calls = std::vector<std::string>;

class Rdmacm : public ::testing::Test {
 protected:
  void SetUp() override {
    g_none.reset();
    g_cm.reset();
  }
  // An id of the "cm" provider, on a channel of its own.
  rdma_cm_id* make_id() {
    rdma_event_channel* ch = rdma_create_event_channel();
    EXPECT_NE(ch, nullptr);
    rdma_cm_id* id = nullptr;
    EXPECT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
    g_none.reset();
    g_cm.reset();
    return id;
  }
};

void expect_fails(int rc, int err) {
  EXPECT_EQ(rc, -1);
  EXPECT_EQ(errno, err) << std::strerror(errno);
}

}  // namespace

// The provider list librdmacm's objects ask for (core/cm_provider.hpp).
extern "C" softverbs::CmProvider* const* softverbs_private_cm_providers(unsigned interface, size_t* count) {
  static softverbs::CmProvider* list[] = {&g_none, &g_cm, nullptr};
  EXPECT_EQ(interface, softverbs::kCmProviderInterface);
  const bool none = std::getenv("SV_RDMACM_TEST_NO_CM") != nullptr;
  *count = none ? 0 : 2;
  return none ? list + 2 : list;
}

namespace {

// ---- library-level functions --------------------------------------------------------

TEST(RdmacmEventStr, EveryEventHasRdmaCore44sName) {
  const std::pair<rdma_cm_event_type, const char*> table[] = {
      {RDMA_CM_EVENT_ADDR_RESOLVED, "RDMA_CM_EVENT_ADDR_RESOLVED"},
      {RDMA_CM_EVENT_ADDR_ERROR, "RDMA_CM_EVENT_ADDR_ERROR"},
      {RDMA_CM_EVENT_ROUTE_RESOLVED, "RDMA_CM_EVENT_ROUTE_RESOLVED"},
      {RDMA_CM_EVENT_ROUTE_ERROR, "RDMA_CM_EVENT_ROUTE_ERROR"},
      {RDMA_CM_EVENT_CONNECT_REQUEST, "RDMA_CM_EVENT_CONNECT_REQUEST"},
      {RDMA_CM_EVENT_CONNECT_RESPONSE, "RDMA_CM_EVENT_CONNECT_RESPONSE"},
      {RDMA_CM_EVENT_CONNECT_ERROR, "RDMA_CM_EVENT_CONNECT_ERROR"},
      {RDMA_CM_EVENT_UNREACHABLE, "RDMA_CM_EVENT_UNREACHABLE"},
      {RDMA_CM_EVENT_REJECTED, "RDMA_CM_EVENT_REJECTED"},
      {RDMA_CM_EVENT_ESTABLISHED, "RDMA_CM_EVENT_ESTABLISHED"},
      {RDMA_CM_EVENT_DISCONNECTED, "RDMA_CM_EVENT_DISCONNECTED"},
      {RDMA_CM_EVENT_DEVICE_REMOVAL, "RDMA_CM_EVENT_DEVICE_REMOVAL"},
      {RDMA_CM_EVENT_MULTICAST_JOIN, "RDMA_CM_EVENT_MULTICAST_JOIN"},
      {RDMA_CM_EVENT_MULTICAST_ERROR, "RDMA_CM_EVENT_MULTICAST_ERROR"},
      {RDMA_CM_EVENT_ADDR_CHANGE, "RDMA_CM_EVENT_ADDR_CHANGE"},
      {RDMA_CM_EVENT_TIMEWAIT_EXIT, "RDMA_CM_EVENT_TIMEWAIT_EXIT"},
  };
  for (const auto& [event, name] : table) EXPECT_STREQ(rdma_event_str(event), name);
  for (int other : {16, 17, 255, -1})
    EXPECT_STREQ(rdma_event_str(static_cast<rdma_cm_event_type>(other)), "UNKNOWN EVENT") << other;
}

TEST(RdmacmPorts, FromTheRouteOfV4V6AndIbAddresses) {
  rdma_cm_id id{};
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  v4.sin_port = htons(7471);
  std::memcpy(&id.route.addr.src_storage, &v4, sizeof v4);
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  v6.sin6_port = htons(18515);
  std::memcpy(&id.route.addr.dst_storage, &v6, sizeof v6);
  EXPECT_EQ(rdma_get_src_port(&id), htons(7471));
  EXPECT_EQ(rdma_get_dst_port(&id), htons(18515));

  // AF_IB: the low 16 bits of the service id (RDMA_PS_TCP's space, port 4791).
  sockaddr_ib ib{};
  ib.sib_family = AF_IB;
  ib.sib_sid = htobe64((static_cast<uint64_t>(RDMA_PS_TCP) << 16) | 4791);
  std::memcpy(&id.route.addr.src_storage, &ib, sizeof ib);
  EXPECT_EQ(rdma_get_src_port(&id), htobe16(4791));

  // Anything else, and no id: 0.
  id.route.addr.dst_storage.ss_family = AF_UNIX;
  EXPECT_EQ(rdma_get_dst_port(&id), 0);
  EXPECT_EQ(rdma_get_src_port(nullptr), 0);
  EXPECT_EQ(rdma_get_dst_port(nullptr), 0);
}

TEST_F(Rdmacm, CreateQpIsCreateQpExWithThePdOfTheCallOrTheId) {
  rdma_cm_id* id = make_id();
  ibv_pd id_pd{}, given_pd{};
  ibv_cq send_cq{}, recv_cq{};
  id->pd = &id_pd;
  ibv_qp_init_attr attr{};
  attr.qp_context = this;
  attr.send_cq = &send_cq;
  attr.recv_cq = &recv_cq;
  attr.cap = {16, 32, 2, 3, 0};
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 1;

  ASSERT_EQ(rdma_create_qp(id, nullptr, &attr), 0);
  EXPECT_EQ(g_cm.calls, Calls{"create_qp_ex"});
  const ibv_qp_init_attr_ex& ex = g_cm.last_qp_attr;
  EXPECT_EQ(ex.comp_mask, static_cast<uint32_t>(IBV_QP_INIT_ATTR_PD));
  EXPECT_EQ(ex.pd, &id_pd);
  EXPECT_EQ(ex.qp_context, this);
  EXPECT_EQ(ex.send_cq, &send_cq);
  EXPECT_EQ(ex.recv_cq, &recv_cq);
  EXPECT_EQ(ex.cap.max_send_wr, 16u);
  EXPECT_EQ(ex.cap.max_recv_wr, 32u);
  EXPECT_EQ(ex.cap.max_send_sge, 2u);
  EXPECT_EQ(ex.cap.max_recv_sge, 3u);
  EXPECT_EQ(ex.qp_type, IBV_QPT_RC);
  EXPECT_EQ(ex.sq_sig_all, 1);
  EXPECT_EQ(ex.create_flags, 0u);
  EXPECT_EQ(ex.xrcd, nullptr);
  // What the provider changed comes back in the caller's attributes.
  EXPECT_EQ(attr.cap.max_inline_data, 64u);

  ASSERT_EQ(rdma_create_qp(id, &given_pd, &attr), 0);
  EXPECT_EQ(g_cm.last_qp_attr.pd, &given_pd);

  // One QP per id (cma.c), checked before the provider is asked.
  ibv_qp qp{};
  id->qp = &qp;
  g_cm.calls.clear();
  expect_fails(rdma_create_qp(id, nullptr, &attr), EINVAL);
  ibv_qp_init_attr_ex attr_ex{};
  expect_fails(rdma_create_qp_ex(id, &attr_ex), EINVAL);
  EXPECT_TRUE(g_cm.calls.empty());
  id->qp = nullptr;
  expect_fails(rdma_create_qp(id, nullptr, nullptr), EINVAL);
}

TEST_F(Rdmacm, CreateSrqIsCreateSrqExWithTheTypeOfTheId) {
  rdma_cm_id* id = make_id();
  ibv_pd pd{};
  ibv_srq_init_attr attr{};
  attr.srq_context = this;
  attr.attr = {64, 2, 8};
  id->qp_type = IBV_QPT_RC;
  ASSERT_EQ(rdma_create_srq(id, &pd, &attr), 0);
  const ibv_srq_init_attr_ex& ex = g_cm.last_srq_attr;
  EXPECT_EQ(ex.comp_mask, static_cast<uint32_t>(IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD));
  EXPECT_EQ(ex.srq_type, IBV_SRQT_BASIC);
  EXPECT_EQ(ex.pd, &pd);
  EXPECT_EQ(ex.srq_context, this);
  EXPECT_EQ(ex.attr.max_wr, 64u);
  EXPECT_EQ(ex.attr.max_sge, 2u);
  EXPECT_EQ(ex.attr.srq_limit, 8u);
  EXPECT_EQ(attr.attr.max_wr, 128u);  // copied back

  // An XRC receive id gets an XRC SRQ; a NULL PD is left for the provider
  // (rdma_create_srq_ex takes the id's).
  id->qp_type = IBV_QPT_XRC_RECV;
  ASSERT_EQ(rdma_create_srq(id, nullptr, &attr), 0);
  EXPECT_EQ(g_cm.last_srq_attr.srq_type, IBV_SRQT_XRC);
  EXPECT_EQ(g_cm.last_srq_attr.pd, nullptr);

  // rdma_create_srq_ex needs the type.
  ibv_srq_init_attr_ex no_type{};
  g_cm.calls.clear();
  expect_fails(rdma_create_srq_ex(id, &no_type), EINVAL);
  EXPECT_TRUE(g_cm.calls.empty());
}

TEST_F(Rdmacm, JoinMulticastIsAFullMemberJoin) {
  rdma_cm_id* id = make_id();
  sockaddr_in group{};
  group.sin_family = AF_INET;
  group.sin_addr.s_addr = htonl(0xe0000101);
  int context = 0;
  ASSERT_EQ(rdma_join_multicast(id, reinterpret_cast<sockaddr*>(&group), &context), 0);
  EXPECT_EQ(g_cm.calls, Calls{"join_multicast_ex"});
  EXPECT_EQ(g_cm.last_join.comp_mask,
            static_cast<uint32_t>(RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS));
  EXPECT_EQ(g_cm.last_join.join_flags, static_cast<uint32_t>(RDMA_MC_JOIN_FLAG_FULLMEMBER));
  EXPECT_EQ(g_cm.last_join.addr, reinterpret_cast<sockaddr*>(&group));

  // The address checks of cma.c, before the provider.
  g_cm.calls.clear();
  sockaddr unknown{};
  unknown.sa_family = AF_UNIX;
  expect_fails(rdma_join_multicast(id, &unknown, nullptr), EINVAL);
  expect_fails(rdma_join_multicast(id, nullptr, nullptr), EINVAL);
  expect_fails(rdma_leave_multicast(id, &unknown), EINVAL);
  rdma_cm_join_mc_attr_ex ex{};
  ex.addr = reinterpret_cast<sockaddr*>(&group);
  ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
  expect_fails(rdma_join_multicast_ex(id, &ex, nullptr), ENOTSUP);
  ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  expect_fails(rdma_join_multicast_ex(id, &ex, nullptr), EINVAL);
  ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS;
  expect_fails(rdma_join_multicast_ex(id, &ex, nullptr), EINVAL);
  ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  ex.join_flags = RDMA_MC_JOIN_FLAG_RESERVED;
  expect_fails(rdma_join_multicast_ex(id, &ex, nullptr), EINVAL);
  EXPECT_TRUE(g_cm.calls.empty());
}

// ---- routing ------------------------------------------------------------------------

TEST_F(Rdmacm, ProvidersWithoutACmAreSkippedAndObjectsStayWithTheirOwner) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  EXPECT_EQ(g_none.calls, Calls{"create_event_channel"});  // asked first, ENODEV
  EXPECT_EQ(g_cm.calls, Calls{"create_event_channel"});

  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&addr)), 0);
  EXPECT_EQ(g_none.calls, Calls{"create_event_channel"});  // never again: the channel is cm's
  EXPECT_EQ(g_cm.calls, (Calls{"create_event_channel", "create_id", "bind_addr"}));

  ASSERT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
  EXPECT_EQ(g_cm.calls.back(), "destroy_event_channel");
  // Released objects are no longer anyone's.
  expect_fails(rdma_destroy_id(id), EINVAL);
}

TEST_F(Rdmacm, AFailureOtherThanEnodevEndsTheSearch) {
  g_none.entry_errno = EMFILE;
  errno = 0;
  EXPECT_EQ(rdma_create_event_channel(), nullptr);
  EXPECT_EQ(errno, EMFILE);
  EXPECT_TRUE(g_cm.calls.empty());
  rdma_cm_id* id = nullptr;
  expect_fails(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), EMFILE);
  EXPECT_TRUE(g_cm.calls.empty());
}

TEST_F(Rdmacm, IdsThatArriveInEventsAreTheirProvidersToo) {
  rdma_cm_id* listen_id = make_id();
  g_cm.last_id = listen_id;
  rdma_cm_event* event = nullptr;
  ASSERT_EQ(rdma_get_cm_event(listen_id->channel, &event), 0);
  ASSERT_NE(event->id, nullptr);
  EXPECT_EQ(event->listen_id, listen_id);
  EXPECT_EQ(rdma_accept(event->id, nullptr), 0);
  EXPECT_EQ(g_cm.last_id, event->id);
  ASSERT_EQ(rdma_ack_cm_event(event), 0);
  EXPECT_EQ(g_cm.calls, (Calls{"get_cm_event", "accept", "ack_cm_event"}));
  // An event is acknowledged once.
  expect_fails(rdma_ack_cm_event(event), EINVAL);

  // And the ids of rdma_get_request (synchronous listeners).
  rdma_cm_id* conn = nullptr;
  ASSERT_EQ(rdma_get_request(listen_id, &conn), 0);
  EXPECT_EQ(rdma_accept(conn, nullptr), 0);
  EXPECT_EQ(g_cm.last_id, conn);
}

TEST_F(Rdmacm, PointersThisLibraryNeverHandedOutGetEinval) {
  rdma_cm_id foreign{};
  rdma_event_channel channel{};
  rdma_cm_event event{};
  rdma_cm_event* out = nullptr;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  expect_fails(rdma_destroy_id(&foreign), EINVAL);
  expect_fails(rdma_bind_addr(&foreign, reinterpret_cast<sockaddr*>(&addr)), EINVAL);
  expect_fails(rdma_listen(&foreign, 1), EINVAL);
  expect_fails(rdma_connect(&foreign, nullptr), EINVAL);
  expect_fails(rdma_disconnect(&foreign), EINVAL);
  expect_fails(rdma_create_qp(&foreign, nullptr, nullptr), EINVAL);
  expect_fails(rdma_get_cm_event(&channel, &out), EINVAL);
  expect_fails(rdma_ack_cm_event(&event), EINVAL);
  expect_fails(rdma_ack_cm_event(nullptr), EINVAL);
  expect_fails(rdma_create_id(&channel, nullptr, nullptr, RDMA_PS_TCP), EINVAL);
  rdma_cm_id* id = nullptr;
  expect_fails(rdma_create_id(&channel, &id, nullptr, RDMA_PS_TCP), EINVAL);
  // The void ones do nothing.
  rdma_destroy_event_channel(&channel);
  rdma_destroy_ep(&foreign);
  rdma_destroy_qp(&foreign);
  rdma_destroy_srq(&foreign);
  rdma_freeaddrinfo(reinterpret_cast<rdma_addrinfo*>(&event));
  ibv_context* list[] = {nullptr};
  rdma_free_devices(list);
  EXPECT_TRUE(g_none.calls.empty());
  EXPECT_TRUE(g_cm.calls.empty());
}

TEST_F(Rdmacm, IdsStayOnTheirProvidersChannels) {
  rdma_cm_id* id = make_id();
  rdma_event_channel foreign{};
  expect_fails(rdma_migrate_id(id, &foreign), EINVAL);
  EXPECT_TRUE(g_cm.calls.empty());
  ASSERT_EQ(rdma_migrate_id(id, nullptr), 0);  // a private channel of the provider
  rdma_cm_event* event = nullptr;
  ASSERT_EQ(rdma_get_cm_event(id->channel, &event), 0);  // which is routed to it
  EXPECT_EQ(g_cm.calls, (Calls{"migrate_id", "get_cm_event"}));
  EXPECT_EQ(rdma_ack_cm_event(event), 0);
}

TEST_F(Rdmacm, AddressListsGoBackToTheirProvider) {
  expect_fails(rdma_getaddrinfo(nullptr, nullptr, nullptr, nullptr), EINVAL);  // nothing to resolve
  EXPECT_TRUE(g_none.calls.empty());
  rdma_addrinfo* res = nullptr;
  ASSERT_EQ(rdma_getaddrinfo("192.0.2.1", "7471", nullptr, &res), 0);
  EXPECT_EQ(g_none.calls, Calls{"getaddrinfo"});
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_ep(&id, res, nullptr, nullptr), 0);
  rdma_freeaddrinfo(res);
  rdma_freeaddrinfo(res);  // the second is not passed on
  EXPECT_EQ(g_cm.calls, (Calls{"getaddrinfo", "create_ep", "freeaddrinfo"}));
  EXPECT_EQ(g_none.calls, Calls{"getaddrinfo"});
  // A list the application built goes to the providers in order.
  rdma_addrinfo own{};
  ASSERT_EQ(rdma_create_ep(&id, &own, nullptr, nullptr), 0);
  EXPECT_EQ(g_none.calls, (Calls{"getaddrinfo", "create_ep"}));
  rdma_destroy_ep(id);
  EXPECT_EQ(g_cm.calls.back(), "destroy_ep");
}

TEST_F(Rdmacm, DeviceArraysAreMergedAndSplitAgain) {
  int num = -1;
  ibv_context** list = rdma_get_devices(&num);
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(num, 2);
  EXPECT_EQ(list[0], &g_cm.contexts[0]);
  EXPECT_EQ(list[1], &g_cm.contexts[1]);
  EXPECT_EQ(list[2], nullptr);
  rdma_free_devices(list);
  EXPECT_EQ(g_cm.calls, (Calls{"get_devices", "free_devices"}));

  g_none.offer_devices = true;  // both list devices: one array, in provider order
  list = rdma_get_devices(nullptr);
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(list[0], &g_none.contexts[0]);
  EXPECT_EQ(list[2], &g_cm.contexts[0]);
  EXPECT_EQ(list[4], nullptr);
  rdma_free_devices(list);
  EXPECT_EQ(g_none.calls, (Calls{"get_devices", "get_devices", "free_devices"}));
}

TEST_F(Rdmacm, EceArgumentsAreCheckedFirst) {
  rdma_cm_id* id = make_id();
  ibv_ece ece{};
  expect_fails(rdma_set_local_ece(nullptr, &ece), EINVAL);
  expect_fails(rdma_set_local_ece(id, nullptr), EINVAL);
  expect_fails(rdma_set_local_ece(id, &ece), EINVAL);  // vendor_id 0
  ece.vendor_id = 0x15b3;
  ece.comp_mask = 1;
  expect_fails(rdma_set_local_ece(id, &ece), EINVAL);
  expect_fails(rdma_get_remote_ece(id, nullptr), EINVAL);
  EXPECT_TRUE(g_cm.calls.empty());
  // Past the checks, the provider's answer (the fake's default: ENOSYS).
  ece.comp_mask = 0;
  expect_fails(rdma_set_local_ece(id, &ece), ENOSYS);
}

// ---- without any CM (SV_RDMACM_TEST_NO_CM) -----------------------------------------------

TEST(RdmacmWithoutCm, EntriesFailWithEnodevLikeLibrdmacm44) {
  ASSERT_NE(std::getenv("SV_RDMACM_TEST_NO_CM"), nullptr) << "run with SV_RDMACM_TEST_NO_CM=1";
  errno = 0;
  EXPECT_EQ(rdma_create_event_channel(), nullptr);
  EXPECT_EQ(errno, ENODEV);
  rdma_cm_id* id = nullptr;
  rdma_event_channel foreign{};
  expect_fails(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), ENODEV);
  expect_fails(rdma_create_id(&foreign, &id, nullptr, RDMA_PS_TCP), ENODEV);
  rdma_addrinfo* res = nullptr;
  expect_fails(rdma_getaddrinfo("127.0.0.1", nullptr, nullptr, &res), ENODEV);
  rdma_addrinfo hints{};
  expect_fails(rdma_create_ep(&id, &hints, nullptr, nullptr), ENODEV);
  rdma_cm_event* event = nullptr;
  expect_fails(rdma_get_cm_event(&foreign, &event), ENODEV);
  int num = -1;
  errno = 0;
  EXPECT_EQ(rdma_get_devices(&num), nullptr);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(num, 0);
  EXPECT_STREQ(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED");
  EXPECT_TRUE(g_none.calls.empty());
  EXPECT_TRUE(g_cm.calls.empty());
}

}  // namespace
