// The TCP communicator for CPU ranks started by `kiln launch` or torchrun (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT; no MPI runtime). Rendezvous: rank 0 listens on MASTER_PORT, every other
// rank connects and tells it the port of its own listener, rank 0 sends back everyone's address and
// port; then each rank connects to the next one, forming a ring. Collectives are ring algorithms:
// all-reduce = reduce-scatter + all-gather (each chunk is reduced once, in one order, then copied,
// so every rank ends with identical bits), each step sending to the next rank while receiving from
// the previous one. A step that stalls past the timeout, or a peer that disconnects, throws
// CollectiveError naming the collective and the rank.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/dist.h"
#include "engine/dist_internal.h"
#include "base/error.h"
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

Socket listener(int port, int backlog) {
  Socket s(::socket(AF_INET, SOCK_STREAM, 0));
  KILN_CHECK(s.fd >= 0, "socket(): ", std::strerror(errno));
  const int one = 1;
  ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(uint16_t(port));
  KILN_CHECK(::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0, "cannot listen on port ", port, ": ",
             std::strerror(errno), port ? " (MASTER_PORT is taken: pick another with --master-port)" : "");
  KILN_CHECK(::listen(s.fd, backlog) == 0, "listen(): ", std::strerror(errno));
  return s;
}

int local_port(const Socket& s) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(s.fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

void tune(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Connects to host:port, retrying until the deadline (the peer may not be listening yet).
Socket connect_to(const std::string& host, int port, Clock::time_point deadline, const std::string& who) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  KILN_CHECK(rc == 0 && res, "cannot resolve ", who, " address '", host, "': ", ::gai_strerror(rc));
  for (;;) {
    Socket s(::socket(AF_INET, SOCK_STREAM, 0));
    if (s.fd >= 0 && ::connect(s.fd, res->ai_addr, res->ai_addrlen) == 0) {
      ::freeaddrinfo(res);
      tune(s.fd);
      return s;
    }
    if (Clock::now() > deadline) {
      ::freeaddrinfo(res);
      KILN_FAIL("could not connect to ", who, " at ", host, ":", port, " before the timeout (is it running?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Socket accept_from(const Socket& l, Clock::time_point deadline, const std::string& who) {
  for (;;) {
    pollfd p{l.fd, POLLIN, 0};
    const int k = ::poll(&p, 1, 200);
    if (k > 0) {
      Socket s(::accept(l.fd, nullptr, nullptr));
      if (s.fd >= 0) {
        tune(s.fd);
        return s;
      }
    }
    if (Clock::now() > deadline) KILN_FAIL("no connection from ", who, " before the timeout");
  }
}

// Sends sn bytes on `out` while receiving rn bytes on `in`, until both are done. false: timed out.
// A peer that closed its end throws CollectiveError (it has exited).
bool exchange(int out, const void* sp, size_t sn, int in, void* rp, size_t rn, Clock::time_point deadline,
              const std::string& what) {
  size_t so = 0, ro = 0;
  const char* s = static_cast<const char*>(sp);
  char* r = static_cast<char*>(rp);
  while (so < sn || ro < rn) {
    pollfd p[2];
    int np = 0, io = -1, ii = -1;
    if (so < sn) io = np, p[np++] = {out, POLLOUT, 0};
    if (ro < rn) ii = np, p[np++] = {in, POLLIN, 0};
    const int k = ::poll(p, nfds_t(np), 200);
    if (k < 0 && errno != EINTR) broken(what + ": poll: " + std::strerror(errno));
    if (k <= 0) {
      if (Clock::now() > deadline) return false;
      continue;
    }
    if (io >= 0 && (p[io].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t n = ::send(out, s + so, sn - so, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) so += size_t(n);
      else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        broken(what + ": the next rank in the ring is gone (" + std::strerror(errno) + ")");
    }
    if (ii >= 0 && (p[ii].revents & (POLLIN | POLLERR | POLLHUP))) {
      const ssize_t n = ::recv(in, r + ro, rn - ro, MSG_DONTWAIT);
      if (n > 0) ro += size_t(n);
      else if (n == 0) broken(what + ": the previous rank in the ring closed its connection (it has exited)");
      else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        broken(what + ": receiving from the previous rank: " + std::strerror(errno));
    }
  }
  return true;
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
    case DType::u8: case DType::boolean:
      return reduce_into(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, op);
    default: KILN_FAIL("TCP collectives reduce f32, f64, i32, i64, u8 or bool, got ", t);
  }
}

class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(const DistEnv& env, std::chrono::seconds timeout)
      : rank_(env.rank), size_(env.world_size), timeout_(timeout) {
    KILN_CHECK(!env.master_addr.empty() && env.master_port > 0, "rank ", rank_, " of ", size_,
               ": MASTER_ADDR and MASTER_PORT must be set (kiln launch sets them)");
    const auto deadline = Clock::now() + timeout_;
    Socket ring = listener(0, 4);
    const int my_port = local_port(ring);
    std::vector<std::string> addr(static_cast<size_t>(size_));
    std::vector<int32_t> port(static_cast<size_t>(size_));
    // ---- rendezvous through rank 0 ----
    if (rank_ == 0) {
      Socket l = listener(env.master_port, size_);
      std::vector<Socket> peers(static_cast<size_t>(size_));
      addr[0] = env.master_addr;
      port[0] = my_port;
      for (int k = 1; k < size_; ++k) {
        Socket s = accept_from(l, deadline, "the other ranks");
        int32_t hello[2];
        KILN_CHECK(exchange(s.fd, nullptr, 0, s.fd, hello, sizeof hello, deadline, "rendezvous"),
                   "rendezvous: a rank connected but said nothing");
        KILN_CHECK(hello[0] > 0 && hello[0] < size_ && peers[size_t(hello[0])].fd < 0, "rendezvous: unexpected rank ",
                   hello[0], " (two launches on one MASTER_PORT?)");
        sockaddr_in a{};
        socklen_t len = sizeof a;
        ::getpeername(s.fd, reinterpret_cast<sockaddr*>(&a), &len);
        char ip[INET_ADDRSTRLEN] = {};
        ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
        addr[size_t(hello[0])] = ip;
        port[size_t(hello[0])] = hello[1];
        peers[size_t(hello[0])] = std::move(s);
      }
      std::string table;
      for (int k = 0; k < size_; ++k) table += addr[size_t(k)] + " " + std::to_string(port[size_t(k)]) + "\n";
      const int32_t len = int32_t(table.size());
      for (int k = 1; k < size_; ++k) {
        exchange(peers[size_t(k)].fd, &len, sizeof len, -1, nullptr, 0, deadline, "rendezvous");
        exchange(peers[size_t(k)].fd, table.data(), table.size(), -1, nullptr, 0, deadline, "rendezvous");
      }
    } else {
      Socket s = connect_to(env.master_addr, env.master_port, deadline, "rank 0 (MASTER_ADDR:MASTER_PORT)");
      const int32_t hello[2] = {rank_, my_port};
      int32_t len = 0;
      exchange(s.fd, hello, sizeof hello, -1, nullptr, 0, deadline, "rendezvous");
      KILN_CHECK(exchange(-1, nullptr, 0, s.fd, &len, sizeof len, deadline, "rendezvous") && len > 0 && len < (1 << 24),
                 "rendezvous: no address table from rank 0");
      std::string table(size_t(len), '\0');
      exchange(-1, nullptr, 0, s.fd, table.data(), table.size(), deadline, "rendezvous");
      std::istringstream in(table);
      for (int k = 0; k < size_; ++k) in >> addr[size_t(k)] >> port[size_t(k)];
    }
    // ---- the ring: connect to the next rank, accept the previous one ----
    const int next = (rank_ + 1) % size_;
    next_ = connect_to(addr[size_t(next)], port[size_t(next)], deadline, "rank " + std::to_string(next));
    prev_ = accept_from(ring, deadline, "rank " + std::to_string((rank_ + size_ - 1) % size_));
  }

  ~TcpCommunicator() override { thread_.stop(); }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  const char* backend() const override { return "tcp"; }

  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    detail::check_tensor(t, "all_reduce");
    return thread_.submit([this, t, op] {
      const bool low = is_low_precision(t.dtype());
      Tensor buf = low ? t.to(DType::f32) : t;
      const int64_t n = buf.numel(), es = int64_t(dtype_size(buf.dtype()));
      char* base = static_cast<char*>(buf.raw_data());
      auto off = [&](int c) { return n * c / size_; };  // chunk c: [off(c), off(c+1))
      std::vector<char> tmp(size_t((n / size_ + 1) * es));
      // Reduce-scatter: after size-1 steps rank r holds chunk r reduced over all ranks.
      for (int s = 0; s < size_ - 1; ++s) {
        const int sc = mod(rank_ - s - 1), rc = mod(rank_ - s - 2);
        step("all_reduce", base + off(sc) * es, (off(sc + 1) - off(sc)) * es, tmp.data(), (off(rc + 1) - off(rc)) * es,
             n * es);
        reduce_bytes(buf.dtype(), base + off(rc) * es, tmp.data(), off(rc + 1) - off(rc), op);
      }
      // All-gather of the reduced chunks.
      for (int s = 0; s < size_ - 1; ++s) {
        const int sc = mod(rank_ - s), rc = mod(rank_ - s - 1);
        step("all_reduce", base + off(sc) * es, (off(sc + 1) - off(sc)) * es, base + off(rc) * es,
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
    thread_.submit([this, t, root] {
      const size_t bytes = size_t(t.numel()) * dtype_size(t.dtype());
      // Along the ring from the root; the rank before the root does not forward.
      if (rank_ != root) step("broadcast", nullptr, 0, t.raw_data(), int64_t(bytes), int64_t(bytes));
      if (mod(rank_ + 1) != root) step("broadcast", t.raw_data(), int64_t(bytes), nullptr, 0, int64_t(bytes));
    })->wait();
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    detail::check_blocks("all_gather", out, in, size_);
    thread_.submit([this, in, out] {
      const int64_t b = in.numel() * int64_t(dtype_size(in.dtype()));
      char* base = static_cast<char*>(out.raw_data());
      std::memcpy(base + rank_ * b, in.raw_data(), size_t(b));
      for (int s = 0; s < size_ - 1; ++s)
        step("all_gather", base + mod(rank_ - s) * b, b, base + mod(rank_ - s - 1) * b, b, b * size_);
    })->wait();
  }

  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    detail::check_blocks("reduce_scatter", in, out, size_);
    thread_.submit([this, in, out, op] {
      Tensor work = in.clone();
      const int64_t n = out.numel(), b = n * int64_t(dtype_size(in.dtype()));
      char* base = static_cast<char*>(work.raw_data());
      std::vector<char> tmp(static_cast<size_t>(b));
      for (int s = 0; s < size_ - 1; ++s) {
        const int sc = mod(rank_ - s - 1), rc = mod(rank_ - s - 2);
        step("reduce_scatter", base + sc * b, b, tmp.data(), b, b * size_);
        reduce_bytes(in.dtype(), base + rc * b, tmp.data(), n, op);
      }
      std::memcpy(out.raw_data(), base + rank_ * b, size_t(b));
      NoGradGuard g;
      if (op == ReduceOp::avg) Tensor(out).mul_(1.0 / double(size_));
    })->wait();
  }

  void barrier() override {
    Tensor t = zeros({1});
    all_reduce(t, ReduceOp::sum);
  }

 private:
  int mod(int x) const { return ((x % size_) + size_) % size_; }

  // One ring step: send to the next rank while receiving from the previous one.
  void step(const char* what, const void* sp, int64_t sn, void* rp, int64_t rn, int64_t total_bytes) {
    const std::string label = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (tcp): " + what;
    if (!exchange(next_.fd, sp, size_t(sn), prev_.fd, rp, size_t(rn), Clock::now() + timeout_, label)) {
      detail::throw_timeout("tcp", rank_, size_, what, (long long)total_bytes, timeout_);
    }
  }

  int rank_, size_;
  std::chrono::seconds timeout_;
  Socket next_, prev_;
  detail::CommThread thread_;  // last member: started after, stopped before the rest
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(const DistEnv& env, std::chrono::seconds timeout) {
  return std::make_unique<TcpCommunicator>(env, timeout);
}

}  // namespace kiln::dist
