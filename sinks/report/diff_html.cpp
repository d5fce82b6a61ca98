// The HTML page of `diff` (contract in diff_html.h).
#include "sinks/report/diff_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "model/accounting.h"
#include "sinks/report/html_escape.h"

namespace ingero {
namespace {

using nlohmann::json;

std::string str(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}
double num(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}
std::string ms(double ns, bool sign = false) {
  char b[48];
  std::snprintf(b, sizeof b, sign ? "%+.3f ms" : "%.3f ms", ns / 1e6);
  return b;
}

// One colour per accounting bucket (model/accounting.h order).
const char* bucket_colour(uint8_t b) {
  constexpr const char* kColours[acct::kBuckets] = {"#d62728", "#1f77b4", "#17becf", "#2ca02c", "#9467bd",
                                                    "#8c564b", "#7f7f7f", "#ff7f0e", "#e377c2", "#bcbd22",
                                                    "#aec7e8", "#c5b0d5", "#c49c94", "#dddddd"};
  return b < acct::kBuckets ? kColours[b] : "#000";
}

// A stacked bar of one thread's ns per unit by bucket, `scale` ns = the full width.
void stacked_bar(std::ostringstream& h, const json& buckets, double scale) {
  h << "<div class=\"bar\">";
  if (buckets.is_object() && scale > 0)
    for (uint8_t b = 0; b < acct::kBuckets; ++b) {
      const double v = num(buckets, acct::bucket_name(b));
      if (v <= 0) continue;
      char w[32];
      std::snprintf(w, sizeof w, "%.3f", 100 * v / scale);
      h << "<span style=\"width:" << w << "%;background:" << bucket_colour(b) << "\" title=\""
        << html_escape(std::string(acct::bucket_name(b)) + " " + ms(v)) << "\"></span>";
    }
  h << "</div>";
}

}  // namespace

std::string diff_html(const json& r) {
  std::ostringstream h;
  const std::string unit = str(r, "unit").empty() ? "step" : str(r, "unit");
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
    << "<title>ingero-pipeline diff</title><style>"
    << "body{font:14px system-ui,sans-serif;margin:24px;max-width:1100px;color:#222}"
    << "h1{font-size:20px;line-height:1.4}table{border-collapse:collapse;margin:8px 0 20px}"
    << "td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}"
    << "td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}.sig{font-weight:bold}"
    << ".ev{color:#555;font-size:12px;margin:2px 0 0 12px}.muted{color:#777}"
    << ".bar{display:flex;width:420px;height:14px;background:#f4f4f4}.bar span{display:block;height:14px}"
    << ".cause{display:inline-block;height:10px}.key span{display:inline-block;margin-right:10px}"
    << ".key i{display:inline-block;width:10px;height:10px;margin-right:3px}</style></head><body>\n";
  h << "<h1 id=\"verdict\">" << html_escape(str(r, "verdict")) << "</h1>\n";
  for (const auto& n : r.value("notes", json::array()))
    if (n.is_string()) h << "<p class=\"muted\">note: " << html_escape(n.get<std::string>()) << "</p>\n";
  const json& before = r.contains("before") ? r["before"] : json::object();
  const json& after = r.contains("after") ? r["after"] : json::object();
  h << "<p>BEFORE: <code>" << html_escape(str(before, "trace")) << "</code><br>AFTER: <code>"
    << html_escape(str(after, "trace")) << "</code></p>\n";

  if (unit == "step") {
    h << "<h2>Step time of " << html_escape(str(before, "process")) << "</h2>\n<table><tr><th></th><th>mean</th>"
      << "<th>p50</th><th>p99</th><th>steps</th><th>how the step was found</th></tr>\n";
    for (const auto* side : {&before, &after})
      h << "<tr><td>" << (side == &before ? "before" : "after") << "</td><td class=\"n\">" << ms(num(*side, "step_ns"))
        << "</td><td class=\"n\">" << ms(num(*side, "p50_ns")) << "</td><td class=\"n\">" << ms(num(*side, "p99_ns"))
        << "</td><td class=\"n\">" << static_cast<uint64_t>(num(*side, "steps")) << "</td><td>"
        << html_escape(str(*side, "method")) << "</td></tr>\n";
    h << "</table>\n";
  }

  // Causes, largest first as the report orders them; bars scaled to the largest change.
  const json causes = r.value("causes", json::array());
  double largest = 0;
  for (const auto& c : causes) largest = std::max(largest, std::fabs(num(c, "added_ns_per_step")));
  h << "<h2>Causes (time per " << html_escape(unit) << "; <span class=\"sig\">bold</span> = significant)</h2>\n"
    << "<table id=\"causes\"><tr><th>change</th><th></th><th>before</th><th>after</th><th>cause</th></tr>\n";
  for (const auto& c : causes) {
    const double added = num(c, "added_ns_per_step");
    const bool sig = c.value("significant", false);
    char w[32];
    std::snprintf(w, sizeof w, "%.1f", largest > 0 ? 100 * std::fabs(added) / largest : 0);
    h << "<tr" << (sig ? " class=\"sig\"" : "") << "><td class=\"n\">" << ms(added, true)
      << "</td><td style=\"width:120px\"><span class=\"cause\" style=\"width:" << w
      << "%;background:" << (added >= 0 ? "#d62728" : "#2ca02c") << "\"></span></td><td class=\"n\">"
      << ms(num(c, "before_ns")) << "</td><td class=\"n\">" << ms(num(c, "after_ns")) << "</td><td>"
      << html_escape(str(c, "what")) << " <span class=\"muted\">(" << html_escape(str(c, "category")) << ")</span>";
    if (!str(c, "explained_by").empty())
      h << "<div class=\"ev\">explained by " << html_escape(str(c, "explained_by")) << "</div>";
    if (sig)
      for (const auto& e : c.value("evidence", json::array()))
        if (e.is_string()) h << "<div class=\"ev\">" << html_escape(e.get<std::string>()) << "</div>";
    h << "</td></tr>\n";
  }
  h << "</table>\n";

  // Incidents that appeared, vanished or grew: time lost per unit, before and after, with evidence.
  h << "<h2>Incidents (MEDIUM or HIGH on either side; time lost per " << html_escape(unit)
    << ")</h2>\n<table id=\"incidents\"><tr><th>change</th><th>before</th><th>after</th><th>incident</th></tr>\n";
  const json incidents = r.value("incidents", json::array());
  if (incidents.empty()) h << "<tr><td class=\"muted\" colspan=\"4\">none on either side</td></tr>\n";
  for (const auto& in : incidents) {
    auto side = [&in](const char* k) {
      const bool has = in.contains(k) && in[k].is_object();
      return has ? ms(num(in[k], "lost_ns_per_unit")) + " <span class=\"muted\">" +
                       html_escape(str(in[k], "severity")) + "</span>"
                 : std::string("&ndash;");
    };
    std::string who = html_escape(str(in, "process")) +
                      (str(in, "thread").empty() ? "" : "/" + html_escape(str(in, "thread")));
    if (in.contains("node")) who += " node " + html_escape(str(in, "node"));
    if (in.contains("rank") && in["rank"].is_number()) who += " rank " + std::to_string(in["rank"].get<int>());
    const std::string change = str(in, "change");
    h << "<tr" << (change == "appeared" || change == "grew" ? " class=\"sig\"" : "") << "><td>" << html_escape(change)
      << "</td><td class=\"n\">" << side("before") << "</td><td class=\"n\">" << side("after") << "</td><td>"
      << html_escape(str(in, "rule")) << " <span class=\"muted\">(" << html_escape(str(in, "category"))
      << ")</span> on " << who;
    for (const auto& e : in.value("evidence", json::array()))
      if (e.is_string()) h << "<div class=\"ev\">" << html_escape(e.get<std::string>()) << "</div>";
    h << "</td></tr>\n";
  }
  h << "</table>\n";

  // Where each feeding thread's time per unit went, before and after, on one scale.
  const json threads = r.value("threads", json::array());
  double scale = 0;
  for (const auto& t : threads)
    for (const char* side : {"before", "after"}) {
      double sum = 0;
      if (t.contains(side) && t[side].is_object())
        for (const auto& [k, v] : t[side].items()) sum += v.is_number() ? v.get<double>() : 0;
      scale = std::max(scale, sum);
    }
  h << "<h2>Feeding threads of " << html_escape(str(before, "process")) << ": time per " << html_escape(unit)
    << "</h2>\n<p class=\"key\">";
  for (uint8_t b = 0; b < acct::kBuckets; ++b)
    h << "<span><i style=\"background:" << bucket_colour(b) << "\"></i>" << acct::bucket_name(b) << "</span>";
  h << "</p>\n<table id=\"threads\">\n";
  for (const auto& t : threads)
    for (const char* side : {"before", "after"}) {
      h << "<tr><td>" << (side[0] == 'b' ? html_escape(str(t, "thread")) : std::string()) << "</td><td>" << side
        << "</td><td>";
      stacked_bar(h, t.contains(side) ? t[side] : json(), scale);
      h << "</td></tr>\n";
    }
  h << "</table>\n";

  h << "<h2>GPU API ops (calls per " << html_escape(unit) << ", latency)</h2>\n<table id=\"ops\"><tr><th>op</th>"
    << "<th>calls before</th><th>after</th><th>p50 before</th><th>after</th><th>p99 before</th><th>after</th>"
    << "<th>median change</th><th>p</th></tr>\n";
  for (const auto& o : r.value("ops", json::array())) {
    const json& b = o.contains("before") ? o["before"] : json::object();
    const json& a = o.contains("after") ? o["after"] : json::object();
    char buf[160];
    std::snprintf(buf, sizeof buf, "<td class=\"n\">%.2f</td><td class=\"n\">%.2f</td>", num(b, "per_unit"),
                  num(a, "per_unit"));
    h << "<tr" << (o.value("significant", false) ? " class=\"sig\"" : "") << "><td>" << html_escape(str(o, "op"))
      << "</td>" << buf << "<td class=\"n\">" << ms(num(b, "p50_ns")) << "</td><td class=\"n\">" << ms(num(a, "p50_ns"))
      << "</td><td class=\"n\">" << ms(num(b, "p99_ns")) << "</td><td class=\"n\">" << ms(num(a, "p99_ns")) << "</td>";
    std::snprintf(buf, sizeof buf, "<td class=\"n\">%+.1f%%</td><td class=\"n\">%.3g</td>",
                  100 * num(o, "median_change"), num(o, "p"));
    h << buf << "</tr>\n";
  }
  h << "</table>\n<h2>Chains (before &rarr; after)</h2>\n<table id=\"chains\">\n";
  const json chains = r.value("chains", json::array());
  if (chains.empty()) h << "<tr><td class=\"muted\">none on either side</td></tr>\n";
  for (const auto& c : chains)
    h << "<tr><td>" << html_escape(str(c, "change")) << "</td><td>" << html_escape(str(c, "rule")) << " ("
      << html_escape(str(c, "category")) << ")</td><td>" << html_escape(str(c, "process"))
      << (str(c, "thread").empty() ? "" : "/" + html_escape(str(c, "thread"))) << "</td><td class=\"n\">"
      << static_cast<uint64_t>(num(c, "before")) << " &rarr; " << static_cast<uint64_t>(num(c, "after"))
      << "</td></tr>\n";
  h << "</table>\n<p class=\"muted\">ingero-pipeline diff: causes are significant when a Mann-Whitney U test "
    << "over whole seconds gives p &lt; 0.01 and they moved by at least 2% of the step (docs/cli.md).</p>\n"
    << "</body></html>\n";
  return h.str();
}

}  // namespace ingero
