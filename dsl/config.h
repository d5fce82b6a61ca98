// X3 configuration shared by grammar.cpp (which instantiates the rules) and parser.cpp (which
// calls them): the iterator, the skipper (whitespace and `#` comments) and the parse context.
// Include only from those two files: it pulls in X3.
#pragma once

#include <boost/spirit/home/x3.hpp>

namespace ingero::dsl::parser {
namespace x3 = boost::spirit::x3;

using iterator_type = const char*;

// ASCII character classes. X3's standard::space/alpha/alnum assert on a byte >= 0x80, and release
// builds hand <cctype> a negative value (undefined behaviour). These compare ranges and sets, so no
// byte of any input reaches a classification function, whatever path the parser (recovery
// included) takes through the text.
inline const auto ascii_space = x3::char_(" \t\n\r\v\f");
inline const auto ascii_alpha = x3::char_('a', 'z') | x3::char_('A', 'Z');
inline const auto ascii_alnum = ascii_alpha | x3::char_('0', '9');

// Whitespace, and comments from `#` to the end of the line. A comment ends at '\n' only, exactly
// as the driver's skip() and the non-ASCII prescan see it (X3's eol would also end it at a bare
// '\r', and the rest of that line would then be parsed as code the prescan took for a comment).
inline const auto skipper = ascii_space | (x3::lit('#') >> *(x3::char_ - x3::lit('\n')));
using skipper_type = std::remove_cv_t<decltype(skipper)>;

using context_type = x3::phrase_parse_context<skipper_type>::type;

// Start of the text being parsed: the on_success handler turns iterators into byte offsets
// relative to it. Set by the parse driver for the duration of one parse call (per thread).
inline thread_local iterator_type g_parse_begin = nullptr;

}  // namespace ingero::dsl::parser
