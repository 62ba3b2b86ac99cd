// rsockets' I/O mapping (riomap, riounmap, riowrite), as rdma-core 44 does it:
//  * riomap(PROT_WRITE) registers a buffer for remote writes and takes one of
//    the peer's iomap slots (the peer sized its table with RDMA_IOMAPSIZE and
//    said so in its connection data). The mapping is advertised before the
//    next data: an RsIomap {offset, addr, key, length} written with
//    immediate IOMAP_SGL|slot into the peer's table, right after its target
//    SGL. Without PROT_WRITE it is only registered locally.
//  * riowrite(offset) finds the peer's mapping holding offset and writes
//    there with plain RDMA WRITEs (no immediate: the peer sees nothing but
//    its memory changing), in transfers of the send path's sizes.
//  * riounmap forgets the registration; the peer is not told (rdma-core
//    leaves the slot's old entry in the peer's table too).
#include <byteswap.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "abi/rdmacm/rsocket.hpp"

namespace softverbs::abi::rs {
namespace {

int fail(int err) {
  errno = err;
  return -1;
}

// One advertisement (rdma-core's rs_write_iomap): it uses a credit and a
// send WR like a data message.
int write_iomap(Rsocket& rs, int slot, ibv_sge* sgl, int nsge, int flags) {
  rs.sseq_no++;
  rs.sqe_avail--;
  rs.sbuf_bytes_avail -= sizeof(RsIomap);
  return post_write_msg(rs, sgl, nsge, msg_set(kOpIomapSgl, static_cast<uint32_t>(slot)), flags,
                        rs.remote_iomap.addr + static_cast<uint64_t>(slot) * sizeof(RsIomap), rs.remote_iomap.key);
}

}  // namespace

off_t iomap(Rsocket& rs, void* buf, size_t len, int prot, off_t offset) {
  if (!rs.pd || (prot & ~(PROT_WRITE | PROT_NONE))) return fail(EINVAL);
  if (!(prot & PROT_WRITE)) {
    ibv_mr* mr = ibv_reg_mr(rs.pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return -1;
    rs.local_maps.push_back(mr);
    return offset == -1 ? static_cast<off_t>(reinterpret_cast<uintptr_t>(buf)) : offset;
  }
  auto free_slot = std::find_if(rs.iomap_slots.begin(), rs.iomap_slots.end(), [](auto& s) { return !s.mr; });
  if (free_slot == rs.iomap_slots.end()) return fail(ENOMEM);
  ibv_mr* mr = ibv_reg_mr(rs.pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) return -1;
  if (offset == -1) offset = static_cast<off_t>(reinterpret_cast<uintptr_t>(buf));
  free_slot->mr = mr;
  free_slot->offset = static_cast<uint64_t>(offset);
  rs.iomap_queue.push_back(static_cast<int>(free_slot - rs.iomap_slots.begin()));
  return offset;
}

int iounmap(Rsocket& rs, void* buf, size_t len) {
  for (size_t i = 0; i < rs.iomap_slots.size(); ++i) {
    ibv_mr*& mr = rs.iomap_slots[i].mr;
    if (mr && mr->addr == buf && mr->length == len) {
      ibv_dereg_mr(mr);
      mr = nullptr;
      std::erase(rs.iomap_queue, static_cast<int>(i));
      return 0;
    }
  }
  for (auto it = rs.local_maps.begin(); it != rs.local_maps.end(); ++it) {
    if ((*it)->addr == buf && (*it)->length == len) {
      ibv_dereg_mr(*it);
      rs.local_maps.erase(it);
      return 0;
    }
  }
  return fail(EINVAL);
}

void free_iomaps(Rsocket& rs) {
  for (auto& s : rs.iomap_slots)
    if (s.mr) ibv_dereg_mr(s.mr);
  for (ibv_mr* mr : rs.local_maps) ibv_dereg_mr(mr);
  rs.iomap_slots.clear();
  rs.iomap_queue.clear();
  rs.local_maps.clear();
}

int send_iomaps(Rsocket& rs, std::unique_lock<std::mutex>& lk, int flags) {
  while (!rs.iomap_queue.empty()) {
    if (!can_send(rs)) {
      if (get_comp(rs, lk, nonblocking(rs, flags), conn_can_send) != 0) return -1;
      if (!(rs.state & kWritable)) return fail(ECONNRESET);
    }
    const int slot = rs.iomap_queue.front();
    rs.iomap_queue.pop_front();
    const Rsocket::IoMapping& m = rs.iomap_slots[static_cast<size_t>(slot)];
    RsIomap iom;
    iom.offset = m.offset;
    iom.sge.addr = reinterpret_cast<uintptr_t>(m.mr->addr);
    iom.sge.length = static_cast<uint32_t>(m.mr->length);
    iom.sge.key = m.mr->rkey;
    if (rs.swap_sgl) {
      iom.offset = bswap_64(iom.offset);
      iom.sge.addr = bswap_64(iom.sge.addr);
      iom.sge.length = bswap_32(iom.sge.length);
      iom.sge.key = bswap_32(iom.sge.key);
    }
    int ret;
    if (rs.sq_inline >= sizeof iom) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(&iom), sizeof iom, 0};
      ret = write_iomap(rs, slot, &sge, 1, IBV_SEND_INLINE);
    } else {
      iovec v{&iom, sizeof iom};
      const iovec* cur = &v;
      size_t off = 0;
      const int nsge = stage(rs, cur, off, sizeof iom);
      ret = write_iomap(rs, slot, rs.ssgl, nsge, 0);
      staged(rs, nsge, sizeof iom);
    }
    if (ret) return ret;
  }
  return 0;
}

ssize_t iowrite(Rsocket& rs, std::unique_lock<std::mutex>& lk, const void* buf, size_t count, off_t offset, int flags) {
  if (!rs.cq) return fail(ENOTCONN);
  if (!(rs.state & kWritable)) return fail(ECONNRESET);  // as rsend
  if (!rs.iomap_queue.empty() && send_iomaps(rs, lk, flags) != 0) return -1;
  iovec v{const_cast<void*>(buf), count};
  const iovec* cur = &v;
  size_t left = count, iov_off = 0;
  uint32_t olen = kOlapStart, xfer = 0;
  int ret = 0;
  const volatile RsIomap* iom = nullptr;
  auto off = static_cast<uint64_t>(offset);
  for (; left; left -= xfer, off += xfer) {
    if (!iom || off >= iom->offset + iom->sge.length) {
      iom = nullptr;
      for (uint16_t i = 0; i < rs.target_iomap_size && rs.target_iomap; ++i) {
        const volatile RsIomap& e = rs.target_iomap[i];
        if (off >= e.offset && off < e.offset + e.sge.length) {
          iom = &e;
          break;
        }
      }
      if (!iom) {
        // Not mapped (yet): a short count, or with nothing written, wait for
        // the peer's next advertisement (EAGAIN when not blocking).
        if (left != count) break;
        rs.iomap_seen = rs.iomap_updates;
        ret = get_comp(rs, lk, nonblocking(rs, flags),
                       [](const Rsocket& r) { return r.iomap_updates != r.iomap_seen || !(r.state & kWritable); });
        if (ret) break;
        if (!(rs.state & kWritable)) {
          ret = fail(ECONNRESET);
          break;
        }
        xfer = 0;
        continue;
      }
    }
    if (!can_send(rs)) {
      ret = get_comp(rs, lk, nonblocking(rs, flags), conn_can_send);
      if (ret) break;
      if (!(rs.state & kWritable)) {
        ret = fail(ECONNRESET);
        break;
      }
    }
    if (olen < left) {
      xfer = olen;
      if (olen < kMaxTransfer) olen <<= 1;
    } else {
      xfer = static_cast<uint32_t>(left);
    }
    xfer = std::min(xfer, rs.sbuf_bytes_avail);
    xfer = static_cast<uint32_t>(std::min<uint64_t>(xfer, iom->offset + iom->sge.length - off));
    const int nsge = stage(rs, cur, iov_off, xfer);
    rs.sqe_avail--;
    rs.sbuf_bytes_avail -= xfer;
    ibv_send_wr wr{};
    wr.wr_id = msg_set(kOpWrite, xfer);
    wr.sg_list = rs.ssgl;
    wr.num_sge = nsge;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = xfer <= rs.sq_inline ? IBV_SEND_INLINE : 0;
    wr.wr.rdma.remote_addr = iom->sge.addr + off - iom->offset;
    wr.wr.rdma.rkey = iom->sge.key;
    ret = post_send(rs, wr);
    staged(rs, nsge, xfer);
    if (ret) break;
  }
  return (ret && left == count) ? ret : static_cast<ssize_t>(count - left);
}

}  // namespace softverbs::abi::rs
