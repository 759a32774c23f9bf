#include "template/jinja_parser.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "template/jinja_builtins.h"
#include "template/jinja_lexer.h"

namespace tessera::jinja {
namespace {

// Deep enough for any real template, shallow enough that recursive descent (and the recursive
// evaluation of the tree later) cannot exhaust the stack, even under sanitizers.
constexpr int kMaxNesting = 128;

using TT = Token::Type;

ExprPtr make_expr(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Result<std::unique_ptr<TemplateAst>> run() {
    auto ast = std::make_unique<TemplateAst>();
    std::string found;
    TESSERA_ASSIGN_OR_RETURN(ast->body, parse_body({}, &found));
    return ast;
  }

 private:
  // RAII guard on the recursion depth.
  class Nest {
   public:
    explicit Nest(int& depth) : depth_(depth) { ++depth_; }
    ~Nest() { --depth_; }
    bool too_deep() const { return depth_ > kMaxNesting; }

   private:
    int& depth_;
  };

  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  void advance() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  bool is_op(std::string_view op) const { return cur().type == TT::kOp && cur().text == op; }
  bool is_name(std::string_view name) const { return cur().type == TT::kName && cur().text == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TT::kBlockEnd: return "end of statement block";
      case TT::kVarEnd: return "end of print statement";
      case TT::kBlockBegin: return "begin of statement block";
      case TT::kVarBegin: return "begin of print statement";
      case TT::kEof: return "end of template";
      case TT::kText: return "template data";
      case TT::kString: return "string literal";
      default: return fmt::format("'{}'", t.text);
    }
  }

  Status error_at(const Token& t, std::string_view what) const {
    return Status::invalid_argument(fmt::format("syntax error at line {}, column {}: {}", t.line, t.column, what));
  }
  Status unexpected() const { return error_at(cur(), fmt::format("unexpected {}", describe(cur()))); }
  Status too_deep() const { return error_at(cur(), "template nested too deeply"); }

  Status expect_op(std::string_view op) {
    if (skip_op(op)) return Status::ok();
    return error_at(cur(), fmt::format("unexpected {}, expected '{}'", describe(cur()), op));
  }
  Status expect_block_end() {
    if (cur().type == TT::kBlockEnd) {
      advance();
      return Status::ok();
    }
    return error_at(cur(), fmt::format("unexpected {}, expected end of statement block", describe(cur())));
  }
  Result<std::string> expect_identifier() {
    if (cur().type != TT::kName) return error_at(cur(), fmt::format("expected a name, got {}", describe(cur())));
    std::string name = cur().text;
    advance();
    return name;
  }

  // ---- statements --------------------------------------------------------------------------

  // Parses until one of `end_tags` opens a block tag; the tag name is consumed and stored in
  // `found`, the rest of that tag is left to the caller. Without end tags, parses to the end.
  Result<StmtList> parse_body(std::initializer_list<std::string_view> end_tags, std::string* found) {
    Nest nest(depth_);
    if (nest.too_deep()) return too_deep();
    const Token opening = i_ > 0 ? toks_[i_ - 1] : cur();
    StmtList body;
    while (true) {
      const Token& t = cur();
      if (t.type == TT::kEof) {
        if (end_tags.size() == 0) return body;
        std::string wanted;
        for (std::string_view tag : end_tags) wanted += fmt::format("{}'{}'", wanted.empty() ? "" : " or ", tag);
        return error_at(t, fmt::format("unexpected end of template, expected {} (block opened at line {})",
                                       wanted, opening.line));
      }
      if (t.type == TT::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        advance();
        continue;
      }
      if (t.type == TT::kVarBegin) {
        advance();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = t.line;
        TESSERA_ASSIGN_OR_RETURN(s->expr, parse_tuple(true));
        if (cur().type != TT::kVarEnd) {
          return error_at(cur(), fmt::format("unexpected {}, expected end of print statement", describe(cur())));
        }
        advance();
        body.push_back(std::move(s));
        continue;
      }
      if (t.type != TT::kBlockBegin) return unexpected();
      advance();
      if (cur().type != TT::kName) return error_at(cur(), "expected a tag name");
      const std::string tag = cur().text;
      if (std::find(end_tags.begin(), end_tags.end(), tag) != end_tags.end()) {
        advance();
        *found = tag;
        return body;
      }
      TESSERA_ASSIGN_OR_RETURN(StmtPtr stmt, parse_statement(end_tags));
      body.push_back(std::move(stmt));
    }
  }

  Result<StmtPtr> parse_statement(std::initializer_list<std::string_view> end_tags) {
    const Token& t = cur();
    const std::string tag = t.text;
    auto s = std::make_unique<Stmt>();
    s->line = t.line;
    advance();
    if (tag == "if") return parse_if(std::move(s));
    if (tag == "for") return parse_for(std::move(s));
    if (tag == "set") return parse_set(std::move(s));
    if (tag == "macro") return parse_macro(std::move(s));
    if (tag == "with") return parse_with(std::move(s));
    if (tag == "filter") return parse_filter_block(std::move(s));
    if (tag == "generation") {
      s->kind = StmtKind::kBlock;
      TESSERA_RETURN_IF_ERROR(expect_block_end());
      std::string found;
      TESSERA_ASSIGN_OR_RETURN(s->body, parse_body({"endgeneration"}, &found));
      TESSERA_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return error_at(t, fmt::format("'{}' outside loop", tag));
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      TESSERA_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
    static constexpr std::string_view kUnsupported[] = {"include", "extends", "import", "from", "block",
                                                        "call", "do", "autoescape", "trans"};
    if (std::find(std::begin(kUnsupported), std::end(kUnsupported), tag) != std::end(kUnsupported)) {
      return error_at(t, fmt::format("tag '{}' is not supported in chat templates", tag));
    }
    std::string msg = fmt::format("unknown tag '{}'", tag);
    if (end_tags.size() > 0) msg += fmt::format(", expected '{}'", *(end_tags.end() - 1));
    return error_at(t, msg);
  }

  Result<StmtPtr> parse_if(StmtPtr s) {
    s->kind = StmtKind::kIf;
    while (true) {
      TESSERA_ASSIGN_OR_RETURN(ExprPtr cond, parse_tuple(false));
      TESSERA_RETURN_IF_ERROR(expect_block_end());
      std::string found;
      TESSERA_ASSIGN_OR_RETURN(StmtList body, parse_body({"elif", "else", "endif"}, &found));
      s->conds.push_back(std::move(cond));
      s->bodies.push_back(std::move(body));
      if (found == "elif") continue;
      if (found == "else") {
        TESSERA_RETURN_IF_ERROR(expect_block_end());
        TESSERA_ASSIGN_OR_RETURN(s->else_body, parse_body({"endif"}, &found));
      }
      TESSERA_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
  }

  Result<std::vector<std::string>> parse_targets() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    while (true) {
      TESSERA_ASSIGN_OR_RETURN(std::string name, expect_identifier());
      names.push_back(std::move(name));
      if (!skip_op(",")) break;
      if (cur().type != TT::kName) break;  // trailing comma
    }
    if (paren) TESSERA_RETURN_IF_ERROR(expect_op(")"));
    return names;
  }

  Result<StmtPtr> parse_for(StmtPtr s) {
    s->kind = StmtKind::kFor;
    TESSERA_ASSIGN_OR_RETURN(s->targets, parse_targets());
    if (!skip_name("in")) return error_at(cur(), fmt::format("expected 'in', got {}", describe(cur())));
    TESSERA_ASSIGN_OR_RETURN(s->expr, parse_tuple(false));
    if (skip_name("if")) {
      TESSERA_ASSIGN_OR_RETURN(s->cond, parse_expression(true));
    }
    if (is_name("recursive")) return error_at(cur(), "recursive loops are not supported in chat templates");
    TESSERA_RETURN_IF_ERROR(expect_block_end());
    std::string found;
    ++loop_depth_;
    auto body = parse_body({"endfor", "else"}, &found);
    --loop_depth_;
    if (!body.is_ok()) return body.status();
    s->body = std::move(body).value();
    if (found == "else") {
      TESSERA_RETURN_IF_ERROR(expect_block_end());
      TESSERA_ASSIGN_OR_RETURN(s->else_body, parse_body({"endfor"}, &found));
    }
    TESSERA_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_set(StmtPtr s) {
    if (cur().type == TT::kName && peek().type == TT::kOp && peek().text == ".") {
      s->targets.push_back(cur().text);
      advance();
      advance();
      TESSERA_ASSIGN_OR_RETURN(s->attr, expect_identifier());
    } else {
      TESSERA_ASSIGN_OR_RETURN(s->targets, parse_targets());
    }
    if (skip_op("=")) {
      s->kind = StmtKind::kSet;
      TESSERA_ASSIGN_OR_RETURN(s->expr, parse_tuple(true));
      TESSERA_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
    if (!s->attr.empty() || s->targets.size() != 1) return unexpected();
    s->kind = StmtKind::kSetBlock;
    if (is_op("|")) {
      TESSERA_ASSIGN_OR_RETURN(s->expr, parse_filter_chain(nullptr));
    }
    TESSERA_RETURN_IF_ERROR(expect_block_end());
    std::string found;
    TESSERA_ASSIGN_OR_RETURN(s->body, parse_body({"endset"}, &found));
    TESSERA_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_macro(StmtPtr s) {
    s->kind = StmtKind::kMacro;
    TESSERA_ASSIGN_OR_RETURN(std::string name, expect_identifier());
    s->targets.push_back(std::move(name));
    TESSERA_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (!s->params.empty()) TESSERA_RETURN_IF_ERROR(expect_op(","));
      if (is_op(")")) break;
      TESSERA_ASSIGN_OR_RETURN(std::string param, expect_identifier());
      ExprPtr def;
      if (skip_op("=")) {
        TESSERA_ASSIGN_OR_RETURN(def, parse_expression(true));
      } else if (!s->params.empty() && s->params.back().second) {
        return error_at(cur(), "non-default argument follows default argument");
      }
      s->params.emplace_back(std::move(param), std::move(def));
    }
    advance();
    TESSERA_RETURN_IF_ERROR(expect_block_end());
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    std::string found;
    auto body = parse_body({"endmacro"}, &found);
    loop_depth_ = saved_loop_depth;
    if (!body.is_ok()) return body.status();
    s->body = std::move(body).value();
    if (cur().type == TT::kName) advance();  // optional macro name after endmacro
    TESSERA_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_with(StmtPtr s) {
    s->kind = StmtKind::kWith;
    while (cur().type != TT::kBlockEnd) {
      if (!s->params.empty()) TESSERA_RETURN_IF_ERROR(expect_op(","));
      TESSERA_ASSIGN_OR_RETURN(std::string name, expect_identifier());
      TESSERA_RETURN_IF_ERROR(expect_op("="));
      TESSERA_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
      s->params.emplace_back(std::move(name), std::move(value));
    }
    advance();
    std::string found;
    TESSERA_ASSIGN_OR_RETURN(s->body, parse_body({"endwith"}, &found));
    TESSERA_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_filter_block(StmtPtr s) {
    s->kind = StmtKind::kFilterBlock;
    // The chain starts with a filter name, without the leading '|'.
    TESSERA_ASSIGN_OR_RETURN(s->expr, parse_one_filter(nullptr));
    TESSERA_ASSIGN_OR_RETURN(s->expr, parse_filter_chain(std::move(s->expr)));
    TESSERA_RETURN_IF_ERROR(expect_block_end());
    std::string found;
    TESSERA_ASSIGN_OR_RETURN(s->body, parse_body({"endfilter"}, &found));
    TESSERA_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  // ---- expressions -------------------------------------------------------------------------

  // An expression, or an implicit tuple `a, b` (as in `{{ a, b }}` and `{% set x = a, b %}`).
  Result<ExprPtr> parse_tuple(bool with_condexpr) {
    const int line = cur().line;
    TESSERA_ASSIGN_OR_RETURN(ExprPtr first, parse_expression(with_condexpr));
    if (!is_op(",")) return first;
    auto tuple = make_expr(ExprKind::kTuple, line);
    tuple->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == TT::kBlockEnd || cur().type == TT::kVarEnd || is_name("if")) break;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(with_condexpr));
      tuple->args.push_back(std::move(item));
    }
    return tuple;
  }

  Result<ExprPtr> parse_expression(bool with_condexpr) {
    Nest nest(depth_);
    if (nest.too_deep()) return too_deep();
    if (!with_condexpr) return parse_or();
    TESSERA_ASSIGN_OR_RETURN(ExprPtr expr, parse_or());
    while (is_name("if")) {
      const int line = cur().line;
      advance();
      auto cond = make_expr(ExprKind::kCond, line);
      TESSERA_ASSIGN_OR_RETURN(cond->operand, parse_or());
      cond->args.push_back(std::move(expr));
      if (skip_name("else")) {
        TESSERA_ASSIGN_OR_RETURN(ExprPtr other, parse_expression(true));
        cond->args.push_back(std::move(other));
      } else {
        cond->args.push_back(nullptr);
      }
      expr = std::move(cond);
    }
    return expr;
  }

  Result<ExprPtr> parse_or() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
    while (is_name("or")) {
      auto node = make_expr(ExprKind::kOr, cur().line);
      advance();
      node->operand = std::move(left);
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
      node->args.push_back(std::move(right));
      left = std::move(node);
    }
    return left;
  }

  Result<ExprPtr> parse_and() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
    while (is_name("and")) {
      auto node = make_expr(ExprKind::kAnd, cur().line);
      advance();
      node->operand = std::move(left);
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
      node->args.push_back(std::move(right));
      left = std::move(node);
    }
    return left;
  }

  Result<ExprPtr> parse_not() {
    if (is_name("not")) {
      Nest nest(depth_);
      if (nest.too_deep()) return too_deep();
      auto node = make_expr(ExprKind::kNot, cur().line);
      advance();
      TESSERA_ASSIGN_OR_RETURN(node->operand, parse_not());
      return node;
    }
    return parse_compare();
  }

  Result<ExprPtr> parse_compare() {
    const int line = cur().line;
    TESSERA_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
    ExprPtr node;
    while (true) {
      std::string op;
      if (cur().type == TT::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == TT::kName && peek().text == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        break;
      }
      if (!node) {
        node = make_expr(ExprKind::kCompare, line);
        node->operand = std::move(first);
      }
      TESSERA_ASSIGN_OR_RETURN(ExprPtr rhs, parse_math1());
      node->ops.push_back(std::move(op));
      node->args.push_back(std::move(rhs));
    }
    return node ? std::move(node) : std::move(first);
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, int line) {
    auto node = make_expr(ExprKind::kBinary, line);
    node->name = std::move(op);
    node->operand = std::move(left);
    node->args.push_back(std::move(right));
    return node;
  }

  Result<ExprPtr> parse_math1() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, parse_concat());
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      advance();
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, parse_concat());
      left = binary(op, std::move(left), std::move(right), line);
    }
    return left;
  }

  Result<ExprPtr> parse_concat() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, parse_math2());
    while (is_op("~")) {
      const int line = cur().line;
      advance();
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, parse_math2());
      left = binary("~", std::move(left), std::move(right), line);
    }
    return left;
  }

  Result<ExprPtr> parse_math2() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, parse_pow());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      advance();
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, parse_pow());
      left = binary(op, std::move(left), std::move(right), line);
    }
    return left;
  }

  Result<ExprPtr> parse_pow() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, parse_unary(true));
    while (is_op("**")) {
      const int line = cur().line;
      advance();
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, parse_unary(true));
      left = binary("**", std::move(left), std::move(right), line);
    }
    return left;
  }

  Result<ExprPtr> parse_unary(bool with_filter) {
    Nest nest(depth_);
    if (nest.too_deep()) return too_deep();
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make_expr(ExprKind::kUnary, cur().line);
      node->name = cur().text;
      advance();
      TESSERA_ASSIGN_OR_RETURN(node->operand, parse_unary(false));
    } else {
      TESSERA_ASSIGN_OR_RETURN(node, parse_primary());
    }
    TESSERA_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
    if (with_filter) {
      TESSERA_ASSIGN_OR_RETURN(node, parse_filter_expr(std::move(node)));
    }
    return node;
  }

  Result<ExprPtr> parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    if (t.type == TT::kName) {
      auto node = make_expr(ExprKind::kLiteral, line);
      if (t.text == "true" || t.text == "True") node->literal = Value::boolean(true);
      else if (t.text == "false" || t.text == "False") node->literal = Value::boolean(false);
      else if (t.text == "none" || t.text == "None") node->literal = Value::none();
      else {
        node->kind = ExprKind::kName;
        node->name = t.text;
      }
      advance();
      return node;
    }
    if (t.type == TT::kString) {
      std::string s;
      while (cur().type == TT::kString) {  // adjacent literals concatenate, as in Python
        s += cur().text;
        advance();
      }
      auto node = make_expr(ExprKind::kLiteral, line);
      node->literal = Value::string(std::move(s));
      return node;
    }
    if (t.type == TT::kInt || t.type == TT::kFloat) {
      auto node = make_expr(ExprKind::kLiteral, line);
      node->literal = t.type == TT::kInt ? Value::integer(t.int_value) : Value::number(t.float_value);
      advance();
      return node;
    }
    if (skip_op("(")) {
      if (skip_op(")")) return make_expr(ExprKind::kTuple, line);
      TESSERA_ASSIGN_OR_RETURN(ExprPtr first, parse_expression(true));
      if (skip_op(")")) return first;
      auto tuple = make_expr(ExprKind::kTuple, line);
      tuple->args.push_back(std::move(first));
      while (skip_op(",")) {
        if (is_op(")")) break;
        TESSERA_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
        tuple->args.push_back(std::move(item));
      }
      TESSERA_RETURN_IF_ERROR(expect_op(")"));
      return tuple;
    }
    if (skip_op("[")) {
      auto list = make_expr(ExprKind::kList, line);
      while (!is_op("]")) {
        if (!list->args.empty()) TESSERA_RETURN_IF_ERROR(expect_op(","));
        if (is_op("]")) break;
        TESSERA_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
        list->args.push_back(std::move(item));
      }
      advance();
      return list;
    }
    if (skip_op("{")) {
      auto dict = make_expr(ExprKind::kDict, line);
      while (!is_op("}")) {
        if (!dict->args.empty()) TESSERA_RETURN_IF_ERROR(expect_op(","));
        if (is_op("}")) break;
        TESSERA_ASSIGN_OR_RETURN(ExprPtr key, parse_expression(true));
        TESSERA_RETURN_IF_ERROR(expect_op(":"));
        TESSERA_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        dict->args.push_back(std::move(key));
        dict->args.push_back(std::move(value));
      }
      advance();
      return dict;
    }
    if (t.type == TT::kVarEnd || t.type == TT::kBlockEnd || t.type == TT::kEof) {
      return error_at(t, fmt::format("expected an expression, got {}", describe(t)));
    }
    return unexpected();
  }

  Result<ExprPtr> parse_postfix(ExprPtr node) {
    while (true) {
      const int line = cur().line;
      if (skip_op(".")) {
        if (cur().type == TT::kInt) {  // x.0 is x[0]
          auto item = make_expr(ExprKind::kItem, line);
          item->operand = std::move(node);
          auto key = make_expr(ExprKind::kLiteral, line);
          key->literal = Value::integer(cur().int_value);
          item->args.push_back(std::move(key));
          advance();
          node = std::move(item);
          continue;
        }
        auto attr = make_expr(ExprKind::kAttr, line);
        TESSERA_ASSIGN_OR_RETURN(attr->name, expect_identifier());
        attr->operand = std::move(node);
        node = std::move(attr);
      } else if (skip_op("[")) {
        TESSERA_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node), line));
      } else if (is_op("(")) {
        TESSERA_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr object, int line) {
    ExprPtr parts[3];
    bool slice = false;
    if (!is_op(":")) {
      TESSERA_ASSIGN_OR_RETURN(parts[0], parse_expression(true));
      if (is_op(",")) {  // x[a, b] subscripts with a tuple
        auto tuple = make_expr(ExprKind::kTuple, line);
        tuple->args.push_back(std::move(parts[0]));
        while (skip_op(",")) {
          if (is_op("]")) break;
          TESSERA_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
          tuple->args.push_back(std::move(item));
        }
        parts[0] = std::move(tuple);
      }
    }
    if (skip_op(":")) {
      slice = true;
      if (!is_op("]") && !is_op(":")) {
        TESSERA_ASSIGN_OR_RETURN(parts[1], parse_expression(true));
      }
      if (skip_op(":") && !is_op("]")) {
        TESSERA_ASSIGN_OR_RETURN(parts[2], parse_expression(true));
      }
    }
    TESSERA_RETURN_IF_ERROR(expect_op("]"));
    auto node = make_expr(slice ? ExprKind::kSlice : ExprKind::kItem, line);
    node->operand = std::move(object);
    node->args.push_back(std::move(parts[0]));
    if (slice) {
      node->args.push_back(std::move(parts[1]));
      node->args.push_back(std::move(parts[2]));
    }
    return node;
  }

  // `(args, name=value)`; fills node->args and node->kwargs.
  Status parse_call_args(Expr& node) {
    TESSERA_RETURN_IF_ERROR(expect_op("("));
    bool first = true;
    while (!is_op(")")) {
      if (!first) TESSERA_RETURN_IF_ERROR(expect_op(","));
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) return error_at(cur(), "*args and **kwargs are not supported in chat templates");
      if (cur().type == TT::kName && peek().type == TT::kOp && peek().text == "=") {
        std::string key = cur().text;
        advance();
        advance();
        TESSERA_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        node.kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!node.kwargs.empty()) return error_at(cur(), "positional argument follows keyword argument");
        TESSERA_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        node.args.push_back(std::move(value));
      }
    }
    advance();
    return Status::ok();
  }

  Result<ExprPtr> parse_call(ExprPtr callee) {
    auto node = make_expr(ExprKind::kCall, cur().line);
    node->operand = std::move(callee);
    TESSERA_RETURN_IF_ERROR(parse_call_args(*node));
    return node;
  }

  Result<ExprPtr> parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        advance();
        TESSERA_ASSIGN_OR_RETURN(node, parse_one_filter(std::move(node)));
      } else if (is_name("is")) {
        TESSERA_ASSIGN_OR_RETURN(node, parse_test(std::move(node)));
      } else if (is_op("(")) {
        TESSERA_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  // `| name(args) | name ...` applied to `node` (null: the body of a filter block or set block).
  Result<ExprPtr> parse_filter_chain(ExprPtr node) {
    while (skip_op("|")) {
      TESSERA_ASSIGN_OR_RETURN(node, parse_one_filter(std::move(node)));
    }
    return node;
  }

  Result<ExprPtr> parse_one_filter(ExprPtr operand) {
    const Token name_token = cur();
    auto node = make_expr(ExprKind::kFilter, name_token.line);
    TESSERA_ASSIGN_OR_RETURN(node->name, expect_identifier());
    while (skip_op(".")) {
      TESSERA_ASSIGN_OR_RETURN(std::string part, expect_identifier());
      node->name += "." + part;
    }
    if (find_filter(node->name) == nullptr) {
      return error_at(name_token, fmt::format("no filter named '{}'", node->name));
    }
    node->operand = std::move(operand);
    if (is_op("(")) TESSERA_RETURN_IF_ERROR(parse_call_args(*node));
    return node;
  }

  Result<ExprPtr> parse_test(ExprPtr operand) {
    auto node = make_expr(ExprKind::kTest, cur().line);
    advance();  // "is"
    node->negated = skip_name("not");
    const Token name_token = cur();
    TESSERA_ASSIGN_OR_RETURN(node->name, expect_identifier());
    if (find_test(node->name) == nullptr) {
      return error_at(name_token, fmt::format("no test named '{}'", node->name));
    }
    node->operand = std::move(operand);
    const Token& t = cur();
    if (is_op("(")) {
      TESSERA_RETURN_IF_ERROR(parse_call_args(*node));
    } else if ((t.type == TT::kName || t.type == TT::kString || t.type == TT::kInt || t.type == TT::kFloat ||
                is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      // One argument without parentheses: `x is divisibleby 3`, `x is sameas none`.
      if (is_name("is")) return error_at(t, "tests cannot be chained with 'is'");
      TESSERA_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
      TESSERA_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
      node->args.push_back(std::move(arg));
    }
    return node;
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

// ---- scoping analysis -----------------------------------------------------------------------
//
// Mirrors the symbol tracking of the reference compiler (jinja2/idtracking.py): per frame, each
// referenced name gets an initial binding: a parameter, the enclosing or context value ("resolve"
// / "alias"), or undefined when the first reference is a store and no enclosing frame knows the
// name. Only the undefined case differs from plain dynamic lookup, so only it is recorded.
class ScopeAnalyzer {
 public:
  enum class Load : uint8_t { kParam, kResolve, kAlias, kUndefined };
  struct Symbols {
    std::map<std::string, Load> refs;
    std::set<std::string> stores;
  };

  // Analyzes one frame whose enclosing frames' symbols are `ancestors` (innermost last), then
  // the frames nested in it. Returns the frame's undefined-at-start names.
  std::vector<std::string> frame(StmtList& body, const std::vector<std::string>& params,
                                 std::vector<const Symbols*>& ancestors) {
    Symbols sym;
    for (const auto& p : params) sym.refs[p] = Load::kParam;
    for (const StmtPtr& s : body) visit(*s, sym, ancestors);
    std::vector<std::string> undefined;
    for (const auto& [name, load] : sym.refs) {
      if (load == Load::kUndefined) undefined.push_back(name);
    }
    ancestors.push_back(&sym);
    for (const StmtPtr& s : body) nested(*s, ancestors);
    ancestors.pop_back();
    return undefined;
  }

 private:
  static bool known_outside(const std::string& name, const std::vector<const Symbols*>& ancestors) {
    for (const Symbols* a : ancestors) {
      if (a->refs.count(name) != 0) return true;
    }
    return false;
  }

  static void load(const std::string& name, Symbols& sym) { sym.refs.emplace(name, Load::kResolve); }

  static void store(const std::string& name, Symbols& sym, const std::vector<const Symbols*>& ancestors) {
    sym.stores.insert(name);
    if (sym.refs.count(name) == 0) sym.refs[name] = known_outside(name, ancestors) ? Load::kAlias : Load::kUndefined;
  }

  static void visit_expr(const Expr* e, Symbols& sym) {
    if (e == nullptr) return;
    if (e->kind == ExprKind::kName) load(e->name, sym);
    visit_expr(e->operand.get(), sym);
    for (const ExprPtr& a : e->args) visit_expr(a.get(), sym);
    for (const auto& [k, a] : e->kwargs) visit_expr(a.get(), sym);
  }

  // The symbols of `s` as seen from the frame that contains it (nested frames stop the visit).
  void visit(const Stmt& s, Symbols& sym, const std::vector<const Symbols*>& ancestors) {
    switch (s.kind) {
      case StmtKind::kOutput: visit_expr(s.expr.get(), sym); break;
      case StmtKind::kSet:
        visit_expr(s.expr.get(), sym);
        if (!s.attr.empty()) load(s.targets[0], sym);
        else for (const auto& t : s.targets) store(t, sym, ancestors);
        break;
      case StmtKind::kSetBlock: store(s.targets[0], sym, ancestors); break;
      case StmtKind::kMacro: store(s.targets[0], sym, ancestors); break;
      case StmtKind::kFor: visit_expr(s.expr.get(), sym); break;
      case StmtKind::kWith:
        for (const auto& [name, value] : s.params) visit_expr(value.get(), sym);
        break;
      case StmtKind::kFilterBlock: visit_expr(s.expr.get(), sym); break;
      case StmtKind::kIf: visit_if(s, 0, sym, ancestors); break;
      default: break;
    }
  }

  // An if with elifs is an if whose else branch holds the next if, as in the reference's tree:
  // branches are the body, the elif chain and the else body.
  void visit_if(const Stmt& s, size_t index, Symbols& sym, const std::vector<const Symbols*>& ancestors) {
    visit_expr(s.conds[index].get(), sym);
    std::vector<Symbols> branches(3, sym);
    for (const StmtPtr& b : s.bodies[index]) visit(*b, branches[0], ancestors);
    if (index + 1 < s.conds.size()) {
      visit_if(s, index + 1, branches[1], ancestors);
    } else {
      for (const StmtPtr& b : s.else_body) visit(*b, branches[2], ancestors);
    }
    std::map<std::string, size_t> counts;
    for (const Symbols& b : branches) {
      for (const auto& t : b.stores) {
        if (sym.stores.count(t) == 0) ++counts[t];
      }
    }
    for (const Symbols& b : branches) {
      for (const auto& [name, load] : b.refs) sym.refs[name] = load;
      sym.stores.insert(b.stores.begin(), b.stores.end());
    }
    for (const auto& [name, count] : counts) {
      if (count != branches.size()) sym.refs[name] = known_outside(name, ancestors) ? Load::kAlias : Load::kResolve;
    }
  }

  // Frames nested in `s` (directly or inside if branches).
  void nested(Stmt& s, std::vector<const Symbols*>& ancestors) {
    switch (s.kind) {
      case StmtKind::kIf:
        for (auto& body : s.bodies) {
          for (StmtPtr& b : body) nested(*b, ancestors);
        }
        for (StmtPtr& b : s.else_body) nested(*b, ancestors);
        break;
      case StmtKind::kFor: {
        std::vector<std::string> params = s.targets;
        params.push_back("loop");
        s.undefined_at_start = frame(s.body, params, ancestors);
        s.else_undefined_at_start = frame(s.else_body, {}, ancestors);
        break;
      }
      case StmtKind::kMacro: {
        std::vector<std::string> params = {"varargs", "kwargs", "caller"};
        for (const auto& [name, def] : s.params) params.push_back(name);
        s.undefined_at_start = frame(s.body, params, ancestors);
        break;
      }
      case StmtKind::kWith: {
        std::vector<std::string> params;
        for (const auto& [name, value] : s.params) params.push_back(name);
        s.undefined_at_start = frame(s.body, params, ancestors);
        break;
      }
      case StmtKind::kSetBlock: case StmtKind::kFilterBlock: case StmtKind::kBlock:
        s.undefined_at_start = frame(s.body, {}, ancestors);
        break;
      default: break;
    }
  }
};

}  // namespace

Result<std::unique_ptr<TemplateAst>> parse_template(std::string_view source) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<TemplateAst> ast, Parser(std::move(tokens)).run());
  std::vector<const ScopeAnalyzer::Symbols*> ancestors;
  ast->undefined_at_start = ScopeAnalyzer().frame(ast->body, {}, ancestors);
  return ast;
}

}  // namespace tessera::jinja
