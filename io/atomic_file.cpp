// Atomic file replacement with POSIX calls, every failure named with the file and errno's text.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace kiln::io {

void fsync_parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  KILN_CHECK(!path_.empty(), "AtomicFile: the path is empty");
  tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666);
  KILN_CHECK(fd_ >= 0, path_, ": cannot create the temporary file ", tmp_, ": ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t r = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) errno = ENOSPC;
    KILN_CHECK(r > 0, path_, ": writing ", tmp_, " failed after ", written_, " bytes: ", std::strerror(errno));
    p += r;
    n -= size_t(r);
    written_ += uint64_t(r);
  }
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t n) {
  KILN_CHECK(offset + n <= written_, path_, ": write_at past the end of what was written");
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t r = ::pwrite(fd_, p, n, off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    KILN_CHECK(r > 0, path_, ": writing ", tmp_, " at offset ", offset, " failed: ", std::strerror(errno));
    p += r;
    n -= size_t(r);
    offset += uint64_t(r);
  }
}

void AtomicFile::commit() {
  KILN_CHECK(!committed_ && fd_ >= 0, path_, ": commit twice");
  KILN_CHECK(::fsync(fd_) == 0, path_, ": flushing ", tmp_, " to disk failed: ", std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  KILN_CHECK(::close(fd) == 0, path_, ": closing ", tmp_, " failed: ", std::strerror(errno));
  KILN_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, path_, ": cannot rename ", tmp_, " over it: ",
             std::strerror(errno));
  committed_ = true;
  fsync_parent_dir(path_);
}

int append_whole(int fd, const std::string& text) {
  struct stat st {};
  const off_t before = ::fstat(fd, &st) == 0 ? st.st_size : -1;
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      if (done > 0 && before >= 0) (void)!::ftruncate(fd, before);
      return err;
    }
    done += size_t(n);
  }
  return 0;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

}  // namespace kiln::io
