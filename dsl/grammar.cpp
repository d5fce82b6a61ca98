// The one translation unit that instantiates the X3 grammar (compile time: keep it alone).
#include "dsl/grammar_def.h"

namespace ingero::dsl::parser {
BOOST_SPIRIT_INSTANTIATE(top_item_type, iterator_type, context_type)
BOOST_SPIRIT_INSTANTIATE(rule_head_type, iterator_type, context_type)
BOOST_SPIRIT_INSTANTIATE(clause_type, iterator_type, context_type)
BOOST_SPIRIT_INSTANTIATE(expr_type, iterator_type, context_type)
}  // namespace ingero::dsl::parser
