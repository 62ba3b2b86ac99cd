// The hw CM provider: rdma_cm on the machine's real devices, through rdma-core's
// own librdmacm.so.1 loaded into the link namespace of the real libibverbs
// (hw/namespace.hpp), so that the real librdmacm drives the real libibverbs.
//
// Every method forwards to the real exported function of the same name and
// convention (hw/cm_symbols.hpp): the application gets librdmacm's behaviour,
// objects and errno unchanged. The verbs objects hung on its ids (id->verbs,
// id->pd, id->qp, the CQs) are the real library's, owned by the hw verbs
// Provider: their devices are the ones it lists.
#pragma once

#include <string>

#include "core/cm_provider.hpp"
#include "hw/cm_symbols.hpp"

namespace softverbs::hw {

class Namespace;

class HwCmProvider final : public CmProvider {
 public:
  // The provider, or NULL when the real librdmacm cannot be used (the reason is
  // logged once). The first call loads it; later calls return the same answer.
  static HwCmProvider* get();

  const char* name() const noexcept override { return "hw"; }
  const std::string& path() const noexcept { return path_; }
  void* handle() const noexcept { return handle_; }  // the real librdmacm.so.1

  rdma_event_channel* create_event_channel() override;
  void destroy_event_channel(rdma_event_channel* channel) override;
  int get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) override;
  int ack_cm_event(rdma_cm_event* event) override;
  int create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) override;
  int destroy_id(rdma_cm_id* id) override;
  int create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) override;
  void destroy_ep(rdma_cm_id* id) override;
  int migrate_id(rdma_cm_id* id, rdma_event_channel* channel) override;
  int set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) override;
  int bind_addr(rdma_cm_id* id, sockaddr* addr) override;
  int resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr, int timeout_ms) override;
  int resolve_route(rdma_cm_id* id, int timeout_ms) override;
  int getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo** res) override;
  void freeaddrinfo(rdma_addrinfo* res) override;
  int listen(rdma_cm_id* id, int backlog) override;
  int get_request(rdma_cm_id* listen, rdma_cm_id** id) override;
  int connect(rdma_cm_id* id, rdma_conn_param* conn_param) override;
  int accept(rdma_cm_id* id, rdma_conn_param* conn_param) override;
  int reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) override;
  int reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) override;
  int establish(rdma_cm_id* id) override;
  int notify(rdma_cm_id* id, ibv_event_type event) override;
  int disconnect(rdma_cm_id* id) override;
  int set_local_ece(rdma_cm_id* id, ibv_ece* ece) override;
  int get_remote_ece(rdma_cm_id* id, ibv_ece* ece) override;
  int init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) override;
  int create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* qp_init_attr) override;
  void destroy_qp(rdma_cm_id* id) override;
  int create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) override;
  void destroy_srq(rdma_cm_id* id) override;
  int join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* mc_join_attr, void* context) override;
  int leave_multicast(rdma_cm_id* id, sockaddr* addr) override;
  ibv_context** get_devices(int* num_devices) override;
  void free_devices(ibv_context** list) override;

 private:
  HwCmProvider(Namespace& ns, std::string path, void* handle) : ns_(ns), path_(std::move(path)), handle_(handle) {}
  bool resolve(std::string* why);

  // Forwards one call into the namespace (errno and environment bridged); an
  // optional function the real library lacks fails as librdmacm does for an
  // operation it cannot do.
  template <class R, class... P, class... A>
  R forward(R (*fn)(P...), A... args);

  Namespace& ns_;
  std::string path_;
  void* handle_;
  RealCmFunctions fn_;
};

}  // namespace softverbs::hw
