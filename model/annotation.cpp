#include "model/annotation.h"

#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

namespace ingero {
namespace {

using nlohmann::json;
using namespace annotation_limits;

// Records the first syntax error of a line that is not JSON, with nlohmann's own message and
// position, without building anything and without an exception being thrown.
class SyntaxErrorSax final : public nlohmann::json_sax<json> {
 public:
  std::string message;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    message = ex.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." -> from "parse error".
    if (const auto at = message.find("] "); at != std::string::npos) message.erase(0, at + 2);
    return false;
  }
};

std::string type_of(const json& j) {
  if (j.is_number_float()) return "a number with a fraction";
  if (j.is_number()) return "a number";
  return std::string(j.is_null()     ? "null"
                     : j.is_string() ? "a string"
                     : j.is_array()  ? "an array"
                     : j.is_object() ? "an object"
                                     : "a boolean");
}

// A key or value for an error message: JSON-quoted, at most ~80 characters.
std::string shown(const std::string& s) {
  std::string q = json(s.size() > 64 ? s.substr(0, 64) : s).dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 64) q.insert(q.size() - 1, "...");
  return q;
}

// An integer field in 0..max. Absent or null: `present` false, true returned. A fraction, a
// negative number, a string...: false with `error`.
bool get_uint(const json& obj, const char* key, uint64_t max, uint64_t& out, bool& present, std::string& error) {
  present = false;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return true;
  if (it->is_number_unsigned()) {
    out = it->get<uint64_t>();
  } else if (it->is_number_integer()) {
    error = std::string(key) + ": negative (" + std::to_string(it->get<int64_t>()) + ")";
    return false;
  } else {
    error = std::string(key) + ": expected an integer, got " + type_of(*it);
    return false;
  }
  if (out > max) {
    error = std::string(key) + ": " + std::to_string(out) + " is out of range 0.." + std::to_string(max);
    return false;
  }
  present = true;
  return true;
}

bool parse_object(const json& j, Annotation& a, std::string& error) {
  if (!j.is_object()) return error = "expected a JSON object, got " + type_of(j), false;
  uint64_t v = 0;
  bool present = false;
  constexpr uint64_t kI64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (!get_uint(j, "v", kI64, v, present, error)) return false;
  if (present && v != static_cast<uint64_t>(kProtocolVersion))
    return error = "v: protocol version " + std::to_string(v) + " is not supported (this reader speaks 1)", false;

  auto labels = j.find("labels");
  if (labels == j.end() || labels->is_null()) return error = "labels: missing (a non-empty object is required)", false;
  if (!labels->is_object()) return error = "labels: expected an object, got " + type_of(*labels), false;
  if (labels->empty()) return error = "labels: empty (at least one label is required)", false;
  if (labels->size() > kMaxLabels)
    return error = "labels: " + std::to_string(labels->size()) + " labels, at most " + std::to_string(kMaxLabels),
           false;
  for (const auto& [k, val] : labels->items()) {
    if (!valid_label_key(k)) return error = "labels: key " + shown(k) + " is not 1-64 bytes of A-Za-z0-9_.-", false;
    std::string text;
    if (val.is_string()) text = val.get<std::string>();
    else if (val.is_number_unsigned()) text = std::to_string(val.get<uint64_t>());
    else if (val.is_number_integer()) text = std::to_string(val.get<int64_t>());
    else return error = "labels." + k + ": expected a string, got " + type_of(val), false;
    if (text.size() > kMaxValueBytes)
      return error = "labels." + k + ": value is " + std::to_string(text.size()) + " bytes, at most " +
                     std::to_string(kMaxValueBytes),
             false;
    a.labels.emplace(k, std::move(text));
  }

  uint64_t ts = 0;
  if (!get_uint(j, "ts", kI64, ts, present, error)) return false;
  a.ts_ns = ts;
  a.ts_given = ts != 0;  // Ingero stamps the receive time for 0 too
  uint64_t x = 0;
  if (!get_uint(j, "pid", UINT32_MAX, x, present, error)) return false;
  a.pid = static_cast<uint32_t>(x);
  x = 0;
  if (!get_uint(j, "tid", UINT32_MAX, x, present, error)) return false;
  a.tid = static_cast<uint32_t>(x);
  x = 0;
  if (!get_uint(j, "start_time", UINT64_MAX, x, present, error)) return false;
  a.start_time = x;
  uint64_t s0 = 0, s1 = 0;
  if (!get_uint(j, "span_start", kI64, s0, present, error)) return false;
  if (!get_uint(j, "span_end", kI64, s1, present, error)) return false;
  if ((s0 == 0) != (s1 == 0))
    return error = "span_start and span_end go together (a phase needs both; an instant neither)", false;
  if (s1 < s0)
    return error = "span_end (" + std::to_string(s1) + ") is before span_start (" + std::to_string(s0) + ")", false;
  a.span_start_ns = s0;
  a.span_end_ns = s1;
  return true;
}

}  // namespace

bool valid_label_key(std::string_view key) {
  if (key.empty() || key.size() > kMaxKeyBytes) return false;
  for (const char c : key)
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
          c == '-'))
      return false;
  return true;
}

bool parse_annotation_line(std::string_view line, Annotation& out, std::string& error) {
  try {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > kMaxLineBytes) {
      error = "line is " + std::to_string(line.size()) + " bytes, over the " + std::to_string(kMaxLineBytes) +
              "-byte limit";
      return false;
    }
    const json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      SyntaxErrorSax sax;
      json::sax_parse(line.begin(), line.end(), &sax);
      error = "not JSON: " + (sax.message.empty() ? std::string("syntax error") : sax.message);
      return false;
    }
    Annotation a;
    if (!parse_object(j, a, error)) return false;
    out = std::move(a);
    return true;
  } catch (const std::exception& e) {  // allocation failure: the line is refused, nothing escapes
    error = std::string("cannot parse: ") + e.what();
    return false;
  }
}

std::string labels_json(const Annotation& a) {
  json j = json::object();
  for (const auto& [k, v] : a.labels) j[k] = v;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool parse_labels_json(std::string_view text, std::map<std::string, std::string>& labels) {
  labels.clear();
  try {
    const json j = json::parse(text.begin(), text.end(), nullptr, false);
    if (!j.is_object()) return false;
    for (const auto& [k, v] : j.items()) {
      if (v.is_string()) labels.emplace(k, v.get<std::string>());
      else if (v.is_number_unsigned()) labels.emplace(k, std::to_string(v.get<uint64_t>()));
      else if (v.is_number_integer()) labels.emplace(k, std::to_string(v.get<int64_t>()));
      else return labels.clear(), false;
    }
    return true;
  } catch (const std::exception&) {
    labels.clear();
    return false;
  }
}

int64_t label_number(const std::string& value) {
  if (value.empty() || value.size() > 18) return -1;
  int64_t n = 0;
  for (const char c : value) {
    if (c < '0' || c > '9') return -1;
    n = n * 10 + (c - '0');
  }
  return n;
}

bool step_marker_of(const Annotation& a, StepMarker& out) {
  const std::string* step = a.label("step");
  const std::string* epoch = a.label("epoch");
  if (!step && !epoch) return false;
  StepMarker m;
  m.ts_ns = a.span_start_ns ? a.span_start_ns : a.ts_ns;
  m.pid = a.pid;
  m.tid = a.tid;
  m.node = a.node;
  m.has_step = step != nullptr;
  m.has_epoch = epoch != nullptr;
  m.step = step ? label_number(*step) : -1;
  m.epoch = epoch ? label_number(*epoch) : -1;
  out = m;
  return true;
}

}  // namespace ingero
