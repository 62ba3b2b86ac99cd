// The progress thread's slice request (fabric/thread_slice.hpp): what it asks
// the kernel for (policy and nice kept, the slice clamped to the kernel's
// bounds), how it degrades (no system call, a refusal, a kernel that ignores
// the slice, a thread that is not SCHED_OTHER), SOFTVERBS_PROGRESS_SLICE's
// parsing, and the real system calls on a thread of this test.
#include <gtest/gtest.h>

#include <sched.h>

#include <cerrno>
#include <string>
#include <thread>

#include "fabric/thread_slice.hpp"

namespace softverbs::fabric {
namespace {

using std::chrono::microseconds;

// A fake kernel: the attributes of one thread and what the calls do.
struct FakeKernel {
  KernelSchedAttr current{};
  int get_error = 0;      // -errno sched_getattr returns
  int set_error = 0;      // -errno sched_setattr returns
  bool custom_slices = true;  // false: sched_runtime is accepted and ignored (before 6.12)
  int gets = 0, sets = 0;
  KernelSchedAttr last_set{};
};
FakeKernel* fake = nullptr;

int fake_get(KernelSchedAttr* a) {
  ++fake->gets;
  if (fake->get_error) return fake->get_error;
  *a = fake->current;
  return 0;
}
int fake_set(const KernelSchedAttr* a) {
  ++fake->sets;
  fake->last_set = *a;
  if (fake->set_error) return fake->set_error;
  fake->current.sched_policy = a->sched_policy;
  fake->current.sched_nice = a->sched_nice;
  if (fake->custom_slices) fake->current.sched_runtime = a->sched_runtime;
  return 0;
}
const SchedAttrOps kFakeOps{fake_get, fake_set};

class ThreadSlice : public ::testing::Test {
 protected:
  void SetUp() override {
    k.current.size = sizeof k.current;
    k.current.sched_policy = SCHED_OTHER;
    k.current.sched_nice = 5;
    k.current.sched_runtime = 3000000;  // the kernel's default slice, reported since 6.12
    fake = &k;
  }
  void TearDown() override { fake = nullptr; }
  FakeKernel k;
};

TEST_F(ThreadSlice, AppliedKeepsPolicyAndNice) {
  int err = -1;
  EXPECT_EQ(request_slice(microseconds(250), kFakeOps, &err), SliceState::kApplied);
  EXPECT_EQ(err, 0);
  EXPECT_EQ(k.sets, 1);
  EXPECT_EQ(k.last_set.size, sizeof(KernelSchedAttr));
  EXPECT_EQ(k.last_set.sched_policy, static_cast<uint32_t>(SCHED_OTHER));
  EXPECT_EQ(k.last_set.sched_nice, 5);  // a lower nice would need privilege
  EXPECT_EQ(k.last_set.sched_runtime, 250000u);
  EXPECT_EQ(k.last_set.sched_deadline, 0u);
  EXPECT_EQ(k.last_set.sched_period, 0u);
}

TEST_F(ThreadSlice, ClampedToTheKernelsBounds) {
  EXPECT_EQ(request_slice(microseconds(10), kFakeOps), SliceState::kApplied);
  EXPECT_EQ(k.last_set.sched_runtime, 100000u);
  EXPECT_EQ(request_slice(microseconds(500000), kFakeOps), SliceState::kApplied);
  EXPECT_EQ(k.last_set.sched_runtime, 100000000u);
}

TEST_F(ThreadSlice, OnlyTheResetOnForkFlagIsKept) {
  k.current.sched_flags = 0x01 | 0x20 | 0x40;  // reset-on-fork, util clamps
  EXPECT_EQ(request_slice(microseconds(100), kFakeOps), SliceState::kApplied);
  EXPECT_EQ(k.last_set.sched_flags, 0x01u);
}

TEST_F(ThreadSlice, ZeroAsksForNothing) {
  EXPECT_EQ(request_slice(microseconds(0), kFakeOps), SliceState::kNotRequested);
  EXPECT_EQ(k.gets + k.sets, 0);
}

TEST_F(ThreadSlice, NoSystemCall) {
  k.get_error = -ENOSYS;
  int err = 0;
  EXPECT_EQ(request_slice(microseconds(100), kFakeOps, &err), SliceState::kUnsupported);
  EXPECT_EQ(err, ENOSYS);
  EXPECT_EQ(k.sets, 0);
}

TEST_F(ThreadSlice, Refused) {
  k.set_error = -EPERM;
  int err = 0;
  EXPECT_EQ(request_slice(microseconds(100), kFakeOps, &err), SliceState::kUnsupported);
  EXPECT_EQ(err, EPERM);
  EXPECT_EQ(k.current.sched_runtime, 3000000u);
}

TEST_F(ThreadSlice, IgnoredByAnOlderKernel) {
  k.custom_slices = false;
  k.current.sched_runtime = 0;  // before 6.12 nothing is reported for SCHED_OTHER
  EXPECT_EQ(request_slice(microseconds(100), kFakeOps), SliceState::kIgnored);
}

TEST_F(ThreadSlice, OtherPoliciesAreLeftAlone) {
  for (uint32_t policy : {uint32_t{SCHED_BATCH}, uint32_t{SCHED_IDLE}, uint32_t{SCHED_FIFO}, uint32_t{SCHED_RR}}) {
    k.current.sched_policy = policy;
    k.sets = 0;
    EXPECT_EQ(request_slice(microseconds(100), kFakeOps), SliceState::kNotFair) << policy;
    EXPECT_EQ(k.sets, 0) << policy;
  }
}

TEST(ThreadSliceParse, Values) {
  std::string error;
  EXPECT_EQ(parse_progress_slice(nullptr, &error), microseconds(0));
  EXPECT_EQ(parse_progress_slice("", &error), microseconds(0));
  EXPECT_EQ(parse_progress_slice("0", &error), microseconds(0));
  EXPECT_EQ(parse_progress_slice("100", &error), microseconds(100));
  EXPECT_EQ(parse_progress_slice("100000", &error), microseconds(100000));
  EXPECT_TRUE(error.empty()) << error;
  for (const char* bad : {"50", "100001", "-1", "1ms", "abc", "9999999", " 100"}) {
    error.clear();
    EXPECT_EQ(parse_progress_slice(bad, &error), microseconds(0)) << bad;
    EXPECT_NE(error.find("SOFTVERBS_PROGRESS_SLICE"), std::string::npos) << bad;
  }
}

// The real calls, on a thread of its own (the slice stays with that thread).
// Any outcome but a crash is allowed (the kernel decides); an applied slice
// must read back.
TEST(ThreadSliceKernel, RequestOnARealThread) {
  SliceState s = SliceState::kNotRequested;
  uint64_t reported = 0;
  std::thread t([&] {
    s = request_slice(microseconds(200), kernel_sched_attr_ops());
    KernelSchedAttr a{};
    a.size = sizeof a;
    if (kernel_sched_attr_ops().get(&a) == 0) reported = a.sched_runtime;
  });
  t.join();
  EXPECT_NE(s, SliceState::kNotRequested);
  if (s == SliceState::kApplied) {
    EXPECT_EQ(reported, 200000u);
  }
  // The calls go to the calling thread only: this one keeps its slice.
  KernelSchedAttr mine{};
  mine.size = sizeof mine;
  if (s == SliceState::kApplied && kernel_sched_attr_ops().get(&mine) == 0) {
    EXPECT_NE(mine.sched_runtime, 200000u);
  }
}

}  // namespace
}  // namespace softverbs::fabric
