// The rdma-core functions the hw backend calls, each with the symbol version the
// real libibverbs.so.1 exports it under by default (the "@@" version in objdump
// -T; abi/verbs/libibverbs.map lists the same nodes). Looking them up with dlvsym
// and these versions gives exactly the implementation a program linked against
// rdma-core 44 would call, never a hidden 1.0 compatibility variant.
//
// Most are the verbs of core/verbs.def, each under the row's name and typed as
// the row's method; the few below are the others the backend needs. Required
// entries exist in every rdma-core release (IBVERBS_1.0/1.1): a library without
// them is not rdma-core's libibverbs and is not used. The others arrived later;
// an older real library may lack them, and the verb then fails as the provider
// interface's default does (EOPNOTSUPP) instead of the whole backend refusing to
// load.
#pragma once

#include <infiniband/verbs.h>

#include <type_traits>

#include "core/rdma_private.h"
#include "core/verbs.hpp"

// The real functions that are not one core/verbs.def row each: the device list
// (Provider::get_devices), the legacy-length ibv_query_port that the verb
// query_port adapts, ibv_reg_mr for a library older than ibv_reg_mr_iova2, and
// ibv_read_sysfs_file for the files of the real library's devices.
// X(member, exported name, version, required, function type)
#define SV_HW_OTHER_SYMBOLS(X)                                                                             \
  X(get_device_list, "ibv_get_device_list", "IBVERBS_1.1", true, ibv_device**(int*))                       \
  X(free_device_list, "ibv_free_device_list", "IBVERBS_1.1", true, void(ibv_device**))                     \
  X(query_port, "ibv_query_port", "IBVERBS_1.1", true, int(ibv_context*, uint8_t, _compat_ibv_port_attr*)) \
  X(reg_mr, "ibv_reg_mr", "IBVERBS_1.1", true, ibv_mr*(ibv_pd*, void*, size_t, int))            \
  X(read_sysfs_file, "ibv_read_sysfs_file", "IBVERBS_1.0", true, int(const char*, const char*, char*, size_t))

namespace softverbs::hw {

struct ForwardedSymbol {
  const char* name;
  const char* version;
  bool required;
};

// One function pointer per real symbol, typed as the real function is.
struct RealFunctions {
  // Generated from core/verbs.def: `<returns> (*<name>)(<parameters>)`; an
  // SV_VERB_ADAPTED row's real function has another type and is listed above.
#define SV_VERB(name, symbol, version, need, fails, ret, params, args) std::add_pointer_t<ret params> name = nullptr;
#define SV_VERB_ADAPTED(...)
#include "core/verbs.def"
#define SV_HW_MEMBER(member, name, version, required, ...) std::add_pointer_t<__VA_ARGS__> member = nullptr;
  SV_HW_OTHER_SYMBOLS(SV_HW_MEMBER)
#undef SV_HW_MEMBER
};

// Calls fn(const ForwardedSymbol&, slot) for every member of RealFunctions, with
// `slot` the member (a reference to the function pointer): how the namespace
// resolves them all with one loop.
// The device list comes first: a library that is not rdma-core's is reported by
// its lack of ibv_get_device_list.
template <class Fn>
void for_each_symbol(RealFunctions& fns, Fn&& fn) {
#define SV_HW_VISIT(member, name, version, required, ...) fn(ForwardedSymbol{name, version, required}, fns.member);
  SV_HW_OTHER_SYMBOLS(SV_HW_VISIT)
#undef SV_HW_VISIT
#define SV_VERB(name, symbol, version, need, ...) \
  fn(ForwardedSymbol{#symbol, version, Need::need == Need::required}, fns.name);
#define SV_VERB_ADAPTED(...)
#include "core/verbs.def"
}

// Every symbol above as data, for diagnostics and for the test that checks them
// against abi/verbs/libibverbs.map.
inline constexpr ForwardedSymbol kForwardedSymbols[] = {
#define SV_HW_ROW(member, name, version, required, ...) {name, version, required},
    SV_HW_OTHER_SYMBOLS(SV_HW_ROW)
#undef SV_HW_ROW
#define SV_VERB(name, symbol, version, need, ...) {#symbol, version, Need::need == Need::required},
#define SV_VERB_ADAPTED(...)
#include "core/verbs.def"
};

}  // namespace softverbs::hw
