// The trace recorder (core/trace.hpp): one process-wide writer behind a mutex.
//
// Records are appended to a buffer in the order the mutex is taken, each on a
// line of its own, and the buffer goes to the file when it grows past kFlushAt,
// at flush() and at exit. After each write the file ends with the closing
// "]}", which the next write overwrites, so the file on disk is complete JSON
// at every moment between writes (a killed process leaves a readable trace up
// to its last flush).
#include "core/trace.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/env.hpp"
#include "core/log.hpp"

namespace softverbs::trace {

namespace detail {
std::atomic<int> g_state{0};
}

namespace {

constexpr size_t kFlushAt = 64 * 1024;
constexpr const char* kHeader =
    "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"producer\":\"softverbs\",\"format\":1},\"traceEvents\":[\n";
constexpr const char* kTrailer = "\n]}\n";
// Tracks (tids) of a device: 0 is the device's own (verbs on no QP, CM, the
// wire of QP-less packets); a QP's is its QPN; an SRQ's is kSrqTrack + SRQN
// (QPNs have 24 bits, so the two never meet).
constexpr uint32_t kSrqTrack = 1u << 24;

class Recorder {
 public:
  explicit Recorder(std::FILE* f) : file_(f) {
    std::fputs(kHeader, file_);
    end_ = std::ftell(file_);
    std::fputs(kTrailer, file_);
    std::fflush(file_);
  }

  std::mutex mu;

  // Starts a record: name, category, phase, the time (or, same_time, the
  // previous record's), the track.
  void begin(Clock::time_point now, std::string_view name, const char* cat, const char* ph, uint32_t pid,
             uint32_t tid, bool same_time = false) {
    if (!same_time) {
      if (!has_origin_) {
        origin_ = now;
        has_origin_ = true;
      }
      // Never before the previous record: the file's order is the order of
      // the mutex, and a clock read just before taking it may lag another's.
      last_ns_ = std::max(last_ns_, std::chrono::duration_cast<std::chrono::nanoseconds>(now - origin_).count());
    }
    const int64_t ns = last_ns_;
    if (records_++) buf_ += ",\n";
    buf_ += "{\"name\":";
    str(name);
    buf_ += ",\"cat\":\"";
    buf_ += cat;
    buf_ += "\",\"ph\":\"";
    buf_ += ph;
    buf_ += '"';
    if (ph[0] == 'i') buf_ += ",\"s\":\"t\"";
    char ts[48];
    std::snprintf(ts, sizeof ts, ",\"ts\":%" PRId64 ".%03d", ns / 1000, static_cast<int>(ns % 1000));
    buf_ += ts;
    num(",\"pid\":", pid);
    num(",\"tid\":", tid);
  }
  // Arguments: args_begin(), then key()/value pairs, then end(true).
  void args_begin(std::string_view dev) {
    buf_ += ",\"args\":{\"dev\":";
    str(dev);
  }
  void arg(const char* key, std::string_view v) {
    buf_ += ",\"";
    buf_ += key;
    buf_ += "\":";
    str(v);
  }
  void arg(const char* key, uint64_t v) {
    buf_ += ",\"";
    buf_ += key;
    buf_ += '"';
    num(":", v);
  }
  void arg_signed(const char* key, int64_t v) {
    char b[32];
    std::snprintf(b, sizeof b, ":%" PRId64, v);
    buf_ += ",\"";
    buf_ += key;
    buf_ += '"';
    buf_ += b;
  }
  void end(bool with_args) {
    buf_ += with_args ? "}}" : "}";
    if (buf_.size() >= kFlushAt) write();
  }
  // A flow or async record with an id, and no arguments, at the time of the
  // record before it: a flow binds to the slice (the instant) that encloses it.
  void linked(Clock::time_point now, const char* cat, const char* ph, uint32_t pid, uint32_t tid, uint64_t id) {
    begin(now, "wr", cat, ph, pid, tid, true);
    num(",\"id\":", id);
    if (ph[0] == 'f') buf_ += ",\"bp\":\"e\"";
    end(false);
  }

  // The device's process track (1, 2, ... in order of first appearance),
  // named by a metadata record the first time.
  uint32_t pid_of(Clock::time_point now, std::string_view dev) {
    for (size_t i = 0; i < devices_.size(); ++i)
      if (devices_[i] == dev) return static_cast<uint32_t>(i + 1);
    devices_.emplace_back(dev);
    const auto pid = static_cast<uint32_t>(devices_.size());
    meta(now, "process_name", pid, 0, dev);
    meta(now, "thread_name", pid, 0, "device");
    tracks_.insert({pid, 0});
    return pid;
  }
  // Names the track tid of pid the first time it is used.
  uint32_t track(Clock::time_point now, uint32_t pid, uint32_t tid) {
    if (tracks_.insert({pid, tid}).second) {
      char name[32];
      if (tid >= kSrqTrack)
        std::snprintf(name, sizeof name, "SRQ %u", tid - kSrqTrack);
      else
        std::snprintf(name, sizeof name, "QP %u", tid);
      meta(now, "thread_name", pid, tid, name);
    }
    return tid;
  }

  uint64_t next_wr() { return ++wr_ids_; }
  // Connected QPs: (pid, the peer's QPN) -> our QPN, so that a sent packet,
  // which names only the peer's QP, lands on its sender's track.
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> peers;

  void write() {
    if (buf_.empty()) return;
    std::fseek(file_, end_, SEEK_SET);
    std::fwrite(buf_.data(), 1, buf_.size(), file_);
    buf_.clear();
    end_ = std::ftell(file_);
    std::fputs(kTrailer, file_);
    std::fflush(file_);
  }

 private:
  void meta(Clock::time_point now, const char* name, uint32_t pid, uint32_t tid, std::string_view value) {
    begin(now, name, "__metadata", "M", pid, tid);
    buf_ += ",\"args\":{\"name\":";
    str(value);
    end(true);
  }
  void num(const char* prefix, uint64_t v) {
    char b[32];
    std::snprintf(b, sizeof b, "%s%" PRIu64, prefix, v);
    buf_ += b;
  }
  // A JSON string: quotes, backslashes and control characters escaped.
  void str(std::string_view s) {
    buf_ += '"';
    for (char c : s) {
      if (c == '"' || c == '\\') {
        buf_ += '\\';
        buf_ += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char b[8];
        std::snprintf(b, sizeof b, "\\u%04x", c);
        buf_ += b;
      } else {
        buf_ += c;
      }
    }
    buf_ += '"';
  }

  std::FILE* file_;
  long end_ = 0;  // where the trailer starts
  std::string buf_;
  uint64_t records_ = 0;
  uint64_t wr_ids_ = 0;
  bool has_origin_ = false;
  int64_t last_ns_ = 0;  // the last record's time
  Clock::time_point origin_{};
  std::vector<std::string> devices_;
  std::set<std::pair<uint32_t, uint32_t>> tracks_;
};

Recorder* g_recorder = nullptr;  // never destroyed: hooks may run until exit
thread_local Pending t_pending;

void flush_at_exit() { flush(); }

// A child of fork() that does not exec shares the parent's file (and its
// offset) and holds a copy of its buffer: it records nothing, so that the
// parent's trace stays whole. (One that execs reads SOFTVERBS_TRACE afresh:
// "%p" in the name gives it a file of its own.)
void stop_in_child() { detail::g_state.store(1, std::memory_order_relaxed); }

// Opens the trace file for this process alone: a file that another live
// process is writing (a program this one started with the same environment,
// or the other way round) is left to it, and this process writes PATH.PID.
// The lock goes with the writer's open file, so it ends with the process.
std::FILE* open_exclusive(std::string* path) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt) *path += "." + std::to_string(::getpid());
    const int fd = ::open(path->c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return nullptr;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      continue;
    }
    if (::ftruncate(fd, 0) != 0) {
      ::close(fd);
      return nullptr;
    }
    if (std::FILE* f = ::fdopen(fd, "w")) return f;
    ::close(fd);
    return nullptr;
  }
  return nullptr;
}

}  // namespace

bool detail::start() noexcept {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* value = env::trace();
    if (!value || !*value) {
      g_state.store(1, std::memory_order_relaxed);
      return;
    }
    std::string path(value);
    // As SOFTVERBS_PCAP: two processes with the same environment write two files.
    for (size_t at; (at = path.find("%p")) != std::string::npos;) path.replace(at, 2, std::to_string(::getpid()));
    const std::string asked = path;
    std::FILE* f = open_exclusive(&path);
    if (f && path != asked)
      SV_LOG(kWarn, "SOFTVERBS_TRACE: %s is written by another process; this one writes %s", asked.c_str(),
             path.c_str());
    if (!f) {
      SV_LOG(kError, "SOFTVERBS_TRACE: cannot write %s: %s", path.c_str(), std::strerror(errno));
      g_state.store(1, std::memory_order_relaxed);
      return;
    }
    g_recorder = new Recorder(f);
    std::atexit(flush_at_exit);
    pthread_atfork(nullptr, nullptr, stop_in_child);
    g_state.store(2, std::memory_order_release);
  });
  return g_state.load(std::memory_order_acquire) == 2;
}

uint64_t wr_posted(const Clock& clock, std::string_view dev, std::string_view verb, uint32_t qpn, uint64_t wr_id,
                   std::string_view opcode, uint64_t length) noexcept {
  Recorder& r = *g_recorder;
  const Clock::time_point now = clock.now();  // outside the lock: a clock may take locks of its own
  std::lock_guard lock(r.mu);
  const uint64_t id = r.next_wr();
  const uint32_t pid = r.pid_of(now, dev);
  const bool srq = verb == "post_srq_recv";
  const uint32_t tid = r.track(now, pid, srq ? kSrqTrack + qpn : qpn);
  r.begin(now, verb, "wr", "i", pid, tid);
  r.args_begin(dev);
  r.arg(srq ? "srqn" : "qpn", qpn);
  r.arg("wr", id);
  r.arg("wr_id", wr_id);
  r.arg("opcode", opcode);
  r.arg("len", length);
  r.end(true);
  r.linked(now, "wr", "s", pid, tid, id);
  r.linked(now, "wr_life", "b", pid, tid, id);
  return id;
}

void wr_started(const Clock& clock, std::string_view dev, uint32_t qpn, uint64_t id, uint32_t first_psn,
                uint32_t last_psn, uint32_t dqpn) noexcept {
  Recorder& r = *g_recorder;
  const Clock::time_point now = clock.now();  // outside the lock: a clock may take locks of its own
  std::lock_guard lock(r.mu);
  const uint32_t pid = r.pid_of(now, dev);
  r.begin(now, "wr_start", "wr", "i", pid, r.track(now, pid, qpn));
  r.args_begin(dev);
  r.arg("qpn", qpn);
  r.arg("wr", id);
  r.arg("first_psn", first_psn);
  r.arg("last_psn", last_psn);
  r.arg("dqpn", dqpn);
  r.end(true);
}

void completion(const Clock& clock, std::string_view dev, uint32_t qpn, uint64_t id, uint64_t wr_id,
                std::string_view status, std::string_view opcode, uint32_t byte_len, bool signaled,
                std::string_view fault) noexcept {
  Recorder& r = *g_recorder;
  const Clock::time_point now = clock.now();  // outside the lock: a clock may take locks of its own
  std::lock_guard lock(r.mu);
  const uint32_t pid = r.pid_of(now, dev);
  const uint32_t tid = r.track(now, pid, qpn);
  r.begin(now, signaled ? "completion" : "retired", "wr", "i", pid, tid);
  r.args_begin(dev);
  r.arg("qpn", qpn);
  r.arg("wr", id);
  r.arg("wr_id", wr_id);
  r.arg("status", status);
  r.arg("opcode", opcode);
  r.arg("byte_len", byte_len);
  if (fault != "none") r.arg("fault", fault);
  r.end(true);
  if (id) {
    r.linked(now, "wr", "f", pid, tid, id);
    r.linked(now, "wr_life", "e", pid, tid, id);
  }
}

void object(const Clock& clock, std::string_view dev, std::string_view verb, uint32_t num) noexcept {
  Recorder& r = *g_recorder;
  const Clock::time_point now = clock.now();  // outside the lock: a clock may take locks of its own
  std::lock_guard lock(r.mu);
  const uint32_t pid = r.pid_of(now, dev);
  const bool qp = verb.ends_with("_qp");
  const bool srq = verb.ends_with("_srq");
  const uint32_t tid = qp ? r.track(now, pid, num) : srq ? r.track(now, pid, kSrqTrack + num) : 0;
  r.begin(now, verb, "verb", "i", pid, tid);
  r.args_begin(dev);
  r.arg(qp ? "qpn" : srq ? "srqn" : "num", num);
  r.end(true);
}

void modify_qp(const Clock& clock, std::string_view dev, uint32_t qpn, std::string_view from, std::string_view to,
               uint32_t dqpn) noexcept {
  Recorder& r = *g_recorder;
  const Clock::time_point now = clock.now();  // outside the lock: a clock may take locks of its own
  std::lock_guard lock(r.mu);
  const uint32_t pid = r.pid_of(now, dev);
  if (dqpn) r.peers[{pid, dqpn}] = qpn;
  r.begin(now, "modify_qp", "verb", "i", pid, r.track(now, pid, qpn));
  r.args_begin(dev);
  r.arg("qpn", qpn);
  r.arg("from", from);
  r.arg("to", to);
  if (dqpn) r.arg("dqpn", dqpn);
  r.end(true);
}

void packet(const Clock& clock, std::string_view dev, const Packet& p) noexcept {
  Recorder& r = *g_recorder;
  const Clock::time_point now = clock.now();  // outside the lock: a clock may take locks of its own
  std::lock_guard lock(r.mu);
  const uint32_t pid = r.pid_of(now, dev);
  // Received: the packet names our QP. Sent: a datagram names its sender (DETH);
  // otherwise the peer's, which a connected QP maps back.
  uint32_t qpn = 0;
  if (p.dir == "rx") {
    qpn = p.dqpn;
  } else if (p.sqpn) {
    qpn = p.sqpn;
  } else if (auto it = r.peers.find({pid, p.dqpn}); it != r.peers.end()) {
    qpn = it->second;
  }
  r.begin(now, p.opcode, "packet", "i", pid, qpn ? r.track(now, pid, qpn) : 0);
  r.args_begin(dev);
  r.arg("dir", p.dir);
  if (qpn) r.arg("qpn", qpn);
  r.arg("dqpn", p.dqpn);
  r.arg("psn", p.psn);
  r.arg("opcode", p.opcode);
  r.arg("len", p.length);
  r.arg("fault", p.fault);
  if (p.frame) r.arg("frame", p.frame);
  r.end(true);
}

void set_pending(const Pending& p) noexcept { t_pending = p; }
Pending take_pending() noexcept { return std::exchange(t_pending, Pending{}); }

void timer(const Clock& clock, std::string_view dev, uint32_t qpn, std::string_view which, std::string_view what,
           int64_t in_ns) noexcept {
  Recorder& r = *g_recorder;
  const Clock::time_point now = clock.now();  // outside the lock: a clock may take locks of its own
  std::lock_guard lock(r.mu);
  const uint32_t pid = r.pid_of(now, dev);
  std::string name(which);
  name += ' ';
  name += what;
  r.begin(now, name, "timer", "i", pid, qpn ? r.track(now, pid, qpn) : 0);
  r.args_begin(dev);
  if (qpn) r.arg("qpn", qpn);
  r.arg("timer", which);
  r.arg("what", what);
  if (what == "armed") r.arg_signed("in_ns", in_ns);
  r.end(true);
}

void event(const Clock& clock, std::string_view dev, std::string_view kind, std::string_view name, uint32_t qpn,
           int status) noexcept {
  Recorder& r = *g_recorder;
  const Clock::time_point now = clock.now();  // outside the lock: a clock may take locks of its own
  std::lock_guard lock(r.mu);
  const uint32_t pid = r.pid_of(now, dev);
  r.begin(now, name, "event", "i", pid, qpn ? r.track(now, pid, qpn) : 0);
  r.args_begin(dev);
  r.arg("kind", kind);
  if (qpn) r.arg("qpn", qpn);
  if (status) r.arg_signed("status", status);
  r.end(true);
}

void flush() noexcept {
  if (detail::g_state.load(std::memory_order_acquire) != 2) return;
  std::lock_guard lock(g_recorder->mu);
  g_recorder->write();
}

std::string_view wr_opcode_name(int opcode) noexcept {
  static constexpr const char* kNames[] = {"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND",     "SEND_WITH_IMM",
                                           "RDMA_READ",  "ATOMIC_CMP_AND_SWP",  "ATOMIC_FETCH_AND_ADD",
                                           "LOCAL_INV",  "BIND_MW",             "SEND_WITH_INV", "TSO", "DRIVER1"};
  if (opcode >= 0 && static_cast<size_t>(opcode) < std::size(kNames)) return kNames[opcode];
  return "OTHER";
}

std::string_view wc_opcode_name(int opcode) noexcept {
  switch (opcode) {
    case 0: return "SEND";
    case 1: return "RDMA_WRITE";
    case 2: return "RDMA_READ";
    case 3: return "COMP_SWAP";
    case 4: return "FETCH_ADD";
    case 5: return "BIND_MW";
    case 6: return "LOCAL_INV";
    case 7: return "TSO";
    case 128: return "RECV";
    case 129: return "RECV_RDMA_WITH_IMM";
    default: return "OTHER";
  }
}

std::string_view qp_state_name(int state) noexcept {
  static constexpr const char* kNames[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  if (state >= 0 && static_cast<size_t>(state) < std::size(kNames)) return kNames[state];
  return "UNKNOWN";
}

std::string_view cm_event_name(int event) noexcept {
  static constexpr const char* kNames[] = {
      "RDMA_CM_EVENT_ADDR_RESOLVED",    "RDMA_CM_EVENT_ADDR_ERROR",      "RDMA_CM_EVENT_ROUTE_RESOLVED",
      "RDMA_CM_EVENT_ROUTE_ERROR",      "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
      "RDMA_CM_EVENT_CONNECT_ERROR",    "RDMA_CM_EVENT_UNREACHABLE",     "RDMA_CM_EVENT_REJECTED",
      "RDMA_CM_EVENT_ESTABLISHED",      "RDMA_CM_EVENT_DISCONNECTED",    "RDMA_CM_EVENT_DEVICE_REMOVAL",
      "RDMA_CM_EVENT_MULTICAST_JOIN",   "RDMA_CM_EVENT_MULTICAST_ERROR", "RDMA_CM_EVENT_ADDR_CHANGE",
      "RDMA_CM_EVENT_TIMEWAIT_EXIT"};
  if (event >= 0 && static_cast<size_t>(event) < std::size(kNames)) return kNames[event];
  return "RDMA_CM_EVENT_OTHER";
}

}  // namespace softverbs::trace
