// libibverbs.so.1's side of the private link to librdmacm.so.1:
// softverbs_private_cm_providers (node SOFTVERBS_PRIVATE_0.1) hands out the
// process's CM providers (cm_providers(), abi/common/cm_registry.cpp), each
// behind a barrier that catches exceptions here.
//
// Why a private export and not a copy: the CM providers share the process's
// devices and verbs objects with the verbs providers (an id's contexts, PDs and
// QPs belong to the Provider that listed its device), so there must be one of
// each per process, the one inside this library. librdmacm.so.1 links against
// us (DT_NEEDED libibverbs.so.1, as rdma-core's does) and reaches them through
// this single function.
//
// Why the barrier: both libraries link their own copy of the C++ runtime
// (-static-libstdc++), so an exception must never unwind from one into the
// other. Every method of the wrapper catches in this library and returns the
// failure of the rdma_cm function it stands for (abi::guarded's errno).
#include <memory>
#include <vector>

#include "abi/common/export.hpp"
#include "core/cm_provider.hpp"

namespace softverbs::abi {
namespace {

// Runs a void method, dropping an exception (the rdma_cm function has no way
// to report one).
template <class Fn>
void guarded_void(Fn&& fn) noexcept {
  try {
    fn();
  } catch (...) {
  }
}

class GuardedCm final : public CmProvider {
 public:
  explicit GuardedCm(CmProvider& inner) : in_(inner) {}

  const char* name() const noexcept override { return in_.name(); }

  rdma_event_channel* create_event_channel() override {
    return guarded(static_cast<rdma_event_channel*>(nullptr), [&] { return in_.create_event_channel(); });
  }
  void destroy_event_channel(rdma_event_channel* c) override {
    guarded_void([&] { in_.destroy_event_channel(c); });
  }
  int get_cm_event(rdma_event_channel* c, rdma_cm_event** e) override {
    return guarded(-1, [&] { return in_.get_cm_event(c, e); });
  }
  int ack_cm_event(rdma_cm_event* e) override {
    return guarded(-1, [&] { return in_.ack_cm_event(e); });
  }
  int create_id(rdma_event_channel* c, rdma_cm_id** id, void* ctx, rdma_port_space ps) override {
    return guarded(-1, [&] { return in_.create_id(c, id, ctx, ps); });
  }
  int destroy_id(rdma_cm_id* id) override {
    return guarded(-1, [&] { return in_.destroy_id(id); });
  }
  int create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* attr) override {
    return guarded(-1, [&] { return in_.create_ep(id, res, pd, attr); });
  }
  void destroy_ep(rdma_cm_id* id) override {
    guarded_void([&] { in_.destroy_ep(id); });
  }
  int migrate_id(rdma_cm_id* id, rdma_event_channel* c) override {
    return guarded(-1, [&] { return in_.migrate_id(id, c); });
  }
  int set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) override {
    return guarded(-1, [&] { return in_.set_option(id, level, optname, optval, optlen); });
  }
  int bind_addr(rdma_cm_id* id, sockaddr* addr) override {
    return guarded(-1, [&] { return in_.bind_addr(id, addr); });
  }
  int resolve_addr(rdma_cm_id* id, sockaddr* src, sockaddr* dst, int timeout_ms) override {
    return guarded(-1, [&] { return in_.resolve_addr(id, src, dst, timeout_ms); });
  }
  int resolve_route(rdma_cm_id* id, int timeout_ms) override {
    return guarded(-1, [&] { return in_.resolve_route(id, timeout_ms); });
  }
  int getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo** res) override {
    return guarded(-1, [&] { return in_.getaddrinfo(node, service, hints, res); });
  }
  void freeaddrinfo(rdma_addrinfo* res) override {
    guarded_void([&] { in_.freeaddrinfo(res); });
  }
  int listen(rdma_cm_id* id, int backlog) override {
    return guarded(-1, [&] { return in_.listen(id, backlog); });
  }
  int get_request(rdma_cm_id* listen, rdma_cm_id** id) override {
    return guarded(-1, [&] { return in_.get_request(listen, id); });
  }
  int connect(rdma_cm_id* id, rdma_conn_param* param) override {
    return guarded(-1, [&] { return in_.connect(id, param); });
  }
  int accept(rdma_cm_id* id, rdma_conn_param* param) override {
    return guarded(-1, [&] { return in_.accept(id, param); });
  }
  int reject(rdma_cm_id* id, const void* data, uint8_t len) override {
    return guarded(-1, [&] { return in_.reject(id, data, len); });
  }
  int reject_ece(rdma_cm_id* id, const void* data, uint8_t len) override {
    return guarded(-1, [&] { return in_.reject_ece(id, data, len); });
  }
  int establish(rdma_cm_id* id) override {
    return guarded(-1, [&] { return in_.establish(id); });
  }
  int notify(rdma_cm_id* id, ibv_event_type event) override {
    return guarded(-1, [&] { return in_.notify(id, event); });
  }
  int disconnect(rdma_cm_id* id) override {
    return guarded(-1, [&] { return in_.disconnect(id); });
  }
  int set_local_ece(rdma_cm_id* id, ibv_ece* ece) override {
    return guarded(-1, [&] { return in_.set_local_ece(id, ece); });
  }
  int get_remote_ece(rdma_cm_id* id, ibv_ece* ece) override {
    return guarded(-1, [&] { return in_.get_remote_ece(id, ece); });
  }
  int init_qp_attr(rdma_cm_id* id, ibv_qp_attr* attr, int* mask) override {
    return guarded(-1, [&] { return in_.init_qp_attr(id, attr, mask); });
  }
  int create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) override {
    return guarded(-1, [&] { return in_.create_qp_ex(id, attr); });
  }
  void destroy_qp(rdma_cm_id* id) override {
    guarded_void([&] { in_.destroy_qp(id); });
  }
  int create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) override {
    return guarded(-1, [&] { return in_.create_srq_ex(id, attr); });
  }
  void destroy_srq(rdma_cm_id* id) override {
    guarded_void([&] { in_.destroy_srq(id); });
  }
  int join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* attr, void* ctx) override {
    return guarded(-1, [&] { return in_.join_multicast_ex(id, attr, ctx); });
  }
  int leave_multicast(rdma_cm_id* id, sockaddr* addr) override {
    return guarded(-1, [&] { return in_.leave_multicast(id, addr); });
  }
  ibv_context** get_devices(int* num) override {
    return guarded(static_cast<ibv_context**>(nullptr), [&] { return in_.get_devices(num); });
  }
  void free_devices(ibv_context** list) override {
    guarded_void([&] { in_.free_devices(list); });
  }

 private:
  CmProvider& in_;
};

}  // namespace
}  // namespace softverbs::abi

SV_EXPORT softverbs::CmProvider* const* softverbs_private_cm_providers(unsigned interface, size_t* count) {
  if (count) *count = 0;
  if (interface != softverbs::kCmProviderInterface) {
    SV_LOG(kError, "librdmacm.so.1 speaks CM interface %u, this libibverbs.so.1 %u: they come from different builds; "
           "no RDMA CM", interface, softverbs::kCmProviderInterface);
    return nullptr;
  }
  using List = softverbs::CmProvider* const*;
  return softverbs::abi::guarded(static_cast<List>(nullptr), [&]() -> List {
    // Built once and never freed: librdmacm.so.1 may call through them until
    // exit. NULL-terminated, so the answer for no provider is not NULL.
    // The vector itself is kept (not only its data), so leak checkers see
    // the array reachable until exit.
    static const std::vector<softverbs::CmProvider*>* const providers = [] {
      auto* out = new std::vector<softverbs::CmProvider*>;
      for (softverbs::CmProvider* cm : softverbs::cm_providers()) out->push_back(new softverbs::abi::GuardedCm(*cm));
      out->push_back(nullptr);
      return out;
    }();
    const List list = providers->data();
    size_t n = 0;
    while (list[n]) ++n;
    if (count) *count = n;
    return list;
  });
}
