#include "bench/gbench_json.h"

#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

namespace stash::bench {
namespace {

// Just enough JSON for Google Benchmark's output: objects, arrays, strings (simple escapes),
// numbers, true/false/null.
struct Value {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  double number = 0;
  std::string text;
  std::vector<Value> items;
  std::vector<std::pair<std::string, Value>> members;
};

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  bool Parse(Value* out) {
    if (!ParseValue(out)) return false;
    SkipSpace();
    return pos_ == s_.size();
  }
  size_t pos() const { return pos_; }

 private:
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Literal(const char* word) {
    const std::string w(word);
    if (s_.compare(pos_, w.size(), w) != 0) return false;
    pos_ += w.size();
    return true;
  }
  bool ParseString(std::string* out) {
    if (pos_ >= s_.size() || s_[pos_] != '"') return false;
    ++pos_;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      char c = s_[pos_++];
      if (c == '\\') {
        if (pos_ >= s_.size()) return false;
        const char e = s_[pos_++];
        switch (e) {
          case 'n':
            c = '\n';
            break;
          case 't':
            c = '\t';
            break;
          case 'u':
            // Benchmark names are ASCII; keep the escape's text as it is.
            out->append("\\u");
            continue;
          default:
            c = e;  // \" \\ \/
        }
      }
      out->push_back(c);
    }
    if (pos_ >= s_.size()) return false;
    ++pos_;
    return true;
  }
  bool ParseValue(Value* out) {
    SkipSpace();
    if (pos_ >= s_.size()) return false;
    const char c = s_[pos_];
    if (c == '{') {
      out->kind = Value::Kind::kObject;
      ++pos_;
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return true;
      }
      while (true) {
        SkipSpace();
        std::string key;
        if (!ParseString(&key)) return false;
        SkipSpace();
        if (pos_ >= s_.size() || s_[pos_] != ':') return false;
        ++pos_;
        Value v;
        if (!ParseValue(&v)) return false;
        out->members.emplace_back(std::move(key), std::move(v));
        SkipSpace();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == '}') {
          ++pos_;
          return true;
        }
        return false;
      }
    }
    if (c == '[') {
      out->kind = Value::Kind::kArray;
      ++pos_;
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return true;
      }
      while (true) {
        Value v;
        if (!ParseValue(&v)) return false;
        out->items.push_back(std::move(v));
        SkipSpace();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == ']') {
          ++pos_;
          return true;
        }
        return false;
      }
    }
    if (c == '"') {
      out->kind = Value::Kind::kString;
      return ParseString(&out->text);
    }
    if (Literal("true")) {
      out->kind = Value::Kind::kBool;
      out->number = 1;
      return true;
    }
    if (Literal("false")) {
      out->kind = Value::Kind::kBool;
      return true;
    }
    if (Literal("null")) return true;
    const char* begin = s_.c_str() + pos_;
    char* end = nullptr;
    out->number = std::strtod(begin, &end);
    if (end == begin) return false;
    out->kind = Value::Kind::kNumber;
    pos_ += static_cast<size_t>(end - begin);
    return true;
  }

  const std::string& s_;
  size_t pos_ = 0;
};

}  // namespace

StatusOr<GbenchResults> ParseGbenchJson(const std::string& json) {
  Value root;
  Parser parser(json);
  if (!parser.Parse(&root) || root.kind != Value::Kind::kObject) {
    return InvalidArgumentError("benchmark output is not JSON (at byte " +
                                std::to_string(parser.pos()) + ")");
  }
  GbenchResults results;
  for (const auto& [key, value] : root.members) {
    if (key != "benchmarks" || value.kind != Value::Kind::kArray) continue;
    for (const Value& bench : value.items) {
      GbenchRun run;
      std::string name;
      for (const auto& [field, v] : bench.members) {
        if (v.kind == Value::Kind::kNumber || v.kind == Value::Kind::kBool) {
          run.numbers[field] = v.number;
        } else if (v.kind == Value::Kind::kString) {
          run.text[field] = v.text;
          if (field == "name") name = v.text;
        }
      }
      if (!name.empty()) results[name] = std::move(run);
    }
  }
  return results;
}

}  // namespace stash::bench
