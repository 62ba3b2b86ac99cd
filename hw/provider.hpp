// The hw provider: the machine's real RDMA devices, through rdma-core's own
// libibverbs loaded into a private link namespace (hw/namespace.hpp).
//
// Every verb forwards to the real exported function of the same name and
// convention (Forwarder, hw/forward.hpp, generated from core/verbs.def), so the
// application gets rdma-core's behaviour, objects and error codes unchanged.
// The objects it returns are the real ones: the inline data path
// (ibv_post_send, ibv_poll_cq, the ibv_wr_* and ibv_cq_ex readers) jumps
// straight into the real provider library with no softverbs code in between.
// The verbs below need more than the call: the device list, the fault layer's
// hooks on contexts and async events, and fallbacks for older libraries.
#pragma once

#include <mutex>
#include <vector>

#include "hw/forward.hpp"

namespace softverbs::hw {

class HwProvider final : public Forwarder {
 public:
  static HwProvider& instance();
  const char* name() const noexcept override { return "hw"; }

  std::vector<ibv_device*> get_devices() override;
  void release_devices(const std::vector<ibv_device*>& devices) override;
  ibv_context* open_device(ibv_device* device) override;
  ibv_context* import_device(int cmd_fd) override;
  int close_device(ibv_context* context) override;
  int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_len) override;
  int get_async_event(ibv_context* context, ibv_async_event* event) override;
  void ack_async_event(ibv_async_event* event) override;
  ibv_mr* reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) override;
  int fork_init() override;
  int read_sysfs_attr(const char* dir, const char* file, std::string* value) override;

 private:
  HwProvider() = default;

  // Each get_devices() is one real ibv_get_device_list: the real array (from the
  // namespace's allocator) is kept and handed back to the real
  // ibv_free_device_list when the same devices are released. Identical lists
  // share one array and a count, so a caller that never releases (the ABI
  // layer's ownership probe) costs a counter, not an array per call.
  struct HeldList {
    ibv_device** array;
    std::vector<ibv_device*> devices;
    size_t refs;
  };
  std::mutex lists_mu_;
  std::vector<HeldList> lists_;
  std::once_flag logged_devices_;

  // The control API: what can be done from above a real provider.
  int qp_force_error(ibv_qp* qp) override;
  int raise_async_event(ibv_context* context, const ibv_async_event& event) override;
};

}  // namespace softverbs::hw
