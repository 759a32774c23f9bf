// Values of the Jinja interpreter behind chat templates (see chat_template.h).
//
// A Value mirrors the Python object a Jinja2 template would see: undefined, None, bool, int,
// float, str, list, tuple, dict, namespace or a callable. Semantics follow Python where templates
// can observe them (truthiness, ==, ordering, str()/repr() printing, code-point string indexing),
// because the expected outputs come from the reference renderer (Python jinja2 as Hugging Face
// transformers configures it).
//
// Ownership: strings, lists, tuples and dicts are immutable and shared by reference counting, so
// copying a Value is cheap. A namespace is the only mutable container (`{% set ns.x = ... %}`);
// its copies alias the same storage, as in Python.
// Thread-safety: a Value may be read from several threads; a namespace must not be shared between
// concurrent renders (each render creates its own).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tessera::jinja {

class Value;
class Interpreter;
using ValueList = std::vector<Value>;

// Insertion-ordered mapping (Python dicts keep insertion order, which tojson and printing show).
class ValueDict {
 public:
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Replaces the value of an existing key, else appends.
  void set(Value key, Value value);
  // Appends without looking for an existing key: the caller knows the key is new.
  void append_new(Value key, Value value);
  // clear() and size() are defined below Value: clang instantiates the pair where they stand.
  void clear();
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  size_t size() const;

 private:
  std::vector<std::pair<Value, Value>> entries_;
};

struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`, or nullptr. Marks nothing; checking for unexpected
  // arguments is the callee's business (see check_arity).
  const Value* get(size_t index, std::string_view name) const;
  // Fails when more than `max_positional` positional arguments or a keyword outside `names` came.
  Status check_arity(std::string_view callee, size_t max_positional,
                     std::initializer_list<std::string_view> names) const;
};

using NativeFunction = std::function<Result<Value>(Interpreter&, const CallArgs&)>;

// A one-pass iterator, as Jinja's map/select/reject/selectattr/rejectattr/items/unique/batch/
// slice/reverse filters return: always truthy, without len(), consumed by iteration. Items are
// computed eagerly; an error met while computing them is deferred to the first consumption,
// where the lazy reference would raise it (or never, when nothing consumes the iterator).
struct GeneratorState {
  std::string name;  // the producing filter, for printing
  ValueList items;
  size_t pos = 0;    // items before pos are consumed
  Status deferred;
};

struct Callable {
  std::string name;  // for messages and printing
  NativeFunction fn;
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kNamespace, kCallable,
    kGenerator
  };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s);
  static Value list(ValueList items);
  static Value tuple(ValueList items);
  static Value dict(ValueDict d);
  static Value make_namespace(ValueDict d);
  static Value callable(std::string name, NativeFunction fn);
  static Value generator(std::string name, ValueList items, Status deferred = Status::ok());

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // bool counts as a number, as in Python (True + 1 == 2).
  bool is_number() const { return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_integral() const { return kind_ == Kind::kBool || kind_ == Kind::kInt; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_generator() const { return kind_ == Kind::kGenerator; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(as_int()); }
  // Container nesting: 0 for scalars, 1 + the deepest element for lists, tuples, dicts and
  // generators; a namespace counts 1 (its members can change). The interpreter bounds it so that
  // printing, comparing and freeing values cannot recurse without limit.
  uint32_t depth() const { return depth_; }

  const std::string& as_string() const { return *str_; }
  const ValueList& as_list() const { return *list_; }
  const ValueDict& as_dict() const { return *dict_; }
  ValueDict& namespace_dict() const { return *dict_; }
  const Callable& as_callable() const { return *fn_; }
  GeneratorState& generator_state() const { return *gen_; }
  // For undefined values: what was looked up ("'x' is undefined"), used in error messages.
  std::string undefined_message() const;

  // Python truthiness.
  bool truthy() const;
  // Python str(): undefined prints as "", None as "None", lists as "[1, 'a']".
  std::string to_str() const;
  // Python repr().
  std::string repr() const;
  // "str", "int", "list", ... for error messages.
  std::string_view type_name() const;
  // Identity for sameas: same scalar value, or the same container object.
  bool same_as(const Value& other) const;

 private:
  // `active`: the namespaces being printed around this value, to print a cycle as Python does.
  std::string repr_in(std::vector<const ValueDict*>& active) const;

  Kind kind_ = Kind::kUndefined;
  uint32_t depth_ = 0;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> str_;  // string, or the hint of an undefined value
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<ValueDict> dict_;         // const in use for kDict; mutable for kNamespace
  std::shared_ptr<const Callable> fn_;
  std::shared_ptr<GeneratorState> gen_;
};

inline void ValueDict::clear() { entries_.clear(); }
inline size_t ValueDict::size() const { return entries_.size(); }

// Python ==: numbers compare by value across bool/int/float; containers element-wise.
bool py_equal(const Value& a, const Value& b);
// Python <; fails for types without an order (TypeError in Python). Strings compare by code point.
Result<bool> py_less(const Value& a, const Value& b);

// Python float repr: "1.0", "0.30000000000000004", "1e+20", "inf".
std::string format_float(double f);

// json.dumps(value, ensure_ascii, indent, separators, sort_keys) as transformers' tojson filter
// calls it (ensure_ascii defaults to false there). indent < 0 means None.
struct JsonOptions {
  bool ensure_ascii = false;
  int indent = -1;
  std::string item_separator;  // empty: Python's default (", ", or "," when indenting)
  std::string key_separator;   // empty: ": "
  bool has_separators = false;
  bool sort_keys = false;
};
Result<std::string> to_json(const Value& value, const JsonOptions& options);

// Parses JSON text into Values (objects become dicts, arrays lists). Integers that do not fit
// int64 become floats. Fails with the parser's message.
Result<Value> value_from_json(std::string_view json_text);

// UTF-8 helpers with Python's code-point semantics. Invalid bytes decode to U+DC80..U+DCFF
// (Python's surrogateescape) and encode back to the same byte, so any byte string round-trips.
std::u32string decode_utf8(std::string_view s);
std::string encode_utf8(std::u32string_view s);
void append_utf8(std::string& out, char32_t c);
// Python's str.isspace() for one code point.
bool is_py_space(char32_t c);
size_t utf8_length(std::string_view s);
bool is_ascii(std::string_view s);

}  // namespace tessera::jinja
