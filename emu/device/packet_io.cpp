// The device's RoCEv2 endpoint: sending packets, receiving them and handing each
// to its QP (the receive demultiplexer).
#include <arpa/inet.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "emu/objects/objects.hpp"
#include "emu/qp/qp.hpp"
#include "emu/device/progress.hpp"
#include "core/log.hpp"
#include "faults/engine.hpp"
#include "wire/pcap.hpp"

namespace softverbs::emu {
namespace {

constexpr uint16_t kRoceV2Port = wire::kRoceV2UdpPort;
constexpr int kRxBatch = 32;
constexpr size_t kMaxDatagram = 65536;
// How long the fault layer holds a packet back for reordering when no other
// packet overtakes it.
constexpr auto kReorderHold = std::chrono::microseconds(200);

std::array<uint8_t, 4> bytes_of(in_addr a) {
  std::array<uint8_t, 4> b;
  std::memcpy(b.data(), &a.s_addr, 4);
  return b;
}

}  // namespace

wire::Ipv4Flow Device::flow(in_addr src, in_addr dst) const {
  wire::Ipv4Flow f;
  f.saddr = bytes_of(src);
  f.daddr = bytes_of(dst);
  // Sent from the endpoint's own port over an unconnected socket with DF set,
  // which gives IP ID 0 (see bind_endpoint).
  f.id = 0;
  f.frag_off = wire::kIpv4FlagDf;
  f.sport = kRoceV2Port;
  f.dport = kRoceV2Port;
  return f;
}

in_addr Device::addr_of_lid(uint16_t lid) const {
  in_addr a;
  a.s_addr = htonl((ntohl(addr_.s_addr) & 0xffff0000u) | lid);
  return a;
}

void Device::inject(in_addr src, std::span<const uint8_t> packet) {
  std::lock_guard lock(rx_mu_);
  handle_packet(src, kRoceV2Port, packet);
}

std::string Device::rx_state() {
  int pending = 0;
  ::ioctl(udp_fd_, FIONREAD, &pending);
  size_t local = 0;
  {
    std::lock_guard lock(local_mu_);
    local = local_.size();
  }
  bool busy = !rx_mu_.try_lock();
  if (!busy) rx_mu_.unlock();
  return "socket " + std::to_string(pending) + " bytes, local " + std::to_string(local) + ", receive " +
         (busy ? "busy" : "idle");
}

void Device::start_progress() {
  std::call_once(progress_started_, [this] { Progress::instance().watch(*this); });
}

void Device::transmit(in_addr dst, std::span<const uint8_t> packet) {
  if (!port_active()) {
    // A port that is down sends nothing: to its peers it is a lost link.
    counters_.port_down_drops.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  faults::FaultEngine& engine = faults::FaultEngine::instance();
  if (engine.active()) {
    wire::PacketView view;
    if (wire::parse(packet, view) == wire::ParseError::ok) {
      faults::FaultDecision d = engine.decide({faults::Direction::tx, name(), &view});
      if (d.fired) {
        switch (d.action) {
          case faults::FaultAction::drop:
            counters_.faults_dropped.fetch_add(1, std::memory_order_relaxed);
            return;
          case faults::FaultAction::duplicate:
            counters_.faults_duplicated.fetch_add(1, std::memory_order_relaxed);
            send_now(dst, packet);
            break;
          case faults::FaultAction::corrupt: {
            // One flipped bit in the middle of the packet: the ICRC no longer matches.
            counters_.faults_corrupted.fetch_add(1, std::memory_order_relaxed);
            std::vector<uint8_t> bad(packet.begin(), packet.end());
            bad[bad.size() / 2] ^= 0x10;
            send_now(dst, bad);
            return;
          }
          case faults::FaultAction::delay: {
            counters_.faults_delayed.fetch_add(1, std::memory_order_relaxed);
            Progress::instance().after(
                std::chrono::microseconds(d.delay_us),
                [this, dst, bytes = std::vector<uint8_t>(packet.begin(), packet.end())] { send_now(dst, bytes); });
            return;
          }
          case faults::FaultAction::reorder: {
            counters_.faults_reordered.fetch_add(1, std::memory_order_relaxed);
            std::lock_guard lock(held_mu_);
            if (!held_tx_) {
              held_tx_.emplace(dst, std::vector<uint8_t>(packet.begin(), packet.end()));
              // It goes out after the next packet, or after a short while if none follows.
              Progress::instance().after(kReorderHold, [this] {
                std::optional<std::pair<in_addr, std::vector<uint8_t>>> held;
                {
                  std::lock_guard l(held_mu_);
                  held.swap(held_tx_);
                }
                if (held) send_now(held->first, held->second);
              });
              return;
            }
            break;
          }
          default:
            break;  // nak: receive side only; verb actions never reach packets
        }
      }
    }
  }
  send_now(dst, packet);
  // A packet held back for reordering follows the one just sent.
  std::optional<std::pair<in_addr, std::vector<uint8_t>>> held;
  {
    std::lock_guard lock(held_mu_);
    held.swap(held_tx_);
  }
  if (held) send_now(held->first, held->second);
}

void Device::send_now(in_addr dst, std::span<const uint8_t> packet) {
  counters_.tx_packets.fetch_add(1, std::memory_order_relaxed);
  if (wire::PcapWriter* pcap = wire::PcapWriter::instance()) pcap->write(addr_, dst, kRoceV2Port, packet);
  if (Device* local = DeviceRegistry::instance().find_by_addr(dst)) {
    local->receive_local(addr_, packet);
    return;
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(kRoceV2Port);
  sa.sin_addr = dst;
  for (;;) {
    ssize_t n = ::sendto(udp_fd_, packet.data(), packet.size(), 0, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    if (n >= 0) return;
    if (errno == EINTR) continue;
    // A full socket buffer or an unreachable peer loses the packet, as a
    // congested link would: the reliable transport recovers it.
    SV_LOG(kDebug, "%s: send to %s failed: %s", name().c_str(), inet_ntoa(dst), std::strerror(errno));
    return;
  }
}

void Device::deliver_later(in_addr src, uint16_t sport, std::vector<uint8_t> bytes, uint32_t delay_us) {
  Progress::instance().after(std::chrono::microseconds(delay_us), [this, src, sport, data = std::move(bytes)] {
    std::lock_guard lock(rx_mu_);
    handle_packet(src, sport, data, false);
  });
}

void Device::receive_local(in_addr src, std::span<const uint8_t> packet) {
  {
    std::lock_guard lock(local_mu_);
    local_.emplace_back(src, std::vector<uint8_t>(packet.begin(), packet.end()));
  }
  if (!local_pending_.exchange(true)) {
    start_progress();
    Progress::instance().post([this] { progress(true); });
  }
}

void Device::progress(bool block) {
  std::unique_lock lock(rx_mu_, std::defer_lock);
  if (block) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return;
  }
  static thread_local std::vector<uint8_t> bufs(static_cast<size_t>(kRxBatch) * kMaxDatagram);
  for (;;) {
    bool any = false;
    // Datagrams from the socket, in batches.
    mmsghdr msgs[kRxBatch];
    iovec iov[kRxBatch];
    sockaddr_in from[kRxBatch];
    for (int i = 0; i < kRxBatch; ++i) {
      iov[i] = {bufs.data() + static_cast<size_t>(i) * kMaxDatagram, kMaxDatagram};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      msgs[i].msg_hdr.msg_name = &from[i];
      msgs[i].msg_hdr.msg_namelen = sizeof from[i];
    }
    int n = ::recvmmsg(udp_fd_, msgs, kRxBatch, MSG_DONTWAIT, nullptr);
    wire::PcapWriter* pcap = wire::PcapWriter::instance();
    for (int i = 0; i < n; ++i) {
      any = true;
      // Packets from other processes are captured on arrival (those of this
      // process were captured when sent).
      if (pcap)
        pcap->write(from[i].sin_addr, addr_, ntohs(from[i].sin_port),
                    std::span<const uint8_t>(static_cast<uint8_t*>(iov[i].iov_base), msgs[i].msg_len));
      handle_packet(from[i].sin_addr, ntohs(from[i].sin_port),
                    std::span<const uint8_t>(static_cast<uint8_t*>(iov[i].iov_base), msgs[i].msg_len));
    }
    // Packets from devices of this process.
    if (local_pending_.load(std::memory_order_acquire)) {
      std::deque<std::pair<in_addr, std::vector<uint8_t>>> batch;
      {
        std::lock_guard l(local_mu_);
        batch.swap(local_);
        local_pending_.store(false, std::memory_order_release);
      }
      for (auto& [src, bytes] : batch) {
        any = true;
        handle_packet(src, kRoceV2Port, bytes);
      }
    }
    if (!any) return;
  }
}

void Device::handle_packet(in_addr src, uint16_t sport, std::span<const uint8_t> packet, bool apply_faults) {
  counters_.rx_packets.fetch_add(1, std::memory_order_relaxed);
  if (!port_active()) {
    counters_.port_down_drops.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  wire::PacketView pkt;
  wire::Ipv4Flow f = flow(src, addr_);
  f.sport = sport;
  wire::ParseError err = wire::parse(packet, pkt, wire::IcrcFlow{f});
  if (err == wire::ParseError::icrc_mismatch) {
    counters_.rx_icrc_errors.fetch_add(1, std::memory_order_relaxed);
    return;  // a corrupted packet is dropped silently (IBTA: invariant CRC error)
  }
  if (err != wire::ParseError::ok) {
    counters_.rx_malformed.fetch_add(1, std::memory_order_relaxed);
    SV_LOG(kDebug, "%s: dropped malformed packet: %.*s", name().c_str(),
           static_cast<int>(wire::to_string(err).size()), wire::to_string(err).data());
    return;
  }
  faults::FaultEngine& engine = faults::FaultEngine::instance();
  if (apply_faults && engine.active()) {
    faults::FaultDecision d = engine.decide({faults::Direction::rx, name(), &pkt});
    if (d.fired) {
      switch (d.action) {
        case faults::FaultAction::drop:
          counters_.faults_dropped.fetch_add(1, std::memory_order_relaxed);
          return;
        case faults::FaultAction::corrupt:
          // As if it had arrived damaged: the ICRC check drops it.
          counters_.faults_corrupted.fetch_add(1, std::memory_order_relaxed);
          counters_.rx_icrc_errors.fetch_add(1, std::memory_order_relaxed);
          return;
        case faults::FaultAction::duplicate:
          counters_.faults_duplicated.fetch_add(1, std::memory_order_relaxed);
          handle_packet(src, sport, packet, false);
          break;
        case faults::FaultAction::delay:
          counters_.faults_delayed.fetch_add(1, std::memory_order_relaxed);
          deliver_later(src, sport, std::vector<uint8_t>(packet.begin(), packet.end()), d.delay_us);
          return;
        case faults::FaultAction::reorder:
          if (!held_rx_) {
            counters_.faults_reordered.fetch_add(1, std::memory_order_relaxed);
            held_rx_.emplace(src, sport, std::vector<uint8_t>(packet.begin(), packet.end()));
            // Handled after the next packet, or after a short while if none follows.
            Progress::instance().after(kReorderHold, [this] {
              std::lock_guard lock(rx_mu_);
              if (!held_rx_) return;
              auto held = std::move(*held_rx_);
              held_rx_.reset();
              handle_packet(std::get<0>(held), std::get<1>(held), std::get<2>(held), false);
            });
            return;
          }
          break;
        case faults::FaultAction::nak:
          if (pkt.op->is_request) {
            if (Qp* qp = find_qp(pkt.bth.dest_qp)) {
              counters_.faults_naks_forged.fetch_add(1, std::memory_order_relaxed);
              qp->forge_nak(pkt.bth.psn, d.syndrome);
              return;
            }
          }
          break;
        default:
          break;  // verb actions never reach packets
      }
    }
  }
  Qp* qp = find_qp(pkt.bth.dest_qp);
  if (!qp) {
    counters_.rx_unknown_qp.fetch_add(1, std::memory_order_relaxed);
  } else {
    qp->receive(pkt, src);
  }
  if (apply_faults && held_rx_) {
    auto held = std::move(*held_rx_);
    held_rx_.reset();
    handle_packet(std::get<0>(held), std::get<1>(held), std::get<2>(held), false);
  }
}

}  // namespace softverbs::emu
