// The chat-template interpreter: renders a parsed template (jinja_ast.h) against a dict of
// variables, with the semantics of Python jinja2 as Hugging Face transformers configures it
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls, the `generation`
// tag, and the globals raise_exception and strftime_now plus an unescaped tojson filter).
//
// Rendering is bounded: output size, loop iterations, macro recursion and evaluation depth all
// have limits, and exceeding one is an error, never a hang or a stack overflow.
// Thread-safety: a Template is immutable after parse; render() may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "template/jinja_ast.h"
#include "template/jinja_value.h"

namespace tessera::jinja {

struct RenderOptions {
  int64_t max_output_bytes = int64_t{32} << 20;  // also caps any string or list built on the way
  int64_t max_loop_iterations = 1'000'000;       // for-loop iterations + filter/map steps + macro calls
  int max_call_depth = 64;                       // nested macro calls
  // strftime_now's clock, seconds since the Unix epoch, formatted in local time; < 0: now.
  int64_t now_unix_seconds = -1;
};

class Template {
 public:
  // Syntax errors: InvalidArgument "syntax error at line L, column C: ...".
  static Result<Template> parse(std::string_view source);

  // `variables` become the template's globals (beside range, dict, namespace, raise_exception,
  // strftime_now). Errors: raise_exception(msg) -> InvalidArgument carrying exactly msg; other
  // runtime errors -> InvalidArgument "chat template: line N: ..."; limits -> ResourceExhausted.
  Result<std::string> render(const ValueDict& variables, const RenderOptions& options) const;

 private:
  std::shared_ptr<const TemplateAst> ast_;
};

struct Scope;

// One render's state. Builtins (jinja_builtins.cpp) call back into it for limits, calls of
// callables, and for filters/tests applied by name (map, select, ...).
class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options);
  ~Interpreter();

  Result<std::string> render(const TemplateAst& ast, const ValueDict& variables);

  // Counts `n` steps toward max_loop_iterations.
  Status charge_iterations(int64_t n);
  // Fails when a value of `bytes` (or elements) would exceed the output limit.
  Status check_size(size_t bytes) const;
  // Counts `bytes` of string built toward the render's total (16x the output limit), so that
  // a loop that copies a large string over and over ends in an error rather than running for
  // hours; also applies check_size.
  Status charge_bytes(size_t bytes);
  int64_t now_unix_seconds() const;
  // raise_exception(message): the render fails with exactly this message.
  Status raise(std::string message);
  // Fails when `v` nests containers deeper than the interpreter allows.
  Status check_depth(const Value& v) const;
  // Namespaces are the only values that can reference themselves; the render empties the ones
  // it created when it ends, so that such cycles do not outlive it.
  void track_namespace(const Value& ns) { namespaces_.push_back(ns); }

  Result<Value> call(const Value& callee, const CallArgs& args);
  Result<Value> apply_filter(std::string_view name, const Value& operand, const CallArgs& args);
  Result<bool> apply_test(std::string_view name, const Value& operand, const CallArgs& args);
  // Python iteration: list/tuple items, dict keys, string characters; undefined is empty.
  Result<ValueList> iterate(const Value& v);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using ScopePtr = std::shared_ptr<Scope>;

  Status exec_list(const StmtList& list, const ScopePtr& scope, std::string& out, Flow& flow);
  Status exec(const Stmt& stmt, const ScopePtr& scope, std::string& out, Flow& flow);
  Status exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  Status exec_set(const Stmt& stmt, const ScopePtr& scope);
  Status emit(std::string& out, std::string_view text);

  Result<Value> eval(const Expr& e, const ScopePtr& scope);
  Result<Value> eval_inner(const Expr& e, const ScopePtr& scope);
  Result<CallArgs> eval_args(const Expr& e, const ScopePtr& scope);
  Result<Value> eval_filter(const Expr& e, const ScopePtr& scope, const Value* block_input);
  Result<Value> eval_compare(const Expr& e, const ScopePtr& scope);
  Result<Value> binary_op(std::string_view op, const Value& a, const Value& b);
  Result<Value> call_macro(const Stmt& def, const std::weak_ptr<Scope>& closure, const CallArgs& args);

  RenderOptions options_;
  int64_t emitted_bytes_ = 0;
  int64_t built_bytes_ = 0;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
  bool error_located_ = false;  // the pending error already names its line
  bool raised_ = false;         // the pending error came from raise_exception
  ScopePtr root_;
  std::vector<Value> namespaces_;
};

}  // namespace tessera::jinja
