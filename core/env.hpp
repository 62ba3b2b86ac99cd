// The environment variables the library reads: one table (kVariables) that
// mirrors docs/configuration.md, and one accessor per variable. This is the only
// place that calls getenv (tests/layout checks it).
//
// docs/configuration.md: every variable is read once per process, the first time
// it is needed, and a later setenv has no effect. An accessor reads its variable
// at its own first call (thread-safe) and returns that same value ever after; each
// module calls it at the point the docs name (SOFTVERBS_LOG at the first
// diagnostic, the device variables at the first device listing, ...), so the
// timing is the caller's. Values are raw: nullptr when unset, the text otherwise
// (possibly empty). Parsing stays with the module that owns the meaning.
#pragma once

#include <cstddef>
#include <span>

namespace softverbs::env {

enum class Var {
  kDevices,
  kLinkLayer,
  kMtu,
  kHostLink,
  kAutoAddrs,
  kLog,
  kBackend,
  kHwLibibverbs,
  kHwLibrdmacm,
  kPcap,
  kTrace,
  kFaults,
  kFaultSeed,
  kFaultLog,
  kSysfsPath,
  kCmResponseTimeout,
  kCmMaxRetries,
  kVendorPartId,
  kPostBeforeRts,
  kClock,
  kPersonality,
  kTopology,
  kProgressSlice,
  kAdaptiveRetransmit,
};

struct Variable {
  Var var;
  const char* name;         // e.g. "SOFTVERBS_LOG"
  const char* meaning;      // one line
  const char* fallback;     // what an unset variable means
  const char* doc_section;  // the "## " section of docs/configuration.md that documents it
  bool ignored_if_setuid;   // read only when the real and effective user IDs are equal
};

// Every variable the library reads, in the order of docs/configuration.md.
std::span<const Variable> variables() noexcept;

// The raw value of `v`, read from the environment at the first call for `v`:
// nullptr if unset (or ignored, see ignored_if_setuid). The text lives until exit.
const char* raw(Var v) noexcept;

// One accessor per variable (see variables() for their meaning).
inline const char* devices() noexcept { return raw(Var::kDevices); }
inline const char* link_layer() noexcept { return raw(Var::kLinkLayer); }
inline const char* mtu() noexcept { return raw(Var::kMtu); }
inline const char* host_link() noexcept { return raw(Var::kHostLink); }
inline const char* auto_addrs() noexcept { return raw(Var::kAutoAddrs); }
inline const char* log() noexcept { return raw(Var::kLog); }
inline const char* backend() noexcept { return raw(Var::kBackend); }
inline const char* hw_libibverbs() noexcept { return raw(Var::kHwLibibverbs); }
inline const char* hw_librdmacm() noexcept { return raw(Var::kHwLibrdmacm); }
inline const char* pcap() noexcept { return raw(Var::kPcap); }
inline const char* trace() noexcept { return raw(Var::kTrace); }
inline const char* faults() noexcept { return raw(Var::kFaults); }
inline const char* fault_seed() noexcept { return raw(Var::kFaultSeed); }
inline const char* fault_log() noexcept { return raw(Var::kFaultLog); }
inline const char* sysfs_path() noexcept { return raw(Var::kSysfsPath); }
inline const char* cm_response_timeout() noexcept { return raw(Var::kCmResponseTimeout); }
inline const char* cm_max_retries() noexcept { return raw(Var::kCmMaxRetries); }
inline const char* vendor_part_id() noexcept { return raw(Var::kVendorPartId); }
inline const char* post_before_rts() noexcept { return raw(Var::kPostBeforeRts); }
inline const char* clock() noexcept { return raw(Var::kClock); }
inline const char* personality() noexcept { return raw(Var::kPersonality); }
inline const char* topology() noexcept { return raw(Var::kTopology); }
inline const char* progress_slice() noexcept { return raw(Var::kProgressSlice); }
inline const char* adaptive_retransmit() noexcept { return raw(Var::kAdaptiveRetransmit); }

}  // namespace softverbs::env
