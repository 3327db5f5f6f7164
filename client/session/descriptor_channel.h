// The client's end of the descriptor channel (stash/v1/descriptor.proto): hands the session's
// memfds to the daemon over `<socket>.fd` before the RegisterMemory that names them
// (daemon-copy mode), and leases and returns pool chunks (mapped mode).
#ifndef STASH_CLIENT_DESCRIPTOR_CHANNEL_H_
#define STASH_CLIENT_DESCRIPTOR_CHANNEL_H_

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/descriptor_socket.h"
#include "common/unique_fd.h"
#include "stash/status.h"

namespace stash::client {

// What one LeaseChunks brought: the descriptors that came (whatever the final status says, so
// none is ever lost) and the daemon's final word.
struct LeaseAnswer {
  Status status;           // the final packet's code and message
  UniqueFd control_block;  // the session's first lease only
  uint64_t control_block_bytes = 0;
  // The group's depot (a session in a group, until the rank says it mapped it).
  UniqueFd group_block;
  uint64_t group_block_bytes = 0;
  uint32_t member_tag = 0;
  uint64_t group_pages = 0, group_chunks = 0;
  std::string group_gpu_uuid;  // 16 raw bytes: the GPU whose memory holds it; empty: a memfd
  std::vector<uint64_t> group_tier_first_page;  // per lease tier, as GroupBlock.tier_first_page
  struct Chunk {
    uint64_t id = 0;
    int tier = 0;  // stash.v1.Tier
    int pool = 0;
    uint64_t bytes = 0;
    // The cuda backend's device and peer chunks: the GPU's UUID, 16 raw bytes (the rank finds
    // its own ordinal for it: GpuOrdinalOfUuid); empty for host chunks.
    std::string gpu_uuid;
    std::optional<uint64_t> group_page;  // a group chunk: where it goes in the group's range
    UniqueFd fd;
  };
  std::vector<Chunk> chunks;  // newly granted
  struct Held {
    int tier = 0;  // stash.v1.Tier
    uint64_t chunks = 0, pages = 0, pages_target = 0;
  };
  std::vector<Held> lease;  // per tier, after this request
  // A group's member: chunks of the group it was not sent yet (it asks again).
  uint64_t chunks_not_sent = 0;
};

// Thread-safe: one request at a time goes out and is answered.
class DescriptorChannel {
 public:
  // `socket` is the gRPC socket the session connected to; `session_id` and `secret` come from
  // its Welcome.
  DescriptorChannel(std::string socket, std::string session_id, std::string secret);

  // Hands memfd `fd` (borrowed) as `memory_id` of `bytes` bytes and waits for the daemon's
  // answer (up to 10 s). Connects on first use. The daemon's refusal comes back as its status;
  // UNAVAILABLE when the daemon cannot be reached.
  Status DepositMemory(uint64_t memory_id, uint64_t bytes, int fd);

  // Mapped sessions: LeaseChunks. `automatic`, or `want` = (stash.v1.Tier, pages) per tier.
  // UNAVAILABLE when the daemon cannot be reached or the answer breaks off (the descriptors that
  // did arrive are in the answer regardless); the daemon's refusal is answer.status.
  StatusOr<LeaseAnswer> Lease(bool automatic, const std::vector<std::pair<int, uint64_t>>& want);

  // Mapped sessions: ReturnChunks; the chunks returned, or the daemon's refusal. With
  // `ended_session` set: chunks that earlier session of this process left (ReturnChunks).
  StatusOr<uint64_t> Return(const std::vector<uint64_t>& chunk_ids,
                            const std::string& ended_session = "");

 private:
  Status ConnectLocked();
  // Sends `request` and receives one packet of the answer (lock held). UNAVAILABLE (and the
  // connection dropped) when that fails.
  Status SendLocked(const std::string& request, const std::vector<int>& fds);
  // A send failed: the refusal stashd sent before closing the connection, if one is waiting,
  // else UNAVAILABLE with `failed`. Drops the connection (lock held).
  Status SendFailedLocked(const Status& failed);
  StatusOr<Packet> ReceiveLocked(std::string* bytes);

  const std::string path_;
  const std::string session_id_;
  const std::string secret_;
  std::mutex mu_;
  UniqueFd socket_;            // guarded by mu_
  int64_t connected_pid_ = 0;  // guarded by mu_: the process that connected socket_
};

}  // namespace stash::client

#endif  // STASH_CLIENT_DESCRIPTOR_CHANNEL_H_
