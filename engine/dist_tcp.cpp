// The TCP communicator for CPU ranks started by `kiln launch` or torchrun (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT; no MPI runtime). Rendezvous: rank 0 listens on MASTER_PORT, every other
// rank connects and tells it the port of its own listener, rank 0 sends back everyone's address and
// port; then each rank connects to the next one, forming a ring, and every listener is closed.
// Collectives are ring algorithms: all-reduce = reduce-scatter + all-gather (each chunk is reduced
// once, in one order, then copied, so every rank ends with identical bits), each step sending to the
// next rank while receiving from the previous one. A step that stalls past the timeout, or a peer
// that disconnects, throws CollectiveError naming the collective and the rank. Every step's data
// follows a 24-byte header (the collective, its reduce op, dtype, element count and sequence number)
// that the receiver compares with its own: ranks gone out of step (another collective or size on
// each, as ranks given other data) stop naming both sides instead of reducing each other's bytes.
//
// Nobody else gets in. A single-machine job (LOCAL_WORLD_SIZE == WORLD_SIZE) listens on loopback
// only; a multi-machine job binds rank 0 to MASTER_ADDR's address and every other rank to the
// interface its connection to rank 0 left from. Every connection starts with a handshake: the
// connecting side sends a hello (what it connects to, its rank, the world size, its listener's port,
// a nonce); the listening side answers with its own nonce and HMAC-SHA256(secret, "server" | hello |
// its nonce); the connecting side checks that and answers HMAC(secret, "client" | hello | nonce |
// that MAC). Both have then shown that they know the job's secret without sending it. A connection
// that sends anything else, says nothing for a few seconds, does not know the secret or claims a rank
// that is not expected is closed and logged, and the listener goes on waiting for the real rank.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/sha256.h"
#include "engine/autograd.h"
#include "engine/dist.h"
#include "engine/dist_internal.h"
#include "engine/ops.h"

namespace kiln::dist {
namespace {

using Clock = std::chrono::steady_clock;

struct Socket {
  int fd = -1;
  Socket() = default;
  explicit Socket(int f) : fd(f) {}
  Socket(Socket&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] void broken(const std::string& msg) { KILN_COLLECTIVE_FAIL(false, msg); }

// The IPv4 address `host` names, as dotted decimal.
std::string resolve_ipv4(const std::string& host, const std::string& who) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  KILN_CHECK(rc == 0 && res, "cannot resolve ", who, " address '", host, "': ", ::gai_strerror(rc));
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, ip, sizeof ip);
  ::freeaddrinfo(res);
  return ip;
}

// A listener on ip:port (port 0: any free one).
Socket listener(const std::string& ip, int port, int backlog) {
  Socket s(::socket(AF_INET, SOCK_STREAM, 0));
  KILN_CHECK(s.fd >= 0, "socket(): ", std::strerror(errno));
  const int one = 1;
  ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  KILN_CHECK(::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1, "not an IPv4 address: '", ip, "'");
  a.sin_port = htons(uint16_t(port));
  if (::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const int e = errno;
    KILN_FAIL("cannot listen on ", ip, ":", port, ": ", std::strerror(e),
              e == EADDRINUSE      ? " (MASTER_PORT is taken: pick another with --master-port)"
              : e == EADDRNOTAVAIL ? " (MASTER_ADDR must be an address of the machine that runs rank 0)"
                                   : "");
  }
  KILN_CHECK(::listen(s.fd, backlog) == 0, "listen(): ", std::strerror(errno));
  return s;
}

// The local (mine = true) or remote end of a socket, as ip and port.
std::pair<std::string, int> endpoint(int fd, bool mine) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (mine)
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  else
    ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len);
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return {ip, ntohs(a.sin_port)};
}

void tune(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// A wait told while it lasts: 5 s in and every 10 s after ("WHAT: 15 s of 600 s SUFFIX"), each note
// 10 s after the previous one was said (a wait blocked for long makes one late note, not a burst).
struct WaitNote {
  std::function<void(const std::string&)> note;
  std::string what, suffix;
  int64_t timeout_s;
  Clock::time_point start = Clock::now(), next = start + std::chrono::seconds(5);
  void tick() {
    const auto now = Clock::now();
    if (!note || now < next) return;
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - start).count();
    note(what + ": " + std::to_string(waited) + " s of " + std::to_string(timeout_s) + " s" + suffix);
    next = now + std::chrono::seconds(10);
  }
};

// Milliseconds to the deadline, at most `cap` and at least 0 (a poll's timeout).
int ms_until(Clock::time_point deadline, int cap) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<int64_t>(left, 0, cap));
}

// Connects to host:port, retrying until the deadline (the peer may not be listening yet). The
// failure names the wait (--dist-timeout, `timeout_s`), as rank 0's wait for the others does. With
// `note`, a wait is told 5 s in and every 10 s after ("waiting for WHO at HOST:PORT: 15 s of 600 s"):
// a rank whose rank 0 never came (refused to start, another machine not up) said nothing for the
// whole --dist-timeout. Each attempt is a non-blocking connect polled until the deadline: a blocking
// one to a host that drops packets took ~127 s, past --dist-timeout and the notes.
Socket connect_to(const std::string& host, int port, Clock::time_point deadline, int64_t timeout_s,
                  const std::string& who, const std::function<void(const std::string&)>& note = nullptr) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  KILN_CHECK(rc == 0 && res, "cannot resolve ", who, " address '", host, "': ", ::gai_strerror(rc));
  WaitNote waiting{note, "waiting for " + who + " at " + host + ":" + std::to_string(port),
                   " (--dist-timeout; is it running?)", timeout_s};
  for (;;) {
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
    bool connected = s.fd >= 0 && ::connect(s.fd, res->ai_addr, res->ai_addrlen) == 0;
    if (!connected && s.fd >= 0 && errno == EINPROGRESS) {
      for (;;) {  // until it connects, fails, or the deadline passes
        pollfd p{s.fd, POLLOUT, 0};
        const int k = ::poll(&p, 1, ms_until(deadline, 200));
        if (k > 0) {
          int err = 0;
          socklen_t len = sizeof err;
          connected = ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
          break;
        }
        if (Clock::now() > deadline) break;
        waiting.tick();
      }
    }
    if (connected) {
      ::freeaddrinfo(res);
      const int flags = ::fcntl(s.fd, F_GETFL, 0);
      ::fcntl(s.fd, F_SETFL, flags & ~O_NONBLOCK);  // as a blocking connect left it
      tune(s.fd);
      return s;
    }
    if (Clock::now() > deadline) {
      ::freeaddrinfo(res);
      KILN_FAIL("could not connect to ", who, " at ", host, ":", port, " within --dist-timeout (", timeout_s,
                " s; is it running?)");
    }
    waiting.tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Waits until `fd` is readable or the deadline passes (false), telling the wait with `waiting`.
bool wait_readable(int fd, Clock::time_point deadline, WaitNote& waiting) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms_until(deadline, 200)) > 0) return true;
    if (Clock::now() > deadline) return false;
    waiting.tick();
  }
}

// Accepts one connection on `l` by the deadline. The failure names the wait (--dist-timeout,
// `timeout_s`), as connect_to's does; `waiting` tells the wait meanwhile.
Socket accept_one(const Socket& l, Clock::time_point deadline, int64_t timeout_s, const std::string& who,
                  WaitNote* waiting = nullptr) {
  for (;;) {
    pollfd p{l.fd, POLLIN, 0};
    const int k = ::poll(&p, 1, ms_until(deadline, 200));
    if (k > 0) {
      Socket s(::accept(l.fd, nullptr, nullptr));
      if (s.fd >= 0) {
        tune(s.fd);
        return s;
      }
    }
    if (Clock::now() > deadline) KILN_FAIL("no connection from ", who, " within --dist-timeout (", timeout_s, " s)");
    if (waiting) waiting->tick();
  }
}

// Sends sn bytes on `out` while receiving rn bytes on `in`, until both are done. false: timed out.
// A peer that closed its end throws CollectiveError (it has exited).
// `to` and `from` name the peers in errors (a ring step names their ranks).
// With a header (hn bytes, a ring step's): `sh` goes out before the sn bytes in the same stream, and
// the first hn bytes received land in `rh`; `check` sees them as soon as they are whole, before the
// data is used. One exchange, so the header costs no round trip or call of its own.
bool exchange(int out, const void* sp, size_t sn, int in, void* rp, size_t rn, Clock::time_point deadline,
              const std::string& what, const std::string& to = "the peer", const std::string& from = "the peer",
              const void* sh = nullptr, void* rh = nullptr, size_t hn = 0, const std::function<void()>& check = {}) {
  const size_t hs = sh ? hn : 0, hr = rh ? hn : 0;  // header bytes sent, received
  size_t so = 0, ro = 0;                            // offsets into header + data
  const char* s = static_cast<const char*>(sp);
  char* r = static_cast<char*>(rp);
  while (so < hs + sn || ro < hr + rn) {
    pollfd p[2];
    int np = 0, io = -1, ii = -1;
    if (so < hs + sn) io = np, p[np++] = {out, POLLOUT, 0};
    if (ro < hr + rn) ii = np, p[np++] = {in, POLLIN, 0};
    const int k = ::poll(p, nfds_t(np), 200);
    if (k < 0 && errno != EINTR) broken(what + ": poll: " + std::strerror(errno));
    if (k <= 0) {
      if (Clock::now() > deadline) return false;
      continue;
    }
    if (io >= 0 && (p[io].revents & (POLLOUT | POLLERR | POLLHUP))) {
      iovec v[2];
      int nv = 0;
      if (so < hs) v[nv++] = {const_cast<void*>(static_cast<const void*>(static_cast<const char*>(sh) + so)), hs - so};
      if (sn > 0) v[nv++] = {const_cast<char*>(s + (so < hs ? 0 : so - hs)), so < hs ? sn : sn - (so - hs)};
      msghdr m{};
      m.msg_iov = v;
      m.msg_iovlen = size_t(nv);
      const ssize_t n = ::sendmsg(out, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) so += size_t(n);
      else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        broken(what + ": " + to + " is gone (" + std::strerror(errno) + ")");
    }
    if (ii >= 0 && (p[ii].revents & (POLLIN | POLLERR | POLLHUP))) {
      // Header and data in one call (a header alone would cost a call per step); the header is
      // checked as soon as it is whole, and a wrong one throws before the data is used.
      iovec v[2];
      int nv = 0;
      if (ro < hr) v[nv++] = {static_cast<char*>(rh) + ro, hr - ro};
      if (rn > 0) v[nv++] = {r + (ro < hr ? 0 : ro - hr), ro < hr ? rn : rn - (ro - hr)};
      msghdr m{};
      m.msg_iov = v;
      m.msg_iovlen = size_t(nv);
      const ssize_t n = ::recvmsg(in, &m, MSG_DONTWAIT);
      if (n > 0) {
        const bool head = ro < hr;
        ro += size_t(n);
        if (head && ro >= hr && check) check();
      } else if (n == 0) {
        broken(what + ": " + from + " closed its connection (it has exited)");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        broken(what + ": receiving from " + from + ": " + std::strerror(errno));
      }
    }
  }
  return true;
}

// ---- the handshake ----------------------------------------------------------------------------

struct Hello {
  char magic[8];  // kRendezvous or kRing: what the connection is for
  int32_t rank, world, port;
  uint8_t nonce[16];
};
static_assert(sizeof(Hello) == 36);
struct Challenge {
  uint8_t nonce[16];
  Digest256 mac;  // HMAC(secret, "server" | hello | nonce)
};
static_assert(sizeof(Challenge) == 48);
// The last byte is the wire format's version: 2 added the listener's verdict, 3 the header before
// each ring step's data. Bump it with any change to what ranks send each other, so a rank of
// another build is refused at the handshake, not misread mid-collective.
constexpr char kRendezvous[8] = {'K', 'I', 'L', 'N', 'R', 'D', 'V', '3'};
constexpr char kRing[8] = {'K', 'I', 'L', 'N', 'R', 'N', 'G', '3'};
constexpr auto kHandshakeTime = std::chrono::seconds(5);  // what a stranger can hold a listener up
constexpr int32_t kMaxVerdict = 1024;                     // the longest refusal reason sent to a rank

void fill_nonce(uint8_t* p) {
  size_t got = 0;
  while (got < 16) {
    const ssize_t n = ::getrandom(p + got, 16 - got, 0);
    KILN_CHECK(n > 0 || errno == EINTR, "getrandom(): ", std::strerror(errno));
    if (n > 0) got += size_t(n);
  }
}

Digest256 server_mac(const std::string& secret, const Hello& h, const uint8_t* nonce) {
  uint8_t msg[6 + sizeof(Hello) + 16];
  std::memcpy(msg, "server", 6);
  std::memcpy(msg + 6, &h, sizeof h);
  std::memcpy(msg + 6 + sizeof h, nonce, 16);
  return hmac_sha256(secret, msg, sizeof msg);
}
Digest256 client_mac(const std::string& secret, const Hello& h, const Challenge& c) {
  uint8_t msg[6 + sizeof(Hello) + sizeof(Challenge)];
  std::memcpy(msg, "client", 6);
  std::memcpy(msg + 6, &h, sizeof h);
  std::memcpy(msg + 6 + sizeof h, &c, sizeof c);
  return hmac_sha256(secret, msg, sizeof msg);
}

// The connecting side: says who it is, checks that the listener knows the secret, proves it does.
void introduce(const Socket& s, const char* magic, int rank, int world, int port, const std::string& secret,
               Clock::time_point deadline, const std::string& who) {
  Hello h{};
  std::memcpy(h.magic, magic, 8);
  h.rank = rank, h.world = world, h.port = port;
  fill_nonce(h.nonce);
  Challenge c{};
  // The listener may be busy with other connections first: wait as long as the whole set-up may take.
  KILN_CHECK(exchange(s.fd, &h, sizeof h, s.fd, &c, sizeof c, deadline, "handshake"), who,
             " accepted the connection but did not answer Kiln's handshake before the timeout (another program "
             "holds that port?)");
  KILN_CHECK(digest_equal(c.mac, server_mac(secret, h, c.nonce)), "the process listening for ", who,
             " does not know this job's secret: KILN_DIST_SECRET differs between the ranks, or another job or "
             "program holds that port");
  const Digest256 mine = client_mac(secret, h, c);
  exchange(s.fd, mine.data(), mine.size(), -1, nullptr, 0, deadline, "handshake");
  // The listener's verdict: empty when admitted, else why not (a rank told nothing only saw its
  // connection close, and waited or failed with no reason).
  int32_t n = -1;
  std::string why;
  try {
    KILN_CHECK(exchange(-1, nullptr, 0, s.fd, &n, sizeof n, deadline, "handshake"), who,
               " did not answer the handshake with a verdict before the timeout");
    KILN_CHECK(n >= 0 && n <= kMaxVerdict, who, " answered the handshake with a verdict of ", n,
               " bytes (another program holds that port?)");
    if (n == 0) return;
    why.resize(size_t(n));
    if (!exchange(-1, nullptr, 0, s.fd, why.data(), why.size(), deadline, "handshake"))
      why = "(the reason did not arrive before the timeout)";
  } catch (const CollectiveError&) {
    KILN_FAIL(who, " closed the connection after the handshake without a verdict (it has exited?)");
  }
  KILN_FAIL(who, " refused this rank: ", why);
}

// Tells a connection that proved it knows the secret whether it is admitted ("" = yes). Best effort:
// a peer gone already is the listener's loss of nothing.
void tell_verdict(const Socket& s, const std::string& why, Clock::time_point deadline) {
  const std::string w = why.substr(0, size_t(kMaxVerdict));
  const int32_t n = int32_t(w.size());
  try {
    const auto until = std::min(deadline, Clock::now() + kHandshakeTime);
    exchange(s.fd, &n, sizeof n, -1, nullptr, 0, until, "handshake");
    if (n > 0) exchange(s.fd, w.data(), w.size(), -1, nullptr, 0, until, "handshake");
  } catch (const Error&) {
  }
}

// The listening side: the Hello of a connection that proved it knows the secret, or nothing, with
// `why` saying what was wrong. Whether that rank belongs to this job is the caller's question
// (world_problem and the rank checks); the caller then tells it the verdict.
std::optional<Hello> admit(const Socket& s, const char* magic, const std::string& secret, Clock::time_point deadline,
                           std::string& why) {
  const auto until = std::min(deadline, Clock::now() + kHandshakeTime);
  try {
    Hello h{};
    if (!exchange(-1, nullptr, 0, s.fd, &h, sizeof h, until, "handshake")) {
      why = "it sent no Kiln handshake within " + std::to_string(kHandshakeTime.count()) + " s";
      return std::nullopt;
    }
    if (std::memcmp(h.magic, magic, 8) != 0) {
      why = std::memcmp(h.magic, magic, 7) == 0
                ? "it is a Kiln rank of another version (handshake version " + std::string(1, h.magic[7]) +
                      ", this one " + std::string(1, magic[7]) + "): every machine needs the same Kiln"
            : std::memcmp(h.magic, magic, 4) == 0 ? "it is a Kiln rank connecting to the wrong port"
                                                  : "it sent bytes that are not a Kiln handshake";
      return std::nullopt;
    }
    Challenge c{};
    fill_nonce(c.nonce);
    c.mac = server_mac(secret, h, c.nonce);
    Digest256 theirs{};
    if (!exchange(s.fd, &c, sizeof c, s.fd, theirs.data(), theirs.size(), until, "handshake")) {
      why = "it did not finish the handshake within " + std::to_string(kHandshakeTime.count()) + " s";
      return std::nullopt;
    }
    if (!digest_equal(theirs, client_mac(secret, h, c))) {
      why = "it does not know the job's secret (KILN_DIST_SECRET)";
      return std::nullopt;
    }
    return h;
  } catch (const Error&) {  // it hung up (a rank that found our proof wrong does) or the socket failed
    why = "it closed the connection during the handshake (a rank whose KILN_DIST_SECRET differs does)";
    return std::nullopt;
  }
}

// Why a rank that proved the secret cannot join this job of `world` ranks, or "".
std::string world_problem(const Hello& h, int world) {
  if (h.world == world && h.rank >= 0 && h.rank < world) return "";
  return "it was started as rank " + std::to_string(h.rank) + " of " + std::to_string(h.world) +
         " (WORLD_SIZE=" + std::to_string(h.world) + "), this job has " + std::to_string(world) +
         " ranks: every rank needs the same WORLD_SIZE and a RANK below it";
}

template <typename T> void reduce_into(T* dst, const T* src, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: case ReduceOp::avg:
      for (int64_t i = 0; i < n; ++i) dst[i] = T(dst[i] + src[i]);
      break;
    case ReduceOp::max:
      for (int64_t i = 0; i < n; ++i) dst[i] = dst[i] < src[i] ? src[i] : dst[i];
      break;
    case ReduceOp::min:
      for (int64_t i = 0; i < n; ++i) dst[i] = src[i] < dst[i] ? src[i] : dst[i];
      break;
  }
}

void reduce_bytes(DType t, void* dst, const void* src, int64_t n, ReduceOp op) {
  switch (t) {
    case DType::f32: return reduce_into(static_cast<float*>(dst), static_cast<const float*>(src), n, op);
    case DType::f64: return reduce_into(static_cast<double*>(dst), static_cast<const double*>(src), n, op);
    case DType::i32: return reduce_into(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, op);
    case DType::i64: return reduce_into(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, op);
    case DType::i16: return reduce_into(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), n, op);
    case DType::i8: return reduce_into(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n, op);
    case DType::u8: case DType::boolean:
      return reduce_into(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, op);
    default: KILN_FAIL("TCP collectives reduce f32, f64, i64, i32, i16, i8, u8 or bool, got ", t);
  }
}

class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(const DistEnv& env, std::chrono::seconds timeout)
      : rank_(env.rank),
        size_(env.world_size),
        timeout_(timeout),
        secret_(env.secret),
        log_(env.log),
        label_("rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) + " (tcp)") {
    KILN_CHECK(!env.master_addr.empty() && env.master_port > 0, "rank ", rank_, " of ", size_,
               ": MASTER_ADDR and MASTER_PORT must be set (kiln launch sets them)");
    KILN_CHECK(env.master_port <= 65535, "rank ", rank_, " of ", size_, ": MASTER_PORT ", env.master_port,
               " is not a TCP port: expected 1..65535");
    const auto deadline = Clock::now() + timeout_;
    if (rank_ == 0 && secret_.empty())
      say("KILN_DIST_SECRET is not set: the ranks authenticate with an empty secret, so any process that can "
          "reach the job's ports could join it (kiln launch sets a secret; for other launchers set the same "
          "KILN_DIST_SECRET for every rank)");
    // One machine (the launcher says all ranks run here): loopback only. Several, or a launcher that
    // does not say: rank 0 on MASTER_ADDR's address, the others on the interface that reaches rank 0.
    const bool one_machine = env.local_world_size_given && env.local_world_size == env.world_size;
    const std::string master_ip = one_machine ? "127.0.0.1" : resolve_ipv4(env.master_addr, "MASTER_ADDR");
    std::vector<std::string> addr(static_cast<size_t>(size_));
    std::vector<int32_t> port(static_cast<size_t>(size_));
    Socket ring;
    auto open_ring = [&](const std::string& ip) {
      ring = listener(ip, 0, 4);
      const int p = endpoint(ring.fd, true).second;
      if (env.on_listen) env.on_listen("ring", ip, p);
      return p;
    };
    // ---- rendezvous through rank 0 ----
    if (rank_ == 0) {
      addr[0] = master_ip;
      port[0] = open_ring(master_ip);
      Socket l = listener(master_ip, env.master_port, size_ + 4);
      if (env.on_listen) env.on_listen("rendezvous", master_ip, env.master_port);
      std::vector<Socket> peers(static_cast<size_t>(size_));
      // Told while it lasts, as a rank waiting for rank 0 is: it was silent for the whole --dist-timeout.
      WaitNote waiting{[this](const std::string& line) { say(line); }, "", " (--dist-timeout)",
                       int64_t(timeout_.count())};
      // The ranks that joined wait for the address table: when rank 0 gives up, a negative length and
      // the reason tell them why none comes (they saw only the connection close). Best effort, briefly.
      const auto give_up = [&peers, this](const std::string& why) {
        const std::string w = why.substr(0, size_t(kMaxVerdict));
        const int32_t n = -int32_t(w.size());
        for (int k = 1; k < size_; ++k)
          if (peers[size_t(k)].fd >= 0) try {
              const auto until = Clock::now() + std::chrono::seconds(1);
              exchange(peers[size_t(k)].fd, &n, sizeof n, -1, nullptr, 0, until, "rendezvous");
              exchange(peers[size_t(k)].fd, w.data(), w.size(), -1, nullptr, 0, until, "rendezvous");
            } catch (const Error&) {
            }
      };
      for (int joined = 1; joined < size_;) {
        std::string missing;  // named when the wait ends: which ranks never came
        for (int k = 1; k < size_; ++k)
          if (peers[size_t(k)].fd < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
        waiting.what = "waiting for rank(s) " + missing + " to join";
        Socket s;
        try {
          s = accept_one(l, deadline, int64_t(timeout_.count()),
                         "the other ranks (" + std::to_string(joined) + " of " + std::to_string(size_) +
                             " joined; missing rank(s) " + missing + ")",
                         &waiting);
        } catch (const Error&) {
          give_up("rank 0 gave up waiting for rank(s) " + missing + " to join within --dist-timeout (" +
                  std::to_string(timeout_.count()) + " s)");
          throw;
        }
        std::string why;
        std::optional<Hello> h = admit(s, kRendezvous, secret_, deadline, why);
        if (h) {
          why = world_problem(*h, size_);
          if (why.empty() && (h->rank == 0 || peers[size_t(h->rank)].fd >= 0))
            why = "rank " + std::to_string(h->rank) +
                  " has joined already: two processes were given the same RANK, or two launches share one "
                  "MASTER_PORT";
          tell_verdict(s, why, deadline);
        }
        if (!why.empty()) {
          // A rank that knows a real secret but another WORLD_SIZE is this job misconfigured, not a
          // stranger: waiting out --dist-timeout would not mend it. (With no secret anyone "knows" it.)
          const bool fatal = h && !secret_.empty() && h->world != size_;
          const std::string from = endpoint(s.fd, false).first;
          refuse(s, "the rendezvous port", why);
          if (fatal) {
            // The ranks that joined are told too: they saw only rank 0 close its connection.
            const std::string what = "a rank at " + from + " that knows this job's KILN_DIST_SECRET joined, but " + why;
            give_up("rank 0 gave up: " + what);
            KILN_FAIL(label_, ": ", what);
          }
          continue;
        }
        addr[size_t(h->rank)] = endpoint(s.fd, false).first;
        port[size_t(h->rank)] = h->port;
        peers[size_t(h->rank)] = std::move(s);
        ++joined;
        if (env.on_join) env.on_join(h->rank);
      }
      std::string table;
      for (int k = 0; k < size_; ++k) table += addr[size_t(k)] + " " + std::to_string(port[size_t(k)]) + "\n";
      const int32_t len = int32_t(table.size());
      for (int k = 1; k < size_; ++k) {
        exchange(peers[size_t(k)].fd, &len, sizeof len, -1, nullptr, 0, deadline, "rendezvous");
        exchange(peers[size_t(k)].fd, table.data(), table.size(), -1, nullptr, 0, deadline, "rendezvous");
      }
    } else {
      Socket s = connect_to(master_ip, env.master_port, deadline, int64_t(timeout_.count()),
                            "rank 0 (MASTER_ADDR:MASTER_PORT)", [this](const std::string& line) { say(line); });
      const int my_port = open_ring(one_machine ? master_ip : endpoint(s.fd, true).first);
      introduce(s, kRendezvous, rank_, size_, my_port, secret_, deadline,
                "rank 0 at " + master_ip + ":" + std::to_string(env.master_port));
      // The table comes when every rank has joined: told while it lasts, as rank 0's wait is.
      WaitNote waiting{[this](const std::string& line) { say(line); },
                       "waiting for the other ranks to join (rank 0 sends the address table when all " +
                           std::to_string(size_) + " have)",
                       " (--dist-timeout)", int64_t(timeout_.count())};
      int32_t len = 0;
      KILN_CHECK(wait_readable(s.fd, deadline, waiting) &&
                     exchange(-1, nullptr, 0, s.fd, &len, sizeof len, deadline, "rendezvous"),
                 "rendezvous: no address table from rank 0 within --dist-timeout (", timeout_.count(), " s)");
      if (len < 0 && len >= -kMaxVerdict) {  // rank 0 gave up, and says why
        std::string why(size_t(-len), '\0');
        if (!exchange(-1, nullptr, 0, s.fd, why.data(), why.size(), deadline, "rendezvous"))
          why = "rank 0 gave up waiting for the other ranks";
        KILN_FAIL("rendezvous: ", why);
      }
      KILN_CHECK(len > 0 && len < (1 << 24), "rendezvous: no address table from rank 0");
      std::string table(size_t(len), '\0');
      exchange(-1, nullptr, 0, s.fd, table.data(), table.size(), deadline, "rendezvous");
      std::istringstream in(table);
      for (int k = 0; k < size_; ++k) in >> addr[size_t(k)] >> port[size_t(k)];
    }
    // ---- the ring: connect to the next rank, accept the previous one ----
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    const std::string next_name = "rank " + std::to_string(next);
    next_ = connect_to(addr[size_t(next)], port[size_t(next)], deadline, int64_t(timeout_.count()), next_name);
    // Every rank is a client of the next and a listener for the previous at once: introduce on a
    // thread of its own while this one admits, or each would wait for the next to answer.
    auto introduced = std::async(std::launch::async, [&] {
      introduce(next_, kRing, rank_, size_, 0, secret_, deadline,
                next_name + " at " + addr[size_t(next)] + ":" + std::to_string(port[size_t(next)]));
    });
    struct Join {  // the thread must end before its captures do, also on an error below
      std::future<void>& f;
      ~Join() {
        if (f.valid()) f.wait();
      }
    } join{introduced};
    for (;;) {
      Socket s = accept_one(ring, deadline, int64_t(timeout_.count()), "rank " + std::to_string(prev));
      std::string why;
      std::optional<Hello> h = admit(s, kRing, secret_, deadline, why);
      if (h) {
        why = world_problem(*h, size_);
        if (why.empty() && h->rank != prev)
          why = "it says rank " + std::to_string(h->rank) + ", the ring expects rank " + std::to_string(prev) + " here";
        tell_verdict(s, why, deadline);
        if (why.empty()) {
          prev_ = std::move(s);
          break;
        }
      }
      refuse(s, "the ring port", why);
    }
    introduced.get();
  }

  ~TcpCommunicator() override { thread_.stop(); }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  const char* backend() const override { return "tcp"; }

  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    detail::check_tensor(t, "all_reduce");
    return thread_.submit([this, t, op] {
      const Op me = begin(Kind::all_reduce, op, t.dtype(), t.numel());
      const bool low = is_low_precision(t.dtype());
      Tensor buf = low ? t.to(DType::f32) : t;
      const int64_t n = buf.numel(), es = int64_t(dtype_size(buf.dtype()));
      char* base = static_cast<char*>(buf.raw_data());
      auto off = [&](int c) { return n * c / size_; };  // chunk c: [off(c), off(c+1))
      std::vector<char> tmp(size_t((n / size_ + 1) * es));
      // Reduce-scatter: after size-1 steps rank r holds chunk r reduced over all ranks.
      for (int s = 0; s < size_ - 1; ++s) {
        const int sc = mod(rank_ - s - 1), rc = mod(rank_ - s - 2);
        step(me, kBoth, base + off(sc) * es, (off(sc + 1) - off(sc)) * es, tmp.data(), (off(rc + 1) - off(rc)) * es,
             n * es);
        reduce_bytes(buf.dtype(), base + off(rc) * es, tmp.data(), off(rc + 1) - off(rc), op);
      }
      // All-gather of the reduced chunks.
      for (int s = 0; s < size_ - 1; ++s) {
        const int sc = mod(rank_ - s), rc = mod(rank_ - s - 1);
        step(me, kBoth, base + off(sc) * es, (off(sc + 1) - off(sc)) * es, base + off(rc) * es,
             (off(rc + 1) - off(rc)) * es, n * es);
      }
      NoGradGuard g;
      if (op == ReduceOp::avg) Tensor(buf).mul_(1.0 / double(size_));
      if (low) Tensor(t).copy_(buf);
    });
  }

  void broadcast(const Tensor& t, int root) override {
    detail::check_tensor(t, "broadcast");
    detail::check_root(root, size_);
    thread_
        .submit([this, t, root] {
          const Op me = begin(Kind::broadcast, ReduceOp::sum, t.dtype(), t.numel());
          const size_t bytes = size_t(t.numel()) * dtype_size(t.dtype());
          // Along the ring from the root; the rank before the root does not forward.
          if (rank_ != root) step(me, kReceives, nullptr, 0, t.raw_data(), int64_t(bytes), int64_t(bytes));
          if (mod(rank_ + 1) != root) step(me, kSends, t.raw_data(), int64_t(bytes), nullptr, 0, int64_t(bytes));
        })
        ->wait();
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    detail::check_blocks("all_gather", out, in, size_);
    thread_
        .submit([this, in, out] {
          const Op me = begin(Kind::all_gather, ReduceOp::sum, in.dtype(), in.numel());
          const int64_t b = in.numel() * int64_t(dtype_size(in.dtype()));
          char* base = static_cast<char*>(out.raw_data());
          if (b > 0 && base + rank_ * b != in.raw_data()) std::memcpy(base + rank_ * b, in.raw_data(), size_t(b));
          for (int s = 0; s < size_ - 1; ++s)
            step(me, kBoth, base + mod(rank_ - s) * b, b, base + mod(rank_ - s - 1) * b, b, b * size_);
        })
        ->wait();
  }

  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    reduce_scatter_async(in, out, op)->wait();
  }

  std::shared_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override {
    detail::check_blocks("reduce_scatter", in, out, size_);
    return thread_.submit([this, in, out, op] {
      const Op me = begin(Kind::reduce_scatter, op, in.dtype(), out.numel());
      Tensor work = in.clone();
      const int64_t n = out.numel(), b = n * int64_t(dtype_size(in.dtype()));
      char* base = static_cast<char*>(work.raw_data());
      std::vector<char> tmp(static_cast<size_t>(b));
      for (int s = 0; s < size_ - 1; ++s) {
        const int sc = mod(rank_ - s - 1), rc = mod(rank_ - s - 2);
        step(me, kBoth, base + sc * b, b, tmp.data(), b, b * size_);
        reduce_bytes(in.dtype(), base + rc * b, tmp.data(), n, op);
      }
      if (b > 0) std::memcpy(out.raw_data(), base + rank_ * b, size_t(b));
      NoGradGuard g;
      if (op == ReduceOp::avg) Tensor(out).mul_(1.0 / double(size_));
    });
  }

  void barrier() override {
    Tensor t = zeros({1});
    all_reduce(t, ReduceOp::sum);
  }

 private:
  int mod(int x) const { return ((x % size_) + size_) % size_; }

  // What a ring step belongs to, sent before its data (the header every step carries).
  enum class Kind : uint8_t { all_reduce = 1, broadcast, all_gather, reduce_scatter };
  struct Op {
    uint32_t magic = kStepMagic;
    Kind kind;
    ReduceOp reduce;  // all_reduce and reduce_scatter; sum for the others
    uint8_t dtype;
    uint8_t unused = 0;
    int64_t count;  // elements: the tensor's (all_reduce, broadcast), a rank's block (all_gather, reduce_scatter)
    uint64_t seq;   // collectives this communicator began, this one included
  };
  static_assert(sizeof(Op) == 24);
  static constexpr uint32_t kStepMagic = 0x5054534b;  // "KSTP"

  // Called first on the communication thread, which runs the collectives in the order they were submitted.
  Op begin(Kind kind, ReduceOp reduce, DType dtype, int64_t count) {
    Op o;
    o.kind = kind;
    o.reduce = reduce;
    o.dtype = uint8_t(dtype);
    o.count = count;
    o.seq = ++seq_;
    return o;
  }

  static const char* kind_name(Kind k) {
    switch (k) {
      case Kind::all_reduce: return "all_reduce";
      case Kind::broadcast: return "broadcast";
      case Kind::all_gather: return "all_gather";
      case Kind::reduce_scatter: return "reduce_scatter";
    }
    return "an unknown collective";
  }
  // "all_reduce (sum) of 24 f32 elements, collective 5"
  static std::string describe(const Op& o) {
    static const char* kReduce[] = {"sum", "avg", "max", "min"};
    const bool reduces = o.kind == Kind::all_reduce || o.kind == Kind::reduce_scatter;
    std::string dt = "dtype " + std::to_string(int(o.dtype));
    if (o.dtype <= uint8_t(DType::i16)) dt = dtype_name(DType(o.dtype));
    return std::string(kind_name(o.kind)) +
           (reduces && uint8_t(o.reduce) < 4 ? std::string(" (") + kReduce[uint8_t(o.reduce)] + ")" : "") + " of " +
           std::to_string(o.count) + " " + dt + " elements" +
           (o.kind == Kind::all_gather || o.kind == Kind::reduce_scatter ? " per rank" : "") + ", collective " +
           std::to_string(o.seq);
  }

  // Which way a ring step goes. Said by the collective, never inferred from its pointers: an empty
  // tensor's data may be null on one rank and not on another, and a header sent by one side but
  // awaited by neither (or the reverse) stalls the ring until --dist-timeout.
  enum Way { kSends = 1, kReceives = 2, kBoth = 3 };

  // One ring step: send to the next rank while receiving from the previous one, each message after
  // the header of the collective it belongs to (checked before the data is read). The header goes
  // both ways `way` says also when there is no data, so a zero-size collective completes at once.
  void step(const Op& me, Way way, const void* sp, int64_t sn, void* rp, int64_t rn, int64_t total_bytes) {
    const char* what = kind_name(me.kind);
    const std::string to = "rank " + std::to_string(mod(rank_ + 1)) + " (the next in the ring)",
                      from = "rank " + std::to_string(mod(rank_ - 1)) + " (the previous in the ring)";
    Op theirs{};
    const bool sends = (way & kSends) != 0, receives = (way & kReceives) != 0;
    const auto check = [&] {
      if (std::memcmp(&theirs, &me, sizeof me) == 0) return;
      KILN_COLLECTIVE_FAIL(false, label_, ": ", describe(me), " here, but ", from, " sent ",
                           theirs.magic == kStepMagic ? describe(theirs) : std::string("bytes that are no step header"),
                           ": the ranks went out of step (each must run the same collectives in the same order; "
                           "ranks given other data or flags do not)");
    };
    if (!exchange(next_.fd, sp, size_t(sn), prev_.fd, rp, size_t(rn), Clock::now() + timeout_, label_ + ": " + what, to,
                  from, sends ? &me : nullptr, receives ? &theirs : nullptr, sizeof me, check))
      detail::throw_timeout("tcp", rank_, size_, what, (long long)total_bytes, timeout_);
  }

  void say(const std::string& line) const {
    if (log_)
      log_(label_ + ": " + line);
    else
      std::fprintf(stderr, "kiln: %s: %s\n", label_.c_str(), line.c_str());
  }
  // Logs a connection that was not admitted and closes it; the listener goes on.
  void refuse(Socket& s, const char* where, const std::string& why) const {
    const auto [ip, p] = endpoint(s.fd, false);
    say("refused a connection from " + ip + ":" + std::to_string(p) + " to " + where + ": " + why);
    s = Socket();
  }

  int rank_, size_;
  std::chrono::seconds timeout_;
  std::string secret_;
  std::function<void(const std::string&)> log_;
  std::string label_;
  Socket next_, prev_;
  uint64_t seq_ = 0;           // collectives begun (on the communication thread only)
  detail::CommThread thread_;  // last member: started after, stopped before the rest
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(const DistEnv& env, std::chrono::seconds timeout) {
  return std::make_unique<TcpCommunicator>(env, timeout);
}

}  // namespace kiln::dist
