// The emulator's connection manager: rdma_cm over the emulated devices
// (docs/rdma-cm.md). Address resolution maps IP addresses to the devices that
// own them (emu/cm/addr.cpp); connections are made with IB CM MADs
// (wire/cm_mad.hpp) sent to QP1 over each device's link (emu/cm/protocol.cpp);
// this file's class is the rdma_cm API on top (emu/cm/cm.cpp, emu/cm/qp.cpp).
//
// One lock (mu_) guards every CM object. It is taken by API calls, by MADs
// arriving on a device's receive path and by the CM's timers (on the
// scheduler's thread); nothing that blocks runs under it: a call that waits
// for an event (a synchronous id, rdma_get_cm_event) waits on the channel's
// file descriptor with the lock released.
#pragma once

#include <atomic>
#include <mutex>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "core/cm_provider.hpp"
#include "emu/cm/state.hpp"
#include "emu/device/gsi.hpp"

namespace softverbs::emu {

class EmuCm final : public CmProvider, public GsiAgent {
 public:
  static EmuCm& instance();
  const char* name() const noexcept override { return "emu"; }

  // ---- CmProvider (core/cm_provider.hpp) -----------------------------------
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

  // ---- GsiAgent (emu/device/gsi.hpp) ---------------------------------------
  void receive_gsi(Device& device, in_addr src, const wire::PacketView& packet) override;
  void device_failed(Device& device) override;
  void link_failed_over(Device& device) override;
  bool reject_gsi(Device& device, in_addr src, const wire::PacketView& packet, uint16_t reason) override;

  // What the CM counted (tests and diagnostics).
  struct Stats {
    std::atomic<uint64_t> tx{0}, retransmitted{0}, rx{0}, rx_dropped{0}, rx_unmatched{0}, rx_duplicates{0};
  };
  const Stats& stats() const { return stats_; }

 private:
  EmuCm() = default;
  using Lock = std::unique_lock<std::mutex>;

  // ---- objects (cm.cpp) ----
  cm::Id* find_id(rdma_cm_id* id);  // null for a pointer this CM never made (or destroyed)
  cm::Channel* new_channel();
  void free_channel(cm::Channel* ch);
  cm::Id* new_id(cm::Channel* ch, bool sync, void* context, rdma_port_space ps, ibv_qp_type qp_type);
  void free_id(Lock& lock, cm::Id* id);
  cm::Event* new_event(cm::Id* id, rdma_cm_event_type type, int status);
  void post_event(cm::Event* ev);
  // The wait of a synchronous id for the event its call caused (librdmacm's
  // ucma_complete): 0, or -1 with errno from the event's status.
  int complete(cm::Id* id);
  // Acknowledges the event a synchronous id holds in pub.event (under the lock).
  void ack_held_event(cm::Id* id);
  // Sends the SIDR_REP that answers the connection's SIDR_REQ.
  void send_sidr_rep(cm::Conn& c, wire::cm::SidrStatus status, uint32_t qpn, const void* data, size_t len);
  // Discards the id's events not yet taken; returns the ids of connection
  // requests so discarded (they go with their listener).
  std::vector<cm::Id*> drop_queued_events(cm::Id* id);

  // ---- multicast (multicast.cpp) ----
  // What librdmacm does when the application takes a MULTICAST_JOIN event
  // (ucma_process_join): attach the id's QP to the group.
  void process_join(cm::Event* ev);
  // The joins of ids on a failed device end with MULTICAST_ERROR.
  void fail_joins(Device& dev);

  // ---- devices and addresses (addr.cpp) ----
  void ensure_devices();
  cm::CmDevice* cm_device(Device* dev);
  int attach_device(cm::Id* id, cm::CmDevice* dev);
  cm::CmDevice* device_for_local(const sockaddr* addr);  // the device owning addr, if any
  cm::CmDevice* device_owning(in_addr addr);
  int bind_locked(cm::Id* id, const sockaddr* addr);
  bool port_in_use(const cm::Id* id, const sockaddr* addr, uint16_t port) const;
  uint16_t ephemeral_port(const cm::Id* id, const sockaddr* addr);
  void resolve_addr_step(uint64_t generation, cm::Id* id, Clock::time_point deadline);
  void fill_route(cm::Id* id);
  cm::Id* find_listener(cm::CmDevice* dev, uint16_t ps, uint16_t port, const sockaddr* dst);

  // ---- the QP an id drives (qp.cpp) ----
  int modify_qp(cm::Id* id, ibv_qp_attr* attr, int mask);
  int qp_attr_for(cm::Id* id, ibv_qp_state state, ibv_qp_attr* attr, int* mask);
  // ECE of an id with a QP, as librdmacm 44 (init_ece, set_local_ece,
  // ucma_process_conn_resp_ece): the QP's options are what the REQ or REP carries.
  void init_ece(cm::Id* id, ibv_qp* qp);
  void settle_local_ece(cm::Id* id);
  // An active side's QP given the REP's ECE: 0, or EINVAL when the REP names
  // another vendor than the REQ offered.
  int apply_rep_ece(cm::Id* id, uint32_t vendor, uint32_t options);
  int move_qp_to_rtr(cm::Id* id, uint8_t resp_res);
  int move_qp_to_rts(cm::Id* id, uint8_t init_depth);
  void move_qp_to_err(cm::Id* id);
  ibv_ah_attr ah_to_peer(cm::Id* id) const;
  // The device's XRC domain for its XRC ids, opened on first use (null and
  // errno if it cannot be).
  ibv_xrcd* xrcd_of(cm::CmDevice& dev);

  // ---- the IB CM protocol (protocol.cpp, connect.cpp) ----
  static uint8_t response_timeout();  // SOFTVERBS_CM_RESPONSE_TIMEOUT
  static int max_retries();           // SOFTVERBS_CM_MAX_RETRIES
  static Clock::duration retry_interval();
  void cancel_retry(cm::Conn& c);
  std::shared_ptr<cm::Conn> conn_for(in_addr src, uint32_t local_comm_id, uint32_t remote_comm_id);
  void fill_conn_param(cm::Event* ev, uint8_t responder_resources, uint8_t initiator_depth, const cm::Conn& c);
  bool next_candidate(cm::Id* id);
  int check_param(cm::Id* id, const rdma_conn_param* param);
  void send_rtu(cm::Conn& c);
  cm::Id* child_of(cm::Id* listener, Device& dev, in_addr src, const wire::cm::CmaHeader* h, uint16_t port);
  int reject_with(rdma_cm_id* id, const void* private_data, uint8_t len, wire::cm::RejReason reason);
  uint32_t next_comm_id() { return comm_id_seq_++; }
  uint32_t random_psn() { return static_cast<uint32_t>(rng_()) & 0xFFFFFF; }
  std::shared_ptr<cm::Conn> new_conn(cm::Id* id, Device* dev, in_addr peer);
  void send_mad(cm::Conn& c, const wire::cm::MadHeader& hdr, const wire::cm::Message& msg, bool expect_reply);
  void send_mad_to(Device& dev, in_addr peer, const wire::cm::MadHeader& hdr, const wire::cm::Message& msg);
  void arm_retry(const std::shared_ptr<cm::Conn>& c);
  void on_retry_timer(const std::weak_ptr<cm::Conn>& wc, uint64_t generation);
  void enter_timewait(const std::shared_ptr<cm::Conn>& c);
  void end_conn(cm::Conn& c);
  int send_req(cm::Id* id, const rdma_conn_param* param);
  int send_sidr_req(cm::Id* id, const rdma_conn_param* param);
  int send_rep(cm::Id* id, const rdma_conn_param* param);
  void send_rej_for(Device& dev, in_addr peer, uint64_t tid, uint32_t remote_comm_id, uint32_t local_comm_id,
                    wire::cm::MsgKind kind, wire::cm::RejReason reason, const void* data, uint8_t len);
  void send_dreq(const std::shared_ptr<cm::Conn>& c);
  void send_drep(cm::Conn& c);
  bool backlog_full(const cm::Id* listener);  // counts the drop when it is
  static bool path_fits_port(const Device& dev, const wire::cm::ReqPath& path);
  void on_req(Device& dev, in_addr src, const wire::cm::MadHeader& hdr, const wire::cm::Req& req);
  void on_mra(in_addr src, const wire::cm::Mra& mra);
  void on_rej(in_addr src, const wire::cm::Rej& rej);
  void on_rep(in_addr src, const wire::cm::MadHeader& hdr, const wire::cm::Rep& rep);
  void on_rtu(in_addr src, const wire::cm::Rtu& rtu);
  void on_dreq(Device& dev, in_addr src, const wire::cm::MadHeader& hdr, const wire::cm::Dreq& dreq);
  void on_drep(in_addr src, const wire::cm::Drep& drep);
  void on_sidr_req(Device& dev, in_addr src, const wire::cm::MadHeader& hdr, const wire::cm::SidrReq& req);
  void on_sidr_rep(in_addr src, const wire::cm::SidrRep& rep);
  std::shared_ptr<cm::Conn> conn_by_local(uint32_t local_comm_id);
  void established(cm::Id* id);
  void connection_failed(cm::Id* id, rdma_cm_event_type type, int status, const void* data, size_t len);

  std::mutex mu_;
  std::once_flag devices_once_;
  std::vector<std::unique_ptr<cm::CmDevice>> devices_;
  std::unordered_set<cm::Channel*> channels_;
  std::unordered_map<rdma_cm_id*, cm::Id*> ids_;
  std::unordered_set<cm::Event*> events_;
  std::unordered_map<uint32_t, std::shared_ptr<cm::Conn>> conns_;  // by local comm ID
  std::condition_variable acked_;  // an event was acknowledged
  std::mt19937 rng_{std::random_device{}()};
  Stats stats_;
  uint32_t gmp_psn_ = 0;
  uint32_t comm_id_seq_ = std::random_device{}();
};

}  // namespace softverbs::emu
