// The Prometheus exporter (sinks/metrics/prometheus_exporter.h): classic buckets are an exact
// collapse of the gamma = 2^(1/32) sketch, labels stay bounded, /metrics is served over HTTP.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <random>

#include "model/ops.h"
#include "sinks/metrics/prometheus_exporter.h"

using namespace ingero;
using namespace ingero::metrics;

namespace {

Event call(Source s, uint8_t o, uint64_t dur, int16_t rank = 0, uint32_t pid = 100) {
  Event e;
  e.source = s;
  e.op = o;
  e.dur_ns = dur;
  e.rank = rank;
  e.pid = e.tid = pid;
  return e;
}

std::string http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

}  // namespace

TEST(Metrics, SketchIndexIsUpperInclusiveAtPowersOfTwo) {
  // 2^-10 s = 976562.5 ns is not an integer; 2^0 s = 1e9 ns is: exactly on a boundary.
  EXPECT_EQ(sketch_index(1'000'000'000), 0);
  EXPECT_EQ(sketch_index(1'000'000'001), 1);
  EXPECT_EQ(sketch_index(2'000'000'000), 32);
  EXPECT_EQ(sketch_index(500'000'000), -32);
}

TEST(Metrics, ClassicBucketsAreTheExactCountsAtPowersOfTwo) {
  MetricsState s({"n1", "c1", "host", "test"});
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> d(std::log(200e3), 2.0);
  std::vector<uint64_t> durs;
  std::vector<Event> ev;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t v = std::min<uint64_t>(static_cast<uint64_t>(d(rng)) + 1, 60'000'000'000ULL);
    durs.push_back(v);
    ev.push_back(call(Source::kCuda, op::kCudaLaunchKernel, v));
  }
  s.observe(ev, TraceMeta{});
  const auto b = s.classic_buckets("cudaLaunchKernel", "0");
  ASSERT_EQ(b.size(), static_cast<size_t>(kMaxPow2 - kMinPow2 + 2));
  for (int k = kMinPow2; k <= kMaxPow2; ++k) {
    const double le = std::ldexp(1.0, k);
    uint64_t exact = 0;
    for (auto v : durs) exact += static_cast<double>(v) * 1e-9 <= le;
    EXPECT_EQ(b[static_cast<size_t>(k - kMinPow2)], exact) << "le=2^" << k;
  }
  EXPECT_EQ(b.back(), durs.size());
}

TEST(Metrics, RendersBoundedSeries) {
  MetricsState s({"n1", "c1", "host", "test"});
  TraceMeta meta;
  std::vector<Event> ev;
  for (int r = 0; r < 40; ++r) {
    meta.process_names[1000 + r] = "python3 train.py";
    ev.push_back(call(Source::kCuda, op::kCudaStreamSync, 2'000'000, static_cast<int16_t>(r), 1000 + r));
    ev.push_back(call(Source::kNccl, op::kNcclAllReduce, 20'000, static_cast<int16_t>(r), 1000 + r));
  }
  s.observe(ev, meta);
  s.set_drops("ringbuf_full", 7);
  Chain c;
  c.id = "x:1";
  c.category = "cpu_contention";
  c.severity = Severity::kHigh;
  s.add_chains(std::span<const Chain>(&c, 1));
  s.add_chains(std::span<const Chain>(&c, 1));  // the same chain again: counted once
  const std::string text = s.render();
  EXPECT_NE(text.find("gpustall_op_latency_seconds_bucket{op=\"cudaStreamSync\",rank=\"3\",le=\"0.00390625\"} 1"),
            std::string::npos)
      << text.substr(0, 2000);
  EXPECT_NE(text.find("gpustall_events_dropped_total{reason=\"ringbuf_full\"} 7"), std::string::npos);
  EXPECT_NE(text.find("gpustall_chains_total{category=\"cpu_contention\",severity=\"high\"} 1"), std::string::npos);
  EXPECT_NE(text.find("gpustall_sync_wait_seconds_total{rank=\"0\"} 0.002"), std::string::npos);
  EXPECT_NE(text.find("target_info{cluster=\"c1\",node=\"n1\",hostname=\"host\"} 1"), std::string::npos);
  // 40 ranks: the first 16 keep their number, the rest share rank="other".
  EXPECT_NE(text.find("rank=\"other\""), std::string::npos);
  EXPECT_EQ(text.find("rank=\"20\""), std::string::npos);
  // pid and comm only in the info series.
  EXPECT_NE(text.find("gpustall_rank_info{rank=\"0\",pid=\"1000\",comm=\"python3 train.py\"} 1"), std::string::npos);
  EXPECT_EQ(text.find("gpustall_op_latency_seconds_count{pid"), std::string::npos);
}

TEST(Metrics, ServesMetricsOnLoopback) {
  std::string error;
  auto ex = MetricsExporter::start("127.0.0.1:0", {"n1", "c1", "host", "test"}, error);
  ASSERT_TRUE(ex) << error;
  ASSERT_GT(ex->port(), 0);
  std::vector<Event> ev{call(Source::kCuda, op::kCudaLaunchKernel, 5'000)};
  ex->state().observe(ev, TraceMeta{});
  const auto body = http_get(ex->port(), "/metrics");
  EXPECT_NE(body.find("200 OK"), std::string::npos) << body.substr(0, 200);
  EXPECT_NE(body.find("gpustall_op_latency_seconds_count{op=\"cudaLaunchKernel\",rank=\"0\"} 1"), std::string::npos);
  // A busy address is an error, not an exception.
  auto second = MetricsExporter::start("127.0.0.1:" + std::to_string(ex->port()), {}, error);
  EXPECT_FALSE(second);
  EXPECT_NE(error.find("--metrics-addr"), std::string::npos) << error;
}
