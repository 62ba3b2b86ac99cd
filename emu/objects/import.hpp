// Sharing a context's objects (ibv_import_device(3), ibv_import_pd(3),
// ibv_import_mr(3)) within a process.
//
// A context's cmd_fd is a memfd that records the process and the context file
// (ContextFile, objects.hpp) it names; a dup of it, or a copy received over
// SCM_RIGHTS, names the same file. ibv_import_device on such an fd in the
// process that made it gives a second context on the file, sharing its object
// numbers; in another process the objects are out of reach (they live in the
// engine of the process that created them) and the import fails with
// EOPNOTSUPP; an fd that is no context's fails with EINVAL, as rdma-core's for
// an fd that is not a uverbs device.
//
// An imported PD or MR is a struct of its own, an alias of the object in the
// file's HandleTable whose Handle's owner is the object itself, so every verb
// acts on the object. ibv_unimport_pd/mr frees only the alias;
// ibv_dealloc_pd/ibv_dereg_mr through it destroys the object, whose own struct
// then stays allocated (its verbs fail the lookup) until it is unimported.
#pragma once

#include <infiniband/verbs.h>

#include <functional>
#include <memory>

#include "emu/objects/objects.hpp"

namespace softverbs::emu {

// A new file for a context opened on device.
std::shared_ptr<ContextFile> new_context_file(Device& device);
// A cmd_fd naming file (a memfd with the process and file recorded in it).
// Throws std::system_error when no fd can be made.
int open_context_fd(const ContextFile& file);

// The verbs, with the errnos of the module comment: NULL and errno.
ibv_context* import_device(int cmd_fd);
ibv_pd* import_pd(ibv_context* context, uint32_t pd_handle);
void unimport_pd(ibv_pd* pd);
ibv_mr* import_mr(ibv_pd* pd, uint32_t mr_handle);
void unimport_mr(ibv_mr* mr);

// Whether pub is an imported struct (HandleTable::AliasKind::imported) of its
// context's file.
bool is_imported(ibv_pd* pd);
bool is_imported(ibv_mr* mr);
// Destroying an object through an imported struct: the object's own struct is
// kept (a lookup through it fails) until unimported; deleter frees it then.
// ibv_dealloc_pd/ibv_dereg_mr call it once the object is released, then free
// the imported struct with unimport_pd/mr.
void retire_original(ContextFile& file, const void* original_pub, std::function<void()> deleter);

}  // namespace softverbs::emu
