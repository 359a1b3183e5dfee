// TILEINFER_CHECK: TORCH_CHECK whose message is built here, with integers and
// shapes formatted by std::to_string instead of std::ostream.
//
// Why: the extension may be compiled by a newer GCC than the libstdc++ that
// Python loads at run time, and linked with -Bsymbolic-functions; an
// ostream<<long instantiated in our library then looks up the num_put facet
// with the id of the newer library, and a TORCH_CHECK message holding an
// integer crashes instead of raising. Messages built from strings,
// std::to_string and c10's own printers (ScalarType, Device: formatted inside
// libc10) do not touch those facets.
#pragma once

#include <string>
#include <type_traits>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

namespace tileinfer::detail {

inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, char v) { s += v; }
inline void append(std::string& s, bool v) { s += v ? "true" : "false"; }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
inline void append(std::string& s, T v) {
  s += std::to_string(v);
}
inline void append(std::string& s, double v) { s += std::to_string(v); }
inline void append(std::string& s, c10::IntArrayRef v) {
  s += "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  s += "]";
}
inline void append(std::string& s, c10::ScalarType v) { s += c10::toString(v); }
inline void append(std::string& s, const c10::Device& v) { s += v.str(); }

template <typename... Args>
std::string message(const Args&... args) {
  std::string s;
  (append(s, args), ...);
  return s;
}

}  // namespace tileinfer::detail

#define TILEINFER_CHECK(cond, ...) TORCH_CHECK(cond, ::tileinfer::detail::message(__VA_ARGS__))
