# Lifecycle of the real stashd: health, reflection, control plane, one daemon per socket, stale
# sockets, signals, permissions, the TCP listener, and the Session protocol's edge cases.
#
# Debian ships no generated stubs for grpc.health.v1 or grpc.reflection.v1alpha, so the project
# carries its own copies of those public protocol definitions: health is stashctl's, reflection
# is the tests'. The test links no stash::daemon: that library pulls in grpc++_reflection, whose
# own generated reflection messages would clash with ours in protobuf's generated pool.
stash_grpc_library(stash_lifecycle_test_protos PROTOS protos/reflection.proto)

stash_add_test(lifecycle_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/lifecycle_test.cc
  LIBS stash_lifecycle_test_protos stash::reflection_v1_proto stash_stashctl_health stash::proto
       stash_test_harness gRPC::grpc++
       protobuf::libprotobuf
  LABELS integration)
add_dependencies(lifecycle_test stashd)
