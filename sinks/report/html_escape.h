// Text for HTML element content and attribute values: & < > " ' as entities. Shared by the HTML
// reports (html_report.cpp, diff_html.cpp).
#pragma once

#include <string>
#include <string_view>

namespace ingero {

inline std::string html_escape(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

}  // namespace ingero
