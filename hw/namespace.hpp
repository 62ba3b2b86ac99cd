// The real rdma-core, loaded into a link namespace of its own.
//
// A second libibverbs.so.1 cannot share our namespace: its references to its own
// exported names would bind to ours (first definition wins) and its providers'
// DT_NEEDED libibverbs.so.1 would match us by soname. dlmopen(LM_ID_NEWLM) gives
// it a private copy of everything it loads, libc included. That private libc is
// what the rest of this file deals with: it has its own errno and its own
// environment, and its own malloc (memory crosses only by pointer, every release
// is forwarded).
#pragma once

#include <dlfcn.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "hw/symbols.hpp"

namespace softverbs::hw {

// Keeps the caller's errno across an internal call whose own errno nobody asked
// for: loading a library as a side effect of a verb, listing devices to answer
// an ownership question.
class KeepErrno {
 public:
  KeepErrno() noexcept : saved_(errno) {}
  ~KeepErrno() { errno = saved_; }
  KeepErrno(const KeepErrno&) = delete;
  KeepErrno& operator=(const KeepErrno&) = delete;

 private:
  int saved_;
};

class Namespace {
 public:
  // The loaded namespace, or NULL when the real library is unavailable (missing,
  // not rdma-core, or our own file); the reason is logged once. The first call
  // loads it; later calls return the same answer.
  static Namespace* get();

  // The loaded namespace if get() succeeded before, without trying to load.
  static Namespace* current() noexcept;

  const RealFunctions& fn() const noexcept { return fn_; }
  const std::string& path() const noexcept { return path_; }
  Lmid_t lmid() const noexcept { return lmid_; }

  // Loads another library of the real rdma-core into this namespace (librdmacm):
  // its libibverbs.so.1 dependency is then the real library loaded here, found
  // by soname. NULL with *why set on failure. The handle is never closed.
  void* load_library(const std::string& path, std::string* why);

  // Brackets one call into the namespace: the namespace sees our current
  // environment and our errno on entry, and we see its errno on return. This is
  // what makes a forwarded verb indistinguishable from the real one called in
  // our own namespace.
  class Call {
   public:
    explicit Call(Namespace& ns) noexcept : ns_(ns) { ns_.enter(); }
    ~Call() { ns_.leave(); }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    Namespace& ns_;
  };

  template <class R, class... P, class... A>
  R call(R (*fn)(P...), A&&... args) {
    Call scope(*this);
    return fn(std::forward<A>(args)...);
  }

 private:
  Namespace() = default;
  bool load(const std::string& path, std::string* why);
  void unload() noexcept;
  bool resolve(std::string* why);

  void enter() noexcept;
  void leave() noexcept;
  void sync_environ() noexcept;

  std::string path_;
  void* libc_ = nullptr;    // the namespace's libc.so.6
  void* handle_ = nullptr;  // the real libibverbs.so.1
  Lmid_t lmid_ = LM_ID_BASE;
  int* (*errno_location_)() = nullptr;
  char*** environ_ = nullptr;  // the namespace libc's environ variable
  RealFunctions fn_;

  // Environment bridge. The namespace gets an array of its own that holds the
  // same string pointers as ours (so in-place edits of a string are seen as they
  // are), minus SOFTVERBS_BACKEND, plus SOFTVERBS_BACKEND=emu. Checking that
  // ours is unchanged is lock-free (it runs before every call); rebuilding takes
  // env_mu_. Snapshots are kept until exit: a thread may still be comparing
  // against one, or reading an array inside the namespace, when the next is
  // installed. One is added per call that finds the environment changed.
  struct EnvSnapshot {
    std::vector<char*> ours;   // our environ's pointers, NULL-terminated
    std::vector<char*> given;  // what the namespace's environ points to
  };
  std::mutex env_mu_;
  std::deque<EnvSnapshot> env_snapshots_;
  std::atomic<const EnvSnapshot*> env_current_{nullptr};
};

}  // namespace softverbs::hw
