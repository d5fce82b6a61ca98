// Transports that carry the MCP server: newline-delimited JSON-RPC over stdio, and Streamable
// HTTP bound to loopback.
//
// stdio contract: one message per line on `in_fd`, one reply per line on `out_fd` and nothing
// else on it (logs go to stderr). A reader thread reads and applies notifications/cancelled at
// once; a worker thread runs requests in order, so a long query can be cancelled while it runs.
// A line longer than the server's max_message_bytes is discarded without being buffered and
// answered with -32700. Returns 0 when the input ends (EOF) after finishing queued requests.
//
// HTTP contract (MCP Streamable HTTP, JSON responses): POST <path> with one JSON-RPC message;
// requests get application/json replies, notifications and responses get 202. The listener binds
// 127.0.0.1 unless HttpOptions::bind says otherwise (GET health_path, when set, is the one
// request answered without a token); every request must carry `Authorization: Bearer <token>` (401 otherwise) and,
// when it has an Origin header, a loopback origin (403 otherwise, against DNS rebinding). The
// session id from initialize comes back as Mcp-Session-Id and is required afterwards; DELETE
// ends the session; GET (server-initiated SSE stream) answers 405. Bodies are capped at
// max_message_bytes (413). Runs until `stop` becomes true.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "sinks/mcp/server.h"

namespace ingero::mcp {

int run_stdio(Server& server, int in_fd, int out_fd);

struct HttpOptions {
  uint16_t port = 0;  // 0 = any free port (reported through `bound_port`)
  std::string path = "/mcp";
  std::string token;  // required bearer token (never empty)
  // The address to listen on (IPv4 dotted). Loopback unless the caller chooses otherwise (the
  // agent's --http-addr in a pod); the bearer token is required either way.
  std::string bind = "127.0.0.1";
  // When set, GET <health_path> answers without a token: the function's (status, JSON body).
  // For liveness probes; it must say nothing a stranger should not read.
  std::function<std::pair<int, std::string>()> health;
  std::string health_path = "/healthz";
};

// Returns 0 on a clean stop, non-zero (with `error`) when it cannot listen.
int run_http(Server& server, const HttpOptions& options, std::atomic<bool>& stop, std::atomic<uint16_t>* bound_port,
             std::string& error);

}  // namespace ingero::mcp
