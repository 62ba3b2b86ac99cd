#include "hw/namespace.hpp"

#include <dlfcn.h>
#include <gnu/lib-names.h>
#include <link.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/env.hpp"
#include "core/log.hpp"

#ifndef SV_HW_DEFAULT_LIBIBVERBS
#define SV_HW_DEFAULT_LIBIBVERBS "/usr/lib/x86_64-linux-gnu/libibverbs.so.1"
#endif

namespace softverbs::hw {
namespace {

std::atomic<Namespace*> g_current{nullptr};

// What the namespace sees instead of our SOFTVERBS_BACKEND. rdma-core ignores the
// variable; a copy of softverbs loaded as "the real library" (the hw-over-emu
// test setup) reads it and must serve emulated devices rather than load yet
// another namespace.
char kBackendOverride[] = "SOFTVERBS_BACKEND=emu";
constexpr char kBackendPrefix[] = "SOFTVERBS_BACKEND=";

// Any function of this library: dladdr on it names the file we were loaded from.
void self_anchor() {}

// The file this code was loaded from: our libibverbs.so.1, or the executable when
// the backend is linked into a program directly.
bool stat_self(struct stat* st) {
  Dl_info info{};
  link_map* map = nullptr;
  if (!dladdr1(reinterpret_cast<void*>(&self_anchor), &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP))
    return false;
  const char* file = map && map->l_name && *map->l_name ? map->l_name : "/proc/self/exe";
  return ::stat(file, st) == 0;
}

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dynamic loader error";
}

}  // namespace

Namespace* Namespace::current() noexcept { return g_current.load(std::memory_order_acquire); }

Namespace* Namespace::get() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = env::hw_libibverbs();
    std::string path = env && *env ? env : SV_HW_DEFAULT_LIBIBVERBS;

    if (path.front() != '/') {
      // Never a bare soname or a relative path: the loader would search
      // LD_LIBRARY_PATH, where softverbs' own libibverbs.so.1 usually comes first.
      SV_LOG(kError, "SOFTVERBS_HW_LIBIBVERBS=%s: not an absolute path; no hw devices", path.c_str());
      return;
    }
    struct stat target {};
    if (::stat(path.c_str(), &target) != 0) {
      SV_LOG(kDebug, "hw: cannot use %s: %s; no hw devices", path.c_str(), std::strerror(errno));
      return;
    }
    struct stat self {};
    if (stat_self(&self) && same_file(self, target)) {
      SV_LOG(kError,
             "hw: %s is softverbs' own libibverbs.so.1, not rdma-core's; no hw devices "
             "(set SOFTVERBS_HW_LIBIBVERBS to the real library)",
             path.c_str());
      return;
    }

    // Deliberately never deleted once loaded: real objects handed to the
    // application stay valid until exit, whatever order static destructors run in.
    auto* ns = new Namespace;
    std::string why;
    if (!ns->load(path, &why)) {
      SV_LOG(kDebug, "hw: cannot use %s: %s; no hw devices", path.c_str(), why.c_str());
      ns->unload();
      delete ns;
      return;
    }
    SV_LOG(kDebug, "hw: loaded %s into its own link namespace", path.c_str());
    g_current.store(ns, std::memory_order_release);
  });
  return current();
}

bool Namespace::load(const std::string& path, std::string* why) {
  path_ = path;
  // ld.so serves threads of every namespace from our libc's malloc (dynamic TLS
  // blocks, allocated in __tls_get_addr), and our libc's malloc takes no lock
  // while __libc_single_threaded says the process never had a second thread,
  // which stays true when only the namespace's libc creates threads (the inner
  // emulator's progress thread, with the hw-over-emu setup): the two threads
  // then corrupt our heap. A thread of our own, created once, clears the flag
  // for good.
  pthread_t thread;
  if (pthread_create(
          &thread, nullptr, [](void*) -> void* { return nullptr; }, nullptr) == 0)
    pthread_join(thread, nullptr);
  // The namespace's libc comes first, alone, so that its environment can be set
  // before any constructor of the real library (or of what it loads) runs.
  libc_ = dlmopen(LM_ID_NEWLM, LIBC_SO, RTLD_NOW | RTLD_LOCAL);
  if (!libc_) {
    *why = "cannot create a link namespace: " + dl_error();
    return false;
  }
  if (dlinfo(libc_, RTLD_DI_LMID, &lmid_) != 0) {
    *why = "dlinfo: " + dl_error();
    return false;
  }
  errno_location_ = reinterpret_cast<int* (*)()>(dlsym(libc_, "__errno_location"));
  environ_ = static_cast<char***>(dlsym(libc_, "environ"));
  if (!errno_location_ || !environ_) {
    *why = "the namespace's " LIBC_SO " lacks __errno_location or environ";
    return false;
  }
  sync_environ();

  handle_ = dlmopen(lmid_, path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    *why = dl_error();
    return false;
  }
  return resolve(why);
}

bool Namespace::resolve(std::string* why) {
  // dlvsym with the default version: the symbol a program linked against rdma-core
  // 44 binds to. A library lacking a required one is not rdma-core's libibverbs.
  bool complete = true;
  for_each_symbol(fn_, [&](const ForwardedSymbol& sym, auto& slot) {
    if (!complete) return;
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlvsym(handle_, sym.name, sym.version));
    if (slot) return;
    if (sym.required) {
      *why = std::string("no ") + sym.name + "@" + sym.version + " in it (not rdma-core's libibverbs.so.1)";
      complete = false;
      return;
    }
    SV_LOG(kDebug, "hw: %s has no %s@%s; that verb fails with EOPNOTSUPP", path_.c_str(), sym.name, sym.version);
  });
  if (!complete) return false;

  // The symbol must come from the file we were pointed at, not from something it
  // pulled in (a library whose dependencies define the verbs is not "the" library).
  Dl_info info{};
  struct stat found {
  }, target{};
  if (dladdr(reinterpret_cast<void*>(fn_.get_device_list), &info) && info.dli_fname &&
      ::stat(info.dli_fname, &found) == 0 && ::stat(path_.c_str(), &target) == 0 && !same_file(found, target)) {
    *why = std::string("its ibv_get_device_list comes from ") + info.dli_fname;
    return false;
  }
  return true;
}

void* Namespace::load_library(const std::string& path, std::string* why) {
  // Constructors of the new library run in the namespace: they see our
  // environment as it is now, like every forwarded call.
  Call scope(*this);
  void* handle = dlmopen(lmid_, path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) *why = dl_error();
  return handle;
}

void Namespace::unload() noexcept {
  if (handle_) dlclose(handle_);
  // The namespace's libc may stay loaded after dlclose: it must not keep
  // pointing at environment arrays that die with this object.
  static char* empty_environ[] = {nullptr};
  if (environ_) *environ_ = empty_environ;
  if (libc_) dlclose(libc_);
  handle_ = libc_ = nullptr;
  environ_ = nullptr;
  errno_location_ = nullptr;
}

void Namespace::enter() noexcept {
  int saved = errno;
  sync_environ();
  *errno_location_() = saved;
}

void Namespace::leave() noexcept { errno = *errno_location_(); }

namespace {

// True if environ holds exactly the pointers of the NULL-terminated snapshot.
bool same_environ(const std::vector<char*>& snapshot, char** environ_now) {
  const char* const* s = snapshot.data();
  if (!environ_now) return s[0] == nullptr;
  size_t i = 0;
  while (s[i] && s[i] == environ_now[i]) ++i;
  return s[i] == environ_now[i];
}

}  // namespace

void Namespace::sync_environ() noexcept {
  // Before every call: the namespace's libc took a snapshot of the environment
  // when it was loaded and would never see a later setenv() of the application
  // (rdma-core reads its variables, e.g. RDMAV_FORK_SAFE, when it needs them).
  // Comparing the pointer array is enough to notice setenv/putenv/unsetenv: each
  // of them changes an entry or the array, and in-place edits of a string need no
  // sync because both sides share the string.
  const EnvSnapshot* current = env_current_.load(std::memory_order_acquire);
  if (current && same_environ(current->ours, ::environ)) return;
  try {
    std::lock_guard lock(env_mu_);
    current = env_current_.load(std::memory_order_acquire);
    char** ours = ::environ;
    if (current && same_environ(current->ours, ours)) return;  // another thread did it

    EnvSnapshot snap;
    size_t n = 0;
    while (ours && ours[n]) ++n;
    snap.ours.assign(ours, ours + n);
    snap.ours.push_back(nullptr);
    snap.given.reserve(n + 2);
    for (size_t i = 0; i < n; ++i)
      if (std::strncmp(ours[i], kBackendPrefix, sizeof kBackendPrefix - 1) != 0) snap.given.push_back(ours[i]);
    snap.given.push_back(kBackendOverride);
    snap.given.push_back(nullptr);
    env_snapshots_.push_back(std::move(snap));
    *environ_ = env_snapshots_.back().given.data();
    env_current_.store(&env_snapshots_.back(), std::memory_order_release);
  } catch (...) {
    // Out of memory: the namespace keeps the environment it had.
  }
}

}  // namespace softverbs::hw
