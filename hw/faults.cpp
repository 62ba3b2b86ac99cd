// The verb-level fault rules on the hw backend (docs/hardware.md): hooks on the
// data path of patched contexts consult the fault engine's VerbFilter, and
// injected async events stand in for those the real device would raise.
#include "hw/faults.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "hw/context.hpp"
#include "core/clock.hpp"
#include "core/events.hpp"
#include "core/log.hpp"
#include "faults/filter.hpp"
#include "faults/process.hpp"

namespace softverbs::hw {
namespace {

using faults::FaultAction;
using faults::FaultDecision;
using faults::VerbFacts;
using faults::VerbFilter;
using faults::VerbPoint;

// What the hooks depend on: the verb rules and the clock that times delayed
// completions. The data path hooks are plain function pointers, so they reach
// these through here; assembled once, for the process, from its fault engine
// and the real clock.
struct HookDeps {
  VerbFilter& verbs;
  const Clock& clock;
};
const HookDeps& deps() {
  static const HookDeps d{faults::process_engine(), real_clock()};
  return d;
}

std::mutex g_mu;
// Injected events per context, and those handed out but not yet acknowledged.
std::unordered_map<ibv_context*, std::deque<ibv_async_event>>& injected() {
  static auto* m = new std::unordered_map<ibv_context*, std::deque<ibv_async_event>>;
  return *m;
}
std::vector<ibv_async_event>& handed_out() {
  static auto* v = new std::vector<ibv_async_event>;
  return *v;
}
// Completions a delay rule holds back, per CQ.
struct Held {
  Clock::time_point due;
  ibv_wc wc;
};
std::unordered_map<ibv_cq*, std::deque<Held>>& held() {
  static auto* m = new std::unordered_map<ibv_cq*, std::deque<Held>>;
  return *m;
}

const char* device_name(ibv_context* ctx) { return ctx->device->name; }

bool same_event(const ibv_async_event& a, const ibv_async_event& b) {
  return a.event_type == b.event_type && a.element.qp == b.element.qp;  // the union's widest member
}

// Side effects a verb rule can have on hw: the QP to the error state, an event.
// Port, device and packet actions need the emulator; they are logged and skipped.
void apply(const FaultDecision& d, ibv_qp* qp, ibv_context* ctx) {
  switch (d.action) {
    case FaultAction::qp_error:
      if (qp) force_qp_error(qp);
      return;
    case FaultAction::event: {
      ibv_async_event ev{};
      ev.event_type = static_cast<ibv_event_type>(d.event);
      switch (event_element(ev.event_type)) {
        case EventElement::qp:
          if (!qp) return;
          ev.element.qp = qp;
          break;
        case EventElement::cq:
          if (!qp) return;
          ev.element.cq = qp->send_cq;
          break;
        case EventElement::srq:
          if (!qp || !qp->srq) return;
          ev.element.srq = qp->srq;
          break;
        case EventElement::port:
          ev.element.port_num = d.port;
          break;
        case EventElement::device:
          break;
        case EventElement::wq:
          return;
      }
      inject_async_event(ctx, ev);
      return;
    }
    default:
      SV_LOG(kInfo, "fault rule %zu: action %.*s is not available on the hw backend", d.rule,
             static_cast<int>(faults::to_string(d.action).size()), faults::to_string(d.action).data());
      return;
  }
}

// The post rules for each work request of a chain: the first that fails the post
// ends it there, after the requests before it have gone to the real provider.
template <class Wr>
int hooked_post(VerbPoint verb, int (*real)(ibv_qp*, Wr*, Wr**), ibv_qp* qp, Wr* wr, Wr** bad_wr) {
  if (!real) return EINVAL;
  VerbFilter& faults = deps().verbs;
  if (faults.verbs_active()) {
    Wr* prev = nullptr;
    for (Wr* w = wr; w; prev = w, w = w->next) {
      std::optional<int> opcode;
      if constexpr (std::is_same_v<Wr, ibv_send_wr>) opcode = static_cast<int>(w->opcode);
      FaultDecision d = faults.decide(VerbFacts{verb, device_name(qp->context), qp->qp_num, opcode, {}});
      if (!d.fired) continue;
      if (d.action != FaultAction::fail) {
        apply(d, qp, qp->context);
        continue;
      }
      if (prev) {
        prev->next = nullptr;
        int rc = real(qp, wr, bad_wr);
        prev->next = w;
        if (rc) return rc;
      }
      *bad_wr = w;
      return d.error;
    }
  }
  return real(qp, wr, bad_wr);
}

int hooked_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  return hooked_post(VerbPoint::post_send, original_data_path(qp->context).post_send, qp, wr, bad_wr);
}

int hooked_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  return hooked_post(VerbPoint::post_recv, original_data_path(qp->context).post_recv, qp, wr, bad_wr);
}

// Completions held back whose time has come, into wc (at most n).
int take_due(ibv_cq* cq, int n, ibv_wc* wc) {
  std::lock_guard lock(g_mu);
  auto it = held().find(cq);
  if (it == held().end()) return 0;
  const auto now = deps().clock.now();
  int out = 0;
  auto& q = it->second;
  while (out < n && !q.empty() && q.front().due <= now) {
    wc[out++] = q.front().wc;
    q.pop_front();
  }
  if (q.empty()) held().erase(it);
  return out;
}

int hooked_poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  auto real = original_data_path(cq->context).poll_cq;
  if (!real) return -EINVAL;
  if (n <= 0) return real(cq, n, wc);
  int out = take_due(cq, n, wc);
  if (out == n) return out;
  int got = real(cq, n - out, wc + out);
  if (got < 0) return out ? out : got;
  VerbFilter& faults = deps().verbs;
  if (!faults.verbs_active()) return out + got;
  // Apply the completion rules to what the device returned, compacting in place.
  int kept = out;
  for (int i = out; i < out + got; ++i) {
    ibv_wc c = wc[i];
    FaultDecision d = faults.decide(
        VerbFacts{VerbPoint::completion, device_name(cq->context), c.qp_num, static_cast<int>(c.opcode), {}});
    if (d.fired) {
      if (d.action == FaultAction::drop) continue;
      if (d.action == FaultAction::delay) {
        std::lock_guard lock(g_mu);
        held()[cq].push_back({deps().clock.now() + std::chrono::microseconds(d.delay_us), c});
        continue;
      }
      if (d.action == FaultAction::status) {
        c.status = static_cast<ibv_wc_status>(d.wc_status);
      } else {
        apply(d, nullptr, cq->context);
      }
    }
    wc[kept++] = c;
  }
  return kept;
}

const DataPathOps kHooks{hooked_post_send, hooked_post_recv, hooked_poll_cq};

}  // namespace

void start_fault_hooks() {
  static std::once_flag once;
  std::call_once(once, [] {
    VerbFilter& faults = deps().verbs;
    faults.add_verbs_listener([](bool active) { set_data_path_hooks(active ? &kHooks : nullptr); });
    if (faults.verbs_active()) set_data_path_hooks(&kHooks);
  });
}

void inject_async_event(ibv_context* ctx, const ibv_async_event& event) {
  std::lock_guard lock(g_mu);
  injected()[ctx].push_back(event);
}

bool take_injected_event(ibv_context* ctx, ibv_async_event* event) {
  std::lock_guard lock(g_mu);
  auto it = injected().find(ctx);
  if (it == injected().end() || it->second.empty()) return false;
  *event = it->second.front();
  it->second.pop_front();
  handed_out().push_back(*event);
  return true;
}

bool ack_injected_event(const ibv_async_event* event) {
  std::lock_guard lock(g_mu);
  auto& v = handed_out();
  auto it = std::find_if(v.begin(), v.end(), [&](const ibv_async_event& e) { return same_event(e, *event); });
  if (it == v.end()) return false;
  v.erase(it);
  return true;
}

bool drop_device_event(ibv_context* ctx, const ibv_async_event& event) {
  VerbFilter& faults = deps().verbs;
  if (!faults.verbs_active()) return false;
  std::optional<uint32_t> qpn;
  if (event_element(event.event_type) == EventElement::qp) qpn = event.element.qp->qp_num;
  FaultDecision d =
      faults.decide(VerbFacts{VerbPoint::async_event, device_name(ctx), qpn, std::nullopt, event.event_type});
  if (!d.fired) return false;
  if (d.action == FaultAction::drop) return true;
  apply(d, event_element(event.event_type) == EventElement::qp ? event.element.qp : nullptr, ctx);
  return false;
}

int force_qp_error(ibv_qp* qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  int rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE);  // through the passthrough, as the application's
  if (rc) return rc;
  ibv_async_event ev{};
  ev.event_type = IBV_EVENT_QP_FATAL;
  ev.element.qp = qp;
  inject_async_event(qp->context, ev);
  return 0;
}

void forget_context(ibv_context* ctx) {
  std::lock_guard lock(g_mu);
  injected().erase(ctx);
  std::erase_if(held(), [ctx](const auto& kv) { return kv.first->context == ctx; });
}

}  // namespace softverbs::hw
