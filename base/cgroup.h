// The one reader of this process's cgroups, for the CPU quota (base/thread_pool.cpp) and the
// memory limit (tools/plan.cpp host_memory): which directories hold a controller's files for this
// process, found through /proc/self/mountinfo and /proc/self/cgroup, so that a hierarchy mounted
// anywhere counts (v2 at /sys/fs/cgroup or, on a hybrid host, /sys/fs/cgroup/unified; v1 alone or
// co-mounted, "cpu,cpuacct" or "cpu,memory", under whatever name; a container whose mount's root is
// its own cgroup).
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace kiln {

// A file's whole text, "" when it cannot be read (the `read` the callers below give on a real host).
std::string read_small_file(const std::string& path);

struct CgroupDirs {
  int version = 0;                // 1 (the controller's v1 hierarchy) or 2; 0: none found
  std::vector<std::string> dirs;  // this process's cgroup first, then each above it; its mount's root last
};
// The cgroup directories whose `controller` files ("cpu", "memory") limit this process: a v1
// hierarchy whose super options name the controller (co-mounted ones too) where /proc/self/cgroup
// places the process in one, else the v2 one. Paths are under the mount point, from the process's
// cgroup (less the mount's root: a container without a cgroup namespace sees its own cgroup as the
// root) up to the mount point itself; none for a cgroup outside this namespace's root ("/../x") or
// where mountinfo names no such mount. `read(path)` gives a file's text, "" when it cannot be read
// (tests give /proc/self/mountinfo and /proc/self/cgroup their own); mountinfo's octal escapes
// ("\040" for a space) are decoded.
CgroupDirs cgroup_dirs(const std::function<std::string(const std::string&)>& read, const std::string& controller);

}  // namespace kiln
