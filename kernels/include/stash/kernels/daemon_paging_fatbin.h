// The fatbin of daemon-copy's kernels (kernels/daemon_paging.cu), embedded in stashd by
// cmake/StashEmbedFile.cmake (target stash::daemon_paging_fatbin; built with STASH_ENABLE_CUDA
// only). Hand it to cuModuleLoadData (daemon/cuda/paging_kernels.h).
#ifndef STASH_KERNELS_DAEMON_PAGING_FATBIN_H_
#define STASH_KERNELS_DAEMON_PAGING_FATBIN_H_

extern "C" {
extern const unsigned char stash_daemon_paging_fatbin[];
extern const unsigned long stash_daemon_paging_fatbin_size;  // NOLINT(google-runtime-int)
}

#endif  // STASH_KERNELS_DAEMON_PAGING_FATBIN_H_
