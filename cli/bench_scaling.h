// `bench --scaling N`: how the engine's multi-thread run scales, set against what this machine
// gives the same work in the same moment.
//
// A speedup alone does not say whether the engine or the machine falls short: on a shared VM two
// busy vCPUs may not give two cores' worth (docs/history/issue-12.md, part 21: two copies of the same
// one-thread run at once took up to 1.5x as long as one alone). So each round, from the batches
// already in memory, runs back to back:
// - one: the analysis on one thread, alone, first and again last in the round: the faster of the
//   two is the round's one-thread time;
// - engine: the analysis at --threads T (the engine's own split);
// - copies: T one-thread runs of the whole trace started together, one per thread. capacity =
//   T x one / their wall time: the speedup a split that added no work and shared nothing would
//   reach in that round, i.e. what the machine gives T copies of this work;
// - slices: T one-thread runs started together, run i over batches i, i + T, i + 2T, ...: a split
//   of time with no merge of the partial states, the most such a design could give here.
// Every run's event count is reported, so a run that read nothing cannot pass for a fast one.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "model/plan.h"
#include "model/trace.h"

namespace ingero::cli {

struct ScalingRun {
  double seconds = 0;
  uint64_t events = 0;
};

struct ScalingRound {
  ScalingRun one, engine;
  std::vector<ScalingRun> copies, slices;
  double copies_wall = 0, slices_wall = 0;  // first start to last end

  double speedup() const { return engine.seconds > 0 ? one.seconds / engine.seconds : 0; }
  double capacity() const {
    return copies_wall > 0 ? static_cast<double>(copies.size()) * one.seconds / copies_wall : 0;
  }
  double time_split_bound() const { return slices_wall > 0 ? one.seconds / slices_wall : 0; }
  double efficiency() const { return capacity() > 0 ? speedup() / capacity() : 0; }
};

// Runs `rounds` rounds over `batches` (as a reader produced them; events may be lent) with the
// engine at `threads` (>= 2), calling on_round after each.
std::vector<ScalingRound> measure_scaling(const Plan& plan, const std::vector<Batch>& batches, const TraceMeta& meta,
                                          unsigned threads, unsigned rounds,
                                          const std::function<void(unsigned, const ScalingRound&)>& on_round);

// {"threads", "rounds": [...], "median": {...}}; every field in docs/cli.md.
nlohmann::json scaling_json(unsigned threads, const std::vector<ScalingRound>& rounds);

// The table's header, one round's line, and the medians with what each column means.
void print_scaling_header(unsigned threads, unsigned rounds);
void print_scaling_round(unsigned index, const ScalingRound& r);
void print_scaling_summary(unsigned threads, const std::vector<ScalingRound>& rounds);

}  // namespace ingero::cli
