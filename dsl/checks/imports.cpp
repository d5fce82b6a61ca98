// Pass `imports`: loads every `import "file"` (relative to the importing file), parses it, and
// rejects missing files, cycles and import trees deeper than 8 or wider than 64 files.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsl/sema.h"

namespace ingero::dsl {
namespace {

constexpr int kMaxDepth = 8;
constexpr size_t kMaxFiles = 64;

// Regular files only (an import of /dev/zero or a FIFO must not hang), and at most one byte past
// the size limit: the parser then reports the file as too large (E0005).
bool default_read(const std::string& path, std::string& text, size_t max_bytes) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  text.assign(max_bytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return true;
}

std::string resolve_path(const std::string& from, const std::string& rel) {
  if (!rel.empty() && rel[0] == '/') return rel;
  const auto dir = std::filesystem::path(from).parent_path();
  return (dir / rel).lexically_normal().string();
}

void load(Module& m, FileUnit& f, std::vector<std::string>& stack) {
  for (const auto& item : f.ast.items) {
    const auto* imp = std::get_if<ast::Import>(&item);
    if (!imp) continue;
    const std::string path = resolve_path(f.src.path(), imp->path.value);
    if (std::find(stack.begin(), stack.end(), path) != stack.end()) {
      m.error_at(f, *imp, "E0102", "import cycle: `" + path + "` imports itself",
                 "move the shared params and defs into a third file");
      continue;
    }
    if (static_cast<int>(stack.size()) >= kMaxDepth) {
      m.error_at(f, *imp, "E0103", "imports nested more than " + std::to_string(kMaxDepth) + " deep");
      continue;
    }
    FileUnit* target = nullptr;
    for (auto& other : m.files)
      if (other->src.path() == path) target = other.get();
    if (!target) {
      if (m.files.size() >= kMaxFiles) {
        m.error_at(f, *imp, "E0103", "more than " + std::to_string(kMaxFiles) + " files imported");
        continue;
      }
      std::string text;
      const bool found = m.opts.read_file ? m.opts.read_file(path, text)
                                          : default_read(path, text, m.opts.limits.max_bytes);
      if (!found) {
        m.error_at(f, imp->path, "E0101", "cannot read imported file `" + path + "`");
        continue;
      }
      auto unit = std::make_unique<FileUnit>();
      unit->src = SourceText(path, std::move(text));
      unit->imported_only = true;
      unit->ast = parse_rules_text(unit->src, m.diags, m.opts.limits);
      target = unit.get();
      m.files.push_back(std::move(unit));
      stack.push_back(path);
      load(m, *target, stack);
      stack.pop_back();
    }
    f.imports.push_back(target);
  }
}

}  // namespace

void pass_imports(Module& m) {
  const size_t n = m.files.size();
  for (size_t i = 0; i < n; ++i) {
    std::vector<std::string> stack{m.files[i]->src.path()};
    load(m, *m.files[i], stack);
  }
}

}  // namespace ingero::dsl
