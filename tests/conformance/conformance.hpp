// Control-path conformance suite: shared fixture and helpers.
//
// Everything here, the test kit (tests/support/) included, uses only the public
// verbs API (plus the ibv_query_gid_type declaration rdma-core keeps in its
// private driver header), so the same tests run against any libibverbs-compatible
// device. Every test is parameterised over
// the devices ibv_get_device_list() returns; the parameter is the device name.
#pragma once

#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tests/support/gtest.hpp"
#include "tests/support/names.hpp"
#include "tests/support/wait.hpp"

// Declared by rdma-core in <infiniband/driver.h>, which applications do not include.
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };
extern "C" int ibv_query_gid_type(struct ibv_context* context, uint8_t port_num, unsigned int index,
                                  enum ibv_gid_type_sysfs* type);

namespace conformance {

// How long a test waits for an event that must arrive (poll() timeout). Events
// are expected at once; the bound only turns a missing event into a failure.
inline constexpr int kEventTimeoutMs = 2000;

// The names of the devices ibv_get_device_list() returns, read once per process.
const std::vector<std::string>& device_names();

// A gtest-safe version of a device name, for test names.
std::string device_param_name(const ::testing::TestParamInfo<std::string>& info);

// True if fd becomes readable within timeout_ms.
inline bool wait_readable(int fd, int timeout_ms = kEventTimeoutMs) {
  return softverbs::testkit::wait_readable(fd, timeout_ms);
}

// Up to n completions of cq collected within timeout_ms (tests/support/wait.hpp).
inline std::vector<ibv_wc> poll_completions(ibv_cq* cq, int n, int timeout_ms = kEventTimeoutMs) {
  return softverbs::testkit::poll_completions(cq, n, timeout_ms);
}

// Sets or clears O_NONBLOCK; returns the previous flags (or -1).
int set_nonblocking(int fd, bool on);

// True for ::ffff:a.b.c.d.
bool gid_is_ipv4_mapped(const ibv_gid& gid);
bool gid_is_zero(const ibv_gid& gid);

// ---- observations -------------------------------------------------------
// Where the suite accepts more than one behaviour (an errno that differs by
// provider, an optional feature, a size a device may round up), the test also
// records what it saw. Each observation is the test property
// "observed.<key>" in GoogleTest's results (--gtest_output=json:FILE), which
// scripts/divergence.py reports and compares between backends
// (docs/hardware.md, "Divergence report"). Observing never fails a test and
// leaves errno as it was. A key observed again in the same test with another
// value keeps every distinct value, in order, separated by ", ".
void observe(const std::string& key, const std::string& value);
inline void observe(const std::string& key, const char* value) { observe(key, std::string(value ? value : "")); }
template <class T>
requires std::is_integral_v<T>
void observe(const std::string& key, T value) { observe(key, std::to_string(value)); }

// The symbolic name of an errno value: "EINVAL", "ENOMEM", ...; "0" for 0, the
// number for an unknown value, and "-EINVAL" for a negated one (verbs that
// return -errno).
std::string errno_name(int e);

// "ok" for a verbs object that was created, otherwise the name of the current
// errno (read before anything else can change it).
std::string outcome(const void* object);

using softverbs::testkit::qp_state_name;
using softverbs::testkit::qp_type_name;
std::string qp_mask_names(uint32_t mask);

// One row of the IBTA modify-QP state transition table (IBTA Vol 1 11.2.5.2,
// as enforced by Linux ib_modify_qp_is_ok()) for RC, UC and UD QPs: whether the
// cur -> next transition exists, the attributes it requires and those it also
// accepts (IBV_QP_STATE is implied in both). IBV_QP_CUR_STATE is accepted only
// where listed as optional, which is only from RTR, RTS, SQD and SQE.
struct TransitionRule {
  bool valid = false;
  uint32_t required = 0;
  uint32_t optional = 0;
};
TransitionRule transition_rule(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next);

// Owners of verbs objects (tests/support/verbs.hpp): a destroy that fails at
// scope exit is a test failure.
using Context = softverbs::testkit::Checked::Context;
using Pd = softverbs::testkit::Checked::Pd;
using Mr = softverbs::testkit::Checked::Mr;
using Channel = softverbs::testkit::Checked::Channel;
using Cq = softverbs::testkit::Checked::Cq;
using Srq = softverbs::testkit::Checked::Srq;
using Qp = softverbs::testkit::Checked::Qp;
using Ah = softverbs::testkit::Checked::Ah;

// Fixture: opens the device named by the parameter, queries it and its first
// port, allocates a PD, and offers helpers for CQs, QPs and QP state changes.
class VerbsTest : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr uint8_t kPort = 1;

  void SetUp() override;
  void TearDown() override;

  bool is_ethernet() const { return pattr_.link_layer == IBV_LINK_LAYER_ETHERNET; }

  // A CQ on ctx_ (ADD_FAILURE and null on error).
  Cq make_cq(int cqe = 16, ibv_comp_channel* channel = nullptr, void* cq_context = nullptr);

  // Small default capabilities: 4 WRs and 1 SGE each way, no inline data.
  ibv_qp_init_attr qp_init_attr(ibv_qp_type type, ibv_cq* cq, ibv_srq* srq = nullptr) const;
  Qp make_qp(ibv_qp_type type, ibv_cq* cq, ibv_srq* srq = nullptr);
  Qp make_qp(ibv_qp_init_attr attr);

  // An address vector that reaches this port itself: on Ethernet a GRH to the
  // device's (preferably IPv4-mapped RoCEv2) GID, on InfiniBand the port LID.
  ibv_ah_attr loopback_ah_attr() const;

  // Attributes for a cur -> next modify with every field holding a valid value,
  // so that any mask bit can be added without making a value wrong.
  ibv_qp_attr valid_attr(const ibv_qp* qp, ibv_qp_state cur, ibv_qp_state next) const;

  // One cur -> next modify with IBV_QP_STATE and exactly the required attributes.
  int modify_min(ibv_qp* qp, ibv_qp_state next);

  // Drives a QP in RESET to target along RESET-INIT-RTR-RTS(-SQD), or
  // RESET-INIT-ERR. Returns the first failing modify's result.
  int move_to(ibv_qp* qp, ibv_qp_state target);

  // Checks that qp->state and ibv_query_qp() agree on the expected state.
  void expect_state(ibv_qp* qp, ibv_qp_state expected);

  ibv_device** list_ = nullptr;
  ibv_device* device_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_device_attr dattr_{};
  ibv_port_attr pattr_{};
  // The GID used for loopback address vectors and its index.
  int sgid_index_ = -1;
  ibv_gid sgid_{};
  // The IPv4-mapped RoCEv2 GID (Ethernet ports), -1 if none.
  int ipv4_gid_index_ = -1;
  ibv_gid ipv4_gid_{};
};

// A VerbsTest with one CQ of 64 entries on the device (cq_), destroyed before
// the fixture's PD and context.
class VerbsCqTest : public VerbsTest {
 protected:
  void SetUp() override;
  void TearDown() override;

  Cq cq_;
};

}  // namespace conformance

// Instantiates a VerbsTest-derived fixture over every listed device. With no
// device listed, DeviceList.AtLeastOneDeviceIsListed fails instead.
#define CONFORMANCE_INSTANTIATE(Fixture)                                                         \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Fixture);                                        \
  INSTANTIATE_TEST_SUITE_P(Devices, Fixture, ::testing::ValuesIn(::conformance::device_names()), \
                           ::conformance::device_param_name)
