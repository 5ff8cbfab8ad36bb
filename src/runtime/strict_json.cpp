#include "runtime/strict_json.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun {
namespace {

constexpr size_t kMaxDepth = 64;

// A SAX pass that only checks what JSON allows and checkpoints must not have: duplicate keys at any
// depth and deep nesting. It builds nothing, so the DOM is built afterwards by nlohmann's plain
// parser. (nlohmann's callback parser, used before, scans the whole parent object at the end of
// every child object; a header with n tensors cost O(n^2).) Each open object keeps a hash set of its
// keys: linear in the document.
class StrictChecker {
 public:
  using json = nlohmann::json;
  StrictChecker(const std::string& file, const std::string& what) : file_(file), what_(what) {}

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) { return value(); }
  bool string(json::string_t&) { return value(); }
  bool binary(json::binary_t&) { return value(); }
  bool start_object(std::size_t) {
    open();
    // As before: the owner is the last key read anywhere (the enclosing key, through arrays too).
    objects_.push_back(Object{{}, objects_.empty() ? "" : last_key_});
    return true;
  }
  bool key(json::string_t& k) {
    Object& o = objects_.back();
    if (!o.keys.insert(k).second && duplicate_.empty()) {
      duplicate_ = k;
      duplicate_in_ = o.owner;
    }
    last_key_ = k;
    return true;
  }
  bool end_object() {
    objects_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) {
    open();
    return true;
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    error_ = e.what();
    return false;
  }

  const std::string& error() const { return error_; }
  const std::string& duplicate() const { return duplicate_; }
  const std::string& duplicate_in() const { return duplicate_in_; }

 private:
  struct Object {
    std::unordered_set<std::string> keys;
    std::string owner;  // the key whose value this object is ("" at the top)
  };

  [[noreturn]] void too_deep() const {
    throw CheckpointError(fmt::format("{}: {} nests deeper than {} levels", file_, what_, kMaxDepth));
  }
  bool value() const {
    if (depth_ >= kMaxDepth) too_deep();
    return true;
  }
  void open() {
    if (depth_ >= kMaxDepth) too_deep();
    ++depth_;
  }

  const std::string& file_;
  const std::string& what_;
  size_t depth_ = 0;  // open objects and arrays
  std::vector<Object> objects_;
  std::string last_key_, duplicate_, duplicate_in_, error_;
};

}  // namespace

nlohmann::json parse_strict_json(std::string_view text, const std::string& file, const std::string& what) {
  StrictChecker checker(file, what);
  if (!nlohmann::json::sax_parse(text.begin(), text.end(), &checker)) {
    throw CheckpointError(fmt::format("{}: {} is not valid JSON: {}", file, what, checker.error()));
  }
  if (!checker.duplicate().empty()) {
    throw CheckpointError(fmt::format("{}: {} has the key '{}' twice{}", file, what, checker.duplicate(),
                                      checker.duplicate_in().empty()
                                          ? ""
                                          : fmt::format(" (in '{}')", checker.duplicate_in())));
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: {} is not valid JSON: {}", file, what, e.what()));
  }
}

namespace {

// The whole file, EINTR retried on open and read; CheckpointError naming the
// errno (ENOENT says "no such file", anything else is said as it is).
std::string read_whole_file(const std::string& path, const std::string& what) {
  auto fail = [&](const char* step, int err) {
    throw CheckpointError(fmt::format("{}: cannot {} {}: {}", path, step, what, std::strerror(err)));
  };
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block the open
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail("open", errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("stat", errno);
  if (!S_ISREG(st.st_mode)) {
    throw CheckpointError(fmt::format("{}: {} is not a regular file", path, what));
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) fail("read", errno);
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  return parse_strict_json(read_whole_file(path, what), path, what);
}

}  // namespace tprun
