// libFuzzer target for the MCP request handler: arbitrary bytes, split into lines, go through
// Server::handle_line exactly as the stdio transport would feed them. The server is initialised
// once, so inputs reach the methods and tools behind the lifecycle check. Every reply must be a
// single line of valid JSON.
//
//   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
//         -DINGERO_FUZZ=ON -DINGERO_SANITIZE=ON -DINGERO_BUILD_BPF=OFF
//   cmake --build build-fuzz --target mcp_request_fuzz
//   build-fuzz/sinks/mcp/mcp_request_fuzz -max_total_time=60 sinks/mcp/fuzz/corpus
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "sinks/mcp/server.h"

namespace {

ingero::mcp::Server& server() {
  static ingero::mcp::Server* s = [] {
    ingero::mcp::ServerOptions o;
    const char* env = std::getenv("INGERO_FUZZ_DB");
    std::string db = env ? env : std::string(INGERO_SHARED_DATA) + "/sample-gpu-node-01.db";
    o.db_path = db;  // a missing file still fuzzes the protocol: tools then report errors
    o.sql.max_ms = 50;
    o.sql.max_rows = 100;
    o.sql.max_memory_bytes = 32u << 20;
    o.max_message_bytes = 1u << 20;
    auto* srv = new ingero::mcp::Server(o);
    (void)srv->handle_line(
        R"({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{}}})");
    return srv;
  }();
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& srv = server();
  std::string_view input(reinterpret_cast<const char*>(data), size);
  size_t start = 0;
  while (start <= input.size()) {
    size_t nl = input.find('\n', start);
    if (nl == std::string_view::npos) nl = input.size();
    auto reply = srv.handle_line(input.substr(start, nl - start));
    if (reply) {
      if (reply->find('\n') != std::string::npos) std::abort();
      auto parsed = ingero::mcp::Json::parse(*reply, nullptr, false);
      if (parsed.is_discarded()) std::abort();
    }
    start = nl + 1;
  }
  return 0;
}
