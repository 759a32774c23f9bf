// Facts about processes on this host, for liveness checks that must tell a slow peer from a dead
// one: a peer that is silent but whose process still exists (busy, starved by a loaded host, or
// stopped) is waited for longer than one whose process is gone.
#pragma once

#include <string>

namespace tessera {

// True while process `pid` exists on this host and has not exited: false when there is no such
// pid, or it is a zombie (exited, not yet reaped by its parent). A stopped process (SIGSTOP)
// counts as alive: it may be continued. pid <= 0: false.
bool process_alive(int pid);

// This host's name (gethostname), as the shards report it in their hello.
std::string this_hostname();

}  // namespace tessera
