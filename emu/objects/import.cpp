// ibv_import_device, ibv_import_pd/mr and their unimports within a process
// (import.hpp has the design and the errnos).
#include "emu/objects/import.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <system_error>

#include "emu/objects/domain.hpp"
#include "emu/provider.hpp"

namespace softverbs::emu {
namespace {

// What a cmd_fd's memfd holds.
struct FdRecord {
  char magic[8];
  uint64_t pid;
  uint64_t serial;
};
constexpr char kMagic[8] = {'s', 'v', 'c', 't', 'x', 'f', 'd', '1'};

std::mutex g_files_mu;
std::map<uint64_t, std::weak_ptr<ContextFile>> g_files;  // by serial, under g_files_mu
std::atomic<uint64_t> g_next_serial{1};

// The alias structs: the public struct first, owned by the object it names.
struct ImportedPd {
  Handle<ibv_pd, Pd> handle;
};
struct ImportedMr {
  Handle<ibv_mr, Mr> handle;
};

bool alias_of(ibv_context* context, const void* pub, HandleTable::Alias* out) {
  return pub && context && Context::from(context)->handles.find_alias(pub, out) &&
         out->kind == HandleTable::AliasKind::imported;
}

}  // namespace

std::shared_ptr<ContextFile> new_context_file(Device& device) {
  auto file = std::make_shared<ContextFile>();
  file->device = &device;
  file->serial = g_next_serial.fetch_add(1);
  std::lock_guard lock(g_files_mu);
  // Forget files whose contexts are all gone.
  std::erase_if(g_files, [](const auto& f) { return f.second.expired(); });
  g_files[file->serial] = file;
  return file;
}

int open_context_fd(const ContextFile& file) {
  const int fd = ::memfd_create("softverbs-context", MFD_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category());
  FdRecord r{};
  std::memcpy(r.magic, kMagic, sizeof kMagic);
  r.pid = static_cast<uint64_t>(::getpid());
  r.serial = file.serial;
  if (::pwrite(fd, &r, sizeof r, 0) != static_cast<ssize_t>(sizeof r)) {
    const int err = errno ? errno : EIO;
    ::close(fd);
    throw std::system_error(err, std::generic_category());
  }
  return fd;
}

ibv_context* import_device(int cmd_fd) {
  // rdma-core: an fd that fstat refuses, or that is not a (uverbs) character
  // device, is EINVAL; here, one that is not a context's memfd.
  struct stat st {};
  FdRecord r{};
  if (::fstat(cmd_fd, &st) || !S_ISREG(st.st_mode) || st.st_size != static_cast<off_t>(sizeof r) ||
      ::pread(cmd_fd, &r, sizeof r, 0) != static_cast<ssize_t>(sizeof r) ||
      std::memcmp(r.magic, kMagic, sizeof kMagic) != 0)
    return fail<ibv_context>(EINVAL);
  // Another process's context: its objects live in that process's engine.
  if (r.pid != static_cast<uint64_t>(::getpid())) return fail<ibv_context>(EOPNOTSUPP);
  std::shared_ptr<ContextFile> file;
  {
    std::lock_guard lock(g_files_mu);
    auto it = g_files.find(r.serial);
    if (it != g_files.end()) file = it->second.lock();
  }
  // Every context of the file is closed: the device it named is gone for it.
  if (!file) return fail<ibv_context>(ENODEV);
  if (file->device->fatal()) return fail<ibv_context>(EIO);
  auto ctx = std::make_unique<Context>(file, cmd_fd);
  return ctx.release()->ibv();
}

// The kernel's lookup of the number (MLX5_IB_METHOD_PD_QUERY, UVERBS_METHOD_QUERY_MR):
// ENOENT for a free number, EINVAL for another type's.
ibv_pd* import_pd(ibv_context* context, uint32_t pd_handle) {
  Context* ctx = Context::from(context);
  const void* pub = ctx->handles.find(ObjectType::pd, pd_handle);
  if (!pub) return fail<ibv_pd>(ctx->handles.check(ObjectType::pd, nullptr, pd_handle));
  auto* original = static_cast<ibv_pd*>(const_cast<void*>(pub));
  auto imported = std::make_unique<ImportedPd>();
  imported->handle.owner = Pd::from(original);
  imported->handle.pub.context = context;
  imported->handle.pub.handle = pd_handle;
  ctx->handles.add_alias(&imported->handle.pub,
                         HandleTable::Alias{pub, HandleTable::AliasKind::imported, imported.get()});
  return &imported.release()->handle.pub;
}

ibv_mr* import_mr(ibv_pd* pd, uint32_t mr_handle) {
  Context* ctx = Context::from(pd->context);
  if (int err = ctx->handles.check(ObjectType::pd, pd, pd->handle)) return fail<ibv_mr>(err);
  const void* pub = ctx->handles.find(ObjectType::mr, mr_handle);
  if (!pub) return fail<ibv_mr>(ctx->handles.check(ObjectType::mr, nullptr, mr_handle));
  auto* original = static_cast<ibv_mr*>(const_cast<void*>(pub));
  auto imported = std::make_unique<ImportedMr>();
  imported->handle.owner = Mr::from(original);
  // ibv_cmd_query_mr: the keys and length from the kernel, no address.
  ibv_mr& m = imported->handle.pub;
  m.context = pd->context;
  m.pd = pd;
  m.addr = nullptr;
  m.length = original->length;
  m.handle = mr_handle;
  m.lkey = original->lkey;
  m.rkey = original->rkey;
  ctx->handles.add_alias(&m, HandleTable::Alias{pub, HandleTable::AliasKind::imported, imported.get()});
  return &imported.release()->handle.pub;
}

bool is_imported(ibv_pd* pd) {
  HandleTable::Alias a;
  return alias_of(pd->context, pd, &a);
}

bool is_imported(ibv_mr* mr) {
  HandleTable::Alias a;
  return alias_of(mr->context, mr, &a);
}

void retire_original(ContextFile& file, const void* original_pub, std::function<void()> deleter) {
  std::lock_guard lock(file.retired_mu);
  file.retired[original_pub] = std::move(deleter);
}

namespace {

// Unimport: an imported struct is freed; an object's own struct destroyed
// through an imported one is freed now; any other struct is the object itself,
// which only ibv_dealloc_pd/ibv_dereg_mr release (nothing happens).
template <class Imported>
void unimport(ibv_context* context, const void* pub) {
  if (!pub || !context) return;
  ContextFile& file = *Context::from(context)->file();
  HandleTable::Alias a;
  if (file.table.find_alias(pub, &a)) {
    if (a.kind != HandleTable::AliasKind::imported) return;  // a parent domain is deallocated, not unimported
    file.table.remove_alias(pub);
    delete static_cast<Imported*>(a.object);
    return;
  }
  std::function<void()> deleter;
  {
    std::lock_guard lock(file.retired_mu);
    auto it = file.retired.find(pub);
    if (it == file.retired.end()) return;
    deleter = std::move(it->second);
    file.retired.erase(it);
  }
  deleter();
}

}  // namespace

void unimport_pd(ibv_pd* pd) { unimport<ImportedPd>(pd ? pd->context : nullptr, pd); }
void unimport_mr(ibv_mr* mr) { unimport<ImportedMr>(mr ? mr->context : nullptr, mr); }

// ---- the provider's verbs (emu/provider.hpp) -------------------------------------

ibv_context* EmuProvider::import_device(int cmd_fd) { return emu::import_device(cmd_fd); }
ibv_pd* EmuProvider::import_pd(ibv_context* context, uint32_t pd_handle) {
  if (Context::from(context)->device().fatal()) return fail<ibv_pd>(EIO);
  return emu::import_pd(context, pd_handle);
}
void EmuProvider::unimport_pd(ibv_pd* pd) { emu::unimport_pd(pd); }
ibv_mr* EmuProvider::import_mr(ibv_pd* pd, uint32_t mr_handle) {
  if (Context::from(pd->context)->device().fatal()) return fail<ibv_mr>(EIO);
  return emu::import_mr(pd, mr_handle);
}
void EmuProvider::unimport_mr(ibv_mr* mr) { emu::unimport_mr(mr); }

}  // namespace softverbs::emu
