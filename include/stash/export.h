// STASH_EXPORT marks the symbols libstash_client.so exports; everything else is hidden, because
// the library is a guest inside PyTorch processes that carry their own gRPC and protobuf.
#ifndef STASH_EXPORT_H_
#define STASH_EXPORT_H_

#if defined(STASH_BUILDING_LIBRARY)
#define STASH_EXPORT __attribute__((visibility("default")))
#else
#define STASH_EXPORT
#endif

#endif  // STASH_EXPORT_H_
