// The fatbin of mapped mode's kernels (kernels/mapped_paging.cu), embedded in the client library
// by cmake/StashEmbedFile.cmake (target stash::mapped_fatbin; built with STASH_ENABLE_CUDA only).
// Hand it to cuModuleLoadData (StreamCopier::Create).
#ifndef STASH_KERNELS_MAPPED_PAGING_FATBIN_H_
#define STASH_KERNELS_MAPPED_PAGING_FATBIN_H_

extern "C" {
extern const unsigned char stash_mapped_paging_fatbin[];
extern const unsigned long stash_mapped_paging_fatbin_size;  // NOLINT(google-runtime-int)
}

#endif  // STASH_KERNELS_MAPPED_PAGING_FATBIN_H_
