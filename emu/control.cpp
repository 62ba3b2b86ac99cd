// The control API on emulated devices (include/softverbs/faults.h; the Provider
// control methods of core/provider.hpp).
#include <cstring>

#include "core/events.hpp"
#include "emu/objects/objects.hpp"
#include "emu/qp/qp.hpp"
#include "emu/provider.hpp"
#include "emu/device/sysfs_counters.hpp"

namespace softverbs::emu {

namespace {

Device* device_named(const char* name) {
  if (!name) return nullptr;
  for (Device* d : DeviceRegistry::instance().devices())
    if (d->name() == name) return d;
  return nullptr;
}

}  // namespace

int EmuProvider::device_counters(const char* device_name, softverbs_counters* out) {
  Device* d = device_named(device_name);
  if (!d) return ENODEV;
  const auto& c = d->counters();
  *out = softverbs_counters{c.tx_packets.load(),         c.rx_packets(),      c.rx_icrc_errors.load(),
                            c.rx_malformed.load(),       c.rx_unknown_qp.load(),   c.rx_dropped.load(),
                            c.retransmits.load(),        c.timeouts.load(),        c.naks_sent.load(),
                            c.naks_received.load(),      c.rnr_naks_sent.load(),   c.rnr_naks_received.load(),
                            c.duplicates.load(),         c.faults_dropped.load(),  c.faults_duplicated.load(),
                            c.faults_corrupted.load(),   c.faults_delayed.load(),  c.faults_reordered.load(),
                            c.faults_naks_forged.load(), c.port_down_drops.load(), c.faults_verbs.load(),
                            c.tx_bytes.load(),           c.rx_bytes.load(),        c.tx_multicast.load(),
                            c.rx_multicast.load(),       c.host_drops.load(),      c.link_downed.load(),
                            c.dup_requests.load(),       c.out_of_seq_requests.load(), c.seq_naks_received.load(),
                            c.retry_exceeded.load(),     c.rnr_retry_exceeded.load(), c.sends_completed.load(),
                            c.recvs_completed.load(),    c.topology_loss_drops.load(), c.topology_mtu_drops.load(),
                            c.rx_direct.load()};
  return 0;
}

int EmuProvider::port_set_state(const char* device_name, uint8_t port_num, bool active) {
  Device* d = device_named(device_name);
  if (!d) return ENODEV;
  if (port_num != 1) return EINVAL;
  if (active && d->fatal()) return EIO;
  d->set_port_active(active);
  return 0;
}

int EmuProvider::device_fatal(const char* device_name) {
  Device* d = device_named(device_name);
  if (!d) return ENODEV;
  d->make_fatal();
  return 0;
}

int EmuProvider::qp_force_error(ibv_qp* qp) {
  Qp::from(qp)->force_error(true);
  return 0;
}

int EmuProvider::raise_async_event(ibv_context* context, const ibv_async_event& ev) {
  Context* ctx = Context::from(context);
  switch (event_element(ev.event_type)) {
    case EventElement::port:
      if (ev.element.port_num != 1) return EINVAL;  // one port
      ctx->device().post_device_event(ev.event_type, 1);
      return 0;
    case EventElement::device:
      ctx->device().post_device_event(ev.event_type, 0);
      return 0;
    case EventElement::wq:
      return EINVAL;  // emulated devices have no work queue objects
    default:
      ctx->post_async_event(ev);
      return 0;
  }
}

int EmuProvider::read_sysfs_attr(const char* dir, const char* file, std::string* value) {
  for (Device* dev : DeviceRegistry::instance().devices()) {
    const std::string base = dev->ibv()->ibdev_path;
    if (std::strcmp(dir, base.c_str()) == 0) {
      // "ports/1/counters/NAME" asked of the device directory: the live counter.
      const std::string f = file;
      if (f.starts_with("ports/1/") && counter_file_text(*dev, f.substr(8), value)) return 0;
      return dev->sysfs_attr(file, value) ? 0 : ENOENT;
    }
    // The port's counter directories: the counters now, never a file's snapshot.
    const std::string port = base + "/ports/1/";
    if (std::strncmp(dir, port.c_str(), port.size()) == 0) {
      const std::string rel = std::string(dir + port.size()) + "/" + file;
      if (counter_file_text(*dev, rel, value)) return 0;
    }
  }
  return ENODEV;
}

}  // namespace softverbs::emu

softverbs::Provider& softverbs::emu_provider() { return emu::EmuProvider::instance(); }
