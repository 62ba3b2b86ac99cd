// The fault layer's verb rules on real devices (docs/hardware.md, "Faults on
// hw"): what can be done from above the real provider.
//
// While verb rules exist, the data path of every real context goes through hooks
// (post_send, post_recv, poll_cq) that apply post and completion rules, then call
// the real provider's functions; without rules the data path is untouched. Async
// events can be injected into a context (ibv_get_async_event returns them before
// the device's own), and async event rules can drop the device's events.
#pragma once

#include <infiniband/verbs.h>

namespace softverbs::hw {

// Follows the fault layer: hooks in while verb rules exist (idempotent).
void start_fault_hooks();
// Queues an event for ibv_get_async_event on ctx.
void inject_async_event(ibv_context* ctx, const ibv_async_event& event);
// An injected event for ctx, if any (true: *event is filled).
bool take_injected_event(ibv_context* ctx, ibv_async_event* event);
// True if `event` was an injected one (then it is acknowledged here: the real
// library never saw it and must not count it).
bool ack_injected_event(const ibv_async_event* event);
// The fault layer's async event rules on an event of the device: true to drop it.
bool drop_device_event(ibv_context* ctx, const ibv_async_event& event);
// Moves a real QP to the error state and injects IBV_EVENT_QP_FATAL.
int force_qp_error(ibv_qp* qp);
// Forgets what is queued for a context being closed.
void forget_context(ibv_context* ctx);

}  // namespace softverbs::hw
