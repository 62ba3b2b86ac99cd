// The counter files of a device (sysfs_counters.hpp): the engine's counters in
// the shape of sysfs.hpp's CounterValues, and the periodic rewrite of a view's
// files. The rewrite runs on the progress thread and never blocks the data path:
// it only reads atomic counters.
#include "emu/device/sysfs_counters.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <utility>

#include "core/env.hpp"
#include "core/log.hpp"
#include "emu/device/identity.hpp"
#include "emu/objects/objects.hpp"

namespace softverbs::emu {
namespace {

// One device of a view: its ports/1 directory and the text last written to
// each of its counter files.
struct ViewPort {
  Device* dev;
  std::string dir;
  std::map<std::string, std::string> written;
};

std::string sysfs_root() {
  // ibv_get_sysfs_path()'s rule: SYSFS_PATH (ignored in setuid programs), else /sys.
  const char* env = env::sysfs_path();
  std::string root = env ? env : "/sys";
  while (!root.empty() && root.back() == '/') root.pop_back();
  return root;
}

// The view describes this very device: same name (the path), same node GUID
// (derived from the address, so another process's device of the same name
// differs), and a counter directory this process may write.
bool view_describes(Device& dev, const std::string& dev_dir) {
  std::ifstream in(dev_dir + "/node_guid");
  std::string guid, own;
  if (!std::getline(in, guid) || !sysfs_attr_of(dev.name(), dev.addr(), "node_guid", &own) || guid != own)
    return false;
  return ::access((dev_dir + "/ports/1/hw_counters/lifespan").c_str(), W_OK) == 0;
}

// Counters only grow, so a file's new text is never shorter than its old one:
// writing it over the old text from offset 0 leaves no stale tail, and a reader
// never finds the file empty (as it could between a truncation and a write).
void write_counter(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  const std::string line = text + "\n";
  if (::pwrite(fd, line.data(), line.size(), 0) < 0) SV_LOG(kDebug, "counter file %s not written", path.c_str());
  ::close(fd);
}

void refresh(ViewPort& port) {
  for (const auto& [rel, text] : counter_files(counter_values(*port.dev))) {
    std::string& last = port.written[rel];
    if (last == text) continue;
    write_counter(port.dir + "/" + rel, text);
    last = text;
  }
}

// The view's devices of this process. Never destroyed: the progress thread may
// be refreshing while the process exits.
struct ViewPorts {
  std::mutex mu;  // the progress thread's refresh, and the last one at exit
  std::vector<ViewPort> ports;
  void refresh_all() {
    std::lock_guard lock(mu);
    for (ViewPort& p : ports) refresh(p);
  }
};
ViewPorts* g_view = nullptr;

// Re-arms itself for as long as the process runs (devices live until exit).
void schedule(Scheduler& scheduler) {
  scheduler.after(std::chrono::milliseconds(kCounterRefreshMs), [&scheduler] {
    g_view->refresh_all();
    schedule(scheduler);
  });
}

// The last values stay in the view after the process is gone (its children
// and its shell read them then).
void refresh_at_exit() { g_view->refresh_all(); }

}  // namespace

CounterValues counter_values(Device& dev) {
  const Device::Counters& c = dev.counters();
  auto get = [](const ShardedCounter& a) { return a.load(std::memory_order_relaxed); };
  CounterValues v;
  v.tx_bytes = get(c.tx_bytes);
  v.rx_bytes = get(c.rx_bytes);
  v.tx_packets = get(c.tx_packets);
  // What the port received: rx_packets counts every datagram the device took
  // off its link, before its checks.
  v.rx_packets = c.rx_packets();
  v.tx_multicast = get(c.tx_multicast);
  v.rx_multicast = get(c.rx_multicast);
  v.rx_errors = get(c.rx_icrc_errors) + get(c.rx_malformed);
  v.tx_discards = get(c.host_drops);
  v.link_downed = get(c.link_downed);
  v.dup_requests = get(c.dup_requests);
  v.out_of_seq_requests = get(c.out_of_seq_requests);
  v.rnr_naks_received = get(c.rnr_naks_received);
  v.rnr_naks_sent = get(c.rnr_naks_sent);
  v.seq_naks_received = get(c.seq_naks_received);
  v.retry_exceeded = get(c.retry_exceeded);
  v.rnr_retry_exceeded = get(c.rnr_retry_exceeded);
  v.retransmits = get(c.retransmits);
  v.sends_completed = get(c.sends_completed);
  v.recvs_completed = get(c.recvs_completed);
  return v;
}

bool counter_file_text(Device& dev, const std::string& rel, std::string* text) {
  if (!rel.starts_with("counters/") && !rel.starts_with("hw_counters/")) return false;
  for (auto& [name, value] : counter_files(counter_values(dev))) {
    if (name != rel) continue;
    *text = std::move(value);
    return true;
  }
  return false;
}

void refresh_view_counters(const std::vector<Device*>& devices, Scheduler& scheduler) {
  const std::string root = sysfs_root() + "/class/infiniband/";
  std::vector<ViewPort> ports;
  for (Device* dev : devices) {
    const std::string dev_dir = root + dev->name();
    if (!view_describes(*dev, dev_dir)) continue;
    SV_LOG(kDebug, "device %s: counters in %s/ports/1 kept current", dev->name().c_str(), dev_dir.c_str());
    ports.push_back(ViewPort{dev, dev_dir + "/ports/1", {}});
  }
  if (ports.empty() || g_view) return;
  g_view = new ViewPorts;
  g_view->ports = std::move(ports);
  std::atexit(refresh_at_exit);
  schedule(scheduler);
}

}  // namespace softverbs::emu
