/* Ondo patch: force-included into mlx-c's C++ sources on toolchains whose C++
 * library has no std::format (GCC 12's libstdc++). mlx-c only formats error
 * messages with plain "{}" placeholders, so this small stand-in is enough. */
#pragma once
#ifdef __cplusplus
#include <version>
#ifndef __cpp_lib_format
#include <sstream>
#include <string>
#include <string_view>

namespace std {
namespace ondo_format_compat {
inline void append(std::ostringstream& out, std::string_view fmt) {
  out << fmt;
}
template <class First, class... Rest>
void append(std::ostringstream& out, std::string_view fmt, const First& first,
            const Rest&... rest) {
  auto at = fmt.find("{}");
  if (at == std::string_view::npos) {
    out << fmt;
    return;
  }
  out << fmt.substr(0, at) << first;
  append(out, fmt.substr(at + 2), rest...);
}
} // namespace ondo_format_compat

template <class... Args>
std::string format(std::string_view fmt, const Args&... args) {
  std::ostringstream out;
  ondo_format_compat::append(out, fmt, args...);
  return out.str();
}
} // namespace std
#endif
#endif
