#include "text/hf_regex.h"

#include <stdexcept>

#include <fmt/format.h>
#include <unicode/uchar.h>

#include "text/tokenizer_common.h"

namespace tprun::text {

namespace {

// ---- character classes ----------------------------------------------------------

enum class ItemKind { kRange, kCategories, kSpace, kDigit };

struct ClassItem {
  ItemKind kind = ItemKind::kRange;
  char32_t lo = 0, hi = 0;  // kRange
  uint32_t categories = 0;  // kCategories: ICU U_GC_*_MASK bits
  bool negated = false;     // \S, \D, \P{..}

  bool matches(char32_t c) const {
    bool hit = false;
    switch (kind) {
      case ItemKind::kRange: hit = c >= lo && c <= hi; break;
      case ItemKind::kCategories: hit = (U_GET_GC_MASK(static_cast<UChar32>(c)) & categories) != 0; break;
      case ItemKind::kSpace:
        hit = (c >= 0x09 && c <= 0x0D) || c == 0x85 ||
              (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_Z_MASK) != 0;
        break;
      case ItemKind::kDigit: hit = u_charType(static_cast<UChar32>(c)) == U_DECIMAL_DIGIT_NUMBER; break;
    }
    return hit != negated;
  }
};

struct CharClass {
  bool negated = false;
  bool case_insensitive = false;  // only for single literals
  std::vector<ClassItem> items;

  bool matches(char32_t c) const {
    if (case_insensitive) {
      const auto fold = [](char32_t x) { return static_cast<char32_t>(u_foldCase(static_cast<UChar32>(x), U_FOLD_CASE_DEFAULT)); };
      return fold(c) == fold(items[0].lo);
    }
    bool hit = false;
    for (const auto& item : items)
      if (item.matches(c)) {
        hit = true;
        break;
      }
    return hit != negated;
  }
};

uint32_t category_mask(const std::string& name) {
  static const std::pair<const char*, uint32_t> kTable[] = {
      {"L", U_GC_L_MASK},   {"Lu", U_GC_LU_MASK}, {"Ll", U_GC_LL_MASK}, {"Lt", U_GC_LT_MASK}, {"Lm", U_GC_LM_MASK},
      {"Lo", U_GC_LO_MASK}, {"M", U_GC_M_MASK},   {"Mn", U_GC_MN_MASK}, {"Mc", U_GC_MC_MASK}, {"Me", U_GC_ME_MASK},
      {"N", U_GC_N_MASK},   {"Nd", U_GC_ND_MASK}, {"Nl", U_GC_NL_MASK}, {"No", U_GC_NO_MASK}, {"P", U_GC_P_MASK},
      {"Pc", U_GC_PC_MASK}, {"Pd", U_GC_PD_MASK}, {"Ps", U_GC_PS_MASK}, {"Pe", U_GC_PE_MASK}, {"Pi", U_GC_PI_MASK},
      {"Pf", U_GC_PF_MASK}, {"Po", U_GC_PO_MASK}, {"S", U_GC_S_MASK},   {"Sm", U_GC_SM_MASK}, {"Sc", U_GC_SC_MASK},
      {"Sk", U_GC_SK_MASK}, {"So", U_GC_SO_MASK}, {"Z", U_GC_Z_MASK},   {"Zs", U_GC_ZS_MASK}, {"Zl", U_GC_ZL_MASK},
      {"Zp", U_GC_ZP_MASK}, {"C", U_GC_C_MASK},   {"Cc", U_GC_CC_MASK}, {"Cf", U_GC_CF_MASK}, {"Co", U_GC_CO_MASK},
      {"Cs", U_GC_CS_MASK}, {"Cn", U_GC_CN_MASK}};
  for (const auto& [n, mask] : kTable)
    if (name == n) return mask;
  return 0;
}

// ---- syntax tree ----------------------------------------------------------------

enum class NodeKind { kAlt, kSeq, kRepeat, kChar, kLook };

struct Node {
  NodeKind kind = NodeKind::kSeq;
  std::vector<Node> children;  // kAlt, kSeq; kRepeat / kLook: one child
  int min = 0, max = -1;       // kRepeat (-1: unbounded)
  int class_index = -1;        // kChar
  bool negated_look = false;   // kLook
};

class Parser {
 public:
  Parser(const std::u32string& p, std::vector<CharClass>& classes) : p_(p), classes_(classes) {}

  Node parse() {
    Node n = alternation(false);
    if (i_ != p_.size()) fail("unbalanced ')'");
    return n;
  }

 private:
  const std::u32string& p_;
  std::vector<CharClass>& classes_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(fmt::format("{} at character {}", what, i_));
  }
  bool at(char32_t c) const { return i_ < p_.size() && p_[i_] == c; }

  Node alternation(bool icase) {
    Node alt;
    alt.kind = NodeKind::kAlt;
    alt.children.push_back(sequence(icase));
    while (at(U'|')) {
      ++i_;
      alt.children.push_back(sequence(icase));
    }
    if (alt.children.size() == 1) return std::move(alt.children[0]);
    return alt;
  }

  Node sequence(bool icase) {
    Node seq;
    seq.kind = NodeKind::kSeq;
    while (i_ < p_.size() && !at(U'|') && !at(U')')) {
      Node atom_node = atom(icase);
      quantify(atom_node);
      seq.children.push_back(std::move(atom_node));
    }
    return seq;
  }

  int add_class(CharClass c) {
    classes_.push_back(std::move(c));
    return static_cast<int>(classes_.size()) - 1;
  }

  Node char_node(CharClass c) {
    Node n;
    n.kind = NodeKind::kChar;
    n.class_index = add_class(std::move(c));
    return n;
  }

  Node atom(bool icase) {
    const char32_t c = p_[i_];
    if (c == U'(') return group(icase);
    if (c == U'[') {
      if (icase) fail("a character class inside (?i:...) is not supported");
      return char_node(bracket_class());
    }
    if (c == U'.' || c == U'^' || c == U'$') fail(fmt::format("'{}' is not supported", static_cast<char>(c)));
    if (c == U'*' || c == U'+' || c == U'?' || c == U'{') fail("a quantifier follows nothing");
    CharClass cls;
    if (c == U'\\') {
      ++i_;
      cls.items.push_back(escape_item(/*in_class=*/false));
    } else {
      ++i_;
      cls.items.push_back(ClassItem{ItemKind::kRange, c, c, 0, false});
    }
    if (icase) {
      if (cls.items[0].kind != ItemKind::kRange || cls.items[0].negated) fail("only literals may be case-insensitive");
      cls.case_insensitive = true;
    }
    return char_node(std::move(cls));
  }

  Node group(bool icase) {
    ++i_;  // '('
    Node n;
    if (at(U'?')) {
      ++i_;
      if (at(U':')) {
        ++i_;
        n = alternation(icase);
      } else if (at(U'i') && i_ + 1 < p_.size() && p_[i_ + 1] == U':') {
        i_ += 2;
        n = alternation(true);
      } else if (at(U'=') || at(U'!')) {
        const bool negated = at(U'!');
        ++i_;
        Node look;
        look.kind = NodeKind::kLook;
        look.negated_look = negated;
        look.children.push_back(alternation(icase));
        n = std::move(look);
      } else {
        fail("this group kind is not supported");
      }
    } else {
      n = alternation(icase);
    }
    if (!at(U')')) fail("missing ')'");
    ++i_;
    return n;
  }

  int number() {
    if (i_ >= p_.size() || p_[i_] < U'0' || p_[i_] > U'9') fail("a number was expected");
    int v = 0;
    while (i_ < p_.size() && p_[i_] >= U'0' && p_[i_] <= U'9') {
      v = v * 10 + static_cast<int>(p_[i_++] - U'0');
      if (v > 1000) fail("a repeat count above 1000");
    }
    return v;
  }

  void quantify(Node& n) {
    if (i_ >= p_.size()) return;
    int min = 0, max = -1;
    const char32_t c = p_[i_];
    if (c == U'*') {
      ++i_;
    } else if (c == U'+') {
      ++i_;
      min = 1;
    } else if (c == U'?') {
      ++i_;
      max = 1;
    } else if (c == U'{') {
      ++i_;
      min = number();
      if (at(U',')) {
        ++i_;
        if (!at(U'}')) max = number();
      } else {
        max = min;
      }
      if (!at(U'}')) fail("missing '}'");
      ++i_;
      if (max >= 0 && max < min) fail("a repeat range with max < min");
    } else {
      return;
    }
    if (at(U'?') || at(U'+')) fail("lazy and possessive quantifiers are not supported");
    if (n.kind == NodeKind::kLook) fail("a quantified look-ahead is not supported");
    if (nullable(n)) fail("a quantified expression that can match the empty string is not supported");
    Node rep;
    rep.kind = NodeKind::kRepeat;
    rep.min = min;
    rep.max = max;
    rep.children.push_back(std::move(n));
    n = std::move(rep);
    if (i_ < p_.size() && (at(U'*') || at(U'+') || at(U'?') || at(U'{'))) fail("a quantifier follows a quantifier");
  }

  static bool nullable(const Node& n) {
    switch (n.kind) {
      case NodeKind::kChar: return false;
      case NodeKind::kLook: return true;
      case NodeKind::kRepeat: return n.min == 0 || nullable(n.children[0]);
      case NodeKind::kSeq:
        for (const auto& c : n.children)
          if (!nullable(c)) return false;
        return true;
      case NodeKind::kAlt:
        for (const auto& c : n.children)
          if (nullable(c)) return true;
        return false;
    }
    return true;
  }

  char32_t hex(size_t digits) {
    char32_t v = 0;
    for (size_t k = 0; k < digits; ++k) {
      if (i_ >= p_.size()) fail("a short hexadecimal escape");
      const char32_t h = p_[i_++];
      int d;
      if (h >= U'0' && h <= U'9') d = static_cast<int>(h - U'0');
      else if (h >= U'a' && h <= U'f') d = static_cast<int>(h - U'a') + 10;
      else if (h >= U'A' && h <= U'F') d = static_cast<int>(h - U'A') + 10;
      else fail("a bad hexadecimal escape");
      v = v * 16 + static_cast<char32_t>(d);
    }
    return v;
  }

  // After a backslash.
  ClassItem escape_item(bool in_class) {
    if (i_ >= p_.size()) fail("a trailing backslash");
    const char32_t c = p_[i_++];
    auto literal = [](char32_t x) { return ClassItem{ItemKind::kRange, x, x, 0, false}; };
    switch (c) {
      case U'r': return literal(U'\r');
      case U'n': return literal(U'\n');
      case U't': return literal(U'\t');
      case U'f': return literal(U'\f');
      case U'v': return literal(U'\v');
      case U'a': return literal(U'\a');
      case U'e': return literal(0x1B);
      case U'0': return literal(0);
      case U'x': return literal(hex(2));
      case U'u': return literal(hex(4));
      case U's': return ClassItem{ItemKind::kSpace, 0, 0, 0, false};
      case U'S': return ClassItem{ItemKind::kSpace, 0, 0, 0, true};
      case U'd': return ClassItem{ItemKind::kDigit, 0, 0, 0, false};
      case U'D': return ClassItem{ItemKind::kDigit, 0, 0, 0, true};
      case U'p':
      case U'P': {
        if (!at(U'{')) fail("\\p needs {Name}");
        ++i_;
        std::string name;
        while (i_ < p_.size() && p_[i_] != U'}') {
          if (p_[i_] > 0x7F) fail("a bad property name");
          name += static_cast<char>(p_[i_++]);
        }
        if (!at(U'}')) fail("missing '}' of \\p{...}");
        ++i_;
        bool negated = c == U'P';
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name.erase(0, 1);
        }
        const uint32_t mask = category_mask(name);
        if (mask == 0) fail(fmt::format("the property \\p{{{}}} is not supported", name));
        return ClassItem{ItemKind::kCategories, 0, 0, mask, negated};
      }
      default:
        break;
    }
    if ((c >= U'a' && c <= U'z') || (c >= U'A' && c <= U'Z') || (c >= U'1' && c <= U'9'))
      fail(fmt::format("the escape \\{} is not supported", static_cast<char>(c)));
    (void)in_class;
    return literal(c);  // escaped punctuation or other symbol
  }

  CharClass bracket_class() {
    ++i_;  // '['
    CharClass cls;
    if (at(U'^')) {
      cls.negated = true;
      ++i_;
    }
    bool first = true;
    while (true) {
      if (i_ >= p_.size()) fail("missing ']'");
      char32_t c = p_[i_];
      if (c == U']' && !first) {
        ++i_;
        break;
      }
      first = false;
      if (c == U'[') fail("nested classes are not supported");
      if (c == U'&' && i_ + 1 < p_.size() && p_[i_ + 1] == U'&') fail("class intersection is not supported");
      ClassItem item;
      if (c == U'\\') {
        ++i_;
        item = escape_item(/*in_class=*/true);
      } else {
        ++i_;
        item = ClassItem{ItemKind::kRange, c, c, 0, false};
      }
      // A range a-b (a '-' before ']' is a literal).
      if (item.kind == ItemKind::kRange && at(U'-') && i_ + 1 < p_.size() && p_[i_ + 1] != U']') {
        ++i_;
        ClassItem hi;
        if (at(U'\\')) {
          ++i_;
          hi = escape_item(/*in_class=*/true);
        } else {
          hi = ClassItem{ItemKind::kRange, p_[i_], p_[i_], 0, false};
          ++i_;
        }
        if (hi.kind != ItemKind::kRange || hi.lo < item.lo) fail("a bad class range");
        item.hi = hi.lo;
      }
      cls.items.push_back(item);
    }
    return cls;
  }
};

// ---- backtracking machine ------------------------------------------------------

enum class Op { kChar, kSplit, kJump, kLook, kMatch };

struct Instr {
  Op op = Op::kMatch;
  int a = 0, b = 0;  // kChar: class; kSplit: preferred, other; kJump: target; kLook: start, negated
};

}  // namespace

struct SplitRegex::Program {
  std::vector<CharClass> classes;
  std::vector<Instr> code;
  int start = 0;
};

namespace {

class Compiler {
 public:
  explicit Compiler(std::vector<Instr>& code) : code_(code) {}

  void emit(const Node& n) {
    switch (n.kind) {
      case NodeKind::kChar: code_.push_back({Op::kChar, n.class_index, 0}); break;
      case NodeKind::kSeq:
        for (const auto& c : n.children) emit(c);
        break;
      case NodeKind::kAlt: {
        std::vector<size_t> jumps;
        for (size_t k = 0; k < n.children.size(); ++k) {
          if (k + 1 < n.children.size()) {
            const size_t split = code_.size();
            code_.push_back({Op::kSplit, 0, 0});
            code_[split].a = static_cast<int>(code_.size());
            emit(n.children[k]);
            jumps.push_back(code_.size());
            code_.push_back({Op::kJump, 0, 0});
            code_[split].b = static_cast<int>(code_.size());
          } else {
            emit(n.children[k]);
          }
        }
        for (size_t j : jumps) code_[j].a = static_cast<int>(code_.size());
        break;
      }
      case NodeKind::kRepeat: {
        const Node& child = n.children[0];
        for (int k = 0; k < n.min; ++k) emit(child);
        if (n.max < 0) {  // greedy star: L: split body, out; body; jump L
          const size_t loop = code_.size();
          code_.push_back({Op::kSplit, 0, 0});
          code_[loop].a = static_cast<int>(code_.size());
          emit(child);
          code_.push_back({Op::kJump, static_cast<int>(loop), 0});
          code_[loop].b = static_cast<int>(code_.size());
        } else {
          std::vector<size_t> splits;
          for (int k = n.min; k < n.max; ++k) {
            splits.push_back(code_.size());
            code_.push_back({Op::kSplit, 0, 0});
            code_.back().a = static_cast<int>(code_.size());
            emit(child);
          }
          for (size_t s : splits) code_[s].b = static_cast<int>(code_.size());
        }
        break;
      }
      case NodeKind::kLook: {
        // kLook jumps over its sub-program, which ends in its own kMatch.
        const size_t look = code_.size();
        code_.push_back({Op::kLook, 0, n.negated_look ? 1 : 0});
        const size_t jump = code_.size();
        code_.push_back({Op::kJump, 0, 0});
        code_[look].a = static_cast<int>(code_.size());
        emit(n.children[0]);
        code_.push_back({Op::kMatch, 0, 0});
        code_[jump].a = static_cast<int>(code_.size());
        break;
      }
    }
  }

 private:
  std::vector<Instr>& code_;
};

struct Runner {
  const SplitRegex::Program& prog;
  const std::u32string& text;
  int64_t& budget;

  // Runs from `pc` at `pos`; on success returns true and the end position.
  bool run(int pc0, size_t pos0, size_t& end) {
    std::vector<std::pair<int, size_t>> stack;
    stack.emplace_back(pc0, pos0);
    while (!stack.empty()) {
      auto [pc, pos] = stack.back();
      stack.pop_back();
      while (true) {
        if (--budget < 0)
          throw std::runtime_error("pre-tokenizer regex: the text needs too much backtracking");
        const Instr& in = prog.code[static_cast<size_t>(pc)];
        bool failed = false;
        switch (in.op) {
          case Op::kChar:
            if (pos < text.size() && prog.classes[static_cast<size_t>(in.a)].matches(text[pos])) {
              ++pos;
              ++pc;
            } else {
              failed = true;
            }
            break;
          case Op::kSplit:
            stack.emplace_back(in.b, pos);
            pc = in.a;
            break;
          case Op::kJump: pc = in.a; break;
          case Op::kLook: {
            size_t ignored = 0;
            const bool hit = run(in.a, pos, ignored);
            if (hit != (in.b == 1)) {
              pc += 1;  // to the jump over the sub-program
            } else {
              failed = true;
            }
            break;
          }
          case Op::kMatch: end = pos; return true;
        }
        if (failed) break;
      }
    }
    return false;
  }
};

}  // namespace

SplitRegex SplitRegex::compile(const std::string& pattern) {
  std::u32string p;
  try {
    p = decode_utf8(pattern, "regex");
  } catch (const std::exception& e) {
    throw std::invalid_argument(e.what());
  }
  auto prog = std::make_shared<Program>();
  Parser parser(p, prog->classes);
  Node root = parser.parse();
  Compiler compiler(prog->code);
  compiler.emit(root);
  prog->code.push_back({Op::kMatch, 0, 0});
  prog->start = 0;
  SplitRegex r;
  r.pattern_ = pattern;
  r.program_ = std::move(prog);
  return r;
}

std::vector<std::pair<size_t, size_t>> SplitRegex::find_all(const std::u32string& text) const {
  std::vector<std::pair<size_t, size_t>> out;
  int64_t budget = 1000000 + 2000 * static_cast<int64_t>(text.size());
  Runner runner{*program_, text, budget};
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    bool found = false;
    size_t s = last_end, e = 0;
    for (; s <= text.size(); ++s)
      if (runner.run(program_->start, s, e)) {
        found = true;
        break;
      }
    if (!found) break;
    if (e == s && have_last && last_match_end == e) {
      last_end += 1;
      continue;
    }
    last_end = e;
    last_match_end = e;
    have_last = true;
    out.emplace_back(s, e);
    if (e == s) {
      // Oniguruma then searches again from the same place; the next empty
      // match there is skipped by the rule above.
    }
  }
  return out;
}

}  // namespace tprun::text
