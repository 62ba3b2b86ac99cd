// rsockets: the data path of a stream rsocket (rsocket.hpp describes the
// protocol): completions, credits and buffer advertisements, sending,
// receiving and the orderly shutdown. All functions run with rs.mu held.
#include <byteswap.h>
#include <endian.h>

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

}  // namespace

int post_send(Rsocket& rs, ibv_send_wr& wr) {
  ibv_send_wr* bad = nullptr;
  if (int e = ibv_post_send(rs.id->qp, &wr, &bad)) return fail(e);
  return 0;
}

// An RDMA WRITE WITH IMMEDIATE of sgl (possibly nothing) to addr/rkey; the
// wr_id is the message, so its completion says what it freed.
int post_write_msg(Rsocket& rs, ibv_sge* sgl, int nsge, uint32_t msg, int flags, uint64_t addr, uint32_t rkey) {
  ibv_send_wr wr{};
  wr.wr_id = msg;
  wr.sg_list = sgl;
  wr.num_sge = nsge;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = static_cast<unsigned>(flags);
  wr.imm_data = htobe32(msg);
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  return post_send(rs, wr);
}

uint32_t sbuf_left(const Rsocket& rs) {
  return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(rs.sbuf + rs.sbuf_size) - rs.ssgl[0].addr);
}

bool conn_can_send(const Rsocket& rs) { return can_send(rs) || !(rs.state & kWritable); }

// Copies len bytes from an iovec cursor.
void copy_iov(uint8_t* dst, const iovec*& iov, size_t& offset, size_t len) {
  while (len) {
    const size_t n = std::min(iov->iov_len - offset, len);
    std::memcpy(dst, static_cast<const uint8_t*>(iov->iov_base) + offset, n);
    dst += n;
    len -= n;
    offset += n;
    if (offset == iov->iov_len) {
      ++iov;
      offset = 0;
    }
  }
}

// Copies len bytes from the cursor into the send buffer at its write
// position, wrapping at its end; sets ssgl and returns how many SGEs.
int stage(Rsocket& rs, const iovec*& cur, size_t& offset, uint32_t len) {
  if (len <= sbuf_left(rs)) {
    copy_iov(reinterpret_cast<uint8_t*>(rs.ssgl[0].addr), cur, offset, len);
    rs.ssgl[0].length = len;
    return 1;
  }
  rs.ssgl[0].length = sbuf_left(rs);
  copy_iov(reinterpret_cast<uint8_t*>(rs.ssgl[0].addr), cur, offset, rs.ssgl[0].length);
  rs.ssgl[1].length = len - rs.ssgl[0].length;
  copy_iov(rs.sbuf, cur, offset, rs.ssgl[1].length);
  return 2;
}

// Moves the send buffer's write position past what stage() placed.
void staged(Rsocket& rs, int nsge, uint32_t len) {
  if (nsge == 2)
    rs.ssgl[0].addr = reinterpret_cast<uintptr_t>(rs.sbuf) + rs.ssgl[1].length;
  else if (len < sbuf_left(rs))
    rs.ssgl[0].addr += len;
  else
    rs.ssgl[0].addr = reinterpret_cast<uintptr_t>(rs.sbuf);
}

namespace {

bool ctrl_avail(const Rsocket& rs) { return rs.ctrl_seqno != rs.ctrl_max_seqno; }

// rdma-core's rs_send_credits: a new credit limit, and the freed half of the
// receive buffer written into the peer's target SGL when there is one.
void send_credits(Rsocket& rs) {
  rs.ctrl_seqno++;
  rs.rseq_comp = static_cast<uint16_t>(rs.rseq_no + (rs.rq_size >> 1));
  const uint32_t msg = msg_set(kOpSgl, static_cast<uint16_t>(rs.rseq_no + rs.rq_size));
  if (rs.rbuf_bytes_avail >= static_cast<int>(rs.rbuf_size >> 1)) {
    RsSge sge;
    sge.addr = reinterpret_cast<uintptr_t>(&rs.rbuf[rs.rbuf_free_offset]);
    sge.key = rs.rmr->rkey;
    sge.length = rs.rbuf_size >> 1;
    if (rs.swap_sgl) {
      sge.addr = bswap_64(sge.addr);
      sge.key = bswap_32(sge.key);
      sge.length = bswap_32(sge.length);
    }
    ibv_sge ib{};
    int flags;
    if (rs.sq_inline < sizeof sge) {
      // Not inline: from a control slot of the send buffer, which stays
      // untouched until the slot's completion.
      uint8_t* slot = rs.sbuf + rs.sbuf_size + sizeof(RsSge) * (rs.ctrl_seqno & (kQpCtrlSize - 1));
      std::memcpy(slot, &sge, sizeof sge);
      ib.addr = reinterpret_cast<uintptr_t>(slot);
      ib.lkey = rs.smr->lkey;
      flags = 0;
    } else {
      ib.addr = reinterpret_cast<uintptr_t>(&sge);
      flags = IBV_SEND_INLINE;
    }
    ib.length = sizeof sge;
    post_write_msg(rs, &ib, 1, msg, flags, rs.remote_sgl.addr + rs.remote_sge * sizeof(RsSge), rs.remote_sgl.key);
    rs.rbuf_bytes_avail -= static_cast<int>(rs.rbuf_size >> 1);
    rs.rbuf_free_offset += static_cast<int>(rs.rbuf_size >> 1);
    if (rs.rbuf_free_offset >= static_cast<int>(rs.rbuf_size)) rs.rbuf_free_offset = 0;
    if (++rs.remote_sge == static_cast<int>(rs.remote_sgl.length)) rs.remote_sge = 0;
  } else {
    post_ctrl(rs, msg);
  }
}

bool give_credits(const Rsocket& rs) {
  return (rs.rbuf_bytes_avail >= static_cast<int>(rs.rbuf_size >> 1) ||
          static_cast<int16_t>(static_cast<int16_t>(rs.rseq_no) - static_cast<int16_t>(rs.rseq_comp)) >= 0) &&
         ctrl_avail(rs) && (rs.state & kConnected);
}

// One data message into the advertised buffer (rdma-core's rs_write_data):
// the target SGE is consumed before posting.
int write_data(Rsocket& rs, ibv_sge* sgl, int nsge, uint32_t length, int flags) {
  rs.sseq_no++;
  rs.sqe_avail--;
  rs.sbuf_bytes_avail -= length;
  volatile RsSge& t = rs.target_sgl[rs.target_sge];
  const uint64_t addr = t.addr;
  const uint32_t rkey = t.key;
  t.addr = addr + length;
  t.length = t.length - length;
  if (t.length == 0 && ++rs.target_sge == kSglSize) rs.target_sge = 0;
  return post_write_msg(rs, sgl, nsge, msg_set(kOpData, length), flags, addr, rkey);
}

bool conn_have_rdata(const Rsocket& rs) { return have_rdata(rs) || !(rs.state & kReadable); }
bool conn_can_send_ctrl(const Rsocket& rs) { return ctrl_avail(rs) || !(rs.state & kConnected); }
bool conn_all_sends_done(const Rsocket& rs) {
  return (static_cast<int>(rs.ctrl_max_seqno) - static_cast<int>(rs.ctrl_seqno)) + rs.sqe_avail == rs.sq_size ||
         !(rs.state & kConnected);
}

}  // namespace

int post_ctrl(Rsocket& rs, uint32_t msg) { return post_write_msg(rs, nullptr, 0, msg, 0, 0, 0); }

bool can_send(const Rsocket& rs) {
  return rs.sqe_avail && rs.sbuf_bytes_avail >= kSndLowat && rs.sseq_no != rs.sseq_comp && rs.target_sgl &&
         rs.target_sgl[rs.target_sge].length != 0;
}

bool have_rdata(const Rsocket& rs) { return rs.rmsg_head != rs.rmsg_tail; }

void update_credits(Rsocket& rs) {
  if (rs.cq && give_credits(rs)) send_credits(rs);
}

// rdma-core's rs_poll_cq: receives carry the peer's messages, send
// completions give back what the message used.
int poll_cq(Rsocket& rs) {
  if (!rs.cq) return 0;
  ibv_wc wc;
  int ret, rcnt = 0;
  while ((ret = ibv_poll_cq(rs.cq, 1, &wc)) > 0) {
    if (wc.wr_id & kRecvFlag) {
      if (wc.status != IBV_WC_SUCCESS) continue;
      rcnt++;
      if (!(wc.wc_flags & IBV_WC_WITH_IMM)) continue;  // rsockets' SEND form (iWARP) is not used
      const uint32_t msg = be32toh(wc.imm_data);
      switch (msg_op(msg)) {
        case kOpSgl:
          rs.sseq_comp = static_cast<uint16_t>(msg_data(msg));
          break;
        case kOpIomapSgl:
          rs.iomap_updates++;
          break;
        case kOpWrite:
          break;
        case kOpCtrl:
          if (msg_data(msg) == kCtrlDisconnect) {
            rs.state = kDisconnected;
            return 0;
          }
          if (msg_data(msg) == kCtrlShutdown) {
            if (rs.state & kWritable) {
              rs.state &= ~kReadable;
            } else {
              rs.state = kDisconnected;
              return 0;
            }
          }
          break;
        default:
          rs.rmsg[rs.rmsg_tail] = {msg_op(msg), msg_data(msg)};
          if (++rs.rmsg_tail == rs.rq_size + 1) rs.rmsg_tail = 0;
          break;
      }
    } else {
      const uint32_t msg = static_cast<uint32_t>(wc.wr_id);
      switch (msg_op(msg)) {
        case kOpSgl:
          rs.ctrl_max_seqno++;
          break;
        case kOpCtrl:
          rs.ctrl_max_seqno++;
          if (msg_data(msg) == kCtrlDisconnect) rs.state = kDisconnected;
          break;
        case kOpIomapSgl:
          rs.sqe_avail++;
          rs.sbuf_bytes_avail += sizeof(RsIomap);
          break;
        default:
          rs.sqe_avail++;
          rs.sbuf_bytes_avail += msg_data(msg);
          break;
      }
      if (wc.status != IBV_WC_SUCCESS && (rs.state & kConnected)) {
        rs.state = kError;
        rs.err = EIO;
      }
    }
  }
  if (rs.state & kConnected) {
    while (!ret && rcnt--) {
      ibv_recv_wr wr{}, *bad = nullptr;
      wr.wr_id = kRecvFlag;
      if (int e = ibv_post_recv(rs.id->qp, &wr, &bad)) ret = fail(e);
    }
    if (ret) {
      rs.state = kError;
      rs.err = errno;
    }
  }
  return ret < 0 ? -1 : 0;
}

// Continues to deliver queued data after the peer has gone (rdma-core's rrecv).
ssize_t recv(Rsocket& rs, std::unique_lock<std::mutex>& lk, void* buf, size_t len, int flags) {
  if (rs.state & kOpening) {
    if (do_connect(rs, lk, !nonblocking(rs, flags)) != 0) {
      if (errno == EINPROGRESS) errno = EAGAIN;
      return -1;
    }
  }
  if (!rs.cq) return fail(ENOTCONN);
  auto* out = static_cast<uint8_t*>(buf);
  size_t left = len;
  int ret = 0;
  do {
    if (!have_rdata(rs)) {
      ret = get_comp(rs, lk, nonblocking(rs, flags), conn_have_rdata);
      if (ret) break;
    }
    if (flags & MSG_PEEK) {
      // Copy without consuming.
      int head = rs.rmsg_head, off = rs.rbuf_offset;
      uint32_t first_left = rs.rmsg[head].data;
      while (left && head != rs.rmsg_tail) {
        const uint32_t avail = (head == rs.rmsg_head) ? first_left : rs.rmsg[head].data;
        uint32_t n = static_cast<uint32_t>(std::min<size_t>(left, avail));
        if (n == avail && ++head == rs.rq_size + 1) head = 0;
        while (n) {
          const uint32_t chunk = std::min<uint32_t>(n, rs.rbuf_size - static_cast<uint32_t>(off));
          std::memcpy(out, &rs.rbuf[off], chunk);
          out += chunk;
          n -= chunk;
          left -= chunk;
          off = (off + static_cast<int>(chunk)) % static_cast<int>(rs.rbuf_size);
        }
      }
      break;
    }
    while (left && have_rdata(rs)) {
      uint32_t rsize;
      if (left < rs.rmsg[rs.rmsg_head].data) {
        rsize = static_cast<uint32_t>(left);
        rs.rmsg[rs.rmsg_head].data -= rsize;
      } else {
        rs.rseq_no++;
        rsize = rs.rmsg[rs.rmsg_head].data;
        if (++rs.rmsg_head == rs.rq_size + 1) rs.rmsg_head = 0;
      }
      while (rsize) {
        const uint32_t chunk = std::min<uint32_t>(rsize, rs.rbuf_size - static_cast<uint32_t>(rs.rbuf_offset));
        std::memcpy(out, &rs.rbuf[rs.rbuf_offset], chunk);
        out += chunk;
        rsize -= chunk;
        left -= chunk;
        rs.rbuf_offset += static_cast<int>(chunk);
        if (rs.rbuf_offset == static_cast<int>(rs.rbuf_size)) rs.rbuf_offset = 0;
        rs.rbuf_bytes_avail += static_cast<int>(chunk);
      }
    }
  } while (left && (flags & MSG_WAITALL) && (rs.state & kReadable));
  update_credits(rs);
  return (ret && left == len) ? ret : static_cast<ssize_t>(len - left);
}

// rdma-core's rsendv: transfers grow from 2 KiB to 64 KiB, each bounded by the
// free send buffer and the advertised receive buffer.
ssize_t sendv(Rsocket& rs, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, int flags) {
  if (rs.state & kOpening) {
    if (do_connect(rs, lk, !nonblocking(rs, flags)) != 0) {
      if (errno == EINPROGRESS) errno = EAGAIN;
      return -1;
    }
  }
  if (!rs.cq) return fail(ENOTCONN);
  // Shut for writing, or the peer is gone: rdma-core's ECONNRESET (it
  // reports it only once it has to wait; here at once, so no data is
  // posted after the SHUTDOWN message).
  if (!(rs.state & kWritable)) return fail(ECONNRESET);
  if (!rs.iomap_queue.empty() && send_iomaps(rs, lk, flags) != 0) return -1;
  size_t len = 0;
  for (int i = 0; i < iovcnt; ++i) len += iov[i].iov_len;
  size_t left = len, offset = 0;
  uint32_t olen = kOlapStart, xfer = 0;
  int ret = 0;
  const iovec* cur = iov;
  while (cur->iov_len == 0 && left) ++cur;
  for (; left; left -= xfer) {
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
    xfer = std::min<uint32_t>(xfer, uint32_t{rs.target_sgl[rs.target_sge].length});
    const int nsge = stage(rs, cur, offset, xfer);
    ret = write_data(rs, rs.ssgl, nsge, xfer, xfer <= rs.sq_inline ? IBV_SEND_INLINE : 0);
    staged(rs, nsge, xfer);
    if (ret) break;
  }
  return (ret && left == len) ? ret : static_cast<ssize_t>(len - left);
}

// rdma-core's rshutdown: a control message tells the peer, then the sends
// drain. SHUT_RD alone sends nothing while the socket can still write.
int shutdown(Rsocket& rs, std::unique_lock<std::mutex>& lk, int how) {
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return fail(EINVAL);
  int ret = 0;
  if (rs.state & kConnected) {
    uint32_t ctrl;
    if (how == SHUT_RDWR) {
      ctrl = kCtrlDisconnect;
      rs.state &= ~(kReadable | kWritable);
    } else if (how == SHUT_WR) {
      rs.state &= ~kWritable;
      ctrl = (rs.state & kReadable) ? kCtrlShutdown : kCtrlDisconnect;
    } else {
      rs.state &= ~kReadable;
      if (rs.state & kWritable) return 0;
      ctrl = kCtrlDisconnect;
    }
    if (!ctrl_avail(rs)) {
      ret = get_comp(rs, lk, false, conn_can_send_ctrl);
      if (ret) return ret;
    }
    if ((rs.state & kConnected) && ctrl_avail(rs)) {
      rs.ctrl_seqno++;
      ret = post_ctrl(rs, msg_set(kOpCtrl, ctrl));
    }
  }
  if (rs.state & kConnected) get_comp(rs, lk, false, conn_all_sends_done);
  return ret;
}

}  // namespace softverbs::abi::rs
