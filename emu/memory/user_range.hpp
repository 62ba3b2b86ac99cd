// Checks that a range of the process's address space is mapped with the rights a
// registration needs, so that remote access through a region can never fault.
#pragma once

#include <cstddef>
#include <cstdint>

namespace softverbs::emu {

// 0, or EFAULT when some byte of [addr, addr+length) is unmapped, or not readable,
// or (need_write) not writable: what the kernel's page pinning reports.
int check_user_range(const void* addr, size_t length, bool need_write);

}  // namespace softverbs::emu
