// `kiln launch --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P] -- CMD...`:
// starts N local ranks of CMD with the variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), prefixes each output line with its rank, forwards
// SIGINT/SIGTERM/SIGHUP, and when a rank fails stops the others and exits with the status of the
// rank that caused the failure (not one that only lost it as a peer), naming every failed rank. Every
// rank gets the job's secret in KILN_DIST_SECRET (a fresh random one on one machine; on several,
// the one the user set on each), which the TCP communicator's handshake checks.
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/thread_pool.h"
#include "tools/cli_checks.h"
#include "tools/commands.h"

namespace kiln::tools {
namespace {

volatile std::sig_atomic_t g_launch_signal = 0;
extern "C" void on_launch_signal(int sig) { g_launch_signal = sig; }

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = strsignal(WTERMSIG(status));
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + (name ? name : "?") + ")";
  }
  return "ended with status " + std::to_string(status);
}

// kiln's exit status for a collective that failed (tools/main.cpp): a peer ended or hangs, so the
// rank that exits with it is seldom the cause of a job's failure.
constexpr int kCollectiveFailed = 3;

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out = -1;  // read end of its stdout+stderr
  bool running = false;
  int status = 0;
  int failed_as = -1;  // its place among the ranks that failed, in the order they ended; -1: none
  uint64_t sent = 0;   // the signals the launcher sent it (bit s for signal s)
  std::thread reader;
};

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// Killed by a signal the launcher sent it, or exited as a shell reports such a death (128 + signal).
bool stopped_by_launcher(const Child& c) {
  const int sig = WIFSIGNALED(c.status) ? WTERMSIG(c.status) : WEXITSTATUS(c.status) - 128;
  return sig > 0 && sig < 64 && (c.sent >> sig & 1);
}

// The stop signal (SIGINT, SIGTERM or SIGHUP) that ended a rank the launcher did not send it to; 0 for
// any other end. Exited with 128 + the signal, or killed by it.
int outside_stop_signal(const Child& c) {
  const int sig = WIFSIGNALED(c.status) ? WTERMSIG(c.status) : WIFEXITED(c.status) ? WEXITSTATUS(c.status) - 128 : 0;
  return (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) && !stopped_by_launcher(c) ? sig : 0;
}

// Ended by SIGINT, SIGTERM or SIGHUP, a signal the launcher did not send: a stop from outside (another
// machine's launcher, a kill to one rank) that the rank caught. kiln train's ranks agree on such a stop
// and end by themselves: the job stopped, it did not fail. The rank that caught the signal exits with
// 128 + it (kiln.train raises SystemExit(128 + signal) for SIGTERM and SIGHUP), except a Python rank's
// SIGINT: kiln.train raises KeyboardInterrupt, and CPython ends on an uncaught KeyboardInterrupt by
// killing itself with SIGINT, so a death by SIGINT is that stop too. A rank killed by SIGTERM or SIGHUP
// itself did not catch it (a command that is not Kiln's, a rank killed before it set its handlers): it
// agreed no stop with the others, so it failed, and the others are stopped as after any failure.
bool stopped_from_outside(const Child& c) {
  const int sig = outside_stop_signal(c);
  return sig != 0 && (WIFEXITED(c.status) || sig == SIGINT);
}

// Killed by SIGTERM or SIGHUP, not sent by the launcher, which it did not catch.
bool killed_from_outside(const Child& c) {
  return WIFSIGNALED(c.status) && outside_stop_signal(c) != 0 && !stopped_from_outside(c);
}

// A failure that follows another rank's: it lost a peer in a collective, or the launcher stopped it.
bool consequence(const Child& c) {
  return (WIFEXITED(c.status) && WEXITSTATUS(c.status) == kCollectiveFailed) || stopped_by_launcher(c);
}

const char* sigabbrev(const Child& c) {
  const int sig = outside_stop_signal(c);  // only for a rank stopped_from_outside
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
}

std::string describe(const Child& c) {
  std::string d = describe_status(c.status);
  if (stopped_by_launcher(c))
    d += " (stopped by the launcher)";
  else if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == kCollectiveFailed)
    d += " (a collective failed: a peer ended or hangs)";
  else if (stopped_from_outside(c) && WIFSIGNALED(c.status))
    d += " (ended by SIGINT, not from the launcher: a Python rank's KeyboardInterrupt ends so)";
  else if (stopped_from_outside(c))
    d += std::string(" (it caught ") + sigabbrev(c) + ", not from the launcher: the ranks stop together)";
  else if (killed_from_outside(c))
    d += ", not sent by the launcher (the rank did not catch it, so the others did not stop with it)";
  return d;
}

}  // namespace

void add_launch_flags(CLI::App& app, LaunchOptions& o) {
  app.add_option("--nproc-per-node", o.nproc_per_node, "Ranks to start on this machine")
      ->check(between(1, 1024))
      ->capture_default_str();
  app.add_option("--nnodes", o.nnodes, "Machines in the job")->check(between(1, 65536))->capture_default_str();
  app.add_option("--node-rank", o.node_rank, "This machine's index in [0, nnodes)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--master-addr", o.master_addr, "Address of the machine running rank 0")->capture_default_str();
  app.add_option("--master-port", o.master_port, "Port rank 0 listens on for the rendezvous")
      ->check(between(1, 65535))
      ->capture_default_str();
  app.add_option("--grace", o.grace_seconds,
                 "Seconds the other ranks get to stop after the first one fails, before SIGKILL (when the first "
                 "to fail only lost a peer, the first half of it to end by themselves before SIGTERM)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("command", o.command, "The command each rank runs, after --  (e.g. -- kiln train ...)")->required();
  // A flag launch does not know, before the `--`: named as such. CLI11 alone reported the command's
  // words instead ("not expected: hi echo" for `--bogus 2 -- echo hi`). With extras allowed, the
  // unknown flag is launch's to name, which it does as soon as its own words are parsed (before the
  // top level's own complaint); `--` itself lands among the extras and is no complaint.
  app.allow_extras();
  app.parse_complete_callback([&app] {
    std::vector<std::string> extra = app.remaining();
    std::erase(extra, std::string("--"));
    if (extra.empty()) return;
    std::string known;
    for (const CLI::Option* opt : app.get_options())
      if (!opt->get_lnames().empty() && opt->get_lnames()[0] != "help")
        known += (known.empty() ? "--" : ", --") + opt->get_lnames()[0];
    std::string hint;
    if (extra[0].rfind("--nproc", 0) == 0 && extra[0] != "--nproc-per-node") hint = " (did you mean --nproc-per-node?)";
    throw CLI::ValidationError(extra[0] + " is not a flag of kiln launch" + hint + "; its flags are " + known +
                                   ", and the command comes after --",
                               CLI::ExitCodes::ExtrasError);
  });
}

int run_launch(const LaunchOptions& o) {
  if (o.node_rank >= o.nnodes) {
    std::fprintf(stderr, "kiln launch: error: --node-rank %d must be below --nnodes %d\n", o.node_rank, o.nnodes);
    return 2;
  }
  const int world = o.nnodes * o.nproc_per_node;
  // The job's secret (engine/dist.h): the user's for a multi-machine job, which every node must
  // share; a fresh one for a job on this machine alone.
  std::string secret;
  if (const char* k = std::getenv("KILN_DIST_SECRET"); k && *k) {
    secret = k;
  } else if (o.nnodes > 1) {
    std::fprintf(stderr,
                 "kiln launch: error: a job on %d machines needs the same secret on each: set KILN_DIST_SECRET on "
                 "every node, e.g. from `head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'`\n",
                 o.nnodes);
    return 2;
  } else {
    uint8_t raw[16];
    size_t got = 0;
    while (got < sizeof raw) {
      const ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
      if (n < 0 && errno != EINTR) {
        std::perror("kiln launch: getrandom");
        return 1;
      }
      if (n > 0) got += size_t(n);
    }
    char hex[33];
    for (size_t i = 0; i < sizeof raw; ++i) std::snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    secret = hex;
  }
  // `kiln` as the command means this very binary, so a rank never runs another build from PATH.
  std::vector<std::string> cmd = o.command;
  if (cmd[0] == "kiln") {
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) cmd[0] = std::string(self, size_t(n));
  }
  // Cores are shared: each rank's compute pool gets its share of the CPUs this process may run on
  // (the ranks inherit its affinity) unless the user chose (KILN_NUM_THREADS, which the header then shows:
  // it showed the share the ranks never got).
  const char* user_threads = std::getenv("KILN_NUM_THREADS");
  const bool threads_chosen = user_threads && *user_threads;
  const std::string threads =
      threads_chosen ? std::string(user_threads) : std::to_string(std::max(1, available_cpus() / o.nproc_per_node));

  // A stop signal ignored on entry stays ignored, in the launcher and (but SIGTERM, below) its ranks
  // (kiln train's rule): `nohup kiln launch ...` survives the terminal's hang-up.
  struct sigaction sa{};
  sa.sa_handler = on_launch_signal;
  sigemptyset(&sa.sa_mask);
  std::set<int> ignored;
  for (int s : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction was {};
    if (::sigaction(s, nullptr, &was) == 0 && was.sa_handler == SIG_IGN)
      ignored.insert(s);
    else
      ::sigaction(s, &sa, nullptr);
  }

  std::vector<Child> children(size_t(o.nproc_per_node));
  std::mutex print_mutex;
  for (int i = 0; i < o.nproc_per_node; ++i) {
    Child& c = children[size_t(i)];
    c.rank = o.node_rank * o.nproc_per_node + i;
    int fds[2];
    // Close-on-exec: no rank inherits another's read end (which kept that rank's pipe open after the
    // launcher died, by accident).
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      std::perror("kiln launch: pipe");
      return 1;
    }
    const pid_t launcher = ::getpid();
    // The stop signals wait (blocked) across the fork: one sent to the new rank before it drops the
    // launcher's handler would run that handler in the child and be lost (a rank stopped at once, as
    // when another fails at start, then ran on until the SIGKILL after --grace).
    sigset_t stops, before;
    sigemptyset(&stops);
    for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stops, s);
    ::pthread_sigmask(SIG_BLOCK, &stops, &before);
    const pid_t pid = ::fork();
    if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
    if (pid < 0) {
      std::perror("kiln launch: fork");
      return 1;
    }
    if (pid == 0) {
      // The child: its own process group (a terminal's Ctrl-C reaches it once, through us), output
      // into the pipe, the rank's variables, then the command.
      ::setpgid(0, 0);
      // A launcher killed outright (kill -9, an OOM kill) cannot stop its ranks, and in their own group
      // no terminal signal reaches them: the kernel sends SIGTERM when it dies, and a rank saves a
      // checkpoint and exits as on any SIGTERM. It may have died before this line.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(1);
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      // SIGTERM is the launcher's own way to stop a rank (after another fails) and the death signal
      // above: a rank always takes it, even when the launcher was started with it ignored.
      for (int s : {SIGINT, SIGTERM, SIGHUP})
        if (s == SIGTERM || !ignored.count(s)) std::signal(s, SIG_DFL);
      ::pthread_sigmask(SIG_SETMASK, &before, nullptr);  // a stop sent meanwhile ends this rank now
      ::setenv("RANK", std::to_string(c.rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(i).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node).c_str(), 1);
      ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);
      ::setenv("KILN_DIST_SECRET", secret.c_str(), 1);
      ::setenv("KILN_NUM_THREADS", threads.c_str(), 1);
      std::vector<char*> argv;
      for (auto& a : cmd) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "kiln launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::close(fds[1]);
    c.pid = pid;
    ::setpgid(pid, pid);  // as the child does: whichever runs first, the group exists before a signal
    c.out = fds[0];
    c.running = true;
    c.reader = std::thread([&print_mutex, fd = c.out, rank = c.rank] {
      // Line by line, each prefixed with its rank; a progress bar's carriage returns end a line too.
      std::string line;
      char buf[4096];
      for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        for (ssize_t k = 0; k < n; ++k) {
          line += buf[k];
          if (buf[k] == '\n') {
            std::lock_guard<std::mutex> lk(print_mutex);
            std::printf("[rank %d] %s", rank, line.c_str());
            std::fflush(stdout);
            line.clear();
          }
        }
      }
      if (!line.empty()) {
        std::lock_guard<std::mutex> lk(print_mutex);
        std::printf("[rank %d] %s\n", rank, line.c_str());
        std::fflush(stdout);
      }
      ::close(fd);
    });
  }
  {
    std::lock_guard<std::mutex> lk(print_mutex);
    // A --threads in the command (kiln train's) is what its ranks take instead: said, as the header's
    // count is then not theirs.
    bool flag = false;
    for (const auto& a : o.command) flag = flag || a == "--threads" || a.rfind("--threads=", 0) == 0;
    const std::string note = threads_chosen && flag ? " (KILN_NUM_THREADS; the command's --threads overrides it)"
                             : threads_chosen       ? " (KILN_NUM_THREADS)"
                             : flag                 ? " (the command's --threads overrides it)"
                                                    : "";
    std::printf("kiln launch: %d rank%s on this node (ranks %d..%d of %d), rendezvous at %s:%d, %s thread%s each%s\n",
                o.nproc_per_node, o.nproc_per_node == 1 ? "" : "s", o.node_rank * o.nproc_per_node,
                (o.node_rank + 1) * o.nproc_per_node - 1, world, o.master_addr.c_str(), o.master_port, threads.c_str(),
                threads == "1" ? "" : "s", note.c_str());
    std::fflush(stdout);
  }

  // After the first failure the launcher stops the others and gathers every rank's status, to name
  // the cause: the first rank to fail that neither lost a peer (kiln's status 3) nor was stopped by
  // the launcher. A rank whose peer died often ends first (it sees the closed connection while the
  // dying rank still frees its memory), so when the first failure is such a one, the others get
  // half of --grace to end by themselves before SIGTERM: a SIGTERM would hide the cause's own status.
  // Either way the SIGKILL comes --grace after the first failure: a rank that hangs costs the job
  // --grace, not a wait before the SIGTERM and a full --grace after it.
  using Clock = std::chrono::steady_clock;
  constexpr Clock::time_point never = Clock::time_point::max();
  const auto grace = std::chrono::milliseconds(int64_t(o.grace_seconds * 1000));
  Clock::time_point term_at = never, kill_at = never;
  bool stopping = false;
  int failures = 0;
  int alive = o.nproc_per_node;
  auto signal_all = [&](int sig) {
    for (auto& c : children)
      if (c.running) {
        // The rank's process group (each rank leads its own, setpgid above): a command's children
        // (a shell's sleep) end with it instead of holding its output pipe open past it. Before the
        // child's setpgid the group does not exist yet: the rank alone then.
        if (::kill(-c.pid, sig) != 0) ::kill(c.pid, sig);
        c.sent |= uint64_t(1) << sig;
      }
  };
  auto stop_others = [&] {
    signal_all(SIGTERM);  // each rank saves and stops (kiln train), or does what its command does
    term_at = never;
    kill_at = std::min(kill_at, Clock::now() + grace);  // set already when the first failure waited
  };
  while (alive > 0) {
    if (g_launch_signal) {
      const int sig = g_launch_signal;
      g_launch_signal = 0;
      signal_all(sig);  // each rank saves and stops (kiln train), or does what its command does
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (auto& c : children)
        if (c.pid == pid && c.running) {
          c.running = false;
          c.status = status;
          --alive;
          if (!failed(status)) continue;
          c.failed_as = failures++;
          if (!stopping) {
            stopping = true;
            const bool wait = (consequence(c) || stopped_from_outside(c)) && alive > 0;
            {
              std::lock_guard<std::mutex> lk(print_mutex);
              if (wait)
                std::fprintf(stderr,
                             "kiln launch: rank %d (pid %d) %s; the other ranks get %g s to end by themselves "
                             "before SIGTERM, and SIGKILL after %g s (--grace)\n",
                             c.rank, int(pid), describe(c).c_str(), o.grace_seconds / 2, o.grace_seconds);
              else
                std::fprintf(stderr, "kiln launch: rank %d (pid %d) %s; stopping the other ranks\n", c.rank, int(pid),
                             describe(c).c_str());
            }
            if (wait) {
              term_at = Clock::now() + grace / 2;
              kill_at = Clock::now() + grace;
            } else
              stop_others();
          } else if (term_at != never && !consequence(c)) {
            stop_others();  // the cause has shown itself: stop the rest now
          }
        }
      continue;
    }
    if (Clock::now() >= term_at) stop_others();
    if (Clock::now() >= kill_at) {
      signal_all(SIGKILL);  // a rank blocked in a collective with the dead one cannot stop by itself
      kill_at = never;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& c : children) c.reader.join();
  if (failures == 0) return 0;
  // The cause: the first failure that is not another's consequence, else the first failure.
  const Child* cause = nullptr;
  for (int k = 0; k < failures && !cause; ++k)
    for (const auto& c : children)
      if (c.failed_as == k && !consequence(c)) cause = &c;
  for (const auto& c : children)
    if (!cause && c.failed_as == 0) cause = &c;
  // A stop from outside is a stop when the other ranks then ended by themselves (kiln train's ranks
  // agree on it); when the launcher had to stop them, nothing was agreed (a command that is not
  // Kiln's, a rank killed by SIGINT before kiln.train set its handlers): a failure.
  bool others_stopped = false;
  for (const auto& c : children)
    if (&c != cause && stopped_by_launcher(c)) others_stopped = true;
  const bool agreed = stopped_from_outside(*cause) && !others_stopped;
  std::string line = std::string(agreed ? "kiln launch: stopped: rank " : "kiln launch: failed: rank ") +
                     std::to_string(cause->rank) + " (pid " + std::to_string(cause->pid) + ") " + describe(*cause);
  if (stopped_from_outside(*cause))
    line += agreed ? "; the other ranks stopped with it"
                   : "; the other ranks did not end by themselves (the launcher stopped them): no stop was agreed";
  if (failures > 1) {
    line += "; each rank: ";
    for (const auto& c : children)
      line += (&c == &children.front() ? "rank " : ", rank ") + std::to_string(c.rank) + " " + describe(c);
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  const int code = exit_code(cause->status);
  return code == 0 ? 1 : code;
}

}  // namespace kiln::tools
