// The softverbs control API (include/softverbs/faults.h), node SOFTVERBS_0.1.
#include "softverbs/faults.h"

#include <cstring>
#include <string>

#include "abi/export.hpp"
#include "emu/objects.hpp"
#include "transport/faults.hpp"

namespace {

int report(bool ok, const std::string& error, char* err, size_t err_len) {
  if (ok) return 0;
  if (err && err_len) {
    std::strncpy(err, error.c_str(), err_len - 1);
    err[err_len - 1] = '\0';
  }
  errno = EINVAL;
  return -1;
}

}  // namespace

SV_EXPORT int softverbs_faults_load(const char* toml_text, char* err, size_t err_len) {
  return softverbs::abi::guarded(-1, [&] {
    std::string error;
    bool ok = toml_text && softverbs::transport::FaultEngine::instance().load(toml_text, &error);
    return report(ok, toml_text ? error : "no scenario text", err, err_len);
  });
}

SV_EXPORT int softverbs_faults_load_file(const char* path, char* err, size_t err_len) {
  return softverbs::abi::guarded(-1, [&] {
    std::string error;
    bool ok = path && softverbs::transport::FaultEngine::instance().load_file(path, &error);
    return report(ok, path ? error : "no path", err, err_len);
  });
}

SV_EXPORT void softverbs_faults_clear(void) { softverbs::transport::FaultEngine::instance().clear(); }

SV_EXPORT void softverbs_faults_seed(uint64_t seed) { softverbs::transport::FaultEngine::instance().set_seed(seed); }

SV_EXPORT int softverbs_faults_log(const char* path) {
  return softverbs::abi::guarded(-1, [&] {
    if (softverbs::transport::FaultEngine::instance().set_log(path ? path : "")) return 0;
    return -1;
  });
}

SV_EXPORT uint64_t softverbs_fault_hits(const char* rule_name) {
  return rule_name ? softverbs::transport::FaultEngine::instance().hits(rule_name) : 0;
}

SV_EXPORT int softverbs_device_counters(const char* device_name, struct softverbs_counters* out, size_t size) {
  for (softverbs::emu::Device* d : softverbs::emu::DeviceRegistry::instance().devices()) {
    if (!device_name || d->name() != device_name) continue;
    const auto& c = d->counters();
    softverbs_counters v{c.tx_packets.load(),       c.rx_packets.load(),         c.rx_icrc_errors.load(),
                         c.rx_malformed.load(),     c.rx_unknown_qp.load(),      c.rx_dropped.load(),
                         c.retransmits.load(),      c.timeouts.load(),           c.naks_sent.load(),
                         c.naks_received.load(),    c.rnr_naks_sent.load(),      c.rnr_naks_received.load(),
                         c.duplicates.load(),       c.faults_dropped.load(),     c.faults_duplicated.load(),
                         c.faults_corrupted.load(), c.faults_delayed.load(),     c.faults_reordered.load(),
                         c.faults_naks_forged.load()};
    std::memcpy(out, &v, size < sizeof v ? size : sizeof v);
    return 0;
  }
  errno = ENODEV;
  return -1;
}
