// Local memory access through scatter/gather lists, with the key checks of the
// verbs spec. Callers hold the device's mr_lock() shared for as long as they use
// the spans.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <span>
#include <vector>

#include "emu/objects/objects.hpp"

namespace softverbs::emu {

// Resolves bytes [offset, offset+len) of the SGE list into host spans. Each SGE's
// lkey must name a region of `pd` that covers it and grants `access` (0 for
// reading local memory, IBV_ACCESS_LOCAL_WRITE for writing it). False on a
// protection violation, or when the list is shorter than offset+len.
bool resolve_sges(Device& dev, const Pd& pd, const Sge* sges, uint32_t num_sge, uint64_t offset, uint64_t len,
                  unsigned access, std::vector<std::span<uint8_t>>& out);

// The host address of [va, va+len) through the region or memory window an
// rkey names, if it lets the peer of QP qpn (of PD pd, granting qp_access)
// perform `access` there: the QP's access flags, same PD, the region's or the
// window's rights and bounds, and a type 2B window bound to this QP
// (window.hpp). nullptr otherwise.
uint8_t* check_rkey(Device& dev, const Pd& pd, uint32_t qpn, unsigned qp_access, uint32_t rkey, uint64_t va,
                    uint64_t len, unsigned access);

// Copies src into the spans, in order.
void scatter(const std::vector<std::span<uint8_t>>& dst, std::span<const uint8_t> src);

}  // namespace softverbs::emu
