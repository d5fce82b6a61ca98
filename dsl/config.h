// X3 configuration shared by grammar.cpp (which instantiates the rules) and parser.cpp (which
// calls them): the iterator, the skipper (whitespace and `#` comments) and the parse context.
// Include only from those two files: it pulls in X3.
#pragma once

#include <boost/spirit/home/x3.hpp>

namespace ingero::dsl::parser {
namespace x3 = boost::spirit::x3;

using iterator_type = const char*;

// Whitespace, and comments from `#` to the end of the line.
inline const auto skipper = x3::space | (x3::lit('#') >> *(x3::char_ - x3::eol));
using skipper_type = std::remove_cv_t<decltype(skipper)>;

using context_type = x3::phrase_parse_context<skipper_type>::type;

// Start of the text being parsed: the on_success handler turns iterators into byte offsets
// relative to it. Set by the parse driver for the duration of one parse call (per thread).
inline thread_local iterator_type g_parse_begin = nullptr;

}  // namespace ingero::dsl::parser
