// Completion queues: the ring, overrun, arming, cleaning and resizing (IBTA 11.4).
#include <algorithm>
#include <bit>
#include <cerrno>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "emu/device/caps.hpp"
#include "emu/device/personality.hpp"
#include "emu/objects/domain.hpp"
#include "emu/objects/objects.hpp"
#include "emu/objects/ops.hpp"
#include "fabric/timer.hpp"

namespace softverbs::emu {
namespace {

// The completion fields that carry the time of a completion.
constexpr uint64_t kTimestampFlags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

// ConnectX sizes a CQ to a power of two and reports one entry less.
int cq_depth_for(int cqe) { return static_cast<int>(std::bit_ceil(static_cast<unsigned>(cqe) + 1)) - 1; }

}  // namespace

Cq::Cq(Context& ctx, int cqe, void* cq_context, CompChannel* channel, uint64_t wc_flags, ParentDomain* domain)
    : ctx_(ctx), channel_(channel), domain_(domain) {
  handle_.owner = this;
  int depth = cq_depth_for(cqe);
  // As mlx5: the ring's buffer, then its doorbell record.
  ring_mem_ = ring_buffer(depth);
  ring_ = reinterpret_cast<Cqe*>(ring_mem_.data());
  ring_size_ = static_cast<size_t>(depth);
  if (domain && domain->custom_alloc())
    doorbell_ = QueueBuffer(domain, kDoorbellSize, kDoorbellSize, resource_type_dbr());
  ibv_cq_ex& c = handle_.pub;
  c.context = ctx.ibv();
  c.channel = channel ? channel->ibv() : nullptr;
  c.cq_context = cq_context;
  c.handle = 0;
  c.cqe = depth;
  pthread_mutex_init(&c.mutex, nullptr);
  pthread_cond_init(&c.cond, nullptr);
  c.comp_events_completed = 0;
  c.async_events_completed = 0;
  wc_flags_ = wc_flags;
  install_cq_ex_ops(&c);
}

QueueBuffer Cq::ring_buffer(int depth) {
  static_assert(std::is_trivially_copyable_v<Cqe> && std::is_trivially_destructible_v<Cqe>);
  QueueBuffer buf(domain_, static_cast<size_t>(depth) * sizeof(Cqe), kQueueAlign, resource_type_cq());
  std::uninitialized_value_construct_n(reinterpret_cast<Cqe*>(buf.data()), static_cast<size_t>(depth));
  return buf;
}

void Cq::push_later(const ibv_wc& wc, bool solicited, uint32_t delay_us) {
  std::lock_guard lock(mu_);
  delayed_.push_back({ctx_.device().clock().now() + std::chrono::microseconds(delay_us), wc, solicited});
  if (!delay_timer_) delay_timer_ = std::make_shared<EngineTimer>(ctx_.device().scheduler(), [this] { push_due(); });
  delay_timer_->arm_at(delayed_.back().due);
}

void Cq::push_due() {
  std::vector<Delayed> due;
  {
    std::lock_guard lock(mu_);
    const auto now = ctx_.device().clock().now();
    auto it = std::stable_partition(delayed_.begin(), delayed_.end(), [now](const Delayed& d) { return d.due <= now; });
    due.assign(delayed_.begin(), it);
    delayed_.erase(delayed_.begin(), it);
    if (!delayed_.empty()) {
      auto next = std::min_element(delayed_.begin(), delayed_.end(),
                                   [](const Delayed& a, const Delayed& b) { return a.due < b.due; });
      delay_timer_->arm_at(next->due);
    }
  }
  for (const Delayed& d : due) push(d.wc, d.solicited);
}

Cq::~Cq() {
  if (delay_timer_) delay_timer_->detach();
  pthread_mutex_destroy(&handle_.pub.mutex);
  pthread_cond_destroy(&handle_.pub.cond);
}

int Cq::depth() const { return static_cast<int>(ring_size_); }

size_t Cq::outstanding() {
  std::lock_guard lock(mu_);
  return static_cast<size_t>(tail_ - head_);
}

bool Cq::push(const ibv_wc& wc, bool solicited) { return push_n(&wc, 1, solicited) == 1; }

size_t Cq::push_n(const ibv_wc* wcs, size_t n, bool solicited) {
  // Several completions under one lock (a QP retiring a run of acknowledged
  // WQEs): each is added exactly as push() adds one, in order; an overrun
  // stops the run, as it would stop single pushes (the CQ takes no more).
  bool raise = false;
  size_t pushed = 0;
  {
    std::lock_guard lock(mu_);
    for (; pushed < n; ++pushed) {
      const ibv_wc& wc = wcs[pushed];
      if (overrun_) break;  // a CQ in error takes no more completions
      if (tail_ - head_ >= ring_size_ && ignore_overrun_) {
        // With overrun checking off (IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN) the device
        // writes on into its ring as ConnectX does: the oldest unpolled entry is
        // overwritten, and the CQ reports nothing.
        ++head_;
      } else if (tail_ - head_ >= ring_size_) {
        // Overrun (IBTA 11.4.2.1): the CQ goes to the error state, reported once by
        // an affiliated asynchronous error. What it holds can still be polled.
        overrun_ = true;
        ibv_async_event ev{};
        ev.element.cq = ibv();
        ev.event_type = IBV_EVENT_CQ_ERR;
        ctx_.post_async_event(ev);
        break;
      }
      // The clock is read only for a CQ whose completions carry a timestamp
      // (ibv_create_cq_ex's IBV_WC_EX_WITH_COMPLETION_TIMESTAMP*): a clock read
      // per completion is a measurable share of the message rate otherwise.
      const uint64_t ts = (wc_flags_ & kTimestampFlags) ? to_ns(ctx_.device().clock().wall_now()) : 0;
      ring_[tail_ % ring_size_] = Cqe{wc, ts};
      ++tail_;
      // An armed CQ raises one event: for any completion when armed with
      // solicited_only=0; only for solicited or failed ones otherwise (IBTA 11.4.2.2).
      if (armed_ == 1 ||
          (armed_ == 2 && (solicited || (wc.status != IBV_WC_SUCCESS && personality().error_wakes_solicited)))) {
        armed_ = 0;
        raise = true;
      }
    }
  }
  if (raise && channel_) channel_->notify(this);
  return pushed;
}

bool Cq::pop_locked(Cqe* out) {
  if (head_ == tail_) return false;
  *out = ring_[head_ % ring_size_];
  ++head_;
  return true;
}

int Cq::poll(int n, ibv_wc* wc) {
  if (n < 0) return -EINVAL;  // mlx5 returns a negative value on a bad argument
  std::lock_guard lock(mu_);
  int got = 0;
  Cqe e;
  while (got < n && pop_locked(&e)) wc[got++] = e.wc;
  return got;
}

void Cq::clean(uint32_t qpn) {
  // ConnectX's driver does the same on the way to RESET and in destroy
  // (mlx5's __mlx5_cq_clean): a QP that comes back finds none of its old
  // completions, and a destroyed one leaves none behind naming its number.
  std::lock_guard lock(mu_);
  uint64_t kept = head_;
  for (uint64_t i = head_; i < tail_; ++i) {
    const Cqe& e = ring_[i % ring_size_];
    if (e.wc.qp_num == qpn) continue;
    if (kept != i) ring_[kept % ring_size_] = e;
    ++kept;
  }
  tail_ = kept;
  std::erase_if(delayed_, [qpn](const Delayed& d) { return d.wc.qp_num == qpn; });
}

int Cq::arm(int solicited_only) {
  std::lock_guard lock(mu_);
  // Arming "next completion" supersedes "solicited only", never the other way round.
  if (solicited_only) {
    if (armed_ == 0) armed_ = 2;
  } else {
    armed_ = 1;
  }
  return 0;
}

int Cq::resize(int cqe) {
  if (cqe < caps::kMinCqe || cqe > personality().max_cqe) return EINVAL;
  std::lock_guard lock(mu_);
  size_t pending = static_cast<size_t>(tail_ - head_);
  int depth = cq_depth_for(cqe);
  if (static_cast<size_t>(depth) < pending) return EINVAL;  // would lose completions
  // The new ring comes from the same allocator (mlx5_resize_cq allocates its
  // resize buffer as the CQ's own).
  QueueBuffer mem = ring_buffer(depth);
  auto* ring = reinterpret_cast<Cqe*>(mem.data());
  for (size_t i = 0; i < pending; ++i) ring[i] = ring_[(head_ + i) % ring_size_];
  ring_mem_ = std::move(mem);
  ring_ = ring;
  ring_size_ = static_cast<size_t>(depth);
  head_ = 0;
  tail_ = pending;
  handle_.pub.cqe = depth;
  return 0;
}

int Cq::start_poll() {
  std::lock_guard lock(mu_);
  if (!pop_locked(&current_)) return ENOENT;
  handle_.pub.status = current_.wc.status;
  handle_.pub.wr_id = current_.wc.wr_id;
  return 0;
}

int Cq::next_poll() { return start_poll(); }

void Cq::end_poll() {}

}  // namespace softverbs::emu
