#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "emu/device/caps.hpp"
#include "emu/device/fault_actions.hpp"
#include "emu/objects/import.hpp"
#include "emu/objects/objects.hpp"
#include "emu/qp/qp.hpp"
#include "emu/objects/ops.hpp"
#include "core/events.hpp"
#include "core/trace.hpp"
#include "faults/scenario.hpp"

namespace softverbs::emu {
namespace {

// Waits for one token on an eventfd in semaphore mode, honouring O_NONBLOCK the
// application may have set on it (then EAGAIN), like a read of a kernel event file.
int take_token(int fd) {
  uint64_t v;
  for (;;) {
    ssize_t n = ::read(fd, &v, sizeof v);
    if (n == sizeof v) return 0;
    if (n < 0 && errno == EINTR) continue;
    return -1;  // errno from read
  }
}

void give_token(int fd) {
  uint64_t one = 1;
  while (::write(fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

}  // namespace

Context::Context(Device& device) : file_(new_context_file(device)), handles(file_->table), device_(device) {
  const int fd = open_context_fd(*file_);
  try {
    init(fd);
  } catch (...) {
    ::close(fd);  // ours; an imported context's fd stays the caller's when the import fails
    throw;
  }
}

Context::Context(std::shared_ptr<ContextFile> file, int cmd_fd)
    : file_(std::move(file)), handles(file_->table), device_(*file_->device) {
  init(cmd_fd);
}

void Context::init(int cmd_fd) {
  handle_.owner = this;
  verbs_context& v = handle_.pub;
  v.sz = sizeof(verbs_context);
  ibv_context& c = v.context;
  c.device = device_.ibv();
  c.cmd_fd = cmd_fd;
  c.async_fd = ::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (c.async_fd < 0) throw std::system_error(errno, std::generic_category());
  c.num_comp_vectors = caps::kNumCompVectors;
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  install_context_ops(&v);
  device_.add_context(this);
}

Context::~Context() {
  device_.remove_context(this);
  ::close(handle_.pub.context.async_fd);
  if (handle_.pub.context.cmd_fd >= 0) ::close(handle_.pub.context.cmd_fd);
  pthread_mutex_destroy(&handle_.pub.context.mutex);
}

void Context::post_async_event(const ibv_async_event& event) {
  if (trace::on()) {
    const bool qp = event_element(event.event_type) == EventElement::qp;
    trace::event(device_.clock(), device_.name(), "async", faults::event_name(event.event_type),
                 qp ? event.element.qp->qp_num : 0);
  }
  faults::FaultDecision d;
  faults::VerbFilter& engine = device_.verb_filter();
  if (engine.verbs_active()) {
    // Async event rules (docs/faults.md): the event can be lost, or set off a
    // port or device change after it; those run from the progress thread, since
    // events are raised with engine locks held.
    std::optional<uint32_t> qpn;
    if (event_element(event.event_type) == EventElement::qp) qpn = event.element.qp->qp_num;
    d = engine.decide(
        faults::VerbFacts{faults::VerbPoint::async_event, device_.name(), qpn, std::nullopt, event.event_type});
    if (d.fired && d.action == faults::FaultAction::drop) {
      device_.counters().faults_verbs.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  {
    std::lock_guard lock(async_mu_);
    // Checked under the queue's lock, so that an event raised while the
    // handle is being destroyed is either dropped here or forgotten there.
    if (event_element(event.event_type) == EventElement::qp) {
      const Qp* q = Qp::from(event.element.qp);  // null for a raised event naming no QP
      if (q && q->events_detached()) return;
    }
    async_events_.push_back(event);
  }
  give_token(handle_.pub.context.async_fd);
  if (d.fired) apply_fault_later(device_, d);
}

int Context::get_async_event(ibv_async_event* event) {
  for (;;) {
    // Under virtual time the wait runs the engine's work (docs/simulation.md).
    device_.scheduler().wait_readable(handle_.pub.context.async_fd);
    if (take_token(handle_.pub.context.async_fd) < 0) return -1;
    std::lock_guard lock(async_mu_);
    if (async_events_.empty()) continue;  // its element was destroyed meanwhile
    *event = async_events_.front();
    async_events_.pop_front();
    // Count the event as reported on its element: destroying the element waits
    // until the application has acknowledged it.
    switch (event_element(event->event_type)) {
      case EventElement::cq: {
        ibv_cq* cq = event->element.cq;
        pthread_mutex_lock(&cq->mutex);
        ++Cq::from(cq)->events.reported;
        pthread_mutex_unlock(&cq->mutex);
        break;
      }
      case EventElement::qp: {
        ibv_qp* qp = event->element.qp;
        pthread_mutex_lock(&qp->mutex);
        ++Qp::from(qp)->events.reported;
        pthread_mutex_unlock(&qp->mutex);
        break;
      }
      case EventElement::srq: {
        ibv_srq* srq = event->element.srq;
        pthread_mutex_lock(&srq->mutex);
        ++Srq::from(srq)->events.reported;
        pthread_mutex_unlock(&srq->mutex);
        break;
      }
      default:
        break;
    }
    return 0;
  }
}

void Context::forget_async_events(const void* obj) {
  std::lock_guard lock(async_mu_);
  std::erase_if(async_events_, [obj](const ibv_async_event& e) {
    return e.element.qp == obj || e.element.cq == obj || e.element.srq == obj;
  });
}

// ---------------------------------------------------------------------------

CompChannel::CompChannel(Context& ctx, int fd) : ctx_(ctx) {
  handle_.owner = this;
  handle_.pub.context = ctx.ibv();
  handle_.pub.fd = fd;
  handle_.pub.refcnt = 0;
}

CompChannel::~CompChannel() { ::close(handle_.pub.fd); }

void CompChannel::notify(Cq* cq) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(cq);
  }
  give_token(handle_.pub.fd);
}

int CompChannel::get_event(Cq** cq) {
  for (;;) {
    ctx_.device().scheduler().wait_readable(handle_.pub.fd);
    if (take_token(handle_.pub.fd) < 0) return -1;
    std::lock_guard lock(mu_);
    if (events_.empty()) continue;  // its CQ was destroyed meanwhile
    *cq = events_.front();
    events_.pop_front();
    return 0;
  }
}

void CompChannel::forget(Cq* cq) {
  std::lock_guard lock(mu_);
  std::erase(events_, cq);
}

}  // namespace softverbs::emu
