// SpillFile: where a store keeps byte blocks it need not hold in memory. The chain annotator
// (operators/chain_annotate.h) keeps every GPU call and off-CPU span of its horizon so that a chain
// can be annotated when its window closes; on a trace whose window holds tens of millions of
// events that history is most of the process's memory. With a SpillFile, sealed blocks beyond a
// resident budget go to an unlinked temporary file and are read back (from the page cache, as a
// rule) when a query or an eviction reaches them. The answers are the same; only where the bytes
// live changes.
//
// Contract:
// - The store says how many bytes it holds in memory (add_resident(+/-)); while that is above the
//   budget (over_budget()), it may put() a block and drop its bytes. Budget 0 = never spill.
// - put() returns a Slot, or false when the file cannot take the block (no file could be created
//   in the directory, a write failed): the store then keeps the bytes. After the first failure
//   the file takes nothing more (counted in `errors`), so a full disk costs one failed write, not
//   one per block. Nothing put() accepted is ever lost: bytes still in the write buffer when its
//   flush fails stay in memory for good (counted in `stuck_bytes`).
// - get() reads a slot back; false (counted in `read_errors`) only on an I/O error of a file we
//   wrote, which the store must treat as the block's records missing.
// - release() makes a slot's space reusable (slots are sized in 64-byte units, and a later block
//   of the same size class takes a released slot), so a long live capture that keeps evicting
//   reuses the file rather than growing it: the file is bounded by the peak of bytes out, plus
//   the size-class rounding.
// - The file is created on the first put(), in $TMPDIR (else /tmp), already unlinked (O_TMPFILE,
//   else mkstemp + unlink; model/temp_file.h): nothing is left behind, however the process ends.
// - Single-threaded (the annotator sits behind its own lock). Never throws except std::bad_alloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace ingero {

struct SpillCounters {
  uint64_t blocks_out = 0;  // put() accepted, in all
  uint64_t bytes_out = 0;   // bytes in slots now (not released)
  uint64_t peak_bytes_out = 0;
  uint64_t file_bytes = 0;   // size of the file (slots in use and free)
  uint64_t reads = 0;        // get() calls
  uint64_t errors = 0;       // creation or write failures (the file then takes nothing more)
  uint64_t read_errors = 0;  // get() failed: an I/O error on our own file
  uint64_t stuck_bytes = 0;  // bytes of a failed flush, kept in memory
};

class SpillFile {
 public:
  struct Slot {
    uint64_t off = 0;
    uint32_t len = 0;  // bytes of the block
    uint32_t cap = 0;  // bytes reserved (len rounded up to kUnit); 0 = no slot
  };
  static constexpr uint32_t kUnit = 64;

  // `resident_budget`: bytes the store may hold in memory before it spills (0 = never).
  // `dir`: where the file goes; empty = $TMPDIR, else /tmp.
  explicit SpillFile(size_t resident_budget, std::string dir = {});
  // A resident budget set by the environment variable `name`, in MiB (0: never spill), or
  // `fallback` when it is unset, empty, or not a whole number of MiB up to 2^20 (1 TiB).
  static size_t budget_from_env(const char* name, size_t fallback);
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  void add_resident(std::ptrdiff_t delta) {
    resident_ = static_cast<size_t>(static_cast<std::ptrdiff_t>(resident_) + delta);
  }
  size_t resident() const { return resident_; }
  bool over_budget() const { return budget_ > 0 && usable_ && resident_ > budget_; }

  bool put(const uint8_t* data, uint32_t len, Slot& out);
  bool get(const Slot& s, uint8_t* out) const;
  void release(const Slot& s);

  const SpillCounters& counters() const { return counters_; }
  // The memory the file itself holds: its write buffer and free lists.
  size_t heap_bytes() const;

 private:
  bool open_file();
  bool flush();

  size_t budget_;
  std::string dir_;
  bool usable_ = true;  // false after a failure
  int fd_ = -1;
  size_t resident_ = 0;
  // Appends go through buf_, which starts at file offset buf_off_ (the file's end before it).
  std::vector<uint8_t> buf_;
  uint64_t buf_off_ = 0;
  std::unordered_map<uint32_t, std::vector<uint64_t>> free_;  // cap -> offsets of released slots
  mutable SpillCounters counters_;
};

}  // namespace ingero
