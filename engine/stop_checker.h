// Stop strings over streamed text. Text that could still become the start of a stop string is
// held back, so a client never receives part of a stop string; the stop string itself is not
// part of the output (OpenAI semantics).
#pragma once

#include <string>
#include <vector>

namespace tessera {

class StopChecker {
 public:
  explicit StopChecker(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Feeds newly decoded text; returns the text that is safe to emit now. After a stop string
  // is found, stopped() is true and later calls return "".
  std::string push(const std::string& text);
  // At the end of generation: whatever was held back (empty if stopped).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace tessera
