# stash-demo against the real stashd: bit-exact parity with roomy pools, with host-tier spills and
# with overflows. The test execs $STASHD_BIN_DIR/daemon/stashd and .../examples/stash-demo.
if(STASH_BUILD_EXAMPLES)
  stash_add_test(demo_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/demo_test.cc
    LIBS stash::client
    LABELS integration)
  add_dependencies(demo_test stashd stash-demo stashctl)
endif()
