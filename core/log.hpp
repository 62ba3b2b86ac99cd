// Diagnostics on stderr, off unless asked for: an unmodified program's output must
// not change because it runs on softverbs. SOFTVERBS_LOG=error|warn|info|debug.
#pragma once

#include <cstdarg>

namespace softverbs {

enum class LogLevel { kNone = 0, kError = 1, kWarn = 2, kInfo = 3, kDebug = 4 };

// The level in force (read once from SOFTVERBS_LOG; default: error).
LogLevel log_level() noexcept;
bool log_enabled(LogLevel level) noexcept;
void log(LogLevel level, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

}  // namespace softverbs

#define SV_LOG(level, ...)                                                       \
  do {                                                                           \
    if (::softverbs::log_enabled(::softverbs::LogLevel::level)) ::softverbs::log(::softverbs::LogLevel::level, __VA_ARGS__); \
  } while (0)
