#include "daemon/core/core.h"
#include "daemon/stats/event_log.h"

#include "common/bytes.h"
#include "common/logging.h"
#include "common/macros.h"
#include "common/random.h"
#include "common/shm.h"
#include "common/sys.h"
#include "common/text.h"
#include "common/version.h"
#include "daemon/copy/host_executor.h"
#if defined(STASH_HAVE_CUDA)
#include "daemon/cuda/cuda_executor.h"
#include "daemon/cuda/cuda_group_block.h"
#endif

#include <sys/resource.h>

#include <algorithm>
#include <fstream>

namespace stash::daemon {
namespace {
namespace v1 = stash::v1;

// Descriptors a session may have deposited and not yet registered (the client library has at
// most a few in flight), and all sessions together: each is a descriptor of the daemon, which
// gRPC, the pools and CUDA need too.
constexpr size_t kMaxPendingDeposits = 64;
// Sessions over all users, and what stays free for another user's first sessions: each costs a
// stream, a little memory and, in mapped mode, a pidfd and a control block.
constexpr uint64_t kMaxSessions = 4096;
constexpr uint64_t kMaxSessionsFirst = 256;
// Bytes of client memory registered over all sessions: a quarter of the 128 TiB address space
// (a sparse memfd costs its sender nothing).
constexpr uint64_t kMaxRegisteredBytes = 32ULL << 40;
uint64_t MaxDepositsHeld() { return std::max<uint64_t>(64, OpenFileLimit() / 4); }

// vm.max_map_count: every registration is one mapping of the daemon, and the kernel refuses
// mmap for the whole process past this many.
uint64_t MaxMapCount() {
  std::ifstream in("/proc/sys/vm/max_map_count");
  uint64_t value = 0;
  if (!(in >> value) || value == 0) value = 65530;  // the kernel's default
  return value;
}

std::string UuidText(const std::string& uuid) {
  static const char* const kHex = "0123456789abcdef";
  std::string out = "GPU-";
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[static_cast<uint8_t>(uuid[i]) >> 4];
    out += kHex[static_cast<uint8_t>(uuid[i]) & 15];
  }
  return out;
}

// The pool serving the GPU with `uuid` (16 raw bytes), or why none does.
StatusOr<int> PoolOfUuid(const std::vector<std::string>& uuids, const std::string& uuid) {
  for (size_t i = 0; i < uuids.size(); ++i) {
    if (uuids[i] == uuid) return static_cast<int>(i);
  }
  std::string served;
  for (const std::string& u : uuids) served += (served.empty() ? "" : ", ") + UuidText(u);
  return FailedPreconditionError("this rank's GPU " + UuidText(uuid) +
                                 " is not one this stashd serves (" + served +
                                 "): start stashd with that GPU visible (check "
                                 "CUDA_VISIBLE_DEVICES and the container's GPU list)");
}
// Every memfd chunk is a descriptor the daemon keeps open (to lease it again): the host
// backend's pools and host tier, the cuda backend's host tier (its pools are VMM handles, no
// descriptors). Raises the soft limit of open files to the hard one (systemd units get a high
// hard limit), then checks the chunks take at most half of it: the rest is for sessions,
// deposits and gRPC.
Status CheckChunkDescriptors(const DaemonConfig& config, uint64_t chunk_pages,
                             bool pools_are_memfds) {
  const uint64_t page = config.page_bytes;
  auto chunks_of = [&](uint64_t bytes) { return (bytes / page + chunk_pages - 1) / chunk_pages; };
  const uint64_t chunks = (pools_are_memfds ? config.devices * chunks_of(config.pool_bytes) : 0) +
                          (config.host_tier_bytes != 0 ? chunks_of(config.host_tier_bytes) : 0);
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return Status::Ok();
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur == RLIM_INFINITY || chunks <= limit.rlim_cur / 2) return Status::Ok();
  return InvalidArgumentError(
      "the tiers would be cut into " + std::to_string(chunks) + " chunks of " +
      std::to_string(chunk_pages * page) +
      " bytes, one open descriptor each, over half of this "
      "process's limit of " +
      std::to_string(limit.rlim_cur) +
      " open files: raise --chunk-bytes, or the limit (LimitNOFILE= in the systemd unit, "
      "ulimit -n)");
}
}  // namespace

void AddConfigEntries(const DaemonConfig& config, v1::GetConfigResponse* out) {
  for (const DaemonConfig::Entry& e : config.entries) {
    v1::ConfigEntry* entry = out->add_entries();
    entry->set_name(e.name);
    entry->set_value(e.value);
    entry->set_source(e.source);
    entry->set_help(e.help);
  }
}

namespace {

// On the cuda backend each group has a depot in every GPU's memory, outside the pools (4 bytes a
// page of the node): a user's groups at once are fewer there (a job has one per node).
GroupRegistry::Limits GroupLimitsFor(v1::Backend backend) {
  GroupRegistry::Limits limits;
  if (backend == v1::BACKEND_CUDA) limits.groups_per_uid = 16;
  return limits;
}

}  // namespace

DaemonCore::DaemonCore(const DaemonConfig& config, v1::Backend backend, std::string socket_path)
    : config_(config),
      backend_(backend),
      socket_path_(std::move(socket_path)),
      start_(std::chrono::steady_clock::now()),
      max_lease_bytes_(config.max_lease_bytes != 0
                           ? config.max_lease_bytes / config.page_bytes * config.page_bytes
                           : config.pool_bytes / config.page_bytes * config.page_bytes),
      groups_(GroupLimitsFor(backend)) {
  limits_.backend = backend;
  limits_.max_inflight = config.max_inflight;
  // Registrations in all: half the mappings the kernel allows, the rest stays for the daemon's
  // own (tiers, libraries, thread stacks); one session may take at most a quarter of that.
  const uint64_t max_memories_total = MaxMapCount() / 2;
  limits_.max_memories = std::min<uint64_t>(limits_.max_memories, max_memories_total / 4);
  // A first session's worth stays free for another user: one session's most of each.
  sessions_share_ = std::make_unique<FairShare>(FairShare::Spec{
      "sessions", kMaxSessions, kMaxSessionsFirst, 0,
      "close sessions that are not used (every session of a process that exited ends at once)"});
  memories_share_ = std::make_unique<FairShare>(
      FairShare::Spec{"registered allocations", max_memories_total, limits_.max_memories, 0,
                      "unregister some first, or reuse buffers"});
  bytes_share_ = std::make_unique<FairShare>(
      FairShare::Spec{"bytes of registered client memory", kMaxRegisteredBytes,
                      limits_.max_memory_bytes, 0, "unregister some first"});
  deposits_share_ = std::make_unique<FairShare>(
      FairShare::Spec{"descriptors deposited and not yet registered", MaxDepositsHeld(),
                      kMaxPendingDeposits, 0, "send the RegisterMemory of earlier deposits first"});
}

StatusOr<std::unique_ptr<DaemonCore>> DaemonCore::Create(const DaemonConfig& config,
                                                         v1::Backend backend,
                                                         std::string socket_path) {
  std::unique_ptr<DaemonCore> core(new DaemonCore(config, backend, std::move(socket_path)));
  const uint64_t page = config.page_bytes;
  const uint64_t chunk_pages = ChunkPages(config);
  std::vector<std::unique_ptr<CopyExecutor>> executors;
  GroupBlock::Factory group_blocks;  // unset: the host backend's memfd depots
  if (backend == v1::BACKEND_CUDA) {
#if defined(STASH_HAVE_CUDA)
    STASH_RETURN_IF_ERROR(CheckChunkDescriptors(config, chunk_pages, /*pools_are_memfds=*/false));
    STASH_ASSIGN_OR_RETURN(executors, CreateCudaExecutors(config, nullptr, &core->pool_uuids_));
    // Groups' depots in GPU memory, one per GPU (the executors outlive Leases: pools_ is
    // destroyed after leases_).
    STASH_ASSIGN_OR_RETURN(group_blocks, CudaGroupBlockFactory(executors));
    if (config.copy_peer_tier && executors.size() > 1) {
      // The cuda executor plans each stash on its GPU's copy stream, against rings that live on
      // that GPU; another GPU's ring is changed by that GPU's own stream with nothing ordering
      // the two, so a stash cannot be planned in it yet (docs/design.md).
      Log("pool")->info(
          "daemon-copy's peer tier is off on the cuda backend: a GPU's page ring is planned on "
          "its own copy stream and no other GPU's stream may change it, so a full pool spills to "
          "the host tier (--copy-peer-tier has no effect here)");
    }
#else
    return UnimplementedError(
        "this stashd was built without CUDA (STASH_ENABLE_CUDA=OFF): run with --backend=host");
#endif
  } else {
    STASH_RETURN_IF_ERROR(CheckChunkDescriptors(config, chunk_pages, /*pools_are_memfds=*/true));
    ChunkMemoryOptions memory;
    memory.lock = config.lock_memory;
    const std::string shmem = ShmemHugePageSetting();
    const std::string offered = shmem.empty()
                                    ? "no /sys/kernel/mm/transparent_hugepage/shmem_enabled"
                                    : "shmem_enabled=" + shmem;
    memory.hugetlb = config.huge_pages == HugePages::kHugetlb;
    memory.transparent_huge = config.huge_pages == HugePages::kAuto && ShmemHugePagesOffered(shmem);
    Tier* host = nullptr;
    if (config.host_tier_bytes > 0) {
      STASH_ASSIGN_OR_RETURN(
          auto tier,
          Tier::Create("host", -1, page, config.host_tier_bytes / page, chunk_pages, memory));
      host = tier.get();
      core->host_backend_tiers_.push_back(std::move(tier));
    }
    core->workers_ = std::make_unique<CopyWorkers>(config.copy_threads);
    std::vector<Tier*> pool_tiers;
    std::vector<HostExecutor*> host_executors;
    for (uint32_t d = 0; d < config.devices; ++d) {
      STASH_ASSIGN_OR_RETURN(auto tier,
                             Tier::Create("gpu" + std::to_string(d), static_cast<int>(d), page,
                                          config.pool_bytes / page, chunk_pages, memory));
      auto executor = std::make_unique<HostExecutor>(tier.get(), host, core->workers_.get());
      pool_tiers.push_back(tier.get());
      host_executors.push_back(executor.get());
      executors.push_back(std::move(executor));
      core->host_backend_tiers_.push_back(std::move(tier));
    }
    // Daemon-copy's peer tier: each pool's stashes may go to the others' spare pages.
    if (config.copy_peer_tier && pool_tiers.size() > 1) {
      for (size_t d = 0; d < host_executors.size(); ++d) {
        std::vector<Tier*> peers;
        for (size_t p = 0; p < pool_tiers.size(); ++p) {
          if (p != d) peers.push_back(pool_tiers[p]);
        }
        host_executors[d]->SetPeers(std::move(peers));
      }
      Log("pool")->info(
          "daemon-copy's peer tier: a stash its own pool cannot hold goes to another pool's "
          "spare pages before the host tier (--copy-peer-tier)");
    }
    const PageKind kind = core->host_backend_tiers_.front()->chunk_memory()->page_kind();
    if (config.huge_pages == HugePages::kOff) {
      Log("pool")->info("tiers use {} (--huge-pages=off)", PageKindName(kind));
    } else if (memory.hugetlb) {
      Log("pool")->info("tiers use {} (--huge-pages=hugetlb), reserved at start",
                        PageKindName(kind));
    } else if (!memory.transparent_huge) {
      Log("pool")->info(
          "tiers use {}: this kernel offers memfds no transparent huge pages ({}; echo advise > "
          "/sys/kernel/mm/transparent_hugepage/shmem_enabled offers them)",
          PageKindName(kind), offered);
    } else if (kind != PageKind::kTransparentHuge) {
      Log("pool")->info(
          "tiers use {}: --chunk-bytes={} is not a multiple of 2 MiB, so no chunk could hold a "
          "huge page ({} offers them)",
          PageKindName(kind), chunk_pages * page, offered);
    } else {
      Log("pool")->info("tiers ask for {} ({})", PageKindName(kind), offered);
    }
  }
  // After the open-file limit was raised (CheckChunkDescriptors): a quarter of what it is now.
  core->deposits_share_ = std::make_unique<FairShare>(
      FairShare::Spec{"descriptors deposited and not yet registered", MaxDepositsHeld(),
                      kMaxPendingDeposits, 0, "send the RegisterMemory of earlier deposits first"});
  for (size_t d = 0; d < executors.size(); ++d) {
    core->pools_.push_back(
        std::make_unique<Pool>(static_cast<int>(d), std::move(executors[d]), &core->counters_));
  }
  // Chunks as the pools cut them (a GPU rounds them up to its allocation granularity). One size
  // for every pool: a session's slots (Welcome.chunk_bytes) take peer chunks too.
  core->chunk_bytes_ = core->pools_.front()->device()->chunk_pages() * page;
  for (const auto& pool : core->pools_) {
    if (pool->device()->chunk_pages() * page != core->chunk_bytes_) {
      return FailedPreconditionError(
          "the GPUs round --chunk-bytes to different sizes (" + FormatBytes(core->chunk_bytes_) +
          " on gpu0, " + FormatBytes(pool->device()->chunk_pages() * page) + " on " +
          pool->device()->name() +
          "): set --chunk-bytes to a multiple of every GPU's allocation granularity");
    }
  }
  if (core->max_lease_bytes_ < core->chunk_bytes_) {
    // Leases come in whole chunks: a smaller quota could never grant one.
    return InvalidArgumentError(
        "--max-lease-bytes=" + std::to_string(config.max_lease_bytes) +
        " is less than one chunk (" + std::to_string(core->chunk_bytes_) +
        " bytes, --chunk-bytes or its default" +
        (backend == v1::BACKEND_CUDA ? ", rounded up to the GPU's allocation granularity" : "") +
        "): no lease could be granted; raise it to at least one chunk or lower --chunk-bytes");
  }
  {
    std::vector<Tier*> pool_tiers;
    for (const auto& pool : core->pools_) pool_tiers.push_back(pool->device());
    LeaseConfig lease;
    lease.page_bytes = page;
    lease.chunk_bytes = core->chunk_bytes_;
    lease.max_lease_bytes = core->max_lease_bytes_;
    lease.peer_tier = config.peer_tier;
    lease.group_peer = config.group_peer_tier;
    lease.first_share_divisor = 16;
    lease.group_blocks = group_blocks;
    if (backend == v1::BACKEND_CUDA) {
      // A GPU member's plan kernels claim in its own GPU's depot only: no other GPU's chunks.
      lease.group_peer_depots = false;
      if (config.group_peer_tier && core->pools_.size() > 1) {
        Log("pool")->info(
            "groups on the cuda backend share each GPU's pool and its share of the host tier "
            "among the group's ranks on that GPU; another GPU's pool is not claimed across "
            "(--group-peer-tier has no effect here yet)");
      }
    }
    // The host tier: one all pools share (host backend), or each GPU's own share (cuda).
    std::vector<Tier*> hosts;
    for (const auto& pool : core->pools_) {
      Tier* host = pool->host();
      if (host == nullptr) continue;
      if (backend != v1::BACKEND_CUDA) {
        hosts = {host};
        break;
      }
      hosts.push_back(host);
    }
    core->leases_ = std::make_unique<Leases>(pool_tiers, hosts, lease);
    DaemonCore* raw = core.get();
    core->leases_->SetActivityListener(
        [raw](const MappedActivity& activity) { raw->FoldMapped(activity); });
  }
  if (backend != v1::BACKEND_CUDA) {
    if (config.warm_memory) {
      std::vector<Warmer::Region> regions;
      for (const auto& tier : core->host_backend_tiers_) {
        regions.push_back({tier->name(), tier->chunk_memory()});
      }
      // Device pools first: they take the first stashes.
      std::stable_sort(regions.begin(), regions.end(), [](const auto& a, const auto& b) {
        return a.name != "host" && b.name == "host";
      });
      DaemonCounters* counters = &core->counters_;
      counters->warming.store(true, std::memory_order_relaxed);
      core->warmer_ = std::make_unique<Warmer>(std::move(regions), [counters](double seconds) {
        counters->warm_after_s.store(seconds, std::memory_order_relaxed);
        counters->warming.store(false, std::memory_order_relaxed);
      });
    }
  }
  // Stats list each tier once: every pool's own, then the spill tiers (shared on host).
  for (const auto& pool : core->pools_) core->tiers_.push_back(pool->device());
  for (const auto& pool : core->pools_) {
    Tier* host = pool->host();
    if (host != nullptr &&
        std::find(core->tiers_.begin(), core->tiers_.end(), host) == core->tiers_.end()) {
      core->tiers_.push_back(host);
    }
  }
  return core;
}

DaemonCore::~DaemonCore() {
  Stop();
  warmer_.reset();  // before the tiers it populates
}

void DaemonCore::Stop() {
  for (auto& pool : pools_) pool->Stop();
}

StatusOr<std::shared_ptr<Session>> DaemonCore::OpenSession(const v1::Hello& hello,
                                                           ResponseSink* sink, v1::Welcome* welcome,
                                                           const PeerCredentials& peer) {
  if (draining()) {
    return UnavailableError("stashd on " + socket_path_ +
                            " is draining (stashctl drain or SIGTERM) and takes no new sessions: "
                            "start the job once it was restarted");
  }
  STASH_RETURN_IF_ERROR(CheckHello(hello, backend_, static_cast<int>(pools_.size())));
  SessionInfo info;
  info.id = RandomHex(16);
  info.secret = RandomBytes(32);
  info.rank = hello.rank();
  info.pid = hello.pid();
  info.pool = hello.device();
  if (backend_ == v1::BACKEND_CUDA && !hello.device_uuid().empty()) {
    // Device indices differ between processes (CUDA_VISIBLE_DEVICES); the UUID does not.
    STASH_ASSIGN_OR_RETURN(info.pool, PoolOfUuid(pool_uuids_, hello.device_uuid()));
  }
  info.label = hello.label();
  info.client_version = hello.client_version();
  info.allow_host_spill = hello.allow_host_spill();
  info.mapped = hello.mode() == v1::MODE_MAPPED;
  info.uid = peer.known ? peer.uid : 0;
  if (!hello.group().empty()) {
    // Only the uid the kernel reported and the secret decide who joins (docs/security.md).
    StatusOr<uint64_t> joined =
        groups_.Join(info.uid, hello.group(), hello.group_secret(), info.id);
    if (!joined.ok()) {
      uint64_t held_back = 0;
      if (joined.status().code() == StatusCode::kPermissionDenied &&
          group_refused_log_.Allow(std::chrono::steady_clock::now(), &held_back)) {
        Log("rpc")->warn(
            "session of uid {} pid {} refused: {} ({} more refused since the last line)", info.uid,
            info.pid, joined.status().message(), held_back);
      }
      return joined.status();
    }
    info.group_id = *joined;
    info.group = hello.group();
  }
  if (Status taken = sessions_share_->Take(info.uid, 1); !taken.ok()) {
    groups_.Leave(info.id);
    return taken;
  }
  auto session = std::make_shared<Session>(
      info, sink, &counters_.rejected,
      SharedBudgets{memories_share_.get(), bytes_share_.get(), deposits_share_.get()});
  {
    MutexLock lock(&mu_);
    sessions_[info.id] = session;
  }
  counters_.sessions_total.fetch_add(1, std::memory_order_relaxed);

  const Pool& pool = *pools_[static_cast<size_t>(info.pool)];
  const Tier* host_tier = pool.host();
  welcome->set_session_id(info.id);
  welcome->set_backend(backend_);
  welcome->set_page_bytes(config_.page_bytes);
  welcome->set_pool_pages(pool.device()->pages());
  welcome->set_host_tier_pages(host_tier != nullptr ? host_tier->pages() : 0);
  const uint64_t pool_bytes = pool.device()->pages() * config_.page_bytes;
  const uint64_t host_bytes =
      host_tier != nullptr && info.allow_host_spill ? host_tier->pages() * config_.page_bytes : 0;
  welcome->set_max_stash_bytes(std::max(pool_bytes, host_bytes));
  welcome->set_max_inflight_requests(config_.max_inflight);
  welcome->set_daemon_version(kVersion);
  welcome->set_pool(info.pool);
  welcome->set_descriptor_secret(info.secret);
  if (leases_ != nullptr) {
    welcome->set_chunk_bytes(chunk_bytes_);
    welcome->set_max_lease_bytes(max_lease_bytes_);
    welcome->set_peer_tier(config_.peer_tier && pools_.size() > 1);
  }
  LogFields fields;
  fields.Add("session", info.id.substr(0, 8))
      .Add("rank", info.rank)
      .Add("pid", info.pid)
      .Add("pool", info.pool)
      .Add("label", info.label)
      .Add("uid", static_cast<int64_t>(info.uid));
  if (info.group_id != 0) {
    fields.Add("group", info.group).Add("group_id", static_cast<int64_t>(info.group_id));
  }
  Log("rpc")->info(
      "session {} started: rank {}, pid {}, pool {}, label '{}', client {}, mode {}{}", info.id,
      info.rank, info.pid, info.pool, Escaped(info.label, kMaxTextBytes),
      Escaped(info.client_version, kMaxTextBytes), info.mapped ? "mapped" : "daemon-copy",
      info.group_id != 0 ? ", group " + info.group + " (" + std::to_string(info.group_id) + ")"
                         : std::string());
  return session;
}

void DaemonCore::HandleRequest(const std::shared_ptr<Session>& session,
                               v1::SessionRequest request) {
  const auto received = std::chrono::steady_clock::now();
  Status status = draining() && request.has_stash()
                      ? UnavailableError(
                            "stashd is draining and takes no new stashes: keep the "
                            "buffer; reloads and releases of earlier stashes go on")
                      : AdmitRequest(request, *session, limits_);
  if (!status.ok()) {
    EventLog::Get().Reject(session->info(), request, status);
    v1::SessionResponse r;
    r.set_request_id(request.request_id());
    r.set_code(static_cast<int>(status.code()));
    r.set_message(status.message());
    // A stash refused by the drain says so: the client keeps it without flagging the step (the
    // DaemonState message may not have reached it yet).
    if (draining() && request.has_stash()) r.mutable_daemon_state()->set_draining(true);
    session->Send(std::move(r));
    return;
  }
  pools_[static_cast<size_t>(session->info().pool)]->Enqueue(session, std::move(request), received);
}

DescriptorReply DaemonCore::HandleDescriptors(const v1::DescriptorRequest& request,
                                              const PeerCredentials& peer,
                                              std::vector<UniqueFd>& fds) {
  std::shared_ptr<Session> session;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(request.session_id());
    if (it != sessions_.end()) session = it->second;
  }
  const std::string& secret = request.session_secret();
  const std::string& expected = session != nullptr ? session->info().secret : secret;
  // Compared in constant time; an unknown session and a wrong secret read alike.
  unsigned char diff = session == nullptr ? 1 : 0;
  diff |= static_cast<unsigned char>(secret.size() != expected.size());
  for (size_t i = 0; i < secret.size() && i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(secret[i] ^ expected[i]);
  }
  if (diff != 0) {
    return PermissionDeniedError(
        "no live session has this id and secret: send Welcome.session_id and "
        "Welcome.descriptor_secret of your own open session");
  }
  if (Status checked = session->CheckPeer(peer); !checked.ok()) return checked;
  const bool lease_kind = request.kind_case() == v1::DescriptorRequest::kLeaseChunks ||
                          request.kind_case() == v1::DescriptorRequest::kReturnChunks;
  if (lease_kind && !session->info().mapped) {
    return FailedPreconditionError(
        "this session is in mode daemon-copy: only a session whose Hello set mode MODE_MAPPED "
        "leases chunks");
  }
  if (lease_kind && leases_ == nullptr) {
    return FailedPreconditionError("this daemon's backend leases no chunks");
  }
  LeaseHolder who;
  who.session_id = session->info().id;
  who.pool = session->info().pool;
  who.allow_host_spill = session->info().allow_host_spill;
  who.uid = peer.uid;
  who.pid = peer.pid;
  who.socket = peer.socket;
  who.max_descriptors = peer.max_descriptors;
  who.rank = session->info().rank;
  who.hello_pid = session->info().pid;
  who.label = session->info().label;
  who.group_id = session->info().group_id;
  who.group = session->info().group;
  switch (request.kind_case()) {
    case v1::DescriptorRequest::kDepositMemory: {
      if (session->info().mapped) {
        return FailedPreconditionError(
            "this session is in mapped mode: it deposits no memory (it leases chunks)");
      }
      const v1::DepositMemory& d = request.deposit_memory();
      if (Status s = CheckClientMemoryFd(fds.at(0).get(), d.bytes()); !s.ok()) return s;
      return session->Deposit(d.memory_id(), d.bytes(), fds[0], kMaxPendingDeposits);
    }
    case v1::DescriptorRequest::kLeaseChunks: {
      DescriptorReply reply = leases_->Lease(who, request.lease_chunks());
      // The session may have ended while the lease was made: its chunks are then orphaned.
      if (session->closed()) leases_->SessionEnded(who.session_id);
      return reply;
    }
    case v1::DescriptorRequest::kReturnChunks:
      return leases_->Return(who, request.return_chunks());
    case v1::DescriptorRequest::KIND_NOT_SET:
      break;
  }
  return InvalidArgumentError("the request has no known kind");
}

void DaemonCore::CloseSession(const std::shared_ptr<Session>& session,
                              std::function<void()> closed) {
  bool open = false;
  {
    MutexLock lock(&mu_);
    open = sessions_.erase(session->info().id) != 0;
  }
  if (!open) {  // closed already: its teardown is queued or done
    if (closed) closed();
    return;
  }
  sessions_share_->Give(session->info().uid, 1);
  groups_.Leave(session->info().id);
  {
    MutexLock lock(&session->mu());
    uint64_t bytes = 0;
    for (const auto& [id, size] : session->declared_memories()) bytes += size;
    GiveDeclared(*session, bytes, session->declared_memories().size());
    session->declared_memories().clear();
    session->declared_by().clear();
  }
  session->ClearDeposits();
  pools_[static_cast<size_t>(session->info().pool)]->CloseSession(session, std::move(closed));
  // After the session is marked closed: a lease racing with this sees closed() and orphans
  // its chunks itself (HandleDescriptors).
  if (leases_ != nullptr) leases_->SessionEnded(session->info().id);
}

v1::SessionStats DaemonCore::SessionRow(Session& s) {
  const SessionInfo& info = s.info();
  SessionCounters& c = s.counters();
  v1::SessionStats row;
  row.set_session_id(info.id);
  row.set_rank(static_cast<int32_t>(info.rank));
  row.set_pid(static_cast<int32_t>(info.pid));
  row.set_pool(info.pool);
  row.set_label(info.label);
  if (!info.group.empty()) row.set_group(info.group);
  row.set_age_s(s.AgeSeconds());
  row.set_stashes(c.stashes.load());
  row.set_reloads(c.reloads.load());
  row.set_releases(c.releases.load());
  row.set_bytes_stashed(c.bytes_stashed.load());
  row.set_bytes_reloaded(c.bytes_reloaded.load());
  row.set_spills(c.spills.load());
  row.set_overflows(c.overflows.load());
  row.set_rejected(c.rejected.load());
  row.set_stashes_live(c.stashes_live.load());
  row.set_pages_live(c.pages_live.load());
  row.set_requests_inflight(c.inflight.load());
  row.set_step_overflow(c.step_overflow.load());
  row.set_step_spilled(c.step_spilled.load());
  row.set_memories(c.memories.load());
  row.set_bytes_live(c.bytes_live.load());
  row.set_step(c.step.load());
  row.set_step_begun(c.step_begun.load());
  for (v1::LiveStashes& live : s.live_tags().Rows()) *row.add_live() = std::move(live);
  row.set_mode(info.mapped ? v1::MODE_MAPPED : v1::MODE_DAEMON_COPY);
  if (info.mapped && leases_ != nullptr) MappedRow(s, &row);
  return row;
}

void DaemonCore::MappedRow(Session& s, v1::SessionStats* row) {
  std::vector<v1::LeaseStats> leases;
  ControlView c;
  LiveView live;
  // The counters of a mapped session are its control block's: written by the rank, clamped;
  // its live stashes by tag are the block's live-stash table (the daemon-copy rows are empty).
  if (leases_->Describe(s.info().id, &leases, &c, &live)) {
    for (v1::LeaseStats& lease : leases) *row->add_leases() = std::move(lease);
  }
  row->clear_live();
  for (v1::LiveStashes& l : live.rows) *row->add_live() = std::move(l);
  row->set_live_untagged(live.untagged);
  row->set_stashes(c.stashes);
  row->set_reloads(c.reloads);
  row->set_releases(c.releases);
  row->set_bytes_stashed(c.bytes_stashed);
  row->set_bytes_reloaded(c.bytes_reloaded);
  row->set_spills(c.spills);
  row->set_overflows(c.overflows);
  row->set_rejected(row->rejected() + c.rejected);
  uint64_t stashes_live = 0;
  uint64_t pages_live = 0;
  uint64_t bytes_live = 0;
  for (const ControlTierView& t : c.tiers) {
    stashes_live += t.stashes_live;
    pages_live += t.pages_used;
    bytes_live += t.bytes_live;
  }
  row->set_stashes_live(stashes_live);
  row->set_pages_live(pages_live);
  row->set_bytes_live(bytes_live);
  row->set_step_overflow(c.step_overflow);
  row->set_step_spilled(c.step_spilled);
  row->set_step(c.step);
  row->set_step_begun(c.steps > 0);
}

namespace {
// A counter raised by what a rank wrote: it stops at the top rather than wrap.
void AddSaturating(std::atomic<uint64_t>& counter, uint64_t delta) {
  uint64_t was = counter.load(std::memory_order_relaxed);
  while (!counter.compare_exchange_weak(was, was + std::min(delta, UINT64_MAX - was),
                                        std::memory_order_relaxed)) {
  }
}
}  // namespace

void DaemonCore::FoldMapped(const MappedActivity& a) {
  AddSaturating(counters_.stashes, a.stashes);
  AddSaturating(counters_.reloads, a.reloads);
  AddSaturating(counters_.releases, a.releases);
  AddSaturating(counters_.bytes_stashed, a.bytes_stashed);
  AddSaturating(counters_.bytes_reloaded, a.bytes_reloaded);
  AddSaturating(counters_.spills, a.spills);
  AddSaturating(counters_.overflows, a.overflows);
  AddSaturating(counters_.rejected, a.rejected);
  if ((a.overflows | a.spills | a.rejected) == 0) return;
  SessionInfo info;
  info.id = a.session_id;
  info.rank = a.rank;
  info.pid = a.pid;
  info.pool = a.pool;
  info.label = a.label;
  info.allow_host_spill = a.allow_host_spill;
  info.mapped = true;
  EventLog::Get().Mapped(info, a.step, a.overflows, a.spills, a.rejected);
}

v1::GetStatsResponse DaemonCore::Stats(bool session_rows) {
  // Mapped sessions' control blocks first, so the node's totals include their latest steps.
  if (leases_ != nullptr) leases_->Sample();
  v1::GetStatsResponse out;
  v1::DaemonStats* d = out.mutable_daemon();
  d->set_version(kVersion);
  d->set_backend(backend_);
  d->set_draining(draining());
  d->set_uptime_s(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  d->set_sessions_total(counters_.sessions_total.load());
  d->set_stashes(counters_.stashes.load());
  d->set_reloads(counters_.reloads.load());
  d->set_releases(counters_.releases.load());
  d->set_bytes_stashed(counters_.bytes_stashed.load());
  d->set_bytes_reloaded(counters_.bytes_reloaded.load());
  d->set_spills(counters_.spills.load());
  d->set_overflows(counters_.overflows.load());
  d->set_rejected(counters_.rejected.load());
  d->set_stash_latency_p50_us(counters_.stash_latency_us.Quantile(0.5));
  d->set_stash_latency_p99_us(counters_.stash_latency_us.Quantile(0.99));
  d->set_warming(counters_.warming.load(std::memory_order_relaxed));
  d->set_warm_after_s(counters_.warm_after_s.load(std::memory_order_relaxed));
  d->set_stashes_while_warming(counters_.stashes_while_warming.load(std::memory_order_relaxed));
  d->set_stash_copy_gbps(counters_.stash_copy.Gbps());
  d->set_reload_copy_gbps(counters_.reload_copy.Gbps());

  auto add_tier = [&](const Tier& tier) {
    const TierSnapshot snap = tier.Snapshot();
    v1::TierStats* t = out.add_tiers();
    t->set_name(snap.name);
    t->set_pool(snap.pool);
    t->set_page_bytes(snap.page_bytes);
    t->set_pages_total(snap.pages_total);
    t->set_pages_used(snap.pages_used);
    t->set_pages_free(snap.pages_total - snap.pages_used);
    t->set_pages_high_water(snap.pages_high_water);
    t->set_bytes_stashed(snap.bytes_stashed);
    t->set_stashes_live(snap.stashes_live);
    t->set_pages_lent(snap.pages_lent);
    const bool host = std::any_of(pools_.begin(), pools_.end(),
                                  [&](const auto& pool) { return pool->host() == &tier; });
    t->set_tier(host ? v1::TIER_HOST : v1::TIER_DEVICE);
    if (leases_ != nullptr && tier.chunks() > 0) {
      const Leases::TierCounts counts = leases_->Counts(&tier);
      t->set_chunk_bytes(tier.chunk_pages() * tier.page_bytes());
      t->set_chunks_total(tier.chunks());
      t->set_chunks_leased(counts.leased);
      t->set_chunks_orphaned(counts.orphaned);
      t->set_chunks_kept(counts.kept);
      t->set_chunks_waiting(counts.waiting);
      t->set_chunks_free(tier.chunks_free());
    }
    if (const ChunkMemory* memory = tier.reported_memory(); memory != nullptr) {
      t->set_bytes_warm(memory->bytes_warm());
      t->set_page_kind(PageKindName(memory->page_kind()));
    }
  };
  for (const Tier* tier : tiers_) add_tier(*tier);

  std::vector<std::shared_ptr<Session>> live;
  {
    MutexLock lock(&mu_);
    for (auto& [id, s] : sessions_) live.push_back(s);
  }
  d->set_sessions_live(live.size());
  std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) {
    return std::tie(a->info().rank, a->info().id) < std::tie(b->info().rank, b->info().id);
  });
  const size_t rows = session_rows ? std::min(live.size(), kMaxSessionRows) : 0;
  for (size_t i = 0; i < rows; ++i) *out.add_sessions() = SessionRow(*live[i]);
  out.set_sessions_omitted(live.size() - rows);
  if (session_rows && leases_ != nullptr) {
    for (v1::GroupStats& g : leases_->DescribeGroups()) *out.add_groups() = std::move(g);
  }
  return out;
}

v1::ListSessionsResponse DaemonCore::ListSessions(bool session_rows) {
  v1::ListSessionsResponse out;
  v1::GetStatsResponse stats = Stats(session_rows);
  for (auto& row : *stats.mutable_sessions()) *out.add_sessions() = std::move(row);
  out.set_sessions_omitted(stats.sessions_omitted());
  return out;
}

v1::GetConfigResponse DaemonCore::Config() const {
  v1::GetConfigResponse out;
  AddConfigEntries(config_, &out);
  out.set_backend(backend_);
  out.set_socket(socket_path_);
  out.set_pools(static_cast<uint32_t>(pools_.size()));
  out.set_page_bytes(config_.page_bytes);
  out.set_pool_pages(pools_.empty() ? 0 : pools_[0]->device()->pages());
  const Tier* host = pools_.empty() ? nullptr : pools_[0]->host();
  out.set_host_tier_pages(host != nullptr ? host->pages() : 0);
  out.set_version(kVersion);
  out.set_metrics_url(metrics_url_);
  out.set_tcp_listener(tcp_listener_);
  return out;
}

}  // namespace stash::daemon
