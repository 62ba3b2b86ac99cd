// Shared receive queues: posting, modify and query (IBTA 10.2.9).
#include <cerrno>

#include "emu/device/caps.hpp"
#include "emu/device/personality.hpp"
#include "emu/objects/domain.hpp"
#include "emu/objects/objects.hpp"
#include "core/trace.hpp"

namespace softverbs::emu {

// As mlx5's SRQ: the ring's buffer, then its doorbell record.
Srq::Srq(Pd& pd, const ibv_srq_init_attr& attr, uint32_t max_wr, uint32_t max_sge, ParentDomain* pdom)
    : queue_mem(QueueBuffer::custom_only(pdom, WorkQueue<RecvWqe>::bytes_for(max_wr, max_sge), kQueueAlign,
                                         resource_type_srq())),
      doorbell(pdom && pdom->custom_alloc() ? QueueBuffer(pdom, kDoorbellSize, kDoorbellSize, resource_type_dbr())
                                                : QueueBuffer()),
      rq(max_wr, max_sge, 0, queue_mem.data()),
      domain(pdom),
      pd_(pd) {
  handle_.owner = this;
  ibv_srq& s = handle_.pub;
  s.context = pd.context().ibv();
  s.srq_context = attr.srq_context;
  s.pd = pd.ibv();
  s.handle = 0;
  pthread_mutex_init(&s.mutex, nullptr);
  pthread_cond_init(&s.cond, nullptr);
  s.events_completed = 0;
}

Srq::~Srq() {
  pthread_mutex_destroy(&handle_.pub.mutex);
  pthread_cond_destroy(&handle_.pub.cond);
}

int Srq::post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  std::lock_guard lock(mu);
  for (; wr; wr = wr->next) {
    if (int rc = post_recv_wqe(rq, *wr)) {
      *bad_wr = wr;
      return rc;
    }
    if (trace::on()) {
      Device& dev = context().device();
      rq.back().trace_id =
          trace::wr_posted(dev.clock(), dev.name(), "post_srq_recv", srqn, wr->wr_id, "RECV", rq.back().total_length);
    }
  }
  return 0;
}

int Srq::modify(ibv_srq_attr* attr, int attr_mask) {
  if (attr_mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
  // ConnectX cannot resize an SRQ (the device does not report
  // IBV_DEVICE_SRQ_RESIZE); rxe can (the personality's queues.srq_resize).
  const Personality& persona = personality();
  if ((attr_mask & IBV_SRQ_MAX_WR) && !persona.srq_resize) return EINVAL;
  std::lock_guard lock(mu);
  if (attr_mask & IBV_SRQ_MAX_WR) {
    // rxe_srq_chk_attr: within max_srq_wr, not below the armed limit; the
    // queue then holds 2^n - 1 as at creation (queues.written_back), and
    // cannot shrink below the receives it holds. A parent domain's buffer
    // cannot grow.
    if (attr->max_wr == 0 || attr->max_wr > static_cast<uint32_t>(persona.max_srq_wr)) return EINVAL;
    if (limit && attr->max_wr < limit) return EINVAL;
    if (queue_mem.data()) return EINVAL;
    const uint32_t depth = persona.queue_sizes_as_requested ? rxe_like_depth(attr->max_wr) : attr->max_wr;
    if (int err = rq.resize(depth)) return err;
  }
  if (attr_mask & IBV_SRQ_LIMIT) {
    if (attr->srq_limit > rq.capacity()) return EINVAL;
    limit = attr->srq_limit;  // arms the limit event; 0 disarms it
  }
  return 0;
}

void Srq::query(ibv_srq_attr* attr) {
  std::lock_guard lock(mu);
  attr->max_wr = rq.capacity();
  attr->max_sge = rq.max_sge();
  attr->srq_limit = limit;
}

}  // namespace softverbs::emu
