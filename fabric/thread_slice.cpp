// The progress thread's slice request (see fabric/thread_slice.hpp): the
// sched_getattr/sched_setattr dance, its fallbacks, and SOFTVERBS_PROGRESS_SLICE.
#include "fabric/thread_slice.hpp"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/env.hpp"
#include "core/log.hpp"

namespace softverbs::fabric {
namespace {

constexpr std::chrono::microseconds kDefaultProgressSlice{0};
// The one flag sched_getattr may report that sched_setattr takes back unchanged.
constexpr uint64_t kResetOnFork = 0x01;  // SCHED_FLAG_RESET_ON_FORK

int sys_get(KernelSchedAttr* attr) {
#ifdef SYS_sched_getattr
  if (::syscall(SYS_sched_getattr, 0, attr, sizeof *attr, 0) == 0) return 0;
  return -errno;
#else
  (void)attr;
  return -ENOSYS;
#endif
}

int sys_set(const KernelSchedAttr* attr) {
#ifdef SYS_sched_setattr
  if (::syscall(SYS_sched_setattr, 0, attr, 0) == 0) return 0;
  return -errno;
#else
  (void)attr;
  return -ENOSYS;
#endif
}

std::atomic<SliceState> g_state{SliceState::kNotRequested};

}  // namespace

const SchedAttrOps& kernel_sched_attr_ops() {
  static const SchedAttrOps ops{sys_get, sys_set};
  return ops;
}

const char* to_string(SliceState s) {
  switch (s) {
    case SliceState::kNotRequested: return "not requested";
    case SliceState::kApplied: return "applied";
    case SliceState::kIgnored: return "ignored by this kernel (no custom slices before Linux 6.12)";
    case SliceState::kNotFair: return "not asked: the thread is not SCHED_OTHER";
    case SliceState::kUnsupported: return "refused";
  }
  return "?";
}

SliceState request_slice(std::chrono::microseconds slice, const SchedAttrOps& ops, int* err) {
  if (err) *err = 0;
  if (slice.count() <= 0) return SliceState::kNotRequested;
  if (slice < kMinSlice) slice = kMinSlice;
  if (slice > kMaxSlice) slice = kMaxSlice;
  const uint64_t ns = static_cast<uint64_t>(std::chrono::nanoseconds(slice).count());
  KernelSchedAttr attr{};
  attr.size = sizeof attr;
  if (int rc = ops.get(&attr); rc < 0) {
    if (err) *err = -rc;
    return SliceState::kUnsupported;
  }
  // Only the default policy: a thread made SCHED_BATCH/IDLE or real-time by
  // whoever runs the process keeps what it was given.
  if (attr.sched_policy != SCHED_OTHER) return SliceState::kNotFair;
  // The same policy and nice value (a lower nice would need CAP_SYS_NICE),
  // only the slice changes.
  attr.size = sizeof attr;
  attr.sched_flags &= kResetOnFork;
  attr.sched_priority = 0;
  attr.sched_runtime = ns;
  attr.sched_deadline = 0;
  attr.sched_period = 0;
  if (int rc = ops.set(&attr); rc < 0) {
    if (err) *err = -rc;
    return SliceState::kUnsupported;
  }
  KernelSchedAttr back{};
  back.size = sizeof back;
  if (int rc = ops.get(&back); rc < 0) {
    if (err) *err = -rc;
    return SliceState::kUnsupported;
  }
  return back.sched_runtime == ns ? SliceState::kApplied : SliceState::kIgnored;
}

std::chrono::microseconds parse_progress_slice(const char* text, std::string* error) {
  if (!text || !*text) return kDefaultProgressSlice;
  const std::string v(text);
  if (v.size() <= 6 && v.find_first_not_of("0123456789") == std::string::npos) {
    const auto us = std::chrono::microseconds(std::stoul(v));
    if (us.count() == 0 || (us >= kMinSlice && us <= kMaxSlice)) return us;
  }
  if (error)
    *error = "SOFTVERBS_PROGRESS_SLICE=" + v + ": expected 0 or microseconds from " +
             std::to_string(kMinSlice.count()) + " to " + std::to_string(kMaxSlice.count());
  return kDefaultProgressSlice;
}

void request_progress_slice() {
  std::string error;
  const auto slice = parse_progress_slice(env::progress_slice(), &error);
  if (!error.empty()) SV_LOG(kError, "%s; using %lld", error.c_str(), static_cast<long long>(kDefaultProgressSlice.count()));
  int err = 0;
  const SliceState s = request_slice(slice, kernel_sched_attr_ops(), &err);
  g_state.store(s, std::memory_order_relaxed);
  if (s == SliceState::kApplied || s == SliceState::kNotRequested)
    SV_LOG(kDebug, "progress thread: slice %lld us %s", static_cast<long long>(slice.count()), to_string(s));
  else
    SV_LOG(kDebug, "progress thread: slice of %lld us %s%s%s; the kernel's slice stays",
           static_cast<long long>(slice.count()), to_string(s), err ? ": " : "", err ? std::strerror(err) : "");
}

SliceState slice_state() { return g_state.load(std::memory_order_relaxed); }

}  // namespace softverbs::fabric
