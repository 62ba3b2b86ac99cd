#include "emu/memory/user_range.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace softverbs::emu {

int check_user_range(const void* addr, size_t length, bool need_write) {
  uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  if (length == 0) return 0;
  if (start + length < start) return EFAULT;
  uintptr_t end = start + length;
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (!maps) return 0;  // cannot tell: accept, as a kernel without the check would
  // /proc/self/maps lists mappings in address order; walk them while they cover
  // the range without a gap.
  uintptr_t covered = start;
  char line[512];
  int result = EFAULT;
  while (std::fgets(line, sizeof line, maps)) {
    unsigned long lo, hi;
    char perms[5] = {};
    if (std::sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3) continue;
    if (hi <= covered) continue;
    if (lo > covered) break;  // a hole
    if (perms[0] != 'r' || (need_write && perms[1] != 'w')) break;
    covered = hi;
    if (covered >= end) {
      result = 0;
      break;
    }
  }
  std::fclose(maps);
  return result;
}

}  // namespace softverbs::emu
