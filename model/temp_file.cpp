#include "model/temp_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ingero {

int open_unnamed_file(const std::string& dir, std::string& error) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  const int tmpfile_errno = errno;
  if (tmpfile_errno == ENOENT || tmpfile_errno == ENOTDIR || tmpfile_errno == EACCES || tmpfile_errno == EROFS) {
    error = dir + ": cannot create the spill file (" + std::strerror(tmpfile_errno) + ")";
    return -1;
  }
  std::string name = dir + "/.ingero-spool-XXXXXX";
  fd = ::mkstemp(name.data());
  if (fd < 0) {
    error = dir + ": cannot create the spill file (" + std::strerror(errno) + ")";
    return -1;
  }
  ::unlink(name.c_str());
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
}

bool pwrite_all(int fd, const void* data, size_t n, uint64_t off, int& err) {
  const auto* p = static_cast<const char*>(data);
  while (n) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      err = errno;
      return false;
    }
    if (w == 0) {
      err = ENOSPC;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return true;
}

bool pread_all(int fd, void* out, size_t n, uint64_t off, int& err) {
  auto* p = static_cast<char*>(out);
  while (n) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      err = errno;
      return false;
    }
    if (r == 0) {
      err = EIO;  // shorter than what was written: someone truncated it
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return true;
}

}  // namespace ingero
