#include "base/cgroup.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

namespace kiln {

std::string read_small_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return "";
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

namespace {

// mountinfo writes a space, tab, newline and backslash in a path as "\040", "\011", "\012", "\134".
std::string unescape_octal(const std::string& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto octal = [&](size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '7'; };
    if (s[i] == '\\' && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      r += char(((s[i + 1] - '0') << 6) | ((s[i + 2] - '0') << 3) | (s[i + 3] - '0'));
      i += 3;
    } else {
      r += s[i];
    }
  }
  return r;
}

// "a,b,c" names `x` as one of its items.
bool names(const std::string& list, const std::string& x) {
  return ("," + list + ",").find("," + x + ",") != std::string::npos;
}

// A ".." component: a cgroup outside this namespace's root, not under the mount.
bool leaves_root(const std::string& path) {
  return path == "/.." || path.find("/../") != std::string::npos ||
         (path.size() >= 3 && path.compare(path.size() - 3, 3, "/..") == 0);
}

}  // namespace

CgroupDirs cgroup_dirs(const std::function<std::string(const std::string&)>& read, const std::string& controller) {
  // The mounts: "id parent major:minor root mount-point options [optional fields...] - type source
  // super-options". The first v1 hierarchy whose super options name the controller, the first v2.
  struct Mount {
    std::string root, point;
  };
  std::optional<Mount> v1, v2;
  {
    std::istringstream lines(read("/proc/self/mountinfo"));
    for (std::string line; std::getline(lines, line);) {
      std::istringstream in(line);
      std::vector<std::string> w;
      for (std::string x; in >> x;) w.push_back(x);
      if (w.size() < 6) continue;
      const auto dash = std::find(w.begin() + 6, w.end(), "-");
      if (dash == w.end() || w.end() - dash < 4) continue;
      const std::string& type = dash[1];
      if (type == "cgroup2" && !v2) v2 = Mount{unescape_octal(w[3]), unescape_octal(w[4])};
      if (type == "cgroup" && names(dash[3], controller) && !v1) v1 = Mount{unescape_octal(w[3]), unescape_octal(w[4])};
    }
  }
  // This process's cgroups, "id:controllers:path": "0::/path" is v2's, "N:cpu,cpuacct:/path" a v1
  // hierarchy's (the path may hold ':').
  std::optional<std::string> v1_path, v2_path;
  {
    std::istringstream lines(read("/proc/self/cgroup"));
    for (std::string line; std::getline(lines, line);) {
      const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos || line.size() <= b + 1 || line[b + 1] != '/') continue;
      const std::string id = line.substr(0, a), ctrl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
      if (id == "0" && ctrl.empty() && !v2_path) v2_path = path;
      if (names(ctrl, controller) && !v1_path) v1_path = path;
    }
  }
  CgroupDirs r;
  const bool use_v1 = v1 && v1_path;
  if (!use_v1 && !(v2 && v2_path)) return r;
  const Mount& mnt = use_v1 ? *v1 : *v2;
  std::string path = use_v1 ? *v1_path : *v2_path;
  if (leaves_root(path)) return r;
  r.version = use_v1 ? 1 : 2;
  // The part of the path below the mount's root ("/" when they are the same). A path that is not
  // under the root is walked whole: the mount point is still read last.
  if (mnt.root != "/" && path.rfind(mnt.root, 0) == 0 &&
      (path.size() == mnt.root.size() || path[mnt.root.size()] == '/'))
    path = path.size() == mnt.root.size() ? "/" : path.substr(mnt.root.size());
  // The process's cgroup and each one above it: a limit on any of them holds.
  for (;;) {
    r.dirs.push_back(mnt.point + (path == "/" ? std::string() : path));
    if (path == "/") break;
    const size_t cut = path.find_last_of('/');
    path = cut == 0 ? "/" : path.substr(0, cut);
  }
  return r;
}

}  // namespace kiln
