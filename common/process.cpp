#include "common/process.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

namespace tessera {

bool process_alive(int pid) {
  if (pid <= 0) return false;
  // /proc/<pid>/stat: "pid (comm) state ...": the state is the first field after the last ')'
  // (comm may itself hold parentheses). No file: no such process.
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string stat = ss.str();
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return true;  // unreadable: assume it lives
  const char state = stat[close + 2];
  return state != 'Z' && state != 'X' && state != 'x';
}

std::string this_hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace tessera
