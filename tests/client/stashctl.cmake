# stashctl: formatting and the command line in-process, then the built stashctl binary against
# the built stashd binary (both found through STASHD_BIN_DIR, which stash_add_test sets; the
# build dir is compiled in for running the test binary by hand).
stash_add_test(stashctl_test
  SOURCES stashctl_test.cc
  LIBS stash::stashctl stash::proto)
add_dependencies(stashctl_test stashd stashctl)
target_compile_definitions(stashctl_test PRIVATE STASH_TEST_BIN_DIR="${PROJECT_BINARY_DIR}")

# Tables fitted to the terminal, session filters and sorts, CSV queries: pure functions and the
# command line, no daemon.
stash_add_test(stashctl_select_test
  SOURCES stashctl_select_test.cc
  LIBS stash::stashctl stash::proto)

# The groups table (stats, sessions, sessions --detail) and which groups a session filter keeps:
# pure functions of a hand-built reply, no daemon.
stash_add_test(stashctl_groups_test
  SOURCES stashctl_groups_test.cc
  LIBS stash::stashctl stash::proto)
