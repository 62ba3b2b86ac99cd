// The hw CM passthrough (hw/cm_provider.hpp): the distribution's librdmacm.so.1
// loaded beside the real libibverbs, in its link namespace. On this machine
// class (no RDMA device, no /dev/infiniband/rdma_cm) every call that needs the
// CM fails; each one is compared, result and errno, with the same call made on
// the real librdmacm directly, in a child process that dlopens it normally.
// Also: fail-soft loading, and the real librdmacm over the hw-test copy of our
// own library (it then lists the emulated devices the hw verbs provider lists).
// Each suite runs in its own process (tests/hw/CMakeLists.txt).
#include <dlfcn.h>
#include <rdma/rdma_cma.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "core/cm_provider.hpp"
#include "hw/cm_provider.hpp"
#include "hw/namespace.hpp"
#include "hw_test.hpp"

namespace {

using softverbs::CmProvider;
using softverbs::hw::HwCmProvider;

// What a call did: its result (0/-1, or 1 for a non-NULL pointer), errno when it
// failed, and a count where the call returns one.
struct Outcome {
  long result = 0;
  int err = 0;
  int count = 0;
  bool operator==(const Outcome&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  return os << "{result " << o.result << ", errno " << o.err << " (" << std::strerror(o.err) << "), count " << o.count
            << "}";
}

// The calls every test makes, on any implementation of the CM API: each cleans
// up what it created, so a machine with an RDMA CM runs them too.
template <class Api>
Outcome create_event_channel(Api& api) {
  errno = 0;
  rdma_event_channel* ch = api.create_event_channel();
  Outcome o{ch ? 1 : 0, ch ? 0 : errno, 0};
  if (ch) api.destroy_event_channel(ch);
  return o;
}

template <class Api>
Outcome create_id_without_channel(Api& api) {
  rdma_cm_id* id = nullptr;
  errno = 0;
  int rc = api.create_id(nullptr, &id, nullptr, RDMA_PS_TCP);
  Outcome o{rc, rc ? errno : 0, 0};
  if (rc == 0) api.destroy_id(id);
  return o;
}

template <class Api>
Outcome getaddrinfo_loopback(Api& api) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* res = nullptr;
  errno = 0;
  int rc = api.getaddrinfo("127.0.0.1", "7471", &hints, &res);
  Outcome o{rc, rc ? errno : 0, 0};
  if (rc == 0) api.freeaddrinfo(res);
  return o;
}

template <class Api>
Outcome get_devices(Api& api) {
  int num = -1;
  errno = 0;
  ibv_context** list = api.get_devices(&num);
  Outcome o{list ? 1 : 0, list ? 0 : errno, num};
  if (list) api.free_devices(list);
  return o;
}

// The real librdmacm called directly, in the base namespace of a child process:
// the CM API as a program linked with -lrdmacm sees it.
struct DirectLibrary {
  void* handle = nullptr;
  template <class Fn>
  Fn* sym(const char* name) {
    return reinterpret_cast<Fn*>(dlvsym(handle, name, "RDMACM_1.0"));
  }
  rdma_event_channel* create_event_channel() {
    return sym<decltype(rdma_create_event_channel)>("rdma_create_event_channel")();
  }
  void destroy_event_channel(rdma_event_channel* c) {
    sym<decltype(rdma_destroy_event_channel)>("rdma_destroy_event_channel")(c);
  }
  int create_id(rdma_event_channel* c, rdma_cm_id** id, void* ctx, rdma_port_space ps) {
    return sym<decltype(rdma_create_id)>("rdma_create_id")(c, id, ctx, ps);
  }
  int destroy_id(rdma_cm_id* id) { return sym<decltype(rdma_destroy_id)>("rdma_destroy_id")(id); }
  int getaddrinfo(const char* n, const char* s, const rdma_addrinfo* h, rdma_addrinfo** r) {
    return sym<decltype(rdma_getaddrinfo)>("rdma_getaddrinfo")(n, s, h, r);
  }
  void freeaddrinfo(rdma_addrinfo* r) { sym<decltype(rdma_freeaddrinfo)>("rdma_freeaddrinfo")(r); }
  ibv_context** get_devices(int* n) { return sym<decltype(rdma_get_devices)>("rdma_get_devices")(n); }
  void free_devices(ibv_context** l) { sym<decltype(rdma_free_devices)>("rdma_free_devices")(l); }
};

// Runs fn on the real librdmacm in a child process (this process's namespace
// already holds the passthrough's copies; the child's base namespace gets fresh
// ones, the real libibverbs first so that librdmacm's dependency is it).
template <class Fn>
Outcome direct(Fn fn) {
  int fds[2];
  if (pipe(fds) != 0) return {-2, errno, 0};
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    Outcome o{-3, 0, 0};
    if (dlopen(SV_REAL_LIB, RTLD_NOW | RTLD_GLOBAL)) {
      DirectLibrary lib{dlopen(SV_REAL_RDMACM, RTLD_NOW)};
      if (lib.handle) o = fn(lib);
    }
    (void)!write(fds[1], &o, sizeof o);
    _exit(0);
  }
  close(fds[1]);
  Outcome o{-4, 0, 0};
  if (read(fds[0], &o, sizeof o) != static_cast<ssize_t>(sizeof o)) o = {-5, 0, 0};
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return o;
}

void require_real_library_env() {
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", "");
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBRDMACM", "");
}

// First in its process: loading the library is a side effect of the first CM
// call and must not disturb the errno that call reports.
TEST(HwCm, LoadingKeepsTheCallersErrno) {
  require_real_library_env();
  errno = ERANGE;
  HwCmProvider* cm = HwCmProvider::get();
  EXPECT_EQ(errno, ERANGE);
  ASSERT_NE(cm, nullptr);
  EXPECT_EQ(softverbs::hw_cm_provider(), cm);
  EXPECT_STREQ(cm->name(), "hw");
  EXPECT_EQ(cm->path(), SV_REAL_RDMACM);
}

TEST(HwCm, LoadsIntoTheNamespaceOfTheRealLibibverbs) {
  require_real_library_env();
  HwCmProvider* cm = HwCmProvider::get();
  ASSERT_NE(cm, nullptr);
  softverbs::hw::Namespace* ns = softverbs::hw::Namespace::current();
  ASSERT_NE(ns, nullptr);
  EXPECT_EQ(ns->path(), SV_REAL_LIB);

  Lmid_t lmid = LM_ID_BASE;
  ASSERT_EQ(dlinfo(cm->handle(), RTLD_DI_LMID, &lmid), 0);
  EXPECT_NE(lmid, LM_ID_BASE);
  EXPECT_EQ(lmid, ns->lmid());
  // Its libibverbs is the one the hw verbs provider forwards to.
  EXPECT_EQ(dlvsym(cm->handle(), "ibv_get_device_list", "IBVERBS_1.1"),
            reinterpret_cast<void*>(ns->fn().get_device_list));
  // And its functions are the file's own.
  EXPECT_TRUE(hwtest::same_file(hwtest::file_of(dlvsym(cm->handle(), "rdma_create_id", "RDMACM_1.0")), SV_REAL_RDMACM));
  // This process's base namespace has no librdmacm (nor libibverbs) of its own.
  EXPECT_EQ(dlopen("librdmacm.so.1", RTLD_NOLOAD | RTLD_NOW), nullptr);
}

TEST(HwCm, CreateEventChannelAsTheRealLibrary) {
  require_real_library_env();
  HwCmProvider* cm = HwCmProvider::get();
  ASSERT_NE(cm, nullptr);
  Outcome real = direct([](DirectLibrary& lib) { return create_event_channel(lib); });
  EXPECT_EQ(create_event_channel(*cm), real);
}

TEST(HwCm, CreateIdWithoutChannelAsTheRealLibrary) {
  require_real_library_env();
  HwCmProvider* cm = HwCmProvider::get();
  ASSERT_NE(cm, nullptr);
  Outcome real = direct([](DirectLibrary& lib) { return create_id_without_channel(lib); });
  EXPECT_EQ(create_id_without_channel(*cm), real);
}

TEST(HwCm, GetaddrinfoLoopbackAsTheRealLibrary) {
  require_real_library_env();
  HwCmProvider* cm = HwCmProvider::get();
  ASSERT_NE(cm, nullptr);
  Outcome real = direct([](DirectLibrary& lib) { return getaddrinfo_loopback(lib); });
  EXPECT_EQ(getaddrinfo_loopback(*cm), real);
}

TEST(HwCm, GetDevicesAsTheRealLibrary) {
  require_real_library_env();
  HwCmProvider* cm = HwCmProvider::get();
  ASSERT_NE(cm, nullptr);
  Outcome real = direct([](DirectLibrary& lib) { return get_devices(lib); });
  EXPECT_EQ(get_devices(*cm), real);
}

// The interface's defaults are librdmacm's answers on a machine without an
// RDMA CM: where the real library has none here, they must agree.
TEST(HwCm, DefaultsFailAsTheRealLibraryWithoutACm) {
  require_real_library_env();
  struct Bare final : CmProvider {
    const char* name() const noexcept override { return "bare"; }
  } bare;
  Outcome real = direct([](DirectLibrary& lib) { return create_event_channel(lib); });
  if (real.result != 0) {
    ::testing::Test::RecordProperty("real_cm", "present");
    return;  // this machine has an RDMA CM: nothing to compare against
  }
  EXPECT_EQ(create_event_channel(bare), real);
  EXPECT_EQ(create_id_without_channel(bare), direct([](DirectLibrary& lib) { return create_id_without_channel(lib); }));
  EXPECT_EQ(getaddrinfo_loopback(bare), direct([](DirectLibrary& lib) { return getaddrinfo_loopback(lib); }));
  EXPECT_EQ(get_devices(bare), direct([](DirectLibrary& lib) { return get_devices(lib); }));
}

// The real librdmacm over the hw-test copy of our libibverbs (emulated devices):
// it opens contexts on exactly the devices the hw verbs provider lists, which is
// what makes an id's contexts usable through the verbs passthrough.
TEST(HwCmOverEmu, RealLibrdmacmListsTheHwProvidersDevices) {
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", SV_HWTEST_LIB);
  HwCmProvider* cm = HwCmProvider::get();
  ASSERT_NE(cm, nullptr);
  // The device list the hw verbs provider forwards to (HwProvider::get_devices).
  softverbs::hw::Namespace* ns = softverbs::hw::Namespace::current();
  ASSERT_NE(ns, nullptr);
  int num_devices = 0;
  ibv_device** array = ns->call(ns->fn().get_device_list, &num_devices);
  ASSERT_NE(array, nullptr);
  std::vector<ibv_device*> devices(array, array + num_devices);
  ASSERT_EQ(devices.size(), 2u) << "SOFTVERBS_DEVICES=hw_roce/eth,hw_ib/ib";

  int num = -1;
  errno = 0;
  ibv_context** list = cm->get_devices(&num);
  ASSERT_NE(list, nullptr) << std::strerror(errno);
  ASSERT_EQ(num, 2);
  for (int i = 0; i < num; ++i) {
    ASSERT_NE(list[i], nullptr);
    EXPECT_NE(std::find(devices.begin(), devices.end(), list[i]->device), devices.end())
        << "context " << i << " is on a device the hw provider does not list";
  }
  EXPECT_EQ(list[num], nullptr);
  cm->free_devices(list);
  ns->call(ns->fn().free_device_list, array);

  // No kernel CM: the channel fails, with errno carried back from the namespace.
  errno = 0;
  rdma_event_channel* ch = cm->create_event_channel();
  if (ch) {
    cm->destroy_event_channel(ch);
  } else {
    EXPECT_NE(errno, 0);
  }
}

// ---- fail-soft ---------------------------------------------------------------

std::string load_capturing_log(HwCmProvider** out) {
  ::testing::internal::CaptureStderr();
  *out = HwCmProvider::get();
  return ::testing::internal::GetCapturedStderr();
}

TEST(HwCmMissingLibrary, NoProviderAndADebugMessage) {
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBRDMACM", "/nonexistent/librdmacm.so.1");
  HWTEST_REQUIRE_ENV("SOFTVERBS_LOG", "debug");
  HwCmProvider* cm = nullptr;
  const std::string log = load_capturing_log(&cm);
  EXPECT_EQ(cm, nullptr);
  EXPECT_EQ(softverbs::hw_cm_provider(), nullptr);
  EXPECT_NE(log.find("hw: cannot use /nonexistent/librdmacm.so.1: No such file or directory; no hw CM provider"),
            std::string::npos)
      << log;
}

TEST(HwCmFakeLibrary, NoProviderAndADebugMessage) {
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBRDMACM", SV_FAKE_LIB);
  HWTEST_REQUIRE_ENV("SOFTVERBS_LOG", "debug");
  HwCmProvider* cm = nullptr;
  const std::string log = load_capturing_log(&cm);
  EXPECT_EQ(cm, nullptr);
  EXPECT_NE(log.find("no rdma_create_event_channel@RDMACM_1.0 in it (not rdma-core's librdmacm.so.1)"),
            std::string::npos)
      << log;
  // The verbs passthrough is unaffected.
  EXPECT_NE(softverbs::hw::Namespace::current(), nullptr);
}

TEST(HwCmRelativePath, NoProviderAndAnError) {
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBRDMACM", "librdmacm.so.1");
  HWTEST_REQUIRE_ENV("SOFTVERBS_LOG", "");
  HwCmProvider* cm = nullptr;
  const std::string log = load_capturing_log(&cm);
  EXPECT_EQ(cm, nullptr);
  EXPECT_NE(log.find("SOFTVERBS_HW_LIBRDMACM=librdmacm.so.1: not an absolute path; no hw CM provider"),
            std::string::npos)
      << log;
}

TEST(HwCmWithoutLibibverbs, NoProviderAndADebugMessage) {
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", "/nonexistent/libibverbs.so.1");
  HWTEST_REQUIRE_ENV("SOFTVERBS_LOG", "debug");
  HwCmProvider* cm = nullptr;
  const std::string log = load_capturing_log(&cm);
  EXPECT_EQ(cm, nullptr);
  EXPECT_NE(log.find("no real libibverbs.so.1 to load it beside; no hw CM provider"), std::string::npos) << log;
}

}  // namespace
