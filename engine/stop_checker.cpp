#include "engine/stop_checker.h"

#include <algorithm>
#include <utility>

namespace tessera {

std::string StopChecker::push(const std::string& text) {
  if (stopped_) return "";
  pending_ += text;
  if (stops_.empty()) return std::exchange(pending_, std::string());
  // The earliest stop string in the pending text ends the output.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopChecker::flush() {
  if (stopped_) return "";
  return std::exchange(pending_, std::string());
}

}  // namespace tessera
