// `ingero-pipeline rules check|test|plan`: the rule language's command line.
//   rules check FILE...   diagnostics (text or --json); exit 0 clean, 1 errors
//   rules test FILE...    run every inline test; exit 0 all pass, 1 any failure or compile error
//   rules plan FILE...    the compiled plan's canonical text (--ast: the parse tree)
// FILE may be `default` for the embedded pack.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/command.h"
#include "dsl/compiler.h"
#include "rules/pack.h"

namespace {

struct RulesArgs {
  std::vector<std::string> files;
  std::vector<std::string> params;
  bool json = false;
  bool ast = false;
};

bool gather(const RulesArgs& a, std::vector<ingero::dsl::RuleSource>& out, ingero::dsl::CompileOptions& opts) {
  for (const auto& p : a.params) {
    const auto eq = p.find('=');
    if (eq == std::string::npos) {
      std::cerr << "error: --param expects NAME=VALUE, got `" << p << "`\n";
      return false;
    }
    opts.params[p.substr(0, eq)] = p.substr(eq + 1);
  }
  for (const auto& f : a.files) {
    if (f == "default") {
      auto d = ingero::rules::default_rule_sources();
      out.insert(out.end(), d.begin(), d.end());
      continue;
    }
    std::error_code ec;
    std::ifstream in(f, std::ios::binary);
    if (!std::filesystem::is_regular_file(f, ec) || !in) {
      std::cerr << "error: cannot read " << f << " (not a regular file)\n";
      return false;
    }
    // One byte past the compiler's limit is enough for it to report the file as too large.
    std::string text(ingero::dsl::ParseLimits{}.max_bytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    out.push_back({f, std::move(text)});
  }
  opts = ingero::rules::pack_compile_options(opts);
  return true;
}

void print_diags(const ingero::dsl::CompileResult& r, bool json) {
  if (json) std::cout << ingero::dsl::render_diagnostics_json(r.diagnostics);
  else std::cerr << ingero::dsl::render_diagnostics(r.diagnostics);
}

// The rule files of a subcommand with its options; on failure the exit status is set.
struct Inputs {
  std::vector<ingero::dsl::RuleSource> sources;
  ingero::dsl::CompileOptions options;
};
bool load_inputs(const RulesArgs& a, Inputs& in, int& rc) {
  if (gather(a, in.sources, in.options)) return true;
  rc = ingero::cli::kExitInput;
  return false;
}

}  // namespace

static ingero::cli::Registrar reg{
    "rules", 40, [](CLI::App& app, int& rc) {
      auto* cmd = app.add_subcommand("rules", "Check, test and inspect .rules files");
      cmd->require_subcommand(1);
      auto args = std::make_shared<RulesArgs>();
      auto add_common = [&](CLI::App* sub) {
        sub->add_option("files", args->files, "Rule files (`default` = the embedded pack)")->required();
        sub->add_option("--param", args->params, "Override a param: NAME=VALUE");
      };

      auto* check = cmd->add_subcommand("check", "Compile rule files and print diagnostics");
      add_common(check);
      check->add_flag("--json", args->json, "Diagnostics as JSON on stdout");
      check->callback([args, &rc] {
        Inputs in;
        if (!load_inputs(*args, in, rc)) return;
        const auto& src = in.sources;
        const auto& opts = in.options;
        auto r = ingero::dsl::compile_rules(src, opts);
        print_diags(r, args->json);
        if (!args->json && r.ok()) std::cerr << r.rules.size() << " rule(s), " << r.tests.size() << " test(s): ok\n";
        rc = r.ok() ? ingero::cli::kExitOk : ingero::cli::kExitFindings;
      });

      auto* test = cmd->add_subcommand("test", "Run the inline tests of rule files");
      add_common(test);
      test->callback([args, &rc] {
        Inputs in;
        if (!load_inputs(*args, in, rc)) return;
        const auto& src = in.sources;
        const auto& opts = in.options;
        auto r = ingero::dsl::compile_rules(src, opts);
        print_diags(r, false);
        if (!r.ok()) {
          rc = ingero::cli::kExitFindings;
          return;
        }
        size_t failed = 0;
        for (const auto& o : ingero::rules::run_rule_tests(r)) {
          std::cout << (o.passed ? "PASS " : "FAIL ") << o.test.file << ":" << o.test.line << " " << o.test.rule
                    << " / \"" << o.test.name << "\"";
          if (!o.passed) {
            std::cout << ": " << o.detail;
            ++failed;
          }
          std::cout << "\n";
        }
        std::cout << r.tests.size() - failed << " passed, " << failed << " failed\n";
        rc = failed ? ingero::cli::kExitFindings : ingero::cli::kExitOk;
      });

      auto* plan = cmd->add_subcommand("plan", "Print the compiled plan (canonical text)");
      add_common(plan);
      plan->add_flag("--ast", args->ast, "Print the parse tree instead");
      plan->callback([args, &rc] {
        Inputs in;
        if (!load_inputs(*args, in, rc)) return;
        const auto& src = in.sources;
        const auto& opts = in.options;
        if (args->ast) {
          for (const auto& s : src) std::cout << ingero::dsl::dump_ast(s);
          rc = ingero::cli::kExitOk;
          return;
        }
        auto r = ingero::dsl::compile_rules(src, opts);
        print_diags(r, false);
        if (!r.ok()) {
          rc = ingero::cli::kExitFindings;
          return;
        }
        std::cout << r.plan.to_string();
        rc = ingero::cli::kExitOk;
      });
    }};
