#include "core/log.hpp"

#include <cstdio>
#include <cstring>

#include "core/env.hpp"

namespace softverbs {

LogLevel log_level() noexcept {
  static const LogLevel level = [] {
    const char* v = env::log();
    if (!v || !*v) return LogLevel::kError;
    if (!std::strcmp(v, "none") || !std::strcmp(v, "0")) return LogLevel::kNone;
    if (!std::strcmp(v, "error")) return LogLevel::kError;
    if (!std::strcmp(v, "warn")) return LogLevel::kWarn;
    if (!std::strcmp(v, "info")) return LogLevel::kInfo;
    if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
    return LogLevel::kError;
  }();
  return level;
}

bool log_enabled(LogLevel level) noexcept { return level <= log_level() && level != LogLevel::kNone; }

void log(LogLevel level, const char* fmt, ...) noexcept {
  static const char* const names[] = {"", "error", "warn", "info", "debug"};
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "softverbs %s: %s\n", names[static_cast<int>(level)], buf);
}

}  // namespace softverbs
