// The one ordered list of semantic passes. Order matters: each pass reads what the ones before
// it filled into the Module (see dsl/sema.h).
#include "dsl/sema.h"

namespace ingero::dsl {

const std::vector<PassEntry>& check_passes() {
  static const std::vector<PassEntry> passes = {
      {"imports", pass_imports},              // load imported files, reject cycles
      {"symbols", pass_symbols},              // params, lists, defs: duplicates, literals, overrides
      {"structure", pass_structure},          // clauses present, unique, in pipeline order
      {"names", pass_names},                  // names against the event schema and the rule's slots
      {"units", pass_units},                  // types and units of every expression
      {"zero_division", pass_zero_division},  // denominators that may be zero (warnings)
      {"bounds", pass_bounds},                // bounded state: horizons, window counts, sizes
      {"output", pass_output},                // severity, category, templates, evidence
      {"tests", pass_tests},                  // inline test fixtures -> events
  };
  return passes;
}

}  // namespace ingero::dsl
