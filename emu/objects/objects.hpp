// The emulated device and the verbs objects it owns (the QP, with its transport
// engine, is in emu/qp/qp.hpp).
//
// Every object follows the same shape as in the verbs spec: validate the
// attributes, allocate, initialise from the attributes. Each keeps its public
// rdma-core struct in a Handle (handle.hpp) and is found again from it.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/types.h>

#include <cerrno>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "emu/device/config.hpp"
#include "emu/device/gsi.hpp"
#include "emu/device/object_table.hpp"
#include "emu/objects/handle.hpp"
#include "emu/objects/queue_buffer.hpp"
#include "emu/qp/wq.hpp"
#include "core/clock.hpp"
#include "core/rdma_private.h"
#include "core/spread_shared_mutex.hpp"
#include "fabric/link.hpp"
#include "fabric/local_link.hpp"
#include "fabric/mcast_directory.hpp"
#include "faults/filter.hpp"
#include "wire/icrc.hpp"
#include "wire/packet.hpp"

namespace softverbs::fabric {
class EngineTimer;
class RealTimeScheduler;
}

namespace softverbs::emu {

// Returns NULL with errno set: the convention of every pointer-returning verb.
template <class T>
T* fail(int err) {
  errno = err;
  return nullptr;
}

using fabric::EngineTimer;
class Context;
class Pd;
class Mr;
class Mw;
class Dm;
class Cq;
class Srq;
class Xrcd;
class Qp;
class Charge;

// ---------------------------------------------------------------------------
// Device: one per configured emulated device, alive for the whole process.
class Device;
// The peer address an address vector names (its IPv4-mapped GID, an emulated IB
// GID, or its LID); false for a destination emulated devices cannot reach.
bool resolve_av(const Device& dev, const ibv_ah_attr& av, in_addr* out);

// The device's receive path is the sink of its link (fabric/link.hpp): the
// link hands it datagrams, the fault layer sitting between its checks and the
// delivery to a QP.
class Device final : private fabric::PacketSink {
 public:
  // Time and timers come from clock and scheduler (core/clock.hpp); packets go
  // through the link given to connect(). `packets` and `verbs` are the fault
  // rules this device's packets and verbs pass (docs/faults.md); they outlive
  // the device.
  Device(const DeviceConfig& config, int index, in_addr addr, const Clock& clock, Scheduler& scheduler,
         faults::PacketFilter& packets, faults::VerbFilter& verbs);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  ibv_device* ibv() { return &handle_.pub.device; }
  static Device* from(ibv_device* dev) { return Handle<verbs_device, Device>::owner_of(dev); }

  const std::string& name() const { return config_.name; }
  int index() const { return index_; }
  in_addr addr() const { return addr_; }
  LinkLayer link_layer() const { return config_.link_layer; }
  ibv_mtu active_mtu() const { return config_.active_mtu; }
  uint16_t lid() const { return lid_; }
  uint64_t guid() const { return guid_; }  // host order
  __be64 guid_be() const;
  const uint8_t* mac() const { return mac_; }
  const Clock& clock() const { return clock_; }
  Scheduler& scheduler() { return scheduler_; }
  // Makes link the device's way to the network (once, before any traffic).
  void connect(fabric::Link& link);

  void fill_device_attr(ibv_device_attr* attr) const;
  void fill_port_attr(ibv_port_attr* attr) const;
  // GID table of port 1. Returns false for an empty slot.
  bool gid_entry(uint32_t index, ibv_gid_entry* entry) const;
  int gid_count() const;
  uint16_t pkey_tbl_len() const;

  // Synthetic sysfs attributes (ibv_read_sysfs_file on ibdev_path).
  bool sysfs_attr(const std::string& attr, std::string* value) const;

  // ---- object counts (the device attributes' max_pd, max_qp, ...) ----------
  // Counts one more object of that type against the device's limit
  // (limit_of): an empty Charge when the limit is reached, which the verb
  // turns into ENOMEM, as the kernel does when a ConnectX runs out of them.
  // The count is given back when the Charge (kept in the object) is destroyed.
  Charge charge(ObjectType type);
  void discharge(ObjectType type) noexcept;
  // The limit of a type (caps.hpp), INT_MAX for the types with none.
  static int limit_of(ObjectType type) noexcept;

  // QP numbers and memory keys are per device: a peer addresses them on the wire.
  // register_qp and register_mr may throw std::bad_alloc (nothing is registered then).
  // Lookups take no lock (emu/device/object_table.hpp). unregister_qp returns
  // once no thread uses the QP: none holds a pin of it (pin_qp), and none
  // hands it a packet under the receive lock.
  uint32_t register_qp(Qp* qp);
  void unregister_qp(uint32_t qpn);
  // The QP of that number; it stays alive only as long as something else
  // ensures it (the receive lock, as on the packet path, or a pin).
  Qp* find_qp(uint32_t qpn);
  // The QP of that number, kept alive while the pin lives.
  QpPin pin_qp(uint32_t qpn) const { return QpPin(qp_table_, qpn); }
  uint32_t register_mr(Mr* mr);
  // Callers hold mr_lock() (shared) while they use the region's memory, so a
  // concurrent deregistration waits for the access to finish.
  Mr* find_mr_locked(uint32_t key);
  // Shared per packet by every QP of the device (core/spread_shared_mutex.hpp).
  SpreadSharedMutex& mr_lock() { return mr_mu_; }
  // Memory windows share the 24-bit key index space with the regions, so one
  // rkey names at most one of them; a window is found by its index alone (its
  // key byte changes with every bind). register_mw returns the index (max_mw is
  // counted by the window's Charge) and may throw std::bad_alloc, with nothing
  // registered. Lookups hold mr_lock(), changes of a window's binding hold it
  // exclusively.
  uint32_t register_mw(Mw* mw);
  void unregister_mw(uint32_t index);
  Mw* find_mw_locked(uint32_t rkey);
  // Deregisters a region unless windows are bound to it: 0, or EINVAL (as rxe,
  // IBTA 10.6.7.2.6).
  int deregister_mr(Mr* mr);

  // ---- device memory (emu/objects/dm.cpp) -----------------------------------
  // Carves size bytes (a multiple of caps::kDmUnit) aligned to 1 << log_align
  // out of the device's caps::kMaxDmSize bytes, first fit: the offset, or
  // UINT64_MAX when no such free range is left.
  uint64_t alloc_dm_range(uint64_t size, uint32_t log_align);
  void free_dm_range(uint64_t offset);
  // The device memory itself (caps::kMaxDmSize bytes, alive with the device).
  uint8_t* dm_memory();

  // ---- the RoCEv2 endpoint ----------------------------------------------
  // tx/rx packets, ICRC errors and what the packet-fault layer did are the
  // link's (fabric::LinkCounters).
  struct Counters : fabric::LinkCounters {
    ShardedCounter rx_malformed, rx_unknown_qp, rx_dropped;
    ShardedCounter retransmits, naks_sent, naks_received, rnr_naks_sent, rnr_naks_received,
        duplicates, timeouts;
    // Packets lost because the port was down; verb-level faults carried out.
    ShardedCounter port_down_drops, faults_verbs;
    // For the port and hw counters of the sysfs view (sysfs.hpp, CounterValues):
    // received datagram bytes and multicast packets (admit), requests the
    // responder found duplicated or out of sequence, sequence NAKs the
    // completer received, completions by outcome, and the port going down.
    ShardedCounter rx_bytes, rx_multicast, dup_requests, out_of_seq_requests,
        seq_naks_received, retry_exceeded, rnr_retry_exceeded, sends_completed, recvs_completed,
        link_downed;
    ShardedCounter rx_direct;  // packets handed over without bytes (fabric::Link::send_direct)
    // Every packet received: a sum, so that a direct packet costs one locked add fewer.
    uint64_t rx_packets() const noexcept { return rx_datagrams.load() + rx_direct.load(); }
  };
  Counters& counters() { return counters_; }

  // The ICRC flow of packets this device sends to dst (and receives from it).
  wire::Ipv4Flow flow(in_addr src, in_addr dst) const;
  // Sends one packet (BTH..ICRC) through the link (a device of this process
  // gets it through its local queue, with the same packet semantics), with
  // IPv4 TOS byte tos: the traffic class of the QP's path or address handle.
  // icrc false: the packet's ICRC was left uncomputed, as needs_icrc(dst) allowed.
  void transmit(in_addr dst, std::span<const uint8_t> packet, uint8_t tos = 0, bool icrc = true);
  // Whether a packet to dst must carry its ICRC (fabric::Link::needs_icrc):
  // false for a device of this process with no capture on this side.
  bool needs_icrc(in_addr dst) { return link_->needs_icrc(dst); }
  // The in-process fast path (fabric::Link::direct_ok, send_direct): whether a
  // packet to dst may go without bytes, and handing it over so. transmit_direct
  // is false when it did not go (port down, receiver busy or behind): the
  // caller then builds the packet and transmit()s it.
  bool direct_ok(in_addr dst) { return link_->direct_ok(dst); }
  bool transmit_direct(in_addr dst, const wire::PacketView& view) {
    return port_active() && link_->send_direct(dst, view);
  }
  // A packet in pieces, without its ICRC (fabric::Link::send_gathered: its
  // payload straight from registered memory into a same-host ring): false
  // when it did not go (port down, a layer needs the whole packet, no such
  // ring): the caller then builds the packet and transmit()s it.
  bool transmit_gathered(in_addr dst, const wire::GatheredPacket& packet, uint8_t tos) {
    return port_active() && link_->send_gathered(dst, packet, tos);
  }
  // What admit() counts for packets like view, or of packet_bytes in all, that came without bytes.
  void count_direct_rx(const wire::PacketView& view, uint64_t packets = 1);
  void count_direct_rx_total(uint64_t packets, uint64_t packet_bytes);
  // Receives and processes the packets waiting for this device. Application
  // threads pass block=false and skip the work when another thread is at it.
  void progress(bool block);
  // Makes the scheduler watch the link for arrivals (idempotent).
  void start_progress();
  // For diagnostics: bytes waiting on the socket, local queue length, receive lock.
  std::string rx_state();
  // Hands a packet (BTH..ICRC) to the receive path as if it had arrived from src
  // on port 4791. Used by fuzzing and tests of hostile input.
  void inject(in_addr src, std::span<const uint8_t> packet);
  // The address a LID maps to: the device's own /16 with the LID as low bits.
  in_addr addr_of_lid(uint16_t lid) const;

  // ---- the fault layer ------------------------------------------------------
  faults::PacketFilter& packet_filter() { return packet_filter_; }
  // The agent that gets the packets sent to QP1 (emu/device/gsi.hpp); set once.
  void set_gsi_agent(GsiAgent* agent) { gsi_agent_.store(agent, std::memory_order_release); }
  GsiAgent* gsi_agent() const { return gsi_agent_.load(std::memory_order_acquire); }
  faults::VerbFilter& verb_filter() { return verb_filter_; }

  // ---- port and device state (the fault layer's port_down/up, device_fatal) --
  bool port_active() const { return port_active_.load(std::memory_order_relaxed); }
  bool fatal() const { return fatal_.load(std::memory_order_relaxed); }
  // Takes the port down or up; raises IBV_EVENT_PORT_ERR / PORT_ACTIVE on every
  // open context when the state changes. False if it already was in that state.
  bool set_port_active(bool up);
  // The device fails: IBV_EVENT_DEVICE_FATAL on every open context, the port goes
  // down, every QP moves to the error state; later resource creation fails (EIO).
  void make_fatal();
  // Queues an event on every open context of the device.
  void post_device_event(ibv_event_type type, uint8_t port);
  void add_context(Context* ctx);
  void remove_context(Context* ctx);
  // Moves the QP of that number to the error state (with IBV_EVENT_QP_FATAL).
  bool fail_qp(uint32_t qpn);
  // Runs f on the QP of that number, if there is one, keeping it alive meanwhile.
  void with_qp(uint32_t qpn, const std::function<void(Qp*)>& f);

  // ---- multicast (emu/device/mcast.cpp) -------------------------------------
  // ibv_attach_mcast/ibv_detach_mcast of a QP of this device, after the verb's
  // own checks: 0 or an errno (the kernel's and mlx5's).
  int attach_mcast(uint32_t qpn, const ibv_gid& gid, uint16_t lid);
  int detach_mcast(uint32_t qpn, const ibv_gid& gid, uint16_t lid);
  // Whether the QP is attached to any group (ibv_destroy_qp refuses then).
  bool mcast_attached(uint32_t qpn);

 private:
  // fabric::PacketSink: the receive path, called under rx_mu_.
  bool admit(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::PacketView& view,
             wire::IpFields ip = {}) override;
  void deliver(in_addr src, const wire::PacketView& view) override;
  bool forge_nak(const wire::PacketView& view, uint8_t syndrome) override;
  bool forge_reject(in_addr src, const wire::PacketView& view, uint16_t reason) override;
  void ready() override;
  // One poll of the link if rx_mu_ is free (fabric::Receiver::try_poll).
  bool try_poll() override;
  // A request or response from a device of this process without bytes
  // (fabric::Receiver::receive_direct): only try-locks, as the sender holds its
  // QP's lock; refused for QP1 and multicast, which keep the packet path.
  bool receive_direct(in_addr src, const wire::PacketView& view) override;
  // A packet to the multicast QPN whose ICRC does not verify against this
  // device's address: verifies it against each IPv4 group the device has
  // joined or left lately, and on success sets rx_group_ (emu/device/mcast.cpp).
  wire::ParseError admit_mcast(std::span<const uint8_t> packet, wire::Ipv4Flow flow, wire::PacketView& view);
  // Hands a multicast packet to every QP of this device attached to rx_group_.
  void deliver_mcast(in_addr src, const wire::PacketView& view);
  // Whether a region or a window has that key index (under mu_).
  bool index_taken(uint32_t index) const;

  Handle<verbs_device, Device> handle_;
  DeviceConfig config_;
  int index_;
  in_addr addr_;
  const Clock& clock_;
  Scheduler& scheduler_;
  fabric::Link* link_ = nullptr;
  faults::PacketFilter& packet_filter_;
  faults::VerbFilter& verb_filter_;
  uint16_t lid_ = 0;
  uint64_t guid_ = 0;
  uint8_t mac_[6] = {};

  // Changes of the tables below, the number sequences, contexts_, dm_.
  std::mutex mu_;
  uint32_t next_qpn_;
  std::unordered_map<uint32_t, Qp*> qps_;  // under mu_: the live QPs, for iteration
  QpTable qp_table_;                       // the lookups' index of qps_
  uint32_t next_mr_index_ = 1;
  uint8_t next_mr_key_ = 0;
  // Regions and windows by key index (the key's upper 24 bits): one lookup
  // tells whether an index is taken, and finds what a key names.
  RadixTable<PtrSlot<Mr>> mrs_;
  RadixTable<PtrSlot<Mw>> mws_;
  // Live objects per ObjectType (charge/discharge).
  std::atomic<int> live_[static_cast<size_t>(ObjectType::xrcd) + 1] = {};
  SpreadSharedMutex mr_mu_;
  std::vector<Context*> contexts_;  // under mu_
  std::unique_ptr<uint8_t[]> dm_mem_;    // under mu_, allocated on first use
  std::map<uint64_t, uint64_t> dm_used_;  // under mu_: offset -> size
  std::atomic<bool> port_active_{true};
  std::atomic<bool> fatal_{false};

  Counters counters_;
  std::atomic<GsiAgent*> gsi_agent_{nullptr};
  // One thread processes received packets at a time, in order: it serialises
  // the link's drain() and inject().
  std::mutex rx_mu_;

  // Multicast groups by GID: the attached QPs (a QP once per (GID, LID) it was
  // attached with, as the kernel lists them) and the device's announcement of
  // its membership to the host (fabric/mcast_directory.hpp).
  struct McastGroup {
    std::vector<std::pair<uint32_t, uint16_t>> attached;  // (QPN, LID)
    std::unique_ptr<fabric::McastMembership> membership;
  };
  std::mutex mcast_mu_;
  std::map<fabric::McastGid, McastGroup> mcast_;  // under mcast_mu_
  size_t mcast_attachments_ = 0;                  // under mcast_mu_
  // The IPv4 groups the device left last, oldest first (under mcast_mu_): what a
  // member was sent before it left still arrives after, and is recognised by them.
  std::deque<in_addr> left_groups_;
  // The group the packet admit() just passed was sent to, or 0 (under rx_mu_:
  // admit() and deliver() of one packet run back to back).
  in_addr rx_group_{};
};

// The process-wide device list, created on first use from the environment.
class DeviceRegistry {
 public:
  static DeviceRegistry& instance();
  const std::vector<Device*>& devices();  // configures on the first call
  Device* find(ibv_device* dev);
  const std::string& config_error() const { return error_; }
  Device* find_by_addr(in_addr addr);

 private:
  // Builds the device's link chain (the one place it is assembled).
  void connect(Device& dev, int udp_fd, fabric::RealTimeScheduler& scheduler);

  std::once_flag once_;
  fabric::LocalHub hub_;
  // SOFTVERBS_TOPOLOGY's fabric between the devices, if set (as long as the links).
  std::unique_ptr<fabric::SimFabric> sim_fabric_;
  std::vector<std::unique_ptr<fabric::Link>> links_;  // the devices' link chains, as long as the devices
  std::vector<std::unique_ptr<Device>> owned_;
  std::vector<Device*> devices_;
  std::string error_;
};

// One object counted against its device's limit for its type (Device::charge).
// Objects keep theirs as a member, so the count is given back whenever the
// object is destroyed: by its destroy verb, or by a creation that fails after it.
class Charge {
 public:
  Charge() = default;
  Charge(Device* dev, ObjectType type) noexcept : dev_(dev), type_(type) {}
  Charge(Charge&& o) noexcept : dev_(std::exchange(o.dev_, nullptr)), type_(o.type_) {}
  Charge& operator=(Charge&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = std::exchange(o.dev_, nullptr);
      type_ = o.type_;
    }
    return *this;
  }
  Charge(const Charge&) = delete;
  Charge& operator=(const Charge&) = delete;
  ~Charge() { reset(); }
  explicit operator bool() const noexcept { return dev_ != nullptr; }

 private:
  void reset() noexcept {
    if (dev_) dev_->discharge(type_);
    dev_ = nullptr;
  }
  Device* dev_ = nullptr;
  ObjectType type_ = ObjectType::pd;
};

// ---------------------------------------------------------------------------
// A counter of objects that refer to this one: destroy refuses with EBUSY while
// it is non-zero, as the kernel does.
struct UseCount {
  std::atomic<int> n{0};
  void get() { n.fetch_add(1, std::memory_order_relaxed); }
  void put() { n.fetch_sub(1, std::memory_order_relaxed); }
  bool busy() const { return n.load(std::memory_order_relaxed) != 0; }
};

// Async event bookkeeping of an object that can be an event's element: destroy
// waits until every event reported on it has been acknowledged (rdma-core semantics).
struct EventCount {
  uint32_t reported = 0;  // guarded by the public struct's mutex
};

// ---------------------------------------------------------------------------
// What a kernel uverbs file is to its contexts: the object table, shared by
// the context that opened it and every context that imports it
// (ibv_import_device, emu/objects/import.cpp). cmd_fd names it.
struct ContextFile {
  Device* device = nullptr;
  uint64_t serial = 0;  // unique in the process: what the cmd_fd's memfd records
  HandleTable table;
  // Objects destroyed through an imported struct: their own struct stays
  // readable until it is unimported (the deleter frees it).
  std::mutex retired_mu;
  std::map<const void*, std::function<void()>> retired;
};

class Context {
 public:
  // A context of its own (ibv_open_device): a new file, and a cmd_fd naming it.
  explicit Context(Device& device);
  // An imported one (ibv_import_device): the file of the context cmd_fd names;
  // the context owns cmd_fd from now on, as rdma-core's does.
  Context(std::shared_ptr<ContextFile> file, int cmd_fd);
  ~Context();

  ibv_context* ibv() { return &handle_.pub.context; }
  verbs_context* vctx() { return &handle_.pub; }
  static Context* from(ibv_context* ctx) {
    return Handle<verbs_context, Context>::owner_of(outer_of<verbs_context>(ctx, offsetof(verbs_context, context)));
  }
  Device& device() { return device_; }
  const std::shared_ptr<ContextFile>& file() const { return file_; }

  // Queues an async event on the context's event file descriptor.
  void post_async_event(const ibv_async_event& event);
  int get_async_event(ibv_async_event* event);
  // Drops pending events whose element is obj (it is being destroyed).
  void forget_async_events(const void* obj);

  UseCount users;  // every object created on the context

 private:
  std::shared_ptr<ContextFile> file_;

 public:
  // The numbers of the objects created on the context, and on every context
  // sharing its file.
  HandleTable& handles;

 private:
  void init(int cmd_fd);

  Handle<verbs_context, Context> handle_;
  Device& device_;
  std::mutex async_mu_;
  std::deque<ibv_async_event> async_events_;
};

// ---------------------------------------------------------------------------
class Pd {
 public:
  explicit Pd(Context& ctx);
  ibv_pd* ibv() { return &handle_.pub; }
  static Pd* from(ibv_pd* pd) { return Handle<ibv_pd, Pd>::owner_of(pd); }
  Context& context() { return ctx_; }
  UseCount users;
  Charge charge;  // max_pd (none for an XRC domain's internal PD)

 private:
  Handle<ibv_pd, Pd> handle_;
  Context& ctx_;
};

class Mr {
 public:
  Mr(Pd& pd, void* addr, size_t length, uint64_t iova, unsigned access);
  ibv_mr* ibv() { return &handle_.pub; }
  static Mr* from(ibv_mr* mr) { return Handle<ibv_mr, Mr>::owner_of(mr); }
  Pd* pd() const { return pd_; }
  void set_pd(Pd* pd) { pd_ = pd; }
  uint64_t iova() const { return iova_; }
  unsigned access() const { return access_; }
  void set_translation(void* addr, size_t length, uint64_t iova);
  void set_access(unsigned access) { access_ = access; }
  // A region of device memory (ibv_reg_dm_mr): its I/O addresses are offsets
  // from host, inside the DM's buffer; the public addr stays NULL as rdma-core
  // leaves it.
  void set_dm(Dm* dm, uint8_t* host) {
    dm_ = dm;
    dm_host_ = host;
  }
  Dm* dm() const { return dm_; }

  // True when [iova, iova+len) lies inside the region and the access is allowed.
  bool covers(uint64_t iova, uint64_t len) const;
  uint8_t* host_addr(uint64_t iova) const;
  uint64_t length() const { return handle_.pub.length; }
  uint32_t lkey() const { return handle_.pub.lkey; }

  // Memory windows bound to the region (under the device's mr_lock()).
  uint32_t bound_windows = 0;
  // The device's own copy of the key (register_mr): lookups and
  // deregistration never trust the public lkey, which the application can write.
  uint32_t key = 0;
  Charge charge;  // max_mr

 private:
  Handle<ibv_mr, Mr> handle_;
  Pd* pd_;
  uint64_t iova_;
  unsigned access_;
  Dm* dm_ = nullptr;
  uint8_t* dm_host_ = nullptr;
};

// Makes a checked region live: counts it against max_mr (ENOMEM past it), gives
// it its key and its object number, and takes its hold on the PD. NULL and errno
// on failure, with nothing changed; may throw std::bad_alloc, also with nothing
// changed (every reg verb runs behind a barrier that turns it into ENOMEM).
ibv_mr* publish_mr(std::unique_ptr<Mr> mr);

// Device memory (ibv_alloc_dm): a range of the device's own buffer
// (Device::alloc_dm_range), read and written by the application through the
// ibv_dm's memcpy ops and by the transport through regions registered on it.
class Dm {
 public:
  Dm(Context& ctx, uint64_t offset, uint64_t length);
  ~Dm();
  ibv_dm* ibv() { return &handle_.pub; }
  static Dm* from(ibv_dm* dm) { return Handle<ibv_dm, Dm>::owner_of(dm); }
  Context& context() { return ctx_; }
  uint64_t length() const { return length_; }  // as the application asked
  uint8_t* memory() const;                     // its first byte
  UseCount users;                              // regions registered on it

 private:
  Handle<ibv_dm, Dm> handle_;
  Context& ctx_;
  uint64_t offset_;
  uint64_t length_;
};

// A memory window (IBTA 10.6.7): an rkey for a part of a region, bound and
// unbound by work requests on a QP (emu/memory/window.hpp). The binding is the
// device's state and changes under its mr_lock() held exclusively; the public
// ibv_mw's rkey is the application's copy (ibv_bind_mw updates it at post).
class Mw {
 public:
  Mw(Pd& pd, ibv_mw_type type);
  ibv_mw* ibv() { return &handle_.pub; }
  static Mw* from(ibv_mw* mw) { return Handle<ibv_mw, Mw>::owner_of(mw); }
  Pd& pd() const { return pd_; }
  ibv_mw_type type() const { return handle_.pub.type; }

  // The binding (under the device's mr_lock()).
  uint32_t rkey = 0;  // the current rkey: key index << 8 | key byte
  Mr* mr = nullptr;   // null: not bound (a type 2 window is then free)
  uint64_t addr = 0;  // where the window starts in the region's I/O addresses
  uint64_t length = 0;
  unsigned access = 0;      // the window's remote access rights
  bool zero_based = false;  // remote addresses are offsets from the window's start
  uint32_t qpn = 0;         // type 2B: the QP it is bound to
  Charge charge;            // max_mw

 private:
  Handle<ibv_mw, Mw> handle_;
  Pd& pd_;
};

// ---------------------------------------------------------------------------
class CompChannel {
 public:
  CompChannel(Context& ctx, int fd);
  ~CompChannel();
  ibv_comp_channel* ibv() { return &handle_.pub; }
  static CompChannel* from(ibv_comp_channel* ch) { return Handle<ibv_comp_channel, CompChannel>::owner_of(ch); }
  Context& context() { return ctx_; }
  void notify(Cq* cq);
  int get_event(Cq** cq);
  void forget(Cq* cq);  // drops the CQ's pending events (the CQ is being destroyed)

 private:
  Handle<ibv_comp_channel, CompChannel> handle_;
  Context& ctx_;
  std::mutex mu_;
  std::deque<Cq*> events_;
};

class Cq {
 public:
  // domain: the parent domain whose allocator holds the ring (null: the heap).
  Cq(Context& ctx, int cqe, void* cq_context, CompChannel* channel, uint64_t wc_flags,
     ParentDomain* domain = nullptr);
  ~Cq();
  ibv_cq* ibv() { return ibv_cq_ex_to_cq(&handle_.pub); }
  ibv_cq_ex* ibv_ex() { return &handle_.pub; }
  static Cq* from(ibv_cq* cq) { return Handle<ibv_cq_ex, Cq>::owner_of(cq); }
  static Cq* from(ibv_cq_ex* cq) { return Handle<ibv_cq_ex, Cq>::owner_of(cq); }
  Context& context() { return ctx_; }
  CompChannel* channel() { return channel_; }
  ParentDomain* domain() { return domain_; }  // holds a use of it
  int depth() const;

  // Adds a completion; raises the completion event if armed. False when the
  // CQ is full or has overrun before: it is then in error (IBV_EVENT_CQ_ERR once).
  bool push(const ibv_wc& wc, bool solicited);
  // The same for n completions in order, under one lock: how many it took
  // (fewer than n: the CQ overran, as push() returning false says).
  size_t push_n(const ibv_wc* wcs, size_t n, bool solicited);
  // The fault layer's delayed completion: pushed after delay_us.
  void push_later(const ibv_wc& wc, bool solicited, uint32_t delay_us);
  int poll(int n, ibv_wc* wc);
  // Removes every completion of the QP numbered qpn, queued or delayed, keeping
  // the others in order: what a QP's reset or destruction does to its CQs.
  void clean(uint32_t qpn);
  int arm(int solicited_only);
  int resize(int cqe);
  size_t outstanding();

  // Extended-CQ (ibv_cq_ex) iteration: start_poll/next_poll load the next entry
  // into current() and the public status/wr_id fields; end_poll releases it.
  int start_poll();
  int next_poll();
  void end_poll();
  const ibv_wc& current() const { return current_.wc; }
  uint64_t current_timestamp_ns() const { return current_.timestamp_ns; }
  uint64_t wc_flags() const { return wc_flags_; }  // the ibv_cq_init_attr_ex wc_flags
  // IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: a full CQ never goes to the error state.
  void set_ignore_overrun() { ignore_overrun_ = true; }

  // Completion events read by ibv_get_cq_event (destroy waits for their acks).
  uint32_t comp_events_reported = 0;  // guarded by the public struct's mutex

  UseCount users;  // QPs and SRQs using this CQ
  EventCount events;
  Charge charge;  // max_cq

 private:
  Handle<ibv_cq_ex, Cq> handle_;
  Context& ctx_;
  CompChannel* channel_;
  struct Cqe {
    ibv_wc wc;
    uint64_t timestamp_ns;
  };
  bool pop_locked(Cqe* out);
  void push_due();
  // A ring of depth entries in a buffer of the CQ's parent domain (or the heap).
  QueueBuffer ring_buffer(int depth);

  ParentDomain* domain_;
  QueueBuffer doorbell_;  // the doorbell record ConnectX allocates beside the ring (parent domains only)
  std::mutex mu_;
  QueueBuffer ring_mem_;
  Cqe* ring_ = nullptr;
  size_t ring_size_ = 0;
  uint64_t head_ = 0, tail_ = 0;
  int armed_ = 0;  // 0: not armed, 1: next completion, 2: solicited only
  bool overrun_ = false;
  bool ignore_overrun_ = false;  // set once, before the application has the CQ
  uint64_t wc_flags_ = 0;
  struct Delayed {
    std::chrono::steady_clock::time_point due;
    ibv_wc wc;
    bool solicited;
  };
  std::vector<Delayed> delayed_;  // the fault layer's delayed completions
  std::shared_ptr<EngineTimer> delay_timer_;
  Cqe current_{};
};

// ---------------------------------------------------------------------------
// An XRC domain (IBTA 14.2.4, ibv_open_xrcd(3)): what XRC SRQs and XRC target
// QPs must share. Every open of the same file (same inode) on the same device
// within the process yields the same domain; fd -1 gives a domain of its own.
struct XrcDomain {
  int device_index = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  bool anonymous = true;
  // The XRC_RECV QPs created in the domain, by number, each with the count of
  // its handles (the creator's and those of ibv_open_qp): the QP lives until
  // the last one is destroyed (the kernel's xrcd->tgt_qps and real_qp->usecnt).
  struct TgtQp {
    Qp* qp = nullptr;
    int handles = 0;
  };
  std::mutex mu;
  std::map<uint32_t, TgtQp> tgt_qps;
};

// One ibv_open_xrcd: a handle on a domain. SRQs created through it count as
// its users (ibv_close_xrcd refuses while they exist, EBUSY).
class Xrcd {
 public:
  Xrcd(Context& ctx, std::shared_ptr<XrcDomain> domain);
  ibv_xrcd* ibv() { return &handle_.pub; }
  static Xrcd* from(ibv_xrcd* xrcd) { return Handle<ibv_xrcd, Xrcd>::owner_of(xrcd); }
  Context& context() { return ctx_; }
  const std::shared_ptr<XrcDomain>& domain() const { return domain_; }

  // The protection domain an XRC_RECV QP is built on: such a QP has no PD of
  // its own (its ibv_qp.pd is NULL); memory access at the target is checked
  // against the PD of the SRQ a request names (IBTA 14.2.4).
  Pd& qp_pd() { return qp_pd_; }

  UseCount users;       // XRC SRQs and XRC_RECV QPs created or opened through this handle
  uint32_t number = 0;  // the context's object number (rdma-core keeps it in verbs_xrcd)

 private:
  Handle<ibv_xrcd, Xrcd> handle_;
  Context& ctx_;
  std::shared_ptr<XrcDomain> domain_;
  Pd qp_pd_;
};

// ---------------------------------------------------------------------------
class Srq {
 public:
  // domain: the parent domain whose allocator holds the ring (null: the heap).
  Srq(Pd& pd, const ibv_srq_init_attr& attr, uint32_t max_wr, uint32_t max_sge, ParentDomain* domain = nullptr);
  ~Srq();
  ibv_srq* ibv() { return &handle_.pub; }
  static Srq* from(ibv_srq* srq) { return Handle<ibv_srq, Srq>::owner_of(srq); }
  Pd& pd() { return pd_; }
  Context& context() { return pd_.context(); }

  int post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
  int modify(ibv_srq_attr* attr, int attr_mask);
  void query(ibv_srq_attr* attr);

  UseCount users;  // QPs attached
  EventCount events;
  std::mutex mu;
  // The ring's memory and ConnectX's doorbell record (parent domains only),
  // before the ring that lives in it.
  QueueBuffer queue_mem;
  QueueBuffer doorbell;
  WorkQueue<RecvWqe> rq;
  ParentDomain* domain = nullptr;  // the parent domain it was created on (holds a use of it)
  uint32_t limit = 0;
  bool error = false;
  // The SRQ number (ibv_get_srq_num): unique on the device, what an XRC
  // sender names in its XRCETH.
  uint32_t srqn = 0;
  // An XRC SRQ (IBV_SRQT_XRC): its domain handle and the CQ its receive
  // completions go to; null for a basic SRQ.
  Xrcd* xrcd = nullptr;
  Cq* cq = nullptr;
  Charge charge;  // max_srq

 private:
  Handle<ibv_srq, Srq> handle_;
  Pd& pd_;
};

// SRQ numbers, unique per device (emu/objects/xrcd.cpp): every SRQ gets one
// at creation; an XRC responder finds the SRQ an XRCETH names by it.
// acquire_srq and unregister_srq_if_unused hold the table's lock while they
// look at the SRQ's users, so that an SRQ found by number cannot be destroyed
// between the lookup and the use the finder takes.
// register_srq may throw std::bad_alloc (nothing is registered then).
uint32_t register_srq(const Device& dev, Srq* srq);
// False, and nothing changed, while the SRQ has users.
bool unregister_srq_if_unused(const Device& dev, Srq* srq);
// The SRQ of that number with one more use taken (users.get()), or null.
Srq* acquire_srq(const Device& dev, uint32_t srqn);

// ---------------------------------------------------------------------------
class Ah {
 public:
  Ah(Pd& pd, const ibv_ah_attr& attr);
  ibv_ah* ibv() { return &handle_.pub; }
  static Ah* from(ibv_ah* ah) { return Handle<ibv_ah, Ah>::owner_of(ah); }
  Pd& pd() { return pd_; }
  const ibv_ah_attr& attr() const { return attr_; }
  Charge charge;  // max_ah

 private:
  Handle<ibv_ah, Ah> handle_;
  Pd& pd_;
  ibv_ah_attr attr_;
};

}  // namespace softverbs::emu
