#include "sinks/mcp/fleet_query.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <thread>

namespace ingero {
namespace {

using Clock = std::chrono::steady_clock;

struct Url {
  std::string host, port, path;
};

bool parse_url(const std::string& u, Url& out, std::string& error) {
  const std::string scheme = "http://";
  if (u.rfind(scheme, 0) != 0) {
    error = "only http:// URLs are supported";
    return false;
  }
  const std::string rest = u.substr(scheme.size());
  const auto slash = rest.find('/');
  const std::string hostport = rest.substr(0, slash);
  out.path = slash == std::string::npos ? "/mcp" : rest.substr(slash);
  const auto colon = hostport.rfind(':');
  if (colon == std::string::npos) {
    error = "the URL needs a port";
    return false;
  }
  out.host = hostport.substr(0, colon);
  out.port = hostport.substr(colon + 1);
  return !out.host.empty() && !out.port.empty();
}

int remaining_ms(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms > 0 ? static_cast<int>(ms) : 0;
}

// One HTTP/1.1 POST with Connection: close; returns the status and fills headers/body.
bool post(const Url& url, const std::string& token, const std::string& session, const std::string& body,
          Clock::time_point deadline, size_t cap, int& status, std::string& headers, std::string& reply,
          std::string& error) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(url.host.c_str(), url.port.c_str(), &hints, &res) != 0 || !res) {
    error = "cannot resolve " + url.host;
    return false;
  }
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int rc = fd < 0 ? -1 : ::connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (fd < 0) {
    error = "socket failed";
    return false;
  }
  auto fail = [&](const std::string& why) {
    ::close(fd);
    error = why;
    return false;
  };
  if (rc != 0 && errno != EINPROGRESS) return fail(std::string("connect: ") + std::strerror(errno));
  pollfd p{fd, POLLOUT, 0};
  if (rc != 0) {
    if (::poll(&p, 1, remaining_ms(deadline)) <= 0) return fail("connect timed out (deadline)");
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) return fail(std::string("connect: ") + std::strerror(err));
  }
  std::string req = "POST " + url.path + " HTTP/1.1\r\nHost: " + url.host + "\r\nContent-Type: application/json\r\n" +
                    "Accept: application/json, text/event-stream\r\nAuthorization: Bearer " + token + "\r\n" +
                    (session.empty() ? "" : "Mcp-Session-Id: " + session + "\r\n") +
                    "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  size_t sent = 0;
  while (sent < req.size()) {
    p = {fd, POLLOUT, 0};
    if (::poll(&p, 1, remaining_ms(deadline)) <= 0) return fail("send timed out (deadline)");
    const ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN) return fail(std::string("send: ") + std::strerror(errno));
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string in;
  char buf[16384];
  size_t need = std::string::npos;  // total bytes once Content-Length is known
  for (;;) {
    p = {fd, POLLIN, 0};
    if (::poll(&p, 1, remaining_ms(deadline)) <= 0) return fail("no reply within the deadline");
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EAGAIN) continue;
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
    if (in.size() > cap) return fail("reply larger than " + std::to_string(cap) + " bytes");
    const auto hend = in.find("\r\n\r\n");
    if (hend != std::string::npos && need == std::string::npos) {
      std::string h = in.substr(0, hend);
      for (auto& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const auto cl = h.find("content-length:");
      if (cl != std::string::npos) need = hend + 4 + std::strtoull(h.c_str() + cl + 15, nullptr, 10);
    }
    if (need != std::string::npos && in.size() >= need) break;
  }
  ::close(fd);
  const auto hend = in.find("\r\n\r\n");
  if (in.rfind("HTTP/1.", 0) != 0 || hend == std::string::npos) {
    error = "not an HTTP reply";
    return false;
  }
  status = std::atoi(in.c_str() + 9);
  headers = in.substr(0, hend);
  reply = in.substr(hend + 4);
  return true;
}

std::string header_value(const std::string& headers, const std::string& name) {
  std::string lower = headers, key = name;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (auto& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto at = lower.find("\r\n" + key + ":");
  if (at == std::string::npos) return "";
  auto start = at + 2 + key.size() + 1;
  while (start < headers.size() && headers[start] == ' ') ++start;
  const auto end = headers.find("\r\n", start);
  return headers.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

FleetNodeReply ask(const std::string& u, const std::string& tool, const nlohmann::json& args,
                   const FleetQueryOptions& o) {
  FleetNodeReply r;
  r.url = u;
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::milliseconds(o.deadline_ms);
  auto done = [&](const std::string& err) {
    r.error = err;
    r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    return r;
  };
  Url url;
  std::string error;
  if (!parse_url(u, url, error)) return done(error);
  int status = 0;
  std::string headers, body;
  const nlohmann::json init = {{"jsonrpc", "2.0"},
                               {"id", 1},
                               {"method", "initialize"},
                               {"params",
                                {{"protocolVersion", "2025-06-18"},
                                 {"capabilities", nlohmann::json::object()},
                                 {"clientInfo", {{"name", "ingero-pipeline-fleet"}, {"version", "1"}}}}}};
  if (!post(url, o.token, "", init.dump(), deadline, o.max_reply_bytes, status, headers, body, error))
    return done(error);
  if (status == 401) return done("the node refused the bearer token (401)");
  if (status != 200) return done("initialize: HTTP " + std::to_string(status));
  const std::string session = header_value(headers, "Mcp-Session-Id");
  const nlohmann::json call = {{"jsonrpc", "2.0"},
                               {"id", 2},
                               {"method", "tools/call"},
                               {"params", {{"name", tool}, {"arguments", args}}}};
  if (!post(url, o.token, session, call.dump(), deadline, o.max_reply_bytes, status, headers, body, error))
    return done(error);
  if (status != 200) return done(tool + ": HTTP " + std::to_string(status));
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return done("reply is not JSON");
  if (j.contains("error")) return done(tool + ": " + j["error"].value("message", "error"));
  const auto& res = j.value("result", nlohmann::json::object());
  if (res.value("isError", false)) {
    std::string text = "tool error";
    if (res.contains("content") && res["content"].is_array() && !res["content"].empty())
      text = res["content"][0].value("text", text);
    return done(tool + ": " + text.substr(0, 200));
  }
  r.data = res.value("structuredContent", nlohmann::json::object());
  r.ok = true;
  return done("");
}

}  // namespace

std::vector<FleetNodeReply> fleet_call(const std::vector<std::string>& urls, const std::string& tool,
                                       const nlohmann::json& arguments, const FleetQueryOptions& options) {
  std::vector<FleetNodeReply> out(urls.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < urls.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        out[i] = ask(urls[i], tool, arguments, options);
      } catch (...) {
        out[i].url = urls[i];
        out[i].error = "internal error";
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace ingero

namespace ingero {

bool query_fleet(const nlohmann::json& a, const std::vector<std::string>& default_nodes, const std::string& token,
                 nlohmann::json& out, std::string& error) {
  std::vector<std::string> nodes = default_nodes;
  if (a.contains("nodes") && a["nodes"].is_string()) {
    nodes.clear();
    const std::string s = a["nodes"].get<std::string>();
    size_t start = 0;
    while (start <= s.size()) {
      const size_t comma = s.find(',', start);
      std::string n = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!n.empty()) nodes.push_back(n);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (nodes.empty()) {
    error = "no nodes: pass `nodes` (comma-separated http://HOST:PORT/mcp URLs) or start the server with --fleet-nodes";
    return false;
  }
  if (nodes.size() > 256) {
    error = "at most 256 nodes per call";
    return false;
  }
  const std::string action = a.value("action", "chains");
  FleetQueryOptions o;
  o.token = token;
  o.deadline_ms = a.contains("timeout_ms") && a["timeout_ms"].is_number_integer() ? a["timeout_ms"].get<int>() : 5000;
  const size_t limit = a.contains("limit") && a["limit"].is_number_integer() ? a["limit"].get<size_t>() : 20;
  std::string tool;
  nlohmann::json args = nlohmann::json::object();
  if (action == "chains") {
    tool = "get_causal_chains";
    args["limit"] = limit;
  } else if (action == "ops") {
    tool = "get_trace_stats";
  } else if (action == "sql") {
    tool = "run_sql";
    std::string q = a.contains("sql") && a["sql"].is_string()       ? a["sql"].get<std::string>()
                    : a.contains("query") && a["query"].is_string() ? a["query"].get<std::string>()
                                                                    : "";
    if (q.empty()) {
      error = "action sql needs `sql` (or `query`)";
      return false;
    }
    args["sql"] = q;
    args["max_rows"] = std::min<size_t>(limit, 1000);
  } else {
    error = "action must be one of: chains, ops, sql";
    return false;
  }
  const auto replies = fleet_call(nodes, tool, args, o);
  out = {{"action", action}, {"nodes", nlohmann::json::array()}, {"warnings", nlohmann::json::array()}};
  nlohmann::json items = nlohmann::json::array();
  size_t answered = 0;
  for (const auto& r : replies) {
    out["nodes"].push_back({{"url", r.url}, {"ok", r.ok}, {"ms", r.ms}, {"error", r.error}});
    if (!r.ok) {
      out["warnings"].push_back(r.url + ": " + r.error);
      continue;
    }
    ++answered;
    if (action == "chains") {
      for (auto c : r.data.value("chains", nlohmann::json::array())) {
        c["from"] = r.url;
        items.push_back(std::move(c));
      }
    } else if (action == "ops") {
      items.push_back({{"from", r.url}, {"stats", r.data}});
    } else {
      for (const auto& row : r.data.value("rows", nlohmann::json::array())) {
        nlohmann::json withnode = nlohmann::json::array({r.url});
        for (const auto& v : row) withnode.push_back(v);
        items.push_back(std::move(withnode));
      }
      if (!out.contains("columns") && r.data.contains("columns")) {
        nlohmann::json cols = nlohmann::json::array({"node"});
        for (const auto& c : r.data["columns"]) cols.push_back(c);
        out["columns"] = cols;
      }
    }
  }
  if (action == "chains") {
    auto rank = [](const nlohmann::json& c) {
      std::string s = c.value("severity", "");
      for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      return s == "high" ? 3 : s == "medium" ? 2 : s == "low" ? 1 : 0;
    };
    std::stable_sort(items.begin(), items.end(),
                     [&](const nlohmann::json& x, const nlohmann::json& y) { return rank(x) > rank(y); });
    out["chains"] = items;
  } else if (action == "ops") {
    out["per_node"] = items;
    out["note"] = "per-node statistics side by side; quantiles are not merged across nodes";
  } else {
    out["rows"] = items;
  }
  if (!answered) {
    error = "no node answered: " + out["warnings"].dump();
    return false;
  }
  return true;
}

}  // namespace ingero
