// bench --scaling: see bench_scaling.h.
#include "cli/bench_scaling.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "cli/preloaded_source.h"
#include "engine/engine.h"
#include "operators/peer.h"

namespace ingero::cli {
namespace {

using Clock = std::chrono::steady_clock;

ScalingRun run_once(const Plan& plan, const std::vector<Batch>& batches, const TraceMeta& meta, unsigned threads) {
  EngineOptions eo;
  eo.threads = threads;
  PreloadedSource src(batches, meta);
  const auto t = Clock::now();
  const AnalysisResult r = run_plan(plan, src, eo);
  return {std::chrono::duration<double>(Clock::now() - t).count(), r.counters.events_in};
}

// One one-thread run per input, all started together (each thread waits until every other has
// started); returns the wall time from the first start to the last end.
double run_together(const Plan& plan, const std::vector<const std::vector<Batch>*>& inputs, const TraceMeta& meta,
                    std::vector<ScalingRun>& out) {
  const size_t n = inputs.size();
  out.assign(n, {});
  std::vector<Clock::time_point> start(n), end(n);
  std::atomic<size_t> arrived{0};
  std::vector<std::thread> workers;
  workers.reserve(n);
  try {
    for (size_t i = 0; i < n; ++i)
      workers.emplace_back([&, i] {
        arrived.fetch_add(1);
        while (arrived.load() < n) std::this_thread::yield();
        start[i] = Clock::now();
        out[i] = run_once(plan, *inputs[i], meta, 1);
        end[i] = Clock::now();
      });
  } catch (...) {
    // No thread to be had: release the ones started (they wait for all n), join them, report.
    arrived.store(n);
    for (auto& w : workers) w.join();
    throw;
  }
  for (auto& w : workers) w.join();
  const auto first = *std::min_element(start.begin(), start.end());
  const auto last = *std::max_element(end.begin(), end.end());
  return std::chrono::duration<double>(last - first).count();
}

// Batches i, i + n, i + 2n, ... of `batches`, lending their events; the last one is final.
std::vector<Batch> slice(const std::vector<Batch>& batches, size_t i, size_t n) {
  std::vector<Batch> out;
  for (size_t k = i; k < batches.size(); k += n) {
    Batch b;
    b.lent = &batches[k].view();
    b.watermark = batches[k].watermark;
    b.seq = batches[k].seq;
    out.push_back(std::move(b));
  }
  if (!out.empty()) out.back().final = true;
  return out;
}

template <typename F>
double median_over(const std::vector<ScalingRound>& rounds, F&& f) {
  std::vector<double> v;
  v.reserve(rounds.size());
  for (const auto& r : rounds) v.push_back(f(r));
  return median_of(std::move(v));
}

nlohmann::json runs_json(const std::vector<ScalingRun>& runs) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : runs) a.push_back({{"seconds", r.seconds}, {"events", r.events}});
  return a;
}

}  // namespace

std::vector<ScalingRound> measure_scaling(const Plan& plan, const std::vector<Batch>& batches, const TraceMeta& meta,
                                          unsigned threads, unsigned rounds,
                                          const std::function<void(unsigned, const ScalingRound&)>& on_round) {
  std::vector<std::vector<Batch>> slices;
  slices.reserve(threads);
  for (size_t i = 0; i < threads; ++i) slices.push_back(slice(batches, i, threads));
  const std::vector<const std::vector<Batch>*> whole(threads, &batches);
  std::vector<const std::vector<Batch>*> parts;
  parts.reserve(slices.size());
  for (const auto& s : slices) parts.push_back(&s);

  std::vector<ScalingRound> out;
  for (unsigned k = 0; k < rounds; ++k) {
    ScalingRound r;
    // One thread both first and last: the round's reference is the faster of the two, so that a
    // noisy moment in one of them does not pass for a gain of the runs between.
    const ScalingRun first = run_once(plan, batches, meta, 1);
    r.engine = run_once(plan, batches, meta, threads);
    r.copies_wall = run_together(plan, whole, meta, r.copies);
    r.slices_wall = run_together(plan, parts, meta, r.slices);
    const ScalingRun last = run_once(plan, batches, meta, 1);
    r.one = first.seconds <= last.seconds ? first : last;
    r.one.events = first.events == last.events ? first.events : 0;  // 0: the two disagree (bench reports it)
    out.push_back(std::move(r));
    if (on_round) on_round(k, out.back());
  }
  return out;
}

nlohmann::json scaling_json(unsigned threads, const std::vector<ScalingRound>& rounds) {
  nlohmann::json rs = nlohmann::json::array();
  for (const auto& r : rounds)
    rs.push_back({{"one_thread", {{"seconds", r.one.seconds}, {"events", r.one.events}}},
                  {"engine", {{"seconds", r.engine.seconds}, {"events", r.engine.events}}},
                  {"speedup", r.speedup()},
                  {"copies", runs_json(r.copies)},
                  {"copies_wall_seconds", r.copies_wall},
                  {"capacity", r.capacity()},
                  {"slices", runs_json(r.slices)},
                  {"slices_wall_seconds", r.slices_wall},
                  {"time_split_bound", r.time_split_bound()},
                  {"efficiency", r.efficiency()}});
  return {{"threads", threads},
          {"rounds", rs},
          {"median",
           {{"one_thread_seconds", median_over(rounds, [](const ScalingRound& r) { return r.one.seconds; })},
            {"engine_seconds", median_over(rounds, [](const ScalingRound& r) { return r.engine.seconds; })},
            {"speedup", median_over(rounds, [](const ScalingRound& r) { return r.speedup(); })},
            {"capacity", median_over(rounds, [](const ScalingRound& r) { return r.capacity(); })},
            {"time_split_bound", median_over(rounds, [](const ScalingRound& r) { return r.time_split_bound(); })},
            {"efficiency", median_over(rounds, [](const ScalingRound& r) { return r.efficiency(); })}}}};
}

void print_scaling_header(unsigned threads, unsigned rounds) {
  std::printf("scaling      --threads %u against this machine, %u round%s (run phase, replayed from memory):\n",
              threads, rounds, rounds == 1 ? "" : "s");
  std::printf("  %-7s %9s %9s %8s %12s %9s %12s %10s %11s\n", "round", "1 thread", "engine", "speedup", "copies wall",
              "capacity", "slices wall", "time split", "speedup /");
  std::printf("  %-7s %9s %9s %8s %12s %9s %12s %10s %11s\n", "", "s", "s", "", "s", "", "s", "bound", "capacity");
}

void print_scaling_round(unsigned index, const ScalingRound& r) {
  std::printf("  %-7u %9.4f %9.4f %7.2fx %12.4f %8.2fx %12.4f %9.2fx %11.2f\n", index + 1, r.one.seconds,
              r.engine.seconds, r.speedup(), r.copies_wall, r.capacity(), r.slices_wall, r.time_split_bound(),
              r.efficiency());
}

void print_scaling_summary(unsigned threads, const std::vector<ScalingRound>& rounds) {
  const nlohmann::json m = scaling_json(threads, rounds)["median"];
  std::printf("  %-7s %9.4f %9.4f %7.2fx %12s %8.2fx %12s %9.2fx %11.2f\n", "median",
              m["one_thread_seconds"].get<double>(), m["engine_seconds"].get<double>(), m["speedup"].get<double>(), "",
              m["capacity"].get<double>(), "", m["time_split_bound"].get<double>(), m["efficiency"].get<double>());
  std::printf(
      "  capacity: %u x the one-thread time / the wall time of %u copies of that run started together: what\n"
      "    this machine gave %u copies of this work in that round (%u.00x on %u idle cores of their own).\n"
      "  time split bound: %u one-thread runs started together, run i over batches i, i + %u, ...: a split\n"
      "    of time with no merge of partial states.\n",
      threads, threads, threads, threads, threads, threads, threads);
}

}  // namespace ingero::cli
