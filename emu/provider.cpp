// The emulated provider: the control verbs of emulated devices.
#include "emu/provider.hpp"

#include <arpa/inet.h>
#include <netinet/ip.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "emu/device/caps.hpp"
#include "emu/device/personality.hpp"
#include "emu/device/identity.hpp"
#include "emu/memory/user_range.hpp"
#include "emu/objects/domain.hpp"
#include "emu/objects/import.hpp"
#include "emu/objects/objects.hpp"
#include "emu/qp/qp.hpp"
#include "emu/objects/ops.hpp"
#include "emu/objects/trace.hpp"
#include "emu/provider_detail.hpp"
#include "fabric/scheduler.hpp"
#include "fabric/virtual_time.hpp"
#include "core/events.hpp"

namespace softverbs::emu {

using namespace provider_detail;

EmuProvider& EmuProvider::instance() {
  static EmuProvider* p = new EmuProvider;
  return *p;
}

// ---- devices ---------------------------------------------------------------

std::vector<ibv_device*> EmuProvider::get_devices() {
  std::vector<ibv_device*> out;
  for (Device* d : DeviceRegistry::instance().devices()) out.push_back(d->ibv());
  return out;
}

void EmuProvider::release_devices(const std::vector<ibv_device*>&) {
  // Emulated devices live as long as the process.
}

__be64 EmuProvider::get_device_guid(ibv_device* device) { return Device::from(device)->guid_be(); }

int EmuProvider::get_device_index(ibv_device* device) { return Device::from(device)->index(); }

ibv_context* EmuProvider::open_device(ibv_device* device) {
  auto ctx = std::make_unique<Context>(*Device::from(device));
  // Virtual time's watch thread steps only while a context is open (docs/simulation.md).
  if (fabric::virtual_clock()) fabric::VirtualScheduler::instance().note_context(true);
  return ctx.release()->ibv();
}

int EmuProvider::close_device(ibv_context* context) {
  Context* ctx = Context::from(context);
  trace::flush();
  if (fabric::virtual_clock()) fabric::VirtualScheduler::instance().note_context(false);
  // The kernel tears down whatever the application left; the emulator keeps such
  // objects (and so the context) alive until exit, since they may still be reached.
  if (ctx->users.busy()) return 0;
  delete ctx;
  return 0;
}

// ---- queries ---------------------------------------------------------------

int EmuProvider::query_device(ibv_context* context, ibv_device_attr* attr) {
  Context::from(context)->device().fill_device_attr(attr);
  return 0;
}

int EmuProvider::query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_len) {
  return emu::query_port(context, port_num, attr, attr_len);
}

int EmuProvider::query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                              uint32_t flags, size_t entry_size) {
  if (flags) return EINVAL;
  if (!port_ok(port_num) || gid_index >= static_cast<uint32_t>(personality().gid_tbl_len)) return EINVAL;
  ibv_gid_entry e;
  if (!Context::from(context)->device().gid_entry(gid_index, &e)) return ENODATA;
  std::memcpy(entry, &e, entry_size < sizeof e ? entry_size : sizeof e);
  return 0;
}

ssize_t EmuProvider::query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags,
                                     size_t entry_size) {
  if (flags) return -EINVAL;
  if (entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  Device& dev = Context::from(context)->device();
  size_t n = 0;
  for (uint32_t i = 0; i < static_cast<uint32_t>(personality().gid_tbl_len); ++i) {
    ibv_gid_entry e;
    if (!dev.gid_entry(i, &e)) continue;
    if (n == max_entries) return -EINVAL;
    std::memcpy(reinterpret_cast<char*>(entries) + n * entry_size, &e, sizeof e);
    ++n;
  }
  return static_cast<ssize_t>(n);
}

int EmuProvider::query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  ibv_gid_entry entry{};
  int ret = index < 0 ? EINVAL : query_gid_ex(context, port_num, static_cast<uint32_t>(index), &entry, 0, sizeof entry);
  if (ret == ENODATA) {
    std::memset(gid, 0, sizeof *gid);
    return 0;
  }
  if (ret) {
    errno = ret;
    return -1;
  }
  *gid = entry.gid;
  return 0;
}

int EmuProvider::query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  Device& dev = Context::from(context)->device();
  if (!port_ok(port_num) || index < 0 || index >= dev.pkey_tbl_len()) {
    errno = ENOENT;  // rdma-core reads ports/N/pkeys/I from sysfs: no such file
    return -1;
  }
  // The default full-membership P_Key at index 0; the rest of the table is empty.
  *pkey = index == 0 ? htons(caps::kDefaultPkey) : 0;
  return 0;
}

// ---- async events and completion channels --------------------------------

int EmuProvider::get_async_event(ibv_context* context, ibv_async_event* event) {
  return Context::from(context)->get_async_event(event);
}

void EmuProvider::ack_async_event(ibv_async_event* event) {
  auto ack = [](pthread_mutex_t* m, pthread_cond_t* c, uint32_t* completed) {
    pthread_mutex_lock(m);
    ++*completed;
    pthread_cond_signal(c);
    pthread_mutex_unlock(m);
  };
  switch (event_element(event->event_type)) {
    case EventElement::cq: {
      ibv_cq* cq = event->element.cq;
      ack(&cq->mutex, &cq->cond, &cq->async_events_completed);
      break;
    }
    case EventElement::qp: {
      ibv_qp* qp = event->element.qp;
      ack(&qp->mutex, &qp->cond, &qp->events_completed);
      break;
    }
    case EventElement::srq: {
      ibv_srq* srq = event->element.srq;
      ack(&srq->mutex, &srq->cond, &srq->events_completed);
      break;
    }
    default:
      break;
  }
}

ibv_comp_channel* EmuProvider::create_comp_channel(ibv_context* context) {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (fd < 0) return nullptr;
  Context* ctx = Context::from(context);
  std::unique_ptr<CompChannel> ch;
  try {
    ch = std::make_unique<CompChannel>(*ctx, fd);  // owns fd from here on
  } catch (...) {
    ::close(fd);
    throw;
  }
  ctx->users.get();
  return ch.release()->ibv();
}

int EmuProvider::destroy_comp_channel(ibv_comp_channel* channel) {
  ibv_context* context = channel->context;
  pthread_mutex_lock(&context->mutex);
  const bool busy = channel->refcnt != 0;
  pthread_mutex_unlock(&context->mutex);
  if (busy) return EBUSY;  // rdma-core returns the errno value, errno untouched
  CompChannel* ch = CompChannel::from(channel);
  Context& ctx = ch->context();
  delete ch;
  ctx.users.put();
  return 0;
}

int EmuProvider::get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  Cq* c = nullptr;
  if (CompChannel::from(channel)->get_event(&c) < 0) return -1;
  ibv_cq* pub = c->ibv();
  pthread_mutex_lock(&pub->mutex);
  ++c->comp_events_reported;
  pthread_mutex_unlock(&pub->mutex);
  *cq = pub;
  *cq_context = pub->cq_context;
  return 0;
}

void EmuProvider::ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

// ---- protection domains and memory ---------------------------------------

ibv_pd* EmuProvider::alloc_pd(ibv_context* context) {
  if (failed(context)) return fail<ibv_pd>(EIO);
  Context* ctx = Context::from(context);
  Charge charge = ctx->device().charge(ObjectType::pd);
  if (!charge) return fail<ibv_pd>(ENOMEM);  // max_pd PDs exist
  auto pd = std::make_unique<Pd>(*ctx);
  pd->charge = std::move(charge);
  pd->ibv()->handle = ctx->handles.add(ObjectType::pd, pd->ibv());
  ctx->users.get();
  trace_object(ctx->device(), "alloc_pd", pd->ibv()->handle);
  return pd.release()->ibv();
}

int EmuProvider::dealloc_pd(ibv_pd* pd) {
  if (int err = lookup(pd->context, ObjectType::pd, pd, pd->handle)) return kernel_error(err);
  // A parent domain is released in the provider alone (mlx5's _mlx5_free_pd).
  if (ParentDomain* domain = parent_domain_of(pd)) return kernel_error(dealloc_parent_domain(domain));
  Pd* p = Pd::from(pd);
  if (p->users.busy()) return kernel_error(EBUSY);
  Context& ctx = p->context();
  trace_object(ctx.device(), "dealloc_pd", pd->handle);
  ctx.handles.remove(pd->handle);
  if (is_imported(pd)) {
    // Destroyed through an imported struct: the PD's own struct stays until unimported.
    retire_original(*ctx.file(), p->ibv(), [p] { delete p; });
    emu::unimport_pd(pd);
  } else {
    delete p;
  }
  ctx.users.put();
  return 0;
}

namespace {
ibv_mr* add_mr(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access);
}

ibv_mr* EmuProvider::reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  if (failed(pd->context)) return fail<ibv_mr>(EIO);
  if (int err = lookup_write(pd->context, ObjectType::pd, pd, pd->handle)) return fail<ibv_mr>(err);
  // IBV_ACCESS_OPTIONAL_RANGE bits are hints the device may ignore.
  access &= ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE);
  if (int err = check_access(access)) return fail<ibv_mr>(err);
  if (length > personality().max_mr_size) return fail<ibv_mr>(EINVAL);
  // ODP (mlx5_ib create_user_odp_mr): NULL and SIZE_MAX ask for an implicit
  // region, the whole address space at I/O address 0; an explicit one needs no
  // mapping now, as nothing is pinned. Accesses check the mapping instead
  // (emu/memory/sge.cpp).
  const bool odp = (access & IBV_ACCESS_ON_DEMAND) != 0;
  if (odp && !personality().odp) return fail<ibv_mr>(EINVAL);  // rxe of that generation: no ODP
  if (odp && !addr && length == SIZE_MAX) {
    if (iova != 0) return fail<ibv_mr>(EINVAL);
    return add_mr(pd, nullptr, length, 0, access);
  }
  // A zero-length region is accepted as the kernel's ib_umem_get accepts it: when
  // the (empty) range still lies in a page, i.e. addr is not page-aligned, that page
  // is pinned; at a page boundary it spans no page and is EINVAL (npages == 0).
  const uint64_t page_size = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (length == 0 && (reinterpret_cast<uintptr_t>(addr) & (page_size - 1)) == 0) return fail<ibv_mr>(EINVAL);
  // The I/O virtual address must keep the buffer's offset within its page
  // (ib_uverbs_reg_mr).
  const uint64_t page_mask = page_size - 1;
  if ((reinterpret_cast<uintptr_t>(addr) ^ iova) & page_mask) return fail<ibv_mr>(EINVAL);
  // The pinned pages must be mapped: for a zero-length region, the page holding addr.
  const int err = odp ? 0 : check_user_range(addr, length ? length : 1, (access & IBV_ACCESS_LOCAL_WRITE) != 0);
  if (err) return fail<ibv_mr>(err);
  return add_mr(pd, addr, length, iova, access);
}

namespace {
// Registers the checked region (publish_mr: its count, key, number and hold on the PD).
ibv_mr* add_mr(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access) {
  ibv_mr* mr = publish_mr(std::make_unique<Mr>(*Pd::from(pd), addr, length, iova, access));
  if (!mr) return nullptr;
  mr->pd = pd;  // a parent domain stays what the region names (libibverbs sets mr->pd)
  trace_object(Pd::from(pd)->context().device(), "reg_mr", mr->lkey);
  return mr;
}
}  // namespace

int EmuProvider::rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  // rdma-core's own argument checks: each gives IBV_REREG_MR_ERR_INPUT, EINVAL.
  auto input_error = [] {
    errno = EINVAL;
    return static_cast<int>(IBV_REREG_MR_ERR_INPUT);
  };
  if (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) return input_error();
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!length || !addr)) return input_error();
  if (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS)) return input_error();
  // What the kernel refuses comes back as IBV_REREG_MR_ERR_CMD with its errno.
  auto cmd_error = [](int err) {
    errno = err;
    return static_cast<int>(IBV_REREG_MR_ERR_CMD);
  };
  if (flags == 0) return cmd_error(EINVAL);
  if (int err = lookup(mr->context, ObjectType::mr, mr, mr->handle)) return cmd_error(err);
  if ((flags & IBV_REREG_MR_CHANGE_PD) && pd && lookup_write(pd->context, ObjectType::pd, pd, pd->handle))
    return cmd_error(EINVAL);
  Mr* m = Mr::from(mr);
  // A region of device memory has no user pages to translate anew: the
  // emulator keeps it as registered.
  if (m->dm()) return cmd_error(EOPNOTSUPP);
  // Nor has an implicit ODP region (the whole address space).
  if ((m->access() & IBV_ACCESS_ON_DEMAND) && m->length() == SIZE_MAX) return cmd_error(EOPNOTSUPP);
  if ((flags & IBV_REREG_MR_CHANGE_PD) && !pd) return cmd_error(EINVAL);
  Pd* new_pd = (flags & IBV_REREG_MR_CHANGE_PD) ? Pd::from(pd) : m->pd();
  if (&new_pd->context() != &m->pd()->context()) return cmd_error(EINVAL);
  unsigned new_access = m->access();
  if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
    new_access = static_cast<unsigned>(access) & ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE);
    if (int err = check_access(new_access)) return cmd_error(err);
  }
  void* new_addr = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? addr : mr->addr;
  size_t new_len = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? length : mr->length;
  if ((flags & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS)) &&
      !(new_access & IBV_ACCESS_ON_DEMAND) &&
      check_user_range(new_addr, new_len, (new_access & IBV_ACCESS_LOCAL_WRITE) != 0))
    return cmd_error(EFAULT);
  // Transfers through the region finish before it changes.
  std::unique_lock lock(m->pd()->context().device().mr_lock());
  if (new_pd != m->pd()) {
    m->pd()->users.put();
    new_pd->users.get();
    m->set_pd(new_pd);
    mr->pd = pd;
  }
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) m->set_translation(addr, length, reinterpret_cast<uintptr_t>(addr));
  m->set_access(new_access);
  return 0;
}

int EmuProvider::dereg_mr(ibv_mr* mr) {
  if (int err = lookup(mr->context, ObjectType::mr, mr, mr->handle)) return kernel_error(err);
  Mr* m = Mr::from(mr);
  Pd* pd = m->pd();
  // A region with windows bound to it stays (IBTA 10.6.7.2.6; EINVAL as rxe).
  if (int err = pd->context().device().deregister_mr(m)) return err;
  trace_object(pd->context().device(), "dereg_mr", mr->lkey);
  pd->context().handles.remove(mr->handle);
  if (m->dm()) m->dm()->users.put();
  if (is_imported(mr)) {
    // Destroyed through an imported struct: the region's own struct stays until unimported.
    retire_original(*pd->context().file(), m->ibv(), [m] { delete m; });
    emu::unimport_mr(mr);
  } else {
    delete m;
  }
  pd->users.put();
  return 0;
}

// ---- completion queues ---------------------------------------------------

ibv_cq* EmuProvider::create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                               int comp_vector) {
  if (failed(context)) return fail<ibv_cq>(EIO);
  ibv_cq_ex* cq = emu::create_cq(*Context::from(context), cqe, cq_context, channel, comp_vector, IBV_WC_STANDARD_FLAGS);
  return cq ? ibv_cq_ex_to_cq(cq) : nullptr;
}

int EmuProvider::resize_cq(ibv_cq* cq, int cqe) {
  if (int err = lookup_write(cq->context, ObjectType::cq, cq, cq->handle)) return kernel_error(err);
  return Cq::from(cq)->resize(cqe);
}

int EmuProvider::destroy_cq(ibv_cq* cq) {
  if (int err = lookup(cq->context, ObjectType::cq, cq, cq->handle)) return kernel_error(err);
  Cq* c = Cq::from(cq);
  if (c->users.busy()) return kernel_error(EBUSY);
  Context& ctx = c->context();
  trace_object(ctx.device(), "destroy_cq", cq->handle);
  ctx.handles.remove(cq->handle);
  if (CompChannel* ch = c->channel()) ch->forget(c);
  ctx.forget_async_events(cq);
  wait_events_acked(&cq->mutex, &cq->cond, &cq->comp_events_completed, &c->comp_events_reported);
  wait_events_acked(&cq->mutex, &cq->cond, &cq->async_events_completed, &c->events.reported);
  if (ibv_comp_channel* ch = cq->channel) {
    pthread_mutex_lock(&ctx.ibv()->mutex);
    --ch->refcnt;
    pthread_mutex_unlock(&ctx.ibv()->mutex);
  }
  ParentDomain* domain = c->domain();
  delete c;
  if (domain) domain->users.put();
  ctx.users.put();
  return 0;
}

// ---- shared receive queues -----------------------------------------------

ibv_srq* EmuProvider::create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (failed(pd->context)) return fail<ibv_srq>(EIO);
  if (int err = lookup(pd->context, ObjectType::pd, pd, pd->handle)) return fail<ibv_srq>(err);
  const ibv_srq_attr& a = attr->attr;
  if (a.max_wr == 0 || a.max_wr > static_cast<uint32_t>(personality().max_srq_wr) ||
      a.max_sge > static_cast<uint32_t>(personality().max_srq_sge))
    return fail<ibv_srq>(EINVAL);
  Pd* p = Pd::from(pd);
  Charge charge = p->context().device().charge(ObjectType::srq);
  if (!charge) return fail<ibv_srq>(ENOMEM);  // max_srq SRQs exist
  uint32_t max_sge = a.max_sge ? a.max_sge : 1;
  // rxe's SRQ holds 2^n - 1 receives while it reports the max_wr asked for
  // (docs/simulation.md, "Vendor personalities"); ConnectX-like devices hold and
  // report exactly max_wr.
  const uint32_t depth = personality().queue_sizes_as_requested ? rxe_like_depth(a.max_wr) : a.max_wr;
  ParentDomain* domain = parent_domain_of(pd);
  auto srq = std::make_unique<Srq>(*p, *attr, depth, max_sge, domain);
  srq->ibv()->pd = pd;  // the parent domain, when given one
  srq->charge = std::move(charge);
  const uint32_t handle = p->context().handles.add(ObjectType::srq, srq->ibv());
  try {
    srq->srqn = register_srq(p->context().device(), srq.get());
  } catch (...) {
    p->context().handles.remove(handle);
    throw;
  }
  srq->ibv()->handle = handle;
  trace_object(p->context().device(), "create_srq", srq->srqn);
  // The caller learns the sizes: the depth asked for, which a.max_wr (the
  // caller's own field) already holds, whichever the personality.
  attr->attr.max_wr = a.max_wr;
  attr->attr.max_sge = max_sge;
  p->users.get();
  if (domain) domain->users.get();
  return srq.release()->ibv();
}

int EmuProvider::modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int attr_mask) {
  if (int err = lookup_write(srq->context, ObjectType::srq, srq, srq->handle)) return kernel_error(err);
  return Srq::from(srq)->modify(attr, attr_mask);
}

int EmuProvider::query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  if (int err = lookup_write(srq->context, ObjectType::srq, srq, srq->handle)) return kernel_error(err);
  Srq::from(srq)->query(attr);
  return 0;
}

int EmuProvider::destroy_srq(ibv_srq* srq) {
  if (int err = lookup(srq->context, ObjectType::srq, srq, srq->handle)) return kernel_error(err);
  Srq* s = Srq::from(srq);
  if (!unregister_srq_if_unused(s->context().device(), s)) return kernel_error(EBUSY);
  trace_object(s->context().device(), "destroy_srq", s->srqn);
  s->context().handles.remove(srq->handle);
  s->context().forget_async_events(srq);
  wait_events_acked(&srq->mutex, &srq->cond, &srq->events_completed, &s->events.reported);
  Pd& pd = s->pd();
  Xrcd* xrcd = s->xrcd;
  Cq* cq = s->cq;
  ParentDomain* domain = s->domain;
  delete s;
  pd.users.put();
  if (domain) domain->users.put();
  if (xrcd) xrcd->users.put();
  if (cq) cq->users.put();
  return 0;
}

// ---- address handles -----------------------------------------------------

ibv_ah* EmuProvider::create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (failed(pd->context)) return fail<ibv_ah>(EIO);
  Pd* p = Pd::from(pd);
  if (int err = lookup_write(pd->context, ObjectType::pd, pd, pd->handle)) return fail<ibv_ah>(err);
  if (int err = check_ah_attr(p->context(), *attr)) return fail<ibv_ah>(err);
  Charge charge = p->context().device().charge(ObjectType::ah);
  if (!charge) return fail<ibv_ah>(ENOMEM);  // max_ah AHs exist
  auto ah = std::make_unique<Ah>(*p, *attr);
  ah->ibv()->pd = pd;
  ah->charge = std::move(charge);
  ah->ibv()->handle = p->context().handles.add(ObjectType::ah, ah->ibv());
  p->users.get();
  trace_object(p->context().device(), "create_ah", ah->ibv()->handle);
  return ah.release()->ibv();
}

int EmuProvider::destroy_ah(ibv_ah* ah) {
  if (int err = lookup(ah->context, ObjectType::ah, ah, ah->handle)) return kernel_error(err);
  Ah* a = Ah::from(ah);
  Pd& pd = a->pd();
  trace_object(pd.context().device(), "destroy_ah", ah->handle);
  pd.context().handles.remove(ah->handle);
  delete a;
  pd.users.put();
  return 0;
}

int EmuProvider::init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                                 ibv_ah_attr* ah_attr) {
  std::memset(ah_attr, 0, sizeof *ah_attr);
  uint32_t flow_class = ntohl(grh->version_tclass_flow);
  ah_attr->grh.flow_label = flow_class & 0xfffff;
  ah_attr->dlid = static_cast<uint16_t>(wc->slid);
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  if (!(wc->wc_flags & IBV_WC_GRH)) return 0;
  ah_attr->is_global = 1;
  // RoCEv2 over IPv4 places the IPv4 header in the last 20 bytes of the GRH. As
  // rdma-core does, a header whose first word does not say IPv6 is IPv4 if the
  // IPv4 version says so; one that says IPv6 is still IPv4 if a 20-byte IPv4
  // header with a valid checksum sits there.
  const auto* ip4 = reinterpret_cast<const iphdr*>(reinterpret_cast<const uint8_t*>(grh) + 20);
  bool v4;
  if (((flow_class >> 28) & 0xf) != 6) {
    if (ip4->version != 4) {
      errno = EPROTONOSUPPORT;
      return -1;
    }
    v4 = true;
  } else if (ip4->ihl != 5) {
    v4 = false;
  } else {
    const auto* w = reinterpret_cast<const uint8_t*>(ip4);
    uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2) sum += static_cast<uint32_t>(w[i] << 8 | w[i + 1]);
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    v4 = sum == 0xffff;  // the checksum field included, a valid header sums to all ones
  }
  ibv_gid want{};
  ibv_gid_type_sysfs want_type = IBV_GID_TYPE_SYSFS_ROCE_V2;
  if (v4) {
    if (IN_CLASSD(ntohl(ip4->daddr))) {
      errno = EINVAL;
      return -1;
    }
    want.raw[10] = want.raw[11] = 0xff;
    std::memcpy(want.raw + 12, &ip4->daddr, 4);
    ah_attr->grh.dgid = ibv_gid{};
    ah_attr->grh.dgid.raw[10] = ah_attr->grh.dgid.raw[11] = 0xff;
    std::memcpy(ah_attr->grh.dgid.raw + 12, &ip4->saddr, 4);
    ah_attr->grh.hop_limit = ip4->ttl;
    ah_attr->grh.traffic_class = ip4->tos;
  } else {
    if (grh->dgid.raw[0] == 0xff) {
      errno = EINVAL;
      return -1;
    }
    ah_attr->grh.dgid = grh->sgid;
    if (grh->next_hdr == IPPROTO_UDP) {
      want_type = IBV_GID_TYPE_SYSFS_ROCE_V2;
    } else if (grh->next_hdr == 0x1b) {
      want_type = IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
    } else {
      errno = EPROTONOSUPPORT;
      return -1;
    }
    want = grh->dgid;
    ah_attr->grh.hop_limit = grh->hop_limit;
    ah_attr->grh.traffic_class = (flow_class >> 20) & 0xff;
  }
  // Find the local GID the packet was addressed to.
  for (int i = 0;; ++i) {
    ibv_gid g;
    ibv_gid_type_sysfs t;
    if (query_gid(context, port_num, i, &g) || query_gid_type(context, port_num, static_cast<unsigned>(i), &t))
      return -1;
    if (!std::memcmp(&g, &want, sizeof g) && t == want_type) {
      ah_attr->grh.sgid_index = static_cast<uint8_t>(i);
      return 0;
    }
  }
}

int EmuProvider::resolve_eth_l2_from_gid(ibv_context* context, ibv_ah_attr* attr, uint8_t eth_mac[6], uint16_t* vid) {
  ibv_gid sgid;
  if (int err = query_gid(context, attr->port_num, attr->grh.sgid_index, &sgid)) return err;
  // Emulated devices derive their MAC from their IPv4 address (identity_of):
  // from an IPv4-mapped DGID, or from a device's link-local one.
  const uint8_t* d = attr->grh.dgid.raw;
  static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  in_addr peer{};
  if (std::memcmp(d, v4mapped, 12) == 0)
    std::memcpy(&peer.s_addr, d + 12, 4);
  else if (!ipv4_in_ipv6(d, &peer) &&  // a device's IPv6 GID carries the same address
           !addr_of_port_gid(attr->grh.dgid, &peer))
    return -EINVAL;
  std::memcpy(eth_mac, identity_of(peer).mac, 6);
  if (vid) *vid = 0xffff;  // no VLAN
  return 0;
}

int EmuProvider::fork_init() { return 0; }

}  // namespace softverbs::emu
