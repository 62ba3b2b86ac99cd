// The table of the library's environment variables and their read-once accessors
// (see core/env.hpp). tests/unit/env_test.cpp checks the table against
// docs/configuration.md; tests/layout keeps getenv out of every other file.
#include "core/env.hpp"

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <string>

namespace softverbs::env {
namespace {

constexpr const char* kLibrary = "Library variables";

constexpr std::array kTable = {
    Variable{Var::kDevices, "SOFTVERBS_DEVICES", "the emulated devices: a count or NAME[@ADDRESS][/LINK] entries",
             "1 (one device emu0 on an automatic address)", kLibrary, false},
    Variable{Var::kLinkLayer, "SOFTVERBS_LINK_LAYER", "link layer of devices whose entry has no /LINK (eth or ib)",
             "eth", kLibrary, false},
    Variable{Var::kMtu, "SOFTVERBS_MTU", "active_mtu of every emulated device's port", "4096", kLibrary, false},
    Variable{Var::kHostLink, "SOFTVERBS_HOST_LINK",
             "how packets reach emulated devices of other processes of this host (unix, unix:MS, socket, socket:MS or udp)",
             "unix (lossless, a full receiver is waited for up to 100 ms)", kLibrary, false},
    Variable{Var::kAutoAddrs, "SOFTVERBS_AUTO_ADDRS",
             "addresses tried first for the devices with automatic addresses (set by softverbs run)",
             "unset: search the automatic range", kLibrary, false},
    Variable{Var::kLog, "SOFTVERBS_LOG", "level of softverbs' diagnostics on stderr (none, error, warn, info, debug)",
             "error", kLibrary, false},
    Variable{Var::kBackend, "SOFTVERBS_BACKEND", "which backends list devices (emu, hw or both)", "emu", kLibrary,
             false},
    Variable{Var::kHwLibibverbs, "SOFTVERBS_HW_LIBIBVERBS", "absolute path of rdma-core's libibverbs.so.1 for the hw backend",
             "the distribution's /usr/lib/<arch>/libibverbs.so.1", kLibrary, false},
    Variable{Var::kHwLibrdmacm, "SOFTVERBS_HW_LIBRDMACM", "absolute path of rdma-core's librdmacm.so.1 for the hw CM passthrough",
             "the distribution's /usr/lib/<arch>/librdmacm.so.1", kLibrary, false},
    Variable{Var::kPcap, "SOFTVERBS_PCAP", "pcap file of the emulated devices' packets (%p: the process id)",
             "unset: no capture", kLibrary, false},
    Variable{Var::kTrace, "SOFTVERBS_TRACE",
             "Chrome trace event JSON file of verbs, packets, timers, completions and events (%p: the process id)",
             "unset: no trace", kLibrary, false},
    Variable{Var::kFaults, "SOFTVERBS_FAULTS", "fault scenario file (TOML, docs/faults.md)", "unset: no faults",
             kLibrary, false},
    Variable{Var::kFaultSeed, "SOFTVERBS_FAULT_SEED", "seed of the fault rules' random streams", "1", kLibrary, false},
    Variable{Var::kFaultLog, "SOFTVERBS_FAULT_LOG", "file that gets one line per fault decision",
             "unset: no decision log", kLibrary, false},
    // rdma-core's rule: ignored in setuid programs.
    Variable{Var::kSysfsPath, "SYSFS_PATH", "what ibv_get_sysfs_path() returns", "/sys", kLibrary, true},
    Variable{Var::kCmResponseTimeout, "SOFTVERBS_CM_RESPONSE_TIMEOUT",
             "the emulated CM's response timeout, as IBTA's 5-bit exponent (4.096 us * 2^N)", "20", kLibrary,
             false},
    Variable{Var::kCmMaxRetries, "SOFTVERBS_CM_MAX_RETRIES", "how often the emulated CM resends an unanswered MAD",
             "15", kLibrary, false},
    Variable{Var::kVendorPartId, "SOFTVERBS_VENDOR_PART_ID",
             "vendor_part_id every emulated device reports (tools such as perftest choose their post API by it)",
             "21334 (0x5356, no adapter's id)", kLibrary, false},
    Variable{Var::kPostBeforeRts, "SOFTVERBS_POST_BEFORE_RTS",
             "posting to a QP before RTS: queue (as ConnectX) or refuse (EINVAL, as the IBTA and rxe)",
             "the personality's post.before_rts (queue for connectx)", kLibrary, false},
    Variable{Var::kClock, "SOFTVERBS_CLOCK",
             "the engine's time: real, or virtual (time jumps to the next deadline whenever every thread waits)",
             "real", kLibrary, false},
    Variable{Var::kPersonality, "SOFTVERBS_PERSONALITY",
             "the vendor personality of the emulated devices: a NAME (connectx, rxe) or a file path",
             "connectx (built-in values, no file read)", kLibrary, false},
    Variable{Var::kTopology, "SOFTVERBS_TOPOLOGY",
             "simulated fabric between the devices of the process: a TOML file of nodes and links (latency, "
             "bandwidth, loss, MTU)",
             "unset: devices of the process reach each other at once, without loss", kLibrary, false},
    Variable{Var::kProgressSlice, "SOFTVERBS_PROGRESS_SLICE",
             "scheduler slice the progress thread asks Linux for, in microseconds (100-100000; 0: the kernel's)",
             "0 (the kernel's slice)", kLibrary, false},
    Variable{Var::kAdaptiveRetransmit, "SOFTVERBS_ADAPTIVE_RETRANSMIT",
             "early resends timed from the measured round trip, before the local ACK timeout (1/on or 0/off)",
             "on (as ConnectX's adaptive retransmission)", kLibrary, false},
};

// kTable is indexed by Var.
constexpr bool indexed_by_var() {
  for (size_t i = 0; i < kTable.size(); ++i)
    if (static_cast<size_t>(kTable[i].var) != i) return false;
  return true;
}
static_assert(indexed_by_var(), "kTable must list the variables in the order of enum Var");

struct Slot {
  std::once_flag once;
  bool set = false;
  std::string value;
};

}  // namespace

std::span<const Variable> variables() noexcept { return kTable; }

const char* raw(Var v) noexcept {
  // Never destroyed: values may be asked for by static destructors and at-exit handlers.
  static auto* slots = new std::array<Slot, kTable.size()>;
  const Variable& var = kTable[static_cast<size_t>(v)];
  Slot& slot = (*slots)[static_cast<size_t>(v)];
  std::call_once(slot.once, [&] {
    if (var.ignored_if_setuid && getuid() != geteuid()) return;
    // A copy: the string getenv returns may be replaced by a later setenv.
    if (const char* text = std::getenv(var.name)) {
      slot.set = true;
      slot.value = text;
    }
  });
  return slot.set ? slot.value.c_str() : nullptr;
}

}  // namespace softverbs::env
