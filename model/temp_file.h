// Unnamed temporary files: the spill files of the spooling writer (sinks/store/spooling_writer.h) and of
// the chain annotator (operators/spill_file.h).
//
// Contract:
// - open_unnamed_file(dir, error): a read-write file in `dir` that never has a name (O_TMPFILE),
//   or, where the file system lacks O_TMPFILE, a mkstemp name unlinked at once: either way nothing
//   survives the process, even kill -9. -1 and `error` ("DIR: cannot create the spill file (why)")
//   on failure. Close-on-exec.
// - pwrite_all / pread_all: the whole range at `off`, retrying short transfers and EINTR; false
//   with `err` set (errno; EIO for a read past the end, ENOSPC for a write that made no progress).
// Plain POSIX, never throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ingero {

int open_unnamed_file(const std::string& dir, std::string& error);
bool pwrite_all(int fd, const void* data, size_t n, uint64_t off, int& err);
bool pread_all(int fd, void* out, size_t n, uint64_t off, int& err);

}  // namespace ingero
