// What daemon-copy passes to a copy executor (copy/executor.h) and keeps of each stash: the
// stash's record, and one stash's or reload's work with its row count and done signal.
#ifndef STASH_DAEMON_RECORDS_H_
#define STASH_DAEMON_RECORDS_H_

#include <cstdint>
#include <vector>

#include "daemon/copy/mapped_memory.h"
#include "stash/kernels/paging.h"
#include "stash/status.h"

namespace stash::daemon {

class Tier;

// One stash the pool holds for a session, from its Stash until its Reload or Release finished.
struct StashRecord {
  uint64_t row_bytes = 0;
  uint64_t max_rows = 0;
  // Set by the executor before the stash's `then` runs.
  kernels::StashPlan plan{};
  Tier* tier = nullptr;  // where the plan placed it; null when it placed nothing
  // Executor-owned placement state: the host executor keeps the page record here, the CUDA
  // executor keeps its slot in device-visible metadata.
  std::vector<uint64_t> page_record;
  int64_t slot = -1;
  uint64_t record_offset = 0;
  uint64_t record_entries = 0;
  // Set instead of a plan when the executor could not run the stash (nothing was taken).
  Status error;
};

// A row count: a value known now, or an int64 the copy reads from client memory when it runs.
struct CountSource {
  const uint8_t* data = nullptr;  // executor address of the int64; null = `value`
  int64_t value = 0;
  uint32_t divisor = 1;
};

// A counter to raise to `value` after the work (the client's done event); null = none.
struct DoneSignal {
  const MappedMemory* memory = nullptr;
  uint64_t offset = 0;
  uint64_t value = 0;
};

struct StashWork {
  const uint8_t* source = nullptr;  // executor address of row 0
  CountSource count;
  bool allow_host_spill = true;
  DoneSignal done;
  StashRecord* record = nullptr;  // filled in; owned by the pool, outlives `then`
};

struct ReloadWork {
  uint8_t* destination = nullptr;  // executor address of row 0; null = release (no copy)
  bool zero_tail = false;
  DoneSignal done;
  StashRecord* record = nullptr;  // the stash's record; its pages go back to its tier
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_RECORDS_H_
