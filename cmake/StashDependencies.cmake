# Third-party dependencies, all from Debian packages (scripts/deps installs them).
find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(spdlog REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
# The daemon's /metrics endpoint (Debian: prometheus-cpp-dev).
find_package(prometheus-cpp CONFIG REQUIRED)
# sd_notify for systemd's Type=notify (Debian: libsystemd-dev).
find_package(PkgConfig REQUIRED)
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
if(STASH_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(STASH_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
find_program(STASH_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
