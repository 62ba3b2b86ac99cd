#include "emu/memory/sge.hpp"

#include <cstring>

#include "emu/memory/user_range.hpp"
#include "emu/memory/window.hpp"

namespace softverbs::emu {

bool resolve_sges(Device& dev, const Pd& pd, const Sge* sges, uint32_t num_sge, uint64_t offset, uint64_t len,
                  unsigned access, std::vector<std::span<uint8_t>>& out) {
  out.clear();
  for (uint32_t i = 0; i < num_sge && len > 0; ++i) {
    const Sge& s = sges[i];
    if (offset >= s.length) {
      offset -= s.length;
      continue;
    }
    uint64_t take = std::min<uint64_t>(s.length - offset, len);
    Mr* mr = dev.find_mr_locked(s.lkey);
    // IBTA 10.6.3.1: the L_Key must be valid, of the QP's PD, grant the access and
    // cover the whole SGE.
    if (!mr || mr->pd() != &pd || (access && !(mr->access() & access)) || !mr->covers(s.addr, s.length))
      return false;
    // An ODP region's pages need not be mapped: a page that is not (or not
    // writable) is a fault the device cannot resolve, not a crash.
    uint8_t* host = mr->host_addr(s.addr + offset);
    if ((mr->access() & IBV_ACCESS_ON_DEMAND) && check_user_range(host, take, access != 0)) return false;
    out.emplace_back(host, take);
    len -= take;
    offset = 0;
  }
  return len == 0;
}

uint8_t* check_rkey(Device& dev, const Pd& pd, uint32_t qpn, unsigned qp_access, uint32_t rkey, uint64_t va,
                    uint64_t len, unsigned access) {
  // IBTA 10.6.3.2 / 9.7.5.2.4: the QP must allow the operation, then the key
  // must name a region or a window that does.
  if (!(qp_access & access)) return nullptr;
  if (Mr* mr = dev.find_mr_locked(rkey)) {
    if (mr->pd() != &pd || !(mr->access() & access) || !mr->covers(va, len)) return nullptr;
    // ODP: an unmapped page is a remote access error (as resolve_sges).
    uint8_t* host = mr->host_addr(va);
    if ((mr->access() & IBV_ACCESS_ON_DEMAND) && check_user_range(host, len, access != IBV_ACCESS_REMOTE_READ))
      return nullptr;
    return host;
  }
  return window_access(dev, pd, qpn, rkey, va, len, access);
}

void scatter(const std::vector<std::span<uint8_t>>& dst, std::span<const uint8_t> src) {
  size_t at = 0;
  for (const auto& d : dst) {
    size_t n = std::min(d.size(), src.size() - at);
    if (n) std::memcpy(d.data(), src.data() + at, n);
    at += n;
  }
}

}  // namespace softverbs::emu
