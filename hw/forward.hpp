// Forwarder: the provider interface as a plain pass-through to the real
// rdma-core, one method per core/verbs.def row. Each calls the real function of
// the row in the namespace (hw/namespace.hpp), so the application gets
// rdma-core's behaviour, objects and error codes unchanged; when the real
// library lacks an optional one, the verb fails as the interface's default does.
// HwProvider (hw/provider.hpp) derives from it and replaces the few verbs that
// need more than a call.
#pragma once

#include "core/provider.hpp"
#include "hw/namespace.hpp"

namespace softverbs::hw {

// The namespace behind every object this backend returned. Objects exist only
// once the library is loaded, so for any verb on them it is there.
inline Namespace& live() { return *Namespace::current(); }
inline const RealFunctions& real() { return live().fn(); }

class Forwarder : public Provider {
 public:
  // Generated from core/verbs.def: `<returns> <name>(<parameters>) override`,
  // defined in hw/forward.cpp. An SV_VERB_ADAPTED row's real function has
  // another signature: HwProvider implements it.
#define SV_VERB(name, symbol, version, need, fails, ret, params, args) ret name params override;
#define SV_VERB_ADAPTED(...)
#include "core/verbs.def"
};

}  // namespace softverbs::hw
