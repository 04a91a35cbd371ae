// base/cgroup.h: the directories of this process's cgroups that the CPU quota and the memory limit
// are read from, found through mountinfo and /proc/self/cgroup as tests give them.
#include <doctest/doctest.h>
#include <map>
#include <string>
#include <vector>
#include "base/cgroup.h"

namespace {
kiln::CgroupDirs dirs(const std::string& mountinfo, const std::string& self, const std::string& controller) {
  const std::map<std::string, std::string> files{{"/proc/self/mountinfo", mountinfo}, {"/proc/self/cgroup", self}};
  return kiln::cgroup_dirs(
      [&](const std::string& path) {
        const auto it = files.find(path);
        return it == files.end() ? std::string() : it->second;
      },
      controller);
}
using Dirs = std::vector<std::string>;
}  // namespace

TEST_CASE("cgroup: a controller's directories, its own cgroup up to the mount's root (v1, co-mounted, v2, hybrid)") {
  const std::string v2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
  auto d = dirs(v2, "0::/a/b\n", "cpu");
  CHECK(d.version == 2);
  CHECK(d.dirs == Dirs{"/sys/fs/cgroup/a/b", "/sys/fs/cgroup/a", "/sys/fs/cgroup"});
  CHECK(dirs(v2, "0::/\n", "memory").dirs == Dirs{"/sys/fs/cgroup"});
  // A hybrid host: memory on a v1 hierarchy co-mounted with cpu, v2 at /sys/fs/cgroup/unified for the
  // rest (pids here); each controller is read where it is.
  const std::string hybrid =
      "26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:6 - cgroup2 cgroup2 rw\n"
      "30 25 0:27 / /sys/fs/cgroup/cpu,memory rw,nosuid shared:11 - cgroup cgroup rw,cpu,memory\n";
  const std::string self = "7:cpu,memory:/docker/abc\n0::/user.slice\n";
  d = dirs(hybrid, self, "memory");
  CHECK(d.version == 1);
  CHECK(d.dirs ==
        Dirs{"/sys/fs/cgroup/cpu,memory/docker/abc", "/sys/fs/cgroup/cpu,memory/docker", "/sys/fs/cgroup/cpu,memory"});
  CHECK(dirs(hybrid, self, "cpu").version == 1);
  d = dirs(hybrid, self, "pids");
  CHECK(d.version == 2);
  CHECK(d.dirs == Dirs{"/sys/fs/cgroup/unified/user.slice", "/sys/fs/cgroup/unified"});
  // "cpu" is not "cpuacct": a process in no cpu hierarchy and no v2 cgroup has none.
  CHECK(dirs("35 31 0:32 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n", "3:cpuacct:/k\n", "cpu").version ==
        0);
}

TEST_CASE("cgroup: a container's mount root, escaped mount points, cgroups outside the root, nonsense") {
  // The mount's root is the container's cgroup: the path below it is walked, up to the mount point.
  const std::string container = "1200 1100 0:26 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n";
  CHECK(dirs(container, "0::/docker/abc\n", "memory").dirs == Dirs{"/sys/fs/cgroup"});
  CHECK(dirs(container, "0::/docker/abc/job\n", "memory").dirs == Dirs{"/sys/fs/cgroup/job", "/sys/fs/cgroup"});
  // Only at a component: /docker/abcd is not under /docker/abc, so it is walked whole.
  CHECK(dirs(container, "0::/docker/abcd\n", "memory").dirs ==
        Dirs{"/sys/fs/cgroup/docker/abcd", "/sys/fs/cgroup/docker", "/sys/fs/cgroup"});
  // mountinfo writes a space in a path as \040 (and a backslash as \134).
  const std::string spaced = "40 23 0:26 /my\\040job /mnt/cg\\040v2 rw - cgroup2 cgroup2 rw\n";
  CHECK(dirs(spaced, "0::/my job/step\n", "cpu").dirs == Dirs{"/mnt/cg v2/step", "/mnt/cg v2"});
  // A cgroup outside this namespace's root is not under the mount; "..x" is a name like any other.
  const std::string v2 = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  CHECK(dirs(v2, "0::/../x\n", "cpu").dirs.empty());
  CHECK(dirs(v2, "0::/a/..\n", "cpu").dirs.empty());
  CHECK(dirs(v2, "0::/..x\n", "cpu").dirs == Dirs{"/sys/fs/cgroup/..x", "/sys/fs/cgroup"});
  // No mountinfo, no cgroup line, or lines that are not either: none.
  CHECK(dirs("", "0::/\n", "cpu").version == 0);
  CHECK(dirs(v2, "", "cpu").version == 0);
  CHECK(dirs("1 2 3\n- - -\n 4 5 0:1 / / - cgroup2\n", "0::/\n", "cpu").version == 0);
  CHECK(dirs(v2, "0::\nx\n::::\n0::relative\n", "cpu").version == 0);
}
