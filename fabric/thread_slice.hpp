// A shorter scheduler slice for the progress thread (Linux EEVDF, 6.12 and
// later), so that its wake-up preempts the application thread it shares a CPU
// with instead of waiting for that thread's slice to run out.
//
// Why: a process pinned to one CPU (benchmarks/perftest.sh pins each perftest
// process) runs its application thread and its progress thread there. When the
// application spins on memory (ib_write_lat waits for the peer's WRITE that
// way), every packet needs the progress thread, which sleeps; woken, it is
// queued behind the spinning thread, and unless the scheduler preempts that
// thread at once the packet waits for the rest of its slice (milliseconds).
// EEVDF lets a SCHED_OTHER thread ask for a shorter slice with sched_setattr's
// sched_runtime (clamped by the kernel to 0.1-100 ms; no privilege needed, the
// nice value is kept), and a woken thread whose slice is shorter than the
// running thread's may preempt it at once (the PREEMPT_SHORT feature). Kernels
// before 6.12 accept the call for SCHED_OTHER and ignore sched_runtime:
// sched_getattr then does not report it back, which is how that is told apart.
// Nothing fails when the request is refused or ignored: the thread keeps the
// kernel's slice, and slice_state() says why (SOFTVERBS_LOG=debug logs it).
// Asked for only with SOFTVERBS_PROGRESS_SLICE: measured on Linux 6.18, a
// 100 us slice changed neither ib_write_lat's typical latency nor its tail,
// whose long waits are the woken thread not being eligible to run yet
// (docs/performance.md, "Wake-up leases").
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace softverbs::fabric {

// The kernel's struct sched_attr (include/uapi/linux/sched/types.h), up to the
// utilisation clamps: glibc has no wrapper for sched_setattr/sched_getattr.
struct KernelSchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime;  // SCHED_OTHER on EEVDF: the slice, in ns
  uint64_t sched_deadline;
  uint64_t sched_period;
  uint32_t sched_util_min;
  uint32_t sched_util_max;
};

// The two system calls on the calling thread, replaceable in tests. Each
// returns 0 or -errno.
struct SchedAttrOps {
  int (*get)(KernelSchedAttr* attr);
  int (*set)(const KernelSchedAttr* attr);
};
// The real ones (syscall(2) on thread 0, the caller).
const SchedAttrOps& kernel_sched_attr_ops();

enum class SliceState : uint8_t {
  kNotRequested,  // no request made (yet), or a slice of 0 asked for the kernel's default
  kApplied,       // the kernel reports the slice asked for
  kIgnored,       // accepted but not reported back: a kernel without custom slices
  kNotFair,       // the thread is not SCHED_OTHER (batch, idle, real-time): left alone
  kUnsupported,   // no sched_getattr/sched_setattr (ENOSYS) or it refused the request (errno)
};
const char* to_string(SliceState s);

// The kernel's bounds for a SCHED_OTHER slice.
inline constexpr std::chrono::microseconds kMinSlice{100};
inline constexpr std::chrono::microseconds kMaxSlice{100000};

// Asks for `slice` (clamped to [kMinSlice, kMaxSlice]) for the calling thread,
// keeping its policy and nice value. A slice of 0 asks for nothing. *err gets
// the errno of a refusal (0 otherwise).
SliceState request_slice(std::chrono::microseconds slice, const SchedAttrOps& ops, int* err = nullptr);

// SOFTVERBS_PROGRESS_SLICE: microseconds ("0": the kernel's default slice);
// default 0 (docs/performance.md: no measured gain on this machine's
// kernel). A bad value is reported in *error and the default returned.
std::chrono::microseconds parse_progress_slice(const char* text, std::string* error);

// The progress thread's request, made at its start (fabric/scheduler.cpp):
// the slice of SOFTVERBS_PROGRESS_SLICE, the outcome kept for slice_state()
// and logged once.
void request_progress_slice();
// What the last request_progress_slice() of this process got.
SliceState slice_state();

}  // namespace softverbs::fabric
