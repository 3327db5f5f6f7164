# Lifecycle of the real stashd: health, reflection, control plane, one daemon per socket, stale
# sockets, signals, permissions, the TCP listener, and the Session protocol's edge cases.
#
# Debian ships no generated stubs for grpc.health.v1 or grpc.reflection.v1alpha, so the tests
# carry their own copies of those public protocol definitions. The test links no stash::daemon:
# that library pulls in grpc++_reflection, whose own generated reflection messages would clash
# with ours in protobuf's generated pool.
set(_lc_proto_files
  ${CMAKE_CURRENT_SOURCE_DIR}/protos/health.proto
  ${CMAKE_CURRENT_SOURCE_DIR}/protos/reflection.proto)
set(_lc_gen ${CMAKE_CURRENT_BINARY_DIR}/lifecycle_gen)
set(_lc_gen_dir ${_lc_gen}/tests/integration/protos)
set(_lc_outs
  ${_lc_gen_dir}/health.pb.cc ${_lc_gen_dir}/health.pb.h
  ${_lc_gen_dir}/health.grpc.pb.cc ${_lc_gen_dir}/health.grpc.pb.h
  ${_lc_gen_dir}/reflection.pb.cc ${_lc_gen_dir}/reflection.pb.h
  ${_lc_gen_dir}/reflection.grpc.pb.cc ${_lc_gen_dir}/reflection.grpc.pb.h)
add_custom_command(
  OUTPUT ${_lc_outs}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_lc_gen}
  COMMAND protobuf::protoc
    --proto_path=${PROJECT_SOURCE_DIR}
    --cpp_out=${_lc_gen}
    --grpc_out=${_lc_gen}
    --plugin=protoc-gen-grpc=${STASH_GRPC_CPP_PLUGIN}
    ${_lc_proto_files}
  DEPENDS ${_lc_proto_files}
  COMMENT "Generating grpc.health.v1 and grpc.reflection.v1alpha test stubs")

# Generated code: no first-party warning flags.
add_library(stash_lifecycle_test_protos STATIC ${_lc_outs})
target_include_directories(stash_lifecycle_test_protos SYSTEM PUBLIC ${_lc_gen})
target_link_libraries(stash_lifecycle_test_protos PUBLIC protobuf::libprotobuf gRPC::grpc++)

stash_add_test(lifecycle_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/lifecycle_test.cc
  LIBS stash_lifecycle_test_protos stash::proto stash_test_harness gRPC::grpc++
       protobuf::libprotobuf
  LABELS integration)
add_dependencies(lifecycle_test stashd)
