// Filters, tests, methods and globals of the chat-template interpreter: the parts of Jinja2's
// builtins and of Python's str/dict/list methods that Hugging Face chat templates call.
#pragma once

#include <string_view>

#include "template/jinja_value.h"

namespace tessera::jinja {

class Interpreter;

using FilterFn = Result<Value> (*)(Interpreter&, const Value& operand, const CallArgs& args);
using TestFn = Result<bool> (*)(Interpreter&, const Value& operand, const CallArgs& args);

// nullptr when there is no filter or test of that name (the parser rejects such templates).
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

// Attribute lookup as Jinja's sandbox does it: methods of str/dict/list first (as bound
// callables), then dict keys / namespace members; anything else is undefined. Fails for
// mutating methods (the reference renderer's sandbox is immutable) and on undefined operands.
Result<Value> get_attribute(const Value& object, std::string_view name);
// Subscript `object[key]`: sequence index (negative from the end) or dict key, then attribute
// lookup for string keys; missing entries are undefined.
Result<Value> get_item(const Value& object, const Value& key);

// The template globals: range, dict, namespace, raise_exception, strftime_now.
void add_global_functions(ValueDict& globals);

// Python str methods on UTF-8 text, shared by filters and methods (jinja_methods.cpp).
// `chars` null, undefined or None strips whitespace.
std::string py_strip(std::string_view s, const Value* chars, bool left, bool right);
// Case mapping covers ASCII, Latin-1, Greek and Cyrillic (one-to-one mappings only).
std::string py_lower(std::string_view s);
std::string py_upper(std::string_view s);
std::string py_capitalize(std::string_view s);
// sep null/None: split on whitespace runs. maxsplit < 0: no limit.
Result<ValueList> py_split(std::string_view s, const Value* sep, int64_t maxsplit, bool from_right);
std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
// printf-style `fmt % args` (the `%` operator on strings and the `format` filter): a tuple gives
// positional arguments, a dict also serves `%(name)s`, anything else is one argument.
Result<std::string> py_percent_format(std::string_view fmt, const Value& args);

}  // namespace tessera::jinja
