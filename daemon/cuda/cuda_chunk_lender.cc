#include "daemon/cuda/cuda_chunk_lender.h"

#include <algorithm>
#include <cstring>

#include "common/macros.h"
#include "daemon/cuda/cuda_executor.h"
#include "stash/kernels/daemon_paging.h"

namespace stash::daemon {

StatusOr<std::unique_ptr<CudaChunkLender>> CudaChunkLender::Create(const Pool& pool) {
  std::unique_ptr<CudaChunkLender> l(new CudaChunkLender(pool));
  const PrimaryContext::Scope scope(*pool.context);
  STASH_RETURN_IF_ERROR(scope.status());
  const CUcontext ctx = pool.context->get();
  STASH_RETURN_IF_ERROR(l->snapshot_.Allocate(pool.driver, ctx, CudaBuffer::Kind::kPinnedMapped,
                                              sizeof(kernels::PageRing) + l->pages_ * 8,
                                              "the lender's ring snapshot"));
  STASH_RETURN_IF_ERROR(l->flags_.Allocate(pool.driver, ctx, CudaBuffer::Kind::kPinnedMapped,
                                           l->chunks_ * sizeof(uint32_t), "the lender's answers"));
  STASH_RETURN_IF_ERROR(l->counts_.Allocate(pool.driver, ctx, CudaBuffer::Kind::kDevice,
                                            l->chunks_ * sizeof(uint64_t), "the lender's scratch"));
  STASH_CU_RETURN_IF_ERROR(pool.driver, EventCreate(&l->reached_, CU_EVENT_DISABLE_TIMING));
  return l;
}

void CudaChunkLender::SetWaiting(std::vector<uint64_t> waiting) {
  MutexLock lock(&mu_);
  for (uint64_t c : waiting) {
    STASH_CHECK(c < chunks_) << "chunk " << c << " of " << chunks_;
    in_ring_[c] = false;
    pool_.tier->AccountTaken(pool_.tier->ChunkPages(c));
  }
  pool_.tier->SetChunksFree(chunks_ - waiting.size());
  waiting_ = std::move(waiting);
}

CudaChunkLender::CudaChunkLender(const Pool& pool)
    : pool_(pool),
      pages_(pool.tier->pages()),
      chunk_pages_(pool.tier->chunk_pages()),
      chunks_(pool.tier->chunks()),
      in_ring_(chunks_, true) {}

CudaChunkLender::~CudaChunkLender() {
  if (reached_ == nullptr) return;
  const PrimaryContext::Scope scope(*pool_.context);
  if (scope.status().ok()) (void)pool_.driver->EventDestroy(reached_);
}

std::vector<uint64_t> CudaChunkLender::Waiting() {
  MutexLock lock(&mu_);
  return std::exchange(waiting_, {});
}

kernels::ChunkRingLaunch CudaChunkLender::Launch() const {
  kernels::ChunkRingLaunch a;
  a.d_ring = pool_.d_ring;
  a.pages = pages_;
  a.chunk_pages = chunk_pages_;
  a.chunks = chunks_;
  a.d_flags = flags_.device<uint32_t>();
  a.d_counts = counts_.device<uint64_t>();
  return a;
}

Status CudaChunkLender::Reach() {
  const CudaDriver* d = pool_.driver;
  STASH_CU_RETURN_IF_ERROR(d, EventRecord(reached_, pool_.stream));
  STASH_CU_RETURN_IF_ERROR(d, EventSynchronize(reached_));
  return Status::Ok();
}

StatusOr<std::vector<CudaChunkLender::Taken>> CudaChunkLender::Take(const Want& want) {
  MutexLock lock(&mu_);
  const CudaDriver* d = pool_.driver;
  const PrimaryContext::Scope scope(*pool_.context);
  STASH_RETURN_IF_ERROR(scope.status());
  // The ring (its header and the ids after it, one copy) as the stream has it after the work
  // enqueued so far. Stashes may run before the take kernel: the snapshot only proposes; the
  // kernel decides on the ring as it is when it runs.
  auto* snapshot = snapshot_.host<kernels::PageRing>();
  STASH_CU_RETURN_IF_ERROR(d,
                           MemcpyDtoHAsync(snapshot, reinterpret_cast<CUdeviceptr>(pool_.d_ring),
                                           sizeof(kernels::PageRing) + pages_ * 8, pool_.stream));
  STASH_RETURN_IF_ERROR(Reach());
  const kernels::PageRing ring = *snapshot;
  const auto* ids = reinterpret_cast<const uint64_t*>(snapshot + 1);
  std::vector<uint64_t> free_pages(chunks_, 0);
  for (uint64_t i = 0; i < ring.tail - ring.head && i < pages_; ++i) {
    const uint64_t id = ids[(ring.head + i) % pages_];
    if (id < pages_) ++free_pages[id / chunk_pages_];
  }
  std::vector<uint64_t> free;
  for (uint64_t c = 0; c < chunks_; ++c) {
    if (in_ring_[c] && free_pages[c] == pool_.tier->ChunkPages(c)) free.push_back(c);
  }
  pool_.tier->SetChunksFree(free.size());
  auto* flags = flags_.host<uint32_t>();
  std::memset(flags, 0, chunks_ * sizeof(uint32_t));
  uint64_t left = free.size();
  bool any = false;
  for (uint64_t c : free) {
    if (!want(c, left)) break;
    flags[c] = kernels::kTakeAsked;
    any = true;
    --left;
  }
  std::vector<Taken> out;
  if (!any) return out;
  const kernels::LaunchResult launched = pool_.kernels->TakeChunks(Launch(), pool_.stream);
  if (!launched.ok()) return InternalError(launched.message);
  // Enqueued, the kernel takes the chunks whatever happens next: without its answer the books
  // would lose their pages for good.
  if (const Status reached = Reach(); !reached.ok()) {
    DeviceLost(pool_.memory->device(), "waiting for a chunk take: " + reached.message());
  }
  for (uint64_t c = 0; c < chunks_; ++c) {
    if (flags[c] != kernels::kTakeDone) continue;
    in_ring_[c] = false;
    pool_.tier->AccountTaken(pool_.tier->ChunkPages(c));
    out.push_back({c, /*written=*/true});
  }
  pool_.tier->SetChunksFree(free.size() - out.size());
  return out;
}

void CudaChunkLender::Return(uint64_t chunk) {
  MutexLock lock(&mu_);
  STASH_CHECK(chunk < chunks_ && !in_ring_[chunk])
      << pool_.tier->name() << ": chunk " << chunk << " returned but not taken";
  STASH_CHECK(pool_.memory->present(chunk))
      << pool_.tier->name() << ": chunk " << chunk << " returned to the ring without memory";
  const PrimaryContext::Scope scope(*pool_.context);
  // Lost, the ring would miss the chunk's pages for good while the books say they are back.
  if (!scope.status().ok()) DeviceLost(pool_.memory->device(), scope.status().message());
  kernels::ChunkRingLaunch a = Launch();
  a.chunk = chunk;
  const kernels::LaunchResult launched = pool_.kernels->ReturnChunk(a, pool_.stream);
  if (!launched.ok()) DeviceLost(pool_.memory->device(), launched.message);
  in_ring_[chunk] = true;
  pool_.tier->AccountReturned(pool_.tier->ChunkPages(chunk));
  pool_.tier->SetChunksFree(pool_.tier->chunks_free() + 1);  // wholly free as it goes back
}

Status CudaChunkLender::Renew(uint64_t chunk) { return pool_.memory->Renew(chunk); }

StatusOr<UniqueFd> CudaChunkLender::Export(uint64_t chunk) { return pool_.memory->ExportFd(chunk); }

uint64_t CudaChunkLender::ChunkBytes(uint64_t chunk) const {
  return pool_.memory->ChunkBytes(chunk);
}

}  // namespace stash::daemon
