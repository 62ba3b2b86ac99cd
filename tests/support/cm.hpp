// The rdma_cm test kit (conformance and fault suites): the two device addresses the tests
// connect, bounded waits for CM events, and owners that release ids and
// channels. Public API only (rdma/rdma_cma.h, infiniband/verbs.h), so the same
// tests run over any librdmacm; where the process has no RDMA CM at all
// (rdma_create_event_channel fails with ENODEV or ENOENT) every test is skipped.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace cmtest {

// How long a test waits for an event that must come (a poll() bound, never a
// sleep): events are expected at once, the bound turns a missing one into a failure.
inline constexpr int kEventTimeoutMs = 5000;
// The port the tests listen on; each test takes its own so that a late MAD of
// one test never meets another's listener.
inline uint16_t next_port() {
  static uint16_t port = 20000 + static_cast<uint16_t>(getpid() % 20000);
  return ++port;
}

inline sockaddr_in v4(const char* text, uint16_t port = 0) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, text, &a.sin_addr);
  return a;
}
inline sockaddr_in v4(in_addr addr, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr = addr;
  return a;
}
inline sockaddr* sa(sockaddr_in& a) { return reinterpret_cast<sockaddr*>(&a); }
inline sockaddr* sa(sockaddr_in6& a) { return reinterpret_cast<sockaddr*>(&a); }

// The RoCE devices and their IPv4 addresses (their RoCEv2 GID, ::ffff:a.b.c.d),
// in the order ibv_get_device_list() gives.
struct DeviceAddr {
  std::string name;
  in_addr addr;
};
inline std::vector<DeviceAddr> roce_devices() {
  std::vector<DeviceAddr> out;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  for (int i = 0; list && i < n; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) continue;
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, 1, &pa) == 0 && pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
      for (int idx = 0; idx < pa.gid_tbl_len && idx < 16; ++idx) {
        ibv_gid g{};
        if (ibv_query_gid(ctx, 1, idx, &g) != 0) break;
        static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (std::memcmp(g.raw, kPrefix, 12) == 0) {
          in_addr a;
          std::memcpy(&a.s_addr, g.raw + 12, 4);
          out.push_back({ibv_get_device_name(list[i]), a});
          break;
        }
      }
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  return out;
}

// The next event of the channel within timeout_ms, or null (nothing is
// taken when the fd never polls readable).
inline rdma_cm_event* next_event(rdma_event_channel* ch, int timeout_ms = kEventTimeoutMs) {
  pollfd p{ch->fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return nullptr;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev) != 0) return nullptr;
  return ev;
}

// Waits for an event of the given type and returns it (the caller acks it),
// failing the test on another type, another status or nothing in time.
inline rdma_cm_event* expect_event(rdma_event_channel* ch, rdma_cm_event_type type, int status = 0,
                                   int timeout_ms = kEventTimeoutMs) {
  rdma_cm_event* ev = next_event(ch, timeout_ms);
  EXPECT_NE(ev, nullptr) << "no " << rdma_event_str(type) << " within " << timeout_ms << " ms";
  if (!ev) return nullptr;
  EXPECT_EQ(ev->event, type) << rdma_event_str(ev->event) << " instead of " << rdma_event_str(type);
  EXPECT_EQ(ev->status, status) << rdma_event_str(ev->event);
  return ev;
}

// Acks the event expect_event returned; true if it was the one wanted.
inline bool ack_expected(rdma_event_channel* ch, rdma_cm_event_type type, int status = 0,
                         int timeout_ms = kEventTimeoutMs) {
  rdma_cm_event* ev = expect_event(ch, type, status, timeout_ms);
  if (!ev) return false;
  bool ok = ev->event == type && ev->status == status;
  rdma_ack_cm_event(ev);
  return ok;
}

// Owners for the test's objects (destroyed in reverse order).
struct Channel {
  rdma_event_channel* ch = rdma_create_event_channel();
  ~Channel() {
    if (ch) rdma_destroy_event_channel(ch);
  }
  operator rdma_event_channel*() const { return ch; }
  rdma_event_channel* operator->() const { return ch; }
};

struct Id {
  rdma_cm_id* id = nullptr;
  Id() = default;
  Id(rdma_event_channel* ch, rdma_port_space ps = RDMA_PS_TCP) { EXPECT_EQ(rdma_create_id(ch, &id, nullptr, ps), 0); }
  ~Id() { reset(); }
  void reset(rdma_cm_id* other = nullptr) {
    if (id) {
      if (id->qp) rdma_destroy_qp(id);
      rdma_destroy_id(id);
    }
    id = other;
  }
  rdma_cm_id* release() {
    rdma_cm_id* r = id;
    id = nullptr;
    return r;
  }
  operator rdma_cm_id*() const { return id; }
  rdma_cm_id* operator->() const { return id; }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
};

// The fixture: two device addresses (a: the active side's, b: the passive
// side's) and a channel for each side.
class CmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rdma_event_channel* probe = rdma_create_event_channel();
    // ENODEV: librdmacm found no RDMA device; ENOENT: it found devices but the
    // kernel has no RDMA CM (no /dev/infiniband/rdma_cm), as through the
    // passthrough to the real librdmacm on a machine without one.
    if (!probe && (errno == ENODEV || errno == ENOENT))
      GTEST_SKIP() << "no RDMA CM in this process (rdma_create_event_channel: " << strerror(errno) << ")";
    ASSERT_NE(probe, nullptr) << strerror(errno);
    rdma_destroy_event_channel(probe);
    devices_ = roce_devices();
    if (devices_.size() < 2) GTEST_SKIP() << "two RoCE devices needed";
    a_ = devices_[0].addr;
    b_ = devices_[1].addr;
    ASSERT_NE(active_.ch, nullptr);
    ASSERT_NE(passive_.ch, nullptr);
  }

  std::vector<DeviceAddr> devices_;
  in_addr a_{}, b_{};
  Channel active_, passive_;
};

}  // namespace cmtest
