// Fan-out to nodes' MCP HTTP endpoints (sinks/mcp/fleet_query.h): four local servers on loopback,
// two healthy (the shared Ingero node samples), one slow (accepts, never answers), one down. The
// healthy ones answer, the slow one fails at its deadline without delaying the others past it,
// the down one fails at once, and a wrong token is reported as such.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "sinks/mcp/fleet_query.h"
#include "sinks/mcp/server.h"
#include "sinks/mcp/transport.h"
#include "tests/util/run_command.h"

using namespace ingero;

namespace {

std::string shared_db(const std::string& name) {
  const std::string p = std::string(INGERO_SHARED_DATA) + "/" + name;
  return std::filesystem::exists(p) ? p : "";
}

int listen_socket(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::listen(fd, 8);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

struct HttpNode {
  std::unique_ptr<mcp::Server> server;
  std::atomic<bool> stop{false};
  std::atomic<uint16_t> port{0};
  std::thread t;
  explicit HttpNode(const std::string& db) {
    mcp::ServerOptions o;
    o.db_path = db;
    server = std::make_unique<mcp::Server>(o);
    t = std::thread([this] {
      mcp::HttpOptions ho;
      ho.token = "fleet-token";
      std::string error;
      mcp::run_http(*server, ho, stop, &port, error);
    });
    for (int i = 0; i < 500 && port.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ~HttpNode() {
    stop = true;
    t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port.load()) + "/mcp"; }
};

}  // namespace

TEST(FleetQuery, PartialResultsWithSlowAndDownNodes) {
  const auto a = shared_db("sample-gpu-node-01.db"), b = shared_db("sample-gpu-node-02.db");
  if (a.empty() || b.empty()) GTEST_SKIP() << "shared Ingero sample databases not found";
  HttpNode n1(a), n2(b);
  ASSERT_NE(n1.port.load(), 0);
  ASSERT_NE(n2.port.load(), 0);
  int slow_port = 0, down_port = 0;
  const int slow_fd = listen_socket(slow_port);  // accepts (kernel backlog), never answers
  const int down_fd = listen_socket(down_port);
  ::close(down_fd);  // nothing listens there any more

  FleetQueryOptions o;
  o.token = "fleet-token";
  o.deadline_ms = 1500;
  const std::vector<std::string> urls{n1.url(), "http://127.0.0.1:" + std::to_string(slow_port) + "/mcp", n2.url(),
                                      "http://127.0.0.1:" + std::to_string(down_port) + "/mcp"};
  const auto t0 = std::chrono::steady_clock::now();
  const auto replies = fleet_call(urls, "get_trace_stats", nlohmann::json::object(), o);
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(replies.size(), 4u);
  EXPECT_TRUE(replies[0].ok) << replies[0].error;
  EXPECT_TRUE(replies[2].ok) << replies[2].error;
  EXPECT_FALSE(replies[0].data.empty());
  EXPECT_FALSE(replies[1].ok);
  EXPECT_NE(replies[1].error.find("deadline"), std::string::npos) << replies[1].error;
  EXPECT_GE(replies[1].ms, 1400);
  EXPECT_FALSE(replies[3].ok);
  EXPECT_NE(replies[3].error.find("connect"), std::string::npos) << replies[3].error;
  EXPECT_LT(replies[3].ms, 500);
  EXPECT_LT(wall_ms, 3000) << "nodes are asked in parallel, each with its own deadline";

  // run_sql fan-out with Ingero's argument name, and a wrong token.
  const auto sql = fleet_call({n1.url(), n2.url()}, "run_sql", {{"query", "SELECT count(*) AS n FROM events"}}, o);
  for (const auto& r : sql) EXPECT_TRUE(r.ok) << r.error;
  FleetQueryOptions bad = o;
  bad.token = "wrong";
  const auto denied = fleet_call({n1.url()}, "get_trace_stats", nlohmann::json::object(), bad);
  EXPECT_FALSE(denied[0].ok);
  EXPECT_NE(denied[0].error.find("401"), std::string::npos) << denied[0].error;
  ::close(slow_fd);
}

// The CLI: `explain --nodes` against a real `mcp --http` server, a slow node and a down node.
TEST(FleetQuery, ExplainNodesReportsPartialFailures) {
  const auto db = shared_db("pytorch-dataloader-starvation.db");
  const std::string bin = std::string(INGERO_BINARY_DIR) + "/ingero-pipeline";
  if (db.empty()) GTEST_SKIP() << "shared Ingero sample databases not found";
  if (::access(bin.c_str(), X_OK) != 0) GTEST_SKIP() << bin << " is not built";
  HttpNode n1(db);
  ASSERT_NE(n1.port.load(), 0);
  int slow_port = 0, down_port = 0;
  const int slow_fd = listen_socket(slow_port);
  ::close(listen_socket(down_port));
  const std::string cmd = bin + " explain --token fleet-token --node-timeout 1 --nodes " + n1.url() +
                          ",http://127.0.0.1:" + std::to_string(slow_port) +
                          "/mcp,http://127.0.0.1:" + std::to_string(down_port) + "/mcp 2>&1";
  int rc = -1;
  const std::string out = ingero::test::capture(cmd, &rc);
  ::close(slow_fd);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("unexplained_tail"), std::string::npos) << out;
  EXPECT_NE(out.find("from 1 of 3 node(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("no reply within the deadline"), std::string::npos) << out;
  EXPECT_NE(out.find("Connection refused"), std::string::npos) << out;
}

// The MCP tool query_fleet on a server: chains and sql from two nodes, one down -> a warning.
TEST(FleetQuery, McpQueryFleetTool) {
  const auto a = shared_db("pytorch-dataloader-starvation.db"), b = shared_db("sample-gpu-node-02.db");
  if (a.empty() || b.empty()) GTEST_SKIP() << "shared Ingero sample databases not found";
  HttpNode n1(a), n2(b);
  int down_port = 0;
  ::close(listen_socket(down_port));
  mcp::ServerOptions o;
  o.db_path = b;
  o.fleet_nodes = {n1.url(), n2.url(), "http://127.0.0.1:" + std::to_string(down_port) + "/mcp"};
  o.fleet_token = "fleet-token";
  mcp::Server hub(o);
  hub.handle_message({{"jsonrpc", "2.0"},
                      {"id", 0},
                      {"method", "initialize"},
                      {"params",
                       {{"protocolVersion", "2025-06-18"},
                        {"capabilities", nlohmann::json::object()},
                        {"clientInfo", {{"name", "gtest"}, {"version", "1"}}}}}});
  auto call = [&](const nlohmann::json& args) {
    const nlohmann::json req = {{"jsonrpc", "2.0"},
                                {"id", 1},
                                {"method", "tools/call"},
                                {"params", {{"name", "query_fleet"}, {"arguments", args}}}};
    const auto reply = hub.handle_message(req);
    return reply ? *reply : nlohmann::json();
  };
  auto chains = call({{"action", "chains"}, {"timeout_ms", 3000}});
  ASSERT_TRUE(chains.contains("result")) << chains.dump().substr(0, 400);
  const auto& sc = chains["result"]["structuredContent"];
  EXPECT_EQ(sc["nodes"].size(), 3u) << sc.dump().substr(0, 400);
  EXPECT_EQ(sc["warnings"].size(), 1u) << sc.dump().substr(0, 400);
  ASSERT_FALSE(sc["chains"].empty());
  EXPECT_EQ(sc["chains"][0]["from"], n1.url());
  auto sql = call(
      {{"action", "sql"}, {"query", "SELECT count(*) AS n FROM events"}, {"nodes", n1.url() + "," + n2.url()}});
  const auto& rows = sql["result"]["structuredContent"]["rows"];
  ASSERT_EQ(rows.size(), 2u) << sql.dump().substr(0, 400);
  EXPECT_EQ(sql["result"]["structuredContent"]["columns"][0], "node");
  auto bad = call({{"action", "sql"}});
  EXPECT_EQ(bad["result"]["isError"], true) << bad.dump().substr(0, 300);
}
