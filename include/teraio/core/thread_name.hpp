// core/thread_name: names TeraIO's own threads, so that a CPU profile (perf's comm column, top -H,
// gdb) tells them from the training threads. Unnamed, they take the process's name ("python3").
#pragma once

#include <string_view>

namespace teraio {

// Names the calling thread; the kernel keeps the first 15 bytes. Best effort: a failure (no
// such call on this platform) leaves the name as it was.
void name_this_thread(std::string_view name);

}  // namespace teraio
