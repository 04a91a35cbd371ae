// The TCP communicator's handshake: SHA-256 and HMAC against published answers, and strangers at
// the rendezvous and ring ports of a 2-rank job (its ranks as threads of this process): garbage, a
// forged hello without the secret, a connection that says nothing, and a rank with the wrong
// secret. Each is refused and logged, and the job's all-reduce still gives the right sum.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "base/sha256.h"
#include "engine/dist.h"
#include "kiln.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;
using kiln::testing::free_port;

namespace {

std::string hex(const Digest256& d) {
  std::string s;
  char b[3];
  for (uint8_t x : d) std::snprintf(b, sizeof b, "%02x", x), s += b;
  return s;
}

// A connection to 127.0.0.1:port that sends `bytes` and stays open until the test ends.
int stranger(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  if (!bytes.empty()) REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size()));
  return fd;
}

// A hello as a Kiln rank sends it (magic, rank, world, port, nonce), then a MAC made up without the secret.
std::string forged_hello(const char* magic, int32_t rank, int32_t world) {
  std::string h(magic, 8);
  for (int32_t v : {rank, world, int32_t(0)}) h.append(reinterpret_cast<const char*>(&v), 4);
  h.append(16, '\x07');  // nonce
  h.append(32, '\x42');  // the "proof"
  return h;
}

struct Log {
  std::mutex m;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& l) {
      std::lock_guard<std::mutex> lk(m);
      lines.push_back(l);
    };
  }
  int count(const std::string& part) {
    std::lock_guard<std::mutex> lk(m);
    int n = 0;
    for (const auto& l : lines) n += l.find(part) != std::string::npos;
    return n;
  }
};

dist::DistEnv rank_env(int rank, int port, const std::string& secret, Log& log) {
  dist::DistEnv e;
  e.rank = e.local_rank = rank;
  e.world_size = e.local_world_size = 2;
  e.local_world_size_given = true;
  e.master_addr = "localhost";
  e.master_port = port;
  e.launcher = "torchrun";
  e.secret = secret;
  e.log = log.sink();
  return e;
}

}  // namespace

TEST_CASE("sha256 and hmac-sha256: published answers") {
  CHECK(hex(sha256("abc", 3)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(sha256("", 0)) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  // two blocks once padded
  CHECK(hex(sha256(two.data(), two.size())) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // RFC 4231, test cases 1, 2 and 6 (a key longer than a block).
  CHECK(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There", 8)) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  const std::string q = "what do ya want for nothing?";
  CHECK(hex(hmac_sha256("Jefe", q.data(), q.size())) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  const std::string m = "Test Using Larger Than Block-Size Key - Hash Key First";
  CHECK(hex(hmac_sha256(std::string(131, '\xaa'), m.data(), m.size())) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  Digest256 a{}, b{};
  CHECK(digest_equal(a, b));
  b[31] = 1;
  CHECK_FALSE(digest_equal(a, b));
}

TEST_CASE("tcp: strangers at the rendezvous and ring ports are refused and logged; the job runs unchanged") {
  const int port = free_port();
  Log log;
  std::vector<int> fds;
  std::mutex fds_m;
  auto keep = [&](int fd) {
    std::lock_guard<std::mutex> lk(fds_m);
    fds.push_back(fd);
  };
  std::promise<void> rendezvous_up;
  dist::DistEnv e0 = rank_env(0, port, "the job's secret", log), e1 = rank_env(1, port, "the job's secret", log);
  std::string bound;
  // Before rank 0 accepts anyone: garbage, a forged hello, and one that says nothing, in that order.
  e0.on_listen = [&](const char* what, const std::string& addr, int p) {
    if (std::string(what) != "rendezvous") return;
    bound = addr;
    keep(stranger(p, std::string(64, 'G')));
    keep(stranger(p, forged_hello("KILNRDV3", 1, 2)));
    keep(stranger(p, ""));
    keep(stranger(p, forged_hello("KILNRDV2", 1, 2)));  // a rank of the Kiln before the step headers
    rendezvous_up.set_value();
  };
  // Before rank 1's ring listener is known to rank 0: garbage and a forged ring hello claiming rank 0.
  e1.on_listen = [&](const char* what, const std::string&, int p) {
    if (std::string(what) != "ring") return;
    keep(stranger(p, "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(40, ' ')));
    keep(stranger(p, forged_hello("KILNRNG3", 0, 2)));
  };
  auto run_rank = [](dist::DistEnv env) {
    auto comm = dist::make_cpu_communicator(env, std::chrono::seconds(60));
    Tensor t = full({1000}, double(env.rank + 1));
    comm->all_reduce(t, dist::ReduceOp::sum);
    return t.to_vector();
  };
  auto r0 = std::async(std::launch::async, run_rank, e0);
  rendezvous_up.get_future().wait();
  auto r1 = std::async(std::launch::async, run_rank, e1);
  CHECK(r0.get() == std::vector<double>(1000, 3.0));
  CHECK(r1.get() == std::vector<double>(1000, 3.0));
  for (int fd : fds) ::close(fd);
  CHECK(bound == "127.0.0.1");  // a single-machine job listens on loopback only
  for (const auto& l : log.lines) MESSAGE(l);
  CHECK(log.count("refused a connection") == 6);
  CHECK(log.count("to the rendezvous port: it is a Kiln rank of another version (handshake version 2, this one 3)") ==
        1);
  CHECK(log.count("to the rendezvous port: it sent bytes that are not a Kiln handshake") == 1);
  CHECK(log.count("to the rendezvous port: it does not know the job's secret (KILN_DIST_SECRET)") == 1);
  CHECK(log.count("to the rendezvous port: it sent no Kiln handshake within 5 s") == 1);
  CHECK(log.count("rank 1 of 2 (tcp): refused a connection from 127.0.0.1:") == 2);
  CHECK(log.count("to the ring port: it sent bytes that are not a Kiln handshake") == 1);
  CHECK(log.count("to the ring port: it does not know the job's secret") == 1);
  CHECK(log.count("KILN_DIST_SECRET is not set") == 0);
}

TEST_CASE("tcp: a rank with the wrong secret is refused; it fails naming KILN_DIST_SECRET, the job times out") {
  const int port = free_port();
  Log log;
  auto start = [](dist::DistEnv env) { dist::make_cpu_communicator(env, std::chrono::seconds(3)); };
  auto r0 = std::async(std::launch::async, start, rank_env(0, port, "right", log));
  auto r1 = std::async(std::launch::async, start, rank_env(1, port, "wrong", log));
  CHECK_THROWS_WITH_AS(r1.get(), doctest::Contains("does not know this job's secret: KILN_DIST_SECRET differs"), Error);
  CHECK_THROWS_WITH_AS(r0.get(),
                       doctest::Contains("no connection from the other ranks (1 of 2 joined; missing rank(s) 1) "
                                         "within --dist-timeout (3 s)"),
                       Error);
  CHECK(log.count("rank 0 of 2 (tcp): refused a connection from 127.0.0.1:") >= 1);
  // The wrong rank saw rank 0's proof fail and hung up before giving its own.
  CHECK(log.count("to the rendezvous port: it closed the connection during the handshake") >= 1);
}

TEST_CASE("tcp: a rank that finds no rank 0 names the wait it gave up after and its flag") {
  const int port = free_port();  // nobody listens there
  Log log;
  const std::string want =
      "could not connect to rank 0 (MASTER_ADDR:MASTER_PORT) at 127.0.0.1:" + std::to_string(port) +
      " within --dist-timeout (1 s; is it running?)";
  CHECK_THROWS_WITH_AS(dist::make_cpu_communicator(rank_env(1, port, "s", log), std::chrono::seconds(1)),
                       doctest::Contains(want.c_str()), Error);
}

TEST_CASE("tcp: a rank waiting for rank 0 says so while it waits, not only when --dist-timeout ends") {
  // Rank 0 refusing to start (its --out holds a run) left a rank on another machine silent for the
  // whole --dist-timeout (600 s by default).
  const int port = free_port();  // nobody listens there
  Log log;
  CHECK_THROWS_AS(dist::make_cpu_communicator(rank_env(1, port, "s", log), std::chrono::seconds(7)), Error);
  const std::string want =
      "rank 1 of 2 (tcp): waiting for rank 0 (MASTER_ADDR:MASTER_PORT) at 127.0.0.1:" + std::to_string(port) +
      ": 5 s of 7 s (--dist-timeout; is it running?)";
  CHECK(log.count(want) == 1);
}

TEST_CASE("tcp: rank 0 waiting for a rank that never came says so, and the ranks that joined learn why it gave up") {
  // Ranks 0 and 1 of 3 were silent for the whole --dist-timeout; rank 1 then said only "rendezvous:
  // the peer closed its connection".
  const int port = free_port();
  Log log;
  auto env = [&](int rank) {
    dist::DistEnv e = rank_env(rank, port, "s", log);
    e.world_size = e.local_world_size = 3;
    return e;
  };
  auto start = [](dist::DistEnv e) { dist::make_cpu_communicator(e, std::chrono::seconds(7)); };
  auto r0 = std::async(std::launch::async, start, env(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 0 gives up first, as when it started first
  auto r1 = std::async(std::launch::async, start, env(1));
  CHECK_THROWS_WITH_AS(r0.get(),
                       doctest::Contains("no connection from the other ranks (2 of 3 joined; missing rank(s) 2) "
                                         "within --dist-timeout (7 s)"),
                       Error);
  CHECK_THROWS_WITH_AS(
      r1.get(),
      doctest::Contains("rendezvous: rank 0 gave up waiting for rank(s) 2 to join within --dist-timeout (7 s)"), Error);
  for (const auto& l : log.lines) MESSAGE(l);
  CHECK(log.count("rank 0 of 3 (tcp): waiting for rank(s) 2 to join: 5 s of 7 s (--dist-timeout)") == 1);
  CHECK(log.count("rank 1 of 3 (tcp): waiting for the other ranks to join (rank 0 sends the address table when all 3 "
                  "have): 5 s of 7 s (--dist-timeout)") == 1);
}

TEST_CASE("tcp: --dist-timeout holds against a rank 0 address that drops the connection attempts") {
  // A blocking connect to a host that drops packets took ~127 s (the kernel's SYN retries): the wait
  // overran --dist-timeout and its notes came ~127 s apart. A listener whose queue is full (backlog 0,
  // one connection never accepted) drops SYNs the same way.
  const int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(l, 0) == 0);
  socklen_t len = sizeof a;
  ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const int held = stranger(port, "");  // fills the queue
  Log log;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(dist::make_cpu_communicator(rank_env(1, port, "s", log), std::chrono::seconds(7)),
                       doctest::Contains("within --dist-timeout (7 s; is it running?)"), Error);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(held);
  ::close(l);
  CHECK(took < 8.5);
  CHECK(log.count("rank 1 of 2 (tcp): waiting for rank 0 (MASTER_ADDR:MASTER_PORT) at 127.0.0.1:" +
                  std::to_string(port) + ": 5 s of 7 s (--dist-timeout; is it running?)") == 1);
}

namespace {

// A listening socket on 127.0.0.1 (port 0: any); its port in *got.
int listen_on(int port, int* got) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 4) == 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *got = ntohs(a.sin_port);
  return fd;
}

}  // namespace

// A rank that joins the rendezvous but never connects to the ring: the rank after it gives up
// accepting, naming the wait and its flag as the connect timeout does (it said only "before the
// timeout"). Rank 0 is played here: it answers rank 1's handshake with the secret, hands it the
// address table, and its own ring port listens but never answers.
TEST_CASE("tcp: a ring neighbour that never connects: the wait names --dist-timeout and its seconds") {
  const int port = free_port();
  Log log;
  int rendezvous_port = 0, ring_port = 0;
  const int rendezvous = listen_on(port, &rendezvous_port), ring = listen_on(0, &ring_port);
  const std::string secret = "the job's secret";
  auto r1 = std::async(std::launch::async,
                       [&] { dist::make_cpu_communicator(rank_env(1, port, secret, log), std::chrono::seconds(5)); });
  const int c = ::accept(rendezvous, nullptr, nullptr);
  REQUIRE(c >= 0);
  // The handshake as rank 0 answers it (engine/dist_tcp.cpp): hello (magic, rank, world, port,
  // nonce), challenge (nonce, HMAC(secret, "server" | hello | nonce)), the rank's proof, a verdict.
  char hello[36];
  REQUIRE(::recv(c, hello, sizeof hello, MSG_WAITALL) == ssize_t(sizeof hello));
  CHECK(std::string(hello, 8) == "KILNRDV3");
  int32_t rank1_port = 0;
  std::memcpy(&rank1_port, hello + 16, 4);
  uint8_t challenge[48] = {};
  std::string msg = "server" + std::string(hello, sizeof hello) + std::string(16, '\0');
  const Digest256 mac = hmac_sha256(secret, msg.data(), msg.size());
  std::memcpy(challenge + 16, mac.data(), mac.size());
  REQUIRE(::send(c, challenge, sizeof challenge, MSG_NOSIGNAL) == ssize_t(sizeof challenge));
  char proof[32];
  REQUIRE(::recv(c, proof, sizeof proof, MSG_WAITALL) == ssize_t(sizeof proof));
  const std::string table =
      "127.0.0.1 " + std::to_string(ring_port) + "\n127.0.0.1 " + std::to_string(rank1_port) + "\n";
  const int32_t verdict = 0, len = int32_t(table.size());
  std::string reply(reinterpret_cast<const char*>(&verdict), 4);
  reply += std::string(reinterpret_cast<const char*>(&len), 4) + table;
  REQUIRE(::send(c, reply.data(), reply.size(), MSG_NOSIGNAL) == ssize_t(reply.size()));
  CHECK_THROWS_WITH_AS(r1.get(), doctest::Contains("no connection from rank 0 within --dist-timeout (5 s)"), Error);
  for (int fd : {c, rendezvous, ring}) ::close(fd);
}

TEST_CASE("tcp: a refused rank is told why; a WORLD_SIZE that differs fails rank 0 at once, not at the timeout") {
  const int port = free_port();
  Log log;
  auto start = [](dist::DistEnv env) { dist::make_cpu_communicator(env, std::chrono::seconds(60)); };
  dist::DistEnv e1 = rank_env(1, port, "s", log);
  e1.world_size = 3;
  auto r0 = std::async(std::launch::async, start, rank_env(0, port, "s", log));
  auto r1 = std::async(std::launch::async, start, e1);
  // Both name the cause; rank 1 saw only a closed connection, rank 0 waited the 60 s.
  CHECK_THROWS_WITH_AS(r1.get(),
                       doctest::Contains("refused this rank: it was started as rank 1 of 3 (WORLD_SIZE=3), this "
                                         "job has 2 ranks: every rank needs the same WORLD_SIZE"),
                       Error);
  CHECK_THROWS_WITH_AS(r0.get(),
                       doctest::Contains("rank 0 of 2 (tcp): a rank at 127.0.0.1 that knows this job's "
                                         "KILN_DIST_SECRET joined, but it was started as rank 1 of 3"),
                       Error);
  CHECK(log.count("refused a connection from 127.0.0.1:") == 1);
}

TEST_CASE("tcp: when a rank of another WORLD_SIZE makes rank 0 give up, the ranks that joined are told why") {
  // Rank 1 had joined and waited for the address table; rank 0 failed on rank 2's WORLD_SIZE and rank 1
  // said only "rank 0 ... closed its connection", not why (the timeout's give-up told it).
  const int port = free_port();
  Log log;
  auto start = [](dist::DistEnv env) { dist::make_cpu_communicator(env, std::chrono::seconds(60)); };
  dist::DistEnv e0 = rank_env(0, port, "s", log), e1 = rank_env(1, port, "s", log), e2 = rank_env(2, port, "s", log);
  e0.world_size = e0.local_world_size = e1.world_size = e1.local_world_size = 3;
  e2.world_size = e2.local_world_size = 4;
  // Rank 2 connects once rank 0 has admitted rank 1 (told by rank 0 itself, not guessed with a sleep).
  std::promise<void> joined;
  e0.on_join = [&joined](int rank) {
    if (rank == 1) joined.set_value();
  };
  auto r0 = std::async(std::launch::async, start, e0);
  auto r1 = std::async(std::launch::async, start, e1);
  REQUIRE(joined.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  auto r2 = std::async(std::launch::async, start, e2);
  CHECK_THROWS_WITH_AS(r2.get(), doctest::Contains("refused this rank: it was started as rank 2 of 4"), Error);
  CHECK_THROWS_WITH_AS(r0.get(), doctest::Contains("joined, but it was started as rank 2 of 4"), Error);
  CHECK_THROWS_WITH_AS(r1.get(),
                       doctest::Contains("rendezvous: rank 0 gave up: a rank at 127.0.0.1 that knows this job's "
                                         "KILN_DIST_SECRET joined, but it was started as rank 2 of 4 (WORLD_SIZE=4), "
                                         "this job has 3 ranks"),
                       Error);
}

TEST_CASE("tcp: without a secret the handshake still runs, and rank 0 says the job is open") {
  const int port = free_port();
  Log log;
  auto run_rank = [](dist::DistEnv env) {
    auto comm = dist::make_cpu_communicator(env, std::chrono::seconds(60));
    Tensor t = full({3}, double(env.rank));
    comm->all_reduce(t, dist::ReduceOp::max);
    return t.to_vector();
  };
  auto r0 = std::async(std::launch::async, run_rank, rank_env(0, port, "", log));
  auto r1 = std::async(std::launch::async, run_rank, rank_env(1, port, "", log));
  CHECK(r0.get() == std::vector<double>(3, 1.0));
  CHECK(r1.get() == std::vector<double>(3, 1.0));
  CHECK(log.count("rank 0 of 2 (tcp): KILN_DIST_SECRET is not set") == 1);
}

TEST_CASE("dist env: a launcher's variables half set are an error, not a job of one") {
  auto env = [](std::map<std::string, std::string> vars) {
    return [vars = std::move(vars)](const char* n) -> const char* {
      auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  // RANK without WORLD_SIZE trained alone while rank 0 waited for it.
  CHECK(contains(error_of([&] {
                   dist::DistEnv::from_variables(env({{"RANK", "1"}, {"MASTER_PORT", "29500"}}));
                 }),
                 "the environment sets RANK=1 but not WORLD_SIZE"));
  // WORLD_SIZE without RANK became rank 0, a second rank 0.
  CHECK(contains(error_of([&] {
                   dist::DistEnv::from_variables(env({{"WORLD_SIZE", "2"}}));
                 }),
                 "the torchrun environment sets WORLD_SIZE=2 but not RANK"));
  const dist::DistEnv ok = dist::DistEnv::from_variables(
      env({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}}));
  CHECK(ok.rank == 1);
  CHECK(ok.world_size == 2);
  CHECK(dist::DistEnv::from_variables(env({{"WORLD_SIZE", "1"}})).world_size == 1);  // a job of one needs no RANK
  CHECK(dist::DistEnv::from_variables(env({})).launcher == "none");
}

TEST_CASE("dist env: a MASTER_PORT outside 1..65535 is refused naming it, not wrapped or read as unset") {
  auto env = [](const std::string& port) {
    return [port](const char* n) -> const char* {
      const std::string name = n;
      return name == "WORLD_SIZE"    ? "2"
             : name == "RANK"        ? "1"
             : name == "MASTER_ADDR" ? "127.0.0.1"
             : name == "MASTER_PORT" ? port.c_str()
                                     : nullptr;
    };
  };
  // 95536 listened on 30000 (the port modulo 65536), 70000 on a connecting rank waited out --dist-timeout
  // for a port nobody could listen on, and 0 said MASTER_PORT "must be set".
  for (const std::string port : {"95536", "70000", "65536", "0"}) {
    CAPTURE(port);
    CHECK(contains(error_of([&] { dist::DistEnv::from_variables(env(port)); }),
                   "environment variable MASTER_PORT='" + port + "' is not a TCP port: expected 1..65535"));
  }
  CHECK(dist::DistEnv::from_variables(env("65535")).master_port == 65535);
  CHECK(dist::DistEnv::from_variables(env("1")).master_port == 1);
}

// Ranks gone out of step (another size, or another reduce op, on each: ranks given other data) stop
// with both sides' collective named; before, the ring read the other side's bytes as its own data
// (garbage sums, or a wait for bytes that never came until --dist-timeout).
TEST_CASE("tcp: ranks whose collectives differ stop naming both sides' op and element count") {
  struct Want {
    int64_t n0, n1;
    dist::ReduceOp op1;
    std::string here0, there0;  // rank 0's own and rank 1's collective, as rank 0 names them
  };
  for (const Want& w : {Want{24, 40, dist::ReduceOp::sum, "all_reduce (sum) of 24 f32 elements, collective 2",
                             "all_reduce (sum) of 40 f32 elements, collective 2"},
                        Want{8, 8, dist::ReduceOp::max, "all_reduce (sum) of 8 f32 elements, collective 2",
                             "all_reduce (max) of 8 f32 elements, collective 2"}}) {
    CAPTURE(w.there0);
    const int port = free_port();
    Log log;
    auto run_rank = [&w](dist::DistEnv env) {
      auto comm = dist::make_cpu_communicator(env, std::chrono::seconds(5));
      Tensor same = full({6}, 1.0);
      comm->all_reduce(same, dist::ReduceOp::sum);  // in step: the sum of both
      CHECK(same.to_vector() == std::vector<double>(6, 2.0));
      Tensor t = full({env.rank == 0 ? w.n0 : w.n1}, 1.0);
      return error_of([&] { comm->all_reduce(t, env.rank == 0 ? dist::ReduceOp::sum : w.op1); });
    };
    auto r0 = std::async(std::launch::async, run_rank, rank_env(0, port, "s", log));
    auto r1 = std::async(std::launch::async, run_rank, rank_env(1, port, "s", log));
    const std::string e0 = r0.get(), e1 = r1.get();
    CHECK_MESSAGE(contains(e0, "rank 0 of 2 (tcp): " + w.here0 + " here, but rank 1 (the previous in the ring) sent " +
                                   w.there0 + ": the ranks went out of step"),
                  e0);
    CHECK_MESSAGE(contains(e1, "rank 1 of 2 (tcp): " + w.there0 + " here, but rank 0 (the previous in the ring) sent " +
                                   w.here0 + ": the ranks went out of step"),
                  e1);
  }
}

// Zero-size collectives complete at once, also when an empty tensor's data pointer is null on one
// rank (a fresh empty tensor) and not on the other (an empty view of real storage). Before, a step
// sent its header only for a non-null pointer and awaited one for any receive buffer: a zero-size
// all_reduce stalled until --dist-timeout and left the communicator broken.
TEST_CASE("tcp: zero-size collectives complete on every rank and the communicator goes on") {
  const int port = free_port();
  Log log;
  auto run_rank = [](dist::DistEnv env) {
    return error_of([&] {
      auto comm = dist::make_cpu_communicator(env, std::chrono::seconds(5));
      Tensor storage = full({8}, 1.0);
      // Rank 0: fresh empty tensors; rank 1: empty views into storage.
      auto empty = [&](int64_t n) { return env.rank == 0 ? zeros({n}) : storage.narrow(0, 0, n); };
      Tensor a = empty(0);
      comm->all_reduce(a, dist::ReduceOp::sum);
      comm->broadcast(empty(0), 0);
      comm->broadcast(empty(0), 1);
      comm->all_gather(empty(0), empty(0));
      comm->reduce_scatter(empty(0), empty(0), dist::ReduceOp::sum);
      comm->all_reduce_async(empty(0), dist::ReduceOp::avg)->wait();
      Tensor one = full({3}, 1.0);
      comm->all_reduce(one, dist::ReduceOp::sum);
      CHECK(one.to_vector() == std::vector<double>(3, 2.0));
    });
  };
  auto r0 = std::async(std::launch::async, run_rank, rank_env(0, port, "s", log));
  auto r1 = std::async(std::launch::async, run_rank, rank_env(1, port, "s", log));
  const std::string e0 = r0.get(), e1 = r1.get();
  CHECK_MESSAGE(e0 == "NO ERROR", e0);
  CHECK_MESSAGE(e1 == "NO ERROR", e1);
}
