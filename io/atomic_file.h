// Files that appear complete or not at all: bytes go to "<path>.tmp.<pid>" in the same directory,
// which is fsynced, renamed over `path`, and the directory fsynced. A failure (a full disk, say)
// removes the temporary file and leaves whatever was at `path` untouched.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::io {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);                 // appends
  void write_at(uint64_t offset, const void* data, size_t n);  // overwrites bytes already written
  uint64_t size() const { return written_; }
  void commit();  // fsync, rename into place, fsync the directory
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

// The whole of `text` as `path`, atomically.
void write_file_atomic(const std::string& path, const std::string& text);
// Appends the whole of `text` to `fd` (an O_APPEND log), or nothing: a write cut short (a full disk) is
// cut back to the size before it, so the file keeps whole records. 0, or the errno of the failure.
int append_whole(int fd, const std::string& text);
// fsync of the directory holding `path` (best effort: some file systems refuse it).
void fsync_parent_dir(const std::string& path);

}  // namespace kiln::io
