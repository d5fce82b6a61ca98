// Stack patterns in rules (`where site ~ "..."`, `where stack ~ [...]`): the glob matcher, what the
// compiler lowers them to, and the engine answering them from the trace's stacks — known at open
// (replay) or arriving while the run goes on (live) — with any number of shards.
#include <gtest/gtest.h>

#include <memory>

#include "dsl/compiler.h"
#include "engine/engine.h"
#include "model/expr.h"
#include "model/ops.h"
#include "model/stack.h"
#include "rules/pack.h"

using namespace ingero;

namespace {

ParsedStack py_stack(std::vector<std::tuple<std::string, uint32_t, std::string>> frames) {
  ParsedStack st;
  StackFrame n;
  n.function = "cudaStreamSynchronize";
  n.module = "libcudart.so.13";
  st.frames.push_back(n);
  for (auto& [file, line, fn] : frames) {
    StackFrame f;
    f.kind = FrameKind::kPython;
    f.file = file;
    f.line = line;
    f.function = fn;
    st.frames.push_back(f);
  }
  return st;
}

const char* kRule = R"(
rule step_syncs
  from cuda where op == cudaStreamSynchronize and site ~ ["* in *step", "model.py:*"]
  window tumbling 10s by pid, op
  let n = count(), total = sum(duration)
  require n >= 5
  category implicit_sync
  summary "{n} syncs in {process}"
end
)";

Plan compile(const std::string& text) {
  const auto r = dsl::compile_rules({{"t.rules", text}});
  EXPECT_TRUE(r.ok()) << dsl::render_diagnostics(r.diagnostics);
  return r.plan;
}

// Events of pid 100: 10 syncs with `stack_a` then 10 with `stack_b`, 100 ms apart.
std::vector<Event> syncs(uint64_t stack_a, uint64_t stack_b, uint32_t pid = 100, int count = 20) {
  std::vector<Event> ev;
  for (int i = 0; i < count; ++i) {
    Event e;
    e.ts_ns = 1'000'000'000'000'000'000ull + static_cast<uint64_t>(i) * 100'000'000;
    e.dur_ns = 5'000'000;
    e.id = static_cast<uint64_t>(i) + 1;
    e.pid = e.tid = pid;
    e.source = Source::kCuda;
    e.op = op::kCudaStreamSync;
    e.stack_id = i < count / 2 ? stack_a : stack_b;
    ev.push_back(e);
  }
  return ev;
}

}  // namespace

TEST(StackGlob, Matches) {
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("train.py:*", "train.py:42 in train_step"));
  EXPECT_TRUE(glob_match("* in *step", "train.py:42 in Trainer.train_step"));
  EXPECT_FALSE(glob_match("* in *step", "train.py:42 in step_fn"));
  EXPECT_TRUE(glob_match("*.item*", "tensor.py:1 in Tensor.item"));
  EXPECT_TRUE(glob_match("a?c", "abc"));
  EXPECT_FALSE(glob_match("a?c", "ac"));
  EXPECT_FALSE(glob_match("Train.py:*", "train.py:1 in f"));  // case-sensitive
  EXPECT_TRUE(glob_match("*a*b*c*", "xxaxxbxxcxx"));
  EXPECT_FALSE(glob_match("*a*b*c*", "xxaxxcxxbxx"));
  // Pathological backtracking stays linear-ish (this would take ages with naive recursion).
  EXPECT_FALSE(glob_match(std::string(30, '*') + "b", std::string(10000, 'a')));
}

TEST(StackGlob, SiteAndStackPredicates) {
  const ParsedStack st = py_stack({{"train.py", 42, "train_step"}, {"main.py", 7, "main"}});
  EXPECT_TRUE(stack_matches(*ex::stack_match(ExprOp::kSiteMatch, {"train.py:42 in *"}), st));
  EXPECT_FALSE(stack_matches(*ex::stack_match(ExprOp::kSiteMatch, {"main.py:*"}), st));  // not the site
  EXPECT_TRUE(stack_matches(*ex::stack_match(ExprOp::kStackMatch, {"main.py:*"}), st));  // but a frame
  EXPECT_TRUE(stack_matches(*ex::stack_match(ExprOp::kStackMatch, {"cudaStream* in libcudart*"}), st));
  EXPECT_FALSE(stack_matches(*ex::stack_match(ExprOp::kStackMatch, {"nothing"}), ParsedStack{}));
  // Without a matcher (or a stack), a stack predicate is false, and its negation true.
  Event e;
  e.stack_id = 7;
  const auto m = ex::stack_match(ExprOp::kSiteMatch, {"*"});
  EXPECT_EQ(eval(*m, e), 0.0);
  EXPECT_EQ(eval(*ex::un(ExprOp::kNot, m), e), 1.0);
}

TEST(StackRules, LowersToAStackPredicate) {
  const std::string plan = compile(kRule).to_string();
  EXPECT_NE(plan.find("(site ~ [\"* in *step\", \"model.py:*\"])"), std::string::npos) << plan;
  // A param or list of globs works the same, and --param retargets it.
  const char* with_param = R"(
param fns = ["* in *step"]
rule r
  from cuda where stack ~ fns
  window tumbling 10s by pid
  let n = count()
  require n >= 1
  category c
  summary "{n}"
end
)";
  dsl::CompileOptions o;
  o.params["fns"] = "[\"* in my_loop\", \"x\"]";
  const auto r = dsl::compile_rules({{"p.rules", with_param}}, o);
  ASSERT_TRUE(r.ok()) << dsl::render_diagnostics(r.diagnostics);
  EXPECT_NE(r.plan.to_string().find("(stack ~ [\"* in my_loop\", \"x\"])"), std::string::npos) << r.plan.to_string();
}

TEST(StackRules, ParseTreeShowsTheMatchOperator) {
  const std::string ast = dsl::dump_ast({"t.rules", kRule});
  EXPECT_NE(ast.find("~"), std::string::npos) << ast;
  EXPECT_NE(ast.find("site"), std::string::npos) << ast;
}

TEST(StackRules, ReplayMatchesOnlyTheSitesOfThePattern) {
  const ParsedStack a = py_stack({{"train.py", 42, "train_step"}, {"main.py", 7, "main"}});
  const ParsedStack b = py_stack({{"data.py", 10, "load_batch"}, {"main.py", 5, "main"}});
  const uint64_t ida = stack_content_hash(a), idb = stack_content_hash(b);
  const Plan plan = compile(kRule);
  for (unsigned threads : {1u, 3u}) {
    for (size_t batch : {1u, 7u, 4096u}) {
      TraceMeta meta;
      meta.stacks[ida] = encode_stack(a);
      meta.stacks[idb] = encode_stack(b);
      // pid 100: 10 from train_step (matches); pid 101: 10 from load_batch (does not).
      auto ev = syncs(ida, ida, 100);
      auto other = syncs(idb, idb, 101);
      for (auto& e : other) e.id += 100;
      ev.insert(ev.end(), other.begin(), other.end());
      VectorSource src(ev, batch, meta);
      EngineOptions eo;
      eo.threads = threads;
      const auto res = run_plan(plan, src, eo);
      ASSERT_EQ(res.chains.size(), 1u) << threads << " threads, batch " << batch;
      EXPECT_EQ(res.chains[0].pid, 100u);
      EXPECT_NE(res.chains[0].summary.find("20 syncs"), std::string::npos) << res.chains[0].summary;
    }
  }
}

// A source whose stacks appear part-way through, as a live capture's do: events reference a stack
// the source only knows from event `known_from` on. An event filtered before its stack is known
// does not match; one filtered after it does. The engine reads at most kMaxBatchesInFlight (32,
// engine/engine.cpp) batches ahead of the slowest shard, so with one event per batch every event
// more than 32 batches before `known_from` was filtered without the stack, every event from
// `known_from` on with it, and the ones in between depend on thread timing.
class LateStacksSource final : public EventSource {
 public:
  LateStacksSource(std::vector<Event> ev, uint64_t id, StackTrace st, size_t known_from)
      : ev_(std::move(ev)), id_(id), st_(std::move(st)), known_from_(known_from) {}
  bool next(Batch& out) override {
    if (pos_ >= ev_.size()) return false;
    out = Batch{};
    const size_t n = 1;
    out.events.assign(ev_.begin() + static_cast<long>(pos_), ev_.begin() + static_cast<long>(pos_ + n));
    pos_ += n;
    if (pos_ > known_from_) meta_.stacks[id_] = st_;
    out.seq = ++seq_;
    out.final = pos_ >= ev_.size();
    out.watermark = out.final ? UINT64_MAX : out.events.back().ts_ns;
    return true;
  }
  TraceMeta& meta() override { return meta_; }

 private:
  std::vector<Event> ev_;
  uint64_t id_;
  StackTrace st_;
  size_t known_from_;
  size_t pos_ = 0;
  uint64_t seq_ = 0;
  TraceMeta meta_;
};

TEST(StackRules, LiveStacksArrivingDuringTheRunAreUsed) {
  const ParsedStack a = py_stack({{"model.py", 3, "Net.forward"}});
  const uint64_t ida = stack_content_hash(a);
  const Plan plan = compile(kRule);
  // 200 syncs 10 ms apart (one 10 s window), the stack known from the 181st on.
  auto ev = syncs(ida, ida, 100, 200);
  for (size_t i = 0; i < ev.size(); ++i) ev[i].ts_ns = ev[0].ts_ns + i * 10'000'000;
  constexpr size_t kKnownFrom = 180, kAhead = 32;
  for (unsigned threads : {1u, 2u}) {
    LateStacksSource src(ev, ida, encode_stack(a), kKnownFrom);
    EngineOptions eo;
    eo.threads = threads;
    const auto res = run_plan(plan, src, eo);
    ASSERT_EQ(res.chains.size(), 1u) << threads << " threads";
    const std::string& sum = res.chains[0].summary;
    const size_t matched = std::stoul(sum.substr(0, sum.find(' ')));
    // The 20 events after the stack arrived always match; none more than kAhead batches before.
    EXPECT_GE(matched, ev.size() - kKnownFrom) << threads << " threads: " << sum;
    EXPECT_LE(matched, ev.size() - kKnownFrom + kAhead + 1) << threads << " threads: " << sum;
    if (threads == 1) {
      EXPECT_EQ(matched, ev.size() - kKnownFrom) << sum;  // no read-ahead
    }
  }
}

// `window ... by site`: one row per call site; `{site}` prints it; the chains (ids, values, order)
// do not depend on the thread count or the batch size, although sites are interned in whatever
// order the shards meet them.
TEST(StackRules, WindowBySiteGivesOneChainPerSite) {
  const char* rule = R"R(
rule per_site
  from cuda where op == cudaStreamSynchronize
  window tumbling 10s by pid, site
  let n = count(), total = sum(duration)
  require n >= 5
  category implicit_sync
  summary "{n} syncs from {site} ({total})"
end
)R";
  const Plan plan = compile(rule);
  EXPECT_NE(plan.to_string().find("by=[pid,site]"), std::string::npos) << plan.to_string();
  const ParsedStack a = py_stack({{"train.py", 42, "train_step"}});
  const ParsedStack b = py_stack({{"train.py", 47, "train_step"}});
  const uint64_t ida = stack_content_hash(a), idb = stack_content_hash(b);
  std::vector<std::string> first;
  for (unsigned threads : {1u, 3u}) {
    for (size_t batch : {1u, 3u, 4096u}) {
      TraceMeta meta;
      meta.stacks[ida] = encode_stack(a);
      meta.stacks[idb] = encode_stack(b);
      auto ev = syncs(idb, ida, 100, 30);  // 15 from line 47, then 15 from line 42
      auto more = syncs(0, 0, 100, 6);     // no stack: its own row, "(no stack)"
      for (auto& e : more) e.id += 100, e.ts_ns += 50'000;
      ev.insert(ev.end(), more.begin(), more.end());
      VectorSource src(ev, batch, meta);
      EngineOptions eo;
      eo.threads = threads;
      const auto res = run_plan(plan, src, eo);
      std::vector<std::string> got;
      for (const auto& c : res.chains) got.push_back(c.id + " | " + c.summary);
      ASSERT_EQ(got.size(), 3u) << threads << " threads, batch " << batch;
      if (first.empty()) first = got;
      EXPECT_EQ(got, first) << threads << " threads, batch " << batch;
    }
  }
  std::string all;
  for (const auto& g : first) all += g + "\n";
  EXPECT_NE(all.find("15 syncs from train.py:42 in train_step"), std::string::npos) << all;
  EXPECT_NE(all.find("15 syncs from train.py:47 in train_step"), std::string::npos) << all;
  EXPECT_NE(all.find("6 syncs from (no stack)"), std::string::npos) << all;
  EXPECT_NE(all.find(":pid=100,site=train.py:42,in,train_step:"), std::string::npos) << all;  // chain id
}

TEST(StackRules, PackRuleSyncInStepFixturesPass) {
  const auto& pack = rules::default_rule_pack();
  int ran = 0;
  for (const auto& o : rules::run_rule_tests(pack)) {
    if (o.test.rule != "sync_in_step") continue;
    ++ran;
    EXPECT_TRUE(o.passed) << o.test.name << ": " << o.detail;
  }
  EXPECT_GE(ran, 8);
}
