// Syntax tree of a parsed chat template. Built once by parse_template (jinja_parser.h), then only
// read, so one tree can serve concurrent renders.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/jinja_value.h"

namespace tessera::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

enum class ExprKind : uint8_t {
  kLiteral,  // literal
  kName,     // name
  kList,     // args: items
  kTuple,    // args: items
  kDict,     // args: key0, value0, key1, value1, ...
  kAttr,     // operand.name
  kItem,     // operand[args[0]]
  kSlice,    // operand[args[0]:args[1]:args[2]], absent parts are null
  kCall,     // operand(args..., kwargs...)
  kFilter,   // operand | name(args..., kwargs...); operand is null inside {% filter %} blocks
  kTest,     // operand is [not] name(args...)
  kUnary,    // name is "-" or "+"
  kNot,      // not operand
  kBinary,   // operand name args[0]; name: + - * / // % ** ~
  kAnd,      // operand and args[0]
  kOr,       // operand or args[0]
  kCompare,  // operand ops[0] args[0] ops[1] args[1] ... (chained, as in Python)
  kCond,     // args[0] if operand else args[1] (args[1] null: undefined)
};

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;
  ExprPtr operand;
  std::vector<ExprPtr> args;                             // null entries where documented
  std::vector<std::pair<std::string, ExprPtr>> kwargs;   // kCall, kFilter, kTest
  std::vector<std::string> ops;                          // kCompare: "==", "<", "in", "not in", ...
  bool negated = false;                                  // kTest
};

enum class StmtKind : uint8_t {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // conds[i] -> bodies[i]; else_body
  kFor,          // for targets in expr [if cond] body [else else_body]
  kSet,          // set targets = expr; or set targets[0].attr = expr (namespace)
  kSetBlock,     // set targets[0] [| filter] body endset; expr holds the filter chain or null
  kMacro,        // macro targets[0](params) body
  kBreak,
  kContinue,
  kWith,         // with params... body
  kFilterBlock,  // filter expr body (expr is a filter chain whose innermost operand is null)
  kBlock,        // body rendered in place ({% generation %}, which transformers adds)
};

struct Stmt {
  StmtKind kind = StmtKind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;                    // kFor: the loop filter, or null
  std::vector<ExprPtr> conds;      // kIf
  std::vector<StmtList> bodies;    // kIf
  StmtList body;
  StmtList else_body;
  std::vector<std::string> targets;
  std::string attr;                // kSet on a namespace attribute
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (default may be null), kWith
  // Names bound to undefined when the frame of `body` (and of a for loop's `else_body`) starts:
  // see TemplateAst::undefined_at_start.
  std::vector<std::string> undefined_at_start;
  std::vector<std::string> else_undefined_at_start;
};

struct TemplateAst {
  StmtList body;
  // Jinja decides variable scoping when it compiles: in each frame (the template, a loop
  // iteration, a macro call, a with/set/filter block), a name whose first use in that frame is an
  // assignment, and that no enclosing frame uses, starts undefined, hiding the render context's
  // value of the same name from nested frames until the assignment runs. The parser computes
  // these names (analyze_scopes in jinja_parser.cpp) so that the interpreter can bind them.
  std::vector<std::string> undefined_at_start;
};

}  // namespace tessera::jinja
