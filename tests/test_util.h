// Helpers shared by the test files.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"

namespace kiln::testing {

// The message of the kiln::Error that f throws, or a marker when it throws something else or nothing.
template <typename F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("NOT A kiln::Error: ") + e.what();
  }
  return "NO ERROR";
}

inline bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// A loopback TCP port free a moment ago (the kernel's pick): a test's rendezvous port, so tests that
// run at once (parallel ctest) do not collide on a fixed one.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path p;
  explicit TempDir(const std::string& tag = "kiln") {
    static int counter = 0;
    p = std::filesystem::temp_directory_path() /
        (tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(++counter) + "_" + std::to_string(std::rand()));
    std::filesystem::create_directories(p);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& f) const { return (p / f).string(); }
};

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Debian's fortunes package: the English text the BERT tests train on.
inline const std::string kFortunes = "/usr/share/games/fortunes";

// The lines of a metrics.jsonl file that log training steps (they have "loss"), parsed.
template <typename Json> std::vector<Json> step_lines(const std::string& path) {
  std::vector<Json> out;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) {
      Json j = Json::parse(line);
      if (j.contains("loss")) out.push_back(j);
    }
  return out;
}

struct CliResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};
// Runs the `kiln` binary built beside the tests with `args` (shell syntax), as a user would.
inline CliResult run_kiln(const std::string& args, const std::string& scratch_dir) {
  const std::string log = scratch_dir + "/cli_output.txt";
  const std::string cmd = std::string(KILN_BINARY) + " " + args + " > " + log + " 2>&1 < /dev/null";
  const int rc = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.output = read_text(log);
  return r;
}

// A short BERT-tiny masked-LM `kiln train` command on fortunes' "computers" (3 steps, dropout off, one
// thread), after building its vocabulary in `dir`; the caller adds --batch, --out and what it compares.
inline std::string small_mlm_train(const TempDir& dir) {
  const CliResult r =
      run_kiln("vocab --text " + kFortunes + "/computers --size 1000 --out " + dir / "vocab.txt", dir.p.string());
  KILN_CHECK(r.code == 0, "kiln vocab failed: ", r.output);
  return "train --model bert-tiny --text " + kFortunes + "/computers --vocab " + dir / "vocab.txt" +
         " --seq-len 64 --max-steps 3 --epochs 1 --limit-eval 32 --optimizer adamw --lr 0.001 --log-every 1 "
         "--progress lines --seed 5 --threads 1 --set hidden_dropout=0 --set attention_dropout=0";
}

}  // namespace kiln::testing
