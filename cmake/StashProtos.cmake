# stash_grpc_library(<target> PROTOS <file.proto>... [IMPORT_ROOT <dir>])
#
# Generates the protobuf messages and gRPC stubs of the given .proto files into a static library
# <target>. Each file is compiled with IMPORT_ROOT (default: the project root) as its import
# path, so its headers are included by that relative path, e.g. "client/stashctl/health.pb.h".
# Generated code gets no first-party warning flags.
function(stash_grpc_library target)
  cmake_parse_arguments(ARG "" "IMPORT_ROOT" "PROTOS" ${ARGN})
  if(NOT ARG_IMPORT_ROOT)
    set(ARG_IMPORT_ROOT ${PROJECT_SOURCE_DIR})
  endif()
  set(gen ${CMAKE_CURRENT_BINARY_DIR}/${target}_gen)
  set(outs)
  set(protos)
  foreach(proto IN LISTS ARG_PROTOS)
    get_filename_component(abs ${proto} ABSOLUTE)
    file(RELATIVE_PATH rel ${ARG_IMPORT_ROOT} ${abs})
    string(REGEX REPLACE "\\.proto$" "" base ${rel})
    list(APPEND outs ${gen}/${base}.pb.cc ${gen}/${base}.pb.h
                     ${gen}/${base}.grpc.pb.cc ${gen}/${base}.grpc.pb.h)
    list(APPEND protos ${abs})
  endforeach()
  add_custom_command(
    OUTPUT ${outs}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${gen}
    COMMAND protobuf::protoc
      --proto_path=${ARG_IMPORT_ROOT}
      --cpp_out=${gen}
      --grpc_out=${gen}
      --plugin=protoc-gen-grpc=${STASH_GRPC_CPP_PLUGIN}
      ${protos}
    DEPENDS ${protos}
    COMMENT "Generating C++ protobuf and gRPC code for ${target}")
  add_library(${target} STATIC ${outs})
  target_include_directories(${target} SYSTEM PUBLIC ${gen})
  target_link_libraries(${target} PUBLIC protobuf::libprotobuf gRPC::grpc++)
endfunction()
