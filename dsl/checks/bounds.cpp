// Pass `bounds`: state is bounded by construction. Every join has a horizon (explicit, or the
// `within` reach), at most 1h; windows are at most 24h and a sliding window overlaps at most 1000
// others; a trend needs a finite window (not `whole`); a peer group compares rows of the same
// window, so its group must be one of the window's keys.
#include "dsl/sema.h"

namespace ingero::dsl {

void pass_bounds(Module& m) {
  constexpr uint64_t kMaxHorizon = 3600ull * 1'000'000'000ull;
  constexpr uint64_t kMaxWindow = 24ull * 3600ull * 1'000'000'000ull;
  for (auto& r : m.rules) {
    if (!r.from || !r.window) continue;
    FileUnit& f = *r.file;
    const auto& w = r.window_node;
    if (w.kind != WindowKind::kWhole && w.size_ns > kMaxWindow && r.window->size)
      m.error_at(f, *r.window->size, "E0502", "windows are at most 24h");
    if (w.kind == WindowKind::kSliding && w.slide_ns > 0 && r.window->slide) {
      if (w.slide_ns > w.size_ns) m.error_at(f, *r.window->slide, "E0505", "`every` must not exceed the window size");
      else if (w.size_ns / w.slide_ns > 1000)
        m.error_at(f, *r.window->slide, "E0505",
                   "each event would be in " + std::to_string(w.size_ns / w.slide_ns) + " windows; the limit is 1000",
                   "slide by at least size/1000");
    }
    for (auto& s : r.steps) {
      // A steps window spans no fixed time and closes key by key as each fills: a join would
      // buffer spans for an unbounded time, a peer group would see its peers' windows at other
      // moments.
      if (w.kind == WindowKind::kSteps && (s.kind == Step::Kind::kJoin || s.kind == Step::Kind::kPeer)) {
        m.error(f, s.pos, s.end, "E0507",
                std::string("a `steps` window cannot be followed by `") +
                    (s.kind == Step::Kind::kJoin ? "join" : "peer") + "` (it spans no fixed time)",
                "compare a key with its own history: `trend VALUE baseline over N windows`");
        continue;
      }
      if (s.kind == Step::Kind::kJoin) {
        auto& jn = s.join_node;
        if (jn.horizon_ns == 0) {
          if (jn.kind == JoinKind::kWithin && s.join->within) {
            jn.horizon_ns = std::max<uint64_t>(jn.within_ns, 1);
          } else if (jn.kind == JoinKind::kOverlap) {
            const bool had_option = std::any_of(s.join->options.begin(), s.join->options.end(),
                                                [](const ast::Option& o) { return o.key.name == "horizon"; });
            if (!had_option)
              m.error_at(
                  f, s.join->name, "E0501",
                  "join `" + jn.name + "` has no horizon: its buffered spans would never be evicted",
                  "add `horizon DURATION` (how long a span may end before the calls it overlaps), e.g. `horizon 2s`");
          }
        }
        if (jn.horizon_ns > kMaxHorizon) {
          for (const auto& o : s.join->options)
            if (o.key.name == "horizon") m.error_at(f, o.value, "E0502", "a join horizon is at most 1h");
        }
        if (jn.kind == JoinKind::kWithin && jn.within_ns > kMaxHorizon && s.join->within)
          m.error_at(f, *s.join->within, "E0502", "`within` is at most 1h");
      }
      if (s.kind == Step::Kind::kTrend && w.kind == WindowKind::kWhole)
        m.error_at(f, *s.trend, "E0503", "a trend compares consecutive windows; a `whole` window has only one",
                   "use `window tumbling DURATION`");
      if (s.kind == Step::Kind::kPeer) {
        if (std::find(w.keys.begin(), w.keys.end(), s.peer_node.group) == w.keys.end())
          m.error_at(f, s.peer->group, "E0506", "peer group `" + s.peer->group.name + "` is not a key of the window",
                     "add it to `by`, e.g. `window tumbling 10s by " + s.peer->group.name + "`");
      }
    }
  }
}

}  // namespace ingero::dsl
