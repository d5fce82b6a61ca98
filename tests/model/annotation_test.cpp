// The annotation line parser (model/annotation.h): Ingero's NDJSON protocol as its Lightning and
// Ray helpers send it, every field's rules, bad and hostile lines (not JSON, partial, huge, deeply
// nested, wrong types), unknown keys, and the step markers an annotation carries.
#include "model/annotation.h"

#include <gtest/gtest.h>

#include <string>

namespace ingero {
namespace {

Annotation ok(const std::string& line) {
  Annotation a;
  std::string error;
  EXPECT_TRUE(parse_annotation_line(line, a, error)) << line << ": " << error;
  EXPECT_TRUE(error.empty());
  return a;
}

std::string bad(const std::string& line) {
  Annotation a;
  a.pid = 77;  // untouched on failure
  std::string error;
  EXPECT_FALSE(parse_annotation_line(line, a, error)) << line;
  EXPECT_FALSE(error.empty()) << line;
  EXPECT_EQ(a.pid, 77u) << line;
  return error;
}

TEST(Annotation, LightningCallbackLines) {
  // What IngeroCallback.on_train_batch_start sends (json.dumps, sort_keys, compact).
  Annotation a = ok(R"({"labels":{"epoch":"3","run_id":"my-run","step":"42"},"pid":4821})");
  EXPECT_EQ(a.pid, 4821u);
  EXPECT_EQ(a.ts_ns, 0u);
  EXPECT_FALSE(a.ts_given);
  ASSERT_EQ(a.labels.size(), 3u);
  EXPECT_EQ(*a.label("step"), "42");
  EXPECT_EQ(*a.label("epoch"), "3");
  EXPECT_EQ(*a.label("run_id"), "my-run");
  StepMarker m;
  ASSERT_TRUE(step_marker_of(a, m));
  EXPECT_TRUE(m.has_step);
  EXPECT_TRUE(m.has_epoch);
  EXPECT_EQ(m.step, 42);
  EXPECT_EQ(m.epoch, 3);
  EXPECT_EQ(m.pid, 4821u);

  // on_train_epoch_end: epoch and phase, no step.
  a = ok(R"({"labels":{"epoch":"3","phase":"epoch_end"},"pid":4821})");
  ASSERT_TRUE(step_marker_of(a, m));
  EXPECT_FALSE(m.has_step);
  EXPECT_EQ(m.epoch, 3);

  // A Ray task start: task labels only, no step marker (recorded, not a step).
  a = ok(R"({"labels":{"run_id":"02000000","task_id":"c8ef45ccd0112571","task_name":"preprocess"},"pid":99})");
  EXPECT_FALSE(step_marker_of(a, m));
}

TEST(Annotation, EveryField) {
  const Annotation a = ok(R"({"v":1,"ts":1700000000123456789,"labels":{"step":"7"},"pid":12,"tid":13,"start_time":555,)"
                          R"("span_start":1700000000000000000,"span_end":1700000000100000000})");
  EXPECT_EQ(a.ts_ns, 1700000000123456789ull);
  EXPECT_TRUE(a.ts_given);
  EXPECT_EQ(a.pid, 12u);
  EXPECT_EQ(a.tid, 13u);
  EXPECT_EQ(a.start_time, 555u);
  EXPECT_EQ(a.span_start_ns, 1700000000000000000ull);
  EXPECT_EQ(a.span_end_ns, 1700000000100000000ull);
  StepMarker m;
  ASSERT_TRUE(step_marker_of(a, m));
  EXPECT_EQ(m.ts_ns, a.span_start_ns);  // a phase marks its start
  EXPECT_EQ(m.tid, 13u);
  // ts 0 is "not given" (Ingero stamps the receive time for it too); nulls are absent.
  EXPECT_FALSE(ok(R"({"labels":{"a":"b"},"ts":0})").ts_given);
  EXPECT_EQ(ok(R"({"labels":{"a":"b"},"pid":null,"ts":null})").pid, 0u);
  // A trailing CR (a client writing \r\n) and surrounding whitespace are fine.
  EXPECT_EQ(*ok("  {\"labels\":{\"step\":\"1\"}}  \r").label("step"), "1");
}

TEST(Annotation, UnknownKeysAreIgnored) {
  const Annotation a = ok(R"({"labels":{"step":"1"},"future_field":{"x":[1,2,3]},"comment":"hi","ts_unit":"ns"})");
  EXPECT_EQ(*a.label("step"), "1");
}

TEST(Annotation, IntegerLabelValuesAreKeptAsText) {
  // An extension (Ingero refuses them): a hand-written client sending numbers still works.
  const Annotation a = ok(R"({"labels":{"step":42,"epoch":-1}})");
  EXPECT_EQ(*a.label("step"), "42");
  EXPECT_EQ(*a.label("epoch"), "-1");
  StepMarker m;
  ASSERT_TRUE(step_marker_of(a, m));
  EXPECT_EQ(m.step, 42);
  EXPECT_EQ(m.epoch, -1);
}

TEST(Annotation, StepValuesThatAreNotNumbers) {
  EXPECT_EQ(label_number("0"), 0);
  EXPECT_EQ(label_number("123456789012345678"), 123456789012345678);
  for (const char* s : {"", "x", "4.5", "-3", "+3", " 3", "1e3", "1234567890123456789"})
    EXPECT_EQ(label_number(s), -1) << s;
  StepMarker m;
  ASSERT_TRUE(step_marker_of(ok(R"({"labels":{"step":"warmup"}})"), m));
  EXPECT_TRUE(m.has_step);
  EXPECT_EQ(m.step, -1);
}

TEST(Annotation, NotJsonSaysWhereAndWhy) {
  std::string e = bad(R"({"labels":{"step":"1"})");  // a partial line: the object is not closed
  EXPECT_EQ(e.rfind("not JSON: ", 0), 0u) << e;
  EXPECT_NE(e.find("column"), std::string::npos) << e;
  e = bad(R"({"labels":{"step":"1"}} trailing)");
  EXPECT_EQ(e.rfind("not JSON: ", 0), 0u) << e;
  EXPECT_EQ(bad("").rfind("not JSON", 0), 0u);
  EXPECT_EQ(bad("hello").rfind("not JSON", 0), 0u);
  EXPECT_EQ(bad(std::string("{\"labels\":{\"step\":\"\xff\"}}")).rfind("not JSON", 0), 0u);  // invalid UTF-8
  EXPECT_EQ(bad(R"([{"labels":{"step":"1"}}])"), "expected a JSON object, got an array");
  EXPECT_EQ(bad("42"), "expected a JSON object, got a number");
}

TEST(Annotation, LabelRules) {
  EXPECT_EQ(bad(R"({"pid":1})"), "labels: missing (a non-empty object is required)");
  EXPECT_EQ(bad(R"({"labels":null})"), "labels: missing (a non-empty object is required)");
  EXPECT_EQ(bad(R"({"labels":{}})"), "labels: empty (at least one label is required)");
  EXPECT_EQ(bad(R"({"labels":["step"]})"), "labels: expected an object, got an array");
  EXPECT_EQ(bad(R"({"labels":{"step":["1"]}})"), "labels.step: expected a string, got an array");
  EXPECT_EQ(bad(R"({"labels":{"step":1.5}})"), "labels.step: expected a string, got a number with a fraction");
  EXPECT_EQ(bad(R"({"labels":{"step":true}})"), "labels.step: expected a string, got a boolean");
  EXPECT_EQ(bad(R"({"labels":{"bad key":"1"}})"), "labels: key \"bad key\" is not 1-64 bytes of A-Za-z0-9_.-");
  EXPECT_EQ(bad(R"({"labels":{"":"1"}})"), "labels: key \"\" is not 1-64 bytes of A-Za-z0-9_.-");
  ok(R"({"labels":{"A-z_0.9":"1"}})");
  const std::string k64(64, 'k'), k65(65, 'k');
  ok("{\"labels\":{\"" + k64 + "\":\"1\"}}");
  EXPECT_NE(bad("{\"labels\":{\"" + k65 + "\":\"1\"}}").find("is not 1-64 bytes"), std::string::npos);
  const std::string v256(256, 'v'), v257(257, 'v');
  ok("{\"labels\":{\"task\":\"" + v256 + "\"}}");
  EXPECT_EQ(bad("{\"labels\":{\"task\":\"" + v257 + "\"}}"), "labels.task: value is 257 bytes, at most 256");
  std::string many = "{\"labels\":{";
  for (int i = 0; i < 33; ++i) many += (i ? "," : "") + std::string("\"k") + std::to_string(i) + "\":\"v\"";
  EXPECT_EQ(bad(many + "}}"), "labels: 33 labels, at most 32");
}

TEST(Annotation, NumericFieldRules) {
  EXPECT_EQ(bad(R"({"labels":{"s":"1"},"ts":"1700000000000000000"})"), "ts: expected an integer, got a string");
  EXPECT_EQ(bad(R"({"labels":{"s":"1"},"ts":1.7e18})"), "ts: expected an integer, got a number with a fraction");
  EXPECT_EQ(bad(R"({"labels":{"s":"1"},"ts":-5})"), "ts: negative (-5)");
  EXPECT_EQ(bad(R"({"labels":{"s":"1"},"ts":9223372036854775808})"),
            "ts: 9223372036854775808 is out of range 0..9223372036854775807");
  EXPECT_EQ(bad(R"({"labels":{"s":"1"},"pid":4294967296})"), "pid: 4294967296 is out of range 0..4294967295");
  EXPECT_EQ(bad(R"({"labels":{"s":"1"},"pid":"12"})"), "pid: expected an integer, got a string");
  EXPECT_EQ(bad(R"({"labels":{"s":"1"},"tid":-1})"), "tid: negative (-1)");
  EXPECT_EQ(bad(R"({"labels":{"s":"1"},"span_start":5})"),
            "span_start and span_end go together (a phase needs both; an instant neither)");
  EXPECT_EQ(bad(R"({"labels":{"s":"1"},"span_start":5,"span_end":4})"), "span_end (4) is before span_start (5)");
  EXPECT_EQ(bad(R"({"labels":{"s":"1"},"v":2})"), "v: protocol version 2 is not supported (this reader speaks 1)");
  EXPECT_EQ(bad(R"({"labels":{"s":"1"},"v":"1"})"), "v: expected an integer, got a string");
}

TEST(Annotation, HugeAndHostileLines) {
  // Over the 16 KiB line limit: refused before any parsing, whatever it holds.
  const std::string pad(annotation_limits::kMaxLineBytes, ' ');
  EXPECT_EQ(bad("{\"labels\":{\"step\":\"1\"}}" + pad), "line is 16407 bytes, over the 16384-byte limit");
  // At the limit: fine.
  const std::string body = "{\"labels\":{\"step\":\"1\"}}";
  ok(body + std::string(annotation_limits::kMaxLineBytes - body.size(), ' '));
  // Nested 8,000 deep within the limit: no recursion blow-up, a plain error.
  const std::string deep = "{\"labels\":{\"step\":\"1\"},\"x\":" + std::string(8000, '[') + std::string(8000, ']') +
                           "}";
  ASSERT_LE(deep.size(), annotation_limits::kMaxLineBytes);
  EXPECT_EQ(*ok(deep).label("step"), "1");
  const std::string open = std::string(16000, '[');
  EXPECT_EQ(bad(open).rfind("not JSON", 0), 0u);
  // NUL bytes and control characters inside strings are escaped data, not framing.
  const Annotation a = ok(R"({"labels":{"note":"a\u0000b\n"}})");
  EXPECT_EQ(a.label("note")->size(), 4u);
  EXPECT_EQ(labels_json(a), R"({"note":"a\u0000b\n"})");
}

TEST(Annotation, LabelsJsonRoundTrip) {
  const Annotation a = ok(R"({"labels":{"step":"42","epoch":"3","run_id":"r\"1"}})");
  const std::string text = labels_json(a);
  EXPECT_EQ(text, R"({"epoch":"3","run_id":"r\"1","step":"42"})");
  std::map<std::string, std::string> back;
  ASSERT_TRUE(parse_labels_json(text, back));
  EXPECT_EQ(back, a.labels);
  EXPECT_FALSE(parse_labels_json("[1]", back));
  EXPECT_TRUE(back.empty());
  EXPECT_FALSE(parse_labels_json(R"({"a":[1]})", back));
  EXPECT_FALSE(parse_labels_json("{", back));
  ASSERT_TRUE(parse_labels_json(R"({"step":7})", back));  // Ingero stores strings; ours too
  EXPECT_EQ(back.at("step"), "7");
}

}  // namespace
}  // namespace ingero
