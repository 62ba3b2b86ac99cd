// Whether a range of the process's memory may be registered (user_range.hpp).
//
// The kernel pins a region's pages at registration and fails with EFAULT if some
// are not mapped with the rights asked for. The emulator asks the kernel about
// the mappings covering the range, one mapping at a time, with the PROCMAP_QUERY
// ioctl on /proc/self/maps (Linux 6.11): a lookup in the process's mapping tree,
// so a registration costs the same however many mappings or regions the process
// has. Older kernels answer ENOTTY; the range is then checked by reading
// /proc/self/maps, whose cost grows with the number of mappings.
#include "emu/memory/user_range.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace softverbs::emu {
namespace {

// The UAPI of PROCMAP_QUERY (linux/fs.h from 6.11; the build's headers may be
// older): a 104-byte record, fields in this order, versioned by its size.
struct ProcmapQuery {
  uint64_t size;
  uint64_t query_flags;
  uint64_t query_addr;
  uint64_t vma_start;
  uint64_t vma_end;
  uint64_t vma_flags;
  uint64_t vma_page_size;
  uint64_t vma_offset;
  uint64_t inode;
  uint32_t dev_major;
  uint32_t dev_minor;
  uint32_t vma_name_size;
  uint32_t build_id_size;
  uint64_t vma_name_addr;
  uint64_t build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104);
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kVmaReadable = 0x01;
constexpr uint64_t kVmaWritable = 0x02;

// The walk over /proc/self/maps (kernels without PROCMAP_QUERY).
int check_by_reading_maps(uintptr_t start, uintptr_t end, bool need_write) {
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

// The process's /proc/self/maps, opened once and reopened when it is no longer
// ours: after fork (it would describe the parent) or when the application
// closed the descriptor and the number now names another file.
class MapsFile {
 public:
  // Runs the query on the process's maps: 0, or the ioctl's errno.
  int query(ProcmapQuery* q) {
    std::lock_guard lock(mu_);
    if (!current() && !open()) return ENOTTY;
    if (::ioctl(fd_, kProcmapQuery, q) == 0) return 0;
    return errno;
  }
  bool unsupported() const { return unsupported_.load(std::memory_order_relaxed); }
  void set_unsupported() { unsupported_.store(true, std::memory_order_relaxed); }

 private:
  bool current() const {
    if (fd_ < 0 || pid_ != ::getpid()) return false;
    struct stat st {};
    return ::fstat(fd_, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
  }
  bool open() {
    // After fork the inherited descriptor is this process's own copy of the
    // parent's: close it, unless its number now names another file.
    if (fd_ >= 0 && pid_ != ::getpid()) {
      struct stat st {};
      if (::fstat(fd_, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) ::close(fd_);
    }
    fd_ = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return false;
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      ::close(fd_);
      fd_ = -1;
      return false;
    }
    pid_ = ::getpid();
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    return true;
  }

  std::mutex mu_;
  int fd_ = -1;
  pid_t pid_ = 0;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  std::atomic<bool> unsupported_{false};
};

MapsFile& maps_file() {
  static MapsFile* file = new MapsFile;  // used until exit
  return *file;
}

}  // namespace

int check_user_range(const void* addr, size_t length, bool need_write) {
  uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  if (length == 0) return 0;
  if (start + length < start) return EFAULT;
  const uintptr_t end = start + length;
  MapsFile& maps = maps_file();
  if (maps.unsupported()) return check_by_reading_maps(start, end, need_write);
  // One query per mapping the range spans, each for the mapping covering the
  // first byte not yet checked.
  for (uintptr_t covered = start; covered < end;) {
    ProcmapQuery q{};
    q.size = sizeof q;
    q.query_addr = covered;
    const int err = maps.query(&q);
    if (err == ENOENT) return EFAULT;  // a hole
    if (err) {
      if (err == ENOTTY || err == EINVAL) maps.set_unsupported();
      return check_by_reading_maps(start, end, need_write);
    }
    if (!(q.vma_flags & kVmaReadable) || (need_write && !(q.vma_flags & kVmaWritable))) return EFAULT;
    if (q.vma_end <= covered) return check_by_reading_maps(start, end, need_write);  // cannot happen
    covered = q.vma_end;
  }
  return 0;
}

}  // namespace softverbs::emu
