// `explain --save`: the database it writes keeps the time accounting (whole trace and each chain's)
// the steps, the incidents and the verdict that `explain --json` prints, and read_result gives them
// back the same.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model/result_json.h"
#include "sinks/store/sqlite_store.h"
#include "tests/util/run_command.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

ingero::test::CommandRun run(const std::string& args) {
  return ingero::test::run_command(std::string(INGERO_BINARY_DIR) + "/ingero-pipeline " + args);
}

TEST(ExplainSave, KeepsTheAccountingAndTheSteps) {
  const fs::path dir = fs::temp_directory_path() / ("ip-save-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string demo = (dir / "cpu.db").string(), saved = (dir / "saved.db").string();
  const auto d = run("demo cpu_contention --save " + demo);
  ASSERT_EQ(d.status, 0) << d.err;
  const auto r = run("explain --db " + demo + " --save " + saved + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json printed = json::parse(r.out);
  ASSERT_FALSE(printed["accounting"].empty());
  ASSERT_FALSE(printed["chains"].empty());

  ingero::AnalysisResult back;
  std::string error;
  ASSERT_TRUE(ingero::read_result(saved, back, error)) << error;
  const json stored = ingero::explain_json(back);
  EXPECT_EQ(stored["accounting"], printed["accounting"]);
  EXPECT_EQ(stored.value("steps", json()), printed.value("steps", json()));
  // The incidents and the verdict (ip_incidents, ip_meta `verdict`) come back the same.
  ASSERT_FALSE(printed["incidents"].empty());
  EXPECT_EQ(stored["incidents"], printed["incidents"]);
  EXPECT_EQ(stored["verdict"], printed["verdict"]);
  EXPECT_EQ(stored["bound"], printed["bound"]);
  ASSERT_EQ(stored["chains"].size(), printed["chains"].size());
  size_t with_accounting = 0;
  for (size_t i = 0; i < printed["chains"].size(); ++i) {
    EXPECT_EQ(stored["chains"][i]["id"], printed["chains"][i]["id"]);
    EXPECT_EQ(stored["chains"][i]["accounting"], printed["chains"][i]["accounting"]) << i;
    EXPECT_EQ(stored["chains"][i]["over_time"], printed["chains"][i]["over_time"]) << i;
    with_accounting += printed["chains"][i]["accounting"].is_object() ? 1 : 0;
  }
  EXPECT_GE(with_accounting, 1u);
  // Replaying the saved trace accounts the same.
  const auto again = run("explain --db " + saved + " --json");
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(json::parse(again.out)["accounting"], printed["accounting"]);
  fs::remove_all(dir);
}

// `run` with a SQLite sink writes the results `explain --save` writes: the same incidents (with
// their cost, --gpus and --gpu-hour-price given to both) and the same verdict, read back with
// read_result.
TEST(RunSave, WritesTheIncidentsExplainFinds) {
  const fs::path dir = fs::temp_directory_path() / ("ip-runsave-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string demo = (dir / "cpu.db").string(), saved = (dir / "results.db").string();
  const auto d = run("demo cpu_contention --save " + demo);
  ASSERT_EQ(d.status, 0) << d.err;
  const auto r = run("explain --db " + demo + " --json --gpus 4 --gpu-hour-price 3");
  ASSERT_EQ(r.status, 0) << r.err;
  const json printed = json::parse(r.out);
  ASSERT_FALSE(printed["incidents"].empty());
  {
    std::ofstream cfg(dir / "run.yaml");
    cfg << "version: 1\nsources:\n  - name: demo\n    type: sqlite\n    path: cpu.db\n"
           "sinks:\n  - name: store\n    type: sqlite\n    path: results.db\n    from: [demo, analysis]\n";
  }
  const auto rr = run("run -q --config " + (dir / "run.yaml").string() + " --gpus 4 --gpu-hour-price 3");
  ASSERT_EQ(rr.status, 0) << rr.err;
  ingero::AnalysisResult back;
  std::string error;
  ASSERT_TRUE(ingero::read_result(saved, back, error)) << error;
  const json stored = ingero::explain_json(back);
  EXPECT_EQ(stored["incidents"], printed["incidents"]);
  EXPECT_EQ(stored["verdict"], printed["verdict"]);
  EXPECT_EQ(stored["incidents"][0]["gpus_from"], "--gpus");
  EXPECT_TRUE(stored["incidents"][0]["cost"].is_number());
  fs::remove_all(dir);
}

}  // namespace
