// The CM providers of librdmacm.so.1 and the ownership maps (dispatch.hpp).
#include "abi/rdmacm/dispatch.hpp"

#include <infiniband/ib.h>
#include <sys/socket.h>

#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace softverbs::abi::cm {
namespace {

// One map per kind of object: the same address may be a channel of one
// provider and, after it was freed, an id of another.
class Owners {
 public:
  CmProvider* find(const void* obj) const {
    if (!obj) return nullptr;
    std::shared_lock lock(mu_);
    auto it = map_.find(obj);
    return it == map_.end() ? nullptr : it->second;
  }
  void note(const void* obj, CmProvider* p) {
    if (!obj) return;
    std::unique_lock lock(mu_);
    map_[obj] = p;
  }
  void forget(const void* obj) {
    std::unique_lock lock(mu_);
    map_.erase(obj);
  }

 private:
  mutable std::shared_mutex mu_;
  std::unordered_map<const void*, CmProvider*> map_;
};

// Never destroyed: a call made from another library's destructor at exit must
// still find its owner.
Owners& channels() {
  static auto* o = new Owners;
  return *o;
}
Owners& ids() {
  static auto* o = new Owners;
  return *o;
}
Owners& events() {
  static auto* o = new Owners;
  return *o;
}
Owners& addrinfos() {
  static auto* o = new Owners;
  return *o;
}

}  // namespace

const std::vector<CmProvider*>& providers() {
  static const std::vector<CmProvider*>* const list = [] {
    size_t n = 0;
    CmProvider* const* p = softverbs_private_cm_providers(kCmProviderInterface, &n);
    return p ? new std::vector<CmProvider*>(p, p + n) : new std::vector<CmProvider*>;
  }();
  return *list;
}

CmProvider* owner(const rdma_event_channel* channel) { return channels().find(channel); }
CmProvider* owner(const rdma_cm_id* id) { return ids().find(id); }
CmProvider* owner(const rdma_cm_event* event) { return events().find(event); }
CmProvider* owner(const rdma_addrinfo* res) { return addrinfos().find(res); }

void note(CmProvider* p, rdma_event_channel* channel) { channels().note(channel, p); }
void note(CmProvider* p, rdma_cm_id* id) {
  if (!id) return;
  ids().note(id, p);
  channels().note(id->channel, p);
}
void note(CmProvider* p, rdma_cm_event* event) {
  if (!event) return;
  events().note(event, p);
  note(p, event->id);
  note(p, event->listen_id);
}
void note(CmProvider* p, rdma_addrinfo* res) { addrinfos().note(res, p); }

void forget(const rdma_event_channel* channel) { channels().forget(channel); }
void forget(const rdma_cm_id* id) { ids().forget(id); }
void forget(const rdma_cm_event* event) { events().forget(event); }
void forget(const rdma_addrinfo* res) { addrinfos().forget(res); }

int addrlen(const sockaddr* addr) {
  if (!addr) return 0;
  switch (addr->sa_family) {
    case AF_INET:
      return sizeof(sockaddr_in);
    case AF_INET6:
      return sizeof(sockaddr_in6);
    case AF_IB:
      return sizeof(sockaddr_ib);
    default:
      return 0;
  }
}

}  // namespace softverbs::abi::cm
