#include "template/jinja_interpreter.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>

#include <fmt/format.h>

#include "template/jinja_builtins.h"
#include "template/jinja_parser.h"

namespace tessera::jinja {

// Variables visible at one point of a render: a frame per template, macro call, `with` block and
// loop iteration (Jinja gives each iteration a fresh scope), chained to the enclosing one.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* lookup(std::string_view name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
      for (const auto& [k, v] : s->vars) {
        if (k == name) return &v;
      }
    }
    return nullptr;
  }
  void set(const std::string& name, Value value) {
    for (auto& [k, v] : vars) {
      if (k == name) {
        v = std::move(value);
        return;
      }
    }
    vars.emplace_back(name, std::move(value));
  }
};

namespace {

// A frame's scope, with the names that start undefined in it (see TemplateAst).
std::shared_ptr<Scope> new_frame(const std::shared_ptr<Scope>& parent, const std::vector<std::string>& undefined) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  for (const std::string& name : undefined) s->set(name, Value::undefined(fmt::format("'{}' is undefined", name)));
  return s;
}

// Recursion through exec/eval nests C++ frames; this bound keeps the stack small (well under
// 1 MiB even with sanitizer-sized frames) whatever the template or its macros do.
constexpr int kMaxEvalDepth = 400;
// Values nested deeper than this are refused where templates build them (literals, set), so that
// recursive printing, comparison and destruction stay shallow.
constexpr uint32_t kMaxValueDepth = 200;

Status undefined_error(const Value& v) { return Status::invalid_argument(v.undefined_message()); }

Status type_error(std::string_view op, const Value& a, const Value& b) {
  return Status::invalid_argument(
      fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
}

Result<Value> int_result(bool overflow, int64_t v) {
  if (overflow) return Status::invalid_argument("integer overflow (more than 64 bits)");
  return Value::integer(v);
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// Python slicing of `n` elements: the selected indices.
Result<std::vector<int64_t>> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step) {
  auto as_index = [](const Value& v, const char* what) -> Result<std::optional<int64_t>> {
    if (v.is_undefined() || v.is_none()) return std::optional<int64_t>();
    if (!v.is_integral()) {
      return Status::invalid_argument(fmt::format("slice {} must be an integer or None, not {}", what, v.type_name()));
    }
    return std::optional<int64_t>(v.as_int());
  };
  TESSERA_ASSIGN_OR_RETURN(auto st, as_index(step, "step"));
  const int64_t s = st.value_or(1);
  if (s == 0) return Status::invalid_argument("slice step cannot be zero");
  TESSERA_ASSIGN_OR_RETURN(auto b, as_index(start, "start"));
  TESSERA_ASSIGN_OR_RETURN(auto e, as_index(stop, "stop"));
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x += n;
    if (s > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t lo = clamp(b, s > 0 ? 0 : n - 1);
  const int64_t hi = clamp(e, s > 0 ? n : -1);
  std::vector<int64_t> out;
  if (s > 0) {
    for (int64_t i = lo; i < hi; i += s) out.push_back(i);
  } else {
    for (int64_t i = lo; i > hi; i += s) out.push_back(i);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Template

Result<Template> Template::parse(std::string_view source) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<TemplateAst> ast, parse_template(source));
  Template t;
  t.ast_ = std::shared_ptr<const TemplateAst>(std::move(ast));
  return t;
}

Result<std::string> Template::render(const ValueDict& variables, const RenderOptions& options) const {
  Interpreter interpreter(options);
  return interpreter.render(*ast_, variables);
}

// ---------------------------------------------------------------------------------------------
// Interpreter: statements

Interpreter::Interpreter(const RenderOptions& options) : options_(options) {}
Interpreter::~Interpreter() = default;

Result<std::string> Interpreter::render(const TemplateAst& ast, const ValueDict& variables) {
  auto globals = std::make_shared<Scope>();
  ValueDict functions;
  add_global_functions(functions);
  for (const auto& [k, v] : functions.entries()) globals->set(k.as_string(), v);
  auto context = std::make_shared<Scope>();
  context->parent = globals;
  for (const auto& [k, v] : variables.entries()) {
    if (k.is_string()) context->set(k.as_string(), v);
  }
  root_ = new_frame(context, ast.undefined_at_start);
  std::string out;
  Flow flow = Flow::kNormal;
  Status status = exec_list(ast.body, root_, out, flow);
  root_.reset();
  for (Value& ns : namespaces_) ns.namespace_dict().clear();
  namespaces_.clear();
  if (!status.is_ok()) return status;
  return out;
}

Status Interpreter::charge_iterations(int64_t n) {
  iterations_ += n;
  if (iterations_ > options_.max_loop_iterations) {
    return Status::resource_exhausted(fmt::format(
        "chat template ran more than {} loop iterations; is it looping without end?", options_.max_loop_iterations));
  }
  return Status::ok();
}

Status Interpreter::check_size(size_t bytes) const {
  if (static_cast<int64_t>(bytes) > options_.max_output_bytes) {
    return Status::resource_exhausted(
        fmt::format("chat template built a value of {} bytes, over the {}-byte limit", bytes, options_.max_output_bytes));
  }
  return Status::ok();
}

Status Interpreter::charge_bytes(size_t bytes) {
  TESSERA_RETURN_IF_ERROR(check_size(bytes));
  built_bytes_ += static_cast<int64_t>(bytes);
  if (built_bytes_ / 16 > options_.max_output_bytes) {
    return Status::resource_exhausted(fmt::format(
        "chat template built more than {} bytes of strings; is it looping without end?", 16 * options_.max_output_bytes));
  }
  return Status::ok();
}

int64_t Interpreter::now_unix_seconds() const {
  if (options_.now_unix_seconds >= 0) return options_.now_unix_seconds;
  return static_cast<int64_t>(std::time(nullptr));
}

Status Interpreter::raise(std::string message) {
  raised_ = true;
  return Status::invalid_argument(std::move(message));
}

Status Interpreter::check_depth(const Value& v) const {
  if (v.depth() > kMaxValueDepth) {
    return Status::resource_exhausted(
        fmt::format("chat template built a value nested more than {} levels deep", kMaxValueDepth));
  }
  return Status::ok();
}

Status Interpreter::emit(std::string& out, std::string_view text) {
  emitted_bytes_ += static_cast<int64_t>(text.size());
  if (emitted_bytes_ > options_.max_output_bytes) {
    return Status::resource_exhausted(
        fmt::format("chat template output exceeds {} bytes", options_.max_output_bytes));
  }
  out.append(text);
  return Status::ok();
}

Status Interpreter::exec_list(const StmtList& list, const ScopePtr& scope, std::string& out, Flow& flow) {
  for (const StmtPtr& stmt : list) {
    TESSERA_RETURN_IF_ERROR(exec(*stmt, scope, out, flow));
    if (flow != Flow::kNormal) return Status::ok();
  }
  return Status::ok();
}

Status Interpreter::exec(const Stmt& stmt, const ScopePtr& scope, std::string& out, Flow& flow) {
  if (++eval_depth_ > kMaxEvalDepth) {
    --eval_depth_;
    return Status::resource_exhausted("chat template nests too deeply (recursion limit)");
  }
  Status status;
  switch (stmt.kind) {
    case StmtKind::kText:
      status = emit(out, stmt.text);
      break;
    case StmtKind::kOutput: {
      auto v = eval(*stmt.expr, scope);
      status = v.is_ok() ? emit(out, v->to_str()) : v.status();
      break;
    }
    case StmtKind::kIf: {
      bool taken = false;
      for (size_t i = 0; i < stmt.conds.size() && status.is_ok(); ++i) {
        auto c = eval(*stmt.conds[i], scope);
        if (!c.is_ok()) {
          status = c.status();
        } else if (c->truthy()) {
          taken = true;
          status = exec_list(stmt.bodies[i], scope, out, flow);
          break;
        }
      }
      if (status.is_ok() && !taken) status = exec_list(stmt.else_body, scope, out, flow);
      break;
    }
    case StmtKind::kFor:
      status = exec_for(stmt, scope, out);
      break;
    case StmtKind::kSet:
      status = exec_set(stmt, scope);
      break;
    case StmtKind::kSetBlock: {
      std::string captured;
      Flow inner = Flow::kNormal;
      status = exec_list(stmt.body, new_frame(scope, stmt.undefined_at_start), captured, inner);
      if (status.is_ok()) {
        Value v = Value::string(std::move(captured));
        if (stmt.expr) {
          auto filtered = eval_filter(*stmt.expr, scope, &v);
          if (filtered.is_ok()) v = std::move(filtered).value();
          else status = filtered.status();
        }
        if (status.is_ok()) scope->set(stmt.targets[0], std::move(v));
      }
      break;
    }
    case StmtKind::kMacro: {
      const Stmt* def = &stmt;
      std::weak_ptr<Scope> closure = scope;
      scope->set(stmt.targets[0], Value::callable(stmt.targets[0], [def, closure](Interpreter& in, const CallArgs& a) {
                   return in.call_macro(*def, closure, a);
                 }));
      break;
    }
    case StmtKind::kBreak:
      flow = Flow::kBreak;
      break;
    case StmtKind::kContinue:
      flow = Flow::kContinue;
      break;
    case StmtKind::kWith: {
      auto inner = new_frame(scope, stmt.undefined_at_start);
      for (const auto& [name, expr] : stmt.params) {
        auto v = eval(*expr, scope);
        if (!v.is_ok()) {
          status = v.status();
          break;
        }
        inner->set(name, std::move(v).value());
      }
      if (status.is_ok()) status = exec_list(stmt.body, inner, out, flow);
      break;
    }
    case StmtKind::kFilterBlock: {
      std::string captured;
      Flow inner = Flow::kNormal;
      status = exec_list(stmt.body, new_frame(scope, stmt.undefined_at_start), captured, inner);
      if (status.is_ok()) {
        const Value input = Value::string(std::move(captured));
        auto v = eval_filter(*stmt.expr, scope, &input);
        status = v.is_ok() ? emit(out, v->to_str()) : v.status();
      }
      break;
    }
    case StmtKind::kBlock: {
      Flow inner = Flow::kNormal;
      status = exec_list(stmt.body, new_frame(scope, stmt.undefined_at_start), out, inner);
      break;
    }
  }
  --eval_depth_;
  if (!status.is_ok() && !raised_ && !error_located_ && status.code() == StatusCode::kInvalidArgument) {
    error_located_ = true;
    return Status::invalid_argument(fmt::format("chat template: line {}: {}", stmt.line, status.message()));
  }
  return status;
}

Status Interpreter::exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
  TESSERA_ASSIGN_OR_RETURN(Value iterable, eval(*stmt.expr, scope));
  TESSERA_ASSIGN_OR_RETURN(ValueList items, iterate(iterable));
  auto bind = [&](Scope& s, const Value& item) -> Status {
    if (stmt.targets.size() == 1) {
      s.set(stmt.targets[0], item);
      return Status::ok();
    }
    TESSERA_ASSIGN_OR_RETURN(ValueList parts, iterate(item));
    if (parts.size() != stmt.targets.size()) {
      return Status::invalid_argument(fmt::format("cannot unpack {} values into {} loop variables", parts.size(),
                                                  stmt.targets.size()));
    }
    for (size_t k = 0; k < parts.size(); ++k) s.set(stmt.targets[k], parts[k]);
    return Status::ok();
  };
  if (stmt.cond) {
    ValueList kept;
    for (const Value& item : items) {
      TESSERA_RETURN_IF_ERROR(charge_iterations(1));
      auto s = std::make_shared<Scope>();
      s->parent = scope;
      TESSERA_RETURN_IF_ERROR(bind(*s, item));
      TESSERA_ASSIGN_OR_RETURN(Value keep, eval(*stmt.cond, s));
      if (keep.truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  // Jinja runs the else block unless some iteration reached the end of the body: an empty loop,
  // but also one whose iterations all ended in break/continue (the reference does this).
  bool completed_iteration = false;
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    TESSERA_RETURN_IF_ERROR(charge_iterations(1));
    auto s = new_frame(scope, stmt.undefined_at_start);
    TESSERA_RETURN_IF_ERROR(bind(*s, items[static_cast<size_t>(i)]));
    ValueDict loop;
    loop.append_new(Value::string("index"), Value::integer(i + 1));
    loop.append_new(Value::string("index0"), Value::integer(i));
    loop.append_new(Value::string("revindex"), Value::integer(n - i));
    loop.append_new(Value::string("revindex0"), Value::integer(n - i - 1));
    loop.append_new(Value::string("first"), Value::boolean(i == 0));
    loop.append_new(Value::string("last"), Value::boolean(i == n - 1));
    loop.append_new(Value::string("length"), Value::integer(n));
    loop.append_new(Value::string("depth"), Value::integer(1));
    loop.append_new(Value::string("depth0"), Value::integer(0));
    loop.append_new(Value::string("previtem"),
                    i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
    loop.append_new(Value::string("nextitem"),
                    i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
    loop.append_new(Value::string("cycle"), Value::callable("cycle", [i](Interpreter&, const CallArgs& a) -> Result<Value> {
                      if (a.positional.empty()) return Status::invalid_argument("no items for cycling given");
                      return a.positional[static_cast<size_t>(i) % a.positional.size()];
                    }));
    s->set("loop", Value::dict(std::move(loop)));
    Flow flow = Flow::kNormal;
    TESSERA_RETURN_IF_ERROR(exec_list(stmt.body, s, out, flow));
    if (flow == Flow::kNormal) completed_iteration = true;
    if (flow == Flow::kBreak) break;
  }
  if (!completed_iteration && !stmt.else_body.empty()) {
    auto s = new_frame(scope, stmt.else_undefined_at_start);
    Flow flow = Flow::kNormal;
    return exec_list(stmt.else_body, s, out, flow);
  }
  return Status::ok();
}

Status Interpreter::exec_set(const Stmt& stmt, const ScopePtr& scope) {
  TESSERA_ASSIGN_OR_RETURN(Value v, eval(*stmt.expr, scope));
  TESSERA_RETURN_IF_ERROR(check_depth(v));
  if (!stmt.attr.empty()) {
    const Value* target = scope->lookup(stmt.targets[0]);
    if (target == nullptr || !target->is_namespace()) {
      return Status::invalid_argument("cannot assign attribute on non-namespace object");
    }
    target->namespace_dict().set(Value::string(stmt.attr), std::move(v));
    return Status::ok();
  }
  if (stmt.targets.size() == 1) {
    scope->set(stmt.targets[0], std::move(v));
    return Status::ok();
  }
  TESSERA_ASSIGN_OR_RETURN(ValueList parts, iterate(v));
  if (parts.size() != stmt.targets.size()) {
    return Status::invalid_argument(
        fmt::format("cannot unpack {} values into {} names", parts.size(), stmt.targets.size()));
  }
  for (size_t k = 0; k < parts.size(); ++k) scope->set(stmt.targets[k], parts[k]);
  return Status::ok();
}

Result<Value> Interpreter::call_macro(const Stmt& def, const std::weak_ptr<Scope>& closure, const CallArgs& args) {
  if (call_depth_ >= options_.max_call_depth) {
    return Status::resource_exhausted(
        fmt::format("macro '{}': more than {} nested macro calls", def.targets[0], options_.max_call_depth));
  }
  TESSERA_RETURN_IF_ERROR(charge_iterations(1));
  if (args.positional.size() > def.params.size()) {
    return Status::invalid_argument(
        fmt::format("macro '{}' takes not more than {} argument(s)", def.targets[0], def.params.size()));
  }
  for (const auto& [k, v] : args.keyword) {
    bool known = false;
    for (const auto& p : def.params) known = known || p.first == k;
    if (!known) return Status::invalid_argument(fmt::format("macro '{}' takes no keyword argument '{}'", def.targets[0], k));
  }
  std::shared_ptr<Scope> parent = closure.lock();
  auto scope = new_frame(parent ? parent : root_, def.undefined_at_start);
  for (size_t i = 0; i < def.params.size(); ++i) {
    const auto& [name, default_expr] = def.params[i];
    if (const Value* given = args.get(i, name)) {
      scope->set(name, *given);
    } else if (default_expr) {
      TESSERA_ASSIGN_OR_RETURN(Value v, eval(*default_expr, scope));
      scope->set(name, std::move(v));
    } else {
      scope->set(name, Value::undefined(fmt::format("'{}' is undefined", name)));
    }
  }
  scope->set("varargs", Value::tuple({}));
  scope->set("kwargs", Value::dict({}));
  ++call_depth_;
  std::string out;
  Flow flow = Flow::kNormal;
  Status status = exec_list(def.body, scope, out, flow);
  --call_depth_;
  if (!status.is_ok()) return status;
  return Value::string(std::move(out));
}

// ---------------------------------------------------------------------------------------------
// Interpreter: expressions

Result<Value> Interpreter::eval(const Expr& e, const ScopePtr& scope) {
  if (++eval_depth_ > kMaxEvalDepth) {
    --eval_depth_;
    return Status::resource_exhausted("chat template nests too deeply (recursion limit)");
  }
  auto r = eval_inner(e, scope);
  --eval_depth_;
  return r;
}

Result<CallArgs> Interpreter::eval_args(const Expr& e, const ScopePtr& scope) {
  CallArgs args;
  for (const ExprPtr& a : e.args) {
    TESSERA_ASSIGN_OR_RETURN(Value v, eval(*a, scope));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [k, a] : e.kwargs) {
    TESSERA_ASSIGN_OR_RETURN(Value v, eval(*a, scope));
    args.keyword.emplace_back(k, std::move(v));
  }
  return args;
}

Result<Value> Interpreter::eval_filter(const Expr& e, const ScopePtr& scope, const Value* block_input) {
  Value operand;
  if (!e.operand) {
    operand = *block_input;
  } else if (e.operand->kind == ExprKind::kFilter && block_input != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(operand, eval_filter(*e.operand, scope, block_input));
  } else {
    TESSERA_ASSIGN_OR_RETURN(operand, eval(*e.operand, scope));
  }
  TESSERA_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, scope));
  return apply_filter(e.name, operand, args);
}

Result<Value> Interpreter::eval_inner(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName: {
      const Value* v = scope->lookup(e.name);
      if (v == nullptr) return Value::undefined(fmt::format("'{}' is undefined", e.name));
      return *v;
    }
    case ExprKind::kList: case ExprKind::kTuple: {
      ValueList items;
      items.reserve(e.args.size());
      for (const ExprPtr& a : e.args) {
        TESSERA_ASSIGN_OR_RETURN(Value v, eval(*a, scope));
        items.push_back(std::move(v));
      }
      Value v = e.kind == ExprKind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
      TESSERA_RETURN_IF_ERROR(check_depth(v));
      return v;
    }
    case ExprKind::kDict: {
      ValueDict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        TESSERA_ASSIGN_OR_RETURN(Value k, eval(*e.args[i], scope));
        TESSERA_ASSIGN_OR_RETURN(Value v, eval(*e.args[i + 1], scope));
        if (k.is_undefined() || k.is_sequence() || k.is_dict() || k.is_namespace()) {
          return Status::invalid_argument(fmt::format("unhashable dict key of type '{}'", k.type_name()));
        }
        d.set(std::move(k), std::move(v));
      }
      Value v = Value::dict(std::move(d));
      TESSERA_RETURN_IF_ERROR(check_depth(v));
      return v;
    }
    case ExprKind::kAttr: {
      TESSERA_ASSIGN_OR_RETURN(Value obj, eval(*e.operand, scope));
      return get_attribute(obj, e.name);
    }
    case ExprKind::kItem: {
      TESSERA_ASSIGN_OR_RETURN(Value obj, eval(*e.operand, scope));
      TESSERA_ASSIGN_OR_RETURN(Value key, eval(*e.args[0], scope));
      return get_item(obj, key);
    }
    case ExprKind::kSlice: {
      TESSERA_ASSIGN_OR_RETURN(Value obj, eval(*e.operand, scope));
      Value parts[3];
      for (int k = 0; k < 3; ++k) {
        if (e.args[static_cast<size_t>(k)]) {
          TESSERA_ASSIGN_OR_RETURN(parts[k], eval(*e.args[static_cast<size_t>(k)], scope));
        }
      }
      if (obj.is_undefined()) return undefined_error(obj);
      if (obj.is_string()) {
        const std::u32string cps = decode_utf8(obj.as_string());
        TESSERA_ASSIGN_OR_RETURN(auto idx, slice_indices(static_cast<int64_t>(cps.size()), parts[0], parts[1], parts[2]));
        std::u32string out;
        for (int64_t i : idx) out.push_back(cps[static_cast<size_t>(i)]);
        return Value::string(encode_utf8(out));
      }
      if (obj.is_sequence()) {
        const ValueList& items = obj.as_list();
        TESSERA_ASSIGN_OR_RETURN(auto idx, slice_indices(static_cast<int64_t>(items.size()), parts[0], parts[1], parts[2]));
        ValueList out;
        out.reserve(idx.size());
        for (int64_t i : idx) out.push_back(items[static_cast<size_t>(i)]);
        return obj.kind() == Value::Kind::kTuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
      }
      // Slices compile to plain Python subscripts (no undefined fallback as for x[i]).
      return Status::invalid_argument(fmt::format("'{}' object is not subscriptable", obj.type_name()));
    }
    case ExprKind::kCall: {
      TESSERA_ASSIGN_OR_RETURN(Value callee, eval(*e.operand, scope));
      TESSERA_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, scope));
      return call(callee, args);
    }
    case ExprKind::kFilter:
      return eval_filter(e, scope, nullptr);
    case ExprKind::kTest: {
      TESSERA_ASSIGN_OR_RETURN(Value operand, eval(*e.operand, scope));
      TESSERA_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, scope));
      TESSERA_ASSIGN_OR_RETURN(bool r, apply_test(e.name, operand, args));
      return Value::boolean(r != e.negated);
    }
    case ExprKind::kUnary: {
      TESSERA_ASSIGN_OR_RETURN(Value v, eval(*e.operand, scope));
      if (v.is_undefined()) return undefined_error(v);
      if (!v.is_number()) {
        return Status::invalid_argument(fmt::format("bad operand type for unary {}: '{}'", e.name, v.type_name()));
      }
      if (e.name == "+") return v.is_float() ? v : Value::integer(v.as_int());
      if (v.is_float()) return Value::number(-v.as_double());
      if (v.as_int() == INT64_MIN) return Status::invalid_argument("integer overflow (more than 64 bits)");
      return Value::integer(-v.as_int());
    }
    case ExprKind::kNot: {
      TESSERA_ASSIGN_OR_RETURN(Value v, eval(*e.operand, scope));
      return Value::boolean(!v.truthy());
    }
    case ExprKind::kBinary: {
      TESSERA_ASSIGN_OR_RETURN(Value a, eval(*e.operand, scope));
      TESSERA_ASSIGN_OR_RETURN(Value b, eval(*e.args[0], scope));
      return binary_op(e.name, a, b);
    }
    case ExprKind::kAnd: case ExprKind::kOr: {
      TESSERA_ASSIGN_OR_RETURN(Value a, eval(*e.operand, scope));
      if (a.truthy() == (e.kind == ExprKind::kOr)) return a;
      return eval(*e.args[0], scope);
    }
    case ExprKind::kCompare:
      return eval_compare(e, scope);
    case ExprKind::kCond: {
      TESSERA_ASSIGN_OR_RETURN(Value c, eval(*e.operand, scope));
      if (c.truthy()) return eval(*e.args[0], scope);
      if (e.args[1]) return eval(*e.args[1], scope);
      return Value::undefined("the inline if-expression evaluated to false and has no else");
    }
  }
  return Status::internal("unknown expression kind");
}

Result<Value> Interpreter::eval_compare(const Expr& e, const ScopePtr& scope) {
  TESSERA_ASSIGN_OR_RETURN(Value left, eval(*e.operand, scope));
  for (size_t i = 0; i < e.ops.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(Value right, eval(*e.args[i], scope));
    const std::string& op = e.ops[i];
    bool r = false;
    if (op == "==") {
      r = py_equal(left, right);
    } else if (op == "!=") {
      r = !py_equal(left, right);
    } else if (op == "in" || op == "not in") {
      CallArgs args;
      args.positional.push_back(right);
      TESSERA_ASSIGN_OR_RETURN(bool in, apply_test("in", left, args));
      r = (op == "in") == in;
    } else {
      if (left.is_undefined()) return undefined_error(left);
      if (right.is_undefined()) return undefined_error(right);
      if (op == "<") {
        TESSERA_ASSIGN_OR_RETURN(r, py_less(left, right));
      } else if (op == ">") {
        TESSERA_ASSIGN_OR_RETURN(r, py_less(right, left));
      } else if (op == "<=") {
        TESSERA_ASSIGN_OR_RETURN(bool gt, py_less(right, left));
        r = !gt;
      } else {
        TESSERA_ASSIGN_OR_RETURN(bool lt, py_less(left, right));
        r = !lt;
      }
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Result<Value> Interpreter::binary_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = a.to_str();
    s += b.to_str();
    TESSERA_RETURN_IF_ERROR(charge_bytes(s.size()));
    return Value::string(std::move(s));
  }
  if (op == "%" && a.is_string()) {  // printf-style formatting; an undefined argument prints empty
    TESSERA_ASSIGN_OR_RETURN(std::string out, py_percent_format(a.as_string(), b));
    TESSERA_RETURN_IF_ERROR(charge_bytes(out.size()));
    return Value::string(std::move(out));
  }
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  if (a.is_number() && b.is_number()) {
    const bool floating = a.is_float() || b.is_float();
    const int64_t x = a.as_int();
    const int64_t y = b.as_int();
    int64_t r = 0;
    if (op == "+") {
      if (floating) return Value::number(a.as_double() + b.as_double());
      const bool overflow = __builtin_add_overflow(x, y, &r);
      return int_result(overflow, r);
    }
    if (op == "-") {
      if (floating) return Value::number(a.as_double() - b.as_double());
      const bool overflow = __builtin_sub_overflow(x, y, &r);
      return int_result(overflow, r);
    }
    if (op == "*") {
      if (floating) return Value::number(a.as_double() * b.as_double());
      const bool overflow = __builtin_mul_overflow(x, y, &r);
      return int_result(overflow, r);
    }
    if (op == "/") {
      if (b.as_double() == 0.0) return Status::invalid_argument("division by zero");
      return Value::number(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (b.as_double() == 0.0) return Status::invalid_argument("integer division or modulo by zero");
      if (floating) {
        // CPython's float divmod.
        const double fx = a.as_double();
        const double fy = b.as_double();
        double m = std::fmod(fx, fy);
        double div = (fx - m) / fy;
        if (m != 0 && ((m < 0) != (fy < 0))) {
          m += fy;
          div -= 1.0;
        }
        if (op == "%") return Value::number(m != 0 ? m : std::copysign(0.0, fy));
        double q = 0;
        if (div != 0) {
          q = std::floor(div);
          if (div - q > 0.5) q += 1.0;
        } else {
          q = std::copysign(0.0, fx / fy);
        }
        return Value::number(q);
      }
      if (x == INT64_MIN && y == -1) return Status::invalid_argument("integer overflow (more than 64 bits)");
      return Value::integer(op == "//" ? floor_div(x, y) : floor_mod(x, y));
    }
    if (op == "**") {
      if (!floating && y >= 0) {
        int64_t result = 1;
        int64_t base = x;
        int64_t e = y;
        bool overflow = false;
        while (e > 0 && !overflow) {
          if (e & 1) overflow = __builtin_mul_overflow(result, base, &result);
          e >>= 1;
          if (e > 0 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
        }
        return int_result(overflow, result);
      }
      if (a.as_double() == 0.0 && b.as_double() < 0) {
        return Status::invalid_argument("0.0 cannot be raised to a negative power");
      }
      return Value::number(std::pow(a.as_double(), b.as_double()));
    }
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      TESSERA_RETURN_IF_ERROR(charge_bytes(a.as_string().size() + b.as_string().size()));
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_sequence() && a.kind() == b.kind()) {
      TESSERA_RETURN_IF_ERROR(charge_iterations(static_cast<int64_t>(a.as_list().size() + b.as_list().size())));
      ValueList items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return a.kind() == Value::Kind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    if (a.is_string()) {
      return Status::invalid_argument(fmt::format("can only concatenate str (not \"{}\") to str", b.type_name()));
    }
    return type_error("+", a, b);
  }
  if (op == "*") {
    const Value* seq = a.is_integral() ? &b : &a;
    const Value* count = a.is_integral() ? &a : &b;
    if (count->is_integral() && (seq->is_string() || seq->is_sequence())) {
      const int64_t n = std::max<int64_t>(count->as_int(), 0);
      const size_t unit = seq->is_string() ? seq->as_string().size() : seq->as_list().size();
      if (unit > 0 && n > options_.max_output_bytes / static_cast<int64_t>(unit)) {
        return check_size(static_cast<size_t>(options_.max_output_bytes) + 1);
      }
      if (seq->is_string()) {
        TESSERA_RETURN_IF_ERROR(charge_bytes(unit * static_cast<size_t>(n)));
        std::string out;
        out.reserve(unit * static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) out += seq->as_string();
        return Value::string(std::move(out));
      }
      TESSERA_RETURN_IF_ERROR(charge_iterations(static_cast<int64_t>(unit) * n));
      ValueList items;
      for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq->as_list().begin(), seq->as_list().end());
      return seq->kind() == Value::Kind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    return type_error("*", a, b);
  }
  return type_error(op, a, b);
}

Result<Value> Interpreter::call(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) return undefined_error(callee);
  if (!callee.is_callable()) {
    return Status::invalid_argument(fmt::format("'{}' object is not callable", callee.type_name()));
  }
  TESSERA_ASSIGN_OR_RETURN(Value r, callee.as_callable().fn(*this, args));
  if (r.is_string()) TESSERA_RETURN_IF_ERROR(charge_bytes(r.as_string().size()));
  return r;
}

Result<Value> Interpreter::apply_filter(std::string_view name, const Value& operand, const CallArgs& args) {
  const FilterFn fn = find_filter(name);
  if (fn == nullptr) return Status::invalid_argument(fmt::format("no filter named '{}'", name));
  TESSERA_ASSIGN_OR_RETURN(Value r, fn(*this, operand, args));
  if (r.is_string()) TESSERA_RETURN_IF_ERROR(charge_bytes(r.as_string().size()));
  return r;
}

Result<bool> Interpreter::apply_test(std::string_view name, const Value& operand, const CallArgs& args) {
  const TestFn fn = find_test(name);
  if (fn == nullptr) return Status::invalid_argument(fmt::format("no test named '{}'", name));
  return fn(*this, operand, args);
}

Result<ValueList> Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return ValueList{};
    case Value::Kind::kList: case Value::Kind::kTuple: return v.as_list();
    case Value::Kind::kGenerator: {
      GeneratorState& g = v.generator_state();
      TESSERA_RETURN_IF_ERROR(g.deferred);
      ValueList rest(g.items.begin() + static_cast<std::ptrdiff_t>(g.pos), g.items.end());
      g.pos = g.items.size();
      return rest;
    }
    case Value::Kind::kDict: {
      ValueList keys;
      keys.reserve(v.as_dict().size());
      for (const auto& [k, val] : v.as_dict().entries()) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      TESSERA_RETURN_IF_ERROR(charge_iterations(static_cast<int64_t>(v.as_string().size())));
      ValueList chars;
      for (char32_t c : decode_utf8(v.as_string())) {
        std::string s;
        append_utf8(s, c);
        chars.push_back(Value::string(std::move(s)));
      }
      return chars;
    }
    default:
      return Status::invalid_argument(fmt::format("'{}' object is not iterable", v.type_name()));
  }
}

}  // namespace tessera::jinja
